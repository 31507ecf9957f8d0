/*
 RoPE on the GPU, HF Llama's "rotate half", in place on the first NH + NKV heads (q and k) of each fused
 qkv row (stride (NH + 2 NKV) hd); row t of each sequence is at position p = pos0 + t. For i < hd/2:
     x[i]        <- x[i] cos(a) - x[i + hd/2] sin(a)
     x[i + hd/2] <- x[i + hd/2] cos(a) + x[i] sin(a),       a = p * inv_freq[i]
 The backward turns the gradient back by -a. The angle is HF's, in fp32: inv_freq[i] = 1 / theta^((2i)/hd),
 a = float(p) * inv_freq[i], then the precise sincosf; the rotation itself is fp32, rounded once to bf16.
*/
#ifndef LLMC_CUDA_ROPE_CUH
#define LLMC_CUDA_ROPE_CUH

#include "llmc/cuda_common.cuh"

// the angle of pair i at position p (every kernel that turns q or k computes it so, for the same bits)
__device__ __forceinline__ void rope_angle(int p, int i, int hd, float theta, float* sin_a, float* cos_a) {
    const float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)hd);
    sincosf((float)p * inv_freq, sin_a, cos_a);
}

// the pair (x[0], x[hd/2]) of a head turned by the angle
__device__ __forceinline__ void rope_turn(bf16* r1, bf16* r2, float x1, float x2, float sin_a, float cos_a) {
    *r1 = __float2bfloat16_rn(x1 * cos_a - x2 * sin_a);
    *r2 = __float2bfloat16_rn(x2 * cos_a + x1 * sin_a);
}

// One thread per (row, i): the angle is computed once and turns pair i of every q and k head of the
// row. Consecutive threads take consecutive i, so each head's halves are read as contiguous runs.
__global__ void rope_kernel(bf16* qkv, int M, int T, int pos0, int heads, int row_stride, int hd, float theta,
                            float direction) {
    const int half = hd / 2;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)M * half) { return; }
    const int m = (int)(idx / half), i = (int)(idx % half);
    float sin_a, cos_a;
    rope_angle(pos0 + m % T, i, hd, theta, &sin_a, &cos_a);
    sin_a *= direction;
    bf16* x = qkv + (size_t)m * row_stride + i;
    #pragma unroll 4
    for (int h = 0; h < heads; h++) {
        rope_turn(&x[h * hd], &x[h * hd + half], __bfloat162float(x[h * hd]), __bfloat162float(x[h * hd + half]), sin_a,
                  cos_a);
    }
}

static void rope_launch(bf16* qkv, int B, int T, int pos0, int NH, int NKV, int hd, float theta, float direction) {
    const int threads = 256, M = B * T;
    int blocks = (int)(((size_t)M * (hd / 2) + threads - 1) / threads);
    rope_kernel<<<blocks, threads, 0, main_stream>>>(qkv, M, T, pos0, NH + NKV, (NH + 2 * NKV) * hd, hd, theta,
                                                     direction);
    cudaCheck(cudaGetLastError());
}

void rope_forward(bf16* qkv, int B, int T, int pos0, int NH, int NKV, int hd, float theta) {
    rope_launch(qkv, B, T, pos0, NH, NKV, hd, theta, 1.0f);
}

void rope_backward(bf16* dqkv, int B, int T, int NH, int NKV, int hd, float theta) {
    rope_launch(dqkv, B, T, 0, NH, NKV, hd, theta, -1.0f);
}

#endif // LLMC_CUDA_ROPE_CUH
