/*
 The mma.sync path of causal attention (sm_80 on; llmc/cuda_attention.cuh has
 the math): hd 64 and 128, 16-byte aligned pointers. A warp owns 16 rows of a
 CTA's tile and computes with mma.sync m16n8k16, operands read from shared
 memory with ldmatrix; tiles arrive by cp.async into a second buffer while the
 first one is used; shared rows are padded by 16 bytes so the 8 rows of an
 ldmatrix fall in different banks; rows past T are loaded as zeros and masked.
 - forward: a CTA per (b, h, block of 16 * warps queries), heaviest blocks
   first. Each warp keeps its 16 queries in registers, walks the key/value
   blocks of 64 keys up to the diagonal (a warp stops at its own last key),
   and keeps the online softmax (running max and sum per row) in fp32; P goes
   from the accumulators of S = QK^T straight into the A operand of O += PV.
 - backward in three launches: delta_t into scratch
   (llmc/cuda_attention_generic.cuh); dK, dV (a CTA per (b, kv head, block of
   16 * warps keys), each warp accumulating its 16 keys' dK, dV in registers
   over the heads of the group and the query tiles from the diagonal on); dQ
   (a CTA per (b, h, block of 16 * warps queries), walking the key blocks like
   the forward).
*/
#ifndef LLMC_CUDA_ATTENTION_MMA_CUH
#define LLMC_CUDA_ATTENTION_MMA_CUH

#include "llmc/cuda_attention_common.cuh"

namespace attention_detail {

// mma.sync path. Warps per CTA of each kernel; a warp owns 16 rows (queries, or
// keys for dK, dV), so a CTA owns 16 * warps. Templates, so
// dev/bench_attention.cu can time other choices.
constexpr int kPad = 8;      // bf16 elements added to each shared row (16 bytes)
constexpr int kBlockK = 64;  // keys per shared tile of the forward and of dQ
constexpr int kFwdWarps = 8, kDqWarps = 4, kDkvWarps = 4;
// queries per shared tile of the dK, dV kernel: 32 at hd 128 keeps S^T and dP^T
// small next to the 128 accumulators of dK and dV
template <int HD> __host__ __device__ constexpr int dkv_block_q() { return HD > 64 ? 32 : 64; }
// CTAs per SM asked of the register allocator: 16 warps where registers allow (hd 64 forward)
template <int HD, int WARPS> __host__ __device__ constexpr int fwd_min_blocks() { return (HD > 64 ? 8 : 16) / WARPS; }

// ----------------------------------------------------------------------------
// PTX wrappers: ldmatrix (cp.async, mma.sync: llmc/cuda_common.cuh)

// four 8x8 bf16 matrices; lane i gives the address of row i % 8 of matrix i / 8
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_address(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_address(p)));
}

// ----------------------------------------------------------------------------
// warp-level products on shared tiles with rows of `stride` bf16

// the A fragments of a warp's 16 rows x 16*KS columns of a row-major tile
template <int KS>
__device__ __forceinline__ void load_a_frags(uint32_t (&a)[KS][4], const bf16* tile, int stride, int lane) {
    #pragma unroll
    for (int ks = 0; ks < KS; ks++) { ldmatrix_x4(a[ks], tile + (lane % 16) * stride + ks * 16 + (lane / 16) * 8); }
}

// acc[16 x 8NT] += A[16 x 16KS] B^T, where B's 8NT rows (keys, or queries) of
// 16KS columns (the head dimension) are a row-major tile: S = Q K^T and dP = dO V^T
template <int NT, int KS>
__device__ __forceinline__ void warp_mma_abt(float (&acc)[NT][4], const uint32_t (&a)[KS][4], const bf16* b,
                                             int stride, int lane) {
    static_assert(NT % 2 == 0, "n-tiles come in pairs");
    #pragma unroll
    for (int ks = 0; ks < KS; ks++) {
        #pragma unroll
        for (int n = 0; n < NT; n += 2) {
            // matrices of B rows 8n.. x cols 16ks.., cols 16ks+8.., then rows 8n+8.. likewise
            uint32_t bf[4];
            ldmatrix_x4(bf, b + (n * 8 + lane % 8 + (lane / 16) * 8) * stride + ks * 16 + ((lane / 8) % 2) * 8);
            mma_16816(acc[n], a[ks], bf[0], bf[1]);
            mma_16816(acc[n + 1], a[ks], bf[2], bf[3]);
        }
    }
}

