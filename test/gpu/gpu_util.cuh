/*
 Helpers shared by the GPU tests and the benchmarks: copying std::vectors to
 and from the device, a random batch of tokens, and timing with CUDA events.
*/
#ifndef TEST_GPU_GPU_UTIL_CUH
#define TEST_GPU_GPU_UTIL_CUH

#include <algorithm>
#include <vector>
#include "llmc/cuda_common.cuh"
#include "llmc/rng.h"

template <typename T>
static T* upload(const std::vector<T>& host) {
    T* dev = (T*)cuda_malloc(host.size() * sizeof(T));
    cudaCheck(cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    return dev;
}

// waits for the work before it, so a launch that failed on the device is reported here
template <typename T>
static std::vector<T> download(const T* dev, size_t n) {
    std::vector<T> host(n);
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaMemcpy(host.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
}

// M random token ids below vocab (seeded) on the device: inputs[i] = t[i], targets[i] = t[i + 1]
struct TokenBatch { int* inputs; int* targets; };

static inline TokenBatch upload_random_batch(int M, int vocab, uint64_t seed) {
    std::vector<int> tokens(M + 1);
    for (int& t : tokens) { t = (int)rng_below(&seed, vocab); }
    TokenBatch b = {upload(std::vector<int>(tokens.begin(), tokens.end() - 1)),
                    upload(std::vector<int>(tokens.begin() + 1, tokens.end()))};
    return b;
}

// the median time of `reps` runs of fn on main_stream, in ms, after `warmup` runs
template <typename F>
static float median_ms(F fn, int reps = 20, int warmup = 1) {
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    for (int i = 0; i < warmup; i++) { fn(); }
    cudaCheck(cudaDeviceSynchronize());
    std::vector<float> ms(reps);
    for (int r = 0; r < reps; r++) {
        cudaCheck(cudaEventRecord(start, main_stream));
        fn();
        cudaCheck(cudaEventRecord(stop, main_stream));
        cudaCheck(cudaEventSynchronize(stop));
        cudaCheck(cudaEventElapsedTime(&ms[r], start, stop));
    }
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    std::sort(ms.begin(), ms.end());
    return ms[reps / 2];
}

#endif // TEST_GPU_GPU_UTIL_CUH
