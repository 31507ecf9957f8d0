// the token shard reader (llmc/shard.h) on any file
#include "fuzz/fuzz.h"
#include "llmc/shard.h"

static void fuzz_one(const uint8_t* data, size_t size) {
    const char* path = fuzz_write_file("shard.bin", data, size);
    char err[SHARD_ERR_LEN];
    ShardInfo info;
    if (shard_read_header(path, &info, err, sizeof(err)) != 0) { return; }
    Shard s = {NULL, 0, 0, 0};
    if (shard_load(path, 50257, &s, err, sizeof(err)) == 0) {
        for (size_t i = 0; i < s.num_tokens; i++) {
            if (shard_token(&s, i) >= 50257) { abort(); }
        }
    }
    shard_free(&s);
}
