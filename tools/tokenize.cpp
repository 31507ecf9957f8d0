/*
 Turns text into llm.c token shards, byte for byte as llm.c's dev/data/fineweb.py writes them. Each input
 file, or with --jsonl FIELD each line (record) of a JSON-lines input, is one document, written as the
 separator token followed by encode(text), in input order. Tokens fill shards of -s tokens:
 <out>_val_000000.bin first, then <out>_train_000001.bin, ...; a document that does not fit completes the
 shard and its rest starts the next one; the last, partial shard is written too. With --val-docs K the val
 shard is instead exactly the first K documents (a split by documents, as llm.c's tinystories.py makes),
 and train shards follow as above.

 Vocabularies: gpt2 (r50k_base; uint16 tokens, magic 20240520; separator <|endoftext|> = 50256) and
 llama3 (Llama-3's tiktoken ranks and pre-tokenizer; uint32 tokens, magic 20240801; separator
 <|begin_of_text|> = 128000, as llm.c uses it).

 Text that is not valid UTF-8 stops the run with an error naming the file and the byte, unless
 --invalid-utf8 says otherwise: "replace" puts U+FFFD for each maximal ill-formed subsequence, as
 Python's bytes.decode(errors="replace") does (and the WHATWG and Unicode's recommended practice),
 "skip" leaves the document out (it still counts as an input document for --val-docs and --resume);
 the summary counts both.

 Documents are tokenized in parallel (OpenMP) a batch at a time; one thread writes the previous batch in
 input order and reads the next while the others tokenize, so the shards are the same bytes whatever the
 thread count. After each complete shard <out>.state records how much of the input the complete shards
 hold; --resume skips that much input and goes on, giving the bytes of a run that never stopped.

 With --hellaswag it writes instead one multiple-choice eval file (llmc/evalset.h) from HellaSwag's JSON
 lines ({"ctx": ..., "endings": [...], "label": k, ...}): each context as the document-start token then
 encode(ctx), each ending encode(" " + ending), as llm.c's hellaswag.py renders them; the tokenizer may
 also be a Hugging Face tokenizer.json there.

   ./tokenize -o OUT [options] FILE...        (FILE "-" is standard input; --help lists the options)
   ./tokenize --hellaswag -o OUT.bin [-t TOKENIZER] [--vocab V] [--total-docs N] FILE...
*/
#include <fcntl.h>
#include <omp.h>
#include <sys/stat.h>
#include "llmc/cli.h"
#include "llmc/evalset.h"
#include "llmc/shard.h"
#include "llmc/tokenizer.h"

#define LLAMA3_RANKS 128000 // Llama-3's tokenizer.model; <|begin_of_text|> is the next id, 128000

// a batch ends at this many input bytes (or --batch-docs documents); a longer document is a batch alone
enum { BATCH_BYTES = 8 << 20 };

enum { UTF8_STOP, UTF8_REPLACE, UTF8_SKIP }; // --invalid-utf8

typedef struct {
    const char* out;          // shard path prefix
    const char* rank_file;
    const char* jsonl_field;  // documents are JSON lines, the text in this field
    int records;              // documents are records: uint32 little-endian byte count, then the text
    int llama3;               // vocabulary: 0 gpt2, 1 llama3
    size_t shard_tokens, val_docs;
    int resume;
    size_t max_shards;        // stop once this many shards are complete (0: never)
    size_t total_docs;        // documents in the whole input, for the ETA and a check (0: unknown)
    size_t first_doc;         // the input starts at this document of the stream (the caller skipped the rest)
    size_t batch_docs;
    int invalid_utf8;         // UTF8_STOP, UTF8_REPLACE or UTF8_SKIP
    char** inputs;
    int n_inputs;
} Options;

// ----------------------------------------------------------------------------
// progress line on stderr: rewritten in place on a terminal, else one line now and then

typedef struct {
    int tty;
    double start, last;
    size_t total_bytes;    // of all inputs, 0 if unknown (a pipe)
    size_t total_docs;     // from --total-docs, 0 if unknown
    size_t skipped_docs;   // documents before this run's first (resume)
    size_t skipped_bytes;  // input bytes of those that this run read past
    size_t bytes;          // input bytes tokenized by this run
    int on_screen;         // a line without '\n' is showing
} Progress;

static void progress_clear(Progress* p) {
    if (p->on_screen) { fputs("\r\033[K", stderr); }
    p->on_screen = 0;
}

static void progress_show(Progress* p, size_t docs, size_t tokens) {
    double t = now_seconds();
    if (t - p->last < (p->tty ? 0.25 : 30.0)) { return; }
    p->last = t;
    double elapsed = t - p->start > 1e-9 ? t - p->start : 1e-9;
    char eta[64] = "";
    double left = -1; // seconds
    if (p->total_docs > 0 && docs > p->skipped_docs) {
        double rate = (double)(docs - p->skipped_docs) / elapsed;
        left = docs < p->total_docs ? (double)(p->total_docs - docs) / rate : 0;
        snprintf(eta, sizeof(eta), " | %.1f%%", 100.0 * (double)docs / (double)p->total_docs);
    } else if (p->total_bytes > 0 && p->bytes > 0) {
        size_t done = p->skipped_bytes + p->bytes;
        left = done < p->total_bytes ? (double)(p->total_bytes - done) / ((double)p->bytes / elapsed) : 0;
        snprintf(eta, sizeof(eta), " | %.1f%%", 100.0 * (double)done / (double)p->total_bytes);
    }
    if (left >= 0) {
        long s = (long)(left + 0.5);
        size_t used = strlen(eta);
        snprintf(eta + used, sizeof(eta) - used, " | ETA %ldh%02ldm%02lds", s / 3600, s / 60 % 60, s % 60);
    }
    progress_clear(p);
    fprintf(stderr, "tokenize: %zu docs | %zu tokens | %.1f MB/s%s%s", docs, tokens, (double)p->bytes / elapsed / 1e6,
            eta, p->tty ? "" : "\n");
    p->on_screen = p->tty;
    fflush(stderr);
}

