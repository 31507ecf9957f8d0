/*
 The sparse FFN kernels of training on the GPU: the hybrid pattern and the
 products of llmc/ffn/ell.h (which has the math, the format and the CPU
 reference), bf16 values, fp32 accumulation, fp32 weight gradients.

     pack        g [M, H] (the one dense product, from cuBLASLt) -> P: a warp per row counts, a scan
                 gives the tail slots in row order, a warp per row writes its entries in unit order;
                 on Hopper the wgmma gate packs g into TwELL blocks from its registers instead, and
                 the count and write read those (g [M, H] is never written)
     up          a warp per row, and for a row in the tail one per further W of its entries: one
                 D-long dot product per entry (f . Wu[n])
     down, df    a CTA per (row, column slice), a thread per 8 columns: y_m (df_m) = sum_e a_e A[n_e]
                 (+ b_e B[n_e]); a row in the tail: CTAs of up to 16 streams of threads (stream i
                 takes every S-th entry from entry i) per 64 to 1024 columns, their sums added in
                 stream order
     transpose   a counting sort by unit over blocks of 64 rows (histogram, scan, fill in row order);
                 its per-unit totals are added to the units' firing counts (the hot/cold choice)
     dh, weights unit-major over the transposed pattern, a warp per (unit, column slice), a CTA for
                 a unit with many entries, in two passes: one gathers dy_m per entry (WdT[n] held for
                 the whole unit) for dWdT[n] and the slice's share of dy_m . WdT[n]; a thread per
                 entry adds the shares into du, dg; one gathers f_m per entry for dWu[n] and dWg[n].
                 fp32 sums in registers added once to the gradients
 The backward runs the transpose, dh + weights, then df (which needs du, dg).

 Deterministic: the same inputs give the same bits (fixed slot, entry and
 summation orders, no float atomics). Nothing here waits for the host; the
 caller reads tail_used once per forward and redoes the forward with a larger
 tail when it exceeded the capacity (the lost rows are NaN until then).

 Every kernel reads gathered rows from L2 (D long: 4 KB at D 2048), and that
 traffic is what bounds them (dev/NOTES.md). Per (token m, unit n) pair:
     up Wu[n]; down WdT[n]; dh and dWdT dy_m; dWu and dWg f_m (one load for both); df Wu[n], Wg[n]
 six rows in all. They were seven: dh gathered WdT[n] row-major (dy_m being the
 row's own) and the weight gradients then gathered dy_m again (f_m was already
 shared): the backward gathers 4 rows a pair instead of 5 (the bytes and the L2
 floor at the standard point: dev/NOTES.md, "Backward with shared gathers"). The
 price: WdT[n] once per unit and slice, and the shares of the dots, 4 bytes per
 entry and slice written and read again.
 Requirements: H % 8 == 0, D % 8 == 0, 16-byte aligned rows.
*/
#ifndef LLMC_FFN_CUDA_ELL_CUH
#define LLMC_FFN_CUDA_ELL_CUH

#include <cub/cub.cuh>
#include "llmc/cuda_common.cuh"
#include "llmc/ffn/cuda_twell.cuh"
#include "llmc/ffn/ell.h"

constexpr int SPARSE_ROW_WARPS = 8;      // warps per CTA of the warp-per-row kernels
constexpr int SPARSE_ROW_BLOCK = 64;     // rows per block of the transpose
constexpr int SPARSE_STAGE = 256;        // entries a CTA stages in shared memory at a time

__device__ __forceinline__ size_t row_base(const SparsePattern<bf16>& p, int m, int slot) {
    return sparse_row_base(p.M, p.H, p.W, m, slot);
}

// ----------------------------------------------------------------------------
// pack

__global__ void sparse_count_kernel(int* count, int* row_active, int* row_flag, const bf16* g, int M, int H, int W) {
    const int m = blockIdx.x * SPARSE_ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (m >= M) { return; }
    int c = 0;
    for (int col = lane * 8; col < H; col += 256) {
        Bf16x8 v = load_bf16x8(g + (size_t)m * H + col);
        for (int i = 0; i < 8; i++) { c += __bfloat162float(v.v[i]) > 0.0f; }
    }
    c = warp_reduce<Sum>(c);
    if (lane == 0) {
        count[m] = row_active[m] = c;
        row_flag[m] = c > W;
    }
}

// row m's tail slot (-1: the ELL part) from the scan of the rows' flags, stored
// with tail_used; SPARSE_ROW_LOST past the tail's capacity
__device__ int sparse_row_slot(const SparsePattern<bf16>& p, int m, const int* row_flag, const int* row_prefix) {
    int slot = row_flag[m] ? row_prefix[m] : -1;
    if (m == p.M - 1 && threadIdx.x % 32 == 0) { *p.tail_used = row_prefix[m] + row_flag[m]; }
    if (slot >= p.tail_capacity) { slot = SPARSE_ROW_LOST; }
    if (threadIdx.x % 32 == 0) {
        p.tail_slot[m] = slot;
        if (slot >= 0) { p.tail_row[slot] = m; }
    }
    return slot;
}

// a warp's 256 consecutive columns, lane l holding units col..col+7 (col = col0
// + 8 l) with their g in v: the positives become entries e, e + 1, ... in unit
// order (lane order is unit order); returns how many (every lane). A fired
// mark is stored only where it still reads 0: unconditional stores of the
// same few cache lines by every warp were measured slower
__device__ int sparse_write_positives(const SparsePattern<bf16>& p, uint8_t* fired, size_t e, int col, const Bf16x8& v) {
    unsigned mask = 0;
    for (int i = 0; i < 8; i++) { mask |= (unsigned)(__bfloat162float(v.v[i]) > 0.0f) << i; }
    int mine = __popc(mask);
    int inclusive = warp_inclusive_sum(mine);
    size_t out = e + inclusive - mine;
    for (int i = 0; i < 8; i++) {
        if ((mask >> i) & 1) {
            p.unit[out] = (uint16_t)(col + i);
            p.g[out] = v.v[i];
            out++;
            if (fired && !fired[col + i]) { fired[col + i] = 1; }
        }
    }
    return __shfl_sync(0xffffffffu, inclusive, 31);
}

__global__ void sparse_write_kernel(SparsePattern<bf16> p, uint8_t* fired, const bf16* g, const int* row_flag,
                                    const int* row_prefix) {
    const int m = blockIdx.x * SPARSE_ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (m >= p.M) { return; }
    const int slot = sparse_row_slot(p, m, row_flag, row_prefix);
    if (slot == SPARSE_ROW_LOST) { return; }
    size_t e = row_base(p, m, slot);
    for (int col = lane * 8; col < p.H; col += 256) {
        e += sparse_write_positives(p, fired, e, col, load_bf16x8(g + (size_t)m * p.H + col));
    }
}

