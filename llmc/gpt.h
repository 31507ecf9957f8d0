/*
 The model's forward and backward: one orchestration for every backend.

     x = E[t]
     per layer:  x += Attn(RMSNorm(x)) Wo^T
                 f = RMSNorm(x);  h = act(f Wg^T) * (f Wu^T);  x += h Wd^T
     logits = RMSNorm(x) E^T   (E: the embedding, or lm_head when the head is untied)
     loss = CE + lambda * (1/L) sum_l (1/M) sum |h_l|

 act is the config's activation: ReLU, or SiLU, which runs dense only (its h
 has no zeros for the sparse paths to skip); a unit "fires" where g > 0 either
 way, which is what the L0 and dead-unit statistics count.

 GPT<T, G> owns parameters (T), gradients (G) and the activations of one
 micro-batch in flat buffers on its device. T is the activation and weight
 type, G the type of gradients, norm statistics and losses: <float, float> on
 the CPU path, <double, double> for the gradient checks, <bf16, float> on the
 GPU. The kernels are overloads with the same signatures for each backend
 (llmc/cpu_ops.h, llmc/cuda_*.cuh), so this file never asks which one runs.

 The FFN of a layer runs dense or sparse (llmc/sparse_ffn.h: after the dense
 gate product, only the units that fire; the backward keeps their pattern and
 values, no [M, H] tensor). model->ffn_mode says which: FFN_DENSE everywhere,
 FFN_SPARSE everywhere, or FFN_AUTO, where each layer is re-chosen at every
 gpt_stats_read from its measured activity (dense until the first statistics).
 In the auto mode a dense layer keeps its g, u, h for the backward as in
 FFN_DENSE (a dense phase trains at the dense path's speed); FFN_SPARSE keeps
 no [M, H] tensor at all.

 The device is waited for at two places: gpt_stats_read, once per optimizer
 step (the loss and sparsity statistics are sums on the device until then),
 and, when a layer ran sparse, the end of each forward, which reads how many
 rows each layer's sparse tail needed: a layer whose tail was too small gets a
 larger one, the event is logged, and the forward is redone before anything
 depends on it, so nothing is ever dropped.
*/
#ifndef LLMC_GPT_H
#define LLMC_GPT_H

#include <stdint.h>
#include "llmc/cpu_ops.h"
#include "llmc/ffn.h"
#include "llmc/sparse_ffn.h"
#ifdef __CUDACC__
#include <type_traits>
#include <vector>
#include "llmc/cuda_adamw.cuh"
#include "llmc/cuda_attention.cuh"
#include "llmc/cuda_attention_cached.cuh"
#include "llmc/cuda_classifier.cuh"
#include "llmc/cuda_encoder.cuh"
#include "llmc/cuda_gate.cuh"
#include "llmc/cuda_matmul.cuh"
#include "llmc/cuda_rmsnorm.cuh"
#include "llmc/cuda_rope.cuh"
#include "llmc/cuda_sparse_decode.cuh"
#include "llmc/cuda_sparse_ffn.cuh"
#include "llmc/cuda_twell.cuh"
#endif
#include "llmc/memory.h"
#include "llmc/model.h"
#include "llmc/rng.h"
#include "llmc/utils.h"

template <typename T, typename G>
struct Activations {
    T* x_res;      // [L+1, M, D] residual stream entering each layer; [L] enters the final norm
    T* x_mid;      // [L, M, D] after the attention residual add
    T* attn_in;    // [L, M, D] RMSNorm output feeding qkv
    G* attn_rstd;  // [L, M]
    T* qkv;        // [L, M, QKV] q and k after RoPE
    T* att;        // [L, M, D] attention output before Wo
    G* lse;        // [L, B, NH, T] attention log-sum-exp per query
    T* ffn_in;     // [L, M, D] RMSNorm output f
    G* ffn_rstd;   // [L, M]
    T* g;          // [M, H] the sparse gate's scratch, or g of the layer that --recompute recomputes
    T* u;          // [M, H] with --recompute only (a layer that keeps g, u, h has its own: FfnLayer.dense)
    T* h;          // [M, H] (same)
    G* row_l1;     // [L, M] sum_n |h|
    int* row_active; // [L, M] firing units
    T* final_out;  // [M, D]
    G* final_rstd; // [M]
    T* logits;     // [M, Vp]; replaced by dlogits when the forward is told to
    G* losses;     // [M]
    // scratch
    T* proj;       // [M, D] output of Wo and Wd before the residual add
    T* d_res;      // [M, D] gradient of the loss wrt the residual stream
    T* d_tmp;      // [M, D]
    T* d_qkv;      // [M, QKV]
    T* d_h;        // [M, H], also dg (none with --ffn sparse)
    T* d_u;        // [M, H] (same)
    G* scratch;    // attention and norm backward scratch
};

typedef enum { FFN_DENSE = 0, FFN_SPARSE = 1, FFN_AUTO = 2 } FfnMode;

// FFN_AUTO: a layer runs sparse while its mean number of firing units per token
// is at most this fraction of H (dev/bench_ffn: sparse fwd + bwd is faster than
// dense up to about k = 1% of H at the standard point), with 25% hysteresis
#define FFN_AUTO_MAX_ACTIVE 0.01

// the FFN state of a layer
template <typename T>
struct SparseFfnLayer {
    T* dense;                // [3, M, H] g, u, h while the layer runs dense and keeps them (else NULL)
    int on;                  // this step's choice: 1 sparse, 0 dense
    SparsePattern<T> p;      // the cold units' pattern, allocated (p.M > 0) from the first sparse forward on
    int W, tail_capacity;    // the sizes the next forward wants (a change reallocates p)
    FfnHot<T> hot;           // units [0, hot.units) run dense; their g, u [M, hot.units]
    int hot_capacity;        // units the hot buffers hold
};

template <typename T, typename G>
struct GPT {
    GPTConfig config;
    Device device;
    size_t num_parameters;
    T* params;
    G* grads;      // NULL until the first backward
    T* param[NUM_PARAM_TENSORS];
    G* grad[NUM_PARAM_TENSORS];
    int B, T_;     // micro-batch the activations are sized for (0 until the first forward)
    int recompute; // 1: keep g, u, h of one layer only and recompute them in the backward
    Activations<T, G> acts;
    void* acts_memory;
    size_t acts_bytes;
    double* stats_acc; // [1 + 3L] on the device: loss sum; per layer l1 sum, firing pairs, max (cpu_ops.h)
    uint8_t* fired;    // [L, H] on the device: unit fired since gpt_stats_reset
    uint32_t* unit_count; // [L, H] on the device: how often each unit fired in the training backwards
                          // since gpt_stats_reset (sparse layers, and dense ones under FFN_AUTO)
    // on the host, filled by gpt_stats_read
    double ce;         // mean CE
    double l1_term;    // (1/L) sum_l mean_m sum_n |h|, before lambda
    LayerStats* stats; // [L]
    uint32_t* unit_count_host; // [L, H] unit_count, read with the statistics
    // the sparse FFN (see the top of this file)
    int ffn_mode;                 // FfnMode
    SparseFfnLayer<T>* ffn;       // [L]
    int* tail_used;               // [L] on the device: rows that asked for a tail slot in the last forward
    SparseTransposed transposed;  // the backward's scratch, shared by the layers
    T *sparse_du, *sparse_dg;     // [entries] the backward's scratch
    size_t sparse_scratch_entries;
    SparseScratch sparse_scratch; // the GPU kernels' scratch
    int ffn_redone;               // forwards redone after a tail overflow, since gpt_build
    FfnCosts hot_costs;           // what moving units between the hot and cold parts costs (llmc/ffn.h)
    T* hot_scratch;               // [3, M, hot_scratch_units] the hot units' h, dh, du (ffn_split_forward)
    int hot_scratch_units;
    // called by gpt_backward once layer l's gradients are final (l = -1: the
    // embedding and final norm), so that data parallelism can reduce them while
    // the backward goes on; NULL when there is nothing to do
    void (*grads_ready)(void* ctx, int layer);
    void* grads_ready_ctx;
    // called by the forward before it reads layer l's weights (l = -1: the
    // embedding and final norm), which data parallelism may still be gathering
    void (*params_needed)(void* ctx, int layer);
    void* params_needed_ctx;
};

template <typename P>
void gpt_point_tensors(P* base, P* ptrs[NUM_PARAM_TENSORS], const GPTConfig* c) {
    size_t offsets[NUM_PARAM_TENSORS];
    param_offsets(offsets, c);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) { ptrs[i] = base + offsets[i]; }
}

template <typename T, typename G>
void gpt_build(GPT<T, G>* model, const GPTConfig* config, Device device) {
    config_validate(config);
    memset(model, 0, sizeof(*model));
    model->config = *config;
    model->device = device;
    model->num_parameters = num_parameters(config);
    model->params = (T*)device_malloc(model->num_parameters * sizeof(T), device);
    gpt_point_tensors(model->params, model->param, config);
    int L = config->num_layers;
    model->stats_acc = (double*)device_malloc((1 + 3 * L) * sizeof(double), device);
    model->fired = (uint8_t*)device_malloc((size_t)L * config->hidden, device);
    model->unit_count = (uint32_t*)device_malloc((size_t)L * config->hidden * sizeof(uint32_t), device);
    model->stats = (LayerStats*)callocCheck(L, sizeof(LayerStats));
    model->unit_count_host = (uint32_t*)callocCheck((size_t)L * config->hidden, sizeof(uint32_t));
    model->ffn = (SparseFfnLayer<T>*)callocCheck(L, sizeof(SparseFfnLayer<T>));
    model->tail_used = (int*)device_malloc(L * sizeof(int), device);
}

