/*
 The FFN of a model, for every backend and every use: the one face llmc/gpt.h
 (training) and llmc/inference.h (prefill and decode) call, which never names
 a format to them. Per layer, M token rows f of width D, H units:
     g = f Wg^T,  u = f Wu^T,  h = act(g) * u,  y = h WdT
 Beneath it, each path is a CPU reference and its CUDA twin:
     dense.h / cuda_dense.cuh              the dense FFN (also the SiLU one)
     ell.h / cuda_ell.cuh                  training's sparse format (hybrid ELL) and its six products
     split.h                               a training layer as hot units (dense GEMMs) + cold ones (ELL)
     twell.h / cuda_twell.cuh              the prefill's sparse format (TwELL) and its fused up + down
     screened_gate.h / cuda_screened_gate.cuh, cuda_decode.cuh
                                           the decode step: exact int8-screened gate, then the fired units
 hot.h chooses and applies the paths, policy.h holds every choice between
 paths; inference's GPU half is cuda_ffn.cuh.

 Training (mode, --ffn): FFN_DENSE keeps g, u, h of each layer for the
 backward; FFN_SPARSE runs every layer by split.h and keeps only the cold
 units' pattern; FFN_AUTO runs each layer dense or by split.h, whichever its
 path (hot.h, ffn_path_update: the costs measured on the device) says (dense
 until the first choice; a dense layer keeps g, u, h as FFN_DENSE, so a dense
 phase trains at the dense speed). A
 sparse forward whose tail overflowed is redone (ffn_overflowed), so nothing
 is dropped. Inference: FFN_DENSE, or FFN_SPARSE for the sparse paths of
 policy.h (the CPU path is dense).
*/
#ifndef LLMC_FFN_FFN_H
#define LLMC_FFN_FFN_H

#include <stdint.h>
#include <algorithm>
#include <vector>
#include "llmc/cpu_ops.h"
#include "llmc/ffn/dense.h"
#include "llmc/ffn/ell.h"
#include "llmc/ffn/hot.h"
#include "llmc/ffn/policy.h"
#include "llmc/ffn/split.h"
#include "llmc/memory.h"
#include "llmc/model.h"

// the FFN state of a layer
template <typename T>
struct FfnLayer {
    T *wg, *wu, *wdT;        // its weights [H, D], views into the model's parameters
    T* dense;                // [3, M, H] g, u, h while the layer runs dense and keeps them (else NULL)
    int on;                  // this step's choice: 1 sparse, 0 dense
    SparsePattern<T> p;      // the cold units' pattern, allocated (p.M > 0) from the first sparse forward on
    int W, tail_capacity;    // the sizes the next forward wants (a change reallocates p)
    int tail_oversized;      // forwards in a row whose tail was far larger than they needed (ffn_overflowed)
    int hot_units;           // units [0, hot_units) run dense (llmc/ffn/split.h)
    int changed;             // the training step of its last change of path (llmc/ffn/hot.h)
    FfnPairPrices prices;    // what its cold pairs cost where it was timed (llmc/ffn/hot.h)
};

template <typename T>
struct Ffn {
    int L, D, H, activation;
    Device device;
    int mode;                     // FfnMode
    int recompute;                // 1: keep g, u, h of one layer only and recompute them in the backward
    int M;                        // rows of the training buffers (0 until ffn_alloc_batch)
    FfnLayer<T>* layer;           // [L]
    // [M, H], shared by the layers: a recomputed layer's g, u, h; the dense backward's d_h and d_u; the sparse
    // gate's scratch g where the gate needs one (not the GPU's fused gate: ffn_gate_needs_scratch). Under FFN_AUTO
    // without --recompute g is d_h: each use of either ends with the layer's forward or backward that began it, so
    // a run whose layers are all dense holds what --ffn dense holds
    T *g, *u, *h, *d_h, *d_u;
    // memory idle in the FFN's forward and backward (the backward's d_qkv): the GPU's fused gate keeps its words
    // and records there, and a sparse layer's hot part its scratch once the gate is done (ffn_hot_scratch)
    void* spare;
    size_t spare_bytes;
    int* tail_used;               // [L + 1] on the device: rows that asked for a tail slot in the last forward, by
                                  // layer; then the most records a layer's fused gate asked for (ffn_overflowed)
    SparseTransposed transposed;  // the backward's scratch, shared by the layers
    T *sparse_du, *sparse_dg;     // [entries] the backward's scratch
    size_t sparse_scratch_entries;
    SparseScratch sparse_scratch; // the GPU kernels' scratch
    int redone;                   // forwards redone after a tail overflow, since ffn_init
    FfnHotPolicy hot;             // how hot sets are chosen (llmc/ffn/hot.h)
    FfnHotHooks hooks;            // who follows a layer's new unit order
    T* hot_scratch;               // the hot part's scratch where g cannot hold it, for the most hot units of such a
    int hot_scratch_units;        // layer (ffn_hot_scratch)
};

