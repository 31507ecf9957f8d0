/*
 What the seed generator (fuzz/seeds.cpp) and the harnesses agree on: the small model of the
 checkpoint seeds, and the data loader harness's shard.
*/
#ifndef FUZZ_COMMON_H
#define FUZZ_COMMON_H

#include "llmc/model.h"

// 668 parameters: checkpoints of a few KB, so that the fuzzer mutates headers and data alike
static inline GPTConfig fuzz_small_config(void) {
    GPTConfig c = {16, 128, 1, 4, 2, 1, 8, 8, 10000.0f, 1e-5f, ACT_RELU, 0};
    return c;
}

// the data loader harness's one shard: FUZZ_SHARD_TOKENS tokens below FUZZ_SHARD_VOCAB
#define FUZZ_SHARD_TOKENS 1000
#define FUZZ_SHARD_VOCAB 100
static inline uint32_t fuzz_shard_token(size_t i) { return (uint32_t)((i * 7 + 3) % FUZZ_SHARD_VOCAB); }

// the data loader configuration that the first 6 bytes of a data loader input choose
typedef struct { int B, T, P, rank, shuffle, batches; } FuzzLoaderConfig;
static inline FuzzLoaderConfig fuzz_loader_config(const uint8_t c[6]) {
    FuzzLoaderConfig f;
    f.B = 1 + c[0] % 4;
    f.T = 1 + c[1] % 32;
    f.P = 1 + c[2] % 3;
    f.rank = c[3] % f.P;
    f.shuffle = c[4] & 1;
    f.batches = c[5] % 64;
    return f;
}

#endif // FUZZ_COMMON_H
