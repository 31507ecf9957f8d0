/*
 GPT-2's byte-level BPE tokenizer (r50k_base: 50257 tokens, <|endoftext|> = 50256): encode and decode.
 It loads a tiktoken rank file (one "<base64 token bytes> <rank>" line per token, ranks 0, 1, 2, ...)
 and adds <|endoftext|> as the last id. Encoding checks that the text is UTF-8, splits it with GPT-2's
 pre-tokenizer pattern
     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 written out by hand (same pieces as a backtracking regex engine, \s = Unicode White_Space), and
 turns each piece into ids as tiktoken does: the piece's own id if it is a token, else repeatedly
 merge the adjacent pair of parts whose concatenation has the lowest rank (leftmost on ties).
 Text is encoded as ordinary text: "<|endoftext|>" in it is not the special token.
 One difference, for bounded memory: a piece longer than TOKENIZER_MAX_PIECE (64 KiB: a run of
 letters, digits, punctuation or spaces that long, which no natural text has) is encoded in
 consecutive chunks of at most 64 KiB cut at character boundaries, as if each were a piece; its ids
 may then differ from tiktoken's near the cuts, but they decode to the same bytes, and the encoder's
 time and memory stay linear in the text (a piece otherwise needs up to 92 bytes of work memory a byte).
 tokenizer_init_pattern(t, path, TOKENIZER_PATTERN_LLAMA3) instead splits with Llama-3's pattern (also
 tiktoken's cl100k_base's)
     (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 for Llama-3's rank file (128000 ranks; the added special token, 128000, is <|begin_of_text|>).

 tokenizer_init_json loads any GPT-2-style byte-level BPE from a Hugging Face tokenizer.json instead
 (model.type BPE; the vocabulary's strings written in GPT-2's byte-to-unicode alphabet) and encodes
 as HF's BPE model does: each byte of a piece becomes its single-byte token (a byte the vocabulary
 has no token for is dropped, as HF does with no unk_token: SmolLM2's vocabulary lacks a few), then
 the adjacent pair with the lowest-ranked merge in the merge list is merged, leftmost on ties, until
 none is left; with model.ignore_merges a piece that is itself a token is that token first. The
 pre-tokenizer is ByteLevel's regex (GPT-2's pattern), optionally after Digits(individual_digits)
 (TOKENIZER_PATTERN_GPT2_DIGITS: every \p{N} character is a piece of its own, as in SmolLM2), or a
 Split with GPT-2's or Llama-3's pattern before ByteLevel without its regex; anything else (a
 normalizer, another model or pre-tokenizer, dropout, byte fallback, word prefixes or suffixes) is
 a one-line error naming the file and the field. The added tokens are tokens with their text as
 bytes, never produced by encoding text. The token that starts a document (eot_token) is the added
 token <|endoftext|> (GPT-2, SmolLM2: there both bos and eos), else <|begin_of_text|> (Llama-3).
 tokenizer_load reads either file, telling them apart by the first byte ('{' is JSON), and
 tokenizer_write_json writes a rank file's tokenizer as a tokenizer.json that encodes the same.
*/
#ifndef LLMC_TOKENIZER_H
#define LLMC_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include "llmc/json.h"
#include "llmc/unicode_tables.h"
#include "llmc/utils.h"

#define TOKENIZER_DEFAULT_PATH "data/r50k_base.tiktoken"
// the longest piece encoded whole; see tokenizer_encode
#define TOKENIZER_MAX_PIECE ((size_t)1 << 16)
#define TOKENIZER_MAX_TOKENS (1 << 24)

typedef struct {
    int vocab_size;          // ranks in the file + 1
    int eot_token;           // <|endoftext|>, the last id
    unsigned char* bytes;    // every token's bytes, back to back
    size_t* offsets;         // token i is bytes[offsets[i] .. offsets[i + 1])
    int* table;              // open addressing, token bytes -> id (-1: empty slot); eot is not in it
    size_t table_mask;       // table size - 1, a power of two at least twice the ranks
    int pattern;             // pre-tokenizer: TOKENIZER_PATTERN_GPT2, _LLAMA3 or _GPT2_DIGITS
    // tokenizer.json only (tokenizer_init_json); all zero for a rank file
    int hf_bpe;              // 1: merge by the merge list, as HF's BPE model does
    int ignore_merges;       // 1: a piece that is a token is that token, before any merging
    int n_merges;
    int* merges;             // [n_merges][3]: left id, right id, merged id; a merge's rank is its index
    int* merge_table;        // open addressing, (left id, right id) -> merge index (-1: empty slot)
    size_t merge_mask;       // merge_table size - 1
    int byte_token[256];     // the id of each byte's single-byte token, -1 where there is none
} Tokenizer;

enum { TOKENIZER_PATTERN_GPT2, TOKENIZER_PATTERN_LLAMA3, TOKENIZER_PATTERN_GPT2_DIGITS };

// ----------------------------------------------------------------------------
// UTF-8

// length of the well-formed UTF-8 sequence at s[i] (Unicode Table 3-7: no overlongs, no surrogates,
// nothing above U+10FFFF), 0 if there is none
static inline size_t utf8_sequence_length(const unsigned char* s, size_t len, size_t i) {
    unsigned char c = s[i];
    if (c < 0x80) { return 1; }
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF; // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) { n = 2; }
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) { lo = 0xA0; }       // overlong
        if (c == 0xED) { hi = 0x9F; }       // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) { lo = 0x90; }       // overlong
        if (c == 0xF4) { hi = 0x8F; }       // above U+10FFFF
    } else {
        return 0; // continuation byte, overlong C0/C1 lead, or F5..FF
    }
    if (len - i < n) { return 0; }
    if (s[i + 1] < lo || s[i + 1] > hi) { return 0; }
    for (size_t k = 2; k < n; k++) {
        if ((s[i + k] & 0xC0) != 0x80) { return 0; }
    }
    return n;
}

// 1 if s[0..len) is valid UTF-8; else 0, with the offset of the first bad sequence in *bad_offset
static inline int utf8_valid(const char* s, size_t len, size_t* bad_offset) {
    const unsigned char* u = (const unsigned char*)s;
    for (size_t i = 0; i < len;) {
        size_t n = utf8_sequence_length(u, len, i);
        if (n == 0) {
            if (bad_offset != NULL) { *bad_offset = i; }
            return 0;
        }
        i += n;
    }
    return 1;
}

// length of the maximal subpart of a well-formed sequence at s[i] (which is ill-formed there): the
// lead byte and the continuation bytes that fit it, at least 1 (Unicode's Table 3-7 ranges)
static inline size_t utf8_ill_formed_length(const unsigned char* s, size_t len, size_t i) {
    unsigned char c = s[i], lo = 0x80, hi = 0xBF;
    size_t n;
    if (c >= 0xC2 && c <= 0xDF) { n = 2; }
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; lo = c == 0xE0 ? 0xA0 : 0x80; hi = c == 0xED ? 0x9F : 0xBF; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; lo = c == 0xF0 ? 0x90 : 0x80; hi = c == 0xF4 ? 0x8F : 0xBF; }
    else { return 1; }
    size_t k = 1;
    if (i + k < len && s[i + k] >= lo && s[i + k] <= hi) {
        for (k = 2; k < n && i + k < len && (s[i + k] & 0xC0) == 0x80; k++) {}
    }
    return k;
}

