/*
 The TwELL sparse FFN forward on the GPU, for many token rows at once (prefill).
 The format and the CPU reference are in llmc/ffn/twell.h. Math, for M rows f_m:
     g = f Wg^T                 the one dense product (it decides which units fire),
                                packed to TwELL with relu applied (TW = 256)
     for each row m and each unit n with g_mn > 0:
         u_mn = f_m . Wu[n],    a_mn = g_mn u_mn,    y_m += a_mn WdT[n]
 bf16 operands, fp32 accumulation, bf16 y. h is never a dense tensor. When too
 many units fire for this to pay, twell_ffn_forward runs the dense FFN instead.

 Gate + packing, two ways that write the same words:
 - cuBLASLt writes g [M, H] (bf16), then a warp per (row, tile) packs it (any GPU);
 - fused, wgmma (sm_90a): persistent clusters of two CTAs of three warpgroups:
   one issues TMA loads (128 x 64 of f, and half of 256 x 64 of Wg multicast to
   both CTAs, 128-byte swizzle) into 4 stages, two multiply 64 x 256 each (wgmma
   m64n256k16, 128 fp32 accumulators per thread) and pack from the registers;
   g never reaches memory.
 A block's slots are in increasing column order: each positive's slot is a
 prefix count over the lanes holding the row, not an atomic, so the words do
 not depend on scheduling. Overflow records are numbered by an atomic counter:
 their order may vary, their content does not.

 Up + down, one kernel (the paper's order, a CTA of 4 or 8 warps per row): the
 row's f and blocks into shared memory, its active units listed there with g,
 a warp per unit for u = f_m . Wu[n] and a = bf16(g bf16(u)) (the dense path's
 rounding of u and h), then a thread per 8 columns adds a WdT[n] over the
 units in list order. h lives in shared memory only.

 Its floor (M 16384, D 2048, H 5632, k = 30 active units per row: P = M k =
 0.5 M pairs): each pair needs a D-long dot product (up) and a D-long axpy
 (down) with a weight row that random rows rarely share (a unit fires in ~87
 of 16384 rows), so every useful multiply-add reads one gathered bf16 weight:
 2 P D 2 bytes = 4.1 GB, from L2 (both matrices, 46 MB, mostly stay there),
 whose bandwidth is the floor. A work list that tiled rows x units to gather
 from shared memory instead measured slower at every k: latency-bound
 (dev/NOTES.md has the figures).

 Exactness: a block with more positives than slots is packed as an overflow
 record (the tile's relu(g) row) and the up + down kernel lists its positives,
 so it is computed exactly. When the record buffer is too small, the counter
 says how many records were needed (twell_ffn_status), and the rows concerned
 come out NaN until the caller grows the buffer and runs again. Deterministic:
 the same inputs give the same bits (fixed slot and summation orders, no float
 atomics).

 Requirements of the GPU path: TW = 256, H % 8 == 0, D % 64 == 0, 16-byte
 aligned pointers. No launch function synchronises with the host.
*/
#ifndef LLMC_FFN_CUDA_TWELL_CUH
#define LLMC_FFN_CUDA_TWELL_CUH

#include <limits.h>
#include <stdint.h>
#include "llmc/cuda_common.cuh"
#include "llmc/ffn/cuda_dense.cuh"
#include "llmc/cuda_hopper.cuh"
#include "llmc/cuda_matmul.cuh"
#include "llmc/ffn/policy.h"
#include "llmc/ffn/twell.h"

constexpr int TWELL_D_MULTIPLE = 64;   // D of the GPU path: the wgmma gate's k-block

// counters in device memory, written by the launches, read by twell_ffn_status
enum { TWELL_RECORDS_NEEDED, TWELL_ACTIVE, TWELL_NUM_COUNTERS };

namespace twell_detail {

// ----------------------------------------------------------------------------
// bf16 bits

__device__ __forceinline__ uint32_t bf16_bits(float x) { return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(x)); }
__device__ __forceinline__ float bf16_bits_to_float(uint32_t b) { return __uint_as_float(b << 16); }
__device__ __forceinline__ float bf16_round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// ----------------------------------------------------------------------------
// the baseline packer: a warp per (row, tile) of a bf16 g [M, H]. Lane l holds
// columns 8l..8l+7 of the tile, so the lane order is the column order and a
// warp prefix of the lanes' counts gives each positive its slot.

constexpr int PACK_THREADS = 256;

