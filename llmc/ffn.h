/*
 A sparse FFN layer of training split into hot and cold units, for every
 backend (the kernels are the overloads of llmc/cpu_ops.h, llmc/sparse_ffn.h
 and llmc/cuda_*.cuh).

 The FFN does not depend on the order of its H units: permuting the rows of
 Wg, Wu and WdT together gives the same function. A layer keeps its units in
 an order with the `hot` most active first (llmc/gpt.h chooses them and
 llmc/optimizer.h permutes the weights and their optimizer state), and
     FFN(f) = FFN(f; units [0, hot)) + FFN(f; units [hot, H))
 where the first term is the dense FFN over the hot rows (its products are
 tensor-core GEMMs with N or K = hot) and the second the sparse FFN of
 llmc/sparse_ffn.h over the cold rows (the weight pointers offset by hot rows,
 the pattern's H = H - hot). A unit that fires for a fraction p of the tokens
 costs the dense part a fixed amount per token and the sparse part p times the
 cost of a gathered pair; the hot set is the number of busiest units with the
 least modelled time (FfnCosts, measured on the running device).

 Forward (cold first: its kernels write row_l1, row_active and y; the hot part adds to them):
     cold:  pattern of g over units [hot, H), u on it, y = h_cold WdT[hot:]
     hot:   g_hot = f Wg[:hot]^T, u_hot = f Wu[:hot]^T, h_hot = relu(g_hot) u_hot, y += h_hot WdT[:hot]
            (g_hot and u_hot are kept for the backward, h_hot is recomputed there: a third less memory)
 Backward (dy = dL/dy):
     cold:  dh, du, dg on the pattern with the weight gradients of rows [hot, H) (unit by unit over the
            transposed pattern), then df = du Wu[hot:] + dg Wg[hot:]
     hot:   dh = dy WdT[:hot]^T, dWdT[:hot] += h_hot^T dy, du, dg (relu_gate_backward),
            df += du Wu[:hot] + dg Wg[:hot], dWu[:hot] += du^T f, dWg[:hot] += dg^T f
 and both parts add each unit's firing count over the batch to unit_count[n].
 With hot = 0 this is the sparse FFN of llmc/sparse_ffn.h, with hot = H the dense one.
*/
#ifndef LLMC_FFN_H
#define LLMC_FFN_H

#include <algorithm>
#include "llmc/cpu_ops.h"
#include "llmc/sparse_ffn.h"
#ifdef __CUDACC__
#include "llmc/cuda_gate.cuh"
#include "llmc/cuda_matmul.cuh"
#include "llmc/cuda_sparse_ffn.cuh"
#endif

// What moving units between the parts costs, measured on the running device
// (ffn_measure_costs), in seconds per token: the dense part over h > 0 hot
// units takes dense0 + dense1 h (small hot sets use the tensor cores less
// well, so a constant and a slope, not a rate); each cold unit adds gate1 (its
// column of the gate product), each (token, cold unit) pair pair1. All zero:
// no hot units; dense1 < 0: not measured yet.
typedef struct {
    float dense0, dense1, gate1, pair1;
} FfnCosts;

// hot sets come in multiples of FFN_HOT_ALIGN units (GEMM tiles); they are
// re-chosen every FFN_HOT_EVERY steps, and a hot set is replaced only when the
// new one saves more than FFN_HOT_MARGIN of the layer's modelled time (gate
// included): counts near a boundary do not flip it back and forth; the dense
// part is measured at FFN_HOT_PROBE and 4 FFN_HOT_PROBE units
#define FFN_HOT_ALIGN 64
#define FFN_HOT_EVERY 10
#define FFN_HOT_MARGIN 0.02
#define FFN_HOT_PROBE 128

// the modelled time per token of a layer with h hot units whose cold units fire for cold_rate pairs per token
static inline double ffn_split_time(const FfnCosts* c, int h, double cold_rate) {
    return (h > 0 ? c->dense0 + ((double)c->dense1 - c->gate1) * h : 0.0) + c->pair1 * cold_rate;
}

// The costs from timed runs on M tokens (seconds): dense(h) the dense part
// alone over h units, gate the gate alone over all H units, sparse the whole
// layer with no hot units over `pairs` (token, unit) pairs.
static inline FfnCosts ffn_costs(double dense_small, int small, double dense_large, int large, double gate,
                                 double sparse, double pairs, int H, int M) {
    FfnCosts c;
    double slope = (dense_large - dense_small) / (large - small), base = dense_small - slope * small;
    if (slope <= 0 || base < 0) { slope = dense_large / large, base = 0; } // (noise: the larger set's mean)
    c.dense0 = (float)(base / M);
    c.dense1 = (float)(slope / M);
    c.gate1 = (float)(gate / ((double)H * M));
    c.pair1 = (float)(fmax(sparse - gate, 0.0) / fmax(pairs, 1.0));
    return c;
}

// The hot set of a layer of H units whose first `hot` are hot now, from each
// unit's count over `tokens` tokens: the busiest h units, h the multiple of
// FFN_HOT_ALIGN (or H) with the least modelled time. Returns -1 when the hot
// set stays (no better one saves FFN_HOT_MARGIN of the layer's time with its
// gate), else the new number of hot
// units with perm[i] = the unit (in today's order) that goes to position i:
// the hot units by decreasing count, then the cold ones in today's order.
static inline int ffn_hot_choose(int* perm, const uint32_t* count, int H, int hot, double tokens, const FfnCosts* c) {
    for (int n = 0; n < H; n++) { perm[n] = n; }
    std::stable_sort(perm, perm + H, [&](int x, int y) { return count[x] > count[y]; });
    double total = 0, cold_now = 0;
    for (int n = 0; n < H; n++) {
        total += count[n];
        cold_now += n >= hot ? count[n] : 0;
    }
    int best = 0;
    double best_time = ffn_split_time(c, 0, total / tokens), hot_count = 0;
    for (int h = 0, i = 0; h < H;) {
        h = std::min(h + FFN_HOT_ALIGN, H);
        for (; i < h; i++) { hot_count += count[perm[i]]; }
        double t = ffn_split_time(c, h, (total - hot_count) / tokens);
        if (t < best_time) { best_time = t, best = h; }
    }
    double now = ffn_split_time(c, hot, cold_now / tokens);
    if (now - best_time <= FFN_HOT_MARGIN * (now + (double)c->gate1 * H)) { return -1; }
    std::sort(perm + best, perm + H); // the cold units in today's order
    return best;
}