// ----------------------------------------------------------------------------
// shards, filled in document order as fineweb.py fills them, and the resume state

typedef struct {
    const Options* o;
    int token_bytes;       // 2 (gpt2) or 4 (llama3)
    uint32_t* buf;         // the shard being filled
    size_t n, cap;
    size_t shards;         // complete shards: 0 .. shards - 1 are written
    size_t docs;           // documents all of whose tokens are in complete shards or buf
    size_t tokens;         // tokens in complete shards and buf
    size_t val_tokens;
    // resume: the first document added continues one whose first `drop` tokens complete shards hold,
    // the last n_tail of them at the end of the last complete shard (to check that the input is the same)
    size_t drop;
    uint32_t* tail;
    size_t n_tail;
    int stop;              // --max-shards reached, or an error
    char err[512];         // the error, empty if none
    size_t replaced_docs;  // documents with invalid UTF-8 replaced (--invalid-utf8 replace), this run
    size_t replaced_seqs;  // the U+FFFD put in them
    size_t skipped_docs;   // documents left out for invalid UTF-8 (--invalid-utf8 skip), this run
    Progress* progress;
} ShardWriter;

static char* path_with(const char* out, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static char* path_with(const char* out, const char* fmt, ...) {
    char suffix[64];
    va_list args;
    va_start(args, fmt);
    vsnprintf(suffix, sizeof(suffix), fmt, args);
    va_end(args);
    size_t len = strlen(out) + strlen(suffix) + 1;
    char* path = (char*)mallocCheck(len);
    snprintf(path, len, "%s%s", out, suffix);
    return path;
}

static char* shard_path(const char* out, size_t index) {
    return path_with(out, "_%s_%06zu.bin", index == 0 ? "val" : "train", index);
}

static const char* vocab_name(const Options* o) { return o->llama3 ? "llama3" : "gpt2"; }

// the state after `shards` complete shards that hold `docs` whole documents and `doc_tokens` tokens of the next
static void state_write(const ShardWriter* w, size_t docs, size_t doc_tokens) {
    char* path = path_with(w->o->out, ".state");
    char tmp[4096];
    FILE* fp = atomic_open(path, tmp, sizeof(tmp));
    fprintf(fp, "tokenize_state 1\nshards %zu\ndocs %zu\ndoc_tokens %zu\ntokens %zu\nval_tokens %zu\n"
            "shard_tokens %zu\nval_docs %zu\nvocab %s\n",
            w->shards, docs, doc_tokens, w->tokens, w->val_tokens, w->o->shard_tokens, w->o->val_docs,
            vocab_name(w->o));
    atomic_commit(fp, tmp, path);
    free(path);
}

static void writer_append(ShardWriter* w, const int* ids, size_t n) {
    if (w->n + n > w->cap) {
        w->cap = 2 * (w->n + n);
        // only a val shard of val_docs documents can outgrow shard_tokens
        int by_docs = w->o->val_docs > 0 && w->shards == 0;
        if (!by_docs && w->cap > w->o->shard_tokens) { w->cap = w->o->shard_tokens; }
        w->buf = (uint32_t*)reallocCheck(w->buf, w->cap * sizeof(uint32_t));
    }
    for (size_t i = 0; i < n; i++) { w->buf[w->n + i] = (uint32_t)ids[i]; }
    w->n += n;
    w->tokens += n;
}

// writes the buffer as the next shard; docs and doc_tokens say where in the input it ends (state_write)
static void writer_flush(ShardWriter* w, size_t docs, size_t doc_tokens) {
    char* path = shard_path(w->o->out, w->shards);
    shard_write(path, w->buf, w->n, w->token_bytes);
    progress_clear(w->progress);
    printf("wrote %s: %zu tokens\n", path, w->n);
    fflush(stdout);
    free(path);
    if (w->shards == 0) { w->val_tokens = w->n; }
    w->shards++;
    w->n = 0;
    state_write(w, docs, doc_tokens);
    if (w->o->max_shards > 0 && w->shards == w->o->max_shards) { w->stop = 1; }
}

static void writer_add_document(ShardWriter* w, const int* ids, size_t n) {
    size_t done = 0; // tokens of this document in complete shards
    if (w->drop > 0) {
        int same = n >= w->drop;
        for (size_t i = 0; same && i < w->n_tail; i++) { same = (uint32_t)ids[w->drop - w->n_tail + i] == w->tail[i]; }
        if (!same) {
            snprintf(w->err, sizeof(w->err), "--resume: document %zu does not continue the last complete shard "
                     "as %s.state says; is the input the one the interrupted run had?", w->docs + 1, w->o->out);
            w->stop = 1;
            return;
        }
        done = w->drop;
        w->drop = 0;
    }
    if (w->o->val_docs > 0 && w->shards == 0) {
        writer_append(w, ids, n);
        w->docs++;
        if (w->docs == w->o->val_docs) { writer_flush(w, w->docs, 0); }
        return;
    }
    // fineweb.py: what does not fit completes this shard and the rest starts the next one
    while (w->n + (n - done) >= w->o->shard_tokens) {
        size_t take = w->o->shard_tokens - w->n;
        writer_append(w, ids + done, take);
        done += take;
        if (done == n) { w->docs++; }
        writer_flush(w, w->docs, done == n ? 0 : done);
        if (w->stop) { return; }
    }
    if (done < n) {
        writer_append(w, ids + done, n - done);
        w->docs++;
    }
}

// a document left out (--invalid-utf8 skip): it adds no tokens but counts as an input document
static void writer_skip_document(ShardWriter* w) {
    if (w->drop > 0) { // the document that the last complete shard continues cannot be one left out
        snprintf(w->err, sizeof(w->err), "--resume: document %zu does not continue the last complete shard as %s.state "
                 "says; is the input the one the interrupted run had?", w->docs + 1, w->o->out);
        w->stop = 1;
        return;
    }
    w->docs++;
    w->skipped_docs++;
    if (w->o->val_docs > 0 && w->shards == 0 && w->docs == w->o->val_docs) { writer_flush(w, w->docs, 0); }
}

// ----------------------------------------------------------------------------
// resume: check the state file and the complete shards it names, and take over its position

// reads "key value" where value is a whole number; the keys must come in this order
static size_t state_field(FILE* fp, const char* path, const char* key) {
    char name[64];
    size_t v;
    if (fscanf(fp, "%63s %zu", name, &v) != 2 || strcmp(name, key) != 0) {
        fatal("%s: expected a line \"%s <number>\"; not a tokenize state file?", path, key);
    }
    return v;
}

static void writer_resume(ShardWriter* w, size_t* skip_docs) {
    const Options* o = w->o;
    char* path = path_with(o->out, ".state");
    FILE* fp = fopen(path, "rb");
    if (fp == NULL) { // nothing to resume: start from the beginning
        if (o->first_doc > 0) { fatal("--first-doc %zu, but there is no %s to resume from", o->first_doc, path); }
        free(path);
        return;
    }
    size_t version = state_field(fp, path, "tokenize_state");
    if (version != 1) { fatal("%s: version %zu, this tokenize reads version 1", path, version); }
    size_t shards = state_field(fp, path, "shards");
    size_t docs = state_field(fp, path, "docs");
    size_t doc_tokens = state_field(fp, path, "doc_tokens");
    size_t tokens = state_field(fp, path, "tokens");
    size_t val_tokens = state_field(fp, path, "val_tokens");
    size_t shard_tokens = state_field(fp, path, "shard_tokens");
    size_t val_docs = state_field(fp, path, "val_docs");
    char vocab[16];
    if (fscanf(fp, " vocab %15s", vocab) != 1) { fatal("%s: expected a line \"vocab <name>\"", path); }
    fclose(fp);
    if (shard_tokens != o->shard_tokens) { fatal("--resume: %s is for -s %zu, this run has -s %zu", path, shard_tokens, o->shard_tokens); }
    if (val_docs != o->val_docs) { fatal("--resume: %s is for --val-docs %zu, this run has %zu", path, val_docs, o->val_docs); }
    if (strcmp(vocab, vocab_name(o)) != 0) { fatal("--resume: %s is for --vocab %s, this run has %s", path, vocab, vocab_name(o)); }
    if (shards == 0) { fatal("%s: no complete shards; not a tokenize state file?", path); }
    if (o->first_doc > docs) { fatal("--first-doc %zu is past the %zu documents that %s says are done", o->first_doc, docs, path); }
    // the complete shards must be there, of the sizes the state says
    size_t sum = 0;
    for (size_t i = 0; i < shards; i++) {
        char* shard = shard_path(o->out, i);
        ShardInfo info = {0, 0};
        char err[SHARD_ERR_LEN];
        if (shard_read_header(shard, &info, err, sizeof(err)) != 0) { fatal("--resume: %s", err); }
        size_t want = i == 0 ? val_tokens : shard_tokens;
        if (info.token_bytes != w->token_bytes || info.num_tokens != want) {
            fatal("--resume: %s holds %zu tokens of %d bytes, %s says %zu of %d", shard, info.num_tokens,
                  info.token_bytes, path, want, w->token_bytes);
        }
        sum += info.num_tokens;
        free(shard);
    }
    if (sum != tokens) { fatal("%s: says %zu tokens, its shards hold %zu", path, tokens, sum); }
    if (doc_tokens > 0) { // keep the end of the last shard: the resumed document must start with it
        char* shard = shard_path(o->out, shards - 1);
        size_t n = shards == 1 ? val_tokens : shard_tokens;
        w->n_tail = doc_tokens < n ? doc_tokens : n;
        w->tail = (uint32_t*)mallocCheck(w->n_tail * sizeof(uint32_t));
        FILE* sf = fopenCheck(shard, "rb");
        fseekCheck(sf, (long)(SHARD_HEADER_BYTES + (n - w->n_tail) * (size_t)w->token_bytes), SEEK_SET);
        for (size_t i = 0; i < w->n_tail; i++) {
            uint8_t b[4] = {0, 0, 0, 0};
            freadCheck(b, 1, (size_t)w->token_bytes, sf);
            w->tail[i] = (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24);
        }
        fclose(sf);
        free(shard);
    }
    w->shards = shards;
    w->docs = docs;
    w->tokens = tokens;
    w->val_tokens = val_tokens;
    w->drop = doc_tokens;
    *skip_docs = docs - o->first_doc;
    printf("tokenize: resuming after %zu complete shards (%zu documents, %zu tokens)\n", shards, docs, tokens);
    free(path);
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
// batches of documents: read in order, tokenized in parallel, written in order

typedef struct {
    size_t off, len;   // the document's input (a whole file, or a JSON line) in the batch's data
    int input;         // which input it comes from
    size_t index;      // its line or record number there, from 1 (0: the whole file)
    size_t file_off;   // its byte offset there
    size_t used;       // the input bytes it took (a JSON line's '\n', a record's length too)
    int* ids;          // separator + tokens, once tokenized
    size_t n_ids, ids_cap;
    const char* err;   // what is wrong with it, NULL if nothing
    int bad_utf8;      // it is not valid UTF-8, first at byte err_at of the input
    size_t err_at;
    size_t replaced;   // --invalid-utf8 replace: the U+FFFD put in it
    int skip;          // --invalid-utf8 skip: left out
} Doc;

typedef struct {
    char* data;
    size_t len, cap;
    Doc* docs;         // slots keep their ids buffers from batch to batch
    size_t n, docs_cap;
} Batch;

static Doc* batch_add(Batch* b, const char* text, size_t len) {
    if (b->n == b->docs_cap) {
        size_t cap = b->docs_cap == 0 ? 256 : 2 * b->docs_cap;
        b->docs = (Doc*)reallocCheck(b->docs, cap * sizeof(Doc));
        memset(b->docs + b->docs_cap, 0, (cap - b->docs_cap) * sizeof(Doc));
        b->docs_cap = cap;
    }
    Doc* d = &b->docs[b->n++];
    d->off = b->len;
    d->len = len;
    if (len > 0) { put_bytes(&b->data, &b->len, &b->cap, text, len); }
    return d;
}

typedef struct {
    const Options* o;
    int input;             // the input being read, or the next to open
    int fd;                // JSON lines and records: the open input, -1 between inputs
    char* buf;             // its read-ahead: unread bytes are buf[start .. end)
    size_t start, end, cap;
    int eof;
    size_t count;          // lines or records of the open input read so far
    size_t offset;         // and their bytes
    size_t skip;           // documents still to skip (resume)
    Progress* progress;
} Reader;

// for messages
static const char* input_name(const char* path) { return strcmp(path, "-") == 0 ? "standard input" : path; }

static int open_input(const char* path) {
    if (strcmp(path, "-") == 0) {
#ifdef F_SETPIPE_SZ
        fcntl(STDIN_FILENO, F_SETPIPE_SZ, 1 << 20); // a larger pipe: fewer switches to the writer (fails harmlessly)
#endif
        return STDIN_FILENO;
    }
    int fd = open(path, O_RDONLY);
    if (fd < 0) { fatal("cannot read %s: %s", path, strerror(errno)); }
    return fd;
}

// reads what is there of the open input (so that a pipe's documents are handled as they come) into the
// read-ahead; 0 at its end
static int reader_more(Reader* r) {
    if (r->eof) { return 0; }
    // keep the unread bytes, at the front of a buffer with room for more
    memmove(r->buf, r->buf + r->start, r->end - r->start);
    r->end -= r->start;
    r->start = 0;
    if (r->end == r->cap) {
        r->cap *= 2;
        r->buf = (char*)reallocCheck(r->buf, r->cap);
    }
    ssize_t got;
    do { got = read(r->fd, r->buf + r->end, r->cap - r->end); } while (got < 0 && errno == EINTR);
    if (got < 0) { fatal("cannot read %s: %s", input_name(r->o->inputs[r->input]), strerror(errno)); }
    r->eof = got == 0;
    r->end += (size_t)got;
    return got > 0;
}

// the next document of the JSON-lines or record inputs: a line without its '\n', or a record's text;
// *used is the input bytes it took. 0 after the last input.
static int reader_next(Reader* r, const char** text, size_t* len, size_t* used) {
    for (;;) {
        if (r->fd < 0) {
            if (r->input >= r->o->n_inputs) { return 0; }
            r->fd = open_input(r->o->inputs[r->input]);
            r->start = r->end = 0;
            r->eof = 0;
            r->count = r->offset = 0;
        }
        size_t avail = r->end - r->start;
        const char* p = r->buf + r->start;
        if (r->o->records) {
            if (avail >= 4) {
                const uint8_t* u = (const uint8_t*)p;
                size_t n = (size_t)u[0] | ((size_t)u[1] << 8) | ((size_t)u[2] << 16) | ((size_t)u[3] << 24);
                if (avail - 4 >= n) {
                    *text = p + 4;
                    *len = n;
                    *used = 4 + n;
                    break;
                }
            }
            if (r->eof && avail > 0) {
                fatal("%s ends inside record %zu (at byte %zu)", input_name(r->o->inputs[r->input]), r->count + 1,
                      r->offset);
            }
        } else {
            const char* nl = (const char*)memchr(p, '\n', avail);
            if (nl != NULL || (r->eof && avail > 0)) {
                *text = p;
                *len = nl != NULL ? (size_t)(nl - p) : avail;
                *used = *len + (nl != NULL);
                break;
            }
        }
        if (!reader_more(r) && r->end == r->start) { // this input is done
            if (r->fd != STDIN_FILENO) { close(r->fd); }
            r->fd = -1;
            r->input++;
        }
    }
    r->start += *used;
    r->offset += *used;
    r->count++;
    return 1;
}

static int blank(const char* s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') { return 0; }
    }
    return 1;
}

// fills b with the next documents (none at the end of the input)
static void reader_fill(Reader* r, Batch* b) {
    b->n = 0;
    b->len = 0;
    while (b->n < r->o->batch_docs && b->len < BATCH_BYTES) {
        if (r->o->jsonl_field != NULL || r->o->records) {
            const char* text;
            size_t len, used;
            if (!reader_next(r, &text, &len, &used)) { return; }
            if (r->o->jsonl_field != NULL && blank(text, len)) { continue; } // not a document
            if (r->skip > 0) { // resume: complete shards hold this document
                r->skip--;
                r->progress->skipped_bytes += used;
                continue;
            }
            Doc* d = batch_add(b, text, len);
            d->input = r->input;
            d->index = r->count;
            d->file_off = r->offset - used;
            d->used = used;
        } else {
            if (r->input >= r->o->n_inputs) { return; }
            const char* path = r->o->inputs[r->input];
            if (r->skip > 0) {
                struct stat st;
                r->progress->skipped_bytes += stat(path, &st) == 0 ? (size_t)st.st_size : 0;
                r->skip--;
                r->input++;
                continue;
            }
            // read to the end rather than trust the size of a pipe or special file
            int fd = open_input(path);
            Doc* d = batch_add(b, NULL, 0);
            for (;;) {
                if (b->cap - b->len < (1 << 20)) {
                    b->cap = 2 * b->cap + (1 << 20);
                    b->data = (char*)reallocCheck(b->data, b->cap);
                }
                ssize_t got = read(fd, b->data + b->len, b->cap - b->len);
                if (got < 0 && errno == EINTR) { continue; }
                if (got < 0) { fatal("cannot read %s: %s", path, strerror(errno)); }
                if (got == 0) { break; }
                b->len += (size_t)got;
                d->len += (size_t)got;
            }
            if (fd != STDIN_FILENO) { close(fd); }
            d->input = r->input++;
            d->index = 0;
            d->file_off = 0;
            d->used = d->len;
        }
    }
}

// per-thread working memory
typedef struct {
    char* text;   // a decoded JSON string
    size_t len, cap;
    char* fixed;  // the document with its invalid UTF-8 replaced
    size_t fixed_len, fixed_cap;
} Scratch;

// s[0..len) with each maximal ill-formed subsequence replaced by U+FFFD (EF BF BD), into *out;
// returns how many were replaced
static size_t utf8_replace_invalid(const char* s, size_t len, char** out, size_t* out_len, size_t* cap) {
    static const char fffd[3] = {'\xEF', '\xBF', '\xBD'};
    const unsigned char* u = (const unsigned char*)s;
    size_t replaced = 0, i = 0, run = 0; // run: start of the valid bytes not yet copied
    *out_len = 0;
    while (i < len) {
        size_t n = utf8_sequence_length(u, len, i);
        if (n > 0) { i += n; continue; }
        put_bytes(out, out_len, cap, s + run, i - run);
        put_bytes(out, out_len, cap, fffd, 3);
        replaced++;
        i += utf8_ill_formed_length(u, len, i);
        run = i;
    }
    put_bytes(out, out_len, cap, s + run, len - run);
    return replaced;
}

// separator + encode(text) of one document into d->ids, or d->err
static void tokenize_doc(const Options* o, const Tokenizer* tok, const Batch* b, Doc* d, Scratch* s) {
    const char* raw = b->data + d->off;
    size_t raw_len = d->len;
    d->n_ids = 0;
    d->err = NULL;
    d->replaced = 0;
    d->skip = 0;
    size_t bad;
    d->bad_utf8 = !utf8_valid(raw, raw_len, &bad);
    if (d->bad_utf8) {
        d->err_at = d->file_off + bad;
        if (o->invalid_utf8 == UTF8_STOP) { d->err = "not valid UTF-8"; return; }
        if (o->invalid_utf8 == UTF8_SKIP) { d->skip = 1; return; }
        d->replaced = utf8_replace_invalid(raw, raw_len, &s->fixed, &s->fixed_len, &s->fixed_cap);
        raw = s->fixed;
        raw_len = s->fixed_len;
    }
    const char* text = raw;
    size_t len = raw_len;
    if (o->jsonl_field != NULL) {
        d->err = json_field(raw, raw_len, o->jsonl_field, &s->text, &s->len, &s->cap);
        if (d->err != NULL) { return; }
        text = s->text;
        len = s->len;
    }
    tokenizer_push(tok->eot_token, &d->ids, &d->n_ids, &d->ids_cap);
    // the input is valid UTF-8 and JSON escapes decode to whole code points, so this cannot fail
    if (tokenizer_encode(tok, text, len, &d->ids, &d->n_ids, &d->ids_cap) != 0) { d->err = "bug: decoded text is not UTF-8"; }
}

// adds the batch's documents to the shards in order; stops at the first bad one (w->err)
static void write_batch(ShardWriter* w, const Batch* b) {
    const Options* o = w->o;
    for (size_t i = 0; i < b->n && !w->stop; i++) {
        const Doc* d = &b->docs[i];
        if (d->err != NULL) {
            const char* path = input_name(o->inputs[d->input]);
            const char* unit = o->records ? "record" : "line";
            const char* hint = "; --invalid-utf8 replace or skip goes on";
            if (d->bad_utf8 && d->index == 0) {
                snprintf(w->err, sizeof(w->err), "%s is %s at byte %zu%s", path, d->err, d->err_at, hint);
            } else if (d->bad_utf8) {
                snprintf(w->err, sizeof(w->err), "%s: %s %zu is %s at byte %zu of the file%s", path, unit, d->index,
                         d->err, d->err_at, hint);
            } else {
                snprintf(w->err, sizeof(w->err), "%s:%zu: %s (--jsonl %s)", path, d->index, d->err, o->jsonl_field);
            }
            w->stop = 1;
            return;
        }
        if (d->skip) {
            writer_skip_document(w);
        } else {
            writer_add_document(w, d->ids, d->n_ids);
            w->replaced_docs += d->replaced > 0;
            w->replaced_seqs += d->replaced;
        }
        w->progress->bytes += d->used;
    }
    progress_show(w->progress, w->docs, w->tokens);
}

// ----------------------------------------------------------------------------

// mkdir -p of the directory part of the prefix
static void make_parent_dirs(const char* out) {
    char* dir = (char*)mallocCheck(strlen(out) + 1);
    strcpy(dir, out);
    for (char* p = dir + 1; *p != '\0'; p++) {
        if (*p != '/') { continue; }
        *p = '\0';
        if (mkdir(dir, 0777) != 0 && errno != EEXIST) { fatal("cannot create directory %s: %s", dir, strerror(errno)); }
        *p = '/';
    }
    free(dir);
}

// ----------------------------------------------------------------------------
// --hellaswag: JSON lines of HellaSwag's examples to one eval file

// the eval file of the examples of every input; K is the first example's count of endings
static void tokenize_hellaswag(const Options* o, const Tokenizer* tok) {
    Reader r;
    memset(&r, 0, sizeof(r));
    r.o = o;
    r.fd = -1;
    r.cap = (size_t)1 << 22;
    r.buf = (char*)mallocCheck(r.cap);
    EvalSet set;
    memset(&set, 0, sizeof(set));
    int* ids[EVALSET_MAX_ENDINGS + 1] = {NULL};
    size_t lens[EVALSET_MAX_ENDINGS + 1], caps[EVALSET_MAX_ENDINGS + 1] = {0};
    char* spaced = NULL; // " " + an ending
    size_t spaced_cap = 0, tokens = 0, longest = 0;
    const char* text;
    size_t len, used;
    while (reader_next(&r, &text, &len, &used)) {
        if (blank(text, len)) { continue; }
        char where[4200];
        snprintf(where, sizeof(where), "%s:%zu", input_name(o->inputs[r.input]), r.count);
        JsonValue v;
        json_parse(text, len, where, &v);
        const JsonValue* ctx = json_get(&v, "ctx");
        const JsonValue* endings = json_get(&v, "endings");
        const JsonValue* label = json_get(&v, "label");
        if (ctx == NULL || ctx->type != JSON_STRING) { fatal("%s: expected a string \"ctx\" (the context)", where); }
        if (endings == NULL || endings->type != JSON_ARRAY) { fatal("%s: expected an array \"endings\"", where); }
        int K = set.num_examples ? set.num_endings : (int)endings->length;
        if (set.num_examples == 0) {
            if (K < 2 || K > EVALSET_MAX_ENDINGS) {
                fatal("%s: %zu endings, expected 2 to %d", where, endings->length, EVALSET_MAX_ENDINGS);
            }
            evalset_init(&set, K, tok->vocab_size);
        }
        if ((int)endings->length != K) {
            fatal("%s: %zu endings, the first example has %d", where, endings->length, K);
        }
        if (label == NULL || label->type != JSON_NUMBER || !label->is_integer || label->integer < 0 ||
            label->integer >= K) {
            fatal("%s: expected \"label\", the index of the right ending: an integer from 0 to %d", where, K - 1);
        }
        lens[0] = 0;
        tokenizer_push(tok->eot_token, &ids[0], &lens[0], &caps[0]);
        // JSON strings are valid UTF-8 (json_parse checks), so encoding cannot fail
        tokenizer_encode(tok, ctx->string, ctx->length, &ids[0], &lens[0], &caps[0]);
        for (int k = 0; k < K; k++) {
            const JsonValue* e = &endings->items[k];
            if (e->type != JSON_STRING) { fatal("%s: ending %d is not a string", where, k); }
            if (e->length + 1 > spaced_cap) {
                spaced_cap = 2 * (e->length + 1);
                spaced = (char*)reallocCheck(spaced, spaced_cap);
            }
            spaced[0] = ' ';
            memcpy(spaced + 1, e->string, e->length);
            lens[1 + k] = 0;
            tokenizer_encode(tok, spaced, e->length + 1, &ids[1 + k], &lens[1 + k], &caps[1 + k]);
            if (lens[0] + lens[1 + k] > longest) { longest = lens[0] + lens[1 + k]; }
        }
        for (int j = 0; j <= K; j++) { tokens += lens[j]; }
        evalset_append(&set, (int)label->integer, (const int* const*)ids, lens);
        json_free(&v);
    }
    if (set.num_examples == 0) { fatal("no examples in the input"); }
    if (o->total_docs > 0 && (size_t)set.num_examples != o->total_docs) { // a download cut short, say
        fatal("the input holds %d examples, --total-docs says %zu", set.num_examples, o->total_docs);
    }
    make_parent_dirs(o->out);
    evalset_save(&set, o->out);
    printf("tokenize: %d examples of %d endings, %zu tokens (the longest context and ending %zu) in %s\n",
           set.num_examples, set.num_endings, tokens, longest, o->out);
    for (int j = 0; j <= EVALSET_MAX_ENDINGS; j++) { free(ids[j]); }
    free(spaced);
    free(r.buf);
    evalset_free(&set);
}

int main(int argc, char** argv) {
    const char *out = NULL, *rank_file = NULL, *jsonl_field = NULL, *vocab = "gpt2", *invalid_utf8 = "stop";
    int records = 0, resume = 0, shard_tokens = 100000000, val_docs = 0, max_shards = 0, total_docs = 0, first_doc = 0;
    int batch_docs = 16384, hellaswag = 0;
    ArgSpec specs[] = {
        {'o', "output", ARG_STRING, &out, 0, 0, "shard prefix (required): OUT_val_000000.bin, OUT_train_000001.bin, ...; OUT.state while unfinished", 0},
        {'s', "shard-tokens", ARG_INT, &shard_tokens, 1, INT32_MAX, "tokens per shard (1e8 as llm.c's fineweb.py)", 0},
        {0, "vocab", ARG_STRING, &vocab, 0, 0, "gpt2 (uint16 shards) or llama3 (uint32 shards; needs -t)", 0},
        {'t', "tokenizer", ARG_STRING, &rank_file, 0, 0, "tiktoken rank file (gpt2: " TOKENIZER_DEFAULT_PATH "; llama3: Llama-3's tokenizer.model)", 0},
        {0, "jsonl", ARG_STRING, &jsonl_field, 0, 0, "each line of a FILE is a document: a JSON object whose string field of this name is the text", 0},
        {0, "records", ARG_SWITCH, &records, 0, 0, "each FILE is documents, each a uint32 little-endian byte count and then the text (what dev/data/fineweb.sh's parquet reader writes)", 0},
        {0, "val-docs", ARG_INT, &val_docs, 0, INT32_MAX, "the val shard is exactly the first K documents (0 = the first shard)", 0},
        {0, "val_docs", ARG_INT, &val_docs, 0, INT32_MAX, NULL, 0}, // the older spelling
        {0, "resume", ARG_SWITCH, &resume, 0, 0, "continue the interrupted run that OUT.state describes (without it a leftover state is an error)", 0},
        {0, "total-docs", ARG_INT, &total_docs, 0, INT32_MAX, "the input's documents, for the ETA; another count is an error (0 = unknown)", 0},
        {0, "first-doc", ARG_INT, &first_doc, 0, INT32_MAX, "with --resume: the input starts at document K (the caller skipped the rest)", 0},
        {0, "max-shards", ARG_INT, &max_shards, 0, INT32_MAX, "stop after N complete shards, leaving OUT.state (to test resuming; 0 = never)", 0},
        {0, "invalid-utf8", ARG_STRING, &invalid_utf8, 0, 0, "a document that is not valid UTF-8: stop (an error), replace (U+FFFD per ill-formed sequence, as Python's errors=\"replace\") or skip (left out)", 0},
        {0, "batch-docs", ARG_INT, &batch_docs, 1, INT32_MAX, "documents per parallel batch", 0},
        {0, "hellaswag", ARG_SWITCH, &hellaswag, 0, 0, "instead of shards, one multiple-choice eval file OUT of HellaSwag's JSON lines (ctx, endings, label); -t may also be a tokenizer.json, --total-docs counts the examples", 0},
    };
    int num_specs = (int)(sizeof(specs) / sizeof(specs[0]));
    int first_input = cli_parse_args(argc, argv, "usage: ./tokenize -o OUT [flags] FILE...\n"
        "Turns text into llm.c token shards: each FILE (- is standard input) is one document, or each line of it\n"
        "with --jsonl, or each record with --records. Threads: OMP_NUM_THREADS (default: all cores).\n"
        "       ./tokenize --hellaswag -o OUT.bin [-t TOKENIZER] [--vocab V] [--total-docs N] FILE...", specs, num_specs);
    if (cli_given(specs, num_specs, "val-docs") && cli_given(specs, num_specs, "val_docs")) {
        fatal("--val_docs is the older spelling of --val-docs: give one");
    }
    if (out == NULL) { fatal("-o OUT is required: the shards' prefix (see --help)"); }
    if (first_input == argc) { fatal("no input: give the FILEs after the flags (- is standard input; see --help)"); }
    Options o = {out, rank_file, jsonl_field, records, 0, (size_t)shard_tokens, (size_t)val_docs, resume,
                 (size_t)max_shards, (size_t)total_docs, (size_t)first_doc, (size_t)batch_docs, UTF8_STOP,
                 argv + first_input, argc - first_input};
    if (strcmp(invalid_utf8, "stop") == 0) { o.invalid_utf8 = UTF8_STOP; }
    else if (strcmp(invalid_utf8, "replace") == 0) { o.invalid_utf8 = UTF8_REPLACE; }
    else if (strcmp(invalid_utf8, "skip") == 0) { o.invalid_utf8 = UTF8_SKIP; }
    else { fatal("--invalid-utf8 is stop, replace or skip, got '%s'", invalid_utf8); }
    if (strcmp(vocab, "gpt2") != 0 && strcmp(vocab, "llama3") != 0) { fatal("--vocab is gpt2 or llama3, got '%s'", vocab); }
    o.llama3 = strcmp(vocab, "llama3") == 0;
    if (o.first_doc > 0 && !o.resume) { fatal("--first-doc is for --resume"); }
    if (o.records && o.jsonl_field != NULL) { fatal("--records and --jsonl are two input formats; give one"); }
    if (o.llama3 && o.rank_file == NULL) {
        fatal("--vocab llama3 needs -t PATH: Llama-3's tiktoken rank file (tokenizer.model of meta-llama/Meta-Llama-3-8B, "
              "%d lines)", LLAMA3_RANKS);
    }
    if (o.rank_file == NULL) { o.rank_file = default_input(TOKENIZER_DEFAULT_PATH, "-t"); }
    if (hellaswag) {
        const char* shard_flags[] = {"shard-tokens", "jsonl", "records", "val-docs", "val_docs", "resume", "first-doc",
                                     "max-shards", "invalid-utf8", "batch-docs"};
        for (size_t i = 0; i < sizeof(shard_flags) / sizeof(shard_flags[0]); i++) {
            if (cli_given(specs, num_specs, shard_flags[i])) {
                fatal("--hellaswag writes one eval file: --%s is for shards", shard_flags[i]);
            }
        }
        Tokenizer tok;
        if (o.llama3) { tokenizer_init_pattern(&tok, o.rank_file, TOKENIZER_PATTERN_LLAMA3); }
        else { tokenizer_load(&tok, o.rank_file); }
        tokenize_hellaswag(&o, &tok);
        tokenizer_free(&tok);
        return 0;
    }

    // the total input size, for the ETA, and a clear error for a missing input before any work
    double start = now_seconds(); // the first progress line comes one interval after the start
    Progress progress = {isatty(fileno(stderr)), start, start, 0, o.total_docs, 0, 0, 0, 0};
    int sizes_known = 1;
    for (int i = 0; i < o.n_inputs; i++) {
        struct stat st;
        const char* path = o.inputs[i];
        int r = strcmp(path, "-") == 0 ? fstat(fileno(stdin), &st) : stat(path, &st);
        if (r != 0) { fatal("cannot read %s: %s", path, strerror(errno)); }
        if (S_ISDIR(st.st_mode)) { fatal("%s is a directory", path); }
        if (S_ISREG(st.st_mode)) { progress.total_bytes += (size_t)st.st_size; } else { sizes_known = 0; }
    }
    if (!sizes_known) { progress.total_bytes = 0; }

    Tokenizer tok;
    tokenizer_init_pattern(&tok, o.rank_file, o.llama3 ? TOKENIZER_PATTERN_LLAMA3 : TOKENIZER_PATTERN_GPT2);
    if (o.llama3 && tok.vocab_size != LLAMA3_RANKS + 1) {
        fatal("%s has %d ranks; Llama-3's tokenizer.model has %d", o.rank_file, tok.vocab_size - 1, LLAMA3_RANKS);
    }
    make_parent_dirs(o.out);
    ShardWriter w;
    memset(&w, 0, sizeof(w));
    w.o = &o;
    w.token_bytes = o.llama3 ? 4 : 2;
    w.progress = &progress;
    Reader r;
    memset(&r, 0, sizeof(r));
    r.o = &o;
    r.fd = -1;
    r.cap = (size_t)1 << 22;
    r.buf = (char*)mallocCheck(r.cap);
    r.progress = &progress;
    if (o.resume) {
        writer_resume(&w, &r.skip);
    } else {
        char* state = path_with(o.out, ".state");
        if (access(state, F_OK) == 0) {
            fatal("%s exists: an interrupted run; --resume continues it, or delete it to start over", state);
        }
        free(state);
    }
    progress.skipped_docs = w.docs;

    // one pipeline step: tokenize batch k while one thread writes batch k - 1 and reads batch k + 1
    int n_threads = omp_get_max_threads();
    Scratch* scratch = (Scratch*)callocCheck((size_t)n_threads, sizeof(Scratch));
    Batch batches[3];
    memset(batches, 0, sizeof(batches));
    reader_fill(&r, &batches[0]);
    for (size_t k = 0;; k++) {
        Batch* cur = &batches[k % 3];
        Batch* prev = k > 0 ? &batches[(k + 2) % 3] : NULL;
        Batch* next = &batches[(k + 1) % 3];
        int last = cur->n == 0; // the input is done: write the previous batch, and that is all
#pragma omp parallel
        {
#pragma omp single nowait
            {
                if (prev != NULL) { write_batch(&w, prev); }
                if (!w.stop && !last) { reader_fill(&r, next); }
            }
#pragma omp for schedule(dynamic, 1)
            for (long i = 0; i < (long)cur->n; i++) {
                tokenize_doc(&o, &tok, cur, &cur->docs[i], &scratch[omp_get_thread_num()]);
            }
        }
        if (last || w.stop) { break; }
    }
    progress_clear(&progress);
    if (w.err[0] != '\0') { fatal("%s", w.err); }
    if (!w.stop && (r.skip > 0 || w.drop > 0)) {
        fatal("--resume: the input ends before the %zu documents that %s.state counts; is it the input of the "
              "interrupted run?", w.docs + (w.drop > 0), o.out);
    }
    if (w.stop) {
        printf("tokenize: stopped after %zu shards (--max-shards); --resume goes on\n", w.shards);
    } else {
        if (o.val_docs > 0 && w.shards == 0) {
            fatal("--val-docs %zu, but there are only %zu documents", o.val_docs, w.docs);
        }
        if (w.docs == 0) { fatal("no documents in the input"); }
        if (o.total_docs > 0 && w.docs != o.total_docs) { // e.g. the program that wrote the input died
            fatal("the input ended after %zu documents, --total-docs says %zu", w.docs, o.total_docs);
        }
        if (w.tokens == 0) { // (every document has its separator at least)
            fatal("all %zu documents were left out for invalid UTF-8 (--invalid-utf8 skip): nothing to write", w.docs);
        }
        if (w.n > 0) { writer_flush(&w, w.docs, 0); }
        char* state = path_with(o.out, ".state");
        if (remove(state) != 0) { fatal("cannot remove %s: %s", state, strerror(errno)); }
        free(state);
        double seconds = now_seconds() - progress.start;
        printf("tokenize: %zu documents, %zu tokens (%zu val, %zu train) in %zu shards; %.1f MB of input in %.1f s "
               "(%.1f MB/s, %d threads)\n", w.docs, w.tokens, w.val_tokens, w.tokens - w.val_tokens, w.shards,
               (double)progress.bytes / 1e6, seconds, (double)progress.bytes / 1e6 / seconds, n_threads);
        // an empty split is a mistake the trainer would only find later (no shard matches *_train_*.bin)
        if (w.shards == 1 && o.val_docs > 0) {
            fprintf(stderr, "warning: no train shard: --val-docs %zu took every document\n", o.val_docs);
        } else if (w.shards == 1) {
            fprintf(stderr, "warning: no train shard: all %zu tokens fit in the val shard of -s %zu tokens; a smaller -s "
                    "(or --val-docs K) leaves some for training\n", w.tokens, o.shard_tokens);
        }
        if (w.val_tokens == 0) {
            fprintf(stderr, "warning: the val shard is empty: its %zu documents were left out (--invalid-utf8 skip)\n",
                    o.val_docs);
        }
    }
    if (w.replaced_docs > 0) {
        printf("tokenize: invalid UTF-8: %zu ill-formed sequence%s replaced with U+FFFD in %zu document%s\n",
               w.replaced_seqs, w.replaced_seqs == 1 ? "" : "s", w.replaced_docs, w.replaced_docs == 1 ? "" : "s");
    }
    if (w.skipped_docs > 0) {
        printf("tokenize: invalid UTF-8: %zu document%s skipped\n", w.skipped_docs, w.skipped_docs == 1 ? "" : "s");
    }
    for (int i = 0; i < 3; i++) {
        for (size_t d = 0; d < batches[i].docs_cap; d++) { free(batches[i].docs[d].ids); }
        free(batches[i].docs);
        free(batches[i].data);
    }
    for (int i = 0; i < n_threads; i++) {
        free(scratch[i].text);
        free(scratch[i].fixed);
    }
    free(scratch);
    free(r.buf);
    free(w.buf);
    free(w.tail);
    tokenizer_free(&tok);
    return 0;
}