// the layers' weights are the rows of wg, wu, wdT [L, H, D] (on the device)
template <typename T>
void ffn_init(Ffn<T>* ffn, const GPTConfig* c, T* wg, T* wu, T* wdT, Device device) {
    memset(ffn, 0, sizeof(*ffn));
    ffn->L = c->num_layers, ffn->D = c->channels, ffn->H = c->hidden, ffn->activation = c->activation;
    ffn->device = device;
    ffn->layer = (FfnLayer<T>*)callocCheck(ffn->L, sizeof(FfnLayer<T>));
    for (int l = 0; l < ffn->L; l++) {
        size_t at = (size_t)l * ffn->H * ffn->D;
        ffn->layer[l].wg = wg + at, ffn->layer[l].wu = wu + at, ffn->layer[l].wdT = wdT + at;
        ffn->layer[l].changed = -FFN_PATH_MIN_STEPS; // (free to change at step 0)
        ffn->layer[l].prices = ffn_no_prices;
    }
    ffn->tail_used = (int*)device_malloc((ffn->L + 1) * sizeof(int), device);
    device_zero(ffn->tail_used, (ffn->L + 1) * sizeof(int), device);
}

// the sparse paths skip the units whose g <= 0, which only ReLU zeroes
template <typename T>
static void ffn_check_activation(const Ffn<T>* ffn) {
    if (ffn->mode != FFN_DENSE && ffn->activation != ACT_RELU) {
        fatal("the sparse FFN needs ReLU: this model's activation is %s, which runs dense only",
              activation_names[ffn->activation]);
    }
}

// whether every layer keeps its dense g, u, h from the forward for the backward
template <typename T>
static inline int ffn_keeps_dense(const Ffn<T>* ffn) { return !ffn->recompute && ffn->mode != FFN_SPARSE; }

// whether the sparse gate needs g [M, H] as scratch: the CPU's and cuBLASLt's do, the GPU's fused gate does not
template <typename T>
static int ffn_gate_needs_scratch(const Ffn<T>* ffn) {
#ifdef __CUDACC__
    if (ffn->device == DEVICE_CUDA) { return !sparse_gate_fused(ffn->D); }
#endif
    return 1;
}

// The training buffers for micro-batches of M rows. spare: memory of the
// model's that is idle during the FFN's forward and backward (Ffn.spare).
template <typename T>
void ffn_alloc_batch(Ffn<T>* ffn, int M, void* spare, size_t spare_bytes) {
    ffn_check_activation(ffn);
    size_t MH = (size_t)M * ffn->H;
    size_t dense = ffn->mode != FFN_SPARSE, recomputed = dense && ffn->recompute;
    size_t scratch_g = (ffn->mode == FFN_SPARSE && ffn_gate_needs_scratch(ffn)) || recomputed;
    T** bufs[] = {&ffn->g, &ffn->u, &ffn->h, &ffn->d_h, &ffn->d_u};
    size_t counts[] = {scratch_g * MH, recomputed * MH, recomputed * MH, dense * MH, dense * MH};
    for (int i = 0; i < 5; i++) { *bufs[i] = counts[i] ? (T*)device_malloc(counts[i] * sizeof(T), ffn->device) : NULL; }
    if (ffn->mode == FFN_AUTO && !recomputed) { ffn->g = ffn->d_h; }
    ffn->spare = spare;
    ffn->spare_bytes = spare_bytes;
    ffn->M = M;
    if (ffn->mode == FFN_DENSE) { return; }
    // sparse from the start, or dense until the first choice says otherwise (unless ffn_state_set restored a
    // checkpoint's choices)
    for (int l = 0; l < ffn->L; l++) {
        FfnLayer<T>* f = &ffn->layer[l];
        // no tail needs more rows than the micro-batch has (a checkpoint's may: written by a run of larger
        // micro-batches, or crafted)
        if (f->tail_capacity > M) { f->tail_capacity = M; }
        if (f->W > 0) { continue; }
        f->on = ffn->mode == FFN_SPARSE;
        f->W = ffn->H < 256 ? ffn->H : 256;
        f->tail_capacity = sparse_choose_tail(M / 64, M);
    }
}