__global__ void __launch_bounds__(PACK_THREADS)
pack_kernel(uint32_t* words, uint16_t* records, unsigned long long* counters, const bf16* g, int M, int H, int T, int S,
            int record_capacity) {
    long long block_id = (long long)blockIdx.x * (PACK_THREADS / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (block_id >= (long long)M * T) { return; }
    int m = (int)(block_id / T), tile = (int)(block_id % T), col = tile * TWELL_TILE + lane * 8;
    float v[8] = {};
    if (col < H) { // H % 8 == 0: the lane's 8 columns are all in or all out
        Bf16x8 x = load_bf16x8(g + (size_t)m * H + col);
        #pragma unroll
        for (int e = 0; e < 8; e++) { v[e] = __bfloat162float(x.v[e]); }
    }
    uint32_t* block = words + (size_t)block_id * (S + 1);
    unsigned int mask = 0;
    #pragma unroll
    for (int e = 0; e < 8; e++) { mask |= (unsigned int)(v[e] > 0.0f) << e; }
    int count = __popc(mask), inclusive = warp_inclusive_sum(count);
    int total = __shfl_sync(0xffffffffu, inclusive, 31);
    if (lane == 0) { block[0] = (uint32_t)total; }
    if (total <= S) {
        int slot = inclusive - count;
        #pragma unroll
        for (int e = 0; e < 8; e++) {
            if ((mask >> e) & 1) { block[1 + slot++] = twell_entry_word(lane * 8 + e, bf16_bits(v[e])); }
        }
        return;
    }
    unsigned long long r = 0;
    if (lane == 0) { r = atomicAdd(&counters[TWELL_RECORDS_NEEDED], 1ull); }
    r = __shfl_sync(0xffffffffu, r, 0);
    if (lane == 0) { block[1] = r < (unsigned long long)record_capacity ? (uint32_t)r : TWELL_RECORD_LOST; }
    if (r < (unsigned long long)record_capacity) {
        uint32_t relu[8]; // a select, not fmaxf, which may keep a -0 whose bits would read as active
        #pragma unroll
        for (int e = 0; e < 8; e++) { relu[e] = (mask >> e) & 1 ? bf16_bits(v[e]) : 0; }
        *reinterpret_cast<uint4*>(records + (size_t)r * TWELL_TILE + lane * 8) =
            make_uint4(relu[0] | relu[1] << 16, relu[2] | relu[3] << 16, relu[4] | relu[5] << 16, relu[6] | relu[7] << 16);
    }
}

// ----------------------------------------------------------------------------
// fused gate GEMM + packing with wgmma (sm_90a): persistent clusters of two
// CTAs of 3 warpgroups, a cluster per 256 x 256 tile, CTA r taking rows 128 r ..
// 128 r + 127. Warpgroup 0 (one thread) issues TMA loads of the CTA's 128 x 64
// tile of f and of half the 256 x 64 tile of Wg, multicast into both CTAs (so
// the weights leave L2 once per pair: 2 MB of L2 reads per 256 x 256 tile
// instead of 3, which was faster: dev/NOTES.md), 128-byte swizzle, 4 stages,
// each completing on its "full" mbarrier; warpgroups 1 and 2 multiply rows 0-63
// and 64-127 of the CTA tile (wgmma m64n256k16 from shared memory, one k-block
// in flight while the next is issued) and release a stage on the "empty"
// mbarrier of both CTAs (one arrival per consumer warp of each). Then each
// consumer packs its 64 rows: a row's 256 columns sit in one quad, so no
// cross-warp step is needed. Tiles go to clusters round-robin, N fastest, so
// the clusters at work share their f rows and all of Wg stays in L2.

constexpr int WG_BM = 128, WG_BN = 256, WG_BK = TWELL_D_MULTIPLE, WG_STAGES = 4, WG_THREADS = 384;
constexpr int WG_A_BYTES = WG_BM * WG_BK * 2, WG_B_BYTES = WG_BN * WG_BK * 2;
constexpr size_t WG_SMEM = 1024 + (size_t)WG_STAGES * (WG_A_BYTES + WG_B_BYTES) + 2 * WG_STAGES * sizeof(uint64_t);

// The wgmma kernel packs from the registers. Lane (g = lane/4, i = lane%4) of a
// consumer warp holds acc[j][2h + e] = row g + 8h of the warp's 16, column
// 8j + 2i + e: a row's 256 columns sit in one quad. Each lane makes a mask of
// its positives (bit 2j + e), the quad swaps masks, and the count of the quad's
// positives in earlier columns gives each positive its slot.

__device__ __forceinline__ uint64_t positives_mask(const float (&acc)[32][4], int h) {
    uint64_t mask = 0;
    #pragma unroll
    for (int j = 0; j < 32; j++) {
        mask |= (uint64_t)(acc[j][2 * h] > 0.0f) << (2 * j);
        mask |= (uint64_t)(acc[j][2 * h + 1] > 0.0f) << (2 * j + 1);
    }
    return mask;
}

// the masks of the 4 lanes of this lane's quad
__device__ __forceinline__ void quad_masks(uint64_t (&q)[4], uint64_t mine, int lane) {
    #pragma unroll
    for (int k = 0; k < 4; k++) { q[k] = __shfl_sync(0xffffffffu, mine, (lane & ~3) | k); }
}

// Writes this lane's part of row g + 8h of a block: the entries of its
// positives when the row's total fits, else its relu(g) values into the
// overflow record `record` (NULL when lost). Column pairs j where no lane of
// the quad has a positive are skipped: at 99% sparsity nearly all of them.
__device__ __forceinline__ void store_row(uint32_t* block, uint16_t* record, const float (&acc)[32][4], int h,
                                          const uint64_t (&q)[4], int i, int total, int S) {
    if (total <= S) {
        uint64_t mine = i == 0 ? q[0] : i == 1 ? q[1] : i == 2 ? q[2] : q[3];
        uint64_t any = q[0] | q[1] | q[2] | q[3];
        int run = 0; // the row's positives in column pairs before j
        #pragma unroll
        for (int j = 0; j < 32; j++) {
            if (((any >> (2 * j)) & 3) == 0) { continue; }
            int c0 = __popc((uint32_t)(q[0] >> (2 * j)) & 3), c1 = __popc((uint32_t)(q[1] >> (2 * j)) & 3);
            int c2 = __popc((uint32_t)(q[2] >> (2 * j)) & 3), c3 = __popc((uint32_t)(q[3] >> (2 * j)) & 3);
            int slot = run + (i > 0 ? c0 : 0) + (i > 1 ? c1 : 0) + (i > 2 ? c2 : 0);
            uint32_t bitpair = (uint32_t)(mine >> (2 * j)) & 3;
            int col = 8 * j + 2 * i;
            if (bitpair & 1) { block[1 + slot] = twell_entry_word(col, bf16_bits(acc[j][2 * h])); }
            if (bitpair & 2) { block[1 + slot + (bitpair & 1)] = twell_entry_word(col + 1, bf16_bits(acc[j][2 * h + 1])); }
            run += c0 + c1 + c2 + c3;
        }
    } else if (record != NULL) {
        #pragma unroll
        for (int j = 0; j < 32; j++) {
            uint32_t lo = acc[j][2 * h] > 0.0f ? bf16_bits(acc[j][2 * h]) : 0;
            uint32_t hi = acc[j][2 * h + 1] > 0.0f ? bf16_bits(acc[j][2 * h + 1]) : 0;
            *reinterpret_cast<uint32_t*>(record + 8 * j + 2 * i) = lo | hi << 16;
        }
    }
}

__global__ void __launch_bounds__(WG_THREADS, 1)
gate_pack_wgmma_kernel(const __grid_constant__ CUtensorMap map_f, const __grid_constant__ CUtensorMap map_w,
                       uint32_t* words, uint16_t* records, unsigned long long* counters, int M, int D, int T, int S,
                       int record_capacity) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) uint8_t wg_smem_raw[];
    // the swizzle repeats every 1024 bytes: stages start on a 1024-byte boundary
    uint8_t* a_s = wg_smem_raw + ((1024 - (smem_address(wg_smem_raw) & 1023)) & 1023);
    uint8_t* b_s = a_s + WG_STAGES * WG_A_BYTES;
    uint64_t* full = reinterpret_cast<uint64_t*>(b_s + WG_STAGES * WG_B_BYTES);
    uint64_t* empty = full + WG_STAGES;
    const int tid = threadIdx.x, wg = tid / 128;
    const unsigned int rank = cluster_rank(); // rows 128 rank .. of the cluster's 256 x 256 tile
    const int cluster = blockIdx.x / 2, clusters = gridDim.x / 2;
    const int num_tiles = ((M + WG_BM - 1) / WG_BM + 1) / 2 * T, num_kb = D / WG_BK;
    if (tid == 0) {
        for (int s = 0; s < WG_STAGES; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 16); // each consumer warp of both CTAs: the stage's B tile is written into both
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    cluster_sync(); // both CTAs' barriers exist before either multicasts or arrives
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (tid == 0) {
            int it = 0; // k-blocks issued so far: stage it % STAGES, use number it / STAGES of that stage
            for (int tile = cluster; tile < num_tiles; tile += clusters) {
                int tm = 2 * (tile / T) + rank, tn = tile % T;
                for (int kb = 0; kb < num_kb; kb++, it++) {
                    int s = it % WG_STAGES;
                    mbar_wait(&empty[s], ((it / WG_STAGES) & 1) ^ 1); // a fresh barrier passes parity 1
                    mbar_expect_tx(&full[s], WG_A_BYTES + WG_B_BYTES);
                    tma_load_2d(a_s + s * WG_A_BYTES, &map_f, &full[s], kb * WG_BK, tm * WG_BM);
                    // this CTA's half of the weight tile, into both CTAs
                    tma_load_2d_multicast(b_s + s * WG_B_BYTES + rank * (WG_B_BYTES / 2), &map_w, &full[s], kb * WG_BK,
                                          tn * WG_BN + rank * (WG_BN / 2), 0x3);
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
        const int c = wg - 1, warp = (tid / 32) % 4, lane = tid % 32, i = lane % 4;
        int it = 0;
        float acc[32][4];
        auto release = [&](int stage) { // in this CTA and the other, whose producer writes half of it
            if (lane == 0) {
                mbar_arrive(&empty[stage]);
                mbar_arrive_cluster(&empty[stage], rank ^ 1);
            }
        };
        for (int tile = cluster; tile < num_tiles; tile += clusters) {
            int tm = 2 * (tile / T) + rank, tn = tile % T;
            for (int kb = 0; kb < num_kb; kb++, it++) {
                int s = it % WG_STAGES;
                mbar_wait(&full[s], (it / WG_STAGES) & 1);
                wgmma_fence();
                uint32_t a_addr = smem_address(a_s + s * WG_A_BYTES + c * 64 * 128), b_addr = smem_address(b_s + s * WG_B_BYTES);
                #pragma unroll
                for (int ks = 0; ks < WG_BK / 16; ks++) { // K-major operands: a k-step of 16 is 32 bytes further
                    wgmma_abt(acc, wgmma_desc(a_addr + ks * 32, 16), wgmma_desc(b_addr + ks * 32, 16), kb > 0 || ks > 0);
                }
                wgmma_commit();
                if (kb > 0) { // the k-block before this one is done: its stage can be refilled
                    wgmma_wait<1>();
                    release((it - 1) % WG_STAGES);
                }
            }
            wgmma_wait<0>();
            fence_regs(acc);
            release((it - 1) % WG_STAGES);

            #pragma unroll
            for (int h = 0; h < 2; h++) {
                int row = tm * WG_BM + c * 64 + warp * 16 + lane / 4 + 8 * h;
                uint64_t q[4];
                quad_masks(q, positives_mask(acc, h), lane);
                int total = __popcll(q[0]) + __popcll(q[1]) + __popcll(q[2]) + __popcll(q[3]);
                unsigned long long rec = 0;
                if (i == 0 && total > S && row < M) { rec = atomicAdd(&counters[TWELL_RECORDS_NEEDED], 1ull); }
                rec = __shfl_sync(0xffffffffu, rec, lane & ~3);
                if (row >= M) { continue; }
                bool stored = rec < (unsigned long long)record_capacity;
                uint32_t* block = words + ((size_t)row * T + tn) * (S + 1);
                if (i == 0) {
                    block[0] = (uint32_t)total;
                    if (total > S) { block[1] = stored ? (uint32_t)rec : TWELL_RECORD_LOST; }
                }
                uint16_t* record = total > S && stored ? records + (size_t)rec * TWELL_TILE : NULL;
                store_row(block, record, acc, h, q, i, total, S);
            }
        }
    }
    cluster_sync(); // the other CTA's last arrivals on this CTA's barriers have landed
#endif
}

// ----------------------------------------------------------------------------
// up + down fused by rows, a CTA of THREADS / 32 warps per row m:
//   1. f_m and the row's words into shared memory (one round trip);
//   2. the blocks' list positions from their counts; list: the active units and
//      their g, in block order and slot order within a block (increasing unit
//      order; an overflow record's positives in column order, a lost record one
//      NaN entry), ROWS_STAGE at a time;
//   3. up: a warp per listed unit n: u = f_m . Wu[n], a = bf16(g bf16(u)), the
//      dense path's rounding of u and h;
//   4. down: thread t adds a WdT[n][8t + 8 THREADS i .. +7] over the listed units,
//      in list order, to fp32 sums; y_m = bf16(sums) after the last stage.
// h lives in shared memory only; the weight rows are gathered through L2, whose
// bandwidth bounds the kernel (46 MB for both matrices at the standard point:
// about half the gathers hit). The weight loads are marked evict_last and f,
// the words and y evict_first, which keeps a little more of the weights there.
// Each row adds its true count to the active-unit counter. THREADS per CTA,
// COLS columns of D per thread (D <= THREADS COLS), 64 registers a thread: up
// to D 2048 a row takes 128 threads, so twice the rows are in flight at once
// (a row's fixed costs, its loads and barriers, bound the kernel at low
// activity: dev/NOTES.md); wider rows take 256.
constexpr int ROWS_STAGE = 512;       // listed units per stage
constexpr int ROWS_MAX_TILES = 64;    // H <= 16384
constexpr int ROWS_MAX_D = 8192;      // 256 threads of 32 columns

template <int COLS, int THREADS>
__global__ void __launch_bounds__(THREADS, 1024 / THREADS)
up_down_rows_kernel(bf16* y, unsigned long long* counters, const uint32_t* words, const uint16_t* records,
                    const bf16* f, const bf16* wu, const bf16* wdT, int D, int T, int S) {
    constexpr int WARPS = THREADS / 32, GROUPS = COLS / 8;
    __shared__ int s_tile_start[ROWS_MAX_TILES + 1]; // list position of each block's first unit
    __shared__ int s_unit[ROWS_STAGE];
    __shared__ float s_value[ROWS_STAGE];            // g, then a
    extern __shared__ uint4 s_f[];                   // f_m (D / 8 pieces of 16 bytes), then the row's words
    const int m = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32, block_words = S + 1;
    uint32_t* s_words = reinterpret_cast<uint32_t*>(s_f + D / 8);
    const uint32_t* row_words = words + (size_t)m * T * block_words;
    const uint64_t keep = l2_policy_evict_last(), stream = l2_policy_evict_first();
    for (int i = threadIdx.x; i < D / 8; i += THREADS) { s_f[i] = load_16_policy(f + (size_t)m * D + 8 * i, stream); }
    if (block_words % 4 == 0) { // the standard S = 31: 16-byte pieces
        for (int i = threadIdx.x; i < T * block_words / 4; i += THREADS) {
            reinterpret_cast<uint4*>(s_words)[i] = load_16_policy(row_words + 4 * i, stream);
        }
    } else {
        for (int i = threadIdx.x; i < T * block_words; i += THREADS) { s_words[i] = row_words[i]; }
    }
    __syncthreads();
    if (warp == 0) { // the blocks' list lengths (a lost record lists one NaN entry), then their prefix
        int carry = 0;
        unsigned int active = 0;
        for (int t0 = 0; t0 < T; t0 += 32) {
            int t = t0 + lane, listed = 0;
            if (t < T) {
                uint32_t c = s_words[t * block_words];
                listed = twell_block_listed(c, s_words[t * block_words + 1], S);
                active += c;
            }
            int inclusive = warp_inclusive_sum(listed);
            if (t < T) { s_tile_start[t] = carry + inclusive - listed; }
            carry += __shfl_sync(0xffffffffu, inclusive, 31);
        }
        active = warp_reduce<Sum>(active);
        if (lane == 0) {
            s_tile_start[T] = carry;
            if (active > 0) { atomicAdd(&counters[TWELL_ACTIVE], (unsigned long long)active); }
        }
    }
    __syncthreads();
    const int total = s_tile_start[T];
    float acc[GROUPS][8] = {};
    for (int first = 0; first < total; first += ROWS_STAGE) {
        const int count = min(ROWS_STAGE, total - first);
        // list the units at positions first .. first + count - 1
        for (int t = warp; t < T; t += WARPS) {
            int start = s_tile_start[t] - first, end = s_tile_start[t + 1] - first;
            if (end <= 0 || start >= count) { continue; }
            const uint32_t* block = s_words + t * block_words;
            uint32_t c = block[0];
            TwellBlockKind kind = twell_block_kind(c, block[1], S);
            if (kind == TWELL_BLOCK_ENTRIES) {
                if (lane < (int)c && start + lane >= 0 && start + lane < count) {
                    uint32_t w = block[1 + lane];
                    s_unit[start + lane] = t * TWELL_TILE + twell_entry_col(w);
                    s_value[start + lane] = bf16_bits_to_float(twell_entry_bits(w));
                }
            } else if (kind == TWELL_BLOCK_LOST) {
                if (lane == 0 && start >= 0) {
                    s_unit[start] = t * TWELL_TILE;
                    s_value[start] = NAN;
                }
            } else {
                uint4 x = *reinterpret_cast<const uint4*>(records + (size_t)block[1] * TWELL_TILE + lane * 8);
                uint32_t v[4] = {x.x, x.y, x.z, x.w}, mask = 0;
                #pragma unroll
                for (int e = 0; e < 8; e++) { mask |= (uint32_t)(((v[e / 2] >> (16 * (e % 2))) & 0xffff) != 0) << e; }
                int position = start + warp_inclusive_sum(__popc(mask)) - __popc(mask);
                #pragma unroll
                for (int e = 0; e < 8; e++) {
                    if (((mask >> e) & 1) && position >= 0 && position < count) {
                        s_unit[position] = t * TWELL_TILE + lane * 8 + e;
                        s_value[position] = bf16_bits_to_float((v[e / 2] >> (16 * (e % 2))) & 0xffff);
                    }
                    position += (mask >> e) & 1;
                }
            }
        }
        __syncthreads();
        // up: two units per warp at a time, so that a lane has 8 weight loads in flight
        for (int j = warp; j < count; j += 2 * WARPS) {
            const int j2 = j + WARPS;
            const bf16* w1 = wu + (size_t)s_unit[j] * D;
            const bf16* w2 = wu + (size_t)s_unit[j2 < count ? j2 : j] * D;
            float dot1 = 0.0f, dot2 = 0.0f;
            #pragma unroll 4
            for (int c = lane * 8; c < D; c += 256) {
                Bf16x8 a = load_bf16x8_policy(w1 + c, keep), b = load_bf16x8_policy(w2 + c, keep);
                const bf16* x = reinterpret_cast<const bf16*>(&s_f[c / 8]);
                #pragma unroll
                for (int e = 0; e < 8; e++) {
                    float xe = __bfloat162float(x[e]);
                    dot1 += xe * __bfloat162float(a.v[e]);
                    dot2 += xe * __bfloat162float(b.v[e]);
                }
            }
            dot1 = warp_reduce<Sum>(dot1);
            dot2 = warp_reduce<Sum>(dot2);
            if (lane == 0) {
                s_value[j] = bf16_round(s_value[j] * bf16_round(dot1));
                if (j2 < count) { s_value[j2] = bf16_round(s_value[j2] * bf16_round(dot2)); }
            }
        }
        __syncthreads();
        // down
        #pragma unroll
        for (int i = 0; i < GROUPS; i++) {
            const int col = threadIdx.x * 8 + i * 8 * THREADS;
            if (col >= D) { continue; }
            #pragma unroll 8
            for (int j = 0; j < count; j++) {
                Bf16x8 w = load_bf16x8_policy(wdT + (size_t)s_unit[j] * D + col, keep);
                float a = s_value[j];
                #pragma unroll
                for (int e = 0; e < 8; e++) { acc[i][e] += a * __bfloat162float(w.v[e]); }
            }
        }
        __syncthreads(); // the next stage's list overwrites this one's
    }
    #pragma unroll
    for (int i = 0; i < GROUPS; i++) {
        const int col = threadIdx.x * 8 + i * 8 * THREADS;
        if (col >= D) { continue; }
        Bf16x8 out;
        #pragma unroll
        for (int e = 0; e < 8; e++) { out.v[e] = __float2bfloat16_rn(acc[i][e]); }
        store_bf16x8_policy(y + (size_t)m * D + col, out, stream);
    }
}

} // namespace twell_detail

// ----------------------------------------------------------------------------
// host API. One TwellFFN holds the buffers of one FFN shape: the format (words,
// overflow records, counters), and what twell_ffn_forward chooses its path from.

typedef enum { TWELL_SPARSE, TWELL_DENSE } TwellPath;
typedef enum { TWELL_AUTO, TWELL_FORCE_SPARSE, TWELL_FORCE_DENSE } TwellChoice;

typedef struct {
    Twell tw;                      // M rows, H columns, TW 256, S slots, record capacity
    int D;
    uint32_t* words;               // [M][T][1 + S]
    uint16_t* records;             // [record capacity][256] bf16 bits
    unsigned long long* counters;  // [TWELL_NUM_COUNTERS]
    unsigned long long* counters_host; // [TWELL_NUM_COUNTERS] pinned: where twell_ffn_status_queue copies them
    // the path of twell_ffn_forward: dense when the activity measured last is
    // above dense_above, which twell_ffn_status sets from the measured times:
    // (dense - gate) / (sparse up + down per active unit per row)
    TwellChoice choice;            // TWELL_AUTO unless the caller forces a path
    TwellPath path;                // of the last run
    double active_per_row;         // measured by the last twell_ffn_status (-1: not yet)
    double dense_above;            // until measured: llmc/ffn/policy.h's
    float ms_gate, ms_dense, ms_per_active; // fastest packing gate, fastest dense, last sparse up + down per unit (0: none yet)
    cudaEvent_t events[3];         // a forward's start, end of its packing gate (start again when dense), end
    int timed;                     // the events hold a forward twell_ffn_status has not read yet
    cudaEvent_t counted;           // the counters' copy to counters_host is done
    int queued;                    // that copy is queued and twell_ffn_status has not read it yet
} TwellFFN;

typedef struct {
    long long records_needed;                // what the last run asked for (0 after a dense run)
    double active_per_row;                   // units with g > 0 per row (either path)
    TwellPath path;                          // the path the last run took
    int ok;                                  // the last run's y is exact: dense, or the record buffer large enough
} TwellStatus;

static inline size_t twell_counter_bytes(void) { return TWELL_NUM_COUNTERS * sizeof(unsigned long long); }

static inline TwellFFN twell_ffn_create(int M, int D, int H, int slots, int record_capacity) {
    if (D % TWELL_D_MULTIPLE != 0) { fatal("twell: D %d must be a multiple of %d on the GPU", D, TWELL_D_MULTIPLE); }
    if (H % 8 != 0) { fatal("twell: H %d must be a multiple of 8 on the GPU", H); }
    TwellFFN ffn;
    memset(&ffn, 0, sizeof(ffn));
    ffn.tw = twell_layout(M, H, TWELL_TILE, slots, record_capacity);
    ffn.D = D;
    ffn.words = (uint32_t*)cuda_malloc(twell_num_words(&ffn.tw) * sizeof(uint32_t));
    ffn.records = (uint16_t*)cuda_malloc((twell_record_values(&ffn.tw) + 8) * sizeof(uint16_t));
    ffn.counters = (unsigned long long*)cuda_malloc(twell_counter_bytes());
    cudaCheck(cudaMemset(ffn.counters, 0, twell_counter_bytes()));
    cudaCheck(cudaMallocHost((void**)&ffn.counters_host, twell_counter_bytes()));
    ffn.choice = TWELL_AUTO;
    ffn.path = TWELL_SPARSE;
    ffn.active_per_row = -1.0;
    ffn.dense_above = ffn_policy_twell_dense_above(H);
    for (int e = 0; e < 3; e++) { cudaCheck(cudaEventCreate(&ffn.events[e])); }
    cudaCheck(cudaEventCreateWithFlags(&ffn.counted, cudaEventDisableTiming));
    return ffn;
}

// a record buffer of record_capacity records in place of ffn's (the words and
// what the path choice learnt stay)
static inline void twell_ffn_grow(TwellFFN* ffn, int record_capacity) {
    cuda_free(ffn->records);
    ffn->tw = twell_layout(ffn->tw.rows, ffn->tw.cols, TWELL_TILE, ffn->tw.slots, record_capacity);
    ffn->records = (uint16_t*)cuda_malloc((twell_record_values(&ffn->tw) + 8) * sizeof(uint16_t));
}

static inline void twell_ffn_free(TwellFFN* ffn) {
    cuda_free(ffn->words);
    cuda_free(ffn->records);
    cuda_free(ffn->counters);
    cudaCheck(cudaFreeHost(ffn->counters_host));
    for (int e = 0; e < 3; e++) { cudaCheck(cudaEventDestroy(ffn->events[e])); }
    cudaCheck(cudaEventDestroy(ffn->counted));
    memset(ffn, 0, sizeof(*ffn));
}

// queues the copy of the last run's counters to the host, for twell_ffn_status:
// work queued after it runs on while the host waits for the copy
static inline void twell_ffn_status_queue(TwellFFN* ffn) {
    cudaCheck(cudaMemcpyAsync(ffn->counters_host, ffn->counters, twell_counter_bytes(), cudaMemcpyDeviceToHost,
                              main_stream));
    cudaCheck(cudaEventRecord(ffn->counted, main_stream));
    ffn->queued = 1;
}

// What a run's counters (on the host) and its events (start, gate done, end;
// complete) teach the path choice: the activity, and after a timed run the
// times that set dense_above. Returns the run's status.
static inline TwellStatus twell_ffn_learn(TwellFFN* ffn, const unsigned long long* c, const cudaEvent_t* events,
                                          int timed, TwellPath path) {
    TwellStatus st;
    st.records_needed = (long long)c[TWELL_RECORDS_NEEDED];
    st.active_per_row = (double)c[TWELL_ACTIVE] / ffn->tw.rows;
    st.path = path;
    st.ok = st.path == TWELL_DENSE || st.records_needed <= ffn->tw.record_capacity;
    ffn->active_per_row = st.active_per_row;
    if (timed && st.ok) {
        float gate_ms = 0.0f, rest_ms = 0.0f;
        cudaCheck(cudaEventElapsedTime(&gate_ms, events[0], events[1]));
        cudaCheck(cudaEventElapsedTime(&rest_ms, events[1], events[2]));
        if (st.path == TWELL_DENSE) {
            ffn->ms_dense = ffn->ms_dense > 0.0f ? fminf(ffn->ms_dense, gate_ms + rest_ms) : gate_ms + rest_ms;
        } else {
            ffn->ms_gate = ffn->ms_gate > 0.0f ? fminf(ffn->ms_gate, gate_ms) : gate_ms;
            if (st.active_per_row > 0.0) { ffn->ms_per_active = (float)(rest_ms / st.active_per_row); }
        }
        if (ffn->ms_per_active > 0.0f) {
            float dense = ffn->ms_dense > 0.0f ? ffn->ms_dense : TWELL_DENSE_PER_GATE * ffn->ms_gate;
            ffn->dense_above = (dense - ffn->ms_gate) / ffn->ms_per_active;
        }
    }
    return st;
}

// The counters of the last run (waits for them: for the copy
// twell_ffn_status_queue queued, else for the run). When !ok the caller grows
// the record buffer (to records_needed records) and runs again. Also
// records the activity and, after a twell_ffn_forward, its times: what the
// next twell_ffn_forward chooses its path from.
static inline TwellStatus twell_ffn_status(TwellFFN* ffn) {
    if (!ffn->queued) { twell_ffn_status_queue(ffn); }
    cudaCheck(cudaEventSynchronize(ffn->counted));
    ffn->queued = 0;
    TwellStatus st = twell_ffn_learn(ffn, ffn->counters_host, ffn->events, ffn->timed, ffn->path);
    ffn->timed = 0;
    return st;
}

// every counter to 0: the start of a run
static inline void twell_reset_counters(TwellFFN* ffn) {
    cudaCheck(cudaMemsetAsync(ffn->counters, 0, twell_counter_bytes(), main_stream));
}

// gate + packing, baseline (any GPU): g = f Wg^T by cuBLASLt into g [M, H], then the packer
static inline void twell_gate_cublas(TwellFFN* ffn, bf16* g, const bf16* f, const bf16* wg) {
    const Twell* tw = &ffn->tw;
    ffn->path = TWELL_SPARSE;
    ffn->timed = 0;
    twell_reset_counters(ffn);
    gemm(g, f, wg, tw->rows, tw->cols, ffn->D, 0, 1, 0);
    long long blocks = ((long long)tw->rows * tw->tiles + twell_detail::PACK_THREADS / 32 - 1) / (twell_detail::PACK_THREADS / 32);
    twell_detail::pack_kernel<<<(unsigned int)blocks, twell_detail::PACK_THREADS, 0, main_stream>>>(
        ffn->words, ffn->records, ffn->counters, g, tw->rows, tw->cols, tw->tiles, tw->slots, tw->record_capacity);
    cudaCheck(cudaGetLastError());
}

// the fused gate + packing into explicit buffers (compute capability 9.0):
// words [M][T][1 + S], records (record_capacity x 256), counters
// [TWELL_NUM_COUNTERS], zeroed first; g never leaves the GEMM
static inline void twell_gate_wgmma_into(uint32_t* words, uint16_t* records, unsigned long long* counters,
                                         const Twell* tw, int D, const bf16* f, const bf16* wg) {
    using namespace twell_detail;
    if (!device_has_wgmma()) { fatal("twell: the wgmma gate needs compute capability 9.0"); }
    if (D % TWELL_D_MULTIPLE != 0) { fatal("twell: the wgmma gate needs D (%d) a multiple of %d", D, TWELL_D_MULTIPLE); }
    cudaLaunchConfig_t config = {};
    cudaLaunchAttribute cluster_dims;
    cluster_dims.id = cudaLaunchAttributeClusterDimension;
    cluster_dims.val.clusterDim.x = 2, cluster_dims.val.clusterDim.y = 1, cluster_dims.val.clusterDim.z = 1;
    config.blockDim = dim3(WG_THREADS);
    config.dynamicSmemBytes = WG_SMEM;
    config.stream = main_stream;
    config.attrs = &cluster_dims;
    config.numAttrs = 1;
    static int max_clusters = 0; // pairs of CTAs that fit at once: a GPC with an odd number of free SMs leaves one out
    if (max_clusters == 0) {
        cudaCheck(cudaFuncSetAttribute(gate_pack_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)WG_SMEM));
        config.gridDim = dim3(device_attribute(cudaDevAttrMultiProcessorCount) / 2 * 2);
        cudaCheck(cudaOccupancyMaxActiveClusters(&max_clusters, gate_pack_wgmma_kernel, &config));
        if (max_clusters < 1) { fatal("twell: the wgmma gate's clusters of two CTAs do not fit on this GPU"); }
    }
    cudaCheck(cudaMemsetAsync(counters, 0, twell_counter_bytes(), main_stream));
    CUtensorMap map_f = tma_map_bf16(f, tw->rows, D, WG_BM);
    CUtensorMap map_w = tma_map_bf16(wg, tw->cols, D, WG_BN / 2);
    int tiles = ((tw->rows + WG_BM - 1) / WG_BM + 1) / 2 * tw->tiles; // 256 x 256, one per cluster
    config.gridDim = dim3(2 * (tiles < max_clusters ? tiles : max_clusters));
    cudaCheck(cudaLaunchKernelEx(&config, gate_pack_wgmma_kernel, map_f, map_w, words, records, counters, tw->rows, D,
                                 tw->tiles, tw->slots, tw->record_capacity));
}

