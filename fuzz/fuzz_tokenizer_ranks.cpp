// the tiktoken rank file loader (llmc/tokenizer.h): the first byte picks the pre-tokenizer, the
// rest is the file; a tokenizer that loads encodes and decodes a text
#include "fuzz/fuzz.h"
#include "llmc/tokenizer.h"

static void fuzz_one(const uint8_t* data, size_t size) {
    if (size == 0) { return; }
    const char* path = fuzz_write_file("ranks.tiktoken", data + 1, size - 1);
    Tokenizer t;
    tokenizer_init_pattern(&t, path, data[0] % 3);
    static const char text[] = "Hello world, it's 2024: 12345 caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC  \n\n  x";
    int* ids = NULL;
    size_t n = 0, cap = 0;
    if (tokenizer_encode(&t, text, sizeof(text) - 1, &ids, &n, &cap) != 0) { abort(); }
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = 0;
        if (tokenizer_decode(&t, ids[i], &len) == NULL) { abort(); }
        total += len;
    }
    if (total != sizeof(text) - 1) { abort(); } // every byte is a token: the ids spell the text
    free(ids);
    tokenizer_free(&t);
}
