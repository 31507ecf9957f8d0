/*
 The hybrid sparse format of the FFN activations for training, and the CPU
 reference of every sparse FFN kernel (the GPU ones are in llmc/ffn/cuda_ell.cuh,
 with the same signatures for T = bf16, G = float). Plain C++: the CPU tests
 build it with the sanitizers.

 One gated FFN layer, M token rows f_m of width D, H hidden units (WdT [H, D] is
 W_d transposed: row n holds unit n's down weights). With P = {(m, n) : g_mn > 0}:
     forward    g = f Wg^T (dense), then only on P:  u_mn = f_m . Wu[n],
                h_mn = g_mn u_mn,  y_m = sum_n h_mn WdT[n],  l1_m = sum_n |h_mn|
     backward   d_mn = dy_m . WdT[n] + l1_scale sign(h_mn),  du_mn = d_mn g_mn,  dg_mn = d_mn u_mn,
                df_m = sum_n du_mn Wu[n] + dg_mn Wg[n],
                dWu[n] += sum_m du_mn f_m,  dWg[n] += sum_m dg_mn f_m,  dWdT[n] += sum_m h_mn dy_m
 All six products run over P only; the dense g is needed only while packing.

 The pattern P with its values (what the backward keeps): per row m its true
 count c_m and its entries (unit, g, u) in increasing unit order, stored
     c_m <= W    in the ELL part: entries m W .. m W + c_m - 1
     c_m > W     in the tail: a slot s of H entries, at M W + s H (tail_slot[m] = s)
 Tail slots go to the overflowing rows in row order. A row past the tail's
 capacity is SPARSE_ROW_LOST: nothing of it is stored, every output of it
 (y, l1, df) is NaN, never silently wrong, and tail_used counts every row that
 asked for a slot, so the caller sees how many it needed, grows the tail and
 redoes the forward.

 The transposed pattern, for dh and the weight gradients: per unit n the
 entries that hold it, in increasing token order: token[i] and entry[i] for i
 in unit_start[n] .. unit_start[n + 1] - 1 (int32: no 16-bit token limit).
*/
#ifndef LLMC_FFN_ELL_H
#define LLMC_FFN_ELL_H

#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "llmc/memory.h"
#include "llmc/utils.h"

#define SPARSE_ROW_LOST (-2)

// the helpers the GPU shares with this file are host and device functions under nvcc
#ifdef __CUDACC__
#define SPARSE_HD __host__ __device__
#else
#define SPARSE_HD
#endif

template <typename T>
struct SparsePattern {
    int M, H, W;       // rows, units, ELL width
    int tail_capacity; // rows the tail holds
    int* count;        // [M] units with g > 0
    int* tail_slot;    // [M] -1 (ELL part), the tail slot, or SPARSE_ROW_LOST
    int* tail_row;     // [tail_capacity] the row in each tail slot (those below tail_used)
    int* tail_used;    // [1] rows that asked for a tail slot (may exceed the capacity); the caller's
    uint16_t* unit;    // [entries] hidden unit of each entry
    T* g;              // [entries] g at the entry (> 0)
    T* u;              // [entries] u at the entry
};

// The GPU's weight gradients sum a unit with many entries in parts of
// SPARSE_HOT_PART entries, each part a CTA of its own where a slot for its sums
// is free (SPARSE_PART_SLOTS of them), so one busy unit does not hold a CTA for
// the kernel's length; per slice of SPARSE_WGRAD_SLICE columns
constexpr int SPARSE_HOT_PART = 1024, SPARSE_PART_SLOTS = 256, SPARSE_WGRAD_SLICE = 256;

typedef struct {
    int H;              // units of the pattern last transposed (sparse_transpose sets it)
    int max_units;      // units the buffers hold
    int* unit_start;    // [H + 1]
    int* token;         // [entries]
    int* entry;         // [entries]
    // GPU only (dh and the weight gradients by slices of SPARSE_WGRAD_SLICE columns):
    int* hot;           // [3 + H + 4 (H + SPARSE_PART_SLOTS)]: items, part slots taken, units of a warp,
                        // those units (most entries first), then per item (unit, part or -1 for all,
                        // parts, first slot or -1)
    float* part_sums;   // [SPARSE_PART_SLOTS][2][D] a part's sums until the unit's last part adds them
    int* part_arrivals; // [SPARSE_PART_SLOTS][slices] parts done (0 between launches)
    size_t capacity;    // entries allocated
    float* dots;        // [slices][capacity] per entry i (transposed order) and slice, dy_m . WdT[n] over the
                        // slice; then row 0 holds (du, dg) of entry i as a bf16 pair
} SparseTransposed;