// acc[16 x 8NT] += P[16 x 8KT] B, P in the accumulator layout of a previous
// product (rounded to bf16 here), B's 8KT rows of 8NT columns a row-major tile:
// O += P V, dQ += dS K, dV += P^T dO, dK += dS^T Q
template <int NT, int KT>
__device__ __forceinline__ void warp_mma_pb(float (&acc)[NT][4], const float (&p)[KT][4], const bf16* b,
                                            int stride, int lane) {
    static_assert(NT % 2 == 0 && KT % 2 == 0, "tiles come in pairs");
    #pragma unroll
    for (int ks = 0; ks < KT / 2; ks++) {
        // the accumulators of n-tiles 2ks and 2ks+1 are exactly the A fragment of k-step ks
        uint32_t a[4] = {pack_bf16(p[2 * ks][0], p[2 * ks][1]), pack_bf16(p[2 * ks][2], p[2 * ks][3]),
                         pack_bf16(p[2 * ks + 1][0], p[2 * ks + 1][1]), pack_bf16(p[2 * ks + 1][2], p[2 * ks + 1][3])};
        #pragma unroll
        for (int n = 0; n < NT; n += 2) {
            // transposed matrices of B rows 16ks.. x cols 8n.., rows 16ks+8.., then cols 8n+8.. likewise
            uint32_t bf[4];
            ldmatrix_x4_trans(bf, b + (ks * 16 + lane % 16) * stride + n * 8 + (lane / 16) * 8);
            mma_16816(acc[n], a, bf[0], bf[1]);
            mma_16816(acc[n + 1], a, bf[2], bf[3]);
        }
    }
}

// cp.async of rows row0.. row0+ROWS-1 (HD bf16 each, `stride` apart in global
// memory) into a padded shared tile; rows at or past T become zeros
template <int ROWS, int HD, int THREADS>
__device__ __forceinline__ void load_tile(bf16* tile, const bf16* src, int row0, int T, int stride) {
    constexpr int CHUNKS = HD / 8; // 16-byte pieces per row
    static_assert(ROWS * CHUNKS % THREADS == 0, "every thread copies the same number of pieces");
    #pragma unroll
    for (int i = 0; i < ROWS * CHUNKS / THREADS; i++) {
        int c = threadIdx.x + i * THREADS, r = c / CHUNKS, col = (c % CHUNKS) * 8, row = row0 + r;
        bool valid = row < T;
        cp_async_16(tile + r * (HD + kPad) + col, src + (size_t)(valid ? row : 0) * stride + col, valid);
    }
}

// ----------------------------------------------------------------------------
// forward