void sparse_pack(SparsePattern<bf16>* p, int* row_active, uint8_t* fired, const bf16* g, SparseScratch* s) {
    if (p->H % 8 != 0) { fatal("sparse_pack: H %d must be a multiple of 8 on the GPU", p->H); }
    const int blocks = ceil_div(p->M, SPARSE_ROW_WARPS);
    sparse_count_kernel<<<blocks, SPARSE_ROW_WARPS * 32, 0, main_stream>>>(p->count, row_active, s->row_flag, g, p->M,
                                                                           p->H, p->W);
    cudaCheck(cudaGetLastError());
    cudaCheck(cub::DeviceScan::ExclusiveSum(s->scan_temp, s->scan_temp_bytes, s->row_flag, s->row_prefix, p->M, main_stream));
    sparse_write_kernel<<<blocks, SPARSE_ROW_WARPS * 32, 0, main_stream>>>(*p, fired, g, s->row_flag, s->row_prefix);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------
// pack fused with the gate (compute capability 9.0): the wgmma gate of
// llmc/ffn/cuda_twell.cuh packs g from its registers into TwELL blocks, one per row
// and tile of 256 units (word 0 the tile's count c; c <= 31: words 1..c the
// entries, unit within the tile | bf16 g << 16, in unit order; else word 1 the
// index of an overflow record, the tile's relu(g) row). Then a warp per row
// counts (the words 0), the same scan, and a warp per row writes its entries
// tile by tile. g never reaches memory except as those records: a block is 128
// bytes per row and tile, g's tile 512. The blocks are read with
// llmc/ffn/twell.h's decoder.
// The records sit where the caller has room (sparse_scratch_alloc_cuda), which
// may be fewer than the tiles: a tile past the capacity is lost, its entries
// written as NaN at valid units (the row's outputs NaN), and the gate's count of
// records reported to records_needed so that the caller grows the buffer and
// redoes the forward, as for a tail (llmc/ffn/ffn.h, ffn_overflowed).

__global__ void sparse_count_twell_kernel(int* count, int* row_active, int* row_flag, const uint32_t* words, int M,
                                          int T, int W, const unsigned long long* gate_counters, int* records_needed) {
    const int m = blockIdx.x * SPARSE_ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (m >= M) { return; }
    if (m == 0 && lane == 0 && records_needed) {
        const unsigned long long asked = gate_counters[TWELL_RECORDS_NEEDED];
        atomicMax(records_needed, asked < INT_MAX ? (int)asked : INT_MAX);
    }
    int c = 0;
    for (int t = lane; t < T; t += 32) { c += (int)words[((size_t)m * T + t) * (TWELL_SLOTS + 1)]; }
    c = warp_reduce<Sum>(c);
    if (lane == 0) {
        count[m] = row_active[m] = c;
        row_flag[m] = c > W;
    }
}

// lane j reads word j of each block, 8 tiles' blocks in flight at once
constexpr int GATE_TILES_IN_FLIGHT = 8;
__global__ void sparse_write_twell_kernel(SparsePattern<bf16> p, uint8_t* fired, const uint32_t* words,
                                          const uint16_t* records, const int* row_flag, const int* row_prefix, int T) {
    const int m = blockIdx.x * SPARSE_ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (m >= p.M) { return; }
    const int slot = sparse_row_slot(p, m, row_flag, row_prefix);
    if (slot == SPARSE_ROW_LOST) { return; }
    size_t e = row_base(p, m, slot);
    const uint32_t* row_words = words + (size_t)m * T * (TWELL_SLOTS + 1);
    for (int t0 = 0; t0 < T; t0 += GATE_TILES_IN_FLIGHT) {
        uint32_t w[GATE_TILES_IN_FLIGHT];
        #pragma unroll
        for (int q = 0; q < GATE_TILES_IN_FLIGHT; q++) {
            w[q] = t0 + q < T ? row_words[(size_t)(t0 + q) * (TWELL_SLOTS + 1) + lane] : 0;
        }
        #pragma unroll
        for (int q = 0; q < GATE_TILES_IN_FLIGHT; q++) {
            const int c = (int)__shfl_sync(0xffffffffu, w[q], 0), unit0 = (t0 + q) * TWELL_TILE;
            if (c == 0) { continue; } // also the tiles past the last (w = 0)
            const uint32_t word1 = __shfl_sync(0xffffffffu, w[q], 1);
            if (twell_block_kind((uint32_t)c, word1, TWELL_SLOTS) == TWELL_BLOCK_ENTRIES) {
                if (lane >= 1 && lane <= c) {
                    const int n = unit0 + twell_entry_col(w[q]);
                    p.unit[e + lane - 1] = (uint16_t)n;
                    p.g[e + lane - 1] = __ushort_as_bfloat16((unsigned short)twell_entry_bits(w[q]));
                    if (fired && !fired[n]) { fired[n] = 1; }
                }
                e += c;
            } else if (word1 == TWELL_RECORD_LOST) { // (c units fired: NaN at the tile's first c)
                for (int i = lane; i < c; i += 32) {
                    p.unit[e + i] = (uint16_t)(unit0 + i);
                    p.g[e + i] = __float2bfloat16(NAN);
                }
                e += c;
            } else {
                const bf16* values = reinterpret_cast<const bf16*>(records) + (size_t)word1 * TWELL_TILE;
                e += sparse_write_positives(p, fired, e, unit0 + lane * 8, load_bf16x8(values + lane * 8));
            }
        }
    }
}

// P from the TwELL blocks in s->gate_words and their records
void sparse_pack_twell(SparsePattern<bf16>* p, int* row_active, uint8_t* fired, const uint16_t* records, SparseScratch* s) {
    const int M = p->M, T = ceil_div(p->H, TWELL_TILE), blocks = ceil_div(M, SPARSE_ROW_WARPS);
    sparse_count_twell_kernel<<<blocks, SPARSE_ROW_WARPS * 32, 0, main_stream>>>(
        p->count, row_active, s->row_flag, s->gate_words, M, T, p->W, s->gate_counters, s->records_needed);
    cudaCheck(cudaGetLastError());
    cudaCheck(cub::DeviceScan::ExclusiveSum(s->scan_temp, s->scan_temp_bytes, s->row_flag, s->row_prefix, M, main_stream));
    sparse_write_twell_kernel<<<blocks, SPARSE_ROW_WARPS * 32, 0, main_stream>>>(*p, fired, s->gate_words, records,
                                                                                 s->row_flag, s->row_prefix, T);
    cudaCheck(cudaGetLastError());
}

// whether this GPU packs the gate's tiles from the product's registers for rows of D (wgmma, D % 64 == 0)
static inline bool sparse_gate_fused(int D) { return device_has_wgmma() && D % TWELL_D_MULTIPLE == 0; }

// the fused gate + pack where this GPU and shape allow it (the scratch's TwELL
// buffers allocated); else false. g is not used (the CPU's and cuBLASLt's gate
// need it)
bool sparse_gate_pack(SparsePattern<bf16>* p, int* row_active, uint8_t* fired, bf16* g, const bf16* f, const bf16* wg,
                      int D, SparseScratch* s) {
    if (s->gate_words == NULL || !sparse_gate_fused(D)) { return false; }
    const int M = p->M, H = p->H, T = ceil_div(H, TWELL_TILE);
    Twell tw = twell_layout(M, H, TWELL_TILE, TWELL_SLOTS, s->record_capacity < M * T ? s->record_capacity : M * T);
    twell_gate_wgmma_into(s->gate_words, s->gate_records, s->gate_counters, &tw, D, f, wg);
    sparse_pack_twell(p, row_active, fired, s->gate_records, s);
    return true;
}

// ----------------------------------------------------------------------------
// up: a D-long dot product per entry, a warp per row (and per further chunk of a tail row)

// u_e = f_m . Wu[n_e]; row_l1[m] = sum |bf16(g_e u_e)| by the row's warp where
// the row has one (not in the tail; NaN for a lost row).
// A warp per chunk of at most W entries of a row (W the ELL width): first a
// warp per row for its first W, then, for the rows in the tail, a warp per
// further chunk (chunk k of tail slot s is warp M + s (chunks - 1) + k - 1),
// so that a row firing ten times the mean does not hold up the kernel. Four
// entries at a time, so that each lane has four weight loads in flight per f load.
constexpr int DOT_ENTRIES = 4;

static inline int sparse_dot_chunks(const SparsePattern<bf16>* p) { return ceil_div(p->H, p->W); }

__global__ void sparse_dot_kernel(SparsePattern<bf16> p, float* row_l1, const bf16* f, const bf16* wu, int D, int chunks) {
    const int warp = blockIdx.x * SPARSE_ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    int m = warp, chunk = 0;
    if (warp >= p.M) { // a later chunk of a tail row
        if (chunks < 2) { return; }
        const int s = (warp - p.M) / (chunks - 1);
        chunk = (warp - p.M) % (chunks - 1) + 1;
        if (s >= min(*p.tail_used, p.tail_capacity)) { return; }
        m = p.tail_row[s];
    }
    const int slot = p.tail_slot[m];
    if (slot == SPARSE_ROW_LOST) {
        if (lane == 0) { row_l1[m] = NAN; }
        return;
    }
    const size_t e0 = row_base(p, m, slot);
    const int c = min(p.count[m], (chunk + 1) * p.W);
    const bf16* fm = f + (size_t)m * D;
    float l1 = 0.0f;
    for (int j0 = chunk * p.W; j0 < c; j0 += DOT_ENTRIES) {
        const int nj = min(DOT_ENTRIES, c - j0);
        const bf16* a[DOT_ENTRIES];
        #pragma unroll
        for (int q = 0; q < DOT_ENTRIES; q++) { a[q] = wu + (size_t)p.unit[e0 + j0 + min(q, nj - 1)] * D; }
        float dot[DOT_ENTRIES] = {};
        for (int col = lane * 8; col < D; col += 256) {
            Bf16x8 xv = load_bf16x8(fm + col);
            Bf16x8 av[DOT_ENTRIES];
            #pragma unroll
            for (int q = 0; q < DOT_ENTRIES; q++) { av[q] = load_bf16x8(a[q] + col); }
            #pragma unroll
            for (int q = 0; q < DOT_ENTRIES; q++) {
                for (int i = 0; i < 8; i++) { dot[q] += __bfloat162float(xv.v[i]) * __bfloat162float(av[q].v[i]); }
            }
        }
        #pragma unroll
        for (int q = 0; q < DOT_ENTRIES; q++) { dot[q] = warp_reduce<Sum>(dot[q]); }
        for (int q = 0; q < nj; q++) {
            const size_t e = e0 + j0 + q;
            bf16 u = __float2bfloat16_rn(dot[q]);
            l1 += fabsf(__bfloat162float(__float2bfloat16_rn(__bfloat162float(p.g[e]) * __bfloat162float(u))));
            if (lane == 0) { p.u[e] = u; }
        }
    }
    if (slot < 0 && lane == 0) { row_l1[m] = l1; }
}

// row_l1 of the rows in the tail (their chunks ran on several warps): a warp per tail slot
__global__ void sparse_tail_l1_kernel(float* row_l1, SparsePattern<bf16> p) {
    const int s = blockIdx.x * SPARSE_ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (s >= min(*p.tail_used, p.tail_capacity)) { return; }
    const int m = p.tail_row[s];
    const size_t e0 = row_base(p, m, s);
    float l1 = 0.0f;
    for (int j = lane; j < p.count[m]; j += 32) {
        l1 += fabsf(__bfloat162float(__float2bfloat16_rn(__bfloat162float(p.g[e0 + j]) * __bfloat162float(p.u[e0 + j]))));
    }
    l1 = warp_reduce<Sum>(l1);
    if (lane == 0) { row_l1[m] = l1; }
}

void sparse_up(SparsePattern<bf16>* p, float* row_l1, const bf16* f, const bf16* wu, int D) {
    if (D % 8 != 0) { fatal("sparse FFN: D %d must be a multiple of 8 on the GPU", D); }
    const int chunks = sparse_dot_chunks(p);
    const long warps = p->M + (long)p->tail_capacity * (chunks - 1);
    if (warps > INT_MAX) { fatal("sparse FFN: %ld warps for the tail's chunks exceed int32", warps); }
    sparse_dot_kernel<<<ceil_div((int)warps, SPARSE_ROW_WARPS), SPARSE_ROW_WARPS * 32, 0, main_stream>>>(
        *p, row_l1, f, wu, D, chunks);
    cudaCheck(cudaGetLastError());
    if (p->tail_capacity > 0) {
        sparse_tail_l1_kernel<<<ceil_div(p->tail_capacity, SPARSE_ROW_WARPS), SPARSE_ROW_WARPS * 32, 0, main_stream>>>(row_l1, *p);
        cudaCheck(cudaGetLastError());
    }
}

// ----------------------------------------------------------------------------
// down and df: out_m = sum_e a_e A[n_e] (+ b_e B[n_e]) over row m's entries (a
// NULL: a_e = h_e = bf16(g_e u_e), as the dense path rounds h), fp32 sums
// rounded once. One launch of CTAs of T threads (a power of two, at most 128),
// a thread per 8 columns, the entries staged in shared memory SPARSE_STAGE at a
// time; two kinds of CTA, the tail rows' first:
// - a tail row (slot s, c entries): S streams of T / S threads each, S the
//   fewest powers of two (at most T / 8) that keep a stream's share within
//   GATHER_TAIL_CHAIN entries; stream i takes entries i, i + S, i + 2S, ... and
//   the streams' sums are added in stream order. A CTA per (slot, 8 T / S
//   columns): the slot has ceil(D / 64) CTAs, one per 64 columns, and those
//   inside a wider CTA's columns return at once. S depends on c only, so the
//   bits do not depend on scheduling; S = 1 is the ELL rows' walk;
// - an ELL row: a CTA per (row, slice of 8 T columns), slices outermost (df's two
//   gathered matrices are read one slice at a time, which L2 holds), its threads
//   walking all of the row's entries; a lost row is NaN.
// Why the tail rows are split: a thread's walk is a chain of dependent L2 round
// trips, so a trained layer's busiest row (thousands of entries), walked by one
// CTA per 1024 columns, kept the kernel running while the rest of the GPU
// idled. Now such a row is 32 CTAs of 16 streams, started first, whose walks
// end inside the time the layer's other gathers take (the timings: dev/NOTES.md,
// "Down and df: a tail row's entries split over streams"). The gathered bytes
// are unchanged; a tail CTA re-reads its row's entries (6 bytes an entry per 64
// columns, against 128 gathered: +5%), and a slot's CTAs that a wider CTA
// covers cost three dependent loads each.
constexpr int GATHER_MAX_THREADS = 128;
constexpr int GATHER_TAIL_COLS = 64;   // a tail CTA's narrowest slice: streams of 8 threads
constexpr int GATHER_TAIL_CHAIN = 128; // entries a stream walks before its row gets more streams
// CTAs per SM that the registers must allow: the ELL rows' occupancy before the
// tail rows had CTAs of their own (34 registers on sm_90a, 32 on sm_80)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr int GATHER_MIN_CTAS = 12;
#else
constexpr int GATHER_MIN_CTAS = 16;
#endif

// a CTA's threads: one per 8 columns up to 128, a power of two (so a tail row's streams split them evenly)
static inline int sparse_gather_threads(int D) {
    int threads = 32;
    while (threads < GATHER_MAX_THREADS && threads * 8 < D) { threads *= 2; }
    return threads;
}

// the gather's shared memory: a stage of entries, or a tail row's streams' sums (per column of a thread, thread)
union GatherShared {
    struct { uint16_t unit[SPARSE_STAGE]; float a[SPARSE_STAGE], b[SPARSE_STAGE]; } stage;
    float sums[8][GATHER_MAX_THREADS];
};

// acc += the row's entries e0 .. e0 + c - 1 at the 8 columns from col, a stage at a
// time; stream `first` of `step` takes every step-th entry (SPARSE_STAGE % step == 0)
__device__ __forceinline__ void gather_row(float (&acc)[8], GatherShared& s, const SparsePattern<bf16>& p, size_t e0,
                                           int c, int first, int step, const bf16* a, const bf16* A, const bf16* b,
                                           const bf16* B, int D, int col) {
    for (int j0 = 0; j0 < c; j0 += SPARSE_STAGE) {
        int n = min(SPARSE_STAGE, c - j0);
        __syncthreads();
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
            size_t e = e0 + j0 + j;
            s.stage.unit[j] = p.unit[e];
            s.stage.a[j] = a ? __bfloat162float(a[e])
                             : __bfloat162float(__float2bfloat16_rn(__bfloat162float(p.g[e]) * __bfloat162float(p.u[e])));
            if (B) { s.stage.b[j] = __bfloat162float(b[e]); }
        }
        __syncthreads();
        if (col >= D) { continue; }
        #pragma unroll 8
        for (int j = first; j < n; j += step) {
            Bf16x8 w = load_bf16x8(A + (size_t)s.stage.unit[j] * D + col);
            for (int i = 0; i < 8; i++) { acc[i] += s.stage.a[j] * __bfloat162float(w.v[i]); }
            if (B) {
                Bf16x8 w2 = load_bf16x8(B + (size_t)s.stage.unit[j] * D + col);
                for (int i = 0; i < 8; i++) { acc[i] += s.stage.b[j] * __bfloat162float(w2.v[i]); }
            }
        }
    }
}