// whether every layer keeps its dense g, u, h from the forward for the backward
template <typename T, typename G>
static inline int gpt_keeps_ffn(const GPT<T, G>* model) {
    return !model->recompute && model->ffn_mode != FFN_SPARSE;
}

// layer l's dense g, u, h [M, H]: its own while it keeps them (allocated at its first dense forward, given
// back when it turns sparse), else the shared ones a recomputed layer fills again in the backward
template <typename T, typename G>
static void gpt_ffn_dense_acts(GPT<T, G>* model, int l, T** g, T** u, T** h) {
    size_t MH = (size_t)model->B * model->T_ * model->config.hidden;
    SparseFfnLayer<T>* f = &model->ffn[l];
    if (!gpt_keeps_ffn(model)) {
        *g = model->acts.g, *u = model->acts.u, *h = model->acts.h;
        return;
    }
    if (f->dense == NULL) { f->dense = (T*)device_malloc(3 * MH * sizeof(T), model->device); }
    *g = f->dense, *u = f->dense + MH, *h = f->dense + 2 * MH;
}

// every matrix N(0, 0.02), norm weights 1, the padded vocab rows 0; made on
// the host in fp32 (so every backend starts from the same numbers)
static inline void init_params_random(float* params, const GPTConfig* c, uint64_t seed) {
    size_t sizes[NUM_PARAM_TENSORS];
    param_sizes(sizes, c);
    uint64_t rng = seed;
    float* p = params;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        for (size_t j = 0; j < sizes[i]; j++) { p[j] = param_is_matrix(i) ? (float)(0.02 * rng_normal(&rng)) : 1.0f; }
        if ((i == P_WTE || i == P_LM_HEAD) && sizes[i] > 0) { // (a tied model's lm_head has none)
            size_t real = (size_t)c->vocab_size * c->channels;
            memset(p + real, 0, (sizes[i] - real) * sizeof(float));
        }
        p += sizes[i];
    }
}

// the sparse FFN paths skip the units whose g <= 0, which only ReLU zeroes
template <typename T, typename G>
static void gpt_check_ffn_activation(const GPT<T, G>* model) {
    if (model->ffn_mode != FFN_DENSE && model->config.activation != ACT_RELU) {
        fatal("the sparse FFN needs ReLU: this model's activation is %s, which runs dense only",
              activation_names[model->config.activation]);
    }
}

template <typename T, typename G>
void gpt_alloc_activations(GPT<T, G>* model, int B, int T_) {
    gpt_check_ffn_activation(model);
    const GPTConfig* c = &model->config;
    size_t L = c->num_layers, M = (size_t)B * T_, D = c->channels, H = c->hidden;
    size_t QKV = qkv_dim(c), NH = c->num_heads, Vp = c->padded_vocab_size;
    Activations<T, G>* a = &model->acts;
    // attention backward wants B*NKV*T values (CPU) or B*NH*T (GPU: a delta per query);
    // the norm backward (GPU) wants a block's partial sums of D
    size_t scratch = M * NH > 1024 * D ? M * NH : 1024 * D;
    // a dense layer that keeps g, u, h has them in its own buffer (gpt_ffn_dense_acts), which it gives back
    // when it turns sparse; here the shared ones: the sparse gate's scratch, a recomputed layer's g, u, h,
    // and the dense backward's d_h, d_u. FFN_AUTO without --recompute: the sparse gate's scratch is d_h
    // (the one is used in the forward only, the other in the backward only), so that a run whose layers
    // are all dense holds what --ffn dense holds
    size_t dense = model->ffn_mode != FFN_SPARSE, recomputed = dense && model->recompute;
    size_t gate_in_d_h = model->ffn_mode == FFN_AUTO && !recomputed;
    size_t scratch_g = model->ffn_mode == FFN_SPARSE || recomputed;
    struct { void** ptr; size_t bytes; } parts[] = {
        {(void**)&a->x_res, (L + 1) * M * D * sizeof(T)}, {(void**)&a->x_mid, L * M * D * sizeof(T)},
        {(void**)&a->attn_in, L * M * D * sizeof(T)}, {(void**)&a->attn_rstd, L * M * sizeof(G)},
        {(void**)&a->qkv, L * M * QKV * sizeof(T)}, {(void**)&a->att, L * M * D * sizeof(T)},
        {(void**)&a->lse, L * M * NH * sizeof(G)}, {(void**)&a->ffn_in, L * M * D * sizeof(T)},
        {(void**)&a->ffn_rstd, L * M * sizeof(G)}, {(void**)&a->g, scratch_g * M * H * sizeof(T)},
        {(void**)&a->u, recomputed * M * H * sizeof(T)}, {(void**)&a->h, recomputed * M * H * sizeof(T)},
        {(void**)&a->row_l1, L * M * sizeof(G)}, {(void**)&a->row_active, L * M * sizeof(int)},
        {(void**)&a->final_out, M * D * sizeof(T)}, {(void**)&a->final_rstd, M * sizeof(G)},
        {(void**)&a->logits, M * Vp * sizeof(T)}, {(void**)&a->losses, M * sizeof(G)},
        {(void**)&a->proj, M * D * sizeof(T)}, {(void**)&a->d_res, M * D * sizeof(T)},
        {(void**)&a->d_tmp, M * D * sizeof(T)}, {(void**)&a->d_qkv, M * QKV * sizeof(T)},
        {(void**)&a->d_h, dense * M * H * sizeof(T)}, {(void**)&a->d_u, dense * M * H * sizeof(T)},
        {(void**)&a->scratch, scratch * sizeof(G)},
    };
    const size_t align = 256; // every buffer starts on a 256-byte boundary for vector loads
    size_t total = 0;
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) { total += (parts[i].bytes + align - 1) / align * align; }
    model->acts_memory = device_malloc(total, model->device);
    model->acts_bytes = total;
    char* p = (char*)model->acts_memory;
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
        *parts[i].ptr = p;
        p += (parts[i].bytes + align - 1) / align * align;
    }
    if (gate_in_d_h) { a->g = a->d_h; }
    model->B = B;
    model->T_ = T_;
    if (model->ffn_mode != FFN_DENSE) {
        // sparse from the start, or dense until the first statistics say otherwise
        // (unless gpt_ffn_state_set restored a checkpoint's choices)
        for (size_t l = 0; l < L; l++) {
            SparseFfnLayer<T>* f = &model->ffn[l];
            // no tail needs more rows than the micro-batch has (a checkpoint's may: written by a run of
            // larger micro-batches, or crafted)
            if (f->tail_capacity > (int)M) { f->tail_capacity = (int)M; }
            if (f->W > 0) { continue; }
            f->on = model->ffn_mode == FFN_SPARSE;
            f->W = (int)(H < 256 ? H : 256);
            f->tail_capacity = sparse_choose_tail((int)M / 64, (int)M);
        }
    }
}

// layer l's pattern at the sizes it wants, and the shared backward scratch large enough for it
// (the pattern over the cold units; the hot units' buffers and the shared hot scratch)
template <typename T, typename G>
static void gpt_sparse_ensure(GPT<T, G>* model, int l) {
    SparseFfnLayer<T>* f = &model->ffn[l];
    int M = model->B * model->T_, D = model->config.channels, hot = f->hot.units;
#ifdef __CUDACC__
    if (model->device == DEVICE_CUDA && model->sparse_scratch.scan_temp == NULL) {
        // the GPU kernels' scratch, the fused gate's words in d_qkv, which only the backward uses
        sparse_scratch_alloc_cuda(&model->sparse_scratch, M, model->config.hidden, model->acts.d_qkv,
                                  (size_t)M * qkv_dim(&model->config) * sizeof(T));
    }
#endif
    int H = model->config.hidden - hot; // cold units
    if (hot > f->hot_capacity) {
        device_free(f->hot.g, model->device);
        f->hot.g = (T*)device_malloc(2 * (size_t)M * hot * sizeof(T), model->device);
        f->hot.u = f->hot.g + (size_t)M * hot;
        f->hot_capacity = hot;
    }
    if (hot > model->hot_scratch_units) {
        device_free(model->hot_scratch, model->device);
        model->hot_scratch = (T*)device_malloc(3 * (size_t)M * hot * sizeof(T), model->device);
        model->hot_scratch_units = hot;
    }
    if (H == 0) { return; }
    int W = f->W < H ? f->W : H;
    if (f->p.M == 0 || f->p.H != H || f->p.W != W || f->p.tail_capacity != f->tail_capacity) {
        sparse_pattern_free(&f->p, model->device);
        sparse_pattern_alloc(&f->p, M, H, W, f->tail_capacity, model->tail_used + l, model->device);
    }
    size_t entries = sparse_entries(M, H, W, f->tail_capacity);
    if (entries > model->sparse_scratch_entries) { // (for any layer's cold units: all H of them)
        sparse_transposed_free(&model->transposed, model->device);
        device_free(model->sparse_du, model->device);
        device_free(model->sparse_dg, model->device);
        sparse_transposed_alloc(&model->transposed, model->config.hidden, D, entries, model->device);
        model->sparse_du = (T*)device_malloc(entries * sizeof(T) + 16, model->device);
        model->sparse_dg = (T*)device_malloc(entries * sizeof(T) + 16, model->device);
        model->sparse_scratch_entries = entries;
    }
}

