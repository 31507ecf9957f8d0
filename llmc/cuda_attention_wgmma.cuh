/*
 The wgmma path of causal attention (Hopper, sm_90a; llmc/cuda_attention.cuh
 has the math): hd 64 and 128, 16-byte aligned pointers. A warpgroup (4 warps)
 owns 64 rows of a tile and multiplies with wgmma.mma_async m64nNk16
 (llmc/cuda_hopper.cuh): operands that are tiles of Q, K, V or dO are read by
 the tensor cores straight from shared memory through a descriptor, P and dS
 come from registers (the fp32 accumulators of the product before, rounded to
 bf16, are exactly the A fragments), accumulators stay in registers. The
 products are asynchronous: a warpgroup issues them, works on something else,
 and waits (wgmma.wait_group) where it needs the result. Tiles arrive by
 cp.async in the 128-byte swizzled layout the tensor cores read: R rows x hd
 columns are hd/64 panels of R rows x 128 bytes, and the 16-byte piece c of row
 r of a panel sits at piece c ^ (r % 8). One tile is both a K-major operand
 (its rows are M or N: K in S = Q K^T) and an MN-major one (its rows are the
 reduction: K in dQ = dS K).

 Every warpgroup of a CTA walks all the CTA's blocks, masking those past its
 own rows: ptxas keeps the products asynchronous only where they are issued
 and waited for under uniform control flow (otherwise it serializes them,
 warning C7518). Loads run STAGES - 1 steps ahead of their use, and one
 barrier per step hands the buffers over.
 - forward: a CTA of NWG warpgroups per (b, h, block of 64 NWG queries),
   sharing key/value tiles of BK rows. In step j a warpgroup issues
   S_j = Q K_j^T and then O += P_{j-1} V_{j-1}, waits for S_j only, runs the
   online softmax of S_j while the tensor cores do P_{j-1} V_{j-1}, then waits
   for that and rescales O (FlashAttention-3's pipelining within a warpgroup).
 - backward, two launches:
   1. dQ (and delta): a CTA of NWG warpgroups per (b, h, block of 64 NWG
      queries); first delta_t = dout_t.out_t of its queries, written to the
      scratch for launch 2; then step j issues S_j = Q K_j^T and
      dP_j = dO V_j^T, then dQ += dS_{j-1} K_{j-1}, and computes dS_j while the
      latter runs;
   2. dK, dV: a CTA of NWG warpgroups per (b, kv head, block of 64 NWG keys),
      over the query heads of the group and the query tiles of BQ from the
      diagonal on: S^T = K Q^T and dP^T = V dO^T; P^T, then dV += P^T dO runs
      while dS^T = P^T (dP^T - delta) is computed; then dK += dS^T Q. dK and dV
      stay in registers to the end.
 The kernels' bodies exist only in the sm_90a build.
*/
#ifndef LLMC_CUDA_ATTENTION_WGMMA_CUH
#define LLMC_CUDA_ATTENTION_WGMMA_CUH

#include "llmc/cuda_attention_common.cuh"
#include "llmc/cuda_hopper.cuh"

