/*
 The calls whose argument types cannot tell the backends apart (fp32 buffers
 live on either device), dispatched on the device the model lives on, so that
 the model (llmc/gpt.h), the inference engine (llmc/inference.h) and the FFN
 never ask which backend runs. The CUDA half exists only when the file is
 compiled by nvcc, as in llmc/memory.h.
*/
#ifndef LLMC_DEVICE_OPS_H
#define LLMC_DEVICE_OPS_H

#include <stddef.h>
#include "llmc/cpu_ops.h"
#include "llmc/memory.h"
#ifdef __CUDACC__
#include <type_traits>
#include "llmc/cuda_adamw.cuh"
#include "llmc/cuda_classifier.cuh"
#endif

// the parameters from fp32 host values (a checkpoint's), rounded to the model's type on its device
template <typename T>
void device_upload_params(T* params, const float* host, size_t n, Device device) {
#ifdef __CUDACC__
    if constexpr (std::is_same<T, bf16>::value) { upload_bf16(params, host, n); } else
#endif
    {
        for (size_t i = 0; i < n; i++) { params[i] = (T)host[i]; }
    }
}

// the statistics of one forward added to the step's sums (llmc/cpu_ops.h, forward_stats_accumulate)
template <typename G>
void device_stats_accumulate(double* acc, const G* losses, const G* row_l1, const int* row_active, int L, int M,
                             Device device) {
    if (device == DEVICE_CPU) {
        forward_stats_accumulate(acc, losses, row_l1, row_active, L, M);
        return;
    }
#ifdef __CUDACC__
    if constexpr (std::is_same<G, float>::value) { forward_stats_accumulate_cuda(acc, losses, row_l1, row_active, L, M); }
#endif
}

// x [rows, D] on the device <- its rows in the order perm (on that device); tmp: as large as x
template <typename T>
void device_permute_rows(T* x, T* tmp, const int* perm, int rows, int D, Device device) {
    if (device == DEVICE_CPU) {
        permute_rows(tmp, x, perm, rows, D);
    } else {
#ifdef __CUDACC__
        permute_rows_cuda(tmp, x, perm, rows, D);
#endif
    }
    device_copy(x, tmp, (size_t)rows * D * sizeof(T), device);
}

#endif // LLMC_DEVICE_OPS_H