// layer l's dense g, u, h [M, H]: its own while it keeps them (allocated at its first dense forward, given
// back when it turns sparse), else the shared ones a recomputed layer fills again in the backward
template <typename T>
static void ffn_dense_acts(Ffn<T>* ffn, int l, T** g, T** u, T** h) {
    size_t MH = (size_t)ffn->M * ffn->H;
    FfnLayer<T>* f = &ffn->layer[l];
    if (!ffn_keeps_dense(ffn)) {
        *g = ffn->g, *u = ffn->u, *h = ffn->h;
        return;
    }
    if (f->dense == NULL) { f->dense = (T*)device_malloc(3 * MH * sizeof(T), ffn->device); }
    *g = f->dense, *u = f->dense + MH, *h = f->dense + 2 * MH;
}

// the GPU kernels' scratch (the CPU's need none), made at the first sparse forward
template <typename T>
static void ffn_kernel_scratch_ensure(Ffn<T>* ffn) {
#ifdef __CUDACC__
    if (ffn->device == DEVICE_CUDA && ffn->sparse_scratch.scan_temp == NULL) {
        sparse_scratch_alloc_cuda(&ffn->sparse_scratch, ffn->M, ffn->H, ffn->spare, ffn->spare_bytes,
                                  ffn->tail_used + ffn->L);
    }
#endif
}

template <typename T>
static void ffn_kernel_scratch_free(Ffn<T>* ffn) {
#ifdef __CUDACC__
    if (ffn->device == DEVICE_CUDA && ffn->sparse_scratch.scan_temp) { sparse_scratch_free_cuda(&ffn->sparse_scratch); }
#endif
}

// the scratch of a sparse layer's hot part of `hot` units (g, u, h, dh; llmc/ffn/split.h): the spare where it
// fits, else the gate's [M, H] scratch g where there is one that holds it (the split is done with the gate's
// words, records and scratch before its hot part starts, and the layers run one at a time), else a buffer of
// its own
template <typename T>
static T* ffn_hot_scratch(const Ffn<T>* ffn, int hot) {
    const size_t bytes = ffn_hot_scratch_elems(ffn->M, hot) * sizeof(T);
    if (ffn->spare && bytes <= ffn->spare_bytes) { return (T*)ffn->spare; }
    if (ffn->g && bytes <= (size_t)ffn->M * ffn->H * sizeof(T)) { return ffn->g; }
    return ffn->hot_scratch;
}

