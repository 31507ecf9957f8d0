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
 tokenizer_init_pattern(t, path, TOKENIZER_PATTERN_LLAMA3) instead splits with Llama-3's pattern (also
 tiktoken's cl100k_base's)
     (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 for Llama-3's rank file (128000 ranks; the added special token, 128000, is <|begin_of_text|>).
*/
#ifndef LLMC_TOKENIZER_H
#define LLMC_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include "llmc/unicode_tables.h"
#include "llmc/utils.h"

#define TOKENIZER_DEFAULT_PATH "data/r50k_base.tiktoken"

typedef struct {
    int vocab_size;          // ranks in the file + 1
    int eot_token;           // <|endoftext|>, the last id
    unsigned char* bytes;    // every token's bytes, back to back
    size_t* offsets;         // token i is bytes[offsets[i] .. offsets[i + 1])
    int* table;              // open addressing, token bytes -> id (-1: empty slot); eot is not in it
    size_t table_mask;       // table size - 1, a power of two at least twice the ranks
    int pattern;             // pre-tokenizer: TOKENIZER_PATTERN_GPT2 or TOKENIZER_PATTERN_LLAMA3
} Tokenizer;

enum { TOKENIZER_PATTERN_GPT2, TOKENIZER_PATTERN_LLAMA3 };

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
} TokenizerScratch;

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
    if (m > w->cap) {
        w->cap = m;
        w->next = (size_t*)reallocCheck(w->next, m * sizeof(size_t));
        w->prev = (size_t*)reallocCheck(w->prev, m * sizeof(size_t));
        // m - 1 pairs to start with, and each of the at most m - 1 merges adds at most 2
        w->heap = (TokenizerPair*)reallocCheck(w->heap, 3 * m * sizeof(TokenizerPair));
    }
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

// ----------------------------------------------------------------------------
// public API

// appends the ids of text[0..len) to the growable array *ids (*n_ids used of *cap); returns 0,
// or -1 (appending nothing) if the text is not valid UTF-8
static inline int tokenizer_encode(const Tokenizer* t, const char* text, size_t len,
                                   int** ids, size_t* n_ids, size_t* cap) {
    if (!utf8_valid(text, len, NULL)) { return -1; }
    const unsigned char* s = (const unsigned char*)text;
    TokenizerScratch w = {NULL, NULL, NULL, 0};
    for (size_t i = 0; i < len;) {
        size_t end = t->pattern == TOKENIZER_PATTERN_LLAMA3 ? tokenizer_piece_end_llama3(s, len, i)
                                                            : tokenizer_piece_end(s, len, i);
        int id = tokenizer_lookup(t, s + i, end - i);
        if (id >= 0) { tokenizer_push(id, ids, n_ids, cap); }
        else { tokenizer_merge(t, s + i, end - i, &w, ids, n_ids, cap); }
        i = end;
    }
    free(w.next);
    free(w.prev);
    free(w.heap);
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
    t->pattern = pattern;
    FILE* fp = fopen(path, "rb");
    if (fp == NULL) {
        fatal("cannot open tokenizer file %s: %s (dev/data/fetch_tokenizer.sh makes it)", path, strerror(errno));
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

#endif // LLMC_TOKENIZER_H