// gate + packing, fused (compute capability 9.0) into ffn's buffers
static inline void twell_gate_wgmma(TwellFFN* ffn, const bf16* f, const bf16* wg) {
    ffn->path = TWELL_SPARSE;
    ffn->timed = 0;
    twell_gate_wgmma_into(ffn->words, ffn->records, ffn->counters, &ffn->tw, ffn->D, f, wg);
}

// gate + packing the fastest way this GPU has: wgmma, else cuBLASLt into g_scratch [M, H]
static inline void twell_gate(TwellFFN* ffn, const bf16* f, const bf16* wg, bf16* g_scratch) {
    if (device_has_wgmma()) {
        twell_gate_wgmma(ffn, f, wg);
    } else {
        if (g_scratch == NULL) { fatal("twell: the cuBLAS gate needs an [M, H] scratch buffer"); }
        twell_gate_cublas(ffn, g_scratch, f, wg);
    }
}

// the sparse FFN after the gate: y [M, D] straight from the packed gate, f, Wu and WdT
static inline void twell_up_down(TwellFFN* ffn, bf16* y, const bf16* f, const bf16* wu, const bf16* wdT) {
    using namespace twell_detail;
    const Twell* tw = &ffn->tw;
    const int D = ffn->D;
    if (D > ROWS_MAX_D || tw->tiles > ROWS_MAX_TILES) {
        fatal("twell: the fused up + down takes D <= %d and H <= %d (D %d, H %d)", ROWS_MAX_D,
              ROWS_MAX_TILES * TWELL_TILE, D, tw->cols);
    }
    size_t smem = D * sizeof(bf16) + tw->tiles * twell_words_per_block(tw) * sizeof(uint32_t); // <= 24 KB
    const int threads = D <= 2048 ? 128 : 256;
    auto kernel = D <= 1024 ? up_down_rows_kernel<8, 128> : D <= 2048 ? up_down_rows_kernel<16, 128>
                : D <= 4096 ? up_down_rows_kernel<16, 256> : up_down_rows_kernel<32, 256>;
    kernel<<<tw->rows, threads, smem, main_stream>>>(y, ffn->counters, ffn->words, ffn->records, f, wu, wdT, D,
                                                     tw->tiles, tw->slots);
    cudaCheck(cudaGetLastError());
}

