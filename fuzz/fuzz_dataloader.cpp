// a data loader state (as a checkpoint holds it, llmc/dataloader.h) restored into a loader of a
// configuration chosen by the input's first 6 bytes (fuzz/common.h), then a few batches read
#include "fuzz/fuzz.h"
#include "fuzz/common.h"
#include "llmc/dataloader.h"

static void fuzz_one(const uint8_t* data, size_t size) {
    static char pattern[256];
    if (pattern[0] == '\0') { // one shard, written once (untracked: before any input)
        uint32_t tokens[FUZZ_SHARD_TOKENS];
        for (size_t i = 0; i < FUZZ_SHARD_TOKENS; i++) { tokens[i] = fuzz_shard_token(i); }
        int armed = fuzz_armed;
        fuzz_armed = 0;
        snprintf(pattern, sizeof(pattern), "%s", fuzz_path("loader.bin"));
        shard_write(pattern, tokens, FUZZ_SHARD_TOKENS, 2);
        fuzz_armed = armed;
    }
    uint8_t head[6] = {0};
    memcpy(head, data, size < 6 ? size : 6);
    FuzzLoaderConfig c = fuzz_loader_config(head);
    DataLoaderState state;
    memset(&state, 0, sizeof(state));
    if (size > 6) { memcpy(&state, data + 6, size - 6 < sizeof(state) ? size - 6 : sizeof(state)); }
    DataLoader dl;
    char err[SHARD_ERR_LEN];
    if (dataloader_try_init(&dl, pattern, c.B, c.T, c.rank, c.P, c.shuffle, 1234, FUZZ_SHARD_VOCAB, err, sizeof(err)) != 0) {
        return;
    }
    if (dataloader_try_set_state(&dl, &state, err, sizeof(err)) == 0) {
        for (int k = 0; k < c.batches; k++) {
            dataloader_next_batch(&dl);
            for (int i = 0; i < c.B * c.T; i++) {
                if (dl.inputs[i] < 0 || dl.inputs[i] >= FUZZ_SHARD_VOCAB || dl.targets[i] < 0 ||
                    dl.targets[i] >= FUZZ_SHARD_VOCAB) { abort(); }
            }
        }
    }
    dataloader_free(&dl);
}