__device__ __forceinline__ void store_row(bf16* out, const float (&acc)[8]) {
    Bf16x8 o;
    for (int i = 0; i < 8; i++) { o.v[i] = __float2bfloat16_rn(acc[i]); }
    store_bf16x8(out, o);
}

// the CTA of tail slot `slot` and 64-column chunk q
__device__ __forceinline__ void gather_tail(bf16* out, GatherShared& s, const SparsePattern<bf16>& p, int slot, int q,
                                            const bf16* a, const bf16* A, const bf16* b, const bf16* B, int D) {
    if (slot >= min(*p.tail_used, p.tail_capacity)) { return; }
    const int m = p.tail_row[slot], c = p.count[m], max_streams = blockDim.x / 8;
    int streams = 1;
    while (streams < max_streams && c > streams * GATHER_TAIL_CHAIN) { streams *= 2; }
    if (q % (max_streams / streams) != 0) { return; } // inside the columns of chunk q - q % (max_streams / streams)
    const int lanes = blockDim.x / streams, stream = threadIdx.x / lanes, lane = threadIdx.x % lanes;
    const int col = q * GATHER_TAIL_COLS + lane * 8;
    float acc[8] = {};
    gather_row(acc, s, p, row_base(p, m, slot), c, stream, streams, a, A, b, B, D, col);
    __syncthreads(); // every stream is done with the staged entries
    for (int i = 0; i < 8; i++) { s.sums[i][threadIdx.x] = acc[i]; }
    __syncthreads();
    if (stream > 0 || col >= D) { return; }
    for (int k = 1; k < streams; k++) { // stream 0 adds the others' sums, in stream order
        for (int i = 0; i < 8; i++) { acc[i] += s.sums[i][k * lanes + lane]; }
    }
    store_row(out + (size_t)m * D + col, acc);
}