// layer l's pattern at the sizes it wants, and the shared scratch large enough for it
// (the pattern over the cold units; the hot part's scratch, which the backward fills again)
template <typename T>
static void ffn_sparse_ensure(Ffn<T>* ffn, int l) {
    FfnLayer<T>* f = &ffn->layer[l];
    int M = ffn->M, D = ffn->D, hot = f->hot_units;
    ffn_kernel_scratch_ensure(ffn);
    if (ffn_hot_scratch(ffn, hot) == ffn->hot_scratch && hot > ffn->hot_scratch_units) {
        device_free(ffn->hot_scratch, ffn->device);
        ffn->hot_scratch = (T*)device_malloc(ffn_hot_scratch_elems(M, hot) * sizeof(T), ffn->device);
        ffn->hot_scratch_units = hot;
    }
    int H = ffn->H - hot; // cold units
    if (H == 0) { return; }
    int W = f->W < H ? f->W : H;
    if (f->p.M == 0 || f->p.H != H || f->p.W != W || f->p.tail_capacity != f->tail_capacity) {
        // a tail sized for another ELL width may shrink after FFN_TAIL_SHRINK_AFTER_RESHAPE forward(s) (not after
        // a new hot set: those come every FFN_HOT_EVERY steps, and tails shrunk at each grew back with a redo)
        if (f->p.M != 0 && f->p.W != W) {
            f->tail_oversized = std::max(f->tail_oversized, FFN_TAIL_SHRINK_AFTER - FFN_TAIL_SHRINK_AFTER_RESHAPE);
        }
        sparse_pattern_free(&f->p, ffn->device);
        sparse_pattern_alloc(&f->p, M, H, W, f->tail_capacity, ffn->tail_used + l, ffn->device);
    }
    // the cold part's backward scratch, shared by the layers: for the most entries any sparse layer asks for, made
    // again when that grows or falls below half (the first steps, every unit cold at the first ELL width and tail,
    // ask for up to ten times what the later ones do; the scratch would keep that size)
    size_t entries = 0;
    for (int i = 0; i < ffn->L; i++) {
        const FfnLayer<T>* fi = &ffn->layer[i];
        int cold = ffn->H - fi->hot_units, width = fi->W < cold ? fi->W : cold;
        if (fi->on && cold > 0) { entries = std::max(entries, sparse_entries(M, cold, width, fi->tail_capacity)); }
    }
    if (entries > ffn->sparse_scratch_entries || 2 * entries < ffn->sparse_scratch_entries) {
        sparse_transposed_free(&ffn->transposed, ffn->device);
        device_free(ffn->sparse_du, ffn->device);
        device_free(ffn->sparse_dg, ffn->device);
        sparse_transposed_alloc(&ffn->transposed, ffn->H, D, entries, ffn->device); // (any layer's cold units: all H)
        ffn->sparse_du = (T*)device_malloc(entries * sizeof(T) + 16, ffn->device);
        ffn->sparse_dg = (T*)device_malloc(entries * sizeof(T) + 16, ffn->device);
        ffn->sparse_scratch_entries = entries;
    }
}

// the sparse paths' scratch shared by the layers, the hot units' and the GPU kernels' (ffn_sparse_ensure
// makes them again at the sizes a layer asks for)
template <typename T>
static void ffn_scratch_free(Ffn<T>* ffn) {
    sparse_transposed_free(&ffn->transposed, ffn->device);
    device_free(ffn->sparse_du, ffn->device);
    device_free(ffn->sparse_dg, ffn->device);
    device_free(ffn->hot_scratch, ffn->device);
    ffn->sparse_du = ffn->sparse_dg = ffn->hot_scratch = NULL;
    ffn->sparse_scratch_entries = 0;
    ffn->hot_scratch_units = 0;
    ffn_kernel_scratch_free(ffn);
}

template <typename T>
void ffn_free(Ffn<T>* ffn) {
    for (int l = 0; l < ffn->L; l++) {
        sparse_pattern_free(&ffn->layer[l].p, ffn->device);
        device_free(ffn->layer[l].dense, ffn->device);
    }
    ffn_scratch_free(ffn);
    T* shared[] = {ffn->mode == FFN_AUTO && ffn->g == ffn->d_h ? NULL : ffn->g, ffn->u, ffn->h, ffn->d_h, ffn->d_u};
    for (T* p : shared) { device_free(p, ffn->device); }
    free(ffn->layer);
    device_free(ffn->tail_used, ffn->device);
    memset(ffn, 0, sizeof(*ffn));
}

// ----------------------------------------------------------------------------
// training forward and backward of layer l: y [M, D] = FFN(f [M, D]), with per
// row the L1 sum and the firing units, and the units' fired marks

// g, u, h of layer l from its normed input, with the sparsity statistics of h
template <typename T, typename G>
void ffn_activations(Ffn<T>* ffn, int l, T* g, T* u, T* h, const T* f, G* row_l1, int* row_active, uint8_t* fired) {
    const FfnLayer<T>* fl = &ffn->layer[l];
    int M = ffn->M, D = ffn->D, H = ffn->H;
    gemm(g, f, fl->wg, M, H, D, 0, 1, 0);
    gemm(u, f, fl->wu, M, H, D, 0, 1, 0);
    relu_gate_forward(h, row_l1, row_active, fired, g, u, M, H, 0, ffn->activation);
}