// device scratch of the GPU kernels (the CPU ones need none)
typedef struct {
    int* row_flag;        // [M] count > W
    int* row_prefix;      // [M] exclusive prefix of row_flag
    int* block_counts;    // [H, row blocks] entries per unit and block of rows
    int* block_offsets;   // [H, row blocks] their exclusive prefix, unit-major
    void* scan_temp;      // cub's temporary storage
    size_t scan_temp_bytes;
    // the fused gate's TwELL blocks (GPUs with wgmma; else NULL): [M][ceil(H / 256)][32] words, its
    // counters, and its overflow records (256 values a tile whose row fires more than 31 of its units)
    uint32_t* gate_words;
    int gate_words_owned;            // 0: the words sit in memory lent by the caller
    unsigned long long* gate_counters;
    uint16_t* gate_records;          // [record_capacity][256]
    int record_capacity;
    int gate_records_owned;          // 0: the records sit in the caller's memory after the words
    int* records_needed;             // NULL: the records have room for every tile; else where each gate reports
                                     // (atomicMax) the records it asked for, which may pass record_capacity
} SparseScratch;

static inline size_t sparse_entries(int M, int H, int W, int tail_capacity) {
    return (size_t)M * W + (size_t)tail_capacity * H;
}

// sizing from measured activity: an ELL width of about twice the mean count
// (rows past it go to the tail), and a tail a quarter larger than the rows that
// needed one, so that a step with a few more does not have to be redone
static inline int sparse_choose_width(double mean_active, int H) {
    int W = ((int)(2 * mean_active) + 16 + 15) / 16 * 16;
    return W < H ? W : H;
}

static inline int sparse_choose_tail(int needed, int M) {
    long cap = (long)needed + needed / 4 + 16;
    return cap < M ? (int)cap : M;
}

// the bytes a pattern keeps for the backward
static inline size_t sparse_pattern_bytes(int M, int H, int W, int tail_capacity, size_t value_bytes) {
    return (2 * (size_t)M + tail_capacity + 1) * sizeof(int) + sparse_entries(M, H, W, tail_capacity) * (sizeof(uint16_t) + 2 * value_bytes);
}

// tail_used is the caller's counter (so that one copy can read those of many patterns)
template <typename T>
void sparse_pattern_alloc(SparsePattern<T>* p, int M, int H, int W, int tail_capacity, int* tail_used, Device device) {
    if (M < 1 || H < 1 || H > 65536 || W < 1 || W > H || tail_capacity < 0) {
        fatal("sparse pattern: M %d, H %d (<= 65536), W %d (1..H), tail %d", M, H, W, tail_capacity);
    }
    size_t n = sparse_entries(M, H, W, tail_capacity);
    if (n > INT_MAX) { fatal("sparse pattern: %zu entries exceed the int32 entry index", n); }
    p->M = M, p->H = H, p->W = W, p->tail_capacity = tail_capacity;
    p->count = (int*)device_malloc(M * sizeof(int), device);
    p->tail_slot = (int*)device_malloc(M * sizeof(int), device);
    p->tail_row = (int*)device_malloc(tail_capacity * sizeof(int) + 1, device);
    p->tail_used = tail_used;
    p->unit = (uint16_t*)device_malloc(n * sizeof(uint16_t) + 1, device);
    p->g = (T*)device_malloc(n * sizeof(T) + 1, device);
    p->u = (T*)device_malloc(n * sizeof(T) + 1, device);
}

template <typename T>
void sparse_pattern_free(SparsePattern<T>* p, Device device) {
    device_free(p->count, device);
    device_free(p->tail_slot, device);
    device_free(p->tail_row, device);
    device_free(p->unit, device);
    device_free(p->g, device);
    device_free(p->u, device);
    memset(p, 0, sizeof(*p));
}

static inline void sparse_transposed_alloc(SparseTransposed* t, int H, int D, size_t entries, Device device) {
    memset(t, 0, sizeof(*t));
    t->H = t->max_units = H;
    t->unit_start = (int*)device_malloc((H + 1) * sizeof(int), device);
    t->token = (int*)device_malloc(entries * sizeof(int) + 1, device);
    t->entry = (int*)device_malloc(entries * sizeof(int) + 1, device);
    if (device == DEVICE_CUDA) { // an item per unit, more only for the parts that take slots
        const int slices = (D + SPARSE_WGRAD_SLICE - 1) / SPARSE_WGRAD_SLICE;
        t->hot = (int*)device_malloc((3 + (size_t)H + 4 * ((size_t)H + SPARSE_PART_SLOTS)) * sizeof(int), device);
        t->part_sums = (float*)device_malloc((size_t)SPARSE_PART_SLOTS * 2 * D * sizeof(float), device);
        size_t arrivals = (size_t)SPARSE_PART_SLOTS * slices * sizeof(int);
        t->part_arrivals = (int*)device_malloc(arrivals, device);
        device_zero(t->part_arrivals, arrivals, device);
        t->capacity = entries;
        t->dots = (float*)device_malloc((size_t)slices * entries * sizeof(float) + 1, device);
    }
}