__global__ void __launch_bounds__(GATHER_MAX_THREADS, GATHER_MIN_CTAS)
    sparse_gather_kernel(bf16* out, SparsePattern<bf16> p, const bf16* a, const bf16* A, const bf16* b, const bf16* B,
                         int D) {
    __shared__ GatherShared s;
    const int chunks = (D + GATHER_TAIL_COLS - 1) / GATHER_TAIL_COLS, tail_ctas = p.tail_capacity * chunks;
    if ((int)blockIdx.x < tail_ctas) {
        gather_tail(out, s, p, blockIdx.x / chunks, blockIdx.x % chunks, a, A, b, B, D);
        return;
    }
    const int r = blockIdx.x - tail_ctas, m = r % p.M, col = (r / p.M * blockDim.x + threadIdx.x) * 8; // slice r / M
    const int slot = p.tail_slot[m];
    if (slot >= 0) { return; } // a tail row: the CTAs above
    float acc[8] = {};
    if (slot == SPARSE_ROW_LOST) {
        for (int i = 0; i < 8; i++) { acc[i] = NAN; }
    } else {
        gather_row(acc, s, p, row_base(p, m, slot), p.count[m], 0, 1, a, A, b, B, D, col);
    }
    if (col < D) { store_row(out + (size_t)m * D + col, acc); }
}

static void sparse_gather(bf16* out, const SparsePattern<bf16>* p, const bf16* a, const bf16* A, const bf16* b,
                          const bf16* B, int D) {
    if (D % 8 != 0) { fatal("sparse FFN: D %d must be a multiple of 8 on the GPU", D); }
    const int threads = sparse_gather_threads(D);
    const long ctas = (long)p->tail_capacity * ceil_div(D, GATHER_TAIL_COLS) + (long)p->M * ceil_div(D, threads * 8);
    if (ctas > INT_MAX) { fatal("sparse FFN: %ld CTAs for down / df exceed int32", ctas); }
    sparse_gather_kernel<<<(unsigned)ctas, threads, 0, main_stream>>>(out, *p, a, A, b, B, D);
    cudaCheck(cudaGetLastError());
}

void sparse_down(bf16* y, const SparsePattern<bf16>* p, const bf16* wdT, int D) {
    sparse_gather(y, p, (const bf16*)NULL, wdT, (const bf16*)NULL, (const bf16*)NULL, D);
}

void sparse_df(bf16* df, const SparsePattern<bf16>* p, const bf16* du, const bf16* dg, const bf16* wu, const bf16* wg, int D) {
    sparse_gather(df, p, du, wu, dg, wg, D);
}

// ----------------------------------------------------------------------------
// the transposed pattern: per block of SPARSE_ROW_BLOCK rows a histogram of
// units (shared memory), one scan over [unit, block] (unit-major), then each
// block's warps fill their rows in order, so a unit's tokens come out sorted.

__global__ void sparse_unit_count_kernel(int* block_counts, SparsePattern<bf16> p, int blocks) {
    extern __shared__ int s_hist[];
    for (int n = threadIdx.x; n < p.H; n += blockDim.x) { s_hist[n] = 0; }
    __syncthreads();
    const int lane = threadIdx.x % 32;
    for (int r = threadIdx.x / 32; r < SPARSE_ROW_BLOCK; r += blockDim.x / 32) {
        int m = blockIdx.x * SPARSE_ROW_BLOCK + r;
        if (m >= p.M || p.tail_slot[m] == SPARSE_ROW_LOST) { continue; }
        size_t e0 = row_base(p, m, p.tail_slot[m]);
        for (int j = lane; j < p.count[m]; j += 32) { atomicAdd(&s_hist[p.unit[e0 + j]], 1); }
    }
    __syncthreads();
    for (int n = threadIdx.x; n < p.H; n += blockDim.x) { block_counts[(size_t)n * blocks + blockIdx.x] = s_hist[n]; }
}

// Warp w fills rows [w R, (w + 1) R) of the block (R = SPARSE_ROW_BLOCK / warps), so a
// block of busy rows (the realistic pattern's first 1%) is walked by all warps,
// not one. A unit's place among the block's tokens is its block offset plus the
// tokens of the warps before (a byte per warp and unit: at most R <= 255).
constexpr int SPARSE_FILL_WARPS = 8;
constexpr int SPARSE_FILL_ROWS = SPARSE_ROW_BLOCK / SPARSE_FILL_WARPS;
static_assert(SPARSE_FILL_ROWS * SPARSE_FILL_WARPS == SPARSE_ROW_BLOCK && SPARSE_FILL_ROWS < 256, "fill rows");

static inline size_t sparse_fill_smem(int H) { return (size_t)H * (sizeof(int) + SPARSE_FILL_WARPS); }

