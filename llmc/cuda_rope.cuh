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

// VEC consecutive bf16 (VEC 8: one 16-byte access)
template <int VEC> struct alignas(2 * VEC) Bf16Vec { bf16 v[VEC]; };

// the pairs per thread of a head size: 8 (16-byte accesses) where hd/2 allows, else 1
static inline int rope_pairs_per_thread(int hd) { return (hd / 2) % 8 == 0 ? 8 : 1; }

// turns pairs i0 .. i0 + VEC - 1 of the head at x by their angles
template <int VEC>
__device__ __forceinline__ void rope_turn_head(bf16* x, int half, const float* sin_a, const float* cos_a) {
    Bf16Vec<VEC> a = *(Bf16Vec<VEC>*)x, b = *(Bf16Vec<VEC>*)(x + half);
    #pragma unroll
    for (int v = 0; v < VEC; v++) {
        rope_turn(&a.v[v], &b.v[v], __bfloat162float(a.v[v]), __bfloat162float(b.v[v]), sin_a[v], cos_a[v]);
    }
    *(Bf16Vec<VEC>*)x = a;
    *(Bf16Vec<VEC>*)(x + half) = b;
}

// One thread per (row, VEC consecutive pairs): the angles are computed once and turn those pairs of every
// q and k head of the row. Consecutive threads take consecutive pairs, so each head's halves are read as
// contiguous runs.
template <int VEC>
__global__ void rope_kernel(bf16* qkv, int M, int T, int pos0, int heads, int row_stride, int hd, float theta,
                            float direction) {
    const int half = hd / 2, groups = half / VEC;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)M * groups) { return; }
    const int m = (int)(idx / groups), i0 = (int)(idx % groups) * VEC;
    float sin_a[VEC], cos_a[VEC];
    #pragma unroll
    for (int v = 0; v < VEC; v++) {
        rope_angle(pos0 + m % T, i0 + v, hd, theta, &sin_a[v], &cos_a[v]);
        sin_a[v] *= direction;
    }
    bf16* x = qkv + (size_t)m * row_stride + i0;
    #pragma unroll 4
    for (int h = 0; h < heads; h++) { rope_turn_head<VEC>(x + h * hd, half, sin_a, cos_a); }
}

static void rope_launch(bf16* qkv, int B, int T, int pos0, int NH, int NKV, int hd, float theta, float direction) {
    const int threads = 256, M = B * T, vec = rope_pairs_per_thread(hd);
    int blocks = (int)(((size_t)M * (hd / 2 / vec) + threads - 1) / threads);
    auto kernel = vec == 8 ? rope_kernel<8> : rope_kernel<1>;
    kernel<<<blocks, threads, 0, main_stream>>>(qkv, M, T, pos0, NH + NKV, (NH + 2 * NKV) * hd, hd, theta, direction);
    cudaCheck(cudaGetLastError());
}

void rope_forward(bf16* qkv, int B, int T, int pos0, int NH, int NKV, int hd, float theta) {
    rope_launch(qkv, B, T, pos0, NH, NKV, hd, theta, 1.0f);
}

void rope_backward(bf16* dqkv, int B, int T, int NH, int NKV, int hd, float theta) {
    rope_launch(dqkv, B, T, 0, NH, NKV, hd, theta, -1.0f);
}

#endif // LLMC_CUDA_ROPE_CUH