// The FFN forward, sparse or dense (check twell_ffn_status before trusting y):
// dense when forced, or (TWELL_AUTO) when the activity twell_ffn_status saw
// last is above dense_above. scratch: 2 M H bf16 for the dense path and for
// the cuBLAS gate of GPUs without wgmma; NULL keeps the sparse wgmma path.
static inline TwellPath twell_ffn_forward(TwellFFN* ffn, bf16* y, const bf16* f, const bf16* wg, const bf16* wu,
                                          const bf16* wdT, bf16* scratch) {
    const int M = ffn->tw.rows, H = ffn->tw.cols;
    bool dense = ffn->choice == TWELL_FORCE_DENSE ||
                 (ffn->choice == TWELL_AUTO && scratch != NULL && ffn->active_per_row > ffn->dense_above);
    if (dense && scratch == NULL) { fatal("twell: the dense path needs a scratch buffer of 2 M H"); }
    ffn->queued = 0; // a status copy queued before this run is of the run before
    cudaCheck(cudaEventRecord(ffn->events[0], main_stream));
    if (dense) {
        twell_reset_counters(ffn);
        cudaCheck(cudaEventRecord(ffn->events[1], main_stream));
        ffn_dense_forward(y, scratch, scratch + (size_t)M * H, f, wg, wu, wdT, M, ffn->D, H, &ffn->counters[TWELL_ACTIVE]);
    } else {
        twell_gate(ffn, f, wg, scratch);
        cudaCheck(cudaEventRecord(ffn->events[1], main_stream));
        twell_up_down(ffn, y, f, wu, wdT);
    }
    cudaCheck(cudaEventRecord(ffn->events[2], main_stream));
    ffn->path = dense ? TWELL_DENSE : TWELL_SPARSE;
    ffn->timed = 1;
    return ffn->path;
}

