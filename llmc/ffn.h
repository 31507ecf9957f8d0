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
 cost of a gathered pair, so the units above the break-even p run hot.

 Forward (cold first: its kernels write row_l1, row_active and y; the hot part adds to them):
     cold:  pattern of g over units [hot, H), u on it, y = h_cold WdT[hot:]
     hot:   g_hot = f Wg[:hot]^T, u_hot = f Wu[:hot]^T, h_hot = relu(g_hot) u_hot, y += h_hot WdT[:hot]
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

// The hot set is re-chosen after every optimizer step from that step's counts,
// with this hysteresis (a unit joins above rate * FFN_HOT_HYSTERESIS and leaves
// below rate / FFN_HOT_HYSTERESIS), in multiples of FFN_HOT_ALIGN units (GEMM tiles)
#define FFN_HOT_HYSTERESIS 1.25
#define FFN_HOT_ALIGN 64
// the break-even rate is measured with this many hot units: the cost per unit of a hot set of that size
#define FFN_HOT_PROBE 256

// The break-even firing rate of a hot unit from measured times (seconds) on
// M tokens: the dense FFN over dense_units units (a = its time per unit and
// token), the gate alone over gate_units (c, paid hot or cold), the sparse FFN
// with that gate over `pairs` (token, unit) pairs (b = its time per pair
// without the gate). A unit firing for a fraction p of the tokens costs a M
// hot and c M + b p M cold, so p* = (a - c) / b, at most 1.
static inline double ffn_break_even(double dense, int dense_units, double gate, int gate_units, double sparse,
                                    double pairs, int M) {
    double per_unit = dense / ((double)dense_units * M) - gate / ((double)gate_units * M);
    double per_pair = (sparse - gate) / (pairs > 0 ? pairs : 1);
    double rate = per_unit > 0 && per_pair > 0 ? per_unit / per_pair : 1.0;
    return rate < 1.0 ? rate : 1.0;
}

// The hot set of a layer of H units whose first `hot` are hot now, from each
// unit's count over `tokens` tokens: the hot units that still fire for at
// least rate / FFN_HOT_HYSTERESIS of the tokens and the cold ones above rate *
// FFN_HOT_HYSTERESIS, rounded up to FFN_HOT_ALIGN units with the most active
// of the others. Returns -1 when the hot set stays, else the new number of hot
// units with perm[i] = the unit (in today's order) that goes to position i:
// the hot units by decreasing count, then the cold ones in today's order.
static inline int ffn_hot_choose(int* perm, const uint32_t* count, int H, int hot, double tokens, double rate) {
    double join = rate * FFN_HOT_HYSTERESIS * tokens, stay = rate / FFN_HOT_HYSTERESIS * tokens;
    auto chosen = [&](int n) { return n < hot ? count[n] >= stay : count[n] > join; };
    int keep = 0, joined = 0;
    for (int n = 0; n < H; n++) {
        if (n < hot) { keep += chosen(n); } else { joined += chosen(n); }
    }
    int wanted = keep + joined, units = wanted == 0 ? 0 : (wanted + FFN_HOT_ALIGN - 1) / FFN_HOT_ALIGN * FFN_HOT_ALIGN;
    if (units > H) { units = H; }
    if (joined == 0 && units == hot) { return -1; }
    // the chosen units first, each group by decreasing count (ties: today's order)
    for (int n = 0; n < H; n++) { perm[n] = n; }
    std::stable_sort(perm, perm + H, [&](int x, int y) {
        if (chosen(x) != chosen(y)) { return chosen(x); }
        return count[x] > count[y];
    });
    std::sort(perm + units, perm + H); // the cold units in today's order
    return units;
}

// the hot units of a layer: how many, and their dense activations [M, units], kept for the backward
template <typename T>
struct FfnHot {
    int units;
    T *g, *u, *h;
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
// cold: the pattern of units [hot->units, H) (unused when every unit is hot); g_scratch: [M, H] or
// what the gate packing of the platform needs (sparse_gate_pack).
template <typename T, typename G>
void ffn_split_forward(T* y, G* row_l1, int* row_active, uint8_t* fired, SparsePattern<T>* cold, FfnHot<T>* hot,
                       T* g_scratch, const T* f, const T* wg, const T* wu, const T* wdT, int M, int D, int H,
                       SparseScratch* scratch) {
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
        relu_gate_forward(hot->h, row_l1, row_active, fired, hot->g, hot->u, M, n_hot, add);
        gemm(y, hot->h, wdT, M, D, n_hot, 0, 0, add);
    }
}

// df [M, D] = dL/df from dy [M, D]; adds the weight gradients and the units' firing counts.
// t, du, dg: the cold part's scratch (sparse_transposed_alloc, [entries]); hot_dh, hot_du: [M, hot]
template <typename T, typename G>
void ffn_split_backward(T* df, G* dwg, G* dwu, G* dwdT, uint32_t* unit_count, const SparsePattern<T>* cold,
                        const FfnHot<T>* hot, SparseTransposed* t, T* du, T* dg, T* hot_dh, T* hot_du, const T* dy,
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
        gemm(hot_dh, dy, wdT, M, n_hot, D, 0, 1, 0);
        gemm(dwdT, hot->h, dy, n_hot, D, M, 1, 0, 1);
        relu_gate_backward(hot_dh, hot_du, hot_dh, hot->g, hot->u, hot->h, l1_scale, M, n_hot);
        gemm(df, hot_du, wu, M, D, n_hot, 0, 0, add);
        gemm(df, hot_dh, wg, M, D, n_hot, 0, 0, 1);
        gemm(dwu, hot_du, f, n_hot, D, M, 1, 0, 1);
        gemm(dwg, hot_dh, f, n_hot, D, M, 1, 0, 1);
        unit_count_add(unit_count, hot->g, M, n_hot);
    }
}

#endif // LLMC_FFN_H
