/*
 The gated FFN on the GPU: its activation over rows of H (bf16 in and out, fp32 math), act = ReLU or
 SiLU (FfnActivation; SiLU for dense models: silu(g) = g / (1 + e^-g), silu'(g) = s (1 + g (1 - s)) with
 s = 1 / (1 + e^-g); a compile-time choice inside the kernels, so both read and write the same bytes),
     forward:   h = bf16(act(g) * u);  per row m:  row_l1[m] = sum_n |h[m, n]| (of h as stored),
                row_active[m] = #{n : g[m, n] > 0} (both added to the old values with accumulate);
                per unit n:  fired[n] = 1 if g[m, n] > 0 for any m (only ever set, never cleared; fired may
                be NULL)
     unit counts:  count[n] += #{m : g[m, n] > 0}
     backward:  d = dh + l1_scale * sign(h),  du = d * act(g),  dg = d * u * act'(g)   (dg may alias dh)
     dead-neuron re-initialisation (docs/MODEL.md): the fp32 master row j of W_g whose unit did not fire
                becomes 0.9 W_g[j] + 0.1 N(0, 0.02^2) (Philox noise of (seed, element)), and its bf16 copy follows
 and the dense FFN forward of inference and of TwELL's dense path, y = bf16(act(f Wg^T) * (f Wu^T)) WdT
 (g and u rounded to bf16 as GEMM outputs; no statistics). The CPU twin: llmc/ffn/dense.h.
*/
#ifndef LLMC_FFN_CUDA_DENSE_CUH
#define LLMC_FFN_CUDA_DENSE_CUH

#include <curand_kernel.h>
#include <stdint.h>
#include "llmc/cuda_common.cuh"
#include "llmc/cuda_matmul.cuh"
#include "llmc/ffn/dense.h"
#include "llmc/model.h"

// act(g) and act'(g) in fp32
template <int ACT>
__device__ __forceinline__ float gate_act(float g) {
    if (ACT == ACT_SILU) { return g / (1.0f + __expf(-g)); }
    return g > 0.0f ? g : 0.0f;
}

template <int ACT>
__device__ __forceinline__ float gate_act_grad(float g) {
    if (ACT == ACT_SILU) {
        float s = 1.0f / (1.0f + __expf(-g));
        return s * (1.0f + g * (1.0f - s));
    }
    return g > 0.0f ? 1.0f : 0.0f;
}

constexpr int GATE_THREADS = 256;
constexpr int GATE_ROWS_PER_WARP = 4;

// A warp owns GATE_ROWS_PER_WARP rows and walks their columns 8 at a time, the rows side by side: the
// row sums stay in registers, and the units that fired in any of the rows are marked once per column
// group instead of once per row. A mark is written only where fired still reads 0, and only as the
// byte 1, so blocks racing on a mark all write the same value.
template <int ACT>
__global__ void __launch_bounds__(GATE_THREADS)
relu_gate_forward_kernel(bf16* __restrict__ h, float* __restrict__ row_l1, int* __restrict__ row_active,
                         uint8_t* __restrict__ fired, const bf16* __restrict__ g, const bf16* __restrict__ u,
                         int M, int H, int accumulate) {
    const int lane = threadIdx.x % 32;
    const int row0 = (blockIdx.x * (GATE_THREADS / 32) + threadIdx.x / 32) * GATE_ROWS_PER_WARP;
    if (row0 >= M) { return; }
    float l1[GATE_ROWS_PER_WARP] = {};
    int active[GATE_ROWS_PER_WARP] = {};
    for (int col = lane * 8; col < H; col += 32 * 8) {
        Bf16x8 gv[GATE_ROWS_PER_WARP], uv[GATE_ROWS_PER_WARP];
        #pragma unroll
        for (int r = 0; r < GATE_ROWS_PER_WARP; r++) {
            if (row0 + r < M) {
                gv[r] = load_bf16x8(g + (size_t)(row0 + r) * H + col);
                uv[r] = load_bf16x8(u + (size_t)(row0 + r) * H + col);
            }
        }
        unsigned fired_bits = 0; // bit i: unit col + i fired in one of the rows
        #pragma unroll
        for (int r = 0; r < GATE_ROWS_PER_WARP; r++) {
            if (row0 + r < M) {
                Bf16x8 hv;
                #pragma unroll
                for (int i = 0; i < 8; i++) {
                    float gi = __bfloat162float(gv[r].v[i]);
                    hv.v[i] = __float2bfloat16_rn(gate_act<ACT>(gi) * __bfloat162float(uv[r].v[i]));
                    l1[r] += fabsf(__bfloat162float(hv.v[i]));
                    active[r] += gi > 0.0f;
                    fired_bits |= (unsigned)(gi > 0.0f) << i;
                }
                store_bf16x8(h + (size_t)(row0 + r) * H + col, hv);
            }
        }
        if (fired && fired_bits) {
            unsigned long long marks = *reinterpret_cast<const unsigned long long*>(fired + col);
            for (int i = 0; i < 8; i++) {
                if (((fired_bits >> i) & 1) && ((marks >> (8 * i)) & 0xff) == 0) { fired[col + i] = 1; }
            }
        }
    }
    #pragma unroll
    for (int r = 0; r < GATE_ROWS_PER_WARP; r++) {
        float row_sum = warp_reduce<Sum>(l1[r]);
        int row_count = warp_reduce<Sum>(active[r]);
        if (lane == 0 && row0 + r < M) {
            row_l1[row0 + r] = accumulate ? row_l1[row0 + r] + row_sum : row_sum;
            row_active[row0 + r] = accumulate ? row_active[row0 + r] + row_count : row_count;
        }
    }
}

