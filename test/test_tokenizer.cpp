/*
 Tests llmc/tokenizer.h: exact GPT-2 ids on the reference vectors of test/data/tokenizer_vectors.txt
 (from the npm package gpt-tokenizer), the heap merge against tiktoken's plain rescan merge, round
 trips decode(encode(s)) == s on random valid UTF-8, rejection of invalid UTF-8, the llm.c
 tokenizer file, and clear errors for bad rank files. Run from the repository root.
*/
#include "llmc/tokenizer.h"
#include "test/test.h"

#define VECTORS_PATH "test/data/tokenizer_vectors.txt"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rng_next(uint32_t n) { // uniform enough in [0, n) for test data (splitmix64)
    rng_state += 0x9E3779B97F4A7C15ull;
    uint64_t z = rng_state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)((z ^ (z >> 31)) % n);
}

// a growable byte string
typedef struct { char* data; size_t len, cap; } Buf;

static void buf_put(Buf* b, const void* bytes, size_t n) {
    if (b->len + n > b->cap) {
        b->cap = 2 * (b->len + n) + 64;
        b->data = (char*)reallocCheck(b->data, b->cap);
    }
    memcpy(b->data + b->len, bytes, n);
    b->len += n;
}

static void buf_put_cp(Buf* b, uint32_t cp) {
    unsigned char u[4];
    buf_put(b, u, utf8_encode(cp, u));
}

// decode(ids) as one byte string
static Buf decode_all(const Tokenizer* t, const int* ids, size_t n) {
    Buf out = {NULL, 0, 0};
    for (size_t i = 0; i < n; i++) {
        size_t len = 0;
        const unsigned char* bytes = tokenizer_decode(t, ids[i], &len);
        if (bytes != NULL) { buf_put(&out, bytes, len); }
    }
    return out;
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') { return c - '0'; }
    if (c >= 'a' && c <= 'f') { return c - 'a' + 10; }
    return -1;
}

static void test_vectors(const Tokenizer* t) {
    FILE* fp = fopenCheck(VECTORS_PATH, "rb");
    size_t size = (size_t)file_size(fp);
    char* text = (char*)mallocCheck(size + 1);
    freadCheck(text, 1, size, fp);
    fcloseCheck(fp);
    text[size] = '\0';
    Buf expect_text = {NULL, 0, 0};
    int n_vectors = 0;
    int* ids = NULL;
    size_t cap = 0;
    for (char* line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        if (strncmp(line, "text ", 5) == 0) {
            expect_text.len = 0;
            for (const char* h = line + 5; h[0] != '\0' && h[1] != '\0'; h += 2) {
                char byte = (char)(hex_value(h[0]) * 16 + hex_value(h[1]));
                buf_put(&expect_text, &byte, 1);
            }
        } else if (strncmp(line, "ids", 3) == 0) {
            // the expected ids
            int expect[8192];
            size_t n_expect = 0;
            for (char* p = line + 3; *p != '\0' && n_expect < 8192;) {
                char* end;
                long v = strtol(p, &end, 10);
                if (end == p) { break; }
                expect[n_expect++] = (int)v;
                p = end;
            }
            size_t n_ids = 0;
            int rc = tokenizer_encode(t, expect_text.data, expect_text.len, &ids, &n_ids, &cap);
            size_t first_diff = 0;
            while (first_diff < n_ids && first_diff < n_expect && ids[first_diff] == expect[first_diff]) { first_diff++; }
            CHECK(rc == 0 && n_ids == n_expect && first_diff == n_expect,
                  "vector %d (%zu bytes): %zu ids, expected %zu, first difference at %zu (got %d, expected %d)",
                  n_vectors, expect_text.len, n_ids, n_expect, first_diff,
                  first_diff < n_ids ? ids[first_diff] : -1, first_diff < n_expect ? expect[first_diff] : -1);
            n_vectors++;
        }
    }
    CHECK(n_vectors >= 190, "only %d vectors in %s", n_vectors, VECTORS_PATH);
    free(ids);
    free(expect_text.data);
    free(text);
}

