/*
 Helpers shared by the GPU tests and the kernel benchmarks: copying
 std::vectors to and from the device, and timing with CUDA events.
*/
#ifndef TEST_GPU_GPU_UTIL_CUH
#define TEST_GPU_GPU_UTIL_CUH

#include <algorithm>
#include <vector>
#include "llmc/cuda_common.cuh"

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