namespace attention_detail {

// wgmma path: tile shapes per head size (warpgroups per CTA, keys or queries
// per shared tile, shared buffers per loaded tile: loads run STAGES - 1 steps
// ahead); templates, so the benchmark can time other choices
template <int HD> struct WgmmaTiles;
template <> struct WgmmaTiles<64> {
    static constexpr int kFwdWarpgroups = 2, kFwdBlockK = 64, kFwdStages = 3;  // 128 queries x 64 keys
    static constexpr int kDqWarpgroups = 2, kDqBlockK = 128, kDqStages = 2;    // 128 queries x 128 keys
    static constexpr int kDkvWarpgroups = 1, kDkvBlockQ = 128, kDkvStages = 2; // 64 keys x 128 queries
};
template <> struct WgmmaTiles<128> {
    static constexpr int kFwdWarpgroups = 2, kFwdBlockK = 128, kFwdStages = 2;
    static constexpr int kDqWarpgroups = 2, kDqBlockK = 64, kDqStages = 2;
    static constexpr int kDkvWarpgroups = 1, kDkvBlockQ = 64, kDkvStages = 2;
};

// the dynamic shared memory, from its first 1024-byte boundary on (the
// swizzle pattern repeats every 8 rows of 128 bytes; the launchers ask 1 KiB more)
__device__ __forceinline__ bf16* aligned_smem() {
    return reinterpret_cast<bf16*>(attention_smem + ((1024 - (smem_address(attention_smem) & 1023)) & 1023));
}

// cp.async of rows row0.. row0+ROWS-1 (HD bf16 each, `stride` apart in global
// memory) into a swizzled tile (see the top of the file); rows at or past T
// become zeros
template <int ROWS, int HD, int THREADS>
__device__ __forceinline__ void load_tile_swizzled(bf16* tile, const bf16* src, int row0, int T, int stride) {
    constexpr int CHUNKS = HD / 8; // 16-byte pieces per row
    #pragma unroll
    for (int i = 0; i < (ROWS * CHUNKS + THREADS - 1) / THREADS; i++) {
        int c = threadIdx.x + i * THREADS, r = c / CHUNKS, piece = c % CHUNKS, row = row0 + r;
        if (ROWS * CHUNKS % THREADS != 0 && c >= ROWS * CHUNKS) { break; }
        bool valid = row < T;
        bf16* dst = tile + (piece / 8) * ROWS * 64 + r * 64 + ((piece % 8) ^ (r % 8)) * 8;
        cp_async_16(dst, src + (size_t)(valid ? row : 0) * stride + piece * 8, valid);
    }
}

// a swizzled tile of ROWS rows as a K-major operand: rows row0.. (64 of them
// for A, all for B) x columns 16ks..16ks+15
template <int ROWS>
__device__ __forceinline__ uint64_t desc_k_major(const bf16* tile, int row0, int ks) {
    return wgmma_desc(smem_address(tile) + (ks / 4) * ROWS * 128 + row0 * 128 + (ks % 4) * 32, 16);
}

// a swizzled tile of ROWS rows as an MN-major B operand: rows 16ks..16ks+15
// are the reduction, all columns are N (panels ROWS * 128 bytes apart)
template <int ROWS>
__device__ __forceinline__ uint64_t desc_mn_major(const bf16* tile, int ks) {
    return wgmma_desc(smem_address(tile) + ks * 2048, ROWS * 128);
}

// the A fragments of P (or dS) from accumulators in the layout of a product
// before: k-step ks is the accumulator tiles 2ks and 2ks+1, rounded to bf16
template <int NT>
__device__ __forceinline__ void pack_a_frags(uint32_t (&a)[NT / 2][4], const float (&p)[NT][4]) {
    #pragma unroll
    for (int ks = 0; ks < NT / 2; ks++) {
        a[ks][0] = pack_bf16(p[2 * ks][0], p[2 * ks][1]);
        a[ks][1] = pack_bf16(p[2 * ks][2], p[2 * ks][3]);
        a[ks][2] = pack_bf16(p[2 * ks + 1][0], p[2 * ks + 1][1]);
        a[ks][3] = pack_bf16(p[2 * ks + 1][2], p[2 * ks + 1][3]);
    }
}

template <int HD, int BK, int NWG, int STAGES>
__global__ void __launch_bounds__(128 * NWG, 1)
attention_forward_wgmma_kernel(bf16* out, float* lse, const bf16* qkv, int T, int NH, int NKV, float scale_log2) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    constexpr int THREADS = 128 * NWG, BQ = 64 * NWG;
    bf16* q_s = aligned_smem();         // [BQ][HD]
    bf16* k_s = q_s + BQ * HD;          // [STAGES][BK][HD]
    bf16* v_s = k_s + STAGES * BK * HD; // [STAGES][BK][HD]

    int b = blockIdx.x / NH, h = blockIdx.x % NH, kvh = h / (NH / NKV);
    int q0 = (gridDim.y - 1 - blockIdx.y) * BQ; // the longest rows first
    int QKV = (NH + 2 * NKV) * HD;
    const bf16* seq = qkv + (size_t)b * T * QKV;
    const bf16* k_g = seq + (NH + kvh) * HD;
    const bf16* v_g = seq + (NH + NKV + kvh) * HD;
    // every warpgroup walks all the CTA's key blocks (the wgmma pipeline wants
    // uniform control flow): blocks past a warpgroup's last query are fully masked
    int n_blocks = (min(T, q0 + BQ) + BK - 1) / BK;

    int wg = threadIdx.x / 128, warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
    int qw = q0 + 64 * wg + 16 * warp; // the warp's first query
    int row_g = qw + lane / 4;         // the lane's queries: row_g and row_g + 8

