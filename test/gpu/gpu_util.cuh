/*
 Helpers shared by the GPU tests and the benchmarks: copying std::vectors to
 and from the device, a random batch of tokens, timing with CUDA events, and
 the GPU's streaming read bandwidth (the limit a memory-bound kernel is held to).
*/
#ifndef TEST_GPU_GPU_UTIL_CUH
#define TEST_GPU_GPU_UTIL_CUH

#include <algorithm>
#include <functional>
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

static inline std::vector<bf16> to_bf16(const std::vector<float>& x) {
    std::vector<bf16> y(x.size());
    for (size_t i = 0; i < x.size(); i++) { y[i] = __float2bfloat16(x[i]); }
    return y;
}

static inline std::vector<float> to_float(const std::vector<bf16>& x) {
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); i++) { y[i] = __bfloat162float(x[i]); }
    return y;
}

// fills a device buffer with NaN (bf16 and fp32), so an output a kernel failed to write shows
static inline void poison(void* dev, size_t bytes) { cudaCheck(cudaMemset(dev, 0xff, bytes)); }

// ||a - b|| / ||b||, infinite if a holds a NaN: for gradients and outputs, whose largest entries matter most
static inline double norm_rel_err(const float* a, const float* b, size_t n) {
    double diff = 0, ref = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i])) { return INFINITY; }
        diff += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        ref += (double)b[i] * b[i];
    }
    return sqrt(diff / fmax(ref, 1e-30));
}

static inline double norm_rel_err(const std::vector<float>& a, const std::vector<float>& b) {
    return norm_rel_err(a.data(), b.data(), b.size());
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

// the median times of `reps` rounds of fns on main_stream, in ms, after `warmup`
// runs of each; a round runs every fn once, in turn: the GPU's clock drops as
// it heats, so only times taken side by side are compared. before_run(round),
// if given, is queued untimed before each timed run (e.g. a flush of L2).
static inline std::vector<float> median_ms_interleaved(const std::vector<std::function<void()>>& fns, int reps = 20,
                                                       int warmup = 1,
                                                       const std::function<void(int)>& before_run = nullptr) {
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    for (const auto& fn : fns) { for (int i = 0; i < warmup; i++) { fn(); } }
    cudaCheck(cudaDeviceSynchronize());
    std::vector<std::vector<float>> ms(fns.size(), std::vector<float>(reps));
    for (int r = 0; r < reps; r++) {
        for (size_t k = 0; k < fns.size(); k++) {
            if (before_run) { before_run(r); }
            cudaCheck(cudaEventRecord(start, main_stream));
            fns[k]();
            cudaCheck(cudaEventRecord(stop, main_stream));
            cudaCheck(cudaEventSynchronize(stop));
            cudaCheck(cudaEventElapsedTime(&ms[k][r], start, stop));
        }
    }
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    std::vector<float> medians;
    for (auto& m : ms) {
        std::sort(m.begin(), m.end());
        medians.push_back(m[reps / 2]);
    }
    return medians;
}

// the median time of `reps` runs of fn on main_stream, in ms, after `warmup` runs
static inline float median_ms(const std::function<void()>& fn, int reps = 20, int warmup = 1) {
    return median_ms_interleaved({fn}, reps, warmup)[0];
}

// what one read of n 16-byte words gives the device to do (a value the compiler cannot drop)
__global__ void stream_read_kernel(const uint4* x, size_t n, unsigned int* sink) {
    unsigned int acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = __ldcs(x + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) { atomicAdd(sink, 1u); }
}

// the GPU's streaming read bandwidth in bytes/s: the best of 5 reads of 2 GiB (after one untimed)
static inline double measure_read_bandwidth(void) {
    const size_t bytes = (size_t)2 << 30;
    uint4* x = (uint4*)cuda_malloc(bytes);
    unsigned int* sink = (unsigned int*)cuda_malloc(sizeof(unsigned int));
    cudaCheck(cudaMemset(x, 1, bytes));
    const int blocks = 4 * device_attribute(cudaDevAttrMultiProcessorCount);
    auto read = [&] {
        stream_read_kernel<<<blocks, 1024, 0, main_stream>>>(x, bytes / 16, sink);
        cudaCheck(cudaGetLastError());
    };
    double best = 0;
    for (int i = 0; i < 5; i++) { best = fmax(best, bytes / (median_ms(read, 1, i == 0) * 1e-3)); }
    cuda_free(x);
    cuda_free(sink);
    return best;
}

#endif // TEST_GPU_GPU_UTIL_CUH
