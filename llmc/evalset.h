/*
 A tokenized multiple-choice evaluation set (HellaSwag's validation set, or
 any set of examples that each have a context, K candidate endings and the
 index of the right one): the file `tokenize --hellaswag` writes and the
 evaluation (llmc/eval.h) reads. Every integer is little-endian:

   header, 256 int32: [0] magic 20261124, [1] version 1, [2] examples N
       (1 to 2^24), [3] endings per example K (2 to 64), [4] the vocabulary
       size V of the tokenizer (every token is below it); the rest 0
   then N examples, each: an int32 label (0 <= label < K), then K + 1 token
       lists, the context and then the K endings, each a uint32 count n >= 1
       followed by n uint32 tokens

 The file ends with the last example. A context is what the model reads
 before an ending: the tokenizer's document-start token (<|endoftext|> for
 GPT-2, as every training document starts with it), then the context text's
 tokens; an ending is the tokens of " " + its text, tokenized apart from the
 context (as llm.c does), so that it starts with a word and its space.
 evalset_load checks every field against the bytes the file has and stops
 with one line that names the file, the example and what was expected.
*/
#ifndef LLMC_EVALSET_H
#define LLMC_EVALSET_H

#include <stdint.h>
#include "llmc/shard.h"
#include "llmc/utils.h"

#define EVALSET_MAGIC 20261124
#define EVALSET_VERSION 1
#define EVALSET_HEADER_BYTES 1024
// the trainer sums the evaluation's counts over processes in fp32, exact below 2^24
#define EVALSET_MAX_EXAMPLES (1 << 24)
#define EVALSET_MAX_ENDINGS 64
#define EVALSET_MAX_VOCAB (1 << 24)

typedef struct {
    int num_examples, num_endings, vocab_size;
    int* labels;        // [N]
    int* tokens;        // every list, back to back
    size_t* starts;     // [N (K + 1) + 1]: list j (0 the context, 1 + k ending k) of example i is
                        // tokens[starts[i (K + 1) + j] .. starts[i (K + 1) + j + 1])
    size_t token_cap, example_cap; // room in tokens and in labels / starts (evalset_append)
} EvalSet;

// list j of example i (0: the context, 1 + k: ending k): *n tokens
static inline const int* evalset_list(const EvalSet* s, int i, int j, size_t* n) {
    size_t at = (size_t)i * (s->num_endings + 1) + j;
    *n = s->starts[at + 1] - s->starts[at];
    return s->tokens + s->starts[at];
}

// an empty set of examples with K endings each, tokens below vocab_size
static inline void evalset_init(EvalSet* s, int num_endings, int vocab_size) {
    if (num_endings < 2 || num_endings > EVALSET_MAX_ENDINGS || vocab_size < 2 || vocab_size > EVALSET_MAX_VOCAB) {
        fatal("an eval set has 2 to %d endings per example and a vocabulary of 2 to %d tokens, not %d and %d",
              EVALSET_MAX_ENDINGS, EVALSET_MAX_VOCAB, num_endings, vocab_size);
    }
    memset(s, 0, sizeof(*s));
    s->num_endings = num_endings;
    s->vocab_size = vocab_size;
    s->starts = (size_t*)callocCheck(1, sizeof(size_t));
}

// appends an example: its label and K + 1 token lists (the context, then the endings), lists[j][0..lens[j])
static inline void evalset_append(EvalSet* s, int label, const int* const* lists, const size_t* lens) {
    int K = s->num_endings, i = s->num_examples;
    if (i == EVALSET_MAX_EXAMPLES) { fatal("an eval set holds at most %d examples", EVALSET_MAX_EXAMPLES); }
    if (label < 0 || label >= K) { fatal("example %d: label %d, expected 0 to %d", i, label, K - 1); }
    if (s->num_examples == (int)s->example_cap) {
        s->example_cap = s->example_cap ? 2 * s->example_cap : 1024;
        s->labels = (int*)reallocCheck(s->labels, s->example_cap * sizeof(int));
        s->starts = (size_t*)reallocCheck(s->starts, (s->example_cap * (K + 1) + 1) * sizeof(size_t));
    }
    size_t at = (size_t)i * (K + 1);
    for (int j = 0; j <= K; j++) {
        if (lens[j] == 0 || lens[j] > (size_t)INT32_MAX) {
            fatal("example %d: list %d (0 the context, 1 + k ending k) has %zu tokens, expected 1 to %d", i, j, lens[j],
                  INT32_MAX);
        }
        size_t used = s->starts[at + j];
        while (used + lens[j] > s->token_cap) {
            s->token_cap = s->token_cap ? 2 * s->token_cap : 1 << 16;
            s->tokens = (int*)reallocCheck(s->tokens, s->token_cap * sizeof(int));
        }
        for (size_t t = 0; t < lens[j]; t++) {
            if (lists[j][t] < 0 || lists[j][t] >= s->vocab_size) {
                fatal("example %d: token %d, expected 0 to %d", i, lists[j][t], s->vocab_size - 1);
            }
        }
        memcpy(s->tokens + used, lists[j], lens[j] * sizeof(int));
        s->starts[at + j + 1] = used + lens[j];
    }
    s->labels[i] = label;
    s->num_examples++;
}