static inline void sparse_transposed_free(SparseTransposed* t, Device device) {
    device_free(t->unit_start, device);
    device_free(t->token, device);
    device_free(t->entry, device);
    device_free(t->hot, device);
    device_free(t->part_sums, device);
    device_free(t->part_arrivals, device);
    device_free(t->dots, device);
    memset(t, 0, sizeof(*t));
}

// the first entry of row m (the row must not be lost)
SPARSE_HD static inline size_t sparse_row_base(int M, int H, int W, int m, int slot) {
    return slot >= 0 ? (size_t)M * W + (size_t)slot * H : (size_t)m * W;
}

// ----------------------------------------------------------------------------
// the CPU reference kernels

// P from the dense gate g [M, H]; row_active[m] = c_m; fired[n] = 1 where unit n
// has an entry (only ever set; may be NULL)
template <typename T>
void sparse_pack(SparsePattern<T>* p, int* row_active, uint8_t* fired, const T* g, SparseScratch* scratch) {
    const int M = p->M, H = p->H, W = p->W;
    int used = 0;
    for (int m = 0; m < M; m++) {
        const T* gm = g + (size_t)m * H;
        int c = 0;
        for (int n = 0; n < H; n++) { c += gm[n] > 0; }
        p->count[m] = row_active[m] = c;
        p->tail_slot[m] = -1;
        if (c > W) {
            int slot = used++;
            p->tail_slot[m] = slot < p->tail_capacity ? slot : SPARSE_ROW_LOST;
            if (slot >= p->tail_capacity) { continue; }
            p->tail_row[slot] = m;
        }
        size_t e = sparse_row_base(M, H, W, m, p->tail_slot[m]);
        for (int n = 0; n < H; n++) {
            if (gm[n] > 0) {
                p->unit[e] = (uint16_t)n;
                p->g[e] = gm[n];
                e++;
                if (fired) { fired[n] = 1; }
            }
        }
    }
    *p->tail_used = used;
}

// the gate product fused with the packing (f [M, D], Wg [H, D]; g [M, H] may be
// used as scratch): where the GPU has such a kernel (llmc/ffn/cuda_ell.cuh);
// false here, and the caller runs the product, then sparse_pack
template <typename T>
bool sparse_gate_pack(SparsePattern<T>* p, int* row_active, uint8_t* fired, T* g, const T* f, const T* wg, int D,
                      SparseScratch* scratch) {
    return false;
}

template <typename T>
static inline T sparse_dot(const T* a, const T* b, int D) {
    T s = 0;
    for (int i = 0; i < D; i++) { s += a[i] * b[i]; }
    return s;
}

// u on P, and l1_m = sum_n |g_mn u_mn| (NaN for a lost row)
template <typename T, typename G>
void sparse_up(SparsePattern<T>* p, G* row_l1, const T* f, const T* wu, int D) {
    const int M = p->M, H = p->H, W = p->W;
    #pragma omp parallel for
    for (int m = 0; m < M; m++) {
        if (p->tail_slot[m] == SPARSE_ROW_LOST) { row_l1[m] = (G)NAN; continue; }
        size_t e = sparse_row_base(M, H, W, m, p->tail_slot[m]);
        G l1 = 0;
        for (int j = 0; j < p->count[m]; j++, e++) {
            p->u[e] = sparse_dot(f + (size_t)m * D, wu + (size_t)p->unit[e] * D, D);
            l1 += fabs(p->g[e] * p->u[e]);
        }
        row_l1[m] = l1;
    }
}

// out_m = sum over row m's entries of a_e A[unit_e] (+ b_e B[unit_e] when B): y (a NULL: a_e = h_e =
// g_e u_e) and df
template <typename T>
static void sparse_gather_rows(T* out, const SparsePattern<T>* p, const T* a, const T* A, const T* b, const T* B, int D) {
    const int M = p->M, H = p->H, W = p->W;
    #pragma omp parallel for
    for (int m = 0; m < M; m++) {
        T* om = out + (size_t)m * D;
        if (p->tail_slot[m] == SPARSE_ROW_LOST) {
            for (int i = 0; i < D; i++) { om[i] = (T)NAN; }
            continue;
        }
        for (int i = 0; i < D; i++) { om[i] = 0; }
        size_t e = sparse_row_base(M, H, W, m, p->tail_slot[m]);
        for (int j = 0; j < p->count[m]; j++, e++) {
            const T* ra = A + (size_t)p->unit[e] * D;
            T ae = a ? a[e] : p->g[e] * p->u[e];
            for (int i = 0; i < D; i++) { om[i] += ae * ra[i]; }
            if (B) {
                const T* rb = B + (size_t)p->unit[e] * D;
                for (int i = 0; i < D; i++) { om[i] += b[e] * rb[i]; }
            }
        }
    }
}

