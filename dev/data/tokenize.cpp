/*
 Turns text into llm.c token shards (GPT-2 BPE, uint16 tokens). Each input file, or with --jsonl FIELD
 each record (line) of a JSON-lines file, is one document, written as <|endoftext|> + encode(text), in
 input order. Tokens fill shards of -s tokens as llm.c's fineweb.py does: <out>_val_000000.bin first,
 then <out>_train_000001.bin, ...; a document that does not fit is split across the shard boundary, and
 the last, partial shard is written too. With --val_docs K the val shard is instead exactly the first K
 documents (a split by documents, as llm.c's tinystories.py makes), and train shards follow as above.

   ./tokenize -o data/corpus [-s shard_tokens] [-t rank_file] [--jsonl FIELD] [--val_docs K] FILE...
*/
#include <time.h>
#include "llmc/shard.h"
#include "llmc/tokenizer.h"

// ----------------------------------------------------------------------------
// shards, filled in document order as fineweb.py fills them

typedef struct {
    const char* out;       // shard path prefix
    size_t shard_tokens;   // tokens per shard
    size_t val_docs;       // 0: the val shard is the first shard_tokens tokens; else the first val_docs documents
    uint32_t* buf;         // the shard being filled
    size_t n, cap;
    int shard_index;
    size_t docs;           // documents added so far
    size_t tokens;         // tokens written or buffered so far
    size_t val_tokens;
} ShardWriter;

static void writer_append(ShardWriter* w, const int* ids, size_t n) {
    if (w->n + n > w->cap) {
        w->cap = 2 * (w->n + n);
        // only a val shard of val_docs documents can outgrow shard_tokens
        int by_docs = w->val_docs > 0 && w->shard_index == 0;
        if (!by_docs && w->cap > w->shard_tokens) { w->cap = w->shard_tokens; }
        w->buf = (uint32_t*)reallocCheck(w->buf, w->cap * sizeof(uint32_t));
    }
    for (size_t i = 0; i < n; i++) { w->buf[w->n + i] = (uint32_t)ids[i]; }
    w->n += n;
    w->tokens += n;
}

static void writer_flush(ShardWriter* w) {
    const char* split = w->shard_index == 0 ? "val" : "train";
    size_t len = strlen(w->out) + 32;
    char* path = (char*)mallocCheck(len);
    snprintf(path, len, "%s_%s_%06d.bin", w->out, split, w->shard_index);
    shard_write(path, w->buf, w->n, 2);
    printf("wrote %s: %zu tokens\n", path, w->n);
    free(path);
    if (w->shard_index == 0) { w->val_tokens = w->n; }
    w->shard_index++;
    w->n = 0;
}

static void writer_add_document(ShardWriter* w, const int* ids, size_t n) {
    w->docs++;
    if (w->val_docs > 0 && w->shard_index == 0) {
        writer_append(w, ids, n);
        if (w->docs == w->val_docs) { writer_flush(w); }
        return;
    }
    // fineweb.py: what does not fit completes this shard and the rest starts the next one
    while (w->n + n >= w->shard_tokens) {
        size_t take = w->shard_tokens - w->n;
        writer_append(w, ids, take);
        writer_flush(w);
        ids += take;
        n -= take;
    }
    writer_append(w, ids, n);
}

static void writer_finish(ShardWriter* w) {
    if (w->val_docs > 0 && w->shard_index == 0) {
        fatal("--val_docs %zu, but there are only %zu documents", w->val_docs, w->docs);
    }
    if (w->n > 0) { writer_flush(w); }
    free(w->buf);
}

// ----------------------------------------------------------------------------
// JSON lines: the string value of one top-level field of each record

typedef struct {
    const char* p;
    const char* end;
    const char* err; // first error, NULL while parsing goes well
} Json;

static void json_ws(Json* j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\r' || *j->p == '\n')) { j->p++; }
}

static int json_fail(Json* j, const char* err) {
    if (j->err == NULL) { j->err = err; }
    return 0;
}