// ----------------------------------------------------------------------------
// The TwELL FFN of a model's prefills (llmc/ffn/cuda_ffn.cuh): one set of
// buffers for the current row count, with room for an overflow record of
// every tile, so no tile is ever lost and a layer is exact in one pass: a
// prefill never waits for the host (it can be captured as a CUDA graph). What
// a layer's run measured, its activity and the times that choose between the
// sparse and the dense path, is copied to pinned memory behind an event and
// learnt when the layer runs next, if the copy is done by then: a layer's
// choices follow what its earlier prefills saw. A layer's slots per block
// come from its measured activity (llmc/ffn/policy.h): fewer words to write
// and read, and the tiles past them take their records.

enum { TWELL_EVENT_START, TWELL_EVENT_GATE, TWELL_EVENT_END, TWELL_EVENT_COPIED, TWELL_LAYER_EVENTS };

typedef struct {
    TwellFFN ffn;          // words of TWELL_SLOTS slots (a run's layout uses its own S), a record for every tile
    int rows;              // M of ffn (0: none yet)
    int cols;              // the units of a layer (one with hot units runs TwELL over fewer: its cold ones)
    TwellChoice choice;    // TWELL_AUTO (dense for too active layers) unless a test forces a path
    int slots;             // 0: each layer's from its activity; else these (tests force overflow with 1)
    int dense_timed;       // the dense FFN was timed at this M (what auto compares the sparse path with)
    int min_rows;          // prefills of fewer rows run the dense FFN (TWELL_PREFILL_MIN_ROWS; 0: never)
    int L;
    double* layer_active;  // [L] units per row the layer's last learnt run saw (-1: none yet)
    unsigned long long* counters_host; // [L][TWELL_NUM_COUNTERS] pinned: each layer's last run's counters
    cudaEvent_t* events;   // [L][TWELL_LAYER_EVENTS]
    int* pending;          // [L] 1: the layer's last run is not learnt yet
    TwellPath* path;       // [L] its path
    int* run_rows;         // [L] its rows
} TwellPrefill;