// After a forward: did a sparse layer's tail overflow? Such a layer gets a tail
// for what it needed, and the event is logged; the caller redoes the forward.
// The rows a layer lost are NaN in every later layer, which therefore counted
// too few: the later layers get a tail at least as large, so that one redo
// usually suffices (another one follows if not).
template <typename T, typename G>
static int gpt_sparse_overflowed(GPT<T, G>* model) {
    int L = model->config.num_layers, M = model->B * model->T_, any_on = 0, overflow = 0, most = 0;
    for (int l = 0; l < L; l++) { any_on |= model->ffn[l].on && model->ffn[l].hot.units < model->config.hidden; }
    if (!any_on) { return 0; }
    int* used = (int*)mallocCheck(L * sizeof(int));
    device_copy(used, model->tail_used, L * sizeof(int), model->device);
    for (int l = 0; l < L; l++) {
        SparseFfnLayer<T>* f = &model->ffn[l];
        if (!f->on || f->p.M == 0) { continue; } // (a layer whose units are all hot has no pattern)
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
            f->tail_capacity = 2 * sparse_choose_tail(used[l], M); // far too large: give memory back next forward
        }
    }
    free(used);
    model->ffn_redone += overflow;
    return overflow;
}

// a layer's sparse buffers: its pattern and its hot units' g, u (gpt_sparse_ensure makes them again; the
// sizes chosen for them stay)
template <typename T>
static void gpt_sparse_layer_free(SparseFfnLayer<T>* f, Device device) {
    sparse_pattern_free(&f->p, device);
    device_free(f->hot.g, device);
    f->hot.g = f->hot.u = NULL;
    f->hot_capacity = 0;
}

// x [rows, D] on the device <- its rows in the order perm (on that device); tmp: as large as x
template <typename T>
static void device_permute_rows(T* x, T* tmp, const int* perm, int rows, int D, Device device) {
    if (device == DEVICE_CPU) {
        permute_rows(tmp, x, perm, rows, D);
    } else {
#ifdef __CUDACC__
        permute_rows_cuda(tmp, x, perm, rows, D);
#endif
    }
    device_copy(x, tmp, (size_t)rows * D * sizeof(T), device);
}

// layer l's FFN units in the order perm (perm[i] = the unit that goes to i, on
// the model's device) in the weights: the rows of Wg, Wu and WdT, so the model
// stays the same function; tmp: H D elements of T
template <typename T, typename G>
static void gpt_permute_units(GPT<T, G>* model, int l, const int* perm, T* tmp) {
    const int H = model->config.hidden, D = model->config.channels;
    for (int i : {P_WG, P_WU, P_WDT}) {
        device_permute_rows(model->param[i] + (size_t)l * H * D, tmp, perm, H, D, model->device);
    }
}

// the sparse paths' scratch shared by the layers, the hot units' and the GPU kernels' (gpt_sparse_ensure
// makes them again at the sizes a layer asks for)
template <typename T, typename G>
static void gpt_sparse_scratch_free(GPT<T, G>* model) {
    sparse_transposed_free(&model->transposed, model->device);
    device_free(model->sparse_du, model->device);
    device_free(model->sparse_dg, model->device);
    device_free(model->hot_scratch, model->device);
    model->sparse_du = model->sparse_dg = model->hot_scratch = NULL;
    model->sparse_scratch_entries = 0;
    model->hot_scratch_units = 0;
#ifdef __CUDACC__
    if (model->device == DEVICE_CUDA && model->sparse_scratch.scan_temp) { sparse_scratch_free_cuda(&model->sparse_scratch); }
#endif
}

template <typename T, typename G>
void gpt_free(GPT<T, G>* model) {
    device_free(model->params, model->device);
    device_free(model->grads, model->device);
    device_free(model->acts_memory, model->device);
    device_free(model->stats_acc, model->device);
    device_free(model->fired, model->device);
    device_free(model->unit_count, model->device);
    free(model->stats);
    free(model->unit_count_host);
    for (int l = 0; l < model->config.num_layers; l++) {
        gpt_sparse_layer_free(&model->ffn[l], model->device);
        device_free(model->ffn[l].dense, model->device);
    }
    gpt_sparse_scratch_free(model);
    free(model->ffn);
    device_free(model->tail_used, model->device);
    memset(model, 0, sizeof(*model));
}

template <typename T, typename G>
void gpt_zero_grad(GPT<T, G>* model) {
    if (model->grads == NULL) {
        model->grads = (G*)device_malloc(model->num_parameters * sizeof(G), model->device);
        gpt_point_tensors(model->grads, model->grad, &model->config);
    }
    device_zero(model->grads, model->num_parameters * sizeof(G), model->device);
}

// starts new sums of the loss and sparsity statistics
template <typename T, typename G>
void gpt_stats_reset(GPT<T, G>* model) {
    int L = model->config.num_layers;
    device_zero(model->stats_acc, (1 + 3 * L) * sizeof(double), model->device);
    device_zero(model->fired, (size_t)L * model->config.hidden, model->device);
    device_zero(model->unit_count, (size_t)L * model->config.hidden * sizeof(uint32_t), model->device);
}

// re-chooses layer l's FFN from its measured mean activity k (FFN_AUTO), and
// resizes its ELL width when the cold units' mean k_cold moved far from what
// the width was chosen for (k_cold < 0: not counted, as in a validation)
template <typename T, typename G>
static void gpt_ffn_choose(GPT<T, G>* model, int l, double k, double k_cold = -1) {
    SparseFfnLayer<T>* f = &model->ffn[l];
    int H = model->config.hidden;
    if (model->ffn_mode == FFN_AUTO) {
        double limit = FFN_AUTO_MAX_ACTIVE * H;
        int on = f->on ? k <= 1.25 * limit : k < limit / 1.25;
        if (on != f->on) {
            printf("ffn: layer %d -> %s (%.1f of %d units active per token, sparse up to %.0f)\n", l,
                   on ? "sparse" : "dense", k, H, limit);
        }
        if (on && f->dense) { // its g, u, h are not needed again until it turns dense
            device_free(f->dense, model->device);
            f->dense = NULL;
        }
        if (!on && f->on) { gpt_sparse_layer_free(f, model->device); } // until it turns sparse again
        f->on = on;
    }
    int W = sparse_choose_width(k_cold, H);
    if (f->on && k_cold >= 0 && (W > 3 * f->W / 2 || 2 * W < f->W)) { f->W = W; }
}

// the layers' FFN choices as ffn_state_ints(L) ints (llmc/model.h): per layer
// sparse or dense, ELL width, tail rows (0 before the first forward) and hot
// units, then the hot/cold costs (4 floats' bits), so that a resumed run makes
// the same choices (the hot units themselves are the first rows of the
// layer's weights, which the checkpoint holds in that order)
template <typename T, typename G>
void gpt_ffn_state_get(const GPT<T, G>* model, int32_t* state) {
    int L = model->config.num_layers;
    for (int l = 0; l < L; l++) {
        const SparseFfnLayer<T>* f = &model->ffn[l];
        state[4 * l] = f->on;
        state[4 * l + 1] = f->W;
        state[4 * l + 2] = f->tail_capacity;
        state[4 * l + 3] = f->hot.units;
    }
    memcpy(state + 4 * L, &model->hot_costs, sizeof(FfnCosts));
}

// before the first forward; n: the ints the checkpoint held (3 per layer from
// before the hot/cold split: no hot units, the costs as the run asks); source:
// the file they came from, which an error names
template <typename T, typename G>
void gpt_ffn_state_set(GPT<T, G>* model, const int32_t* state, int n, const char* source) {
    int H = model->config.hidden, L = model->config.num_layers, per = n == 3 * L ? 3 : 4;
    if (n != 3 * L && n != ffn_state_ints(L)) { fatal("%s: %d ints of FFN state, expected %d", source, n, ffn_state_ints(L)); }
    for (int l = 0; l < L; l++) {
        SparseFfnLayer<T>* f = &model->ffn[l];
        const int32_t* s = state + per * l;
        int hot = per == 4 ? s[3] : 0;
        if (s[0] < 0 || s[0] > 1 || s[1] < 0 || s[1] > H || s[2] < 0 || hot < 0 || hot > H) {
            fatal("%s: FFN state of layer %d (%d, %d, %d, %d) is corrupt", source, l, s[0], s[1], s[2], hot);
        }
        f->on = model->ffn_mode == FFN_DENSE ? 0 : model->ffn_mode == FFN_SPARSE ? 1 : s[0];
        f->W = s[1];
        f->tail_capacity = s[2];
        f->hot.units = hot;
    }
    if (per == 4) {
        FfnCosts costs;
        memcpy(&costs, state + 4 * L, sizeof(costs));
        float v[4] = {costs.dense0, costs.dense1, costs.gate1, costs.pair1};
        for (float x : v) {
            if (!isfinite(x) || x < -1 || x > 1) { fatal("%s: hot/cold cost %g is corrupt", source, x); }
        }
        model->hot_costs = costs;
    }
}