// the code point at s[*i] of valid UTF-8; advances *i past it
static inline uint32_t utf8_decode(const unsigned char* s, size_t* i) {
    uint32_t c = s[*i];
    if (c < 0x80) { *i += 1; return c; }
    size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    uint32_t cp = c & (0x7F >> n);
    for (size_t k = 1; k < n; k++) { cp = (cp << 6) | (s[*i + k] & 0x3F); }
    *i += n;
    return cp;
}

// writes code point cp (not a surrogate, at most U+10FFFF) as UTF-8 into out; returns its length
static inline size_t utf8_encode(uint32_t cp, unsigned char out[4]) {
    size_t n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    static const unsigned char lead[5] = {0, 0x00, 0xC0, 0xE0, 0xF0};
    out[0] = (unsigned char)(lead[n] | (cp >> (6 * (n - 1))));
    for (size_t k = 1; k < n; k++) { out[k] = (unsigned char)(0x80 | ((cp >> (6 * (n - 1 - k))) & 0x3F)); }
    return n;
}

// ----------------------------------------------------------------------------
// pre-tokenizer

enum { UNI_OTHER, UNI_LETTER, UNI_NUMBER, UNI_SPACE };

static inline int tokenizer_char_class(uint32_t cp) {
    if (cp < 0x80) { // most text is ASCII: skip the table search
        if ((uint32_t)((cp | 0x20) - 'a') < 26) { return UNI_LETTER; }
        if ((uint32_t)(cp - '0') < 10) { return UNI_NUMBER; }
        if (cp == ' ' || (cp >= '\t' && cp <= '\r')) { return UNI_SPACE; }
        return UNI_OTHER;
    }
    if (unicode_is_letter(cp)) { return UNI_LETTER; }
    if (unicode_is_number(cp)) { return UNI_NUMBER; }
    if (unicode_is_space(cp)) { return UNI_SPACE; }
    return UNI_OTHER;
}

// class of the code point at s[*i]; advances *i past it
static inline int tokenizer_next_class(const unsigned char* s, size_t* i) {
    return tokenizer_char_class(utf8_decode(s, i));
}

// end of the piece that starts at byte i < n of the valid UTF-8 s[0..n): the first alternative of
// the pattern that matches at i, as a backtracking regex engine picks it
static inline size_t tokenizer_piece_end(const unsigned char* s, size_t n, size_t i) {
    // 's|'t|'re|'ve|'m|'ll|'d (ASCII bytes are whole code points in UTF-8)
    if (s[i] == '\'' && i + 1 < n) {
        unsigned char a = s[i + 1];
        if (a == 's' || a == 't' || a == 'm' || a == 'd') { return i + 2; }
        if (i + 2 < n) {
            unsigned char b = s[i + 2];
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) { return i + 3; }
        }
    }
    size_t j = i;
    int cls = tokenizer_next_class(s, &j);
    // the optional space of ' ?\p{L}+', ' ?\p{N}+' and ' ?[^\s\p{L}\p{N}]+'
    if (s[i] == ' ' && j < n) {
        size_t k = j;
        int next = tokenizer_next_class(s, &k);
        if (next != UNI_SPACE) { cls = next; j = k; }
    }
    if (cls != UNI_SPACE) { // \p{L}+, \p{N}+ or [^\s\p{L}\p{N}]+
        while (j < n) {
            size_t k = j;
            if (tokenizer_next_class(s, &k) != cls) { break; }
            j = k;
        }
        return j;
    }
    size_t last = i; // start of the run's last whitespace character
    while (j < n) {
        size_t k = j;
        if (tokenizer_next_class(s, &k) != UNI_SPACE) { break; }
        last = j;
        j = k;
    }
    if (j == n) { return n; }       // \s+(?!\S) at the end of the text
    if (last > i) { return last; }  // \s+(?!\S) backs off one character so that it is not followed by \S
    return j;                       // \s+: one whitespace character before a non-space
}

// end of the piece that starts at byte i < n of the valid UTF-8 s[0..n) under Llama-3's pattern, the
// first alternative that matches at i as a backtracking regex engine picks it
static inline size_t tokenizer_piece_end_llama3(const unsigned char* s, size_t n, size_t i) {
    // (?i:'s|'t|'re|'ve|'m|'ll|'d): c | 0x20 is c's lower case for ASCII letters, and no other byte
    // maps to these letters; U+017F (long s) case-folds to s as well
    if (s[i] == '\'' && i + 1 < n) {
        unsigned char a = s[i + 1] | 0x20;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') { return i + 2; }
        if (i + 2 < n) {
            unsigned char b = s[i + 2] | 0x20;
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) { return i + 3; }
            if (s[i + 1] == 0xC5 && s[i + 2] == 0xBF) { return i + 3; }
        }
    }
    size_t j = i;
    int cls = tokenizer_next_class(s, &j);
    int crlf = s[i] == '\r' || s[i] == '\n';
    size_t k = j;
    int next = j < n ? tokenizer_next_class(s, &k) : UNI_OTHER; // the class of the second character
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (cls == UNI_LETTER || (cls != UNI_NUMBER && !crlf && j < n && next == UNI_LETTER)) {
        size_t end = cls == UNI_LETTER ? j : k;
        while (end < n) {
            size_t m = end;
            if (tokenizer_next_class(s, &m) != UNI_LETTER) { break; }
            end = m;
        }
        return end;
    }
    // \p{N}{1,3}
    if (cls == UNI_NUMBER) {
        size_t end = j;
        for (int count = 1; count < 3 && end < n; count++) {
            size_t m = end;
            if (tokenizer_next_class(s, &m) != UNI_NUMBER) { break; }
            end = m;
        }
        return end;
    }
    // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    if (cls == UNI_OTHER || (s[i] == ' ' && j < n && next == UNI_OTHER)) {
        size_t end = cls == UNI_OTHER ? j : k;
        while (end < n) {
            size_t m = end;
            if (tokenizer_next_class(s, &m) != UNI_OTHER) { break; }
            end = m;
        }
        while (end < n && (s[end] == '\r' || s[end] == '\n')) { end++; }
        return end;
    }
    // s[i] is whitespace: the run of it, where its last character and its last \r or \n are
    size_t end = j, last = i, after_crlf = crlf ? j : i;
    while (end < n) {
        size_t m = end;
        if (tokenizer_next_class(s, &m) != UNI_SPACE) { break; }
        if (s[end] == '\r' || s[end] == '\n') { after_crlf = m; }
        last = end;
        end = m;
    }
    if (after_crlf > i) { return after_crlf; } // \s*[\r\n]+ backs off to the last \r or \n of the run
    if (end == n) { return n; }               // \s+(?!\S) at the end of the text
    if (last > i) { return last; }            // \s+(?!\S) backs off one character so that it is not followed by \S
    return end;                               // \s+: one whitespace character before a non-space
}

