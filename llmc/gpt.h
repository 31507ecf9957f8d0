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

 The FFN of a layer is llmc/ffn/ffn.h's: it runs dense or sparse as
 model->ffn.mode says, and gpt_stats_read gives it each step's statistics to
 choose from; this file never names a sparse format.

 A forward with targets makes the logits GPT_LOGITS_BYTES at a time (all at once
 where they fit): per slice of rows, the head, the cross-entropy and, when it is
 told to, dlogits in place and the head's backward at once (dL/d final_out into
 d_tmp, the head's gradient summed), so a 16384 x 50304 micro-batch keeps 256 MiB
 of logits, not 1.6 GiB. A forward without targets keeps every row's logits for
 its caller, so they must fit.

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
#include "llmc/device_ops.h"
#include "llmc/ffn/ffn.h"
#ifdef __CUDACC__
#include "llmc/cuda_attention.cuh"
#include "llmc/cuda_classifier.cuh"
#include "llmc/cuda_encoder.cuh"
#include "llmc/cuda_matmul.cuh"
#include "llmc/cuda_rmsnorm.cuh"
#include "llmc/cuda_rope.cuh"
#endif
#include "llmc/memory.h"
#include "llmc/model.h"
#include "llmc/rng.h"
#include "llmc/utils.h"

#define GPT_LOGITS_BYTES ((size_t)256 << 20) // the logits a forward with targets holds at once (see the top)