    // K_i and V_{i-1} travel together, STAGES - 1 steps ahead of their use
    auto load_kv = [&](int i) {
        if (i < n_blocks) { load_tile_swizzled<BK, HD, THREADS>(k_s + i % STAGES * BK * HD, k_g, i * BK, T, QKV); }
        if (i >= 1 && i - 1 < n_blocks) {
            load_tile_swizzled<BK, HD, THREADS>(v_s + (i - 1) % STAGES * BK * HD, v_g, (i - 1) * BK, T, QKV);
        }
        cp_async_commit();
    };
    load_tile_swizzled<BQ, HD, THREADS>(q_s, seq + h * HD, q0, T, QKV);
    #pragma unroll
    for (int i = 0; i < STAGES - 1; i++) { load_kv(i); }

    // the start of step j: K_j and V_{j-1} are in
    auto next_step = [&](int j) {
        cp_async_wait<STAGES - 2>();
        fence_proxy_async();
        __syncthreads(); // ... and K_{j-1}, V_{j-2} are no one's
        load_kv(j + STAGES - 1);
    };
    float s[BK / 8][4];
    auto issue_s = [&](int j) { // S_j = Q K_j^T
        const bf16* kb = k_s + j % STAGES * BK * HD;
        wgmma_fence();
        #pragma unroll
        for (int ks = 0; ks < HD / 16; ks++) {
            wgmma_abt(s, desc_k_major<BQ>(q_s, 64 * wg, ks), desc_k_major<BK>(kb, 0, ks), ks > 0);
        }
        wgmma_commit();
    };
    float o[HD / 8][4] = {};
    uint32_t p[BK / 16][4]; // P_{j-1} as A fragments
    auto issue_pv = [&](int j) { // O += P_j V_j
        const bf16* vb = v_s + j % STAGES * BK * HD;
        wgmma_fence();
        #pragma unroll
        for (int ks = 0; ks < BK / 16; ks++) { wgmma_pb(o, p[ks], desc_mn_major<BK>(vb, ks), 1); }
        wgmma_commit();
    };
    float row_max[2] = {-INFINITY, -INFINITY}; // running max of the raw scores q.k
    float row_sum[2] = {0.0f, 0.0f};           // this lane's part of sum exp2((score - max) c log2(e))
    float correction[2];
    // S_j to P_j = exp2((S_j - max) c log2(e)), the max and sum updated, O's correction factors
    auto softmax = [&](int j) {
        fence_regs(s);
        int key0 = j * BK;
        mask_future_keys(s, key0, qw, row_g, lane);
        // key 0 is in block 0 of every row, so the max is finite from the first block on
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = row_max[r];
            #pragma unroll
            for (int n = 0; n < BK / 8; n++) { mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1])); }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1)); // the 4 lanes of a row
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
            correction[r] = exp2_ftz((row_max[r] - mx) * scale_log2);
            row_max[r] = mx;
            float max_scaled = mx * scale_log2, sum = 0.0f;
            #pragma unroll
            for (int n = 0; n < BK / 8; n++) {
                s[n][2 * r] = exp2_ftz(fmaf(s[n][2 * r], scale_log2, -max_scaled));
                s[n][2 * r + 1] = exp2_ftz(fmaf(s[n][2 * r + 1], scale_log2, -max_scaled));
                sum += s[n][2 * r] + s[n][2 * r + 1];
            }
            row_sum[r] = row_sum[r] * correction[r] + sum;
        }
    };

    next_step(0);
    issue_s(0);
    wgmma_wait<0>();
    softmax(0);
    pack_a_frags(p, s);
    // step j: S_j and O += P_{j-1} V_{j-1} issued; the softmax of S_j runs while the tensor cores do the latter
    for (int j = 1; j < n_blocks; j++) {
        next_step(j);
        issue_s(j);
        issue_pv(j - 1);
        wgmma_wait<1>(); // S_j
        softmax(j);
        wgmma_wait<0>(); // P_{j-1} V_{j-1}
        fence_regs(o);
        fence_regs(p);
        #pragma unroll
        for (int n = 0; n < HD / 8; n++) {
            o[n][0] *= correction[0];
            o[n][1] *= correction[0];
            o[n][2] *= correction[1];
            o[n][3] *= correction[1];
        }
        pack_a_frags(p, s);
    }
    next_step(n_blocks);
    issue_pv(n_blocks - 1);
    wgmma_wait<0>();
    fence_regs(o);

    if (qw < T) {
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
#endif
}