static inline void twell_prefill_init(TwellPrefill* tp, int L, int H) {
    memset(tp, 0, sizeof(*tp));
    tp->cols = H;
    tp->choice = TWELL_AUTO;
    tp->min_rows = TWELL_PREFILL_MIN_ROWS;
    tp->L = L;
    tp->layer_active = (double*)mallocCheck(L * sizeof(double));
    tp->pending = (int*)callocCheck(L, sizeof(int));
    tp->path = (TwellPath*)callocCheck(L, sizeof(TwellPath));
    tp->run_rows = (int*)callocCheck(L, sizeof(int));
    tp->events = (cudaEvent_t*)mallocCheck((size_t)L * TWELL_LAYER_EVENTS * sizeof(cudaEvent_t));
    cudaCheck(cudaMallocHost((void**)&tp->counters_host, (size_t)L * TWELL_NUM_COUNTERS * sizeof(unsigned long long)));
    for (int l = 0; l < L; l++) {
        tp->layer_active[l] = -1.0;
        for (int e = 0; e < TWELL_LAYER_EVENTS; e++) {
            cudaCheck(cudaEventCreateWithFlags(&tp->events[l * TWELL_LAYER_EVENTS + e],
                                               e == TWELL_EVENT_COPIED ? cudaEventDisableTiming : cudaEventDefault));
        }
    }
}