static int json_hex4(Json* j, uint32_t* v) {
    if (j->end - j->p < 4) { return json_fail(j, "truncated \\u escape"); }
    *v = 0;
    for (int k = 0; k < 4; k++) {
        char c = *j->p++;
        uint32_t d = c >= '0' && c <= '9' ? (uint32_t)(c - '0') : c >= 'a' && c <= 'f' ? (uint32_t)(c - 'a' + 10)
                   : c >= 'A' && c <= 'F' ? (uint32_t)(c - 'A' + 10) : 16;
        if (d == 16) { return json_fail(j, "bad \\u escape"); }
        *v = *v * 16 + d;
    }
    return 1;
}

static void put_bytes(char** out, size_t* len, size_t* cap, const void* bytes, size_t n) {
    if (*len + n > *cap) {
        *cap = 2 * (*len + n) + 256;
        *out = (char*)reallocCheck(*out, *cap);
    }
    memcpy(*out + *len, bytes, n);
    *len += n;
}

// a JSON string at j->p (at its opening quote); decoded into *out when out != NULL
static int json_string(Json* j, char** out, size_t* len, size_t* cap) {
    j->p++;
    while (j->p < j->end && *j->p != '"') {
        unsigned char c = (unsigned char)*j->p;
        if (c < 0x20) { return json_fail(j, "control character in a string"); }
        if (c != '\\') {
            const char* run = j->p; // copy a run of plain bytes at once
            while (j->p < j->end && *j->p != '"' && *j->p != '\\' && (unsigned char)*j->p >= 0x20) { j->p++; }
            if (out != NULL) { put_bytes(out, len, cap, run, (size_t)(j->p - run)); }
            continue;
        }
        if (++j->p == j->end) { break; }
        char e = *j->p++;
        char simple = e == '"' ? '"' : e == '\\' ? '\\' : e == '/' ? '/' : e == 'b' ? '\b' : e == 'f' ? '\f'
                    : e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t' : 0;
        if (simple != 0) {
            if (out != NULL) { put_bytes(out, len, cap, &simple, 1); }
            continue;
        }
        if (e != 'u') { return json_fail(j, "bad escape in a string"); }
        uint32_t cp;
        if (!json_hex4(j, &cp)) { return 0; }
        if (cp >= 0xDC00 && cp <= 0xDFFF) { return json_fail(j, "lone low surrogate escape"); }
        if (cp >= 0xD800 && cp <= 0xDBFF) { // a UTF-16 pair makes one code point
            uint32_t lo;
            if (j->end - j->p < 2 || j->p[0] != '\\' || j->p[1] != 'u') { return json_fail(j, "lone high surrogate escape"); }
            j->p += 2;
            if (!json_hex4(j, &lo)) { return 0; }
            if (lo < 0xDC00 || lo > 0xDFFF) { return json_fail(j, "lone high surrogate escape"); }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        unsigned char u[4];
        size_t n = utf8_encode(cp, u);
        if (out != NULL) { put_bytes(out, len, cap, u, n); }
    }
    if (j->p == j->end) { return json_fail(j, "unterminated string"); }
    j->p++;
    return 1;
}

// skips any JSON value
static int json_skip(Json* j, int depth) {
    json_ws(j);
    if (j->p == j->end) { return json_fail(j, "missing value"); }
    if (depth > 64) { return json_fail(j, "nested too deeply"); }
    char c = *j->p;
    if (c == '"') { return json_string(j, NULL, NULL, NULL); }
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->p++;
        json_ws(j);
        if (j->p < j->end && *j->p == close) { j->p++; return 1; }
        for (;;) {
            if (c == '{') {
                json_ws(j);
                if (j->p == j->end || *j->p != '"' || !json_string(j, NULL, NULL, NULL)) { return json_fail(j, "bad object key"); }
                json_ws(j);
                if (j->p == j->end || *j->p++ != ':') { return json_fail(j, "missing ':'"); }
            }
            if (!json_skip(j, depth + 1)) { return 0; }
            json_ws(j);
            if (j->p < j->end && *j->p == ',') { j->p++; continue; }
            if (j->p < j->end && *j->p == close) { j->p++; return 1; }
            return json_fail(j, "missing ',' or closing bracket");
        }
    }
    // number, true, false, null: a run of their characters
    const char* start = j->p;
    while (j->p < j->end && *j->p != '\0' && strchr("+-.0123456789eEtruefalsn", *j->p) != NULL) { j->p++; }
    return j->p > start ? 1 : json_fail(j, "unexpected character");
}