// HF's Digits pre-tokenizer with individual_digits (before ByteLevel's regex): every \p{N} character
// is a piece of its own, and the regex splits each run between them as if it were the whole text.
// Returns the end of the run that starts at byte i < n: one number character, or the characters
// up to the next one.
static inline size_t tokenizer_digit_run_end(const unsigned char* s, size_t n, size_t i) {
    size_t j = i;
    if (tokenizer_next_class(s, &j) == UNI_NUMBER) { return j; }
    while (j < n) {
        size_t k = j;
        if (tokenizer_next_class(s, &k) == UNI_NUMBER) { break; }
        j = k;
    }
    return j;
}

// ----------------------------------------------------------------------------
// rank lookup and BPE merging

static inline uint64_t tokenizer_hash(const unsigned char* s, size_t n) {
    uint64_t h = 14695981039346656037ull; // FNV-1a
    for (size_t i = 0; i < n; i++) { h = (h ^ s[i]) * 1099511628211ull; }
    return h;
}

// the id of the token with bytes s[0..n), n > 0, or -1 if there is none
static inline int tokenizer_lookup(const Tokenizer* t, const unsigned char* s, size_t n) {
    for (size_t slot = tokenizer_hash(s, n) & t->table_mask;; slot = (slot + 1) & t->table_mask) {
        int id = t->table[slot];
        if (id < 0) { return -1; }
        size_t off = t->offsets[id];
        if (t->offsets[id + 1] - off == n && memcmp(t->bytes + off, s, n) == 0) { return id; }
    }
}

static inline void tokenizer_push(int id, int** ids, size_t* n_ids, size_t* cap) {
    if (*n_ids == *cap) {
        *cap = *cap == 0 ? 1024 : 2 * *cap;
        *ids = (int*)reallocCheck(*ids, *cap * sizeof(int));
    }
    (*ids)[(*n_ids)++] = id;
}

// a candidate merge: parts [left, mid) and [mid, end) of a piece; the rank of bytes [left, end)
typedef struct { int rank; size_t left; size_t end; } TokenizerPair;

// working memory of one encode call, grown to the longest piece that needed merging
typedef struct {
    size_t* next;        // next[p]: end of the part that starts at byte p (0 once p is merged away)
    size_t* prev;        // prev[p]: start of the part before the one at p
    TokenizerPair* heap; // min-heap by (rank, left): tiktoken merges the lowest rank, leftmost first
    size_t cap;
    int* sym;            // HF merging: the id of each symbol (-1 once merged into the one before)
} TokenizerScratch;

// room for a piece of m bytes: m - 1 pairs to start with, and each of the at most m - 1 merges
// adds at most 2
static inline void tokenizer_scratch_grow(TokenizerScratch* w, size_t m) {
    if (m <= w->cap) { return; }
    w->cap = m;
    w->next = (size_t*)reallocCheck(w->next, m * sizeof(size_t));
    w->prev = (size_t*)reallocCheck(w->prev, m * sizeof(size_t));
    w->heap = (TokenizerPair*)reallocCheck(w->heap, 3 * m * sizeof(TokenizerPair));
    w->sym = (int*)reallocCheck(w->sym, m * sizeof(int));
}

static inline int tokenizer_pair_less(const TokenizerPair* a, const TokenizerPair* b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static inline void tokenizer_heap_push(TokenizerPair* heap, size_t* n, TokenizerPair p) {
    size_t i = (*n)++;
    while (i > 0 && tokenizer_pair_less(&p, &heap[(i - 1) / 2])) {
        heap[i] = heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    heap[i] = p;
}

static inline TokenizerPair tokenizer_heap_pop(TokenizerPair* heap, size_t* n) {
    TokenizerPair top = heap[0];
    TokenizerPair last = heap[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) { break; }
        if (c + 1 < *n && tokenizer_pair_less(&heap[c + 1], &heap[c])) { c++; }
        if (!tokenizer_pair_less(&heap[c], &last)) { break; }
        heap[i] = heap[c];
        i = c;
    }
    heap[i] = last;
    return top;
}

// pushes the pair [left, end) of piece p if its bytes are a token
static inline void tokenizer_candidate(const Tokenizer* t, const unsigned char* p, size_t left, size_t end,
                                       TokenizerPair* heap, size_t* n) {
    int rank = tokenizer_lookup(t, p + left, end - left);
    if (rank >= 0) {
        TokenizerPair pair = {rank, left, end};
        tokenizer_heap_push(heap, n, pair);
    }
}

// byte-level BPE of the m-byte piece p, m >= 2. A heap with lazily dropped stale pairs gives the
// same merges as tiktoken's rescan of all pairs, in O(m log m) rather than O(m^2) for long pieces.
static inline void tokenizer_merge(const Tokenizer* t, const unsigned char* p, size_t m, TokenizerScratch* w,
                                   int** ids, size_t* n_ids, size_t* cap) {
    tokenizer_scratch_grow(w, m);
    size_t* next = w->next;
    size_t* prev = w->prev;
    size_t n_heap = 0;
    for (size_t i = 0; i < m; i++) {
        next[i] = i + 1;
        prev[i] = i == 0 ? 0 : i - 1;
        if (i + 1 < m) { tokenizer_candidate(t, p, i, i + 2, w->heap, &n_heap); }
    }
    while (n_heap > 0) {
        TokenizerPair pair = tokenizer_heap_pop(w->heap, &n_heap);
        size_t left = pair.left, mid = next[left];
        // a pair is stale once either part has changed; (left, end) then no longer spans two parts
        if (mid == 0 || mid >= m || next[mid] != pair.end) { continue; }
        next[left] = pair.end;
        next[mid] = 0;
        if (pair.end < m) {
            prev[pair.end] = left;
            tokenizer_candidate(t, p, left, next[pair.end], w->heap, &n_heap);
        }
        if (left > 0) { tokenizer_candidate(t, p, prev[left], pair.end, w->heap, &n_heap); }
    }
    for (size_t i = 0; i < m; i = next[i]) {
        tokenizer_push(tokenizer_lookup(t, p + i, next[i] - i), ids, n_ids, cap);
    }
}

// the index of the merge of tokens (a, b) in the merge list, -1 if there is none
static inline int tokenizer_merge_index(const Tokenizer* t, int a, int b) {
    uint64_t h = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) * 0x9E3779B97F4A7C15ull;
    for (size_t slot = (size_t)(h >> 20) & t->merge_mask;; slot = (slot + 1) & t->merge_mask) {
        int k = t->merge_table[slot];
        if (k < 0 || (t->merges[3 * k] == a && t->merges[3 * k + 1] == b)) { return k; }
    }
}

// pushes the pair of symbols (left, right) if the merge list has it: rank = its index, and (unlike
// tiktoken's pairs) end = the merged token's id
static inline void tokenizer_candidate_hf(const Tokenizer* t, const int* sym, size_t left, size_t right,
                                          TokenizerPair* heap, size_t* n) {
    int k = tokenizer_merge_index(t, sym[left], sym[right]);
    if (k >= 0) {
        TokenizerPair pair = {k, left, (size_t)t->merges[3 * k + 2]};
        tokenizer_heap_push(heap, n, pair);
    }
}