static inline void twell_prefill_free(TwellPrefill* tp) {
    if (tp->rows) { twell_ffn_free(&tp->ffn); }
    for (int i = 0; i < tp->L * TWELL_LAYER_EVENTS; i++) { cudaCheck(cudaEventDestroy(tp->events[i])); }
    cudaCheck(cudaFreeHost(tp->counters_host));
    free(tp->events);
    free(tp->layer_active);
    free(tp->pending);
    free(tp->path);
    free(tp->run_rows);
    memset(tp, 0, sizeof(*tp));
}

// whether the GPU's TwELL path takes this shape (else a prefill runs the dense FFN)
static inline bool twell_prefill_supports(int D) { return D % TWELL_D_MULTIPLE == 0; }

// whether a prefill of M rows runs TwELL
static inline bool twell_prefill_takes(const TwellPrefill* tp, int M, int D) {
    return twell_prefill_supports(D) && ffn_policy_prefill_sparse(M, tp->min_rows);
}

// learns layer l's last run if its copy is done (never waits); a run of
// another row count teaches its activity only
static inline void twell_prefill_learn(TwellPrefill* tp, int l) {
    cudaEvent_t* ev = tp->events + (size_t)l * TWELL_LAYER_EVENTS;
    if (!tp->pending[l] || cudaEventQuery(ev[TWELL_EVENT_COPIED]) != cudaSuccess) { return; }
    const unsigned long long* c = tp->counters_host + (size_t)l * TWELL_NUM_COUNTERS;
    TwellFFN* tw = &tp->ffn;
    int same_m = tp->run_rows[l] == tw->tw.rows;
    if (same_m) {
        TwellStatus st = twell_ffn_learn(tw, c, ev, 1, tp->path[l]);
        // (records for every tile: none is ever lost)
        if (!st.ok) { fatal("twell: layer %d lost records (%lld needed): a bug", l, st.records_needed); }
    }
    tp->layer_active[l] = (double)c[TWELL_ACTIVE] / tp->run_rows[l];
    tp->pending[l] = 0;
}

