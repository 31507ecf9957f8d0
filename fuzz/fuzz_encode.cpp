// the encoder (llmc/tokenizer.h): the first byte picks a tokenizer (GPT-2's rank file with GPT-2's
// or SmolLM2's digit pre-tokenizer, the small Llama-3-style rank file of test/data with Llama-3's,
// or a tokenizer.json written from it), the rest is the text. Valid UTF-8 must encode to ids that
// decode to the same bytes; anything else must be refused with nothing appended.
#include "fuzz/fuzz.h"
#include "llmc/tokenizer.h"

static Tokenizer fuzz_tokenizers[4];

static void fuzz_load_tokenizers(void) {
    int armed = fuzz_armed;
    fuzz_armed = 0; // loaded once, untracked
    tokenizer_init_pattern(&fuzz_tokenizers[0], TOKENIZER_DEFAULT_PATH, TOKENIZER_PATTERN_GPT2);
    tokenizer_init_pattern(&fuzz_tokenizers[1], TOKENIZER_DEFAULT_PATH, TOKENIZER_PATTERN_GPT2_DIGITS);
    tokenizer_init_pattern(&fuzz_tokenizers[2], "test/data/tokenize/llama3_ranks.tiktoken", TOKENIZER_PATTERN_LLAMA3);
    const char* path = fuzz_path("tokenizer.json");
    tokenizer_write_json(&fuzz_tokenizers[2], path);
    tokenizer_init_json(&fuzz_tokenizers[3], path);
    fuzz_armed = armed;
}

static void fuzz_one(const uint8_t* data, size_t size) {
    if (fuzz_tokenizers[0].vocab_size == 0) { fuzz_load_tokenizers(); }
    if (size == 0) { return; }
    const Tokenizer* t = &fuzz_tokenizers[data[0] % 4];
    const char* text = (const char*)data + 1;
    size_t len = size - 1;
    int* ids = NULL;
    size_t n = 0, cap = 0;
    int rc = tokenizer_encode(t, text, len, &ids, &n, &cap);
    if (rc != 0) {
        if (n != 0 || utf8_valid(text, len, NULL)) { abort(); }
        free(ids);
        return;
    }
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k = 0;
        const unsigned char* bytes = tokenizer_decode(t, ids[i], &k);
        if (bytes == NULL || ids[i] == t->eot_token || at + k > len || memcmp(bytes, text + at, k) != 0) { abort(); }
        at += k;
    }
    if (at != len) { abort(); }
    free(ids);
}