template <int HD, int WARPS>
__global__ void __launch_bounds__(32 * WARPS, (fwd_min_blocks<HD, WARPS>()))
attention_forward_kernel(bf16* out, float* lse, const bf16* qkv, int T, int NH, int NKV, float scale_log2) {
    constexpr int THREADS = 32 * WARPS, BQ = 16 * WARPS, BK = kBlockK, S = HD + kPad;
    bf16* q_s = reinterpret_cast<bf16*>(attention_smem); // [BQ][S]
    bf16* k_s = q_s + BQ * S;                             // [2][BK][S]
    bf16* v_s = k_s + 2 * BK * S;                         // [2][BK][S]

    int b = blockIdx.x / NH, h = blockIdx.x % NH, kvh = h / (NH / NKV);
    int q0 = (gridDim.y - 1 - blockIdx.y) * BQ; // the longest rows first
    int QKV = (NH + 2 * NKV) * HD;
    const bf16* seq = qkv + (size_t)b * T * QKV;
    const bf16* k_g = seq + (NH + kvh) * HD;
    const bf16* v_g = seq + (NH + NKV + kvh) * HD;
    int n_kblocks = (min(T, q0 + BQ) + BK - 1) / BK;

    load_tile<BQ, HD, THREADS>(q_s, seq + h * HD, q0, T, QKV);
    cp_async_commit();
    load_tile<BK, HD, THREADS>(k_s, k_g, 0, T, QKV);
    load_tile<BK, HD, THREADS>(v_s, v_g, 0, T, QKV);
    cp_async_commit();

    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int qw = q0 + 16 * warp;       // the warp's first query
    int row_g = qw + lane / 4;     // the lane's queries: row_g and row_g + 8
    bool warp_has_rows = qw < T;
    cp_async_wait<1>();            // Q is in
    __syncthreads();
    uint32_t q_frag[HD / 16][4];
    load_a_frags(q_frag, q_s + 16 * warp * S, S, lane);

    float o[HD / 8][4] = {};
    float row_max[2] = {-INFINITY, -INFINITY}; // running max of the raw scores q.k
    float row_sum[2] = {0.0f, 0.0f};           // this lane's part of sum exp2((score - max) c log2(e))
    for (int j = 0; j < n_kblocks; j++) {
        int buf = j % 2, key0 = j * BK;
        if (j + 1 < n_kblocks) {
            load_tile<BK, HD, THREADS>(k_s + (buf ^ 1) * BK * S, k_g, key0 + BK, T, QKV);
            load_tile<BK, HD, THREADS>(v_s + (buf ^ 1) * BK * S, v_g, key0 + BK, T, QKV);
        }
        cp_async_commit();
        cp_async_wait<1>(); // block j is in
        __syncthreads();
        if (warp_has_rows && key0 <= qw + 15) {
            float s[BK / 8][4] = {};
            warp_mma_abt(s, q_frag, k_s + buf * BK * S, S, lane);
            mask_future_keys(s, key0, qw, row_g, lane);
            // key 0 is in block 0 of every row, so the max is finite from the first block on
            #pragma unroll
            for (int r = 0; r < 2; r++) {
                float mx = row_max[r];
                #pragma unroll
                for (int n = 0; n < BK / 8; n++) { mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1])); }
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1)); // the 4 lanes of a row
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
                float correction = exp2_ftz((row_max[r] - mx) * scale_log2);
                row_max[r] = mx;
                #pragma unroll
                for (int n = 0; n < HD / 8; n++) { o[n][2 * r] *= correction; o[n][2 * r + 1] *= correction; }
                float max_scaled = mx * scale_log2, sum = 0.0f;
                #pragma unroll
                for (int n = 0; n < BK / 8; n++) {
                    s[n][2 * r] = exp2_ftz(fmaf(s[n][2 * r], scale_log2, -max_scaled));
                    s[n][2 * r + 1] = exp2_ftz(fmaf(s[n][2 * r + 1], scale_log2, -max_scaled));
                    sum += s[n][2 * r] + s[n][2 * r + 1];
                }
                row_sum[r] = row_sum[r] * correction + sum;
            }
            warp_mma_pb(o, s, v_s + buf * BK * S, S, lane);
        }
        __syncthreads(); // everyone is done with buffer `buf` before it is refilled
    }

    if (warp_has_rows) {
        float inv_sum[2];
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            row_sum[r] += __shfl_xor_sync(0xffffffff, row_sum[r], 1);
            row_sum[r] += __shfl_xor_sync(0xffffffff, row_sum[r], 2);
            inv_sum[r] = 1.0f / row_sum[r];
            int row = row_g + 8 * r;
            if (lane % 4 == 0 && row < T) {
                lse[((size_t)b * NH + h) * T + row] = (row_max[r] * scale_log2 + log2f(row_sum[r])) * kLn2;
            }
        }
        store_rows(out + (size_t)b * T * NH * HD + h * HD, (size_t)NH * HD, o, row_g, T, inv_sum, lane);
    }
}

// ----------------------------------------------------------------------------
// backward