// tiktoken's merge as written there: rescan every adjacent pair, merge the lowest rank (leftmost)
static void naive_bpe(const Tokenizer* t, const unsigned char* p, size_t m, int** ids, size_t* n, size_t* cap) {
    int whole = tokenizer_lookup(t, p, m);
    if (whole >= 0) { tokenizer_push(whole, ids, n, cap); return; }
    size_t* starts = (size_t*)mallocCheck((m + 1) * sizeof(size_t));
    size_t parts = m;
    for (size_t i = 0; i <= m; i++) { starts[i] = i; }
    for (;;) {
        int best = -1;
        size_t best_i = 0;
        for (size_t i = 0; i + 1 < parts; i++) {
            int r = tokenizer_lookup(t, p + starts[i], starts[i + 2] - starts[i]);
            if (r >= 0 && (best < 0 || r < best)) { best = r; best_i = i; }
        }
        if (best < 0) { break; }
        memmove(starts + best_i + 1, starts + best_i + 2, (parts - best_i - 1) * sizeof(size_t));
        parts--;
    }
    for (size_t i = 0; i < parts; i++) {
        tokenizer_push(tokenizer_lookup(t, p + starts[i], starts[i + 1] - starts[i]), ids, n, cap);
    }
    free(starts);
}

static void naive_encode(const Tokenizer* t, const char* text, size_t len, int** ids, size_t* n, size_t* cap) {
    const unsigned char* s = (const unsigned char*)text;
    for (size_t i = 0; i < len;) {
        size_t end = tokenizer_piece_end(s, len, i);
        naive_bpe(t, s + i, end - i, ids, n, cap);
        i = end;
    }
}

