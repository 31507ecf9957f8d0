/*
 A sparse FFN layer of training split into hot and cold units, for every
 backend (the kernels are the overloads of llmc/ffn/dense.h, llmc/ffn/ell.h
 and their CUDA twins).

 The FFN does not depend on the order of its H units: permuting the rows of
 Wg, Wu and WdT together gives the same function. A layer keeps its units in
 an order with the `hot` most active first (llmc/ffn/hot.h chooses them and
 permutes the weights; the optimizer's state follows through a hook), and
     FFN(f) = FFN(f; units [0, hot)) + FFN(f; units [hot, H))
 where the first term is the dense FFN over the hot rows (its products are
 tensor-core GEMMs with N or K = hot) and the second the sparse FFN of
 llmc/ffn/ell.h over the cold rows (the weight pointers offset by hot rows,
 the pattern's H = H - hot). A unit that fires for a fraction p of the tokens
 costs the dense part a fixed amount per token and the sparse part p times the
 cost of a gathered pair; the hot set is the number of busiest units with the
 least modelled time (llmc/ffn/hot.h).

 Forward (cold first: its kernels write row_l1, row_active and y; the hot part adds to them):
     cold:  pattern of g over units [hot, H), u on it, y = h_cold WdT[hot:]
     hot:   g_hot = f Wg[:hot]^T, u_hot = f Wu[:hot]^T, h_hot = relu(g_hot) u_hot, y += h_hot WdT[:hot]
            (nothing of the hot part is kept for the backward: only the cold part's pattern is)
 Backward (dy = dL/dy):
     cold:  dh, du, dg on the pattern with the weight gradients of rows [hot, H) (unit by unit over the
            transposed pattern), then df = du Wu[hot:] + dg Wg[hot:]
     hot:   g_hot, u_hot again (the forward's product: the same call on the same inputs, so the same bits),
            h_hot = relu(g_hot) u_hot, dh = dy WdT[:hot]^T, dWdT[:hot] += h_hot^T dy, du, dg (relu_gate_backward),
            df += du Wu[:hot] + dg Wg[:hot], dWu[:hot] += du^T f, dWg[:hot] += dg^T f
 and both parts add each unit's firing count over the batch to unit_count[n].
 With hot = 0 this is the sparse FFN of llmc/ffn/ell.h, with hot = H the dense one.

 Memory: the hot part's g, u, h, dh live in one scratch of [4, M, hot] that the layers share (they run one
 at a time; llmc/ffn/ffn.h lends the gate's [M, H] scratch where it holds them), not per layer. Keeping
 g_hot and u_hot per layer would cost 2 M hot values a layer (1.34 GiB at the 1.5B shape with 782 hot
 units: 28 layers, M 16384); recomputing them costs one batched product beside the hot part's nine. Keeping
 g and recomputing u alone would save half for one product, but only if the forward ran g and u as two
 products (a single product and the batched pair need not round alike), giving up the batched pair's gain.
*/
#ifndef LLMC_FFN_SPLIT_H
#define LLMC_FFN_SPLIT_H

#include "llmc/cpu_ops.h"
#include "llmc/ffn/dense.h"
#include "llmc/ffn/ell.h"
#ifdef __CUDACC__
#include "llmc/ffn/cuda_dense.cuh"
#include "llmc/cuda_matmul.cuh"
#include "llmc/ffn/cuda_ell.cuh"
#endif

// the elements of the hot part's scratch for `hot` units: g, u, h, dh [M, hot] each
static inline size_t ffn_hot_scratch_elems(int M, int hot) { return 4 * (size_t)M * hot; }

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
// cold: the pattern of units [n_hot, H) (unused when every unit is hot); hot_scratch: ffn_hot_scratch_elems, and
// may be g_scratch (the cold part is done with it before the hot part starts); g_scratch: [M, H] or what the gate
// packing of the platform needs (sparse_gate_pack).
template <typename T, typename G>
void ffn_split_forward(T* y, G* row_l1, int* row_active, uint8_t* fired, SparsePattern<T>* cold, int n_hot,
                       T* hot_scratch, T* g_scratch, const T* f, const T* wg, const T* wu, const T* wdT, int M, int D,
                       int H, SparseScratch* scratch) {
    const size_t off = (size_t)n_hot * D;
    if (n_hot < H) {
        ffn_cold_gate(cold, row_active, fired + n_hot, g_scratch, f, wg + off, D, scratch);
        sparse_up(cold, row_l1, f, wu + off, D);
        sparse_down(y, cold, wdT + off, D);
    }
    if (n_hot > 0) {
        const int add = n_hot < H;
        const size_t MN = (size_t)M * n_hot;
        T *g = hot_scratch, *u = g + MN, *h = u + MN;
        gemm_pair(g, u, f, wg, wu, M, n_hot, D); // (the backward repeats this call: keep the two alike)
        relu_gate_forward(h, row_l1, row_active, fired, g, u, M, n_hot, add);
        gemm(y, h, wdT, M, D, n_hot, 0, 0, add);
    }
}