// HF's BPE model on the m-byte piece p (tokenizers' Word::merge_all): symbols are the pieces'
// single-byte tokens (bytes without one are dropped), then the pair with the lowest merge rank,
// leftmost on ties, merges until none is left. A queued pair is stale unless the two symbols now
// at its place still merge into its token.
static inline void tokenizer_merge_hf(const Tokenizer* t, const unsigned char* p, size_t m, TokenizerScratch* w,
                                      int** ids, size_t* n_ids, size_t* cap) {
    if (t->ignore_merges) {
        int id = tokenizer_lookup(t, p, m);
        if (id >= 0) { tokenizer_push(id, ids, n_ids, cap); return; }
    }
    tokenizer_scratch_grow(w, m);
    int* sym = w->sym;
    size_t* next = w->next;
    size_t* prev = w->prev;
    size_t n = 0, n_heap = 0;
    for (size_t i = 0; i < m; i++) {
        if (t->byte_token[p[i]] >= 0) { sym[n++] = t->byte_token[p[i]]; }
    }
    for (size_t k = 0; k < n; k++) {
        next[k] = k + 1;
        prev[k] = k == 0 ? 0 : k - 1;
        if (k + 1 < n) { tokenizer_candidate_hf(t, sym, k, k + 1, w->heap, &n_heap); }
    }
    while (n_heap > 0) {
        TokenizerPair pair = tokenizer_heap_pop(w->heap, &n_heap);
        size_t left = pair.left, right = next[left];
        if (sym[left] < 0 || right >= n) { continue; }
        int k = tokenizer_merge_index(t, sym[left], sym[right]);
        if (k < 0 || (size_t)t->merges[3 * k + 2] != pair.end) { continue; }
        sym[left] = (int)pair.end;
        sym[right] = -1;
        next[left] = next[right];
        if (left > 0) { tokenizer_candidate_hf(t, sym, prev[left], left, w->heap, &n_heap); }
        if (next[left] < n) {
            prev[next[left]] = left;
            tokenizer_candidate_hf(t, sym, left, next[left], w->heap, &n_heap);
        }
    }
    for (size_t k = 0; k < n; k = next[k]) { tokenizer_push(sym[k], ids, n_ids, cap); }
}

// ----------------------------------------------------------------------------
// public API

// ids of one piece (or chunk of a piece) p[0..m), appended to *ids
static inline void tokenizer_encode_piece(const Tokenizer* t, const unsigned char* p, size_t m, TokenizerScratch* w,
                                          int** ids, size_t* n_ids, size_t* cap) {
    if (t->hf_bpe) {
        tokenizer_merge_hf(t, p, m, w, ids, n_ids, cap);
    } else {
        int id = tokenizer_lookup(t, p, m);
        if (id >= 0) { tokenizer_push(id, ids, n_ids, cap); }
        else { tokenizer_merge(t, p, m, w, ids, n_ids, cap); }
    }
}

// appends the ids of text[0..len) to the growable array *ids (*n_ids used of *cap); returns 0,
// or -1 (appending nothing) if the text is not valid UTF-8. A piece longer than
// TOKENIZER_MAX_PIECE bytes is encoded as chunks of at most that many, each cut at the last
// character boundary that fits, so that memory (besides the ids) and time stay linear in len
static inline int tokenizer_encode(const Tokenizer* t, const char* text, size_t len,
                                   int** ids, size_t* n_ids, size_t* cap) {
    if (!utf8_valid(text, len, NULL)) { return -1; }
    const unsigned char* s = (const unsigned char*)text;
    TokenizerScratch w = {NULL, NULL, NULL, 0, NULL};
    size_t run_end = 0; // TOKENIZER_PATTERN_GPT2_DIGITS: the end of the run that i is in
    for (size_t i = 0; i < len;) {
        size_t end;
        if (t->pattern == TOKENIZER_PATTERN_LLAMA3) { end = tokenizer_piece_end_llama3(s, len, i); }
        else if (t->pattern == TOKENIZER_PATTERN_GPT2_DIGITS) {
            if (i >= run_end) { run_end = tokenizer_digit_run_end(s, len, i); }
            end = tokenizer_piece_end(s, run_end, i);
        } else { end = tokenizer_piece_end(s, len, i); }
        while (end - i > TOKENIZER_MAX_PIECE) {
            size_t cut = i + TOKENIZER_MAX_PIECE;
            while ((s[cut] & 0xC0) == 0x80) { cut--; } // not inside a character
            tokenizer_encode_piece(t, s + i, cut - i, &w, ids, n_ids, cap);
            i = cut;
        }
        tokenizer_encode_piece(t, s + i, end - i, &w, ids, n_ids, cap);
        i = end;
    }
    free(w.next);
    free(w.prev);
    free(w.heap);
    free(w.sym);
    return 0;
}

// the bytes of token id (*len of them; not NUL-terminated), NULL if id is out of range
static inline const unsigned char* tokenizer_decode(const Tokenizer* t, int id, size_t* len) {
    if (id < 0 || id >= t->vocab_size) { return NULL; }
    *len = t->offsets[id + 1] - t->offsets[id];
    return t->bytes + t->offsets[id];
}

// decodes canonical standard base64 s[0..n) into out; returns the byte count, -1 if malformed
static inline long tokenizer_base64_decode(const char* s, size_t n, unsigned char* out) {
    if (n == 0 || n % 4 != 0) { return -1; }
    size_t pad = s[n - 1] == '=' ? (s[n - 2] == '=' ? 2 : 1) : 0;
    long len = 0;
    uint32_t bits = 0;
    for (size_t i = 0; i < n - pad; i++) {
        char c = s[i];
        uint32_t v;
        if (c >= 'A' && c <= 'Z') { v = (uint32_t)(c - 'A'); }
        else if (c >= 'a' && c <= 'z') { v = (uint32_t)(c - 'a') + 26; }
        else if (c >= '0' && c <= '9') { v = (uint32_t)(c - '0') + 52; }
        else if (c == '+') { v = 62; }
        else if (c == '/') { v = 63; }
        else { return -1; }
        bits = (bits << 6) | v;
        if (i % 4 == 3) {
            out[len++] = (unsigned char)(bits >> 16);
            out[len++] = (unsigned char)(bits >> 8);
            out[len++] = (unsigned char)bits;
            bits = 0;
        }
    }
    // the last group: "xx==" holds one byte, "xxx=" two; the unused low bits must be zero
    if (pad == 2) {
        if (bits & 0xF) { return -1; }
        out[len++] = (unsigned char)(bits >> 4);
    } else if (pad == 1) {
        if (bits & 0x3) { return -1; }
        out[len++] = (unsigned char)(bits >> 10);
        out[len++] = (unsigned char)(bits >> 2);
    }
    return len;
}