// dQ of a block of 64 NWG queries of one head, and their delta (into `delta`)
template <int HD, int BK, int NWG, int STAGES>
__global__ void __launch_bounds__(128 * NWG, 1)
attention_backward_dq_wgmma_kernel(bf16* dqkv, float* delta, const bf16* dout, const bf16* out, const bf16* qkv,
                                   const float* lse, int T, int NH, int NKV, float scale_log2, float scale) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    constexpr int THREADS = 128 * NWG, BQ = 64 * NWG;
    bf16* q_s = aligned_smem();                                   // [BQ][HD]
    bf16* do_s = q_s + BQ * HD;                                   // [BQ][HD]
    bf16* k_s = do_s + BQ * HD;                                        // [STAGES + 1][BK][HD]: K_{j-1} too
    bf16* v_s = k_s + (STAGES + 1) * BK * HD;                          // [STAGES][BK][HD]
    float* delta_s = reinterpret_cast<float*>(v_s + STAGES * BK * HD); // [BQ]

    int b = blockIdx.x / NH, h = blockIdx.x % NH, kvh = h / (NH / NKV);
    int q0 = (gridDim.y - 1 - blockIdx.y) * BQ; // the longest rows first
    int QKV = (NH + 2 * NKV) * HD, D = NH * HD;
    const bf16* seq = qkv + (size_t)b * T * QKV;
    const bf16* k_g = seq + (NH + kvh) * HD;
    const bf16* v_g = seq + (NH + NKV + kvh) * HD;
    int n_blocks = (min(T, q0 + BQ) + BK - 1) / BK; // all of them for every warpgroup, as in the forward

    int wg = threadIdx.x / 128, warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
    int qw = q0 + 64 * wg + 16 * warp; // the warp's first query
    int row_g = qw + lane / 4;         // the lane's queries: row_g and row_g + 8

    // K_i and V_i, STAGES - 1 steps ahead of their use
    auto load_kv = [&](int i) {
        if (i < n_blocks) {
            load_tile_swizzled<BK, HD, THREADS>(k_s + i % (STAGES + 1) * BK * HD, k_g, i * BK, T, QKV);
            load_tile_swizzled<BK, HD, THREADS>(v_s + i % STAGES * BK * HD, v_g, i * BK, T, QKV);
        }
        cp_async_commit();
    };
    load_tile_swizzled<BQ, HD, THREADS>(q_s, seq + h * HD, q0, T, QKV);
    load_tile_swizzled<BQ, HD, THREADS>(do_s, dout + (size_t)b * T * D + h * HD, q0, T, D);
    #pragma unroll
    for (int i = 0; i < STAGES - 1; i++) { load_kv(i); }

    // delta of the CTA's queries, two threads a query (THREADS = 2 BQ), each
    // summing half of the head vector; rows past T get 0
    {
        int i = threadIdx.x / 2, half = threadIdx.x % 2, t = q0 + i;
        float sum = 0.0f;
        if (t < T) {
            size_t offset = ((size_t)b * T + t) * D + h * HD + half * (HD / 2);
            #pragma unroll
            for (int c = 0; c < HD / 16; c++) {
                Bf16x8 x = load_bf16x8(dout + offset + 8 * c), y = load_bf16x8(out + offset + 8 * c);
                #pragma unroll
                for (int e = 0; e < 8; e++) { sum += __bfloat162float(x.v[e]) * __bfloat162float(y.v[e]); }
            }
        }
        sum += __shfl_xor_sync(0xffffffff, sum, 1);
        if (half == 0) {
            delta_s[i] = sum;
            if (t < T) { delta[((size_t)b * NH + h) * T + t] = sum; }
        }
    }
    __syncthreads();
    float row_lse[2], row_delta[2]; // lse in base 2; rows past T get 0 (their dS is never stored)
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = row_g + 8 * r;
        row_lse[r] = row < T ? lse[((size_t)b * NH + h) * T + row] * kLog2e : 0.0f;
        row_delta[r] = delta_s[row - q0];
    }

    // the start of step j: K_j and V_j are in
    auto next_step = [&](int j) {
        cp_async_wait<STAGES - 2>();
        fence_proxy_async();
        __syncthreads(); // ... and K_{j-2}, V_{j-1} are no one's
        load_kv(j + STAGES - 1);
    };
    float s[BK / 8][4], dp[BK / 8][4];
    auto issue_s_dp = [&](int j) { // S_j = Q K_j^T, dP_j = dO V_j^T
        const bf16* kb = k_s + j % (STAGES + 1) * BK * HD;
        const bf16* vb = v_s + j % STAGES * BK * HD;
        wgmma_fence();
        #pragma unroll
        for (int ks = 0; ks < HD / 16; ks++) {
            wgmma_abt(s, desc_k_major<BQ>(q_s, 64 * wg, ks), desc_k_major<BK>(kb, 0, ks), ks > 0);
        }
        #pragma unroll
        for (int ks = 0; ks < HD / 16; ks++) {
            wgmma_abt(dp, desc_k_major<BQ>(do_s, 64 * wg, ks), desc_k_major<BK>(vb, 0, ks), ks > 0);
        }
        wgmma_commit();
    };
    float dq[HD / 8][4] = {};
    uint32_t ds[BK / 16][4]; // dS_j as A fragments
    auto issue_dq = [&](int j) { // dQ += dS_j K_j
        const bf16* kb = k_s + j % (STAGES + 1) * BK * HD;
        wgmma_fence();
        #pragma unroll
        for (int ks = 0; ks < BK / 16; ks++) { wgmma_pb(dq, ds[ks], desc_mn_major<BK>(kb, ks), 1); }
        wgmma_commit();
    };
    auto dscores = [&](int j) { // S_j, dP_j to dS_j = P_j (dP_j - delta), in s
        fence_regs(s);
        fence_regs(dp);
        int key0 = j * BK;
        mask_future_keys(s, key0, qw, row_g, lane);
        #pragma unroll
        for (int n = 0; n < BK / 8; n++) {
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = e / 2;
                s[n][e] = exp2_ftz(fmaf(s[n][e], scale_log2, -row_lse[r])) * (dp[n][e] - row_delta[r]);
            }
        }
    };

    next_step(0);
    issue_s_dp(0);
    wgmma_wait<0>();
    dscores(0);
    pack_a_frags(ds, s);
    // step j: S_j, dP_j and dQ += dS_{j-1} K_{j-1} issued; dS_j computed while the tensor cores do the latter
    for (int j = 1; j < n_blocks; j++) {
        next_step(j);
        issue_s_dp(j);
        issue_dq(j - 1);
        wgmma_wait<1>(); // S_j, dP_j
        dscores(j);
        wgmma_wait<0>(); // dS_{j-1} K_{j-1}
        fence_regs(ds);
        pack_a_frags(ds, s);
    }
    next_step(n_blocks);
    issue_dq(n_blocks - 1);
    wgmma_wait<0>();
    fence_regs(dq);

    if (qw < T) {
        const float dq_scale[2] = {scale, scale};
        store_rows(dqkv + (size_t)b * T * QKV + h * HD, QKV, dq, row_g, T, dq_scale, lane);
    }