// dK, dV of a block of 16 * WARPS keys of one kv head, summed over the query
// heads of its group and all the queries at or after each key
template <int HD, int WARPS>
__global__ void __launch_bounds__(32 * WARPS)
attention_backward_dkdv_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* delta,
                               int T, int NH, int NKV, float scale_log2, float scale) {
    constexpr int THREADS = 32 * WARPS, BK = 16 * WARPS, BQ = dkv_block_q<HD>(), S = HD + kPad;
    bf16* k_s = reinterpret_cast<bf16*>(attention_smem);       // [BK][S]
    bf16* v_s = k_s + BK * S;                                   // [BK][S]
    bf16* q_s = v_s + BK * S;                                   // [2][BQ][S]
    bf16* do_s = q_s + 2 * BQ * S;                              // [2][BQ][S]
    float* lse_s = reinterpret_cast<float*>(do_s + 2 * BQ * S); // [2][BQ]
    float* delta_s = lse_s + 2 * BQ;                            // [2][BQ]

    int b = blockIdx.x / NKV, kvh = blockIdx.x % NKV, group = NH / NKV;
    int k0 = blockIdx.y * BK; // blockIdx.y 0, the most queries, goes first
    int QKV = (NH + 2 * NKV) * HD, D = NH * HD;
    const bf16* seq = qkv + (size_t)b * T * QKV;
    const bf16* dout_seq = dout + (size_t)b * T * D;
    // the query tiles that see these keys: from the one holding k0 to the end, for each head of the group
    int first_qtile = k0 / BQ, n_qtiles = (T + BQ - 1) / BQ - first_qtile, n_iters = group * n_qtiles;

    // Q, dO, lse and delta of iteration `it` into buffer `buf`
    auto load_query_tile = [&](int it, int buf) {
        int h = kvh * group + it / n_qtiles, q_start = (first_qtile + it % n_qtiles) * BQ;
        load_tile<BQ, HD, THREADS>(q_s + buf * BQ * S, seq + h * HD, q_start, T, QKV);
        load_tile<BQ, HD, THREADS>(do_s + buf * BQ * S, dout_seq + h * HD, q_start, T, D);
        const float* lse_row = lse + ((size_t)b * NH + h) * T;
        const float* delta_row = delta + ((size_t)b * NH + h) * T;
        for (int i = threadIdx.x; i < BQ; i += THREADS) {
            int q = q_start + i;
            bool valid = q < T;
            cp_async_4(lse_s + buf * BQ + i, lse_row + (valid ? q : 0), valid);
            cp_async_4(delta_s + buf * BQ + i, delta_row + (valid ? q : 0), valid);
        }
    };

    load_tile<BK, HD, THREADS>(k_s, seq + (NH + kvh) * HD, k0, T, QKV);
    load_tile<BK, HD, THREADS>(v_s, seq + (NH + NKV + kvh) * HD, k0, T, QKV);
    load_query_tile(0, 0);
    cp_async_commit();

    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int kw = k0 + 16 * warp;    // the warp's first key
    int key_g = kw + lane / 4;  // the lane's keys: key_g and key_g + 8
    bool warp_has_keys = kw < T;
    float dk[HD / 8][4] = {}, dv[HD / 8][4] = {};
    for (int it = 0; it < n_iters; it++) {
        int buf = it % 2;
        if (it + 1 < n_iters) { load_query_tile(it + 1, buf ^ 1); }
        cp_async_commit();
        cp_async_wait<1>(); // iteration it's tiles (and K, V) are in
        __syncthreads();
        int q_start = (first_qtile + it % n_qtiles) * BQ;
        if (warp_has_keys && q_start + BQ - 1 >= kw) {
            const bf16* qb = q_s + buf * BQ * S;
            const bf16* dob = do_s + buf * BQ * S;
            const float* lse_b = lse_s + buf * BQ;
            const float* delta_b = delta_s + buf * BQ;
            uint32_t a[HD / 16][4];
            float s[BQ / 8][4] = {}, dp[BQ / 8][4] = {};
            load_a_frags(a, k_s + 16 * warp * S, S, lane);
            warp_mma_abt(s, a, qb, S, lane);   // S^T = K Q^T: rows keys, columns queries
            load_a_frags(a, v_s + 16 * warp * S, S, lane);
            warp_mma_abt(dp, a, dob, S, lane); // dP^T = V dO^T
            // queries before the key or past the end get P = 2^-inf = 0
            if (q_start < kw + 15 || q_start + BQ > T) {
                int ahead = key_g - q_start - 2 * (lane % 4); // key - query of element [0][0]
                #pragma unroll
                for (int n = 0; n < BQ / 8; n++) {
                    #pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int col = n * 8 + 2 * (lane % 4) + e % 2;
                        if (ahead - 8 * n - e % 2 + 8 * (e / 2) > 0 || q_start + col >= T) { s[n][e] = -INFINITY; }
                    }
                }
            }
            #pragma unroll
            for (int n = 0; n < BQ / 8; n++) {
                float2 l = *reinterpret_cast<const float2*>(lse_b + n * 8 + 2 * (lane % 4));
                float2 d = *reinterpret_cast<const float2*>(delta_b + n * 8 + 2 * (lane % 4));
                #pragma unroll
                for (int e = 0; e < 4; e++) {
                    float p = exp2_ftz(fmaf(s[n][e], scale_log2, -(e % 2 ? l.y : l.x) * kLog2e));
                    s[n][e] = p;
                    dp[n][e] = p * (dp[n][e] - (e % 2 ? d.y : d.x)); // dS^T
                }
            }
            warp_mma_pb(dv, s, dob, S, lane); // dV += P^T dO
            warp_mma_pb(dk, dp, qb, S, lane); // dK += dS^T Q
        }
        __syncthreads(); // everyone is done with buffer `buf` before it is refilled
    }

    if (warp_has_keys) {
        const float dk_scale[2] = {scale, scale}, dv_scale[2] = {1.0f, 1.0f};
        store_rows(dqkv + (size_t)b * T * QKV + (NH + kvh) * HD, QKV, dk, key_g, T, dk_scale, lane);
        store_rows(dqkv + (size_t)b * T * QKV + (NH + NKV + kvh) * HD, QKV, dv, key_g, T, dv_scale, lane);
    }
}