template <typename T, typename G>
void ffn_forward(Ffn<T>* ffn, int l, T* y, G* row_l1, int* row_active, uint8_t* fired, const T* f) {
    FfnLayer<T>* fl = &ffn->layer[l];
    int M = ffn->M, D = ffn->D, H = ffn->H;
    if (fl->on) {
        // the hot units as dense products, the cold ones by their pattern (llmc/ffn/split.h)
        ffn_sparse_ensure(ffn, l);
        ffn_split_forward(y, row_l1, row_active, fired, &fl->p, fl->hot_units, ffn_hot_scratch(ffn, fl->hot_units),
                          ffn->g, f, fl->wg, fl->wu, fl->wdT, M, D, H, &ffn->sparse_scratch);
        return;
    }
    T *g, *u, *h;
    ffn_dense_acts(ffn, l, &g, &u, &h);
    ffn_activations(ffn, l, g, u, h, f, row_l1, row_active, fired);
    gemm(y, h, fl->wdT, M, D, H, 0, 0, 0);
}

// After a forward: did a sparse layer's tail overflow, or the GPU's fused gate
// ask for more records than its buffer holds? Such a layer gets a tail for what
// it needed (the gate a buffer of its own for what it asked), and the event is
// logged; the caller redoes the forward.
// The rows a layer lost are NaN in every later layer, which therefore counted
// too few: the later layers get a tail at least as large, so that one redo
// usually suffices (another one follows if not). A tail is given back only after
// FFN_TAIL_SHRINK_AFTER forwards in a row needed less than a quarter of it: the
// later layers grown for an earlier one's overflow would otherwise shrink at the
// next forward and grow at the next overflow, each time reallocated (a device
// sync) and often with the forward redone.
template <typename T>
static int ffn_overflowed(Ffn<T>* ffn) {
    int L = ffn->L, M = ffn->M, any_on = 0, overflow = 0, most = 0, records_lost = 0;
    for (int l = 0; l < L; l++) { any_on |= ffn->layer[l].on && ffn->layer[l].hot_units < ffn->H; }
    if (!any_on) { return 0; }
    std::vector<int> used(L + 1);
    device_copy(used.data(), ffn->tail_used, (L + 1) * sizeof(int), ffn->device);
#ifdef __CUDACC__
    SparseScratch* s = &ffn->sparse_scratch;
    if (ffn->device == DEVICE_CUDA && used[L] > s->record_capacity) {
        printf("ffn: the sparse gate asked for %d overflow records, its buffer held %d: grown, forward redone\n",
               used[L], s->record_capacity);
        sparse_scratch_grow_records(s, M, ffn->H, used[L]);
        records_lost = 1;
    }
#endif
    device_zero(ffn->tail_used + L, sizeof(int), ffn->device);
    for (int l = 0; l < L; l++) {
        FfnLayer<T>* f = &ffn->layer[l];
        if (!f->on || f->p.M == 0) { continue; } // (a layer whose units are all hot has no pattern)
        const int oversized = f->tail_oversized;
        f->tail_oversized = 0;
        if (used[l] > f->p.tail_capacity) {
            f->tail_capacity = sparse_choose_tail(used[l] > most ? used[l] : most, M);
            printf("ffn: layer %d: %d rows had more than %d active units, the tail held %d: tail grown to %d rows, "
                   "forward redone\n", l, used[l], f->p.W, f->p.tail_capacity, f->tail_capacity);
            overflow = 1;
            most = used[l] > most ? used[l] : most;
        } else if (overflow && f->tail_capacity < sparse_choose_tail(most, M)) {
            f->tail_capacity = sparse_choose_tail(most, M);
            printf("ffn: layer %d: tail grown to %d rows after the overflow of an earlier layer\n", l, f->tail_capacity);
        } else if (f->tail_capacity > 4 * sparse_choose_tail(used[l], M)) {
            f->tail_oversized = oversized + 1;
            if (f->tail_oversized >= FFN_TAIL_SHRINK_AFTER) { // far too large for long: give memory back next forward
                f->tail_capacity = 2 * sparse_choose_tail(used[l], M);
                f->tail_oversized = 0;
            }
        }
    }
    ffn->redone += overflow || records_lost;
    return overflow || records_lost;
}

