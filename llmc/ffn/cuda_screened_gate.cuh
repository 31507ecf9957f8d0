/*
 The screened decode gate on the GPU. The math, the bound and why it holds are
 at the top of llmc/ffn/screened_gate.h, whose CPU reference gives the same bits.

 screen_quantize (once, when the weights are loaded): the int8 copy of Wg
 [H, D], a warp per row: the row's outlier by a warp reduction (the largest
 finite |w|, the first column on ties), then lane g quantises group g
 (screen_quantize_group, the CPU's code).

 screened_gate (each decode step, B <= GEMV_MAX_ROWS rows f [B, D]): per unit n
     U_bn >= G_bn = the decode GEMV's fp32 sum f_b . Wg[n], from the int8 row;
     n is recomputed when some b has !(U_bn <= 0): G_n = that sum for every b,
       by warp_dot_rows on the bf16 row (the GEMV's own code: the same bits);
     then epilogue(n, G_n) as the GEMV calls it, with G_n = 0 for a unit not
       recomputed (no b fires there, and relu(bf16(0)) = relu(g)).
 With GateUpRow (llmc/ffn/cuda_decode.cuh) the epilogue writes a[b, n] =
 bf16(g bf16(f_b . Wu[n])) where g > 0 and 0 elsewhere: every word that
 gemv(GateUpRow) writes, to the bit, for sparse_down_active_kernel to read.

 Layout, for bandwidth: a warp per unit, 8 warps a block, as the GEMV.
 Before the grid dependency wait (launch_early) each warp loads its unit's
 int8 row (16 bytes a lane per step of 512 columns, coalesced; D <= 2048
 whole), its scale words (lane g: group g) and outlier, so that the 11.5 MB
 of a 5632 x 2048 layer stream in while the kernels before it finish. After
 the wait: f into shared memory (bf16, as the exact rows want it), the group
 norms of f once per block, a lane's 16 products per step and row, then the
 bound terms (lane g: group g) and one warp reduction per row. A candidate's
 bf16 row is read after that (4 KB at D 2048): ~65 units of 5632 per row at
 the standard synthetic point (uniform k = 30, 28.5 firing).
 With GateUpRow on sm_90a: 80 registers at B = 1, 2 (3 blocks of 256 threads
 an SM), 88 to 102 at B = 3 (2 blocks), no spills. Two units a warp, sharing
 one conversion of f, took 170 to 210 registers: not kept (dev/NOTES.md).
 int8 -> float: a byte permute puts the byte (q + 128) under the exponent of
 2^23 and a subtraction of 2^23 + 128 leaves q, exactly (no I2F, a
 quarter-rate conversion).
 candidates (NULL in a decode step): per row b the units with !(U_bn <= 0),
 then the units recomputed, added by atomics (tests and benchmarks).
*/
#ifndef LLMC_FFN_CUDA_SCREENED_GATE_CUH
#define LLMC_FFN_CUDA_SCREENED_GATE_CUH

#include "llmc/cuda_common.cuh"
#include "llmc/cuda_matmul.cuh"
#include "llmc/ffn/screened_gate.h"

namespace screen_detail {

constexpr int SCREEN_PREFETCH = 4; // steps of the int8 row loaded before the wait (D <= 2048: the row)
constexpr int SCREEN_THREADS = GEMV_THREADS, SCREEN_WARPS = SCREEN_THREADS / 32;

// the int8 copy of rows of Wg: a warp per row
__global__ void screen_quantize_kernel(ScreenedGate sg, const bf16* wg) {
    const int n = blockIdx.x * SCREEN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= sg.H) { return; }
    const uint16_t* w = reinterpret_cast<const uint16_t*>(wg) + (size_t)n * sg.D;
    float best = -1.0f;
    int c = 0;
    for (int i = lane; i < sg.D; i += 32) {
        const float v = fabsf(screen_bf16_value(w[i]));
        if (isfinite(v) && v > best) { best = v; c = i; }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        const float other = __shfl_xor_sync(0xffffffffu, best, offset);
        const int other_c = __shfl_xor_sync(0xffffffffu, c, offset);
        if (other > best || (other == best && other_c < c)) { best = other; c = other_c; }
    }
    for (int g = lane; g < sg.groups; g += 32) {
        const int end = (g + 1) * SCREEN_GROUP < sg.D ? (g + 1) * SCREEN_GROUP : sg.D;
        sg.scales[(size_t)n * sg.groups + g] = screen_quantize_group(sg.q + (size_t)n * sg.D, w, g * SCREEN_GROUP, end, c);
    }
    if (lane == 0) { sg.outlier[n] = (uint32_t)c | (uint32_t)w[c] << 16; }
}