// brings the sums of the forwards since gpt_stats_reset to the host (the one
// place a step waits for the device) and turns them into means over `tokens`
template <typename T, typename G>
void gpt_stats_read(GPT<T, G>* model, double tokens) {
    int L = model->config.num_layers, H = model->config.hidden;
    double acc[1 + 3 * 1024];
    uint8_t* fired = (uint8_t*)mallocCheck((size_t)L * H);
    device_copy(acc, model->stats_acc, (1 + 3 * L) * sizeof(double), model->device);
    device_copy(fired, model->fired, (size_t)L * H, model->device);
    device_copy(model->unit_count_host, model->unit_count, (size_t)L * H * sizeof(uint32_t), model->device);
    model->ce = acc[0] / tokens;
    model->l1_term = 0;
    for (int l = 0; l < L; l++) {
        LayerStats* s = &model->stats[l];
        s->l1 = acc[1 + 3 * l] / tokens;
        s->l0_mean = acc[2 + 3 * l] / tokens;
        s->l0_max = (int)acc[3 + 3 * l];
        int dead = 0;
        for (int n = 0; n < H; n++) { dead += !fired[(size_t)l * H + n]; }
        s->dead = (double)dead / H;
        model->l1_term += s->l1 / L;
        // the ELL width is for the cold units: the mean count without the hot ones where counts were taken
        double cold = 0, all = 0;
        for (int n = 0; n < H; n++) {
            uint32_t c = model->unit_count_host[(size_t)l * H + n];
            all += c;
            cold += n >= model->ffn[l].hot.units ? c : 0;
        }
        gpt_ffn_choose(model, l, s->l0_mean, all > 0 ? s->l0_mean * cold / all : -1.0);
    }
    free(fired);
    int any_on = 0;
    for (int l = 0; l < L; l++) { any_on |= model->ffn[l].on; }
    if (!any_on) { gpt_sparse_scratch_free(model); } // all dense again: as little memory as --ffn dense
}

// The dead-neuron re-initialisation of docs/MODEL.md, after an optimizer step and
// its gpt_stats_read (the fired marks then cover that step's tokens): every
// W_g row whose unit fired for no token is pulled a tenth of the way to fresh
// N(0, 0.02^2) noise. master: the fp32 master weights in the model's flat order
// (the GPU path with one process), NULL on the CPU path. Returns the rows
// re-initialised.
template <typename T, typename G>
int gpt_dead_reinit(GPT<T, G>* model, float* master, uint64_t seed) {
    const GPTConfig* c = &model->config;
    int L = c->num_layers, H = c->hidden, dead = 0;
    for (int l = 0; l < L; l++) { dead += (int)lround(model->stats[l].dead * H); }
    if (dead == 0) { return 0; }
    size_t offset = model->param[P_WG] - model->params;
    gate_dead_reinit(model->param[P_WG], master ? master + offset : (float*)NULL, model->fired, L * H, c->channels, seed);
    return dead;
}

// the median of 5 timed runs of fn (after one untimed), in seconds
template <typename F>
static double gpt_time(Device device, F fn) {
    double t[5];
    fn();
    for (int i = 0; i < 5; i++) {
        device_synchronize(device);
        double t0 = now_seconds();
        fn();
        device_synchronize(device);
        t[i] = now_seconds() - t0;
    }
    for (int i = 1; i < 5; i++) { // insertion sort of 5
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) { double x = t[j]; t[j] = t[j - 1]; t[j - 1] = x; }
    }
    return t[2];
}

// The costs of moving units between the hot and cold parts on the running
// device (FfnCosts), measured on sparse layer l (which has no hot units yet)
// with the inputs and weights of the last step: the dense part alone over
// FFN_HOT_PROBE and 4 FFN_HOT_PROBE units, the gate alone, the whole layer
// cold. What it writes is scratch until the next forward (the projection and
// gradient buffers, the weight gradients, which the next step zeroes, the
// pattern, recomputed by the next forward).
template <typename T, typename G>
FfnCosts gpt_hot_costs(GPT<T, G>* model, int l, int verbose) {
    const GPTConfig* c = &model->config;
    int M = model->B * model->T_, D = c->channels, H = c->hidden;
    int large = H < 4 * FFN_HOT_PROBE ? H : 4 * FFN_HOT_PROBE, small = large / 4 > 0 ? large / 4 : 1;
    SparseFfnLayer<T>* f = &model->ffn[l];
    if (!f->on || f->hot.units != 0 || f->p.M == 0 || H < 2) { fatal("gpt_hot_costs: layer %d is not sparse and cold", l); }
    if (model->params_needed) { model->params_needed(model->params_needed_ctx, l); }
    Activations<T, G>* a = &model->acts;
    size_t LD = (size_t)l * H * D;
    const T *wg = model->param[P_WG] + LD, *wu = model->param[P_WU] + LD, *wdT = model->param[P_WDT] + LD;
    G *dwg = model->grad[P_WG] + LD, *dwu = model->grad[P_WU] + LD, *dwdT = model->grad[P_WDT] + LD;
    const T* ffn_in = a->ffn_in + (size_t)l * M * D;
    G* row_l1 = a->row_l1 + (size_t)l * M;
    int* row_active = a->row_active + (size_t)l * M;
    uint8_t* fired = (uint8_t*)device_malloc(H, model->device);
    uint32_t* count = (uint32_t*)device_malloc(H * sizeof(uint32_t), model->device);
    device_zero(fired, H, model->device);
    device_zero(count, H * sizeof(uint32_t), model->device);
    // the dense part alone: `units` hot units and no cold ones
    T* probe = (T*)device_malloc(5 * (size_t)M * large * sizeof(T), model->device);
    auto dense = [&](int units) {
        FfnHot<T> hot = {units, probe, probe + (size_t)M * units};
        return gpt_time(model->device, [&] {
            ffn_split_forward(a->proj, row_l1, row_active, fired, &f->p, &hot, probe + 2 * (size_t)M * units, a->g,
                              ffn_in, wg, wu, wdT, M, D, units, &model->sparse_scratch);
            ffn_split_backward(a->d_tmp, dwg, dwu, dwdT, count, &f->p, &hot, &model->transposed, model->sparse_du,
                               model->sparse_dg, probe + 2 * (size_t)M * units, a->d_res, ffn_in, wg, wu, wdT, 0.0f, M,
                               D, units, &model->sparse_scratch);
        });
    };
    double dense_small = dense(small), dense_large = dense(large);
    device_free(probe, model->device);
    FfnHot<T> none = {0, NULL, NULL};
    double gate = gpt_time(model->device, [&] {
        ffn_cold_gate(&f->p, row_active, fired, a->g, ffn_in, wg, D, &model->sparse_scratch);
    });
    double sparse = gpt_time(model->device, [&] {
        ffn_split_forward(a->proj, row_l1, row_active, fired, &f->p, &none, (T*)NULL, a->g, ffn_in, wg, wu, wdT, M, D, H,
                          &model->sparse_scratch);
        ffn_split_backward(a->d_tmp, dwg, dwu, dwdT, count, &f->p, &none, &model->transposed, model->sparse_du,
                           model->sparse_dg, model->hot_scratch, a->d_res, ffn_in, wg, wu, wdT, 0.0f, M, D,
                           H, &model->sparse_scratch);
    });
    int* active = (int*)mallocCheck(M * sizeof(int));
    device_copy(active, row_active, M * sizeof(int), model->device);
    double pairs = 0;
    for (int m = 0; m < M; m++) { pairs += active[m]; }
    free(active);
    device_free(fired, model->device);
    device_free(count, model->device);
    if (verbose) {
        printf("ffn: hot units: costs measured on layer %d: the dense part over %d / %d units %.3f / %.3f ms, the "
               "layer all cold %.3f ms (its gate %.3f) at %.1f pairs per token\n", l, small, large, 1e3 * dense_small,
               1e3 * dense_large, 1e3 * sparse, 1e3 * gate, pairs / M);
    }
    return ffn_costs(dense_small, small, dense_large, large, gate, sparse, pairs, H, M);
}

// the hot set of sparse layer l after a training step of `tokens` tokens, from
// its units' counts (gpt_stats_read): ffn_hot_choose with the model's costs
template <typename T, typename G>
int gpt_hot_choose(const GPT<T, G>* model, int l, double tokens, int* perm) {
    int H = model->config.hidden;
    return ffn_hot_choose(perm, model->unit_count_host + (size_t)l * H, H, model->ffn[l].hot.units, tokens,
                          &model->hot_costs);
}

// out[M,N] = inp[M,K] W[N,K]^T: a linear layer in the PyTorch weight layout
template <typename T>
void linear_forward(T* out, const T* inp, const T* w, int M, int K, int N) {
    gemm(out, inp, w, M, N, K, 0, 1, 0);
}

