/*
 Causal grouped-query attention on the GPU, flash-attention style: bf16 in and
 out, fp32 accumulation, nothing of size T x T ever in memory.

 Math, per sequence b, query head h (key/value head kvh = h / (NH/NKV)), query
 row t, keys j <= t, scale c = 1/sqrt(hd):
     s_tj = c q_t.k_j            p_tj = exp(s_tj - lse_t),  lse_t = log sum_j exp(s_tj)
     out_t = sum_j p_tj v_j
 backward, with dp_tj = dout_t.v_j and delta_t = dout_t.out_t (= sum_j p_tj dp_tj):
     ds_tj = p_tj (dp_tj - delta_t)
     dq_t = c sum_j ds_tj k_j     dk_j = c sum_{h in group, t >= j} ds_tj q_t     dv_j = sum_{h, t} p_tj dout_t
 The kernels work with scores in base 2: p = exp2(q.k c log2(e) - m), in the
 tensor-core paths one FMA and one ex2.approx.ftz per score (exp2f is
 ex2.approx.f32, whose subnormal handling costs extra instructions around the
 multi-function unit's), with the running max m kept in raw score units.
 Masks are written as scores of -inf (2^-inf = 0), and only on the blocks
 that cross the diagonal or the end: a data-dependent "masked ? 0 : exp2f(..)"
 became a branch around each exp2 and its shared memory loads, and cost the
 backward kernels half their time.

 The backward is deterministic (no atomics, every sum in a fixed order), so
 dK, dV and dQ come from two separate passes over the score matrix: one with
 keys outside and queries inside, one the other way round. Both recompute S
 and dP: 7 matrix products instead of the 5 of an atomic dQ, the price of
 bit-identical results.

 Three paths, picked per call:
 1. wgmma (Hopper, sm_90a; hd 64 and 128, 16-byte aligned pointers). A
    warpgroup (4 warps) owns 64 rows of a tile and multiplies with
    wgmma.mma_async m64nNk16: operands that are tiles of Q, K, V or dO are read
    by the tensor cores straight from shared memory through a descriptor,
    P and dS come from registers (the fp32 accumulators of the product before,
    rounded to bf16, are exactly the A fragments), accumulators stay in
    registers. The products are asynchronous: a warpgroup issues them, works
    on something else, and waits (wgmma.wait_group) where it needs the result.
    Tiles arrive by cp.async in the 128-byte swizzled layout the tensor cores
    read: R rows x hd columns are hd/64 panels of R rows x 128 bytes, and the
    16-byte piece c of row r of a panel sits at piece c ^ (r % 8). One tile is
    both a K-major operand (its rows are M or N: K in S = Q K^T) and an
    MN-major one (its rows are the reduction: K in dQ = dS K).
    Every warpgroup of a CTA walks all the CTA's blocks, masking those past
    its own rows: ptxas keeps the products asynchronous only where they are
    issued and waited for under uniform control flow (otherwise it serializes
    them, warning C7518). Loads run STAGES - 1 steps ahead of their use, and
    one barrier per step hands the buffers over.
    - forward: a CTA of NWG warpgroups per (b, h, block of 64 NWG queries),
      sharing key/value tiles of BK rows. In step j a warpgroup issues
      S_j = Q K_j^T and then O += P_{j-1} V_{j-1}, waits for S_j only, runs
      the online softmax of S_j while the tensor cores do P_{j-1} V_{j-1}, then
      waits for that and rescales O (FlashAttention-3's pipelining within a
      warpgroup).
    - backward, two launches:
      1. dQ (and delta): a CTA of NWG warpgroups per (b, h, block of 64 NWG
         queries); first delta_t = dout_t.out_t of its queries, written to the
         scratch for launch 2; then step j issues S_j = Q K_j^T and
         dP_j = dO V_j^T, then dQ += dS_{j-1} K_{j-1}, and computes dS_j while
         the latter runs;
      2. dK, dV: a CTA of NWG warpgroups per (b, kv head, block of 64 NWG
         keys), over the query heads of the group and the query tiles of BQ
         from the diagonal on: S^T = K Q^T and dP^T = V dO^T; P^T, then
         dV += P^T dO runs while dS^T = P^T (dP^T - delta) is computed; then
         dK += dS^T Q. dK and dV stay in registers to the end.
 2. mma.sync (sm_80 on; other GPUs, and the same shapes): a warp owns 16 rows
    of a CTA's tile and computes with mma.sync m16n8k16, operands read from
    shared memory with ldmatrix; tiles arrive by cp.async into a second buffer
    while the first one is used; shared rows are padded by 16 bytes so the 8
    rows of an ldmatrix fall in different banks; rows past T are loaded as
    zeros and masked.
    - forward: a CTA per (b, h, block of 16 * warps queries), heaviest blocks
      first. Each warp keeps its 16 queries in registers, walks the key/value
      blocks of 64 keys up to the diagonal (a warp stops at its own last key),
      and keeps the online softmax (running max and sum per row) in fp32; P
      goes from the accumulators of S = QK^T straight into the A operand of
      O += PV.
    - backward in three launches: delta_t into scratch; dK, dV (a CTA per
      (b, kv head, block of 16 * warps keys), each warp accumulating its 16
      keys' dK, dV in registers over the heads of the group and the query tiles
      from the diagonal on); dQ (a CTA per (b, h, block of 16 * warps
      queries), walking the key blocks like the forward).
 3. generic (any hd up to 128, other alignments): one warp per row, the same
    math in fp32 with the same fixed orders.

 Scratch of the backward: B*T*NH floats (delta).
*/
#ifndef LLMC_CUDA_ATTENTION_CUH
#define LLMC_CUDA_ATTENTION_CUH