#endif
}

// dK, dV of a block of 64 NWG keys of one kv head, summed over the query
// heads of its group and all the queries at or after each key
template <int HD, int BQ, int NWG, int STAGES>
__global__ void __launch_bounds__(128 * NWG, NWG > 1 ? 1 : 2)
attention_backward_dkdv_wgmma_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                                     const float* delta, int T, int NH, int NKV, float scale_log2, float scale) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    constexpr int THREADS = 128 * NWG, BK = 64 * NWG;
    bf16* k_s = aligned_smem();                                  // [BK][HD]
    bf16* v_s = k_s + BK * HD;                                   // [BK][HD]
    bf16* q_s = v_s + BK * HD;                                        // [STAGES][BQ][HD]
    bf16* do_s = q_s + STAGES * BQ * HD;                              // [STAGES][BQ][HD]
    float* lse_s = reinterpret_cast<float*>(do_s + STAGES * BQ * HD); // [STAGES][BQ]
    float* delta_s = lse_s + STAGES * BQ;                             // [STAGES][BQ]

    int b = blockIdx.x / NKV, kvh = blockIdx.x % NKV, group = NH / NKV;
    int k0 = blockIdx.y * BK; // blockIdx.y 0, the most queries, goes first
    int QKV = (NH + 2 * NKV) * HD, D = NH * HD;
    const bf16* seq = qkv + (size_t)b * T * QKV;
    const bf16* dout_seq = dout + (size_t)b * T * D;
    // the query tiles that see these keys: from the one holding k0 to the end, for each head of the group
    int first_qtile = k0 / BQ, n_qtiles = (T + BQ - 1) / BQ - first_qtile, n_iters = group * n_qtiles;

    // Q, dO, lse and delta of iteration `it` into buffer it % STAGES, then a commit
    auto load_query_tile = [&](int it) {
        if (it >= n_iters) {
            cp_async_commit();
            return;
        }
        int buf = it % STAGES, h = kvh * group + it / n_qtiles, q_start = (first_qtile + it % n_qtiles) * BQ;
        load_tile_swizzled<BQ, HD, THREADS>(q_s + buf * BQ * HD, seq + h * HD, q_start, T, QKV);
        load_tile_swizzled<BQ, HD, THREADS>(do_s + buf * BQ * HD, dout_seq + h * HD, q_start, T, D);
        const float* lse_row = lse + ((size_t)b * NH + h) * T;
        const float* delta_row = delta + ((size_t)b * NH + h) * T;
        for (int i = threadIdx.x; i < BQ; i += THREADS) {
            int q = q_start + i;
            bool valid = q < T;
            cp_async_4(lse_s + buf * BQ + i, lse_row + (valid ? q : 0), valid);
            cp_async_4(delta_s + buf * BQ + i, delta_row + (valid ? q : 0), valid);
        }
        cp_async_commit();
    };

    load_tile_swizzled<BK, HD, THREADS>(k_s, seq + (NH + kvh) * HD, k0, T, QKV);
    load_tile_swizzled<BK, HD, THREADS>(v_s, seq + (NH + NKV + kvh) * HD, k0, T, QKV);
    #pragma unroll
    for (int i = 0; i < STAGES - 1; i++) { load_query_tile(i); } // STAGES - 1 iterations ahead

    int wg = threadIdx.x / 128, warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
    int kw = k0 + 64 * wg;                 // the warpgroup's first key
    int key_g = kw + 16 * warp + lane / 4; // the lane's keys: key_g and key_g + 8
    float dk[HD / 8][4] = {}, dv[HD / 8][4] = {};
    for (int it = 0; it < n_iters; it++) {
        int buf = it % STAGES;
        load_query_tile(it + STAGES - 1); // into the buffer of iteration it - 1
        cp_async_wait<STAGES - 1>();      // iteration it's tiles (and K, V) are in
        fence_proxy_async();
        __syncthreads();
        int q_start = (first_qtile + it % n_qtiles) * BQ;
        if (kw < T && q_start + BQ - 1 >= kw) {
            const bf16* qb = q_s + buf * BQ * HD;
            const bf16* dob = do_s + buf * BQ * HD;
            const float* lse_b = lse_s + buf * BQ;
            const float* delta_b = delta_s + buf * BQ;
            float s[BQ / 8][4], dp[BQ / 8][4];
            wgmma_fence();
            #pragma unroll
            for (int ks = 0; ks < HD / 16; ks++) { // S^T = K Q^T: rows keys, columns queries
                wgmma_abt(s, desc_k_major<BK>(k_s, 64 * wg, ks), desc_k_major<BQ>(qb, 0, ks), ks > 0);
            }
            #pragma unroll
            for (int ks = 0; ks < HD / 16; ks++) { // dP^T = V dO^T
                wgmma_abt(dp, desc_k_major<BK>(v_s, 64 * wg, ks), desc_k_major<BQ>(dob, 0, ks), ks > 0);
            }
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs(s);
            fence_regs(dp);
            // queries before the key or past the end get P = 2^-inf = 0
            if (q_start < kw + 16 * warp + 15 || q_start + BQ > T) {
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
            for (int n = 0; n < BQ / 8; n++) { // P^T
                float2 l = *reinterpret_cast<const float2*>(lse_b + n * 8 + 2 * (lane % 4));
                float lse0 = l.x * kLog2e, lse1 = l.y * kLog2e;
                #pragma unroll
                for (int e = 0; e < 4; e++) { s[n][e] = exp2_ftz(fmaf(s[n][e], scale_log2, -(e % 2 ? lse1 : lse0))); }
            }
            uint32_t a[BQ / 16][4];
            pack_a_frags(a, s);
            wgmma_fence();
            #pragma unroll
            for (int ks = 0; ks < BQ / 16; ks++) { wgmma_pb(dv, a[ks], desc_mn_major<BQ>(dob, ks), 1); } // dV += P^T dO
            wgmma_commit();
            #pragma unroll
            for (int n = 0; n < BQ / 8; n++) { // dS^T
                float2 d = *reinterpret_cast<const float2*>(delta_b + n * 8 + 2 * (lane % 4));
                #pragma unroll
                for (int e = 0; e < 4; e++) { dp[n][e] = s[n][e] * (dp[n][e] - (e % 2 ? d.y : d.x)); }
            }
            uint32_t a2[BQ / 16][4];
            pack_a_frags(a2, dp);
            wgmma_fence();
            #pragma unroll
            for (int ks = 0; ks < BQ / 16; ks++) { wgmma_pb(dk, a2[ks], desc_mn_major<BQ>(qb, ks), 1); } // dK += dS^T Q
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs(dv);
            fence_regs(dk);
        }
        __syncthreads(); // everyone is done with buffer `buf` before it is refilled
    }

    if (kw < T) {
        const float dk_scale[2] = {scale, scale}, dv_scale[2] = {1.0f, 1.0f};
        store_rows(dqkv + (size_t)b * T * QKV + (NH + kvh) * HD, QKV, dk, key_g, T, dk_scale, lane);
        store_rows(dqkv + (size_t)b * T * QKV + (NH + NKV + kvh) * HD, QKV, dv, key_g, T, dv_scale, lane);
    }
#endif
}

