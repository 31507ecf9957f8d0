/*
 The generic path of causal attention (llmc/cuda_attention.cuh has the math):
 any hd up to 128, other alignments. One warp per row, the same math in fp32
 with the same fixed orders as the tensor-core paths; lane i holds elements i,
 i+32, i+64, i+96 of each head vector. Also delta_t = dout_t.out_t for the
 backward, which the mma.sync path uses too.
*/
#ifndef LLMC_CUDA_ATTENTION_GENERIC_CUH
#define LLMC_CUDA_ATTENTION_GENERIC_CUH

#include "llmc/cuda_attention_common.cuh"

namespace attention_detail {

constexpr int kGenericWarps = 8; // the generic path and delta: a warp per row
constexpr int kGenericSlots = 4;

__device__ __forceinline__ void load_slots(float (&x)[kGenericSlots], const bf16* src, int hd, int lane) {
    #pragma unroll
    for (int c = 0; c < kGenericSlots; c++) {
        int i = lane + 32 * c;
        x[c] = i < hd ? __bfloat162float(src[i]) : 0.0f;
    }
}

__device__ __forceinline__ float warp_dot(const float (&x)[kGenericSlots], const bf16* y, int hd, int lane) {
    float sum = 0.0f;
    #pragma unroll
    for (int c = 0; c < kGenericSlots; c++) {
        int i = lane + 32 * c;
        if (i < hd) { sum += x[c] * __bfloat162float(y[i]); }
    }
    return warp_reduce<Sum>(sum); // the same bits in every lane
}

__device__ __forceinline__ void store_slots(bf16* dst, const float (&x)[kGenericSlots], float scale, int hd, int lane) {
    #pragma unroll
    for (int c = 0; c < kGenericSlots; c++) {
        int i = lane + 32 * c;
        if (i < hd) { dst[i] = __float2bfloat16(x[c] * scale); }
    }
}

// a warp per (b, h, t), t fastest
__global__ void attention_forward_generic_kernel(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH,
                                                 int NKV, int hd, float scale_log2) {
    int row = blockIdx.x * kGenericWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= B * NH * T) { return; }
    int t = row % T, h = row / T % NH, b = row / T / NH, kvh = h / (NH / NKV), QKV = (NH + 2 * NKV) * hd;
    const bf16* seq = qkv + (size_t)b * T * QKV;
    float q[kGenericSlots], o[kGenericSlots] = {};
    load_slots(q, seq + (size_t)t * QKV + h * hd, hd, lane);
    float max_score = -INFINITY, sum = 0.0f;
    for (int j = 0; j <= t; j++) {
        float score = warp_dot(q, seq + (size_t)j * QKV + (NH + kvh) * hd, hd, lane) * scale_log2;
        float new_max = fmaxf(max_score, score), correction = exp2f(max_score - new_max), p = exp2f(score - new_max);
        const bf16* v = seq + (size_t)j * QKV + (NH + NKV + kvh) * hd;
        sum = sum * correction + p;
        #pragma unroll
        for (int c = 0; c < kGenericSlots; c++) {
            int i = lane + 32 * c;
            if (i < hd) { o[c] = o[c] * correction + p * __bfloat162float(v[i]); }
        }
        max_score = new_max;
    }
    store_slots(out + ((size_t)b * T + t) * NH * hd + h * hd, o, 1.0f / sum, hd, lane);
    if (lane == 0) { lse[((size_t)b * NH + h) * T + t] = (max_score + log2f(sum)) * kLn2; }
}

// a warp per (b, h, t): dq_t
__global__ void attention_backward_dq_generic_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                                                     const float* delta, int B, int T, int NH, int NKV, int hd,
                                                     float scale_log2, float scale) {
    int row = blockIdx.x * kGenericWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= B * NH * T) { return; }
    int t = row % T, h = row / T % NH, b = row / T / NH, kvh = h / (NH / NKV), QKV = (NH + 2 * NKV) * hd;
    const bf16* seq = qkv + (size_t)b * T * QKV;
    float q[kGenericSlots], d_out[kGenericSlots], dq[kGenericSlots] = {};
    load_slots(q, seq + (size_t)t * QKV + h * hd, hd, lane);
    load_slots(d_out, dout + ((size_t)b * T + t) * NH * hd + h * hd, hd, lane);
    size_t stat = ((size_t)b * NH + h) * T + t;
    float row_lse = lse[stat] * kLog2e, row_delta = delta[stat];
    for (int j = 0; j <= t; j++) {
        const bf16* k = seq + (size_t)j * QKV + (NH + kvh) * hd;
        float p = exp2f(warp_dot(q, k, hd, lane) * scale_log2 - row_lse);
        float ds = p * (warp_dot(d_out, seq + (size_t)j * QKV + (NH + NKV + kvh) * hd, hd, lane) - row_delta);
        #pragma unroll
        for (int c = 0; c < kGenericSlots; c++) {
            int i = lane + 32 * c;
            if (i < hd) { dq[c] += ds * __bfloat162float(k[i]); }
        }
    }
    store_slots(dqkv + ((size_t)b * T + t) * QKV + h * hd, dq, scale, hd, lane);
}