// df [M, D] = dL/df of layer l from dy [M, D]; adds the weight gradients and the units' firing counts.
// row_l1, row_active, fired: a recomputed dense layer's statistics are written again (the same values).
template <typename T, typename G>
void ffn_backward(Ffn<T>* ffn, int l, T* df, G* dwg, G* dwu, G* dwdT, uint32_t* unit_count, const T* dy, const T* f,
                  G* row_l1, int* row_active, uint8_t* fired, float l1_scale) {
    FfnLayer<T>* fl = &ffn->layer[l];
    int M = ffn->M, D = ffn->D, H = ffn->H;
    if (fl->on) {
        // the cold units' six products over their pattern only, the hot units' as dense products
        ffn_split_backward(df, dwg, dwu, dwdT, unit_count, &fl->p, fl->hot_units, &ffn->transposed, ffn->sparse_du,
                           ffn->sparse_dg, ffn_hot_scratch(ffn, fl->hot_units), dy, f, fl->wg, fl->wu, fl->wdT,
                           l1_scale, M, D, H, &ffn->sparse_scratch);
        return;
    }
    T *g, *u, *h;
    ffn_dense_acts(ffn, l, &g, &u, &h);
    if (!ffn_keeps_dense(ffn)) { ffn_activations(ffn, l, g, u, h, f, row_l1, row_active, fired); }
    // (FFN_AUTO: the counts choose the hot units once the layer runs sparse)
    if (ffn->mode == FFN_AUTO) { unit_count_add(unit_count, g, M, H); }
    gemm(ffn->d_h, dy, fl->wdT, M, H, D, 0, 1, 0);
    gemm(dwdT, h, dy, H, D, M, 1, 0, 1);
    relu_gate_backward(ffn->d_h, ffn->d_u, ffn->d_h, g, u, h, l1_scale, M, H, ffn->activation);
    gemm(df, ffn->d_u, fl->wu, M, D, H, 0, 0, 0);
    gemm(dwu, ffn->d_u, f, H, D, M, 1, 0, 1);
    gemm(df, ffn->d_h, fl->wg, M, D, H, 0, 0, 1);
    gemm(dwg, ffn->d_h, f, H, D, M, 1, 0, 1);
}

// ----------------------------------------------------------------------------
// choices after a step's statistics

// resizes layer l's ELL width when the mean k_cold of its cold units moved far from what the width was chosen for
template <typename T>
static void ffn_choose_width(Ffn<T>* ffn, int l, double k_cold) {
    FfnLayer<T>* f = &ffn->layer[l];
    int W = sparse_choose_width(k_cold, ffn->H);
    if (f->on && (W > 3 * f->W / 2 || 2 * W < f->W)) { f->W = W; }
}

// every layer's ELL width from the statistics of the forwards just read (stats [L]; count [L, H]: each unit's
// firing count, all 0 where none were taken, as in a validation: then no change)
template <typename T>
void ffn_stats_update(Ffn<T>* ffn, const LayerStats* stats, const uint32_t* count) {
    int L = ffn->L, H = ffn->H;
    for (int l = 0; l < L; l++) {
        // the ELL width is for the cold units: the mean count without the hot ones
        double cold = 0, all = 0;
        for (int n = 0; n < H; n++) {
            uint32_t c = count[(size_t)l * H + n];
            all += c;
            cold += n >= ffn->layer[l].hot_units ? c : 0;
        }
        if (all > 0) { ffn_choose_width(ffn, l, stats[l].l0_mean * cold / all); }
    }
}

// Layer l's path becomes h hot units (FFN_AUTO: h = H is the dense layer) at
// training step `step`, its units in the order perm (ffn_path_choose; a dense
// layer keeps its order), its cold units firing k_cold times per token (its
// ELL width). A layer turned dense gives its pattern back (and the shared
// sparse scratch goes when every layer is dense: as little memory as --ffn
// dense), one turned sparse its g, u, h.
template <typename T>
void ffn_set_path(Ffn<T>* ffn, int l, int h, const int* perm, int step, double k_cold) {
    FfnLayer<T>* f = &ffn->layer[l];
    const int dense = ffn->mode == FFN_AUTO && h == ffn->H;
    if (dense) {
        if (f->on) { sparse_pattern_free(&f->p, ffn->device); } // (until it turns sparse again; its sizes stay)
        f->on = 0, f->hot_units = 0;
    } else {
        ffn_hot_permute(f->wg, f->wu, f->wdT, l, perm, ffn->H, ffn->D, &ffn->hooks, ffn->device);
        f->W = sparse_choose_width(k_cold, ffn->H);
        device_free(f->dense, ffn->device); // (its g, u, h are not needed again until it turns dense)
        f->dense = NULL;
        f->on = 1, f->hot_units = h;
    }
    f->changed = step;
    int any_on = 0;
    for (int i = 0; i < ffn->L; i++) { any_on |= ffn->layer[i].on; }
    if (!any_on) { ffn_scratch_free(ffn); }
}