void relu_gate_forward(bf16* h, float* row_l1, int* row_active, uint8_t* fired, const bf16* g, const bf16* u,
                       int M, int H, int accumulate = 0, int activation = ACT_RELU) {
    if (H % 8 != 0) { fatal("relu_gate_forward: H %d must be a multiple of 8 on the GPU", H); }
    const int rows_per_block = GATE_THREADS / 32 * GATE_ROWS_PER_WARP;
    auto kernel = activation == ACT_SILU ? relu_gate_forward_kernel<ACT_SILU> : relu_gate_forward_kernel<ACT_RELU>;
    kernel<<<ceil_div(M, rows_per_block), GATE_THREADS, 0, main_stream>>>(h, row_l1, row_active, fired, g, u, M, H,
                                                                            accumulate);
    cudaCheck(cudaGetLastError());
}

// A thread per 8 columns and UNIT_COUNT_ROWS rows: its counts in registers, then one integer atomic per
// column (integer sums: the same result in any order)
constexpr int UNIT_COUNT_ROWS = 256;

__global__ void unit_count_add_kernel(uint32_t* count, const bf16* g, int M, int H) {
    const int col = (blockIdx.x * blockDim.x + threadIdx.x) * 8, row0 = blockIdx.y * UNIT_COUNT_ROWS;
    if (col >= H) { return; }
    uint32_t c[8] = {};
    const int rows = min(UNIT_COUNT_ROWS, M - row0);
    for (int r = 0; r < rows; r++) {
        Bf16x8 v = load_bf16x8(g + (size_t)(row0 + r) * H + col);
        #pragma unroll
        for (int i = 0; i < 8; i++) { c[i] += __bfloat162float(v.v[i]) > 0.0f; }
    }
    #pragma unroll
    for (int i = 0; i < 8; i++) {
        if (c[i]) { atomicAdd(count + col + i, c[i]); }
    }
}

void unit_count_add(uint32_t* count, const bf16* g, int M, int H) {
    if (H % 8 != 0) { fatal("unit_count_add: H %d must be a multiple of 8 on the GPU", H); }
    dim3 grid(ceil_div(H / 8, 128), ceil_div(M, UNIT_COUNT_ROWS));
    unit_count_add_kernel<<<grid, 128, 0, main_stream>>>(count, g, M, H);
    cudaCheck(cudaGetLastError());
}

// elementwise, 8 per thread; every input of an element is loaded before its outputs are stored, so dg may
// be dh and du may be h (llmc/ffn/split.h)
template <int ACT>
__global__ void relu_gate_backward_kernel(bf16* dg, bf16* du, const bf16* dh, const bf16* g, const bf16* u,
                                          const bf16* h, float l1_scale, size_t n) {
    const size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (idx >= n) { return; }
    Bf16x8 dhv = load_bf16x8(dh + idx), gv = load_bf16x8(g + idx), uv = load_bf16x8(u + idx), hv = load_bf16x8(h + idx);
    Bf16x8 dgv, duv;
    for (int i = 0; i < 8; i++) {
        float hi = __bfloat162float(hv.v[i]), gi = __bfloat162float(gv.v[i]);
        float sign = hi > 0.0f ? 1.0f : (hi < 0.0f ? -1.0f : 0.0f);
        float d = __bfloat162float(dhv.v[i]) + l1_scale * sign;
        duv.v[i] = __float2bfloat16_rn(d * gate_act<ACT>(gi));
        dgv.v[i] = __float2bfloat16_rn(d * __bfloat162float(uv.v[i]) * gate_act_grad<ACT>(gi));
    }
    store_bf16x8(du + idx, duv);
    store_bf16x8(dg + idx, dgv);
}

void relu_gate_backward(bf16* dg, bf16* du, const bf16* dh, const bf16* g, const bf16* u, const bf16* h,
                        float l1_scale, int M, int H, int activation = ACT_RELU) {
    if (H % 8 != 0) { fatal("relu_gate_backward: H %d must be a multiple of 8 on the GPU", H); }
    const int threads = 256;
    const size_t n = (size_t)M * H;
    auto kernel = activation == ACT_SILU ? relu_gate_backward_kernel<ACT_SILU> : relu_gate_backward_kernel<ACT_RELU>;
    kernel<<<(unsigned)((n / 8 + threads - 1) / threads), threads, 0, main_stream>>>(dg, du, dh, g, u, h, l1_scale, n);
    cudaCheck(cudaGetLastError());
}