template <typename T, typename G>
struct Activations {
    T* x_res;      // [L+1, M, D] residual stream entering each layer; [L] enters the final norm
    T* x_mid;      // [L, M, D] after the attention residual add
    T* attn_in;    // [M, D] RMSNorm output feeding qkv, the latest layer's (the backward recomputes each layer's
                   // from x_res and attn_rstd: 2 L M D bytes fewer for it and ffn_in)
    G* attn_rstd;  // [L, M]
    T* qkv;        // [L, M, QKV] q and k after RoPE
    T* att;        // [L, M, D] attention output before Wo
    G* lse;        // [L, B, NH, T] attention log-sum-exp per query
    T* ffn_in;     // [M, D] RMSNorm output f, the latest layer's (recomputed from x_mid and ffn_rstd)
    G* ffn_rstd;   // [L, M]
    G* row_l1;     // [L, M] sum_n |h|
    int* row_active; // [L, M] firing units
    T* final_out;  // [M, D]
    G* final_rstd; // [M]
    T* logits;     // [logits_rows, Vp]; replaced by dlogits when the forward is told to
    int logits_rows; // M, or the rows of a slice when the micro-batch's logits pass the model's logits_bytes
    G* losses;     // [M]
    // scratch
    T* proj;       // [M, D] output of Wo and Wd before the residual add
    T* d_res;      // [M, D] gradient of the loss wrt the residual stream
    T* d_tmp;      // [M, D]
    T* d_qkv;      // [M, QKV]
    G* scratch;    // attention and norm backward scratch
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
    size_t logits_bytes; // the most logits the activations hold (GPT_LOGITS_BYTES; set before the first forward)
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
    Ffn<T> ffn;        // the FFN of every layer (llmc/ffn/ffn.h): set its mode and recompute before the first forward
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
    ffn_init(&model->ffn, config, model->param[P_WG], model->param[P_WU], model->param[P_WDT], device);
    model->logits_bytes = GPT_LOGITS_BYTES;
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

template <typename T, typename G>
void gpt_alloc_activations(GPT<T, G>* model, int B, int T_) {
    const GPTConfig* c = &model->config;
    size_t L = c->num_layers, M = (size_t)B * T_, D = c->channels;
    size_t QKV = qkv_dim(c), NH = c->num_heads, Vp = c->padded_vocab_size;
    Activations<T, G>* a = &model->acts;
    // attention backward wants B*NKV*T values (CPU) or B*NH*T (GPU: a delta per query);
    // the norm backward (GPU) wants a block's partial sums of D
    size_t scratch = M * NH > 1024 * D ? M * NH : 1024 * D;
    size_t logits_rows = model->logits_bytes / (Vp * sizeof(T));
    if (logits_rows >= 128) { logits_rows -= logits_rows % 128; } // (whole tiles of the head's products)
    a->logits_rows = (int)(logits_rows < 1 ? 1 : logits_rows < M ? logits_rows : M);
    struct { void** ptr; size_t bytes; } parts[] = {
        {(void**)&a->x_res, (L + 1) * M * D * sizeof(T)}, {(void**)&a->x_mid, L * M * D * sizeof(T)},
        {(void**)&a->attn_in, M * D * sizeof(T)}, {(void**)&a->attn_rstd, L * M * sizeof(G)},
        {(void**)&a->qkv, L * M * QKV * sizeof(T)}, {(void**)&a->att, L * M * D * sizeof(T)},
        {(void**)&a->lse, L * M * NH * sizeof(G)}, {(void**)&a->ffn_in, M * D * sizeof(T)},
        {(void**)&a->ffn_rstd, L * M * sizeof(G)}, {(void**)&a->row_l1, L * M * sizeof(G)}, {(void**)&a->row_active, L * M * sizeof(int)},
        {(void**)&a->final_out, M * D * sizeof(T)}, {(void**)&a->final_rstd, M * sizeof(G)},
        {(void**)&a->logits, a->logits_rows * Vp * sizeof(T)}, {(void**)&a->losses, M * sizeof(G)},
        {(void**)&a->proj, M * D * sizeof(T)}, {(void**)&a->d_res, M * D * sizeof(T)},
        {(void**)&a->d_tmp, M * D * sizeof(T)}, {(void**)&a->d_qkv, M * QKV * sizeof(T)},
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
    model->B = B;
    model->T_ = T_;
    // the GPU's fused sparse gate keeps its words in d_qkv, which only the backward uses
    ffn_alloc_batch(&model->ffn, (int)M, a->d_qkv, M * QKV * sizeof(T));
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
    ffn_free(&model->ffn);
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
    }
    free(fired);
    ffn_stats_update(&model->ffn, model->stats, model->unit_count_host);
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

// the parameters from fp32 (a checkpoint's), rounded to the model's type on its device
template <typename T, typename G>
void gpt_load_params(GPT<T, G>* model, const float* params) {
    device_upload_params(model->params, params, model->num_parameters, model->device);
}

// layer l's norm output as its forward computed it, from the residual stream and rstd it kept: the norm
// before the FFN into ffn_in (ffn 1) or the one before attention into attn_in (ffn 0), which it returns; the
// forward keeps only the latest layer's
template <typename T, typename G>
static T* gpt_norm_output(GPT<T, G>* model, int l, int ffn) {
    const int M = model->B * model->T_, D = model->config.channels;
    Activations<T, G>* a = &model->acts;
    T* out = ffn ? a->ffn_in : a->attn_in;
    rmsnorm_apply(out, (ffn ? a->x_mid : a->x_res) + (size_t)l * M * D, (ffn ? a->ffn_rstd : a->attn_rstd) + (size_t)l * M,
                  model->param[ffn ? P_FFN_NORM : P_ATTN_NORM] + (size_t)l * D, M, D);
    return out;
}

// The FFN's paths after optimizer step `step` of `tokens` tokens (llmc/ffn/hot.h,
// ffn_path_update), from the step's firing counts (gpt_stats_read); what is
// timed runs on a layer's input of the last step, with the projection and
// gradient buffers as scratch (all rewritten before they are read again).
template <typename T, typename G>
void gpt_ffn_update(GPT<T, G>* model, int step, double tokens, int verbose) {
    int M = model->B * model->T_, D = model->config.channels, H = model->config.hidden;
    Activations<T, G>* a = &model->acts;
    auto probe = [&](int l) {
        size_t LD = (size_t)l * H * D;
        return FfnProbe<T, G>{gpt_norm_output(model, l, 1), a->proj, a->d_tmp, a->d_res, model->grad[P_WG] + LD,
                              model->grad[P_WU] + LD, model->grad[P_WDT] + LD, a->row_l1 + (size_t)l * M,
                              a->row_active + (size_t)l * M};
    };
    ffn_path_update(&model->ffn, step, tokens, model->unit_count_host, probe, verbose);
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
        T* ffn_in = a->ffn_in;

        linear_forward(qkv, a->attn_in, model->param[P_WQKV] + (size_t)l * QKV * D, M, D, QKV);
        rope_forward(qkv, B, T_, 0, NH, NKV, hd, c->rope_theta);
        attention_forward(att, a->lse + (size_t)l * M * NH, qkv, B, T_, NH, NKV, hd);
        linear_forward(a->proj, att, model->param[P_WO] + (size_t)l * D * D, M, D, D);
        fused_residual_rmsnorm_forward(a->x_mid + l * MD, ffn_in, a->ffn_rstd + (size_t)l * M, a->x_res + l * MD,
                                       a->proj, model->param[P_FFN_NORM] + (size_t)l * D, M, D, c->norm_eps);

        ffn_forward(&model->ffn, l, a->proj, a->row_l1 + (size_t)l * M, a->row_active + (size_t)l * M,
                    model->fired + (size_t)l * H, ffn_in);
        // the residual add, fused with the norm of the next layer (or the final norm)
        int last = l == L - 1;
        fused_residual_rmsnorm_forward(a->x_res + (l + 1) * MD, last ? a->final_out : a->attn_in,
                                       last ? a->final_rstd : a->attn_rstd + (size_t)(l + 1) * M, a->x_mid + l * MD,
                                       a->proj, last ? model->param[P_FINAL_NORM] : model->param[P_ATTN_NORM] + (size_t)(l + 1) * D,
                                       M, D, c->norm_eps);
    }
}

// Forward over B sequences of T tokens (inputs and targets on the model's
// device). With targets, adds the losses and the sparsity statistics to the
// sums; with dloss > 0, also leaves for gpt_backward dlogits = dloss *
// dCE/dlogits in place of the logits, or, where the logits come in slices (see
// the top of the file), dL/d final_out in d_tmp and the head's gradient summed.
// Without targets, the logits of every row (which must fit logits_bytes).
template <typename T, typename G>
void gpt_forward(GPT<T, G>* model, const int* inputs, const int* targets, int B, int T_, float dloss) {
    const GPTConfig* c = &model->config;
    if (T_ > c->max_seq_len) { fatal("sequence length %d exceeds max_seq_len %d", T_, c->max_seq_len); }
    if (model->acts_memory == NULL) { gpt_alloc_activations(model, B, T_); }
    if (B != model->B || T_ != model->T_) {
        fatal("batch %dx%d differs from the %dx%d the activations were sized for", B, T_, model->B, model->T_);
    }
    int L = c->num_layers, D = c->channels, M = B * T_, Vp = c->padded_vocab_size;
    Activations<T, G>* a = &model->acts;
    const int rows = a->logits_rows, head = output_head(c);
    if (!targets && rows < M) {
        fatal("a forward without targets keeps every row's logits: %d rows of %d do not fit the model's logits_bytes "
              "(%zu; %d rows)", M, Vp, model->logits_bytes, rows);
    }

    // a redo after a sparse tail overflow gives the same patterns, now all held
    do {
        gpt_forward_layers(model, inputs);
    } while (ffn_overflowed(&model->ffn));
    if (dloss > 0 && rows < M && model->grads == NULL) { gpt_zero_grad(model); }
    for (int r0 = 0; r0 < M; r0 += rows) {
        const int n = rows < M - r0 ? rows : M - r0;
        const T* x = a->final_out + (size_t)r0 * D;
        linear_forward(a->logits, x, model->param[head], n, D, Vp);
        if (!targets) { continue; }
        crossentropy_forward_backward(dloss > 0 ? a->logits : (T*)NULL, a->losses + r0, a->logits, targets + r0, n,
                                      c->vocab_size, Vp, dloss);
        if (dloss > 0 && rows < M) { // this slice's dlogits, used before the next slice takes their place
            linear_backward(a->d_tmp + (size_t)r0 * D, model->grad[head], a->logits, x, model->param[head], n, D, Vp, 0);
        }
    }
    if (targets) { device_stats_accumulate(model->stats_acc, a->losses, a->row_l1, a->row_active, L, M, model->device); }
}

// Backward of the last forward (which must have been given dloss > 0).
// Gradients accumulate into model->grads. l1_scale = lambda / (L * M * accum * P)
// (P processes: their gradients are summed) is the derivative of the L1 term
// with respect to each |h|.
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