#include <math.h>
#include <stdint.h>
#include "llmc/cuda_common.cuh"

namespace attention_detail {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kGenericWarps = 8; // the generic path and delta: a warp per row

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

// ----------------------------------------------------------------------------
// PTX wrappers: ldmatrix, mma.sync, wgmma (cp.async: llmc/cuda_common.cuh)

// four 8x8 bf16 matrices; lane i gives the address of row i % 8 of matrix i / 8
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_address(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_address(p)));
}

// c[16x8] += a[16x16] b[16x8]. Lane l (g = l/4, i = l%4) holds a: rows g, g+8 x
// cols 2i, 2i+1, 2i+8, 2i+9; b: rows 2i, 2i+1, 2i+8, 2i+9 x col g; c: rows g, g+8
// x cols 2i, 2i+1 (c[0], c[1] in row g, c[2], c[3] in row g+8)
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// two floats as bf16x2, lo in the low half (the lower column of a fragment)
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// Causal mask of a score block in the accumulator layout above (s[n][e]: row
// row_g + 8(e/2), key key0 + 8n + 2(lane%4) + e%2): keys after their query get
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

// wgmma (sm_90a), issued by the 4 warps of a warpgroup together:
// D[64 x N] (+)= A[64 x 16] B[16 x N]. Accumulators in the layout of mma.sync's,
// warp w of the warpgroup holding rows 16w..16w+15: d[n][e] is row
// 16w + lane/4 + 8(e/2), column 8n + 2(lane%4) + e%2. `accumulate` 0 starts
// from zero. wgmma_abt: A and B K-major in shared memory (D = A B^T of two
// row-major tiles); wgmma_pb: A from registers in mma.sync's A layout (per warp
// its 16 rows), B MN-major in shared memory (D += P B of a row-major tile B).

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

// waits until at most N of the warpgroup's committed groups of products are unfinished
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}

// an empty asm that reads and writes the registers: the compiler keeps their
// accesses on the same side of it as in the source (after a wait, say)
template <int NT>
__device__ __forceinline__ void fence_regs(float (&x)[NT][4]) {
    #pragma unroll
    for (int n = 0; n < NT; n++) {
        asm volatile("" : "+f"(x[n][0]), "+f"(x[n][1]), "+f"(x[n][2]), "+f"(x[n][3]) :: "memory");
    }
}

template <int NT>
__device__ __forceinline__ void fence_regs(uint32_t (&x)[NT][4]) {
    #pragma unroll
    for (int n = 0; n < NT; n++) {
        asm volatile("" : "+r"(x[n][0]), "+r"(x[n][1]), "+r"(x[n][2]), "+r"(x[n][3]) :: "memory");
    }
}

// 2^x with the multi-function unit alone (subnormal results flush to 0); 2^-inf = 0
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// makes this thread's cp.async writes to shared memory visible to the tensor cores (the async proxy)
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// shared memory descriptor of a 128-byte-swizzled operand: start address,
// leading byte offset, stride byte offset 1024 (from one 8-row group to the next)
__device__ __forceinline__ uint64_t smem_desc(uint32_t address, uint32_t leading_bytes) {
    return (uint64_t)((address & 0x3FFFF) >> 4) | (uint64_t)(leading_bytes >> 4) << 16 | (uint64_t)(1024 >> 4) << 32 |
           1ull << 62;
}