// dinp[M,K] = dout W (+= if accumulate);  dW[N,K] += dout^T inp
template <typename T, typename G>
void linear_backward(T* dinp, G* dw, const T* dout, const T* inp, const T* w, int M, int K, int N, int accumulate) {
    gemm(dinp, dout, w, M, K, N, 0, 0, accumulate);
    gemm(dw, dout, inp, N, K, M, 1, 0, 1);
}

// layer l's FFN activations from its normed input: g = f Wg^T, u = f Wu^T,
// h = act(g) * u, with the sparsity statistics of h
template <typename T, typename G>
void gpt_ffn_activations(GPT<T, G>* model, int l, T* g, T* u, T* h) {
    const GPTConfig* c = &model->config;
    int M = model->B * model->T_, D = c->channels, H = c->hidden;
    const T* ffn_in = model->acts.ffn_in + (size_t)l * M * D;
    linear_forward(g, ffn_in, model->param[P_WG] + (size_t)l * H * D, M, D, H);
    linear_forward(u, ffn_in, model->param[P_WU] + (size_t)l * H * D, M, D, H);
    relu_gate_forward(h, model->acts.row_l1 + (size_t)l * M, model->acts.row_active + (size_t)l * M,
                      model->fired + (size_t)l * H, g, u, M, H, 0, c->activation);
}

// the embedding and the layers of a forward (gpt_forward)
template <typename T, typename G>
static void gpt_forward_layers(GPT<T, G>* model, const int* inputs) {
    const GPTConfig* c = &model->config;
    int B = model->B, T_ = model->T_, L = c->num_layers, D = c->channels, H = c->hidden, M = B * T_;
    int QKV = qkv_dim(c), hd = head_size(c), NH = c->num_heads, NKV = c->num_kv_heads;
    Activations<T, G>* a = &model->acts;
    size_t MD = (size_t)M * D;

    if (model->params_needed) {
        model->params_needed(model->params_needed_ctx, -1);
        model->params_needed(model->params_needed_ctx, 0);
    }
    encoder_forward(a->x_res, inputs, model->param[P_WTE], M, D);
    rmsnorm_forward(a->attn_in, a->attn_rstd, a->x_res, model->param[P_ATTN_NORM], M, D, c->norm_eps);
    for (int l = 0; l < L; l++) {
        // layer l ends with the next layer's norm
        if (model->params_needed && l + 1 < L) { model->params_needed(model->params_needed_ctx, l + 1); }
        T* qkv = a->qkv + (size_t)l * M * QKV;
        T* att = a->att + l * MD;
        T* ffn_in = a->ffn_in + l * MD;
        const T* wdT = model->param[P_WDT] + (size_t)l * H * D;

        linear_forward(qkv, a->attn_in + l * MD, model->param[P_WQKV] + (size_t)l * QKV * D, M, D, QKV);
        rope_forward(qkv, B, T_, 0, NH, NKV, hd, c->rope_theta);
        attention_forward(att, a->lse + (size_t)l * M * NH, qkv, B, T_, NH, NKV, hd);
        linear_forward(a->proj, att, model->param[P_WO] + (size_t)l * D * D, M, D, D);
        fused_residual_rmsnorm_forward(a->x_mid + l * MD, ffn_in, a->ffn_rstd + (size_t)l * M, a->x_res + l * MD,
                                       a->proj, model->param[P_FFN_NORM] + (size_t)l * D, M, D, c->norm_eps);

        if (model->ffn[l].on) {
            // the hot units as dense products, the cold ones by their pattern (llmc/ffn.h)
            SparseFfnLayer<T>* f = &model->ffn[l];
            gpt_sparse_ensure(model, l);
            ffn_split_forward(a->proj, a->row_l1 + (size_t)l * M, a->row_active + (size_t)l * M,
                              model->fired + (size_t)l * H, &f->p, &f->hot, model->hot_scratch, a->g, ffn_in,
                              model->param[P_WG] + (size_t)l * H * D, model->param[P_WU] + (size_t)l * H * D, wdT, M,
                              D, H, &model->sparse_scratch);
        } else {
            T *g, *u, *h;
            gpt_ffn_dense_acts(model, l, &g, &u, &h);
            gpt_ffn_activations(model, l, g, u, h);
            gemm(a->proj, h, wdT, M, D, H, 0, 0, 0);
        }
        // the residual add, fused with the norm of the next layer (or the final norm)
        int last = l == L - 1;
        fused_residual_rmsnorm_forward(a->x_res + (l + 1) * MD, last ? a->final_out : a->attn_in + (l + 1) * MD,
                                       last ? a->final_rstd : a->attn_rstd + (size_t)(l + 1) * M, a->x_mid + l * MD,
                                       a->proj, last ? model->param[P_FINAL_NORM] : model->param[P_ATTN_NORM] + (size_t)(l + 1) * D,
                                       M, D, c->norm_eps);
    }
}

// Forward over B sequences of T tokens (inputs and targets on the model's
// device). With targets, adds the losses and the sparsity statistics to the
// sums; with dloss > 0, also leaves dlogits = dloss * dCE/dlogits in place of
// the logits for gpt_backward.
template <typename T, typename G>
void gpt_forward(GPT<T, G>* model, const int* inputs, const int* targets, int B, int T_, float dloss) {
    const GPTConfig* c = &model->config;
    if (T_ > c->max_seq_len) { fatal("sequence length %d exceeds max_seq_len %d", T_, c->max_seq_len); }
    if (model->acts_memory == NULL) { gpt_alloc_activations(model, B, T_); }
    if (B != model->B || T_ != model->T_) {
        fatal("batch %dx%d differs from the %dx%d the activations were sized for", B, T_, model->B, model->T_);
    }
    int L = c->num_layers, D = c->channels, M = B * T_;
    Activations<T, G>* a = &model->acts;

    // a redo after a sparse tail overflow gives the same patterns, now all held
    do {
        gpt_forward_layers(model, inputs);
    } while (gpt_sparse_overflowed(model));
    linear_forward(a->logits, a->final_out, model->param[output_head(c)], M, D, c->padded_vocab_size);
    if (targets) {
        crossentropy_forward_backward(dloss > 0 ? a->logits : (T*)NULL, a->losses, a->logits, targets, M,
                                      c->vocab_size, c->padded_vocab_size, dloss);
        // the one call whose argument types cannot tell the backends apart
        if (model->device == DEVICE_CPU) {
            forward_stats_accumulate(model->stats_acc, a->losses, a->row_l1, a->row_active, L, M);
        } else {
#ifdef __CUDACC__
            forward_stats_accumulate_cuda(model->stats_acc, a->losses, a->row_l1, a->row_active, L, M);
#endif
        }
    }
}