// the string value of top-level field `field` of the JSON object line[0..len), decoded into *out;
// NULL on success, else what is wrong
static const char* json_field(const char* line, size_t len, const char* field, char** out, size_t* out_len, size_t* cap) {
    Json j = {line, line + len, NULL};
    size_t field_len = strlen(field);
    int found = 0;
    json_ws(&j);
    if (j.p == j.end || *j.p++ != '{') { return "not a JSON object"; }
    json_ws(&j);
    if (j.p < j.end && *j.p == '}') { j.p++; }
    else {
        for (;;) {
            json_ws(&j);
            if (j.p == j.end || *j.p != '"') { return "bad object key"; }
            const char* key = j.p + 1;
            if (!json_string(&j, NULL, NULL, NULL)) { return j.err; }
            // keys are compared as written; a key with escapes does not match
            int match = (size_t)(j.p - 1 - key) == field_len && memcmp(key, field, field_len) == 0;
            json_ws(&j);
            if (j.p == j.end || *j.p++ != ':') { return "missing ':'"; }
            json_ws(&j);
            if (match && j.p < j.end && *j.p == '"') {
                *out_len = 0;
                if (!json_string(&j, out, out_len, cap)) { return j.err; }
                found = 1;
            } else if (!json_skip(&j, 0)) {
                return j.err;
            }
            json_ws(&j);
            if (j.p < j.end && *j.p == ',') { j.p++; continue; }
            if (j.p < j.end && *j.p == '}') { j.p++; break; }
            return "missing ',' or '}'";
        }
    }
    json_ws(&j);
    if (j.p != j.end) { return "trailing characters after the object"; }
    return found ? NULL : "no string field of that name";
}

// ----------------------------------------------------------------------------

static char* read_file(const char* path, size_t* size) {
    FILE* fp = fopen(path, "rb");
    if (fp == NULL) { fatal("cannot read %s: %s", path, strerror(errno)); }
    size_t cap = 1 << 20, n = 0;
    char* data = (char*)mallocCheck(cap);
    for (;;) { // read to the end rather than trust the size of a pipe or special file
        n += fread(data + n, 1, cap - n, fp);
        if (ferror(fp)) { fatal("cannot read %s: %s", path, strerror(errno)); }
        if (n < cap) { break; }
        cap *= 2;
        data = (char*)reallocCheck(data, cap);
    }
    fclose(fp);
    *size = n;
    return data;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    const Tokenizer* tok;
    ShardWriter writer;
    int* ids;              // the current document's tokens
    size_t n_ids, ids_cap;
    size_t bytes_in;       // input bytes consumed, for the progress line
    double start, last_report;
} Tokenize;

// one document: <|endoftext|> + encode(text), into the shards; input_bytes is what it took of the input
static void add_document(Tokenize* job, const char* text, size_t len, size_t input_bytes) {
    job->n_ids = 0;
    tokenizer_push(job->tok->eot_token, &job->ids, &job->n_ids, &job->ids_cap);
    if (tokenizer_encode(job->tok, text, len, &job->ids, &job->n_ids, &job->ids_cap) != 0) {
        // files are checked when read and JSON escapes when decoded, so this is a bug
        fatal("document %zu is not valid UTF-8", job->writer.docs + 1);
    }
    writer_add_document(&job->writer, job->ids, job->n_ids);
    job->bytes_in += input_bytes;
    double t = now_seconds();
    if (t - job->last_report > 2.0) {
        fprintf(stderr, "tokenize: %zu documents, %zu tokens, %.1f MB/s\n", job->writer.docs, job->writer.tokens,
                (double)job->bytes_in / (t - job->start) / 1e6);
        job->last_report = t;
    }
}

