/*
 What the three attention paths (llmc/cuda_attention.cuh) share: the base-2
 constants, the causal mask and the row store of a score or output tile in the
 mma.sync accumulator layout (which the wgmma path's accumulators share), the
 exp2 of the tensor-core paths, and their dynamic shared memory.
*/
#ifndef LLMC_CUDA_ATTENTION_COMMON_CUH
#define LLMC_CUDA_ATTENTION_COMMON_CUH

#include <math.h>
#include <stdint.h>
#include "llmc/cuda_common.cuh"

namespace attention_detail {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// two floats as bf16x2, lo in the low half (the lower column of a fragment)
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// Causal mask of a score block in the accumulator layout of mma.sync (s[n][e]:
// row row_g + 8(e/2), key key0 + 8n + 2(lane%4) + e%2): keys after their query get
// -inf, so exp2 makes them 0. last_query is the warp's last row; blocks wholly
// at or before it need no mask.
template <int NB>
__device__ __forceinline__ void mask_future_keys(float (&s)[NB][4], int key0, int last_query, int row_g, int lane) {
    if (key0 + 8 * NB - 1 <= last_query) { return; }
    int ahead = key0 + 2 * (lane % 4) - row_g; // key - query of element [0][0]
    #pragma unroll
    for (int n = 0; n < NB; n++) {
        #pragma unroll
        for (int e = 0; e < 4; e++) {
            if (ahead + 8 * n + e % 2 - 8 * (e / 2) > 0) { s[n][e] = -INFINITY; }
        }
    }
}

// 2^x with the multi-function unit alone (subnormal results flush to 0); 2^-inf = 0
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// lane's two rows of an accumulator tile, scaled, as bf16 into rows row0 and
// row0 + 8 (those before row_end) of a row-major matrix
template <int NT>
__device__ __forceinline__ void store_rows(bf16* dst, size_t stride, const float (&acc)[NT][4], int row0,
                                           int row_end, const float (&row_scale)[2], int lane) {
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = row0 + 8 * r;
        if (row >= row_end) { continue; }
        bf16* d = dst + (size_t)row * stride + 2 * (lane % 4);
        #pragma unroll
        for (int n = 0; n < NT; n++) {
            *reinterpret_cast<__nv_bfloat162*>(d + n * 8) =
                __floats2bfloat162_rn(acc[n][2 * r] * row_scale[r], acc[n][2 * r + 1] * row_scale[r]);
        }
    }
}

extern __shared__ __align__(16) unsigned char attention_smem[];

// past 48 KiB, dynamic shared memory needs an opt-in per kernel
template <typename Kernel>
static void allow_smem(Kernel kernel, size_t smem) {
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
}

} // namespace attention_detail

#endif // LLMC_CUDA_ATTENTION_COMMON_CUH