// a warp per (b, kv head, key j): dk_j, dv_j over the heads of the group and the queries t >= j
__global__ void attention_backward_dkdv_generic_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv,
                                                       const float* lse, const float* delta, int B, int T, int NH,
                                                       int NKV, int hd, float scale_log2, float scale) {
    int row = blockIdx.x * kGenericWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= B * NKV * T) { return; }
    int j = row % T, kvh = row / T % NKV, b = row / T / NKV, group = NH / NKV, QKV = (NH + 2 * NKV) * hd;
    const bf16* seq = qkv + (size_t)b * T * QKV;
    float k[kGenericSlots], v[kGenericSlots], dk[kGenericSlots] = {}, dv[kGenericSlots] = {};
    load_slots(k, seq + (size_t)j * QKV + (NH + kvh) * hd, hd, lane);
    load_slots(v, seq + (size_t)j * QKV + (NH + NKV + kvh) * hd, hd, lane);
    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
        for (int t = j; t < T; t++) {
            const bf16* q = seq + (size_t)t * QKV + h * hd;
            const bf16* d_out = dout + ((size_t)b * T + t) * NH * hd + h * hd;
            size_t stat = ((size_t)b * NH + h) * T + t;
            float p = exp2f(warp_dot(k, q, hd, lane) * scale_log2 - lse[stat] * kLog2e);
            float ds = p * (warp_dot(v, d_out, hd, lane) - delta[stat]);
            #pragma unroll
            for (int c = 0; c < kGenericSlots; c++) {
                int i = lane + 32 * c;
                if (i < hd) {
                    dv[c] += p * __bfloat162float(d_out[i]);
                    dk[c] += ds * __bfloat162float(q[i]);
                }
            }
        }
    }
    store_slots(dqkv + ((size_t)b * T + j) * QKV + (NH + kvh) * hd, dk, scale, hd, lane);
    store_slots(dqkv + ((size_t)b * T + j) * QKV + (NH + NKV + kvh) * hd, dv, 1.0f, hd, lane);
}

// delta[b, h, t] = dout[b, t, h] . out[b, t, h]: a warp per (token, head)
__global__ void attention_delta_kernel(float* delta, const bf16* dout, const bf16* out, int BT, int T, int NH,
                                       int hd) {
    int row = blockIdx.x * kGenericWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= BT * NH) { return; }
    const bf16* d = dout + (size_t)row * hd;
    const bf16* o = out + (size_t)row * hd;
    float sum = 0.0f;
    for (int i = lane; i < hd; i += 32) { sum += __bfloat162float(d[i]) * __bfloat162float(o[i]); }
    sum = warp_reduce<Sum>(sum);
    if (lane == 0) {
        int token = row / NH, h = row % NH, b = token / T, t = token % T;
        delta[((size_t)b * NH + h) * T + t] = sum;
    }
}

// delta = rowsum(dout * out) into delta [B, NH, T]
static void attention_delta(float* delta, const bf16* dout, const bf16* out, int B, int T, int NH, int hd) {
    int rows = B * T * NH;
    attention_delta_kernel<<<ceil_div(rows, kGenericWarps), 32 * kGenericWarps, 0, main_stream>>>(
        delta, dout, out, B * T, T, NH, hd);
    cudaCheck(cudaGetLastError());
}

static void attention_forward_generic(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int NKV, int hd) {
    int rows = B * NH * T;
    attention_forward_generic_kernel<<<ceil_div(rows, kGenericWarps), 32 * kGenericWarps, 0, main_stream>>>(
        out, lse, qkv, B, T, NH, NKV, hd, kLog2e / sqrtf((float)hd));
    cudaCheck(cudaGetLastError());
}

// delta [B, NH, T] is scratch
static void attention_backward_generic(bf16* dqkv, float* delta, const bf16* dout, const bf16* out, const bf16* qkv,
                                       const float* lse, int B, int T, int NH, int NKV, int hd) {
    attention_delta(delta, dout, out, B, T, NH, hd);
    float scale = 1.0f / sqrtf((float)hd), scale_log2 = scale * kLog2e;
    int kv_rows = B * NKV * T, rows = B * NH * T;
    attention_backward_dkdv_generic_kernel<<<ceil_div(kv_rows, kGenericWarps), 32 * kGenericWarps, 0,
                                             main_stream>>>(dqkv, dout, qkv, lse, delta, B, T, NH, NKV, hd,
                                                            scale_log2, scale);
    cudaCheck(cudaGetLastError());
    attention_backward_dq_generic_kernel<<<ceil_div(rows, kGenericWarps), 32 * kGenericWarps, 0,
                                           main_stream>>>(dqkv, dout, qkv, lse, delta, B, T, NH, NKV, hd,
                                                          scale_log2, scale);
    cudaCheck(cudaGetLastError());
}

} // namespace attention_detail

#endif // LLMC_CUDA_ATTENTION_GENERIC_CUH