// dQ of a block of 16 * WARPS queries of one head
template <int HD, int WARPS>
__global__ void __launch_bounds__(32 * WARPS)
attention_backward_dq_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* delta,
                             int T, int NH, int NKV, float scale_log2, float scale) {
    constexpr int THREADS = 32 * WARPS, BQ = 16 * WARPS, BK = kBlockK, S = HD + kPad;
    bf16* q_s = reinterpret_cast<bf16*>(attention_smem); // [BQ][S]
    bf16* do_s = q_s + BQ * S;                            // [BQ][S]
    bf16* k_s = do_s + BQ * S;                            // [2][BK][S]
    bf16* v_s = k_s + 2 * BK * S;                         // [2][BK][S]

    int b = blockIdx.x / NH, h = blockIdx.x % NH, kvh = h / (NH / NKV);
    int q0 = (gridDim.y - 1 - blockIdx.y) * BQ; // the longest rows first
    int QKV = (NH + 2 * NKV) * HD, D = NH * HD;
    const bf16* seq = qkv + (size_t)b * T * QKV;
    const bf16* k_g = seq + (NH + kvh) * HD;
    const bf16* v_g = seq + (NH + NKV + kvh) * HD;
    int n_kblocks = (min(T, q0 + BQ) + BK - 1) / BK;

    load_tile<BQ, HD, THREADS>(q_s, seq + h * HD, q0, T, QKV);
    load_tile<BQ, HD, THREADS>(do_s, dout + (size_t)b * T * D + h * HD, q0, T, D);
    load_tile<BK, HD, THREADS>(k_s, k_g, 0, T, QKV);
    load_tile<BK, HD, THREADS>(v_s, v_g, 0, T, QKV);
    cp_async_commit();

    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int qw = q0 + 16 * warp;
    int row_g = qw + lane / 4; // the lane's queries: row_g and row_g + 8
    bool warp_has_rows = qw < T;
    float row_lse[2], row_delta[2]; // lse in base 2; rows past T get 0 (their dS is never stored)
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = row_g + 8 * r;
        size_t i = ((size_t)b * NH + h) * T + row;
        row_lse[r] = row < T ? lse[i] * kLog2e : 0.0f;
        row_delta[r] = row < T ? delta[i] : 0.0f;
    }

    float dq[HD / 8][4] = {};
    for (int j = 0; j < n_kblocks; j++) {
        int buf = j % 2, key0 = j * BK;
        if (j + 1 < n_kblocks) {
            load_tile<BK, HD, THREADS>(k_s + (buf ^ 1) * BK * S, k_g, key0 + BK, T, QKV);
            load_tile<BK, HD, THREADS>(v_s + (buf ^ 1) * BK * S, v_g, key0 + BK, T, QKV);
        }
        cp_async_commit();
        cp_async_wait<1>(); // block j is in
        __syncthreads();
        if (warp_has_rows && key0 <= qw + 15) {
            const bf16* kb = k_s + buf * BK * S;
            uint32_t a[HD / 16][4];
            float s[BK / 8][4] = {}, dp[BK / 8][4] = {};
            load_a_frags(a, q_s + 16 * warp * S, S, lane);
            warp_mma_abt(s, a, kb, S, lane);                // S = Q K^T
            load_a_frags(a, do_s + 16 * warp * S, S, lane);
            warp_mma_abt(dp, a, v_s + buf * BK * S, S, lane); // dP = dO V^T
            mask_future_keys(s, key0, qw, row_g, lane);
            #pragma unroll
            for (int n = 0; n < BK / 8; n++) {
                #pragma unroll
                for (int e = 0; e < 4; e++) { // dS
                    int r = e / 2;
                    s[n][e] = exp2_ftz(fmaf(s[n][e], scale_log2, -row_lse[r])) * (dp[n][e] - row_delta[r]);
                }
            }
            warp_mma_pb(dq, s, kb, S, lane); // dQ += dS K
        }
        __syncthreads(); // everyone is done with buffer `buf` before it is refilled
    }

    if (warp_has_rows) {
        const float dq_scale[2] = {scale, scale};
        store_rows(dqkv + (size_t)b * T * QKV + h * HD, QKV, dq, row_g, T, dq_scale, lane);
    }
}