// Backward of the last forward (which must have been given dloss > 0).
// Gradients accumulate into model->grads. l1_scale = lambda / (L * M * accum)
// is the derivative of the L1 term with respect to each |h|.
template <typename T, typename G>
void gpt_backward(GPT<T, G>* model, const int* inputs, float l1_scale) {
    const GPTConfig* c = &model->config;
    if (model->grads == NULL) { gpt_zero_grad(model); }
    int B = model->B, T_ = model->T_, M = B * T_;
    int L = c->num_layers, D = c->channels, H = c->hidden, Vp = c->padded_vocab_size;
    int QKV = qkv_dim(c), hd = head_size(c), NH = c->num_heads, NKV = c->num_kv_heads;
    Activations<T, G>* a = &model->acts;
    size_t MD = (size_t)M * D;
    T* d_res = a->d_res; // dL/dx of the residual stream, walking down the layers

    // classifier and final norm
    linear_backward(a->d_tmp, model->grad[output_head(c)], a->logits, a->final_out, model->param[output_head(c)], M, D,
                    Vp, 0);
    device_zero(d_res, MD * sizeof(T), model->device);
    rmsnorm_backward(d_res, model->grad[P_FINAL_NORM], a->scratch, a->d_tmp, a->x_res + L * MD,
                     model->param[P_FINAL_NORM], a->final_rstd, M, D);

    for (int l = L - 1; l >= 0; l--) {
        const T* wg = model->param[P_WG] + (size_t)l * H * D;
        const T* wu = model->param[P_WU] + (size_t)l * H * D;
        const T* wdT = model->param[P_WDT] + (size_t)l * H * D;
        const T* ffn_in = a->ffn_in + l * MD;
        G *dwg = model->grad[P_WG] + (size_t)l * H * D, *dwu = model->grad[P_WU] + (size_t)l * H * D;
        G* dwdT = model->grad[P_WDT] + (size_t)l * H * D;

        // FFN: x_out = x_mid + h Wd^T; d_res is dL/dx_out and passes through to x_mid
        uint32_t* unit_count = model->unit_count + (size_t)l * H;
        if (model->ffn[l].on) {
            // the cold units' six products over their pattern only, the hot units' as dense products
            const SparseFfnLayer<T>* f = &model->ffn[l];
            ffn_split_backward(a->d_tmp, dwg, dwu, dwdT, unit_count, &f->p, &f->hot, &model->transposed,
                               model->sparse_du, model->sparse_dg, model->hot_scratch, d_res, ffn_in, wg, wu,
                               wdT, l1_scale, M, D, H, &model->sparse_scratch);
        } else {
            T *g, *u, *h;
            gpt_ffn_dense_acts(model, l, &g, &u, &h);
            if (!gpt_keeps_ffn(model)) { gpt_ffn_activations(model, l, g, u, h); }
            // (FFN_AUTO: the counts choose the hot units once the layer runs sparse)
            if (model->ffn_mode == FFN_AUTO) { unit_count_add(unit_count, g, M, H); }
            gemm(a->d_h, d_res, wdT, M, H, D, 0, 1, 0);
            gemm(dwdT, h, d_res, H, D, M, 1, 0, 1);
            relu_gate_backward(a->d_h, a->d_u, a->d_h, g, u, h, l1_scale, M, H, c->activation);
            linear_backward(a->d_tmp, dwu, a->d_u, ffn_in, wu, M, D, H, 0);
            linear_backward(a->d_tmp, dwg, a->d_h, ffn_in, wg, M, D, H, 1);
        }
        rmsnorm_backward(d_res, model->grad[P_FFN_NORM] + (size_t)l * D, a->scratch, a->d_tmp, a->x_mid + l * MD,
                         model->param[P_FFN_NORM] + (size_t)l * D, a->ffn_rstd + (size_t)l * M, M, D);

        // attention: x_mid = x + att Wo^T
        linear_backward(a->d_tmp, model->grad[P_WO] + (size_t)l * D * D, d_res, a->att + l * MD,
                        model->param[P_WO] + (size_t)l * D * D, M, D, D, 0);
        attention_backward(a->d_qkv, a->scratch, a->d_tmp, a->att + l * MD, a->qkv + (size_t)l * M * QKV,
                           a->lse + (size_t)l * M * NH, B, T_, NH, NKV, hd);
        rope_backward(a->d_qkv, B, T_, NH, NKV, hd, c->rope_theta);
        linear_backward(a->d_tmp, model->grad[P_WQKV] + (size_t)l * QKV * D, a->d_qkv, a->attn_in + l * MD,
                        model->param[P_WQKV] + (size_t)l * QKV * D, M, D, QKV, 0);
        rmsnorm_backward(d_res, model->grad[P_ATTN_NORM] + (size_t)l * D, a->scratch, a->d_tmp, a->x_res + l * MD,
                         model->param[P_ATTN_NORM] + (size_t)l * D, a->attn_rstd + (size_t)l * M, M, D);
        if (model->grads_ready) { model->grads_ready(model->grads_ready_ctx, l); }
    }
    encoder_backward(model->grad[P_WTE], d_res, inputs, M, D);
    if (model->grads_ready) { model->grads_ready(model->grads_ready_ctx, -1); }
}

// ----------------------------------------------------------------------------
// Inference: the forward above over a key/value cache, for a batch of
// sequences. A prefill feeds a batch of prompts of any lengths; then each
// decode step feeds one new token of every sequence. Per layer l and row
// (sequence s, position p):
//     a = RMSNorm(x);  qkv = a Wqkv^T;  RoPE(q, k at p);  cache[l, s, p] = k, v
//     x += Attn(q, cache[l, s, 0..p]) Wo^T
//     f = RMSNorm(x);  x += FFN(f)
// and logits = RMSNorm(x) E^T of each sequence's last row.
//
// A prefill's prompts are the rows of one [M, D] batch (M = the sum of their
// lengths): the products, norms and the FFN do not care where a sequence ends;
// RoPE and the cache take each row's sequence and position from arrays on the
// device, and attention runs per prompt over its own rows. A decode step has a
// row per sequence; on the GPU its linear layers are a GEMV of our own for up to
// 8 rows (llmc/cuda_matmul.cuh), its attention splits a long cache over many
// SMs (llmc/cuda_attention_cached.cuh), and the step is queued as one CUDA graph
// (tokens and positions live in device memory: no allocation and no wait for
// the host inside it), so its launches cost the GPU's time, not the host's.
// The FFN of a layer: gpt_ffn_cached. The parts only the GPU has are compiled
// for bf16, its type, alone.

template <typename T>
struct InferState {
    int max_seqs;      // sequences the cache holds (the decode batch)
    int max_rows;      // tokens of one prefill (the sum of the prompts' lengths)
    int cache_len;     // positions per sequence in the cache (<= max_seq_len)
    T *k_cache, *v_cache; // [L, max_seqs, cache_len, KVD] keys after RoPE, values
    // activations, [rows, ...] with rows = max(max_rows, max_seqs)
    T *x, *x_mid, *normed, *qkv, *att, *proj;
    T* gu;             // [rows, 2H]: g and u of the dense FFN, the sparse FFNs' scratch
    T* last;           // [max_seqs, D] each sequence's last row, final-normed
    T* logits;         // [max_seqs, Vp]
    int *tokens, *row_slot, *row_pos; // [rows]: each row's token, sequence (cache slot) and position
    int* last_row;     // [max_seqs] each prompt's last row
    // the GPU's (NULL on the CPU): the prefill attention's log-sum-exp [max_rows, NH], the decode
    // attention's splits (llmc/cuda_attention_cached.cuh)
    float* lse;
    float *part_o, *part_ml;
    int* splits_done;
    // called before layer l's FFN of a prefill of M rows (the synthetic-sparse
    // benchmark model sets its gates there, llmc/synthetic.h); NULL: nothing
    void (*before_ffn)(void* ctx, int layer, int M);
    void* before_ffn_ctx;
#ifdef __CUDACC__
    SparseDecode sparse_decode; // the sparse FFN of a decode step
    ScreenedGate screen;        // its gate's int8 copy of every layer's Wg (made at the first sparse decode)
    int screen_stale;           // 1: the weights changed since the copy was made
    TwellPrefill twell;         // the TwELL FFN of a prefill
    CudaGraph graph;            // the decode step, for one batch size and FFN
    int use_graph;              // 1 (the default): a decode step is one CUDA graph
    uint16_t* logits_pinned;    // [max_seqs, Vp] bf16 bits: the logits' way to the host
#endif
};

// The cache and buffers of max_seqs sequences, prefills of up to max_rows
// tokens, and cache_len positions per sequence, on the model's device.
template <typename T, typename G>
void infer_state_alloc(InferState<T>* s, const GPT<T, G>* model, int max_seqs, int max_rows, int cache_len) {
    const GPTConfig* c = &model->config;
    size_t L = c->num_layers, D = c->channels, H = c->hidden, QKV = qkv_dim(c), KVD = kv_dim(c);
    int gpu = model->device == DEVICE_CUDA;
    if (max_seqs < 1 || max_rows < 1) { fatal("inference for %d sequences of %d rows in all", max_seqs, max_rows); }
    if (cache_len < 1 || cache_len > c->max_seq_len) { fatal("cache length %d must be 1..%d", cache_len, c->max_seq_len); }
#ifdef __CUDACC__
    if (gpu && (D % 8 != 0 || H % 8 != 0 || !attention_decode_supports(head_size(c)))) {
        fatal("the GPU path needs D %zu and H %zu multiples of 8 and a head size (%d) of 16, 32, 64 or 128", D, H,
              head_size(c));
    }
    if (gpu && main_stream == 0) { cudaCheck(cudaStreamCreateWithFlags(&main_stream, cudaStreamNonBlocking)); }
#endif
    memset(s, 0, sizeof(*s));
    s->max_seqs = max_seqs;
    s->max_rows = max_rows;
    s->cache_len = cache_len;
    size_t rows = max_rows > max_seqs ? max_rows : max_seqs, cache = L * max_seqs * cache_len * KVD;
    struct { void** ptr; size_t bytes; } parts[] = {
        {(void**)&s->k_cache, cache * sizeof(T)}, {(void**)&s->v_cache, cache * sizeof(T)},
        {(void**)&s->x, rows * D * sizeof(T)}, {(void**)&s->x_mid, rows * D * sizeof(T)},
        {(void**)&s->normed, rows * D * sizeof(T)}, {(void**)&s->qkv, rows * QKV * sizeof(T)},
        {(void**)&s->att, rows * D * sizeof(T)}, {(void**)&s->proj, rows * D * sizeof(T)},
        {(void**)&s->gu, rows * 2 * H * sizeof(T)}, {(void**)&s->last, max_seqs * D * sizeof(T)},
        {(void**)&s->logits, (size_t)max_seqs * c->padded_vocab_size * sizeof(T)},
        {(void**)&s->lse, gpu ? (size_t)max_rows * c->num_heads * sizeof(float) : 0},
        {(void**)&s->tokens, rows * sizeof(int)}, {(void**)&s->row_slot, rows * sizeof(int)},
        {(void**)&s->row_pos, rows * sizeof(int)}, {(void**)&s->last_row, max_seqs * sizeof(int)},
    };
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
        if (parts[i].bytes > 0) { *parts[i].ptr = device_malloc(parts[i].bytes, model->device); }
    }
