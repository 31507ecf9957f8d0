/*
 Buffers on the device a model lives on: host memory for the CPU path, GPU
 memory (cudaMalloc) for the CUDA path. The CUDA half exists only when the
 file is compiled by nvcc; the CPU-only test builds never ask for it.
*/
#ifndef LLMC_MEMORY_H
#define LLMC_MEMORY_H

#include <stddef.h>
#include <string.h>
#include "llmc/utils.h"
#ifdef __CUDACC__
#include "llmc/cuda_common.cuh"
#endif

typedef enum { DEVICE_CPU = 0, DEVICE_CUDA = 1 } Device;

static inline void* device_malloc(size_t bytes, Device device) {
    if (device == DEVICE_CPU) { return mallocCheck(bytes); }
#ifdef __CUDACC__
    return cuda_malloc(bytes);
#else
    fatal("this build has no CUDA path");
#endif
}

static inline void device_free(void* ptr, Device device) {
    if (device == DEVICE_CPU) { free(ptr); return; }
#ifdef __CUDACC__
    cuda_free(ptr);
#endif
}

static inline void device_zero(void* ptr, size_t bytes, Device device) {
    if (device == DEVICE_CPU) { memset(ptr, 0, bytes); return; }
#ifdef __CUDACC__
    cudaCheck(cudaMemsetAsync(ptr, 0, bytes, main_stream));
#endif
}

// copies between the host and the model's device (either direction); the CUDA
// path synchronises so that the host may use or reuse its buffer right away
static inline void device_copy(void* dst, const void* src, size_t bytes, Device device) {
    if (device == DEVICE_CPU) { memcpy(dst, src, bytes); return; }
#ifdef __CUDACC__
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, main_stream));
    cudaCheck(cudaStreamSynchronize(main_stream));
#endif
}

// host -> the model's device, queued without waiting for the device: the CUDA
// path copies pageable host memory before it returns (so src may be reused at
// once), and the device reads dst in stream order
static inline void device_upload(void* dst, const void* src, size_t bytes, Device device) {
    if (device == DEVICE_CPU) { memcpy(dst, src, bytes); return; }
#ifdef __CUDACC__
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, main_stream));
#endif
}

// waits until the device has done all its queued work (timing)
static inline void device_synchronize(Device device) {
#ifdef __CUDACC__
    if (device == DEVICE_CUDA) { cudaCheck(cudaStreamSynchronize(main_stream)); }
#endif
}

#endif // LLMC_MEMORY_H