// ----------------------------------------------------------------------------
// launchers

template <int HD, int WARPS>
static void attention_forward_mma(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int NKV) {
    constexpr int BQ = 16 * WARPS;
    size_t smem = (size_t)(BQ + 4 * kBlockK) * (HD + kPad) * sizeof(bf16);
    allow_smem(attention_forward_kernel<HD, WARPS>, smem);
    dim3 grid(B * NH, ceil_div(T, BQ));
    attention_forward_kernel<HD, WARPS><<<grid, 32 * WARPS, smem, main_stream>>>(out, lse, qkv, T, NH, NKV,
                                                                                 kLog2e / sqrtf((float)HD));
    cudaCheck(cudaGetLastError());
}

template <int HD, int WARPS>
static void attention_backward_dkdv_mma(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                                        const float* delta, int B, int T, int NH, int NKV) {
    constexpr int BK = 16 * WARPS, BQ = dkv_block_q<HD>();
    size_t smem = (size_t)(2 * BK + 4 * BQ) * (HD + kPad) * sizeof(bf16) + 4 * BQ * sizeof(float);
    allow_smem(attention_backward_dkdv_kernel<HD, WARPS>, smem);
    dim3 grid(B * NKV, ceil_div(T, BK));
    float scale = 1.0f / sqrtf((float)HD);
    attention_backward_dkdv_kernel<HD, WARPS><<<grid, 32 * WARPS, smem, main_stream>>>(
        dqkv, dout, qkv, lse, delta, T, NH, NKV, scale * kLog2e, scale);
    cudaCheck(cudaGetLastError());
}

template <int HD, int WARPS>
static void attention_backward_dq_mma(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                                      const float* delta, int B, int T, int NH, int NKV) {
    constexpr int BQ = 16 * WARPS;
    size_t smem = (size_t)(2 * BQ + 4 * kBlockK) * (HD + kPad) * sizeof(bf16);
    allow_smem(attention_backward_dq_kernel<HD, WARPS>, smem);
    dim3 grid(B * NH, ceil_div(T, BQ));
    float scale = 1.0f / sqrtf((float)HD);
    attention_backward_dq_kernel<HD, WARPS><<<grid, 32 * WARPS, smem, main_stream>>>(
        dqkv, dout, qkv, lse, delta, T, NH, NKV, scale * kLog2e, scale);
    cudaCheck(cudaGetLastError());
}

} // namespace attention_detail

#endif // LLMC_CUDA_ATTENTION_MMA_CUH