// writes the set to path (<path>.tmp, then renamed)
static inline void evalset_save(const EvalSet* s, const char* path) {
    if (s->num_examples == 0) { fatal("%s: an eval set needs at least one example", path); }
    int K = s->num_endings;
    size_t tokens = s->starts[(size_t)s->num_examples * (K + 1)];
    size_t bytes = EVALSET_HEADER_BYTES + (size_t)s->num_examples * (4 + 4 * (K + 1)) + 4 * tokens;
    uint8_t* buf = (uint8_t*)callocCheck(bytes, 1);
    int32_t header[5] = {EVALSET_MAGIC, EVALSET_VERSION, s->num_examples, K, s->vocab_size};
    for (int w = 0; w < 5; w++) { shard_put_le32(buf + 4 * w, (uint32_t)header[w]); }
    uint8_t* p = buf + EVALSET_HEADER_BYTES;
    for (int i = 0; i < s->num_examples; i++) {
        shard_put_le32(p, (uint32_t)s->labels[i]);
        p += 4;
        for (int j = 0; j <= K; j++) {
            size_t n;
            const int* list = evalset_list(s, i, j, &n);
            shard_put_le32(p, (uint32_t)n);
            p += 4;
            for (size_t t = 0; t < n; t++, p += 4) { shard_put_le32(p, (uint32_t)list[t]); }
        }
    }
    char tmp[4096];
    FILE* fp = atomic_open(path, tmp, sizeof(tmp));
    fwriteCheck(buf, 1, bytes, fp);
    atomic_commit(fp, tmp, path);
    free(buf);
}

static inline void evalset_free(EvalSet* s) {
    free(s->labels);
    free(s->tokens);
    free(s->starts);
    memset(s, 0, sizeof(*s));
}

// reads and checks the file at path
static inline void evalset_load(EvalSet* s, const char* path) {
    FILE* fp = fopenCheck(path, "rb");
    long size = file_size(fp);
    if (size < EVALSET_HEADER_BYTES) {
        fatal("%s is %ld bytes, shorter than the %d-byte header of an eval file", path, size, EVALSET_HEADER_BYTES);
    }
    uint8_t* buf = (uint8_t*)mallocCheck((size_t)size);
    freadCheck(buf, 1, (size_t)size, fp);
    fcloseCheck(fp);
    int32_t magic = shard_get_le32(buf), version = shard_get_le32(buf + 4);
    int32_t N = shard_get_le32(buf + 8), K = shard_get_le32(buf + 12), V = shard_get_le32(buf + 16);
    if (magic != EVALSET_MAGIC) {
        fatal("%s is not an eval file: magic %d, expected %d (tokenize --hellaswag writes them)", path, magic,
              EVALSET_MAGIC);
    }
    if (version != EVALSET_VERSION) { fatal("%s: eval file version %d, expected %d", path, version, EVALSET_VERSION); }
    if (N < 1 || N > EVALSET_MAX_EXAMPLES) {
        fatal("%s: %d examples, expected 1 to %d", path, N, EVALSET_MAX_EXAMPLES);
    }
    if (K < 2 || K > EVALSET_MAX_ENDINGS) {
        fatal("%s: %d endings per example, expected 2 to %d", path, K, EVALSET_MAX_ENDINGS);
    }
    if (V < 2 || V > EVALSET_MAX_VOCAB) { fatal("%s: vocabulary size %d, expected 2 to %d", path, V, EVALSET_MAX_VOCAB); }
    // an example is at least a label and K + 1 lists of one token: the header's count must fit the bytes
    size_t body = (size_t)size - EVALSET_HEADER_BYTES, least = 4 + 8 * ((size_t)K + 1);
    if ((size_t)N * least > body) {
        fatal("%s ends early: %zu bytes after the header cannot hold %d examples (each at least %zu)", path, body, N,
              least);
    }
    memset(s, 0, sizeof(*s));
    s->num_examples = N, s->num_endings = K, s->vocab_size = V;
    s->labels = (int*)mallocCheck((size_t)N * sizeof(int));
    s->starts = (size_t*)mallocCheck(((size_t)N * (K + 1) + 1) * sizeof(size_t));
    s->tokens = (int*)mallocCheck(body / 4 * sizeof(int));
    s->example_cap = (size_t)N;
    s->token_cap = body / 4;
    s->starts[0] = 0;
    size_t off = EVALSET_HEADER_BYTES, used = 0;
    for (int i = 0; i < N; i++) {
        if ((size_t)size - off < 4) { fatal("%s ends early, in example %d of %d", path, i, N); }
        int32_t label = shard_get_le32(buf + off);
        off += 4;
        if (label < 0 || label >= K) { fatal("%s: example %d has label %d, expected 0 to %d", path, i, label, K - 1); }
        s->labels[i] = label;
        for (int j = 0; j <= K; j++) {
            if ((size_t)size - off < 4) { fatal("%s ends early, in example %d of %d", path, i, N); }
            uint32_t n = (uint32_t)shard_get_le32(buf + off);
            off += 4;
            if (n == 0) { fatal("%s: example %d has an empty %s", path, i, j ? "ending" : "context"); }
            if (((size_t)size - off) / 4 < n) { fatal("%s ends early, in example %d of %d", path, i, N); }
            for (uint32_t t = 0; t < n; t++, off += 4) {
                int32_t token = shard_get_le32(buf + off);
                if (token < 0 || token >= V) {
                    fatal("%s: example %d has token %d, expected 0 to %d (the vocabulary size is %d)", path, i, token,
                          V - 1, V);
                }
                s->tokens[used++] = token;
            }
            s->starts[(size_t)i * (K + 1) + j + 1] = used;
        }
    }
    if (off != (size_t)size) { fatal("%s has %zu bytes after its %d examples", path, (size_t)size - off, N); }
    free(buf);
}

#endif // LLMC_EVALSET_H