// byte k (a constant) of word as a float: (q + 128) - 128
__device__ __forceinline__ float screen_q(uint32_t word, int k) {
    return __fsub_rn(__uint_as_float(__byte_perm(word, 0x4B000000u, 0x7440 | k)), 8388736.0f);
}

// norms[b][g] = (||f_bg||_1, >= ||f_bg||_2) of the rows in xs, in screen_group_norms' order:
// a warp per (row, step), a lane's 16 columns in order, a butterfly over the lanes of a group
template <int B>
__device__ void screen_norms(float2* norms, const bf16* xs, int D, int groups) {
    constexpr int LANES = SCREEN_GROUP / SCREEN_LANE_COLS;
    const int lane = threadIdx.x % 32, steps = (D + SCREEN_STEP - 1) / SCREEN_STEP;
    for (int p = threadIdx.x / 32; p < B * steps; p += SCREEN_WARPS) {
        const int b = p / steps, col = (p % steps) * SCREEN_STEP + lane * SCREEN_LANE_COLS;
        float n1 = 0.0f, ss = 0.0f;
        if (col < D) {
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                const Bf16x8 v = load_bf16x8(xs + b * D + col + 8 * h);
                #pragma unroll
                for (int e = 0; e < 8; e++) {
                    const float f = __bfloat162float(v.v[e]);
                    n1 = __fadd_rn(n1, fabsf(f));
                    ss = __fmaf_rn(f, f, ss);
                }
            }
        }
        #pragma unroll
        for (int offset = LANES / 2; offset > 0; offset /= 2) {
            n1 = __fadd_rn(n1, __shfl_xor_sync(0xffffffffu, n1, offset));
            ss = __fadd_rn(ss, __shfl_xor_sync(0xffffffffu, ss, offset));
        }
        if (lane % LANES == 0 && col < D) {
            norms[b * groups + col / SCREEN_GROUP] =
                make_float2(n1, __fsqrt_rn(__fadd_rn(ss, (float)SCREEN_GROUP * 0x1p-149f)));
        }
    }
}

// acc[b] += s_g t, t = the fma chain of f_b q over the lane's 16 columns from col
// (v: the unit's int8 there; scale: lane g's word of group g; every lane calls it)
template <int B>
__device__ __forceinline__ void screen_step(float (&acc)[B], const bf16* xs, int D, int col, uint4 v, uint32_t scale) {
    const float s = __uint_as_float(__shfl_sync(0xffffffffu, scale, (col / SCREEN_GROUP) % 32) << 16);
    if (col >= D) { return; }
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
    float q[SCREEN_LANE_COLS];
    #pragma unroll
    for (int k = 0; k < SCREEN_LANE_COLS; k++) { q[k] = screen_q(words[k / 4], k % 4); }
    #pragma unroll
    for (int b = 0; b < B; b++) {
        const Bf16x8 lo = load_bf16x8(xs + b * D + col), hi = load_bf16x8(xs + b * D + col + 8);
        float t = 0.0f;
        #pragma unroll
        for (int k = 0; k < SCREEN_LANE_COLS; k++) { t = __fmaf_rn(__bfloat162float(k < 8 ? lo.v[k] : hi.v[k - 8]), q[k], t); }
        acc[b] = __fmaf_rn(s, t, acc[b]);
    }
}