#define WGMMA_REGS32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WGMMA_REGS64 WGMMA_REGS32 ", " \
                     "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
                     "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WGMMA_D(n) "+f"(d[n][0]), "+f"(d[n][1]), "+f"(d[n][2]), "+f"(d[n][3])
#define WGMMA_D8 WGMMA_D(0), WGMMA_D(1), WGMMA_D(2), WGMMA_D(3), WGMMA_D(4), WGMMA_D(5), WGMMA_D(6), WGMMA_D(7)
#define WGMMA_D16 WGMMA_D8, WGMMA_D(8), WGMMA_D(9), WGMMA_D(10), WGMMA_D(11), WGMMA_D(12), WGMMA_D(13), \
                  WGMMA_D(14), WGMMA_D(15)

__device__ __forceinline__ void wgmma_abt(float (&d)[8][4], uint64_t a, uint64_t b, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" WGMMA_REGS32 "}, "
                 "%32, %33, p, 1, 1, 0, 0;\n}\n"
                 : WGMMA_D8 : "l"(a), "l"(b), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_abt(float (&d)[16][4], uint64_t a, uint64_t b, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WGMMA_REGS64 "}, "
                 "%64, %65, p, 1, 1, 0, 0;\n}\n"
                 : WGMMA_D16 : "l"(a), "l"(b), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_pb(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" WGMMA_REGS32 "}, "
                 "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : WGMMA_D8 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_pb(float (&d)[16][4], const uint32_t (&a)[4], uint64_t b, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WGMMA_REGS64 "}, "
                 "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : WGMMA_D16 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

#undef WGMMA_REGS32
#undef WGMMA_REGS64
#undef WGMMA_D
#undef WGMMA_D8
#undef WGMMA_D16

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

// ----------------------------------------------------------------------------
// the mma.sync path: forward

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
// the mma.sync path: backward (delta also serves the generic path)

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
// the wgmma path (sm_90a): the kernels' bodies exist only in the sm_90a build

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
    return smem_desc(smem_address(tile) + (ks / 4) * ROWS * 128 + row0 * 128 + (ks % 4) * 32, 16);
}