// loads a tiktoken rank file and adds <|endoftext|> after its ranks; fatal() if it is missing or malformed.
// pattern is the pre-tokenizer: TOKENIZER_PATTERN_GPT2 or TOKENIZER_PATTERN_LLAMA3
static inline void tokenizer_init_pattern(Tokenizer* t, const char* path, int pattern) {
    memset(t, 0, sizeof(*t));
    t->pattern = pattern;
    FILE* fp = fopen(path, "rb");
    if (fp == NULL) {
        fatal("cannot open tokenizer file %s: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fileno(fp), &st) != 0 || !S_ISREG(st.st_mode)) { fatal("tokenizer file %s is not a regular file", path); }
    size_t size = (size_t)st.st_size;
    char* text = (char*)mallocCheck(size + 1);
    if (fread(text, 1, size, fp) != size) { fatal("cannot read tokenizer file %s: %s", path, strerror(errno)); }
    fclose(fp);
    text[size] = '\n'; // so that every line ends in '\n'
    size_t n_lines = 0;
    for (size_t i = 0; i < size; i++) { n_lines += text[i] == '\n'; }
    if (size > 0 && text[size - 1] != '\n') { n_lines++; }
    if (n_lines < 256) { fatal("tokenizer file %s has %zu lines; a rank file has one for each byte at least", path, n_lines); }
    if (n_lines >= TOKENIZER_MAX_TOKENS) {
        fatal("tokenizer file %s has %zu lines; at most %d ranks are supported", path, n_lines, TOKENIZER_MAX_TOKENS - 1);
    }

    static const char eot[] = "<|endoftext|>";
    t->vocab_size = (int)n_lines + 1;
    t->eot_token = (int)n_lines;
    t->bytes = (unsigned char*)mallocCheck(size + sizeof(eot)); // base64 is longer than what it encodes
    t->offsets = (size_t*)mallocCheck(((size_t)t->vocab_size + 1) * sizeof(size_t));
    size_t table_size = 1;
    while (table_size < 2 * n_lines) { table_size *= 2; }
    t->table_mask = table_size - 1;
    t->table = (int*)mallocCheck(table_size * sizeof(int));
    memset(t->table, -1, table_size * sizeof(int));

    size_t used = 0, line_start = 0;
    for (size_t id = 0; id < n_lines; id++) {
        size_t line_end = line_start;
        while (text[line_end] != '\n') { line_end++; }
        size_t space = line_start;
        while (space < line_end && text[space] != ' ') { space++; }
        long len = space < line_end ? tokenizer_base64_decode(text + line_start, space - line_start, t->bytes + used) : -1;
        // the rank must be the line number counted from 0, in plain decimal
        size_t rank = 0, digits = 0;
        for (size_t k = space + 1; k < line_end && text[k] >= '0' && text[k] <= '9' && digits < 10; k++, digits++) {
            rank = rank * 10 + (size_t)(text[k] - '0');
        }
        if (len <= 0 || digits == 0 || space + 1 + digits != line_end || rank != id) {
            fatal("tokenizer file %s: line %zu is not \"<base64 bytes> %zu\"", path, id + 1, id);
        }
        t->offsets[id] = used;
        const unsigned char* tok = t->bytes + used;
        size_t slot = tokenizer_hash(tok, (size_t)len) & t->table_mask;
        for (; t->table[slot] >= 0; slot = (slot + 1) & t->table_mask) {
            int other = t->table[slot];
            if (t->offsets[other + 1] - t->offsets[other] == (size_t)len &&
                memcmp(t->bytes + t->offsets[other], tok, (size_t)len) == 0) {
                fatal("tokenizer file %s: line %zu repeats the token of line %d", path, id + 1, other + 1);
            }
        }
        t->table[slot] = (int)id;
        used += (size_t)len;
        t->offsets[id + 1] = used; // needed by the duplicate check of later lines
        line_start = line_end + 1;
    }
    free(text);
    memcpy(t->bytes + used, eot, sizeof(eot) - 1);
    t->offsets[t->eot_token + 1] = used + sizeof(eot) - 1;
    // every byte must be a token, or some text could not be encoded
    for (int b = 0; b < 256; b++) {
        unsigned char byte = (unsigned char)b;
        if (tokenizer_lookup(t, &byte, 1) < 0) { fatal("tokenizer file %s: byte 0x%02X has no rank", path, b); }
    }
}

// GPT-2's tokenizer from its rank file
static inline void tokenizer_init(Tokenizer* t, const char* path) {
    tokenizer_init_pattern(t, path, TOKENIZER_PATTERN_GPT2);
}

static inline void tokenizer_free(Tokenizer* t) {
    free(t->bytes);
    free(t->offsets);
    free(t->table);
    free(t->merges);
    free(t->merge_table);
}

// writes llm.c's decode-only tokenizer file: a 256-int32 header (magic 20240328, version 2, vocab
// size, eot id), then for each token its length as one byte and its bytes
static inline void tokenizer_write_llmc(const Tokenizer* t, const char* path) {
    FILE* fp = fopenCheck(path, "wb");
    int32_t header[256] = {0};
    header[0] = 20240328;
    header[1] = 2;
    header[2] = t->vocab_size;
    header[3] = t->eot_token;
    fwriteCheck(header, sizeof(int32_t), 256, fp);
    for (int id = 0; id < t->vocab_size; id++) {
        size_t len;
        const unsigned char* bytes = tokenizer_decode(t, id, &len);
        if (len > 255) { fatal("token %d is %zu bytes, longer than llm.c's tokenizer file allows", id, len); }
        unsigned char len8 = (unsigned char)len;
        fwriteCheck(&len8, 1, 1, fp);
        fwriteCheck(bytes, 1, len, fp);
    }
    fcloseCheck(fp);
}

// ----------------------------------------------------------------------------
// Hugging Face tokenizer.json

#define TOKENIZER_GPT2_REGEX "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define TOKENIZER_LLAMA3_REGEX \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

// GPT-2's byte-level alphabet (its bytes_to_unicode): tokenizer.json writes byte b as the code point
// chars[b], printable Latin-1 as itself and the other 68 bytes as U+0100 to U+0143 in byte order
static inline void tokenizer_byte_chars(uint32_t chars[256]) {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        chars[b] = printable ? b : next++;
    }
}

// decodes the byte-level string s[0..n) (valid UTF-8) into out (n bytes at most); -1 if a
// character is outside the alphabet. from_char[cp] is the byte of code point cp < 324, else -1.
static inline long tokenizer_from_byte_chars(const char* s, size_t n, const int from_char[324], unsigned char* out) {
    long len = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp = utf8_decode((const unsigned char*)s, &i);
        if (cp >= 324 || from_char[cp] < 0) { return -1; }
        out[len++] = (unsigned char)from_char[cp];
    }
    return len;
}