template <int B, typename Epilogue>
__global__ void __launch_bounds__(SCREEN_THREADS)
screened_gate_kernel(Epilogue epilogue, ScreenedGate sg, const bf16* wg, const bf16* x, int* candidates) {
    extern __shared__ __align__(16) bf16 xs[]; // [B][D], then the norms [B][groups]
    const int D = sg.D, groups = sg.groups, lane = threadIdx.x % 32;
    const int n = blockIdx.x * SCREEN_WARPS + threadIdx.x / 32;
    float2* norms = reinterpret_cast<float2*>(xs + B * D);
    // the unit's int8 row, scale words and outlier (nothing in the stream writes them) before the wait
    const uint8_t* row = sg.q + (size_t)n * D;
    uint4 v[SCREEN_PREFETCH];
    uint32_t scale = 0, outlier = 0;
    if (n < sg.H) {
        #pragma unroll
        for (int j = 0; j < SCREEN_PREFETCH; j++) {
            const int col = j * SCREEN_STEP + lane * SCREEN_LANE_COLS;
            if (col < D) { v[j] = *reinterpret_cast<const uint4*>(row + col); }
        }
        if (lane < groups) { scale = sg.scales[(size_t)n * groups + lane]; }
        outlier = sg.outlier[n];
    }
    grid_dependents_launch();
    grid_dependency_wait();
    for (int i = threadIdx.x * 8; i < B * D; i += SCREEN_THREADS * 8) { store_bf16x8(xs + i, load_bf16x8(x + i)); }
    __syncthreads();
    screen_norms<B>(norms, xs, D, groups);
    __syncthreads();
    if (n >= sg.H) { return; }

    // A~: the lane's 16 columns of every step, per row
    float acc[B] = {};
    #pragma unroll
    for (int j = 0; j < SCREEN_PREFETCH; j++) {
        if (j * SCREEN_STEP >= D) { break; }
        screen_step<B>(acc, xs, D, j * SCREEN_STEP + lane * SCREEN_LANE_COLS, v[j], scale);
    }
    for (int col = (SCREEN_PREFETCH * 32 + lane) * SCREEN_LANE_COLS; col - lane * SCREEN_LANE_COLS < D; col += SCREEN_STEP) {
        screen_step<B>(acc, xs, D, col, col < D ? *reinterpret_cast<const uint4*>(row + col) : make_uint4(0, 0, 0, 0), scale);
    }

    // the outlier and the bound terms (lane g: group g), one reduction per row
    const int c = (int)(outlier & 0xffffu);
    const float w_c = __uint_as_float(outlier & 0xffff0000u);
    const float s = __uint_as_float(scale << 16), E = __uint_as_float(scale & 0xffff0000u);
    const float r_margin = screen_r_margin(D), abs_slack = screen_abs_slack(D);
    bool recompute = false;
    #pragma unroll
    for (int b = 0; b < B; b++) {
        const float f_c = __bfloat162float(xs[b * D + c]);
        float a = acc[b];
        if (lane == 0) { a = __fmaf_rn(f_c, w_c, a); }
        if (lane < groups) {
            const float2 nb = norms[b * groups + lane];
            a = __fmaf_rn(fminf(__fmul_rn(nb.x, __fmul_rn(0.5f, s)), __fmul_rn(nb.y, E)), SCREEN_Q_MARGIN, a);
            float S = __fmul_rn(nb.x, __fmul_rn(127.0f, s));
            if (lane == 0) { S = __fadd_rn(S, fabsf(__fmul_rn(f_c, w_c))); }
            a = __fmaf_rn(S, r_margin, a);
            if (!(S <= 0x1p100f)) { a = INFINITY; }
        }
        const bool candidate = !(__fadd_rn(warp_reduce<Sum>(a), abs_slack) <= 0.0f);
        recompute = recompute || candidate;
        if (candidates && candidate && lane == 0) { atomicAdd(candidates + b, 1); }
    }

    // a candidate's exact sums, as the GEMV computes them; then the epilogue (G = 0 elsewhere: no row fires
    // there). From two rows up, what the epilogue reads is requested with the bf16 row, one round trip instead
    // of two on a fired unit's chain; at one row that measured 2% slower, at two 2.4% faster (dev/RESULTS.md)
    float G[B] = {};
    if (!recompute) {
        epilogue(n, G, xs, lane);
        return;
    }
    const bf16* wrow = wg + (size_t)n * D;
    RowPrefetch r;
    prefetch_row(r, wrow, D, lane);
    if constexpr (B >= 2) {
        const auto ahead = epilogue.early(n, lane);
        warp_dot_rows<B>(G, xs, r, wrow, D, lane);
        if (candidates && lane == 0) { atomicAdd(candidates + B, 1); }
        epilogue(n, G, xs, lane, ahead);
    } else {
        warp_dot_rows<B>(G, xs, r, wrow, D, lane);
        if (candidates && lane == 0) { atomicAdd(candidates + B, 1); }
        epilogue(n, G, xs, lane);
    }
}