#ifdef __CUDACC__
    if (gpu) {
        sparse_decode_alloc(&s->sparse_decode, max_seqs, (int)H);
        cudaCheck(cudaMallocHost(&s->logits_pinned, (size_t)max_seqs * c->padded_vocab_size * sizeof(uint16_t)));
        twell_prefill_init(&s->twell, (int)L, (int)H);
        attention_decode_alloc(&s->part_o, &s->part_ml, &s->splits_done, max_seqs, c->num_heads, head_size(c), cache_len);
        s->use_graph = 1;
    }
#endif
}

template <typename T, typename G>
void infer_state_free(InferState<T>* s, const GPT<T, G>* model) {
    void* bufs[] = {s->k_cache, s->v_cache, s->x, s->x_mid, s->normed, s->qkv, s->att, s->proj, s->gu, s->last,
                    s->logits, s->lse, s->tokens, s->row_slot, s->row_pos, s->last_row, s->part_o, s->part_ml,
                    s->splits_done};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) { device_free(bufs[i], model->device); }
#ifdef __CUDACC__
    if (model->device == DEVICE_CUDA) {
        sparse_decode_free(&s->sparse_decode);
        screen_gate_free(&s->screen, DEVICE_CUDA);
        twell_prefill_free(&s->twell);
        cuda_graph_free(&s->graph);
        cudaCheck(cudaFreeHost(s->logits_pinned));
    }
#endif
    memset(s, 0, sizeof(*s));
}

// the parameters from fp32 (a checkpoint's), rounded to the model's type on its device
template <typename T, typename G>
void gpt_load_params(GPT<T, G>* model, const float* params) {
#ifdef __CUDACC__
    if constexpr (std::is_same<T, bf16>::value) { upload_bf16(model->params, params, model->num_parameters); } else
#endif
    for (size_t i = 0; i < model->num_parameters; i++) { model->params[i] = (T)params[i]; }
}

// y = x W^T of the cached forward: a decode step's few rows by decode_linear (the GPU's GEMV)
template <typename T>
static void linear_cached(T* y, const T* x, const T* w, int M, int K, int N, int decode) {
    if (decode) { decode_linear(y, x, w, M, N, K); } else { linear_forward(y, x, w, M, K, N); }
}

// Layer l's FFN of the cached forward, s->normed [M, D] -> s->proj: dense
// (FFN_DENSE, and always on the CPU), or on the GPU with FFN_SPARSE the
// active units' weight rows for a decode step (llmc/cuda_sparse_decode.cuh)
// and TwELL for a prefill of enough rows (llmc/cuda_twell.cuh: the packing
// gate, then the fused up + down; its status is read after every layer, and a
// layer whose record buffer was too small is grown and run again, so the
// output is always exact). The one place a layer's FFN is chosen.
template <typename T, typename G>
static void gpt_ffn_cached(GPT<T, G>* model, InferState<T>* s, int l, int M, int decode) {
    const GPTConfig* c = &model->config;
    int D = c->channels, H = c->hidden;
    size_t LH = (size_t)l * H * D;
    const T *wg = model->param[P_WG] + LH, *wu = model->param[P_WU] + LH, *wdT = model->param[P_WDT] + LH;
    if (s->before_ffn) { s->before_ffn(s->before_ffn_ctx, l, M); }
#ifdef __CUDACC__
    if constexpr (std::is_same<T, bf16>::value) {
        if (model->ffn_mode == FFN_SPARSE && decode) {
            ScreenedGate rows = s->screen.q ? screen_gate_rows(&s->screen, l * H, H) : s->screen;
            ffn_sparse_decode(s->proj, &s->sparse_decode, s->normed, wg, wu, wdT, M, D, H, s->screen.q ? &rows : NULL,
                              s->gu);
            return;
        }
        if (model->ffn_mode == FFN_SPARSE && twell_prefill_takes(&s->twell, M, D)) {
            // the layer's hot units (its first ones, llmc/ffn.h) as the dense FFN over them, added to TwELL's
            // over the cold rest; queued before the wait for TwELL's status, so the GPU runs them meanwhile
            int hot = model->ffn[l].hot.units;
            size_t off = (size_t)hot * D;
            do {
                if (hot < H) {
                    twell_prefill_start(&s->twell, l, s->proj, s->normed, wg + off, wu + off, wdT + off, M, D, H - hot,
                                        s->gu);
                }
                if (hot > 0) {
                    ffn_dense_forward(s->proj, s->gu, s->gu + (size_t)M * hot, s->normed, wg, wu, wdT, M, D, hot,
                                      (unsigned long long*)NULL, false, hot < H);
                }
            } while (hot < H && !twell_prefill_done(&s->twell, l));
            return;
        }
    }
#endif
    ffn_dense_forward(s->proj, s->gu, s->gu + (size_t)M * H, s->normed, wg, wu, wdT, M, D, H,
                      (unsigned long long*)NULL, decode, 0, c->activation);
}

// The layers over M rows whose tokens, cache slots and positions are in s;
// leaves the final norm of every row in s->normed. A prefill (decode 0) names
// its prompts' rows: prompt i is rows seq_rows[i] .. seq_rows[i] + seq_lens[i] - 1
// (host arrays, nseq prompts); a decode step has row b in slot b.
template <typename T, typename G>
static void gpt_forward_cached(GPT<T, G>* model, InferState<T>* s, int M, const int* seq_rows, const int* seq_lens,
                               int nseq, int decode) {
    const GPTConfig* c = &model->config;
    int L = c->num_layers, D = c->channels, QKV = qkv_dim(c), hd = head_size(c), NH = c->num_heads;
    int NKV = c->num_kv_heads;
    size_t cache_layer = (size_t)s->max_seqs * s->cache_len * kv_dim(c);
    encoder_forward(s->x, s->tokens, model->param[P_WTE], M, D);
    rmsnorm_forward(s->normed, (G*)NULL, s->x, model->param[P_ATTN_NORM], M, D, c->norm_eps, decode);
    for (int l = 0; l < L; l++) {
        T* kc = s->k_cache + l * cache_layer;
        T* vc = s->v_cache + l * cache_layer;
        linear_cached(s->qkv, s->normed, model->param[P_WQKV] + (size_t)l * QKV * D, M, D, QKV, decode);
        if (decode) {
            attention_decode(s->att, s->part_o, s->part_ml, s->splits_done, s->qkv, kc, vc, s->row_pos, M, NH, NKV,
                             hd, s->cache_len, c->rope_theta);
        } else {
            attention_prefill(s->att, s->lse, s->qkv, kc, vc, s->row_slot, s->row_pos, M, seq_rows, seq_lens, nseq,
                              NH, NKV, hd, s->cache_len, c->rope_theta);
        }
        linear_cached(s->proj, s->att, model->param[P_WO] + (size_t)l * D * D, M, D, D, decode);
        fused_residual_rmsnorm_forward(s->x_mid, s->normed, (G*)NULL, s->x, s->proj,
                                       model->param[P_FFN_NORM] + (size_t)l * D, M, D, c->norm_eps, decode);
        gpt_ffn_cached(model, s, l, M, decode);
        int last = l == L - 1;
        fused_residual_rmsnorm_forward(s->x, s->normed, (G*)NULL, s->x_mid, s->proj,
                                       last ? model->param[P_FINAL_NORM] : model->param[P_ATTN_NORM] + (size_t)(l + 1) * D,
                                       M, D, c->norm_eps, decode);
    }
}

// the first n rows of s->logits into logits (host floats [n, Vp]; NULL: none),
// once the device's work is done
template <typename T, typename G>
static void gpt_logits_out(GPT<T, G>* model, InferState<T>* s, int n, float* logits) {
    size_t count = (size_t)n * model->config.padded_vocab_size;
#ifdef __CUDACC__
    if constexpr (std::is_same<T, bf16>::value) {
        if (logits) {
            cudaCheck(cudaMemcpyAsync(s->logits_pinned, s->logits, count * sizeof(bf16), cudaMemcpyDeviceToHost,
                                      main_stream));
        }
        cudaCheck(cudaStreamSynchronize(main_stream));
        for (size_t i = 0; logits && i < count; i++) { logits[i] = float_from_bf16(s->logits_pinned[i]); }
    } else
#endif
    for (size_t i = 0; logits && i < count; i++) { logits[i] = (float)s->logits[i]; }
}