// The layers' choices as ffn_state_ints(L) ints (llmc/model.h): per layer
// sparse or dense, ELL width, tail rows (0 before the first forward), hot
// units, the step of its last change of path and its pair prices (at, split,
// two floats' bits, lo, two floats' bits: low and miss), then the hot-unit policy
// (FFN_COSTS_FLOATS floats' bits, llmc/ffn/hot.h), so that a resumed run makes the
// same choices (the hot units themselves are the first rows of the layer's
// weights, which the checkpoint holds in that order).
#define FFN_STATE_PER_LAYER 12

template <typename T>
void ffn_state_get(const Ffn<T>* ffn, int32_t* state) {
    int L = ffn->L;
    for (int l = 0; l < L; l++) {
        const FfnLayer<T>* f = &ffn->layer[l];
        int32_t* s = state + FFN_STATE_PER_LAYER * l;
        s[0] = f->on, s[1] = f->W, s[2] = f->tail_capacity, s[3] = f->hot_units;
        s[4] = f->changed, s[5] = f->prices.at, s[6] = f->prices.split;
        memcpy(s + 7, &f->prices.busy, sizeof(float));
        memcpy(s + 8, &f->prices.rest, sizeof(float));
        s[9] = f->prices.lo;
        memcpy(s + 10, &f->prices.low, sizeof(float));
        memcpy(s + 11, &f->prices.miss, sizeof(float));
    }
    float policy[FFN_COSTS_FLOATS];
    ffn_hot_policy_pack(policy, &ffn->hot);
    memcpy(state + FFN_STATE_PER_LAYER * L, policy, sizeof(policy));
}

// before the first forward; n: the ints the checkpoint held (older files: 3
// per layer from before the hot/cold split, no hot units and the policy as the
// run asks; 4 per layer and 4 floats from before the layers' paths were
// measured, no change yet and no prices; 9 per layer and 5 floats from before
// the cold part's constant, which is 0; 9 per layer and 6 from before the
// busiest units' own price, which they do not have: lo 0; 11 per layer from
// before the prices' miss, which is then 0: the margin alone, as they chose
// with); source: the file they came from, which an error names
template <typename T>
void ffn_state_set(Ffn<T>* ffn, const int32_t* state, int n, const char* source) {
    int H = ffn->H, L = ffn->L;
    if (!ffn_state_ints_known(n, L)) { fatal("%s: %d ints of FFN state, expected %d", source, n, ffn_state_ints(L)); }
    int per = n == 3 * L ? 3 : n == 4 * L + 4 ? 4 : n == 9 * L + 5 || n == 9 * L + 6 ? 9
              : n == 11 * L + 6 ? 11 : FFN_STATE_PER_LAYER;
    int floats = n - per * L;
    for (int l = 0; l < L; l++) {
        FfnLayer<T>* f = &ffn->layer[l];
        const int32_t* s = state + per * l;
        int hot = per > 3 ? s[3] : 0;
        if (s[0] < 0 || s[0] > 1 || s[1] < 0 || s[1] > H || s[2] < 0 || hot < 0 || hot > H) {
            fatal("%s: FFN state of layer %d (%d, %d, %d, %d) is corrupt", source, l, s[0], s[1], s[2], hot);
        }
        f->on = ffn->mode == FFN_DENSE ? 0 : ffn->mode == FFN_SPARSE ? 1 : s[0];
        f->W = s[1];
        f->tail_capacity = s[2];
        f->hot_units = hot;
        f->changed = -FFN_PATH_MIN_STEPS, f->prices = ffn_no_prices;
        if (per < 9) { continue; }
        FfnPairPrices p = {s[5], s[6], 0.0f, 0.0f, 0, 0.0f, 0.0f};
        memcpy(&p.busy, s + 7, sizeof(float));
        memcpy(&p.rest, s + 8, sizeof(float));
        if (per > 9) {
            p.lo = s[9];
            memcpy(&p.low, s + 10, sizeof(float));
        }
        if (per > 11) { memcpy(&p.miss, s + 11, sizeof(float)); }
        auto price = [](float x) { return x > 0 && x <= 1; }; // (NaN: not a price)
        int priced = p.at < 0 || (price(p.busy) && price(p.rest) && (p.lo == 0 || price(p.low)));
        if (s[4] < -FFN_PATH_MIN_STEPS || p.at < -1 || p.at >= H || p.split < 0 || p.split > H || p.lo < 0 ||
            p.lo > p.split || !priced || !isfinite(p.miss) || p.miss < 0) {
            fatal("%s: FFN path of layer %d (changed at %d, prices %d, %d, %g, %g, %d, %g, miss %g) is corrupt", source,
                  l, s[4], p.at, p.split, p.busy, p.rest, p.lo, p.low, p.miss);
        }
        f->changed = s[4];
        f->prices = p;
    }
    if (per > 3) {
        float policy[FFN_COSTS_FLOATS];
        memcpy(policy, state + per * L, floats * sizeof(float));
        ffn->hot = ffn_hot_policy_unpack(policy, floats, source);
    }
}