static void usage(void) {
    fprintf(stderr,
            "usage: ./tokenize -o OUT [-s SHARD_TOKENS] [-t RANK_FILE] [--jsonl FIELD] [--val_docs K] FILE...\n"
            "  each FILE (or each line of a JSON-lines FILE, field FIELD) is one document\n"
            "  -o OUT          shard prefix: OUT_val_000000.bin, OUT_train_000001.bin, ...\n"
            "  -s SHARD_TOKENS tokens per shard (default 100000000, as llm.c's fineweb.py)\n"
            "  -t RANK_FILE    tokenizer rank file (default " TOKENIZER_DEFAULT_PATH ")\n"
            "  --jsonl FIELD   read JSON lines and tokenize the string field FIELD of each\n"
            "  --val_docs K    the val shard is the first K documents instead of the first shard\n");
    exit(EXIT_FAILURE);
}

static size_t parse_count(const char* flag, const char* s) {
    char* end;
    errno = 0;
    double v = strtod(s, &end); // accepts 1e8
    if (errno != 0 || end == s || *end != '\0' || !(v >= 1 && v <= 1e15) || v != (double)(size_t)v) {
        fatal("%s wants a positive whole number, got '%s'", flag, s);
    }
    return (size_t)v;
}

int main(int argc, char** argv) {
    const char* out = NULL;
    const char* rank_file = TOKENIZER_DEFAULT_PATH;
    const char* jsonl_field = NULL;
    size_t shard_tokens = 100000000, val_docs = 0;
    int first_input = argc;
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        if (a[0] != '-') { first_input = i; break; }
        if (i + 1 >= argc) { usage(); }
        if (strcmp(a, "-o") == 0) { out = argv[++i]; }
        else if (strcmp(a, "-s") == 0) { shard_tokens = parse_count(a, argv[++i]); }
        else if (strcmp(a, "-t") == 0) { rank_file = argv[++i]; }
        else if (strcmp(a, "--jsonl") == 0) { jsonl_field = argv[++i]; }
        else if (strcmp(a, "--val_docs") == 0) { val_docs = parse_count(a, argv[++i]); }
        else { usage(); }
    }
    if (out == NULL || first_input >= argc) { usage(); }
    if (shard_tokens > (size_t)INT32_MAX) { fatal("-s %zu: a shard holds at most %d tokens", shard_tokens, INT32_MAX); }

    Tokenizer tok;
    tokenizer_init(&tok, rank_file);
    Tokenize job = {&tok, {out, shard_tokens, val_docs, NULL, 0, 0, 0, 0, 0, 0}, NULL, 0, 0, 0, now_seconds(), 0};
    job.last_report = job.start;
    char* text = NULL;
    size_t text_len = 0, text_cap = 0;
    for (int f = first_input; f < argc; f++) {
        const char* path = argv[f];
        size_t size, bad;
        char* data = read_file(path, &size);
        if (!utf8_valid(data, size, &bad)) { fatal("%s is not valid UTF-8 at byte %zu", path, bad); }
        if (jsonl_field == NULL) {
            add_document(&job, data, size, size);
        } else {
            size_t line_no = 0;
            for (size_t pos = 0; pos < size;) {
                const char* line = data + pos;
                const char* nl = (const char*)memchr(line, '\n', size - pos);
                size_t line_len = nl != NULL ? (size_t)(nl - line) : size - pos;
                pos += line_len + 1;
                line_no++;
                size_t blank = 0;
                while (blank < line_len && (line[blank] == ' ' || line[blank] == '\t' || line[blank] == '\r')) { blank++; }
                if (blank == line_len) { continue; }
                const char* err = json_field(line, line_len, jsonl_field, &text, &text_len, &text_cap);
                if (err != NULL) { fatal("%s:%zu: %s (--jsonl %s)", path, line_no, err, jsonl_field); }
                add_document(&job, text, text_len, line_len + 1);
            }
        }
        free(data);
    }
    writer_finish(&job.writer);
    double seconds = now_seconds() - job.start;
    const ShardWriter* w = &job.writer;
    printf("tokenize: %zu documents, %zu tokens (%zu val, %zu train) in %d shards; %.1f MB of text in %.1f s\n",
           w->docs, w->tokens, w->val_tokens, w->tokens - w->val_tokens, w->shard_index, (double)job.bytes_in / 1e6,
           seconds);
    free(job.ids);
    free(text);
    tokenizer_free(&tok);
    return 0;
}