// ----------------------------------------------------------------------------
// launchers

// the wgmma kernels' shared memory: the tiles, and 1 KiB to align them
template <int HD, int BK, int NWG, int STAGES>
static void attention_forward_wgmma(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int NKV) {
    constexpr int BQ = 64 * NWG;
    size_t smem = 1024 + (size_t)(BQ + 2 * STAGES * BK) * HD * sizeof(bf16);
    allow_smem(attention_forward_wgmma_kernel<HD, BK, NWG, STAGES>, smem);
    dim3 grid(B * NH, ceil_div(T, BQ));
    attention_forward_wgmma_kernel<HD, BK, NWG, STAGES><<<grid, 128 * NWG, smem, main_stream>>>(
        out, lse, qkv, T, NH, NKV, kLog2e / sqrtf((float)HD));
    cudaCheck(cudaGetLastError());
}

// dQ, and delta into `delta`
template <int HD, int BK, int NWG, int STAGES>
static void attention_backward_dq_wgmma(bf16* dqkv, float* delta, const bf16* dout, const bf16* out,
                                        const bf16* qkv, const float* lse, int B, int T, int NH, int NKV) {
    constexpr int BQ = 64 * NWG;
    size_t smem = 1024 + (size_t)(2 * BQ + (2 * STAGES + 1) * BK) * HD * sizeof(bf16) + BQ * sizeof(float);
    allow_smem(attention_backward_dq_wgmma_kernel<HD, BK, NWG, STAGES>, smem);
    dim3 grid(B * NH, ceil_div(T, BQ));
    float scale = 1.0f / sqrtf((float)HD);
    attention_backward_dq_wgmma_kernel<HD, BK, NWG, STAGES><<<grid, 128 * NWG, smem, main_stream>>>(
        dqkv, delta, dout, out, qkv, lse, T, NH, NKV, scale * kLog2e, scale);
    cudaCheck(cudaGetLastError());
}

template <int HD, int BQ, int NWG, int STAGES>
static void attention_backward_dkdv_wgmma(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                                          const float* delta, int B, int T, int NH, int NKV) {
    constexpr int BK = 64 * NWG;
    size_t smem = 1024 + (size_t)(2 * BK + 2 * STAGES * BQ) * HD * sizeof(bf16) + 2 * STAGES * BQ * sizeof(float);
    allow_smem(attention_backward_dkdv_wgmma_kernel<HD, BQ, NWG, STAGES>, smem);
    dim3 grid(B * NKV, ceil_div(T, BK));
    float scale = 1.0f / sqrtf((float)HD);
    attention_backward_dkdv_wgmma_kernel<HD, BQ, NWG, STAGES><<<grid, 128 * NWG, smem, main_stream>>>(
        dqkv, dout, qkv, lse, delta, T, NH, NKV, scale * kLog2e, scale);
    cudaCheck(cudaGetLastError());
}

} // namespace attention_detail

#endif // LLMC_CUDA_ATTENTION_WGMMA_CUH