__global__ void __launch_bounds__(SPARSE_FILL_WARPS * 32)
    sparse_unit_fill_kernel(SparseTransposed t, SparsePattern<bf16> p, const int* block_counts,
                            const int* block_offsets, int blocks) {
    extern __shared__ int s_base[];                                    // [H] the block's first position per unit
    uint8_t* s_cursor = (uint8_t*)(s_base + p.H);                      // [warps][H] the warp's place per unit
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int n = threadIdx.x; n < p.H; n += blockDim.x) {
        s_base[n] = block_offsets[(size_t)n * blocks + blockIdx.x];
        if (blockIdx.x == 0) { t.unit_start[n] = s_base[n]; }
        for (int w = 0; w < SPARSE_FILL_WARPS; w++) { s_cursor[w * p.H + n] = 0; }
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        size_t last = (size_t)p.H * blocks - 1;
        t.unit_start[p.H] = block_offsets[last] + block_counts[last];
    }
    __syncthreads();
    const int first = blockIdx.x * SPARSE_ROW_BLOCK + warp * SPARSE_FILL_ROWS;
    const int last = min(first + SPARSE_FILL_ROWS, p.M);
    uint8_t* cursor = s_cursor + warp * p.H;
    // the units of a row are distinct, so the lanes never share a byte's update
    for (int m = first; m < last; m++) {
        if (p.tail_slot[m] == SPARSE_ROW_LOST) { continue; }
        size_t e0 = row_base(p, m, p.tail_slot[m]);
        for (int j = lane; j < p.count[m]; j += 32) { cursor[p.unit[e0 + j]]++; }
        __syncwarp();
    }
    __syncthreads();
    for (int n = threadIdx.x; n < p.H; n += blockDim.x) {
        int before = 0;
        for (int w = 0; w < SPARSE_FILL_WARPS; w++) {
            int c = s_cursor[w * p.H + n];
            s_cursor[w * p.H + n] = (uint8_t)before;
            before += c;
        }
    }
    __syncthreads();
    for (int m = first; m < last; m++) {
        if (p.tail_slot[m] == SPARSE_ROW_LOST) { continue; }
        size_t e0 = row_base(p, m, p.tail_slot[m]);
        for (int j = lane; j < p.count[m]; j += 32) {
            int n = p.unit[e0 + j];
            int pos = s_base[n] + cursor[n]++;
            t.token[pos] = m;
            t.entry[pos] = (int)(e0 + j);
        }
        __syncwarp();
    }
}

static inline int sparse_row_blocks(int M) { return ceil_div(M, SPARSE_ROW_BLOCK); }

void sparse_transpose(SparseTransposed* t, const SparsePattern<bf16>* p, SparseScratch* s) {
    if (p->H > t->max_units) { fatal("sparse_transpose: %d units, the buffers hold %d", p->H, t->max_units); }
    t->H = p->H;
    const int blocks = sparse_row_blocks(p->M);
    const size_t count_smem = (size_t)p->H * sizeof(int), fill_smem = sparse_fill_smem(p->H);
    cudaCheck(cudaFuncSetAttribute(sparse_unit_count_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)count_smem));
    cudaCheck(cudaFuncSetAttribute(sparse_unit_fill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)fill_smem));
    sparse_unit_count_kernel<<<blocks, 256, count_smem, main_stream>>>(s->block_counts, *p, blocks);
    cudaCheck(cudaGetLastError());
    cudaCheck(cub::DeviceScan::ExclusiveSum(s->scan_temp, s->scan_temp_bytes, s->block_counts, s->block_offsets,
                                            p->H * blocks, main_stream));
    sparse_unit_fill_kernel<<<blocks, SPARSE_FILL_WARPS * 32, fill_smem, main_stream>>>(*t, *p, s->block_counts,
                                                                                        s->block_offsets, blocks);
    cudaCheck(cudaGetLastError());
}

__global__ void sparse_unit_count_add_kernel(uint32_t* count, const int* unit_start, int H) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < H) { count[n] += (uint32_t)(unit_start[n + 1] - unit_start[n]); }
}