// y = h WdT
template <typename T>
void sparse_down(T* y, const SparsePattern<T>* p, const T* wdT, int D) {
    sparse_gather_rows(y, p, (const T*)NULL, wdT, (const T*)NULL, (const T*)NULL, D);
}

// the transposed pattern: a counting sort of the entries by unit, rows in order
template <typename T>
void sparse_transpose(SparseTransposed* t, const SparsePattern<T>* p, SparseScratch* scratch) {
    const int M = p->M, H = p->H, W = p->W;
    if (H > t->max_units) { fatal("sparse_transpose: %d units, the buffers hold %d", H, t->max_units); }
    t->H = H;
    memset(t->unit_start, 0, (H + 1) * sizeof(int));
    for (int m = 0; m < M; m++) {
        if (p->tail_slot[m] == SPARSE_ROW_LOST) { continue; }
        size_t e = sparse_row_base(M, H, W, m, p->tail_slot[m]);
        for (int j = 0; j < p->count[m]; j++) { t->unit_start[p->unit[e + j] + 1]++; }
    }
    for (int n = 0; n < H; n++) { t->unit_start[n + 1] += t->unit_start[n]; }
    int* cursor = (int*)mallocCheck(H * sizeof(int));
    memcpy(cursor, t->unit_start, H * sizeof(int));
    for (int m = 0; m < M; m++) {
        if (p->tail_slot[m] == SPARSE_ROW_LOST) { continue; }
        size_t e = sparse_row_base(M, H, W, m, p->tail_slot[m]);
        for (int j = 0; j < p->count[m]; j++) {
            int i = cursor[p->unit[e + j]]++;
            t->token[i] = m;
            t->entry[i] = (int)(e + j);
        }
    }
    free(cursor);
}

// count[n] += the entries of unit n in t, the transpose of p: how often each unit fired (the hot/cold
// choice, llmc/ffn/split.h)
template <typename T>
void sparse_unit_count_add(uint32_t* count, const SparsePattern<T>* p, const SparseTransposed* t) {
    for (int n = 0; n < p->H; n++) { count[n] += (uint32_t)(t->unit_start[n + 1] - t->unit_start[n]); }
}

// dh and the weight gradients, unit by unit over the transposed pattern (tokens
// in order), from dy [M, D] (the gradient of y): for each entry of unit n, at token m,
//     d = dy_m . WdT[n] + l1_scale sign(h),  du = d g,  dg = d u  (stored at the entry, for df),
//     dWdT[n] += h dy_m,  dWu[n] += du f_m,  dWg[n] += dg f_m
// so that dy_m serves both dh and dWdT, and f_m both dWu and dWg (llmc/ffn/cuda_ell.cuh)
template <typename T, typename G>
void sparse_dh_weight_grads(T* du, T* dg, G* dwu, G* dwg, G* dwdT, const SparsePattern<T>* p, const SparseTransposed* t,
                            const T* f, const T* dy, const T* wdT, float l1_scale, int D) {
    #pragma omp parallel for
    for (int n = 0; n < p->H; n++) {
        for (int i = t->unit_start[n]; i < t->unit_start[n + 1]; i++) {
            const int e = t->entry[i];
            const T* fm = f + (size_t)t->token[i] * D;
            const T* dym = dy + (size_t)t->token[i] * D;
            T h = p->g[e] * p->u[e];
            T sign = h > 0 ? 1 : (h < 0 ? -1 : 0);
            T d = sparse_dot(dym, wdT + (size_t)n * D, D) + (T)l1_scale * sign;
            du[e] = d * p->g[e];
            dg[e] = d * p->u[e];
            for (int c = 0; c < D; c++) {
                dwdT[(size_t)n * D + c] += h * dym[c];
                dwu[(size_t)n * D + c] += du[e] * fm[c];
                dwg[(size_t)n * D + c] += dg[e] * fm[c];
            }
        }
    }
}

// df = du Wu + dg Wg over the entries
template <typename T>
void sparse_df(T* df, const SparsePattern<T>* p, const T* du, const T* dg, const T* wu, const T* wg, int D) {
    sparse_gather_rows(df, p, du, wu, dg, wg, D);
}

#endif // LLMC_FFN_ELL_H