// the pre-tokenizer of a tokenizer.json as one of the patterns; fatal() for any other
static inline int tokenizer_json_pattern(const JsonValue* pre, const char* path) {
    const JsonValue* steps = pre;
    size_t n = 1;
    if (json_string_is(json_get(pre, "type"), "Sequence")) {
        const JsonValue* list = json_get(pre, "pretokenizers");
        if (list == NULL || list->type != JSON_ARRAY) { fatal("%s: pre_tokenizer Sequence has no pretokenizers array", path); }
        steps = list->items;
        n = list->length;
    }
    int pattern = -1;
    if (pre != NULL && pre->type == JSON_OBJECT && (n == 1 || n == 2)) {
        const JsonValue* first = &steps[0];
        const JsonValue* last = &steps[n - 1];
        if (json_string_is(json_get(last, "type"), "ByteLevel")) {
            const JsonValue* prefix = json_get(last, "add_prefix_space");
            const JsonValue* regex = json_get(last, "use_regex");
            int use_regex = regex == NULL || regex->type == JSON_TRUE; // tokenizers' default is true
            if (prefix == NULL || prefix->type != JSON_FALSE) {
                fatal("%s: pre_tokenizer ByteLevel.add_prefix_space is not false: not supported", path);
            }
            const JsonValue* split = json_get(first, "pattern");
            const JsonValue* split_regex = json_get(split, "Regex");
            if (n == 1 && use_regex) { pattern = TOKENIZER_PATTERN_GPT2; }
            else if (n == 2 && use_regex && json_string_is(json_get(first, "type"), "Digits") &&
                     json_get(first, "individual_digits") != NULL && json_get(first, "individual_digits")->type == JSON_TRUE) {
                pattern = TOKENIZER_PATTERN_GPT2_DIGITS;
            } else if (n == 2 && !use_regex && json_string_is(json_get(first, "type"), "Split") &&
                       json_string_is(json_get(first, "behavior"), "Isolated") &&
                       json_get(first, "invert") != NULL && json_get(first, "invert")->type == JSON_FALSE) {
                if (json_string_is(split_regex, TOKENIZER_GPT2_REGEX)) { pattern = TOKENIZER_PATTERN_GPT2; }
                if (json_string_is(split_regex, TOKENIZER_LLAMA3_REGEX)) { pattern = TOKENIZER_PATTERN_LLAMA3; }
            }
        }
    }
    if (pattern < 0) {
        char desc[256] = "null";
        if (pre != NULL && pre->type == JSON_OBJECT) {
            size_t used = (size_t)snprintf(desc, sizeof(desc), "%s", n == 1 && steps == pre ? "" : "Sequence[");
            for (size_t k = 0; k < n && used < sizeof(desc); k++) {
                const JsonValue* type = json_get(&steps[k], "type");
                char shown[44];
                used += (size_t)snprintf(desc + used, sizeof(desc) - used, "%s%s", k ? ", " : "", type && type->type ==
                                         JSON_STRING ? json_escaped(shown, sizeof(shown), type->string, type->length) : "?");
            }
            if (!(n == 1 && steps == pre) && used < sizeof(desc)) { snprintf(desc + used, sizeof(desc) - used, "]"); }
        }
        fatal("%s: pre_tokenizer %s is not supported: byte-level BPE needs ByteLevel (with its regex), Digits"
              "(individual_digits) then ByteLevel, or a Split with GPT-2's or Llama-3's regex then ByteLevel without it",
              path, desc);
    }
    return pattern;
}