// a block per row; rows whose unit fired return at once
__global__ void gate_dead_reinit_kernel(bf16* wg, float* master, const uint8_t* fired, int D, uint64_t seed) {
    const int j = blockIdx.x;
    if (fired[j]) { return; }
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        size_t idx = (size_t)j * D + i;
        curandStatePhilox4_32_10_t state;
        curand_init(seed, idx, 0, &state);
        float w = 0.9f * master[idx] + 0.1f * 0.02f * curand_normal(&state);
        master[idx] = w;
        wg[idx] = __float2bfloat16_rn(w);
    }
}

void gate_dead_reinit(bf16* wg, float* master, const uint8_t* fired, int rows, int D, uint64_t seed) {
    if (master == NULL) { fatal("gate_dead_reinit: the GPU path needs the fp32 master weights"); }
    gate_dead_reinit_kernel<<<rows, 256, 0, main_stream>>>(wg, master, fired, D, seed);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------
// the dense FFN forward of inference and of TwELL's dense path (no statistics)

// the dense FFN's elementwise step: h = bf16(act(g) * u), 8 values per thread
// and step; `active` (if not NULL) gets the number of g > 0, one atomic per block
constexpr int RELU_MUL_THREADS = 256;
template <int ACT>
__global__ void __launch_bounds__(RELU_MUL_THREADS)
relu_mul_kernel(bf16* h, const bf16* g, const bf16* u, size_t n8, unsigned long long* active) {
    unsigned long long count = 0;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n8; k += (size_t)gridDim.x * blockDim.x) {
        Bf16x8 gv = load_bf16x8(g + 8 * k), uv = load_bf16x8(u + 8 * k), hv;
        #pragma unroll
        for (int e = 0; e < 8; e++) {
            float gate = __bfloat162float(gv.v[e]);
            count += gate > 0.0f;
            hv.v[e] = __float2bfloat16_rn(gate_act<ACT>(gate) * __bfloat162float(uv.v[e]));
        }
        store_bf16x8(h + 8 * k, hv);
    }
    count = block_reduce<Sum>(count);
    if (threadIdx.x == 0 && active != NULL && count > 0) { atomicAdd(active, count); }
}

// h = bf16(act(g) * u) over n values (n % 8 == 0; h may be g), a grid of at
// most 8 blocks per SM striding over them; `active` (if not NULL) gets the number of g > 0
static inline void relu_mul(bf16* h, const bf16* g, const bf16* u, size_t n, unsigned long long* active,
                            int activation = ACT_RELU) {
    static int num_sms = 0;
    if (num_sms == 0) { num_sms = device_attribute(cudaDevAttrMultiProcessorCount); }
    size_t n8 = n / 8, blocks = (n8 + RELU_MUL_THREADS - 1) / RELU_MUL_THREADS;
    blocks = blocks < (size_t)num_sms * 8 ? blocks : (size_t)num_sms * 8;
    auto kernel = activation == ACT_SILU ? relu_mul_kernel<ACT_SILU> : relu_mul_kernel<ACT_RELU>;
    kernel<<<(unsigned int)blocks, RELU_MUL_THREADS, 0, main_stream>>>(h, g, u, n8, active);
    cudaCheck(cudaGetLastError());
}

// the dense gated FFN (the reference, and the path for layers too active for
// sparsity): g = f Wg^T and u = f Wu^T as one batched product (decode: up to
// GEMV_MAX_ROWS rows, each by decode_linear's GEMV), h = act(g) * u over g,
// y = h WdT (y += with accumulate: a layer's hot units beside its cold ones);
// g and u [M, H] are scratch; `active` (if not NULL) gets the number of g > 0
static inline void ffn_dense_forward(bf16* y, bf16* g, bf16* u, const bf16* f, const bf16* wg, const bf16* wu,
                                     const bf16* wdT, int M, int D, int H, unsigned long long* active,
                                     bool decode = false, int accumulate = 0, int activation = ACT_RELU) {
    if (H % 8 != 0) { fatal("ffn_dense_forward: H %d must be a multiple of 8", H); }
    if (decode && gemv_fits(M, D)) {
        decode_linear(g, f, wg, M, H, D);
        decode_linear(u, f, wu, M, H, D);
    } else {
        gemm_pair(g, u, f, wg, wu, M, H, D);
    }
    relu_mul(g, g, u, (size_t)M * H, active, activation);
    gemm(y, g, wdT, M, D, H, 0, 0, accumulate);
}

#endif // LLMC_FFN_CUDA_DENSE_CUH