// ----------------------------------------------------------------------------
// inference: a prefill's and a decode step's FFN over the rows of a batch

// the FFN state of inference on the CPU path: none (it runs the dense FFN); the GPU's: llmc/ffn/cuda_ffn.cuh
template <typename T>
struct FfnCache {
    int unused;
};

template <typename T>
void ffn_cache_init(FfnCache<T>* cache, const Ffn<T>* ffn, int max_seqs) { memset(cache, 0, sizeof(*cache)); }

template <typename T>
void ffn_cache_free(FfnCache<T>* cache) {}

// the weights changed (values, or the order of units): whatever the cache derived from them is stale
template <typename T>
void ffn_cache_stale(FfnCache<T>* cache) {}

// before a decode step of B rows is queued or captured as a graph: what it needs that a graph cannot make
template <typename T>
void ffn_decode_prepare(FfnCache<T>* cache, Ffn<T>* ffn, int B) {}

// whether a prefill of M rows runs a sparse FFN (the hot units' calibration only pays there)
template <typename T>
int ffn_prefill_sparse(const FfnCache<T>* cache, const Ffn<T>* ffn, int M) { return 0; }

// y [M, D] = layer l's FFN of f [M, D] for a prefill (decode 0) or a decode step's rows; scratch: [M, 2H];
// fired (if not NULL) gets the number of units that fire (g > 0), summed over the rows; fired_union (if not
// NULL) the number that fire in some row, counted by the GPU's sparse decode only (the rows it reads)
template <typename T>
void ffn_forward_cached(FfnCache<T>* cache, Ffn<T>* ffn, int l, T* y, const T* f, int M, int decode, T* scratch,
                        unsigned long long* fired = NULL, unsigned long long* fired_union = NULL) {
    const FfnLayer<T>* fl = &ffn->layer[l];
    ffn_dense_forward(y, scratch, scratch + (size_t)M * ffn->H, f, fl->wg, fl->wu, fl->wdT, M, ffn->D, ffn->H, fired,
                      decode, 0, ffn->activation);
}

// layer l of a prefill by its sparse path (the GPU's TwELL) over all its units, hot ones too; the CPU path has
// none and runs it dense
template <typename T>
void ffn_prefill_sparse_layer(FfnCache<T>* cache, Ffn<T>* ffn, int l, T* y, const T* f, int M, T* scratch) {
    ffn_forward_cached(cache, ffn, l, y, f, M, 0, scratch);
}

// y [M, D] = layer l's last `units` units alone (the others excluded) by a prefill's sparse path, as the cold part
// of a split, whose units fire `active` times per row, teaching the layer's choices nothing (llmc/ffn/hot.h times
// it); the CPU path runs them dense
template <typename T>
void ffn_prefill_cold_units(FfnCache<T>* cache, Ffn<T>* ffn, int l, int units, double active, T* y, const T* f, int M,
                            T* scratch) {
    const FfnLayer<T>* fl = &ffn->layer[l];
    const size_t off = (size_t)(ffn->H - units) * ffn->D;
    ffn_dense_forward(y, scratch, scratch + (size_t)M * units, f, fl->wg + off, fl->wu + off, fl->wdT + off, M, ffn->D,
                      units, (unsigned long long*)NULL);
}

#ifdef __CUDACC__
#include "llmc/ffn/cuda_ffn.cuh"
#endif

#endif // LLMC_FFN_FFN_H