    // classifier (unless the forward did it, slice by slice) and final norm
    if (a->logits_rows == M) {
        linear_backward(a->d_tmp, model->grad[output_head(c)], a->logits, a->final_out, model->param[output_head(c)], M,
                        D, Vp, 0);
    }
    device_zero(d_res, MD * sizeof(T), model->device);
    rmsnorm_backward(d_res, model->grad[P_FINAL_NORM], a->scratch, a->d_tmp, a->x_res + L * MD,
                     model->param[P_FINAL_NORM], a->final_rstd, M, D);

    for (int l = L - 1; l >= 0; l--) {
        size_t LHD = (size_t)l * H * D;
        // FFN: x_out = x_mid + h Wd^T; d_res is dL/dx_out and passes through to x_mid
        ffn_backward(&model->ffn, l, a->d_tmp, model->grad[P_WG] + LHD, model->grad[P_WU] + LHD,
                     model->grad[P_WDT] + LHD, model->unit_count + (size_t)l * H, d_res, gpt_norm_output(model, l, 1),
                     a->row_l1 + (size_t)l * M, a->row_active + (size_t)l * M, model->fired + (size_t)l * H, l1_scale);
        rmsnorm_backward(d_res, model->grad[P_FFN_NORM] + (size_t)l * D, a->scratch, a->d_tmp, a->x_mid + l * MD,
                         model->param[P_FFN_NORM] + (size_t)l * D, a->ffn_rstd + (size_t)l * M, M, D);

        // attention: x_mid = x + att Wo^T
        linear_backward(a->d_tmp, model->grad[P_WO] + (size_t)l * D * D, d_res, a->att + l * MD,
                        model->param[P_WO] + (size_t)l * D * D, M, D, D, 0);
        attention_backward(a->d_qkv, a->scratch, a->d_tmp, a->att + l * MD, a->qkv + (size_t)l * M * QKV,
                           a->lse + (size_t)l * M * NH, B, T_, NH, NKV, hd);
        rope_backward(a->d_qkv, B, T_, NH, NKV, hd, c->rope_theta);
        linear_backward(a->d_tmp, model->grad[P_WQKV] + (size_t)l * QKV * D, a->d_qkv, gpt_norm_output(model, l, 0),
                        model->param[P_WQKV] + (size_t)l * QKV * D, M, D, QKV, 0);
        rmsnorm_backward(d_res, model->grad[P_ATTN_NORM] + (size_t)l * D, a->scratch, a->d_tmp, a->x_res + l * MD,
                         model->param[P_ATTN_NORM] + (size_t)l * D, a->attn_rstd + (size_t)l * M, M, D);
        if (model->grads_ready) { model->grads_ready(model->grads_ready_ctx, l); }
    }
    encoder_backward(model->grad[P_WTE], d_res, inputs, M, D);
    if (model->grads_ready) { model->grads_ready(model->grads_ready_ctx, -1); }
}

#endif // LLMC_GPT_H