// waits for every layer's last run and learns it (benchmarks and tests that read the activity; a prefill
// itself never waits)
static inline void twell_prefill_settle(TwellPrefill* tp) {
    for (int l = 0; l < tp->L; l++) {
        if (tp->pending[l]) { cudaCheck(cudaEventSynchronize(tp->events[(size_t)l * TWELL_LAYER_EVENTS + TWELL_EVENT_COPIED])); }
        twell_prefill_learn(tp, l);
    }
}

// the overflow records layer l's last run took (its tiles past their slots), once settled
static inline long long twell_prefill_records(const TwellPrefill* tp, int l) {
    return (long long)tp->counters_host[(size_t)l * TWELL_NUM_COUNTERS + TWELL_RECORDS_NEEDED];
}

// the buffers for prefills of M rows over up to tp->cols units (a new M: the dense FFN is timed again)
static inline void twell_prefill_rows(TwellPrefill* tp, int M, int D, int H) {
    if (H > tp->cols) { fatal("twell: a layer of %d units, the prefill's buffers are for %d", H, tp->cols); }
    const int tiles = ceil_div(tp->cols, TWELL_TILE);
    if ((long long)M * tiles > INT_MAX) { fatal("twell: a prefill of %d rows is too many for its records", M); }
    if (tp->rows == M) { return; }
    if (tp->rows) { twell_ffn_free(&tp->ffn); }
    tp->ffn = twell_ffn_create(M, D, tp->cols, TWELL_SLOTS, M * tiles);
    tp->ffn.choice = tp->choice;
    tp->rows = M;
    tp->dense_timed = 0;
}

// Queues layer l's FFN for M rows, y [M, D] from f, by TwELL over H units
// (the layer's cold ones where it has hot units: llmc/ffn/split.h), exact
// when the work is done; scratch: 2 M H. Its counters and times are copied
// for the layer's next run to learn from.
static inline void twell_prefill_run(TwellPrefill* tp, int l, bf16* y, const bf16* f, const bf16* wg, const bf16* wu,
                                     const bf16* wdT, int M, int D, int H, bf16* scratch) {
    twell_prefill_rows(tp, M, D, H);
    twell_prefill_learn(tp, l);
    TwellFFN* tw = &tp->ffn;
    int slots = tp->slots ? tp->slots : ffn_policy_twell_slots(tp->layer_active[l] / ceil_div(H, TWELL_TILE));
    tw->tw = twell_layout(M, H, TWELL_TILE, slots, tw->tw.record_capacity);
    tw->active_per_row = tp->layer_active[l];
    // auto: the first layer at a new M runs dense once, so that the choice compares measured times, not the
    // sparse time with an estimate of the dense one
    bool time_dense = tw->choice == TWELL_AUTO && !tp->dense_timed;
    if (time_dense) { tw->choice = TWELL_FORCE_DENSE; }
    cudaEvent_t* ev = tp->events + (size_t)l * TWELL_LAYER_EVENTS;
    cudaEvent_t own[3];
    memcpy(own, tw->events, sizeof(own)); // the run's times go to the layer's events
    memcpy(tw->events, ev, sizeof(own));
    tp->path[l] = twell_ffn_forward(tw, y, f, wg, wu, wdT, scratch);
    memcpy(tw->events, own, sizeof(own));
    if (time_dense) { tw->choice = TWELL_AUTO; tp->dense_timed = 1; }
    cudaCheck(cudaMemcpyAsync(tp->counters_host + (size_t)l * TWELL_NUM_COUNTERS, tw->counters, twell_counter_bytes(),
                              cudaMemcpyDeviceToHost, main_stream));
    cudaCheck(cudaEventRecord(ev[TWELL_EVENT_COPIED], main_stream));
    tp->pending[l] = 1;
    tp->run_rows[l] = M;
}

// Queues y [M, D] from f by TwELL's sparse path over H units alone (the rows of wg, wu, wdT), which fire
// `active` times per row (their slots per block), as a layer's cold part runs but teaching no layer's choices:
// nothing is copied to learn from, and the path is not chosen (llmc/ffn/hot.h times the smallest cold part so).
// scratch: as twell_prefill_run's.
static inline void twell_prefill_probe(TwellPrefill* tp, bf16* y, const bf16* f, const bf16* wg, const bf16* wu,
                                       const bf16* wdT, int M, int D, int H, double active, bf16* scratch) {
    twell_prefill_rows(tp, M, D, H);
    TwellFFN* tw = &tp->ffn;
    int slots = tp->slots ? tp->slots : ffn_policy_twell_slots(active / ceil_div(H, TWELL_TILE));
    tw->tw = twell_layout(M, H, TWELL_TILE, slots, tw->tw.record_capacity);
    TwellChoice choice = tw->choice;
    tw->choice = TWELL_FORCE_SPARSE;
    twell_ffn_forward(tw, y, f, wg, wu, wdT, scratch);
    tw->choice = choice;
}

#endif // LLMC_FFN_CUDA_TWELL_CUH