void sparse_unit_count_add(uint32_t* count, const SparsePattern<bf16>* p, const SparseTransposed* t) {
    sparse_unit_count_add_kernel<<<ceil_div(p->H, 256), 256, 0, main_stream>>>(count, t->unit_start, p->H);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------
// dh and the weight gradients, unit-major over the transposed pattern (a unit's
// entries, tokens in order), per slice of WGRAD_SLICE = 256 columns, lane l
// taking columns 8l..8l+7, in two passes that each gather one row per entry:
//   dy pass  per unit n and slice, WdT[n]'s columns held in registers for the whole unit; per
//            entry (token m): dWdT[n] += h dy_m, and the entry's dot dy_m . WdT[n] over the
//            slice stored in dots[slice][i] (i: the entry's place in the transposed pattern)
//   finish   per entry: d = its dots added in slice order + l1_scale sign(h), du = d g, dg = d u,
//            stored at the entry (for df) and as a bf16 pair in dots[0][i] (for the f pass)
//   f pass   per unit n and slice, per entry: dWu[n] += du f_m, dWg[n] += dg f_m
// Slices outermost, so that the CTAs at work gather from one slice of dy or f
// (8 MB at M 16384): L2 holds it, where whole rows (64 MB each) would come from
// memory. That is why dh is not finished inside one kernel over all of D: a
// unit's du and dg need the whole of each dot before its first f_m is used.
// Both passes share the split of the work:
// - a unit with at most WGRAD_HOT entries (at k = 30 a unit has ~90): one warp,
//   8 units per CTA, the units in decreasing count (a counting sort), so that a
//   CTA's warps finish together however uneven the units are, biggest first;
//   the lanes load 32 entries at a time and pass them round by shuffles, so no
//   warp waits on another;
// - a hot unit (one that fires in many tokens, as the realistic pattern's do):
//   CTAs of 8 warps, one per part of SPARSE_HOT_PART entries (the warps take
//   every 8th entry; their sums added in warp order), the parts' sums added in
//   part order by the CTA that finishes the unit's last part. A unit whose parts
//   find no free slot for their sums has them all summed by one CTA, in the
//   same order: the same bits either way. The items are listed first (in any
//   order: a unit's sums do not depend on where they are computed), and both
//   kinds of CTA are one launch, so that a slice's CTAs run together.
// One warp per unit everywhere made the hot units a long tail; 8 warps
// everywhere spent more on the cross-warp sum than it saved; a CTA per hot unit
// left the busiest (thousands of entries) as the tail (dev/NOTES.md).

constexpr int WGRAD_WARPS = 8;
constexpr int WGRAD_SLICE = SPARSE_WGRAD_SLICE;
constexpr int WGRAD_HOT = 128;        // entries above which a unit gets CTAs
// CTAs per slice that share the hot items: enough to fill the GPU with one
// slice (fewer let the CTAs at work spread over several slices, more than L2 holds)
constexpr int WGRAD_HOT_CTAS = 1024;
static_assert(SPARSE_HOT_PART % SPARSE_STAGE == 0, "a part is whole stages");

enum { WGRAD_DY, WGRAD_F }; // the two passes

// what a pass gathers and adds to
struct WgradPass {
    float* grad[2];  // the dy pass: dWdT; the f pass: dWu, dWg
    const bf16* x;   // the gathered rows [M, D]: dy or f
    const bf16* wdT; // the dy pass's WdT [H, D]
    int D;
};

template <int PASS> constexpr int WGRAD_GRADS = PASS == WGRAD_DY ? 1 : 2; // the gradients a pass adds to

// h_e = bf16(g_e u_e), as the dense path rounds h
__device__ __forceinline__ float entry_h(const SparsePattern<bf16>& p, int e) {
    return __bfloat162float(__float2bfloat16_rn(__bfloat162float(p.g[e]) * __bfloat162float(p.u[e])));
}

// an entry's (du, dg) as one word, du in the low half (bf16 bits), and back
__device__ __forceinline__ uint32_t pack_dudg(bf16 du, bf16 dg) {
    return (uint32_t)__bfloat16_as_ushort(du) | (uint32_t)__bfloat16_as_ushort(dg) << 16;
}
__device__ __forceinline__ float unpack_du(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float unpack_dg(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// the sum over the warp of each of v[0..3], lanes 8q..8q+7 returning v[q]'s: a
// reduce-scatter, 6 shuffles where a butterfly per value would take 20
__device__ __forceinline__ float warp_sum4(const float (&v)[4]) {
    const int lane = threadIdx.x % 32;
    const bool b4 = lane & 16, b3 = lane & 8;
    float a[2];
    #pragma unroll
    for (int i = 0; i < 2; i++) { // lanes 0-15 keep the sums of v[0..1], lanes 16-31 those of v[2..3]
        a[i] = (b4 ? v[2 + i] : v[i]) + __shfl_xor_sync(0xffffffffu, b4 ? v[i] : v[2 + i], 16);
    }
    float c = (b3 ? a[1] : a[0]) + __shfl_xor_sync(0xffffffffu, b3 ? a[0] : a[1], 8);
    c += __shfl_xor_sync(0xffffffffu, c, 4);
    c += __shfl_xor_sync(0xffffffffu, c, 2);
    return c + __shfl_xor_sync(0xffffffffu, c, 1);
}

// the dy pass on WGRAD_DY_GROUP = 4 entries of a unit, the first nq real:
// entry(q, token, h) gives entry q's token, whose dy row is read at the lane's
// columns (col), and its h (for q >= nq, those of a real entry, h unused);
// acc += h dy there, and the dots of the rows with w (WdT[n] at the same
// columns), summed over the warp as warp_sum4 returns them. Every lane takes
// part (in_d: its columns are inside D). Groups of 8 spilled registers at the
// 64 that 4 CTAs per SM leave.
constexpr int WGRAD_DY_GROUP = 4;
template <typename Entry>
__device__ __forceinline__ float wgrad_dy_entries(float (&acc)[8], const float (&w)[8], const bf16* dy, int D, int col,
                                                  int nq, bool in_d, Entry entry) {
    Bf16x8 v[WGRAD_DY_GROUP] = {};
    float h[WGRAD_DY_GROUP], dot[WGRAD_DY_GROUP];
    #pragma unroll
    for (int q = 0; q < WGRAD_DY_GROUP; q++) {
        int token;
        entry(q, token, h[q]);
        if (in_d) { v[q] = load_bf16x8(dy + (size_t)token * D + col); }
    }
    #pragma unroll
    for (int q = 0; q < WGRAD_DY_GROUP; q++) {
        dot[q] = 0.0f;
        #pragma unroll
        for (int k = 0; k < 8; k++) {
            float x = __bfloat162float(v[q].v[k]);
            dot[q] += w[k] * x;
            if (q < nq) { acc[k] += h[q] * x; }
        }
    }
    return warp_sum4(dot);
}

// the f pass on one entry: acc += du f, dg f at the lane's columns (one f load for both)
__device__ __forceinline__ void wgrad_f_add(float (&acc)[2][8], const bf16* f_row, float du, float dg) {
    Bf16x8 fv = load_bf16x8(f_row);
    #pragma unroll
    for (int k = 0; k < 8; k++) {
        float fk = __bfloat162float(fv.v[k]);
        acc[0][k] += du * fk;
        acc[1][k] += dg * fk;
    }
}

// WdT[n] at the lane's columns (zero outside D)
__device__ __forceinline__ void wgrad_load_w(float (&w)[8], const WgradPass& a, int n, int col) {
    if (col >= a.D) { return; }
    Bf16x8 v = load_bf16x8(a.wdT + (size_t)n * a.D + col);
    #pragma unroll
    for (int k = 0; k < 8; k++) { w[k] = __bfloat162float(v.v[k]); }
}

// the gradients += the sums, 8 columns from col
template <int R>
__device__ __forceinline__ void wgrad_store(const WgradPass& a, const float (&acc)[R][8], int n, int col) {
    #pragma unroll
    for (int r = 0; r < R; r++) {
        float* out = a.grad[r] + (size_t)n * a.D + col;
        #pragma unroll
        for (int k = 0; k < 8; k++) { out[k] += acc[r][k]; }
    }
}

// The work lists, one CTA of WGRAD_LIST_THREADS: the units of 1..WGRAD_HOT
// entries in decreasing count (ties in any order), and the hot units' items:
// one per part where the unit's parts get slots for their sums, else one for
// the whole unit (part -1)
constexpr int WGRAD_LIST_THREADS = 1024;
__global__ void __launch_bounds__(WGRAD_LIST_THREADS) sparse_wgrad_lists_kernel(SparseTransposed t) {
    __shared__ int s_place[WGRAD_HOT + 1]; // per count: its units, then the next place for one
    int *warp_units = t.hot + 3, *items = t.hot + 3 + t.H;
    for (int c = threadIdx.x; c <= WGRAD_HOT; c += blockDim.x) { s_place[c] = 0; }
    __syncthreads();
    for (int n = threadIdx.x; n < t.H; n += blockDim.x) {
        const int count = t.unit_start[n + 1] - t.unit_start[n];
        if (count == 0) { continue; }
        if (count <= WGRAD_HOT) { atomicAdd(&s_place[count], 1); continue; }
        const int parts = (count + SPARSE_HOT_PART - 1) / SPARSE_HOT_PART;
        int slot = -1;
        if (parts > 1) {
            slot = atomicAdd(&t.hot[1], parts);
            if (slot + parts > SPARSE_PART_SLOTS) { slot = -1; }
        }
        const int n_items = slot < 0 ? 1 : parts;
        int* item = items + 4 * (size_t)atomicAdd(&t.hot[0], n_items);
        for (int i = 0; i < n_items; i++, item += 4) {
            item[0] = n, item[1] = slot < 0 ? -1 : i, item[2] = parts, item[3] = slot;
        }
    }
    __syncthreads();
    if (threadIdx.x < 32) { // counts WGRAD_HOT down to 1: lane l sums its run of them, then a prefix over the lanes
        constexpr int RUN = (WGRAD_HOT + 31) / 32;
        const int lane = threadIdx.x, top = WGRAD_HOT - lane * RUN;
        int sum = 0;
        for (int c = top; c > top - RUN && c >= 1; c--) { sum += s_place[c]; }
        int place = warp_inclusive_sum(sum) - sum;
        for (int c = top; c > top - RUN && c >= 1; c--) {
            int units = s_place[c];
            s_place[c] = place;
            place += units;
        }
        if (lane == 31) { t.hot[2] = place; }
    }
    __syncthreads();
    for (int n = threadIdx.x; n < t.H; n += blockDim.x) {
        const int count = t.unit_start[n + 1] - t.unit_start[n];
        if (count >= 1 && count <= WGRAD_HOT) { warp_units[atomicAdd(&s_place[count], 1)] = n; }
    }
}

// the dy pass, one warp: unit n over its entries [start, end)
__device__ __forceinline__ void wgrad_dy_warp_unit(const WgradPass& a, const SparsePattern<bf16>& p,
                                                   const SparseTransposed& t, int n, int start, int end) {
    const int lane = threadIdx.x % 32, col = blockIdx.y * WGRAD_SLICE + lane * 8;
    const bool in_d = col < a.D;
    float* dots = t.dots + (size_t)blockIdx.y * t.capacity;
    float w[8] = {}, acc[1][8] = {};
    wgrad_load_w(w, a, n, col);
    for (int i0 = start; i0 < end; i0 += 32) {
        const int cnt = min(32, end - i0);
        int token = 0;
        float h_e = 0.0f;
        if (lane < cnt) {
            token = t.token[i0 + lane];
            h_e = entry_h(p, t.entry[i0 + lane]);
        }
        for (int j0 = 0; j0 < cnt; j0 += WGRAD_DY_GROUP) {
            const int nq = min(WGRAD_DY_GROUP, cnt - j0);
            const float dot = wgrad_dy_entries(acc[0], w, a.x, a.D, col, nq, in_d, [&](int q, int& tok, float& h) {
                const int j = j0 + min(q, nq - 1);
                tok = __shfl_sync(0xffffffffu, token, j);
                h = __shfl_sync(0xffffffffu, h_e, j);
            });
            if (lane % 8 == 0 && lane / 8 < nq) { dots[i0 + j0 + lane / 8] = dot; }
        }
    }
    if (in_d) { wgrad_store<1>(a, acc, n, col); }
}

// the f pass, one warp: unit n over its entries [start, end)
__device__ __forceinline__ void wgrad_f_warp_unit(const WgradPass& a, const SparseTransposed& t, int n, int start,
                                                  int end) {
    const int lane = threadIdx.x % 32, col = blockIdx.y * WGRAD_SLICE + lane * 8;
    const uint32_t* dudg = reinterpret_cast<const uint32_t*>(t.dots);
    float acc[2][8] = {};
    for (int i0 = start; i0 < end; i0 += 32) {
        const int cnt = min(32, end - i0);
        int token = 0;
        uint32_t pair = 0;
        if (lane < cnt) {
            token = t.token[i0 + lane];
            pair = dudg[i0 + lane];
        }
        #pragma unroll 4
        for (int j = 0; j < cnt; j++) {
            size_t row = (size_t)__shfl_sync(0xffffffffu, token, j) * a.D + col;
            uint32_t pj = __shfl_sync(0xffffffffu, pair, j);
            if (col < a.D) { wgrad_f_add(acc, a.x + row, unpack_du(pj), unpack_dg(pj)); }
        }
    }
    if (col < a.D) { wgrad_store<2>(a, acc, n, col); }
}

// total[r][col] += the pass's sums over entries [start, end) of unit n, for
// warp 0's columns (lane: 8 of the slice); the warps take every 8th entry of
// each stage (the dy pass 4 of them at a time: i, i + 8, i + 16, i + 24), and
// their sums are added in warp order
template <int PASS>
__device__ void wgrad_part(float (*total)[WGRAD_SLICE], const WgradPass& a, const SparsePattern<bf16>& p,
                           const SparseTransposed& t, int n, int start, int end) {
    constexpr int R = WGRAD_GRADS<PASS>;
    __shared__ int s_token[SPARSE_STAGE];
    __shared__ float s_a[SPARSE_STAGE], s_b[SPARSE_STAGE]; // the dy pass: h; the f pass: du, dg
    __shared__ float s_sum[WGRAD_WARPS - 1][R][WGRAD_SLICE];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, col = blockIdx.y * WGRAD_SLICE + lane * 8;
    const bool in_d = col < a.D;
    const uint32_t* dudg = reinterpret_cast<const uint32_t*>(t.dots);
    float w[8] = {}, acc[R][8] = {};
    if (PASS == WGRAD_DY) { wgrad_load_w(w, a, n, col); }
    for (int i0 = start; i0 < end; i0 += SPARSE_STAGE) {
        int cnt = min(SPARSE_STAGE, end - i0);
        __syncthreads(); // the last stage (or part) is done with the staged entries
        for (int i = threadIdx.x; i < cnt; i += blockDim.x) {
            s_token[i] = t.token[i0 + i];
            if (PASS == WGRAD_DY) {
                s_a[i] = entry_h(p, t.entry[i0 + i]);
            } else {
                uint32_t pair = dudg[i0 + i];
                s_a[i] = unpack_du(pair);
                s_b[i] = unpack_dg(pair);
            }
        }
        __syncthreads();
        if constexpr (PASS == WGRAD_DY) {
            float* dots = t.dots + (size_t)blockIdx.y * t.capacity + i0;
            for (int i1 = warp; i1 < cnt; i1 += WGRAD_DY_GROUP * WGRAD_WARPS) {
                const int nq = min(WGRAD_DY_GROUP, (cnt - i1 + WGRAD_WARPS - 1) / WGRAD_WARPS); // i1 + 8q in the stage
                const float dot = wgrad_dy_entries(acc[0], w, a.x, a.D, col, nq, in_d, [&](int q, int& tok, float& h) {
                    const int i = i1 + WGRAD_WARPS * min(q, nq - 1);
                    tok = s_token[i];
                    h = s_a[i];
                });
                if (lane % 8 == 0 && lane / 8 < nq) { dots[i1 + WGRAD_WARPS * (lane / 8)] = dot; }
            }
        } else if (in_d) {
            #pragma unroll 4
            for (int i = warp; i < cnt; i += WGRAD_WARPS) {
                wgrad_f_add(acc, a.x + (size_t)s_token[i] * a.D + col, s_a[i], s_b[i]);
            }
        }
    }
    if (warp > 0) {
        for (int r = 0; r < R; r++) {
            for (int k = 0; k < 8; k++) { s_sum[warp - 1][r][lane * 8 + k] = acc[r][k]; }
        }
    }
    __syncthreads();
    if (warp == 0) {
        for (int r = 0; r < R; r++) {
            for (int k = 0; k < 8; k++) {
                float v = acc[r][k];
                for (int w = 0; w < WGRAD_WARPS - 1; w++) { v += s_sum[w][r][lane * 8 + k]; }
                total[r][lane * 8 + k] += v;
            }
        }
    }
    __syncthreads(); // s_sum has been read
}

// the hot items, a CTA each: CTA c of the hot ones takes items c, c + WGRAD_HOT_CTAS, ...
template <int PASS>
__device__ __forceinline__ void wgrad_hot(const WgradPass& a, const SparsePattern<bf16>& p, const SparseTransposed& t,
                                          int c) {
    constexpr int R = WGRAD_GRADS<PASS>;
    __shared__ float s_total[R][WGRAD_SLICE]; // warp 0's, a lane's 8 columns
    const int lane = threadIdx.x % 32, col = blockIdx.y * WGRAD_SLICE + lane * 8;
    for (int it = c; it < t.hot[0]; it += WGRAD_HOT_CTAS) {
        const int* item = t.hot + 3 + t.H + 4 * (size_t)it;
        const int n = item[0], part = item[1], parts = item[2], slot = item[3];
        const int start = t.unit_start[n], end = t.unit_start[n + 1];
        if (threadIdx.x < 32) {
            for (int r = 0; r < R; r++) {
                for (int k = 0; k < 8; k++) { s_total[r][lane * 8 + k] = 0.0f; }
            }
        }
        const int first_part = part < 0 ? 0 : part, end_part = part < 0 ? parts : part + 1; // all, or this one
        for (int q = first_part; q < end_part; q++) {
            int i = start + q * SPARSE_HOT_PART;
            wgrad_part<PASS>(s_total, a, p, t, n, i, min(i + SPARSE_HOT_PART, end));
        }
        bool last = true;
        if (part >= 0) { // the part's sums out; the unit's last part to finish adds them all in order
            float* mine = t.part_sums + (size_t)(slot + part) * 2 * a.D;
            if (threadIdx.x < 32 && col < a.D) {
                for (int r = 0; r < R; r++) {
                    for (int k = 0; k < 8; k++) { mine[(size_t)r * a.D + col + k] = s_total[r][lane * 8 + k]; }
                }
            }
            last = block_arrives_last(t.part_arrivals + (size_t)slot * gridDim.y + blockIdx.y, parts);
            if (last && threadIdx.x < 32 && col < a.D) {
                for (int r = 0; r < R; r++) {
                    for (int k = 0; k < 8; k++) {
                        float v = 0.0f;
                        for (int q = 0; q < parts; q++) {
                            v += __ldcg(t.part_sums + ((size_t)(slot + q) * 2 + r) * a.D + col + k);
                        }
                        s_total[r][lane * 8 + k] = v;
                    }
                }
            }
        }
        if (last && threadIdx.x < 32 && col < a.D) { // warp 0: the gradients += the total
            float acc[R][8];
            for (int r = 0; r < R; r++) {
                for (int k = 0; k < 8; k++) { acc[r][k] = s_total[r][lane * 8 + k]; }
            }
            wgrad_store<R>(a, acc, n, col);
        }
    }
}

// one launch per pass for both kinds of CTA, so that the CTAs of one slice, warp
// units first (warp w of CTA b takes the (8 b + w)-th unit of the list), then
// hot items, run together
template <int PASS>
__global__ void __launch_bounds__(WGRAD_WARPS * 32, 4)
    sparse_wgrad_kernel(WgradPass a, SparsePattern<bf16> p, SparseTransposed t) {
    const int warp_ctas = (p.H + WGRAD_WARPS - 1) / WGRAD_WARPS;
    if ((int)blockIdx.x >= warp_ctas) {
        wgrad_hot<PASS>(a, p, t, blockIdx.x - warp_ctas);
        return;
    }
    const int i = blockIdx.x * WGRAD_WARPS + threadIdx.x / 32;
    if (i >= t.hot[2]) { return; }
    const int n = t.hot[3 + i], start = t.unit_start[n], end = t.unit_start[n + 1];
    if (PASS == WGRAD_DY) {
        wgrad_dy_warp_unit(a, p, t, n, start, end);
    } else {
        wgrad_f_warp_unit(a, t, n, start, end);
    }
}

// per entry i of the transposed pattern, a thread: d = its dots added in slice
// order + l1_scale sign(h), du = d g and dg = d u at the entry, and the pair into
// dots[0][i], the f pass's (that row of dots is read first, by this thread only)
__global__ void sparse_dh_finish_kernel(bf16* du, bf16* dg, SparsePattern<bf16> p, SparseTransposed t, float l1_scale,
                                        int slices) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= t.unit_start[t.H]) { return; }
    float d = 0.0f;
    for (int s = 0; s < slices; s++) { d += t.dots[(size_t)s * t.capacity + i]; }
    const int e = t.entry[i];
    const float gv = __bfloat162float(p.g[e]), uv = __bfloat162float(p.u[e]), h = entry_h(p, e);
    d += l1_scale * (h > 0.0f ? 1.0f : (h < 0.0f ? -1.0f : 0.0f));
    const bf16 du_e = __float2bfloat16_rn(d * gv), dg_e = __float2bfloat16_rn(d * uv);
    du[e] = du_e;
    dg[e] = dg_e;
    reinterpret_cast<uint32_t*>(t.dots)[i] = pack_dudg(du_e, dg_e);
}

void sparse_dh_weight_grads(bf16* du, bf16* dg, float* dwu, float* dwg, float* dwdT, const SparsePattern<bf16>* p,
                            const SparseTransposed* t, const bf16* f, const bf16* dy, const bf16* wdT, float l1_scale,
                            int D) {
    if (D % 8 != 0) { fatal("sparse_dh_weight_grads: D %d must be a multiple of 8 on the GPU", D); }
    cudaCheck(cudaMemsetAsync(t->hot, 0, 2 * sizeof(int), main_stream));
    sparse_wgrad_lists_kernel<<<1, WGRAD_LIST_THREADS, 0, main_stream>>>(*t);
    cudaCheck(cudaGetLastError());
    const int slices = ceil_div(D, WGRAD_SLICE);
    dim3 grid(ceil_div(p->H, WGRAD_WARPS) + WGRAD_HOT_CTAS, slices);
    WgradPass dy_pass = {{dwdT, NULL}, dy, wdT, D}, f_pass = {{dwu, dwg}, f, NULL, D};
    sparse_wgrad_kernel<WGRAD_DY><<<grid, WGRAD_WARPS * 32, 0, main_stream>>>(dy_pass, *p, *t);
    cudaCheck(cudaGetLastError());
    sparse_dh_finish_kernel<<<ceil_div((int)t->capacity, 256), 256, 0, main_stream>>>(du, dg, *p, *t, l1_scale, slices);
    cudaCheck(cudaGetLastError());
    sparse_wgrad_kernel<WGRAD_F><<<grid, WGRAD_WARPS * 32, 0, main_stream>>>(f_pass, *p, *t);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------
// scratch

// the bytes of the fused gate's words for M rows of H units, rounded up to 256 (the records after them in lent
// memory start aligned for their 16-byte accesses)
static inline size_t sparse_gate_words_bytes(int M, int H) {
    const size_t bytes = (size_t)M * ceil_div(H, TWELL_TILE) * (TWELL_SLOTS + 1) * sizeof(uint32_t);
    return (bytes + 255) / 256 * 256;
}

// spare (may be NULL): spare_bytes of device memory nothing uses while the
// gate runs (llmc/gpt.h lends the backward's d_qkv), where the fused gate's
// words go when they fit, instead of an allocation of their own, and its
// records in the rest. records_needed (a device int, or NULL): where the gate
// reports the records it asked for; without it the records have room for every
// tile, with it they start with the spare's rest (sparse_scratch_grow_records)
static inline void sparse_scratch_alloc_cuda(SparseScratch* s, int M, int H, void* spare = NULL, size_t spare_bytes = 0,
                                             int* records_needed = NULL) {
    memset(s, 0, sizeof(*s));
    const int blocks = sparse_row_blocks(M);
    size_t n = (size_t)H * blocks;
    if (n > INT_MAX) { fatal("sparse scratch: %zu unit blocks exceed int32", n); }
    s->row_flag = (int*)cuda_malloc(M * sizeof(int));
    s->row_prefix = (int*)cuda_malloc(M * sizeof(int));
    s->block_counts = (int*)cuda_malloc(n * sizeof(int));
    s->block_offsets = (int*)cuda_malloc(n * sizeof(int));
    size_t a = 0, b = 0;
    cudaCheck(cub::DeviceScan::ExclusiveSum(NULL, a, s->row_flag, s->row_prefix, M, main_stream));
    cudaCheck(cub::DeviceScan::ExclusiveSum(NULL, b, s->block_counts, s->block_offsets, (int)n, main_stream));
    s->scan_temp_bytes = a > b ? a : b;
    s->scan_temp = cuda_malloc(s->scan_temp_bytes);
    if (device_has_wgmma()) { // the fused gate's buffers
        const size_t tiles = (size_t)M * ceil_div(H, TWELL_TILE), record_bytes = TWELL_TILE * sizeof(uint16_t);
        const size_t word_bytes = sparse_gate_words_bytes(M, H);
        if (tiles > INT_MAX) { fatal("sparse scratch: %zu gate tiles exceed int32", tiles); }
        s->gate_words_owned = spare == NULL || spare_bytes < word_bytes;
        s->gate_words = s->gate_words_owned ? (uint32_t*)cuda_malloc(word_bytes) : (uint32_t*)spare;
        s->gate_counters = (unsigned long long*)cuda_malloc(twell_counter_bytes());
        s->records_needed = records_needed;
        size_t rest = s->gate_words_owned || records_needed == NULL ? 0 : (spare_bytes - word_bytes) / record_bytes;
        s->gate_records_owned = rest == 0;
        s->record_capacity = (int)(s->gate_records_owned ? tiles : rest < tiles ? rest : tiles);
        s->gate_records = s->gate_records_owned ? (uint16_t*)cuda_malloc(tiles * record_bytes)
                                                : (uint16_t*)((char*)spare + word_bytes);
    }
}

// room for `needed` records (and a quarter more, at most every tile's) in a buffer of the scratch's own
static inline void sparse_scratch_grow_records(SparseScratch* s, int M, int H, int needed) {
    const long tiles = (long)M * ceil_div(H, TWELL_TILE), want = (long)needed + needed / 4 + 64;
    if (s->gate_records_owned) { cuda_free(s->gate_records); }
    s->record_capacity = (int)(want < tiles ? want : tiles);
    s->gate_records = (uint16_t*)cuda_malloc((size_t)s->record_capacity * TWELL_TILE * sizeof(uint16_t));
    s->gate_records_owned = 1;
}

static inline void sparse_scratch_free_cuda(SparseScratch* s) {
    cuda_free(s->row_flag);
    cuda_free(s->row_prefix);
    cuda_free(s->block_counts);
    cuda_free(s->block_offsets);
    cuda_free(s->scan_temp);
    if (s->gate_words_owned) { cuda_free(s->gate_words); }
    cuda_free(s->gate_counters);
    if (s->gate_records_owned) { cuda_free(s->gate_records); }
    memset(s, 0, sizeof(*s));
}

#endif // LLMC_FFN_CUDA_ELL_CUH