// a swizzled tile of ROWS rows as an MN-major B operand: rows 16ks..16ks+15
// are the reduction, all columns are N (panels ROWS * 128 bytes apart)
template <int ROWS>
__device__ __forceinline__ uint64_t desc_mn_major(const bf16* tile, int ks) {
    return smem_desc(smem_address(tile) + ks * 2048, ROWS * 128);
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
// the generic path: any hd up to 128, a warp per row, lane i holding elements
// i, i+32, i+64, i+96 of each head vector

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

// ----------------------------------------------------------------------------
// launchers

static inline void check_attention_shape(int NH, int NKV, int hd) {
    if (NKV < 1 || NH % NKV != 0) { fatal("attention: %d query heads are not a multiple of %d kv heads", NH, NKV); }
    if (hd < 1 || hd > 32 * kGenericSlots) { fatal("attention: head size %d, the CUDA kernels take 1 to 128", hd); }
}

static inline bool aligned16(const void* p) { return ((uintptr_t)p & 15) == 0; }

enum Path { kGenericPath, kMmaPath, kWgmmaPath };

// whether the current device runs the sm_90a code (compute capability 9.x: H100, H200)
static inline bool device_has_wgmma() {
    static int major = -1; // a process drives one device
    if (major < 0) {
        int device;
        cudaCheck(cudaGetDevice(&device));
        cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    }
    return major == 9;
}

// the tensor-core kernels read 16-byte pieces of head vectors
template <typename... Ptrs>
static inline Path attention_path(int hd, const Ptrs*... ptrs) {
    if ((hd != 64 && hd != 128) || !(aligned16(ptrs) && ...)) { return kGenericPath; }
    return device_has_wgmma() ? kWgmmaPath : kMmaPath;
}

// past 48 KiB, dynamic shared memory needs an opt-in per kernel
template <typename Kernel>
static void allow_smem(Kernel kernel, size_t smem) {
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
}

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

// delta = rowsum(dout * out) into delta [B, NH, T]
static void attention_delta(float* delta, const bf16* dout, const bf16* out, int B, int T, int NH, int hd) {
    int rows = B * T * NH;
    attention_delta_kernel<<<ceil_div(rows, kGenericWarps), 32 * kGenericWarps, 0, main_stream>>>(
        delta, dout, out, B * T, T, NH, hd);
    cudaCheck(cudaGetLastError());
}

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

template <int HD>
static void attention_forward_fast(Path path, bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int NKV) {
    using Tiles = WgmmaTiles<HD>;
    if (path == kWgmmaPath) {
        attention_forward_wgmma<HD, Tiles::kFwdBlockK, Tiles::kFwdWarpgroups, Tiles::kFwdStages>(out, lse, qkv, B, T,
                                                                                              NH, NKV);
    } else {
        attention_forward_mma<HD, kFwdWarps>(out, lse, qkv, B, T, NH, NKV);
    }
}

template <int HD>
static void attention_backward_fast(Path path, bf16* dqkv, float* delta, const bf16* dout, const bf16* out,
                                    const bf16* qkv, const float* lse, int B, int T, int NH, int NKV) {
    using Tiles = WgmmaTiles<HD>;
    if (path == kWgmmaPath) { // dQ first: it writes delta
        attention_backward_dq_wgmma<HD, Tiles::kDqBlockK, Tiles::kDqWarpgroups, Tiles::kDqStages>(
            dqkv, delta, dout, out, qkv, lse, B, T, NH, NKV);
        attention_backward_dkdv_wgmma<HD, Tiles::kDkvBlockQ, Tiles::kDkvWarpgroups, Tiles::kDkvStages>(
            dqkv, dout, qkv, lse, delta, B, T, NH, NKV);
    } else {
        attention_delta(delta, dout, out, B, T, NH, HD);
        attention_backward_dkdv_mma<HD, kDkvWarps>(dqkv, dout, qkv, lse, delta, B, T, NH, NKV);
        attention_backward_dq_mma<HD, kDqWarps>(dqkv, dout, qkv, lse, delta, B, T, NH, NKV);
    }
}

// the two entry points on a given path (the test runs each path)
static void attention_forward_on(Path path, bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int NKV,
                                 int hd) {
    check_attention_shape(NH, NKV, hd);
    if (B == 0 || T == 0) { return; }
    if (path == kGenericPath) {
        int rows = B * NH * T;
        attention_forward_generic_kernel<<<ceil_div(rows, kGenericWarps), 32 * kGenericWarps, 0, main_stream>>>(
            out, lse, qkv, B, T, NH, NKV, hd, kLog2e / sqrtf((float)hd));
        cudaCheck(cudaGetLastError());
    } else if (hd == 64) {
        attention_forward_fast<64>(path, out, lse, qkv, B, T, NH, NKV);
    } else {
        attention_forward_fast<128>(path, out, lse, qkv, B, T, NH, NKV);
    }
}

static void attention_backward_on(Path path, bf16* dqkv, float* scratch, const bf16* dout, const bf16* out,
                                  const bf16* qkv, const float* lse, int B, int T, int NH, int NKV, int hd) {
    check_attention_shape(NH, NKV, hd);
    if (B == 0 || T == 0) { return; }
    float* delta = scratch;
    if (path == kGenericPath) {
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
    } else if (hd == 64) {
        attention_backward_fast<64>(path, dqkv, delta, dout, out, qkv, lse, B, T, NH, NKV);
    } else {
        attention_backward_fast<128>(path, dqkv, delta, dout, out, qkv, lse, B, T, NH, NKV);
    }
}

} // namespace attention_detail

// ----------------------------------------------------------------------------
// the overloads gpt.h calls (see the CPU templates in llmc/cpu_ops.h)

// qkv [B, T, (NH + 2 NKV) hd] after RoPE -> out [B, T, NH hd], lse [B, NH, T]
void attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int NKV, int hd) {
    using namespace attention_detail;
    attention_forward_on(attention_path(hd, out, qkv), out, lse, qkv, B, T, NH, NKV, hd);
}

// dqkv (overwritten) from dout; scratch holds B*T*NH floats
void attention_backward(bf16* dqkv, float* scratch, const bf16* dout, const bf16* out, const bf16* qkv,
                        const float* lse, int B, int T, int NH, int NKV, int hd) {
    using namespace attention_detail;
    attention_backward_on(attention_path(hd, dqkv, dout, out, qkv), dqkv, scratch, dout, out, qkv, lse, B, T, NH,
                          NKV, hd);
}

#endif // LLMC_CUDA_ATTENTION_CUH