// loads a byte-level BPE tokenizer from a Hugging Face tokenizer.json; fatal() with a line naming
// the file and the field for anything malformed or unsupported
static inline void tokenizer_init_json(Tokenizer* t, const char* path) {
    memset(t, 0, sizeof(*t));
    t->hf_bpe = 1;
    JsonValue root;
    json_parse_file(path, &root);
    if (root.type != JSON_OBJECT) { fatal("%s: the top level is %s, not a tokenizer.json object", path, json_type_name(root.type)); }
    const JsonValue* model = json_get(&root, "model");
    if (model == NULL || model->type != JSON_OBJECT) { fatal("%s: no \"model\" object", path); }
    const JsonValue* v = json_get(model, "type");
    char a[64], b[64]; // strings of the file as the messages show them (json_escaped)
    if (!json_string_is(v, "BPE")) {
        fatal("%s: model.type is %s: only byte-level BPE is supported", path,
              v && v->type == JSON_STRING ? json_escaped(a, sizeof(a), v->string, v->length) : "missing");
    }
    // what HF's BPE model would do differently
    if ((v = json_get(model, "dropout")) != NULL && v->type != JSON_NULL) { fatal("%s: model.dropout is set: not supported", path); }
    if ((v = json_get(model, "byte_fallback")) != NULL && v->type != JSON_FALSE) {
        fatal("%s: model.byte_fallback is set: not supported", path);
    }
    static const char* const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int k = 0; k < 2; k++) {
        if ((v = json_get(model, affixes[k])) != NULL && v->type != JSON_NULL && !json_string_is(v, "")) {
            fatal("%s: model.%s is set: not supported", path, affixes[k]);
        }
    }
    const JsonValue* unk = json_get(model, "unk_token");
    if ((v = json_get(model, "ignore_merges")) != NULL && v->type != JSON_TRUE && v->type != JSON_FALSE) {
        fatal("%s: model.ignore_merges is %s, not true or false", path, json_type_name(v->type));
    }
    t->ignore_merges = v != NULL && v->type == JSON_TRUE;
    if ((v = json_get(&root, "normalizer")) != NULL && v->type != JSON_NULL) {
        const JsonValue* type = json_get(v, "type");
        fatal("%s: normalizer %s is not supported", path,
              type && type->type == JSON_STRING ? json_escaped(a, sizeof(a), type->string, type->length) : "?");
    }
    t->pattern = tokenizer_json_pattern(json_get(&root, "pre_tokenizer"), path);
    if (!json_string_is(json_get(json_get(&root, "decoder"), "type"), "ByteLevel")) {
        fatal("%s: decoder is not ByteLevel: not a byte-level BPE tokenizer", path);
    }
    const JsonValue* vocab = json_get(model, "vocab");
    const JsonValue* merges = json_get(model, "merges");
    const JsonValue* added = json_get(&root, "added_tokens");
    if (vocab == NULL || vocab->type != JSON_OBJECT) { fatal("%s: model.vocab is not an object", path); }
    if (merges == NULL || merges->type != JSON_ARRAY) { fatal("%s: model.merges is not an array", path); }
    if (added != NULL && added->type != JSON_ARRAY) { fatal("%s: added_tokens is not an array", path); }
    size_t n_added = added ? added->length : 0;

    // every id from 0 to n - 1 is one token: a vocabulary string, or an added token's text
    int n = 0;
    for (size_t k = 0; k < vocab->length + n_added; k++) {
        const JsonValue* id = k < vocab->length ? &vocab->members[k].value : json_get(&added->items[k - vocab->length], "id");
        if (k >= vocab->length && !json_get(&added->items[k - vocab->length], "content")) {
            fatal("%s: added_tokens[%zu] has no content", path, k - vocab->length);
        }
        if (id == NULL || id->type != JSON_NUMBER || !id->is_integer || id->integer < 0 || id->integer >= TOKENIZER_MAX_TOKENS) {
            if (k < vocab->length) {
                fatal("%s: model.vocab[\"%s\"] is not a token id", path,
                      json_escaped(a, sizeof(a), vocab->members[k].key, vocab->members[k].key_length));
            }
            fatal("%s: added_tokens[%zu].id is not a token id", path, k - vocab->length);
        }
        if (id->integer >= n) { n = (int)id->integer + 1; }
    }
    const char** text = (const char**)callocCheck(n ? n : 1, sizeof(char*));
    size_t* text_len = (size_t*)callocCheck(n ? n : 1, sizeof(size_t));
    char* is_added = (char*)callocCheck(n ? n : 1, 1);
    for (size_t k = 0; k < n_added; k++) {
        const JsonValue* content = json_get(&added->items[k], "content");
        int id = (int)json_get(&added->items[k], "id")->integer;
        if (content->type != JSON_STRING || content->length == 0) {
            fatal("%s: added_tokens[%zu].content is not a non-empty string", path, k);
        }
        if (is_added[id]) {
            fatal("%s: added tokens \"%s\" and \"%s\" both have id %d", path, json_escaped(a, sizeof(a), text[id], text_len[id]),
                  json_escaped(b, sizeof(b), content->string, content->length), id);
        }
        text[id] = content->string;
        text_len[id] = content->length;
        is_added[id] = 1;
    }
    for (size_t k = 0; k < vocab->length; k++) {
        const JsonMember* m = &vocab->members[k];
        int id = (int)m->value.integer;
        if (is_added[id]) {
            if (m->key_length != text_len[id] || memcmp(m->key, text[id], text_len[id]) != 0) {
                fatal("%s: id %d is \"%s\" in model.vocab but \"%s\" in added_tokens", path, id,
                      json_escaped(a, sizeof(a), m->key, m->key_length), json_escaped(b, sizeof(b), text[id], text_len[id]));
            }
            continue;
        }
        if (text[id] != NULL) {
            fatal("%s: tokens \"%s\" and \"%s\" both have id %d", path, json_escaped(a, sizeof(a), text[id], text_len[id]),
                  json_escaped(b, sizeof(b), m->key, m->key_length), id);
        }
        if (m->key_length == 0) { fatal("%s: model.vocab has an empty token (id %d)", path, id); }
        text[id] = m->key;
        text_len[id] = m->key_length;
    }
    for (int id = 0; id < n; id++) {
        if (text[id] == NULL) { fatal("%s: no token has id %d (the ids must run from 0 to %d)", path, id, n - 1); }
    }

    // the tokens' bytes, and the lookup table of the vocabulary's (not the added tokens')
    uint32_t chars[256];
    int from_char[324];
    tokenizer_byte_chars(chars);
    for (int c = 0; c < 324; c++) { from_char[c] = -1; }
    for (int b = 0; b < 256; b++) { from_char[chars[b]] = b; }
    size_t total = 0;
    for (int id = 0; id < n; id++) { total += text_len[id]; }
    t->vocab_size = n;
    t->bytes = (unsigned char*)mallocCheck(total ? total : 1);
    t->offsets = (size_t*)mallocCheck(((size_t)n + 1) * sizeof(size_t));
    size_t table_size = 2;
    while (table_size < 2 * (size_t)n) { table_size *= 2; }
    t->table_mask = table_size - 1;
    t->table = (int*)mallocCheck(table_size * sizeof(int));
    memset(t->table, -1, table_size * sizeof(int));
    size_t used = 0;
    for (int id = 0; id < n; id++) {
        t->offsets[id] = used;
        long len;
        if (is_added[id]) {
            memcpy(t->bytes + used, text[id], text_len[id]);
            len = (long)text_len[id];
        } else {
            len = tokenizer_from_byte_chars(text[id], text_len[id], from_char, t->bytes + used);
            if (len < 0) {
                fatal("%s: token \"%s\" (id %d) has a character outside GPT-2's byte-level alphabet: not a byte-level BPE "
                      "vocabulary", path, json_escaped(a, sizeof(a), text[id], text_len[id]), id);
            }
        }
        used += (size_t)len;
        t->offsets[id + 1] = used;
        if (is_added[id]) { continue; }
        size_t slot = tokenizer_hash(t->bytes + t->offsets[id], (size_t)len) & t->table_mask;
        for (; t->table[slot] >= 0; slot = (slot + 1) & t->table_mask) {} // distinct strings: distinct bytes
        t->table[slot] = id;
    }
    for (int b = 0; b < 256; b++) {
        unsigned char byte = (unsigned char)b;
        t->byte_token[b] = tokenizer_lookup(t, &byte, 1);
        if (t->byte_token[b] < 0 && unk != NULL && unk->type != JSON_NULL) {
            fatal("%s: byte 0x%02X has no token and model.unk_token is set: not supported", path, b);
        }
    }

    // the merges, "left right" (tokenizers < 0.20) or ["left", "right"]; rank = position
    t->n_merges = (int)merges->length;
    t->merges = (int*)mallocCheck(3 * (merges->length ? merges->length : 1) * sizeof(int));
    table_size = 2;
    while (table_size < 2 * merges->length) { table_size *= 2; }
    t->merge_mask = table_size - 1;
    t->merge_table = (int*)mallocCheck(table_size * sizeof(int));
    memset(t->merge_table, -1, table_size * sizeof(int));
    unsigned char* buf = (unsigned char*)mallocCheck(1);
    size_t buf_cap = 1;
    for (size_t k = 0; k < merges->length; k++) {
        const JsonValue* e = &merges->items[k];
        const char* part[2] = {NULL, NULL};
        size_t part_len[2] = {0, 0};
        if (e->type == JSON_STRING) {
            const char* space = (const char*)memchr(e->string, ' ', e->length);
            if (space != NULL && memchr(space + 1, ' ', e->length - (size_t)(space + 1 - e->string)) == NULL) {
                part[0] = e->string;
                part_len[0] = (size_t)(space - e->string);
                part[1] = space + 1;
                part_len[1] = e->length - part_len[0] - 1;
            }
        } else if (e->type == JSON_ARRAY && e->length == 2 && e->items[0].type == JSON_STRING && e->items[1].type == JSON_STRING) {
            for (int j = 0; j < 2; j++) { part[j] = e->items[j].string; part_len[j] = e->items[j].length; }
        }
        if (part[0] == NULL || part_len[0] == 0 || part_len[1] == 0) {
            fatal("%s: model.merges[%zu] is not \"left right\" or [\"left\", \"right\"]", path, k);
        }
        if (part_len[0] + part_len[1] > buf_cap) {
            buf_cap = part_len[0] + part_len[1];
            buf = (unsigned char*)reallocCheck(buf, buf_cap);
        }
        int ids[3];
        long len[2];
        for (int j = 0; j < 2; j++) {
            len[j] = tokenizer_from_byte_chars(part[j], part_len[j], from_char, buf + (j ? len[0] : 0));
            ids[j] = len[j] < 0 ? -1 : tokenizer_lookup(t, buf + (j ? len[0] : 0), (size_t)len[j]);
            if (ids[j] < 0) {
                fatal("%s: model.merges[%zu]: \"%s\" is not in the vocabulary", path, k,
                      json_escaped(a, sizeof(a), part[j], part_len[j]));
            }
        }
        ids[2] = tokenizer_lookup(t, buf, (size_t)(len[0] + len[1]));
        if (ids[2] < 0) {
            fatal("%s: model.merges[%zu]: \"%s\" + \"%s\" is not in the vocabulary", path, k,
                  json_escaped(a, sizeof(a), part[0], part_len[0]), json_escaped(b, sizeof(b), part[1], part_len[1]));
        }
        int other = tokenizer_merge_index(t, ids[0], ids[1]);
        if (other >= 0) { fatal("%s: model.merges[%zu] repeats model.merges[%d]", path, k, other); }
        memcpy(t->merges + 3 * k, ids, sizeof(ids));
        uint64_t h = ((uint64_t)(uint32_t)ids[0] << 32 | (uint32_t)ids[1]) * 0x9E3779B97F4A7C15ull;
        size_t slot = (size_t)(h >> 20) & t->merge_mask;
        while (t->merge_table[slot] >= 0) { slot = (slot + 1) & t->merge_mask; }
        t->merge_table[slot] = (int)k;
    }
    free(buf);

    // the token that starts (and ends) documents
    static const char* const doc_tokens[] = {"<|endoftext|>", "<|begin_of_text|>"};
    t->eot_token = -1;
    for (int k = 0; k < 2 && t->eot_token < 0; k++) {
        for (int id = 0; id < n && t->eot_token < 0; id++) {
            if (text_len[id] == strlen(doc_tokens[k]) && memcmp(text[id], doc_tokens[k], text_len[id]) == 0) { t->eot_token = id; }
        }
    }
    if (t->eot_token < 0) { fatal("%s: no <|endoftext|> or <|begin_of_text|> token to start documents with", path); }
    free(text);
    free(text_len);
    free(is_added);
    json_free(&root);
}

