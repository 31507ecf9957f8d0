// the Hugging Face tokenizer.json loader (llmc/tokenizer.h); a tokenizer that loads encodes a text
#include "fuzz/fuzz.h"
#include "llmc/tokenizer.h"

static void fuzz_one(const uint8_t* data, size_t size) {
    const char* path = fuzz_write_file("tokenizer.json", data, size);
    Tokenizer t;
    tokenizer_init_json(&t, path);
    static const char text[] = "Hello world, it's 2024: 12345 caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC  \n\n  x";
    int* ids = NULL;
    size_t n = 0, cap = 0;
    if (tokenizer_encode(&t, text, sizeof(text) - 1, &ids, &n, &cap) != 0) { abort(); }
    for (size_t i = 0; i < n; i++) {
        size_t len = 0;
        if (tokenizer_decode(&t, ids[i], &len) == NULL) { abort(); }
    }
    free(ids);
    tokenizer_free(&t);
}