// df [M, D] = dL/df from dy [M, D]; adds the weight gradients and the units' firing counts.
// t, du, dg: the cold part's scratch (sparse_transposed_alloc, [entries]); hot_scratch: ffn_hot_scratch_elems
// (nothing in it is read from the forward)
template <typename T, typename G>
void ffn_split_backward(T* df, G* dwg, G* dwu, G* dwdT, uint32_t* unit_count, const SparsePattern<T>* cold, int n_hot,
                        SparseTransposed* t, T* du, T* dg, T* hot_scratch, const T* dy, const T* f, const T* wg,
                        const T* wu, const T* wdT, float l1_scale, int M, int D, int H, SparseScratch* scratch) {
    const size_t off = (size_t)n_hot * D;
    if (n_hot < H) {
        sparse_transpose(t, cold, scratch);
        sparse_unit_count_add(unit_count + n_hot, cold, t);
        sparse_dh_weight_grads(du, dg, dwu + off, dwg + off, dwdT + off, cold, t, f, dy, wdT + off, l1_scale, D);
        sparse_df(df, cold, du, dg, wu + off, wg + off, D);
    }
    if (n_hot > 0) {
        const int add = n_hot < H;
        const size_t MN = (size_t)M * n_hot;
        T *g = hot_scratch, *u = g + MN, *h = u + MN, *hot_dh = h + MN;
        T* hot_du = h; // (relu_gate_backward reads h before it writes du, and h is not needed after it)
        // the forward's g and u to the bit: the same product (cuBLASLt: the same shape, strides and cached
        // algorithm) on the same f and weights
        gemm_pair(g, u, f, wg, wu, M, n_hot, D);
        relu_mul(h, g, u, MN, (unsigned long long*)NULL);
        gemm(hot_dh, dy, wdT, M, n_hot, D, 0, 1, 0);
        gemm(dwdT, h, dy, n_hot, D, M, 1, 0, 1);
        relu_gate_backward(hot_dh, hot_du, hot_dh, g, u, h, l1_scale, M, n_hot);
        gemm(df, hot_du, wu, M, D, n_hot, 0, 0, add);
        gemm(df, hot_dh, wg, M, D, n_hot, 0, 0, 1);
        gemm(dwu, hot_du, f, n_hot, D, M, 1, 0, 1);
        gemm(dwg, hot_dh, f, n_hot, D, M, 1, 0, 1);
        unit_count_add(unit_count, g, M, n_hot);
    }
}

// A layer's last `units` units alone as a split's cold part (the others excluded, not hot): its pattern, with room
// for every row's entries (the ELL width all its units: no row needs the tail, and the kernels' cost follows a
// row's entries, not the width), and its backward's scratch. What llmc/ffn/hot.h times as the smallest cold part.
template <typename T>
struct FfnColdPart {
    SparsePattern<T> p;
    SparseTransposed t;
    T *du, *dg;     // [entries] the backward's scratch
    int* tail_used; // [1] the pattern's counter (no row asks)
};

template <typename T>
void ffn_cold_part_alloc(FfnColdPart<T>* c, int M, int units, int D, Device device) {
    size_t n = sparse_entries(M, units, units, 0);
    c->tail_used = (int*)device_malloc(sizeof(int), device);
    sparse_pattern_alloc(&c->p, M, units, units, 0, c->tail_used, device);
    sparse_transposed_alloc(&c->t, units, D, n, device);
    c->du = (T*)device_malloc(n * sizeof(T) + 16, device);
    c->dg = (T*)device_malloc(n * sizeof(T) + 16, device);
}

template <typename T>
void ffn_cold_part_free(FfnColdPart<T>* c, Device device) {
    sparse_pattern_free(&c->p, device);
    sparse_transposed_free(&c->t, device);
    device_free(c->du, device);
    device_free(c->dg, device);
    device_free(c->tail_used, device);
}

// The forward and backward of the cold part c over the last c->p.H of a layer's H units (weights wg, wu, wdT
// [H, D]), as ffn_split_forward and ffn_split_backward run a cold part: y, df, the statistics of its units
// (row_l1, row_active: theirs alone), their fired marks, counts and weight gradients
template <typename T, typename G>
void ffn_cold_part_run(FfnColdPart<T>* c, T* y, G* row_l1, int* row_active, uint8_t* fired, T* df, G* dwg, G* dwu,
                       G* dwdT, uint32_t* unit_count, T* g_scratch, const T* dy, const T* f, const T* wg, const T* wu,
                       const T* wdT, int M, int D, int H, SparseScratch* scratch) {
    const int units = c->p.H, first = H - units;
    const size_t off = (size_t)first * D;
    ffn_split_forward(y, row_l1, row_active, fired + first, &c->p, 0, (T*)NULL, g_scratch, f, wg + off, wu + off,
                      wdT + off, M, D, units, scratch);
    ffn_split_backward(df, dwg + off, dwu + off, dwdT + off, unit_count + first, &c->p, 0, &c->t, c->du, c->dg, (T*)NULL,
                       dy, f, wg + off, wu + off, wdT + off, 0.0f, M, D, units, scratch);
}

#endif // LLMC_FFN_SPLIT_H