template <int B, typename Epilogue>
static void screened_gate_launch(const Epilogue& epilogue, const ScreenedGate& sg, const bf16* wg, const bf16* x,
                                 int* candidates) {
    // f and its norms: within the default 48 KiB at any width the screen takes
    static_assert(GEMV_MAX_ROWS * SCREEN_MAX_GROUPS * (SCREEN_GROUP * sizeof(bf16) + sizeof(float2)) <= 48 * 1024,
                  "the screened gate's shared memory past 48 KiB");
    static bool configured = false;
    if (!configured) {
        prefer_shared_memory(screened_gate_kernel<B, Epilogue>);
        configured = true;
    }
    const size_t smem = (size_t)B * sg.D * sizeof(bf16) + (size_t)B * sg.groups * sizeof(float2);
    launch_early(screened_gate_kernel<B, Epilogue>, ceil_div(sg.H, SCREEN_WARPS), SCREEN_THREADS, smem, epilogue, sg,
                 wg, x, candidates);
}

} // namespace screen_detail

// the int8 copy of Wg [sg->H, sg->D] (bf16, on the device) into sg's device buffers
static inline void screen_quantize(ScreenedGate* sg, const bf16* wg) {
    screen_detail::screen_quantize_kernel<<<ceil_div(sg->H, screen_detail::SCREEN_WARPS), screen_detail::SCREEN_THREADS,
                                            0, main_stream>>>(*sg, wg);
    cudaCheck(cudaGetLastError());
}

// whether the screened gate takes B rows of width D (else the GEMV gate)
static inline bool screened_gate_fits(int B, int D) {
    return gemv_fits(B, D) && D % SCREEN_LANE_COLS == 0 && D <= SCREEN_MAX_GROUPS * SCREEN_GROUP;
}

// The gate of B <= GEMV_MAX_ROWS rows x [B, D] over the units of sg (its int8 copy of wg
// [H, D]), each unit's sums handed to epilogue as the decode GEMV hands them
// (see the top of the file); candidates: NULL, or B + 1 counters to add to.
template <typename Epilogue>
static void screened_gate(const Epilogue& epilogue, const ScreenedGate& sg, const bf16* wg, const bf16* x, int B,
                          int* candidates) {
    using namespace screen_detail;
    if (!screened_gate_fits(B, sg.D)) { fatal("screened gate: %d rows of width %d, built for 1 to %d rows, D %% 16 == 0, D <= %d", B, sg.D, GEMV_MAX_ROWS, SCREEN_MAX_GROUPS * SCREEN_GROUP); }
    with_rows(B, [&](auto rows) { screened_gate_launch<decltype(rows)::value>(epilogue, sg, wg, x, candidates); });
}

#endif // LLMC_FFN_CUDA_SCREENED_GATE_CUH