// Prefill: prompt i (tokens[first_i .. first_i + lens[i]), the prompts
// concatenated) fills cache slot i from position 0. logits (host, [nseq, Vp],
// may be NULL) gets each prompt's last-token logits.
template <typename T, typename G>
void gpt_prefill(GPT<T, G>* model, InferState<T>* s, const int* tokens, const int* lens, int nseq, float* logits) {
    const GPTConfig* c = &model->config;
    gpt_check_ffn_activation(model);
    if (nseq < 1 || nseq > s->max_seqs) { fatal("prefill of %d prompts, the model holds 1 to %d", nseq, s->max_seqs); }
    int M = 0;
    int* seq_rows = (int*)mallocCheck(nseq * sizeof(int));
    for (int i = 0; i < nseq; i++) {
        if (lens[i] < 1 || lens[i] > s->cache_len) {
            fatal("prompt %d has %d tokens, the cache holds 1 to %d", i, lens[i], s->cache_len);
        }
        seq_rows[i] = M;
        M += lens[i];
    }
    if (M > s->max_rows) { fatal("prefill of %d tokens, the model was sized for %d", M, s->max_rows); }
    int* host = (int*)mallocCheck((size_t)2 * M * sizeof(int) + nseq * sizeof(int));
    int *slot = host, *pos = host + M, *last = host + 2 * M;
    for (int i = 0; i < nseq; i++) {
        for (int t = 0; t < lens[i]; t++) { slot[seq_rows[i] + t] = i; pos[seq_rows[i] + t] = t; }
        last[i] = seq_rows[i] + lens[i] - 1;
    }
    device_upload(s->tokens, tokens, M * sizeof(int), model->device);
    device_upload(s->row_slot, slot, M * sizeof(int), model->device);
    device_upload(s->row_pos, pos, M * sizeof(int), model->device);
    device_upload(s->last_row, last, nseq * sizeof(int), model->device);
    gpt_forward_cached(model, s, M, seq_rows, lens, nseq, 0);
    gather_rows(s->last, s->normed, s->last_row, nseq, c->channels);
    linear_forward(s->logits, s->last, model->param[output_head(c)], nseq, c->channels, c->padded_vocab_size);
    gpt_logits_out(model, s, nseq, logits);
    free(host);
    free(seq_rows);
}

// one decode step of B sequences as queued work (what the graph holds)
template <typename T, typename G>
static void gpt_decode_step(GPT<T, G>* model, InferState<T>* s, int B) {
    const GPTConfig* c = &model->config;
    gpt_forward_cached(model, s, B, (const int*)NULL, (const int*)NULL, B, 1);
    decode_linear(s->logits, s->normed, model->param[output_head(c)], B, c->padded_vocab_size, c->channels);
}

#ifdef __CUDACC__
// The hot units of a model's TwELL prefills (llmc/ffn.h), from one calibration
// prefill of the given prompts with the dense FFN: before each layer's FFN its
// gate runs once more into the scratch and counts how often each unit fires;
// at the middle layer the costs are measured on its real input (the dense FFN
// over FFN_HOT_PROBE and 4 FFN_HOT_PROBE units, TwELL over all of them, the
// gate alone). Then each layer's hot set is the number of busiest units with
// the least modelled prefill time, and its units are reordered (the weights'
// rows of Wg, Wu, WdT: the same function) with the hot ones first.
struct HotCalibration {
    GPT<bf16, float>* model;
    InferState<bf16>* s;
    uint32_t* count; // [L, H] on the device
    FfnCosts costs;
    int verbose;
};

static void gpt_hot_calibrate_layer(void* ctx, int l, int M) {
    HotCalibration* cal = (HotCalibration*)ctx;
    GPT<bf16, float>* model = cal->model;
    InferState<bf16>* s = cal->s;
    const int D = model->config.channels, H = model->config.hidden, L = model->config.num_layers;
    const size_t LH = (size_t)l * H * D;
    const bf16 *wg = model->param[P_WG] + LH, *wu = model->param[P_WU] + LH, *wdT = model->param[P_WDT] + LH;
    gemm(s->gu, s->normed, wg, M, H, D, 0, 1, 0);
    unit_count_add(cal->count + (size_t)l * H, s->gu, M, H);
    if (l != L / 2 || !twell_prefill_supports(D)) { return; }
    std::vector<uint32_t> count(H);
    device_copy(count.data(), cal->count + (size_t)l * H, H * sizeof(uint32_t), DEVICE_CUDA);
    double pairs = 0;
    for (uint32_t c : count) { pairs += c; }
    int large = H < 4 * FFN_HOT_PROBE ? H : 4 * FFN_HOT_PROBE, small = large / 4 > 0 ? large / 4 : 1;
    auto dense = [&](int units) {
        return gpt_time(DEVICE_CUDA, [&] {
            ffn_dense_forward(s->proj, s->gu, s->gu + (size_t)M * units, s->normed, wg, wu, wdT, M, D, units,
                              (unsigned long long*)NULL);
        });
    };
    double dense_small = dense(small), dense_large = dense(large);
    double gate = gpt_time(DEVICE_CUDA, [&] { gemm(s->gu, s->normed, wg, M, H, D, 0, 1, 0); });
    double sparse = gpt_time(DEVICE_CUDA, [&] {
        twell_prefill_layer(&s->twell, l, s->proj, s->normed, wg, wu, wdT, M, D, H, s->gu);
    });
    cal->costs = ffn_costs(dense_small, small, dense_large, large, gate, sparse, pairs, H, M);
    if (cal->verbose) {
        printf("hot units: costs measured on layer %d of a prefill of %d tokens: the dense FFN over %d / %d units "
               "%.3f / %.3f ms, TwELL over all %.3f ms (its gate %.3f) at %.1f pairs per token\n", l, M, small,
               large, 1e3 * dense_small, 1e3 * dense_large, 1e3 * sparse, 1e3 * gate, pairs / M);
    }
}

static void gpt_hot_calibrate(GPT<bf16, float>* model, InferState<bf16>* s, const int* tokens, const int* lens,
                              int nseq, int verbose) {
    const int L = model->config.num_layers, H = model->config.hidden, D = model->config.channels;
    int M = 0;
    for (int i = 0; i < nseq; i++) { M += lens[i]; }
    HotCalibration cal = {model, s, (uint32_t*)cuda_malloc((size_t)L * H * sizeof(uint32_t)), {}, verbose};
    cudaCheck(cudaMemset(cal.count, 0, (size_t)L * H * sizeof(uint32_t)));
    int ffn_mode = model->ffn_mode;
    model->ffn_mode = FFN_DENSE;
    s->before_ffn = gpt_hot_calibrate_layer;
    s->before_ffn_ctx = &cal;
    gpt_prefill(model, s, tokens, lens, nseq, (float*)NULL);
    s->before_ffn = NULL;
    s->before_ffn_ctx = NULL;
    model->ffn_mode = ffn_mode;
    std::vector<uint32_t> count((size_t)L * H);
    device_copy(count.data(), cal.count, count.size() * sizeof(uint32_t), DEVICE_CUDA);
    cuda_free(cal.count);
    std::vector<int> perm(H);
    int* dev_perm = (int*)cuda_malloc(H * sizeof(int));
    bf16* tmp = (bf16*)cuda_malloc((size_t)H * D * sizeof(bf16));
    for (int l = 0; l < L && cal.costs.dense1 > 0; l++) {
        int units = ffn_hot_choose(perm.data(), count.data() + (size_t)l * H, H, model->ffn[l].hot.units, M, &cal.costs);
        if (units < 0) { continue; }
        device_copy(dev_perm, perm.data(), H * sizeof(int), DEVICE_CUDA);
        gpt_permute_units(model, l, dev_perm, tmp);
        if (verbose) {
            printf("hot units: layer %d: %d hot units, %.0f%% of the firing\n", l, units,
                   100 * ffn_hot_share(count.data() + (size_t)l * H, perm.data(), H, units));
        }
        model->ffn[l].hot.units = units;
    }
    cudaCheck(cudaStreamSynchronize(main_stream));
    cuda_free(tmp);
    cuda_free(dev_perm);
    s->screen_stale = 1; // the gates' rows moved
}
#endif

// Decode: sequence b (cache slot b) gets tokens[b] at position pos[b] (its
// cache holds 0..pos[b]-1); logits (host, [B, Vp], may be NULL) gets the
// next-token logits.
template <typename T, typename G>
void gpt_decode(GPT<T, G>* model, InferState<T>* s, const int* tokens, const int* pos, int B, float* logits) {
    if (B < 1 || B > s->max_seqs) { fatal("decode of %d sequences, the model holds 1 to %d", B, s->max_seqs); }
    for (int b = 0; b < B; b++) {
        if (pos[b] < 0 || pos[b] >= s->cache_len) {
            fatal("decode at position %d, the cache holds 0 to %d", pos[b], s->cache_len - 1);
        }
    }
    device_upload(s->tokens, tokens, B * sizeof(int), model->device);
    device_upload(s->row_pos, pos, B * sizeof(int), model->device);
#ifdef __CUDACC__
    if constexpr (std::is_same<T, bf16>::value) {
        const GPTConfig* c = &model->config;
        if (model->device == DEVICE_CUDA && model->ffn_mode == FFN_SPARSE && B <= SCREEN_MAX_ROWS &&
            screened_gate_fits(B, c->channels) && (s->screen.q == NULL || s->screen_stale)) {
            // the int8 copy of the gates, outside any graph (a graph keeps its pointers, not its contents)
            if (s->screen.q == NULL) { s->screen = screen_gate_create(c->num_layers * c->hidden, c->channels, DEVICE_CUDA); }
            screen_quantize(&s->screen, model->param[P_WG]);
            s->screen_stale = 0;
        }
    }
    if (model->device == DEVICE_CUDA && s->use_graph) { // captured again when the batch or the FFN changes
        cuda_graph_launch(&s->graph, 4LL * B + model->ffn_mode, [&] { gpt_decode_step(model, s, B); });
        gpt_logits_out(model, s, B, logits);
        return;
    }
#endif
    gpt_decode_step(model, s, B);
    gpt_logits_out(model, s, B, logits);
}

#endif // LLMC_GPT_H