// a rank file (GPT-2's pre-tokenizer), or a tokenizer.json if its first byte that is not
// whitespace is '{'
static inline void tokenizer_load(Tokenizer* t, const char* path) {
    FILE* fp = fopen(path, "rb");
    int c = EOF;
    if (fp != NULL) {
        do { c = fgetc(fp); } while (c == ' ' || c == '\t' || c == '\n' || c == '\r');
        fclose(fp);
    }
    if (c == '{') { tokenizer_init_json(t, path); }
    else { tokenizer_init(t, path); }
}

// tokenizer_load, for a model of vocab_size tokens (model: its file, for the error)
static inline void tokenizer_load_for_model(Tokenizer* t, const char* path, int vocab_size, const char* model) {
    tokenizer_load(t, path);
    if (t->vocab_size != vocab_size) {
        fatal("%s has %d tokens but the model %s has vocab_size %d", path, t->vocab_size, model, vocab_size);
    }
}

// writes bytes s[0..n) in the byte-level alphabet, escaped for the inside of a JSON string
static inline void tokenizer_write_byte_chars(FILE* fp, const unsigned char* s, size_t n, const uint32_t chars[256]) {
    for (size_t i = 0; i < n; i++) {
        char buf[8];
        size_t len = 0;
        if (chars[s[i]] == '"' || chars[s[i]] == '\\') { buf[len++] = '\\'; }
        len = json_put_utf8(buf, len, chars[s[i]]);
        fwrite(buf, 1, len, fp);
    }
}

// writes the tokenizer of a rank file as an equivalent tokenizer.json: the ranks as the vocabulary,
// the end-of-text token as an added special token, and as merges every split of each token into two
// tokens (the order of transformers' tiktoken converter: by the merged token's rank, then the
// parts'), with ignore_merges, so that HF's BPE gives tiktoken's ids
static inline void tokenizer_write_json(const Tokenizer* t, const char* path) {
    if (t->hf_bpe) { fatal("%s: only a rank file's tokenizer is written as a tokenizer.json; copy a tokenizer.json", path); }
    uint32_t chars[256];
    tokenizer_byte_chars(chars);
    char tmp[4096];
    FILE* fp = atomic_open(path, tmp, sizeof(tmp));
    size_t eot_len = 0;
    const unsigned char* eot = tokenizer_decode(t, t->eot_token, &eot_len);
    fprintf(fp, "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[{\"id\":%d,\"content\":", t->eot_token);
    json_write_string(fp, (const char*)eot, eot_len);
    fprintf(fp, ",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true}],"
                "\"normalizer\":null,\"pre_tokenizer\":");
    const char* byte_level = "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":%s}";
    if (t->pattern == TOKENIZER_PATTERN_GPT2) { fprintf(fp, byte_level, "true"); }
    else if (t->pattern == TOKENIZER_PATTERN_GPT2_DIGITS) {
        fprintf(fp, "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\",\"individual_digits\":true},");
        fprintf(fp, byte_level, "true");
        fprintf(fp, "]}");
    } else {
        fprintf(fp, "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":");
        json_write_string(fp, TOKENIZER_LLAMA3_REGEX, strlen(TOKENIZER_LLAMA3_REGEX));
        fprintf(fp, "},\"behavior\":\"Isolated\",\"invert\":false},");
        fprintf(fp, byte_level, "false");
        fprintf(fp, "]}");
    }
    fprintf(fp, ",\"post_processor\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":false,\"use_regex\":true},"
                "\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,\"use_regex\":true},"
                "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":null,"
                "\"end_of_word_suffix\":null,\"fuse_unk\":false,\"byte_fallback\":false,\"ignore_merges\":true,\"vocab\":{");
    for (int id = 0; id < t->vocab_size; id++) {
        size_t len = 0;
        const unsigned char* bytes = tokenizer_decode(t, id, &len);
        if (id > 0) { fputc(',', fp); }
        if (id == t->eot_token) { json_write_string(fp, (const char*)bytes, len); }
        else {
            fputc('"', fp);
            tokenizer_write_byte_chars(fp, bytes, len, chars);
            fputc('"', fp);
        }
        fprintf(fp, ":%d", id);
    }
    fprintf(fp, "},\"merges\":[");
    int first = 1;
    size_t* split = NULL; // the split points of one token that make two tokens, sorted by the parts' ids
    size_t split_cap = 0;
    for (int id = 0; id < t->vocab_size; id++) {
        size_t len = 0;
        const unsigned char* bytes = tokenizer_decode(t, id, &len);
        if (id == t->eot_token || len < 2) { continue; }
        if (len > split_cap) { split_cap = len; split = (size_t*)reallocCheck(split, split_cap * sizeof(size_t)); }
        size_t n_split = 0;
        for (size_t k = 1; k < len; k++) {
            int a = tokenizer_lookup(t, bytes, k), b = tokenizer_lookup(t, bytes + k, len - k);
            if (a < 0 || b < 0) { continue; }
            size_t j = n_split++; // insertion by (a, b)
            for (; j > 0; j--) {
                size_t p = split[j - 1];
                int pa = tokenizer_lookup(t, bytes, p), pb = tokenizer_lookup(t, bytes + p, len - p);
                if (pa < a || (pa == a && pb < b)) { break; }
                split[j] = p;
            }
            split[j] = k;
        }
        for (size_t j = 0; j < n_split; j++) {
            fputs(first ? "\"" : ",\"", fp);
            first = 0;
            tokenizer_write_byte_chars(fp, bytes, split[j], chars);
            fputc(' ', fp);
            tokenizer_write_byte_chars(fp, bytes + split[j], len - split[j], chars);
            fputc('"', fp);
        }
    }
    free(split);
    fprintf(fp, "]}}\n");
    atomic_commit(fp, tmp, path);
}

#endif // LLMC_TOKENIZER_H