// random valid UTF-8 mixing ASCII (with contraction bait), whitespace runs and code points of all planes
static void random_text(Buf* b) {
    static const uint32_t spaces[] = {' ', ' ', ' ', '\n', '\t', '\r', 0x0B, 0x0C, 0x85, 0xA0, 0x2003, 0x2028, 0x3000};
    static const char ascii[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?'\"-()[]{}<>/\\|@#$%^&*_+=~`";
    static const char* words[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "don't", " the", " and", "ing", "\n\n"};
    b->len = 0;
    uint32_t segments = rng_next(12);
    for (uint32_t s = 0; s < segments; s++) {
        uint32_t kind = rng_next(5), count = 1 + rng_next(kind == 1 ? 6 : 16);
        for (uint32_t k = 0; k < count; k++) {
            if (kind == 0) { buf_put(b, &ascii[rng_next(sizeof(ascii) - 1)], 1); }
            else if (kind == 1) { buf_put_cp(b, spaces[rng_next(sizeof(spaces) / sizeof(spaces[0]))]); }
            else if (kind == 2) { const char* w = words[rng_next(sizeof(words) / sizeof(words[0]))]; buf_put(b, w, strlen(w)); }
            else if (kind == 3) { buf_put_cp(b, 0x80 + rng_next(0x3000 - 0x80)); } // Latin to CJK punctuation
            else {
                uint32_t cp = rng_next(0x110000);
                if (cp >= 0xD800 && cp <= 0xDFFF) { cp -= 0x800; } // no surrogates
                buf_put_cp(b, cp);
            }
        }
    }
}

static void test_random(const Tokenizer* t) {
    Buf text = {NULL, 0, 0};
    int *ids = NULL, *ref = NULL;
    size_t cap = 0, ref_cap = 0;
    int roundtrip_bad = 0, merge_bad = 0, range_bad = 0;
    const int cases = 4000;
    for (int c = 0; c < cases; c++) {
        random_text(&text);
        size_t n = 0, n_ref = 0;
        int rc = tokenizer_encode(t, text.data, text.len, &ids, &n, &cap);
        if (rc != 0 || !utf8_valid(text.data, text.len, NULL)) { roundtrip_bad++; continue; }
        Buf back = decode_all(t, ids, n);
        if (back.len != text.len || (text.len > 0 && memcmp(back.data, text.data, text.len) != 0)) {
            if (roundtrip_bad++ == 0) { fprintf(stderr, "round trip fails on case %d (%zu bytes)\n", c, text.len); }
        }
        free(back.data);
        for (size_t i = 0; i < n; i++) { range_bad += ids[i] < 0 || ids[i] >= t->eot_token; }
        naive_encode(t, text.data, text.len, &ref, &n_ref, &ref_cap);
        if (n != n_ref || (n > 0 && memcmp(ids, ref, n * sizeof(int)) != 0)) {
            if (merge_bad++ == 0) { fprintf(stderr, "heap merge differs from rescan merge on case %d\n", c); }
        }
    }
    CHECK(roundtrip_bad == 0, "%d of %d random texts do not round-trip", roundtrip_bad, cases);
    CHECK(merge_bad == 0, "%d of %d random texts merge differently", merge_bad, cases);
    CHECK(range_bad == 0, "%d ids out of range", range_bad);

    // long pieces, where the heap merge matters: letters, a digit run, spaces, punctuation
    static const char* fills[] = {"a", "ab", "7", " ", "=-", "\xC3\xA9", "\xE6\x97\xA5"};
    for (size_t f = 0; f < sizeof(fills) / sizeof(fills[0]); f++) {
        text.len = 0;
        for (int k = 0; k < 3000; k++) { buf_put(&text, fills[f], strlen(fills[f])); }
        size_t n = 0, n_ref = 0;
        tokenizer_encode(t, text.data, text.len, &ids, &n, &cap);
        naive_encode(t, text.data, text.len, &ref, &n_ref, &ref_cap);
        Buf back = decode_all(t, ids, n);
        CHECK(n == n_ref && memcmp(ids, ref, n * sizeof(int)) == 0 && back.len == text.len &&
              memcmp(back.data, text.data, text.len) == 0, "long run of \"%s\": %zu ids, rescan %zu", fills[f], n, n_ref);
        free(back.data);
    }
    free(ids);
    free(ref);
    free(text.data);
}

static void test_utf8(const Tokenizer* t) {
    // valid boundaries: U+0000, U+007F, U+0080, U+07FF, U+0800, U+D7FF, U+E000, U+FFFF, U+10000, U+10FFFF
    static const char valid[] = "a\0\x7F\xC2\x80\xDF\xBF\xE0\xA0\x80\xED\x9F\xBF\xEE\x80\x80\xEF\xBF\xBF"
                                "\xF0\x90\x80\x80\xF4\x8F\xBF\xBF";
    int* ids = NULL;
    size_t n = 0, cap = 0, bad = 99;
    CHECK(utf8_valid(valid, sizeof(valid) - 1, &bad) == 1, "boundary code points rejected at byte %zu", bad);
    CHECK(tokenizer_encode(t, valid, sizeof(valid) - 1, &ids, &n, &cap) == 0, "boundary code points not encoded");
    Buf back = decode_all(t, ids, n);
    CHECK(back.len == sizeof(valid) - 1 && memcmp(back.data, valid, back.len) == 0, "boundary code points do not round-trip");
    free(back.data);

    struct { const char* s; size_t bad; const char* what; } cases[] = {
        {"ok \xC0\x80", 3, "overlong NUL"},
        {"ok \xC1\xBF", 3, "overlong 2-byte"},
        {"ok \xE0\x80\xAF", 3, "overlong 3-byte"},
        {"ok \xF0\x8F\xBF\xBF", 3, "overlong 4-byte"},
        {"ok \xED\xA0\x80", 3, "high surrogate"},
        {"ok \xED\xBF\xBF", 3, "low surrogate"},
        {"ok \xF4\x90\x80\x80", 3, "above U+10FFFF"},
        {"ok \xF5\x80\x80\x80", 3, "lead byte F5"},
        {"ok \xFF", 3, "byte FF"},
        {"ok \xFE", 3, "byte FE"},
        {"\x80 stray", 0, "stray continuation first"},
        {"abc\xBF", 3, "stray continuation"},
        {"\xC3\xA9\xA9", 2, "extra continuation"},
        {"ok \xE2\x82", 3, "truncated 3-byte"},
        {"ok \xF0\x9F\x98", 3, "truncated 4-byte"},
        {"ok \xC3", 3, "truncated at the end"},
        {"ok \xC3" "A", 3, "bad continuation"},
        {"ok \xE2\x28\xA1", 3, "bad second byte"},
        {"ok \xF0\x9F\x98" "x", 3, "bad fourth byte"},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        size_t len = strlen(cases[c].s);
        bad = 99;
        n = 0;
        CHECK(utf8_valid(cases[c].s, len, &bad) == 0 && bad == cases[c].bad,
              "%s: accepted or bad offset %zu, expected %zu", cases[c].what, bad, cases[c].bad);
        CHECK(tokenizer_encode(t, cases[c].s, len, &ids, &n, &cap) == -1 && n == 0, "%s: encoded", cases[c].what);
    }
    free(ids);
}

static void test_llmc_file(const Tokenizer* t) {
    const Path path = tmp_path("tokenizer.bin");
    tokenizer_write_llmc(t, path.s);
    FILE* fp = fopenCheck(path.s, "rb");
    int32_t header[256];
    freadCheck(header, sizeof(int32_t), 256, fp);
    CHECK(header[0] == 20240328 && header[1] == 2 && header[2] == 50257 && header[3] == 50256,
          "llm.c header %d %d %d %d", header[0], header[1], header[2], header[3]);
    int bad = 0;
    for (int id = 0; id < t->vocab_size; id++) {
        unsigned char len8, bytes[256];
        size_t len;
        const unsigned char* want = tokenizer_decode(t, id, &len);
        if (fread(&len8, 1, 1, fp) != 1 || fread(bytes, 1, len8, fp) != len8 || len8 != len ||
            memcmp(bytes, want, len) != 0) {
            bad++;
        }
    }
    CHECK(bad == 0, "%d tokens differ in the llm.c file", bad);
    CHECK(fgetc(fp) == EOF, "llm.c file has trailing bytes");
    fcloseCheck(fp);
}

static void init_child(const void* path) {
    Tokenizer t;
    tokenizer_init(&t, (const char*)path);
    tokenizer_free(&t);
}

// 1 if tokenizer_init(path) exits with status 1 and one line on stderr that names the file and why
static int init_fails_with(const char* path, const char* why) {
    char msg[1024];
    int status = run_child(init_child, path, msg, sizeof(msg));
    int ok = status == 1 && strstr(msg, path) != NULL && strstr(msg, why) != NULL &&
             strchr(msg, '\n') == msg + strlen(msg) - 1;
    if (!ok) { fprintf(stderr, "tokenizer_init(%s) exited %d: %s", path, status, msg); }
    return ok;
}

static void test_bad_files(void) {
    CHECK(init_fails_with("/nonexistent/ranks.tiktoken", "cannot open"), "missing file");
    CHECK(init_fails_with(tmp_dir, "not a regular file"), "a directory");
    const Path path = tmp_path("ranks.tiktoken");
    struct { const char* last_line; const char* why; } cases[] = {
        {"QUJD 256\n", ""},                    // a valid file: no error
        {"QUJD 257\n", "line 257"},            // rank out of order
        {"QUJD\n", "line 257"},                // no rank
        {"QU*D 256\n", "line 257"},            // not base64
        {"QUJ= 256\n", "line 257"},            // non-canonical base64
        {"QQ== 256\n", "repeats"},             // a duplicate of byte 'A'
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        FILE* fp = fopenCheck(path.s, "wb");
        for (int b = 0; b < 256; b++) { // every byte as a token, in base64
            static const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
            fprintf(fp, "%c%c== %d\n", b64[b >> 2], b64[(b & 3) << 4], b);
        }
        fputs(cases[c].last_line, fp);
        fcloseCheck(fp);
        if (cases[c].why[0] == '\0') {
            Tokenizer t;
            tokenizer_init(&t, path.s);
            int* out = NULL;
            size_t n = 0, cap = 0;
            tokenizer_encode(&t, "ABC", 3, &out, &n, &cap);
            CHECK(t.vocab_size == 258 && t.eot_token == 257 && n == 1 && out[0] == 256,
                  "small rank file: vocab %d, %zu ids", t.vocab_size, n);
            free(out);
            tokenizer_free(&t);
        } else {
            CHECK(init_fails_with(path.s, cases[c].why), "bad rank file case %zu not rejected", c);
        }
    }
}

// a piece longer than TOKENIZER_MAX_PIECE is encoded as chunks of at most that many bytes, cut at
// character boundaries: the ids are the chunks' ids, and they decode to the text
static void test_long_pieces(const Tokenizer* t) {
    static const char* fills[] = {"7", "\xE6\x97\xA5", " "}; // a digit run, a CJK letter run, spaces
    for (size_t f = 0; f < sizeof(fills) / sizeof(fills[0]); f++) {
        Buf text = {NULL, 0, 0};
        while (text.len < 3 * TOKENIZER_MAX_PIECE + 1000) { buf_put(&text, fills[f], strlen(fills[f])); }
        int *ids = NULL, *part = NULL;
        size_t n = 0, cap = 0, n_part = 0, part_cap = 0;
        CHECK(tokenizer_encode(t, text.data, text.len, &ids, &n, &cap) == 0, "long run of \"%s\"", fills[f]);
        size_t char_len = strlen(fills[f]), at = 0;
        while (at < text.len) { // the documented cuts, chunk by chunk
            size_t len = text.len - at;
            if (len > TOKENIZER_MAX_PIECE) { len = TOKENIZER_MAX_PIECE / char_len * char_len; }
            tokenizer_encode(t, text.data + at, len, &part, &n_part, &part_cap);
            at += len;
        }
        Buf back = decode_all(t, ids, n);
        CHECK(n == n_part && memcmp(ids, part, n * sizeof(int)) == 0, "long run of \"%s\": %zu ids, by chunks %zu",
              fills[f], n, n_part);
        CHECK(back.len == text.len && memcmp(back.data, text.data, text.len) == 0, "long run of \"%s\" round trip", fills[f]);
        free(back.data);
        free(ids);
        free(part);
        free(text.data);
    }
}

int main(void) {
    make_tmp_dir("test_tokenizer");
    Tokenizer t;
    tokenizer_init(&t, TOKENIZER_DEFAULT_PATH);
    CHECK(t.vocab_size == 50257 && t.eot_token == 50256, "vocab %d, eot %d", t.vocab_size, t.eot_token);
    size_t len = 0;
    const unsigned char* eot = tokenizer_decode(&t, t.eot_token, &len);
    CHECK(eot != NULL && len == 13 && memcmp(eot, "<|endoftext|>", 13) == 0, "eot decodes wrong");
    CHECK(tokenizer_decode(&t, -1, &len) == NULL && tokenizer_decode(&t, 50257, &len) == NULL, "out of range id decodes");
    int* ids = NULL;
    size_t n = 0, cap = 0;
    CHECK(tokenizer_encode(&t, "Hello world", 11, &ids, &n, &cap) == 0 && n == 2 && ids[0] == 15496 && ids[1] == 995,
          "Hello world");
    CHECK(tokenizer_encode(&t, " again", 6, &ids, &n, &cap) == 0 && n == 3 && ids[0] == 15496 && ids[2] == 757,
          "encode appends");
    free(ids);

    test_vectors(&t);
    test_random(&t);
    test_long_pieces(&t);
    test_utf8(&t);
    test_llmc_file(&t);
    test_bad_files();
    tokenizer_free(&t);
    remove_tmp_dir();
    return test_summary("test_tokenizer");
}