// the share of a layer's firing (count per unit) that its first `units` units
// in the order perm hold (0 when none fired)
static inline double ffn_hot_share(const uint32_t* count, const int* perm, int H, int units) {
    double pairs = 0, hot_pairs = 0;
    for (int n = 0; n < H; n++) {
        pairs += count[perm[n]];
        hot_pairs += n < units ? count[perm[n]] : 0;
    }
    return pairs > 0 ? hot_pairs / pairs : 0.0;
}

// the hot units of a layer: how many, and their g and u [M, units], kept for the backward
template <typename T>
struct FfnHot {
    int units;
    T *g, *u;
};

// the cold units' gate product and pattern (wg: their rows), fused where the GPU's gate packs its tiles
template <typename T>
void ffn_cold_gate(SparsePattern<T>* cold, int* row_active, uint8_t* fired, T* g_scratch, const T* f, const T* wg,
                   int D, SparseScratch* scratch) {
    if (!sparse_gate_pack(cold, row_active, fired, g_scratch, f, wg, D, scratch)) {
        gemm(g_scratch, f, wg, cold->M, cold->H, D, 0, 1, 0);
        sparse_pack(cold, row_active, fired, g_scratch, scratch);
    }
}

// y [M, D] = FFN(f); row_l1, row_active per token and the fired marks as relu_gate_forward gives them.
// cold: the pattern of units [hot->units, H) (unused when every unit is hot); hot_scratch: [3, M, hot units];
// g_scratch: [M, H] or what the gate packing of the platform needs (sparse_gate_pack).
template <typename T, typename G>
void ffn_split_forward(T* y, G* row_l1, int* row_active, uint8_t* fired, SparsePattern<T>* cold, FfnHot<T>* hot,
                       T* hot_scratch, T* g_scratch, const T* f, const T* wg, const T* wu, const T* wdT, int M, int D,
                       int H, SparseScratch* scratch) {
    const int n_hot = hot->units;
    const size_t off = (size_t)n_hot * D;
    if (n_hot < H) {
        ffn_cold_gate(cold, row_active, fired + n_hot, g_scratch, f, wg + off, D, scratch);
        sparse_up(cold, row_l1, f, wu + off, D);
        sparse_down(y, cold, wdT + off, D);
    }
    if (n_hot > 0) {
        const int add = n_hot < H;
        gemm_pair(hot->g, hot->u, f, wg, wu, M, n_hot, D);
        T* h = hot_scratch;
        relu_gate_forward(h, row_l1, row_active, fired, hot->g, hot->u, M, n_hot, add);
        gemm(y, h, wdT, M, D, n_hot, 0, 0, add);
    }
}

// df [M, D] = dL/df from dy [M, D]; adds the weight gradients and the units' firing counts.
// t, du, dg: the cold part's scratch (sparse_transposed_alloc, [entries]); hot_scratch: [3, M, hot units]
template <typename T, typename G>
void ffn_split_backward(T* df, G* dwg, G* dwu, G* dwdT, uint32_t* unit_count, const SparsePattern<T>* cold,
                        const FfnHot<T>* hot, SparseTransposed* t, T* du, T* dg, T* hot_scratch, const T* dy,
                        const T* f, const T* wg, const T* wu, const T* wdT, float l1_scale, int M, int D, int H,
                        SparseScratch* scratch) {
    const int n_hot = hot->units;
    const size_t off = (size_t)n_hot * D;
    if (n_hot < H) {
        sparse_transpose(t, cold, scratch);
        sparse_unit_count_add(unit_count + n_hot, cold, t);
        sparse_dh_weight_grads(du, dg, dwu + off, dwg + off, dwdT + off, cold, t, f, dy, wdT + off, l1_scale, D);
        sparse_df(df, cold, du, dg, wu + off, wg + off, D);
    }
    if (n_hot > 0) {
        const int add = n_hot < H;
        T *h = hot_scratch, *hot_dh = h + (size_t)M * n_hot, *hot_du = hot_dh + (size_t)M * n_hot;
        relu_mul(h, hot->g, hot->u, (size_t)M * n_hot, (unsigned long long*)NULL);
        gemm(hot_dh, dy, wdT, M, n_hot, D, 0, 1, 0);
        gemm(dwdT, h, dy, n_hot, D, M, 1, 0, 1);
        relu_gate_backward(hot_dh, hot_du, hot_dh, hot->g, hot->u, h, l1_scale, M, n_hot);
        gemm(df, hot_du, wu, M, D, n_hot, 0, 0, add);
        gemm(df, hot_dh, wg, M, D, n_hot, 0, 0, 1);
        gemm(dwu, hot_du, f, n_hot, D, M, 1, 0, 1);
        gemm(dwg, hot_dh, f, n_hot, D, M, 1, 0, 1);
        unit_count_add(unit_count, hot->g, M, n_hot);
    }
}

#endif // LLMC_FFN_H
