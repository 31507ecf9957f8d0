/*
 What every CUDA file shares: checked CUDA calls, the one stream the model's
 work is queued on, device allocation with a clear out-of-memory message, and
 the bf16 type of activations and weights on the GPU.
*/
#ifndef LLMC_CUDA_COMMON_CUH
#define LLMC_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include "llmc/utils.h"

typedef __nv_bfloat16 bf16;

static inline void cuda_check(cudaError_t err, const char* file, int line) {
    if (err != cudaSuccess) { fatal("CUDA error at %s:%d: %s", file, line, cudaGetErrorString(err)); }
}
#define cudaCheck(err) cuda_check((err), __FILE__, __LINE__)

// the stream all of a step's work is queued on (the default stream until set)
static cudaStream_t main_stream = 0;

// cudaMalloc, or one line saying how much was asked for and how much is free
static inline void* cuda_malloc(size_t bytes) {
    void* ptr = NULL;
    cudaError_t err = cudaMalloc(&ptr, bytes);
    if (err == cudaErrorMemoryAllocation) {
        size_t free_bytes = 0, total = 0;
        cudaGetLastError(); // clear the error so the query below works
        cudaMemGetInfo(&free_bytes, &total);
        fatal("GPU out of memory: asked for %.2f GiB, %.2f GiB free of %.2f GiB (try a smaller --batch)",
              bytes / 1073741824.0, free_bytes / 1073741824.0, total / 1073741824.0);
    }
    cudaCheck(err);
    return ptr;
}

static inline void cuda_free(void* ptr) {
    if (ptr) { cudaCheck(cudaFree(ptr)); }
}

static inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

#endif // LLMC_CUDA_COMMON_CUH
