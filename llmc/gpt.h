/*
 The model's forward and backward orchestration over the kernels of
 llmc/cpu_ops.h, and the cached single-sequence forward that `infer` uses.

     x = E[t]
     per layer:  x += Attn(RMSNorm(x)) Wo^T
                 f = RMSNorm(x);  h = relu(f Wg^T) * (f Wu^T);  x += h Wd^T
     logits = RMSNorm(x) E^T
     loss = CE + lambda * (1/L) sum_l (1/M) sum |h_l|

 GPT<T> owns parameters, gradients and the activations of one micro-batch in
 flat buffers whose layout (llmc/model.h) a GPU can use unchanged.
*/
#ifndef LLMC_GPT_H
#define LLMC_GPT_H

#include <stdint.h>
#include "llmc/cpu_ops.h"
#include "llmc/model.h"
#include "llmc/rng.h"
#include "llmc/utils.h"

// per-layer sparsity statistics of the last forward
typedef struct {
    double l1;       // mean over tokens of sum_n |h[m, n]|
    double l0_mean;  // mean number of firing units per token
    int l0_max;      // most firing units of any token
} LayerStats;

template <typename T>
struct Activations {
    T* x_res;      // [L+1, M, D] residual stream entering each layer; [L] enters the final norm
    T* x_mid;      // [L, M, D] after the attention residual add
    T* attn_in;    // [L, M, D] RMSNorm output feeding qkv
    T* attn_rstd;  // [L, M]
    T* qkv;        // [L, M, QKV] q and k after RoPE
    T* probs;      // [L, B, NH, T, T]
    T* att;        // [L, M, D] attention output before Wo
    T* ffn_in;     // [L, M, D] RMSNorm output f
    T* ffn_rstd;   // [L, M]
    T* g;          // [L, M, H] gate pre-activation
    T* u;          // [L, M, H] up projection
    T* h;          // [L, M, H] relu(g) * u
    T* final_out;  // [M, D]
    T* final_rstd; // [M]
    T* logits;     // [M, Vp]; replaced by dlogits when the forward is told to
    // backward scratch
    T* d_res;      // [M, D]
    T* d_tmp;      // [M, D]
    T* d_qkv;      // [M, QKV]
    T* d_h;        // [M, H], also dg
    T* d_u;        // [M, H]
    T* d_probs;    // [B, NKV, T]
};

template <typename T>
struct GPT {
    GPTConfig config;
    size_t num_parameters;
    T* params;
    T* grads;      // NULL until the first backward
    T* param[NUM_PARAM_TENSORS];
    T* grad[NUM_PARAM_TENSORS];
    int B, T_;     // micro-batch the activations are sized for (0 until the first forward)
    Activations<T> acts;
    T* acts_memory;
    float* losses; // [M] per-token CE of the last forward
    // results of the last forward
    double ce;           // mean CE
    double l1_term;      // (1/L) sum_l mean_m sum_n |h|, before lambda
    LayerStats* stats;   // [L]
    uint8_t* fired;      // [L, H]: unit fired since the last gpt_reset_fired
};

template <typename T>
void gpt_point_tensors(T* base, T* ptrs[NUM_PARAM_TENSORS], const GPTConfig* c) {
    size_t offsets[NUM_PARAM_TENSORS];
    param_offsets(offsets, c);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) { ptrs[i] = base + offsets[i]; }
}

template <typename T>
void gpt_build(GPT<T>* model, const GPTConfig* config) {
    config_validate(config);
    memset(model, 0, sizeof(*model));
    model->config = *config;
    model->num_parameters = num_parameters(config);
    model->params = (T*)mallocCheck(model->num_parameters * sizeof(T));
    gpt_point_tensors(model->params, model->param, config);
    model->stats = (LayerStats*)callocCheck(config->num_layers, sizeof(LayerStats));
    model->fired = (uint8_t*)callocCheck((size_t)config->num_layers * config->hidden, 1);
}

// every matrix N(0, 0.02), norm weights 1, the padded vocab rows 0
template <typename T>
void gpt_init_random(GPT<T>* model, uint64_t seed) {
    size_t sizes[NUM_PARAM_TENSORS];
    param_sizes(sizes, &model->config);
    uint64_t rng = seed;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        T* p = model->param[i];
        for (size_t j = 0; j < sizes[i]; j++) {
            p[j] = param_is_matrix(i) ? (T)(0.02 * rng_normal(&rng)) : (T)1;
        }
    }
    const GPTConfig* c = &model->config;
    size_t real = (size_t)c->vocab_size * c->channels;
    memset(model->param[P_WTE] + real, 0, (sizes[P_WTE] - real) * sizeof(T));
}

template <typename T>
void gpt_alloc_activations(GPT<T>* model, int B, int T_) {
    const GPTConfig* c = &model->config;
    size_t L = c->num_layers, M = (size_t)B * T_, D = c->channels, H = c->hidden;
    size_t QKV = qkv_dim(c), NH = c->num_heads, Vp = c->padded_vocab_size;
    struct { T** ptr; size_t n; } parts[] = {
        {&model->acts.x_res, (L + 1) * M * D}, {&model->acts.x_mid, L * M * D},
        {&model->acts.attn_in, L * M * D}, {&model->acts.attn_rstd, L * M},
        {&model->acts.qkv, L * M * QKV}, {&model->acts.probs, L * B * NH * T_ * T_},
        {&model->acts.att, L * M * D}, {&model->acts.ffn_in, L * M * D},
        {&model->acts.ffn_rstd, L * M}, {&model->acts.g, L * M * H},
        {&model->acts.u, L * M * H}, {&model->acts.h, L * M * H},
        {&model->acts.final_out, M * D}, {&model->acts.final_rstd, M},
        {&model->acts.logits, M * Vp}, {&model->acts.d_res, M * D},
        {&model->acts.d_tmp, M * D}, {&model->acts.d_qkv, M * QKV},
        {&model->acts.d_h, M * H}, {&model->acts.d_u, M * H},
        {&model->acts.d_probs, (size_t)B * c->num_kv_heads * T_},
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) { total += parts[i].n; }
    model->acts_memory = (T*)mallocCheck(total * sizeof(T));
    T* p = model->acts_memory;
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) { *parts[i].ptr = p; p += parts[i].n; }
    model->losses = (float*)mallocCheck(M * sizeof(float));
    model->B = B;
    model->T_ = T_;
}

template <typename T>
void gpt_free(GPT<T>* model) {
    free(model->params);
    free(model->grads);
    free(model->acts_memory);
    free(model->losses);
    free(model->stats);
    free(model->fired);
    memset(model, 0, sizeof(*model));
}

template <typename T>
void gpt_zero_grad(GPT<T>* model) {
    if (model->grads == NULL) {
        model->grads = (T*)mallocCheck(model->num_parameters * sizeof(T));
        gpt_point_tensors(model->grads, model->grad, &model->config);
    }
    memset(model->grads, 0, model->num_parameters * sizeof(T));
}

template <typename T>
void gpt_reset_fired(GPT<T>* model) {
    memset(model->fired, 0, (size_t)model->config.num_layers * model->config.hidden);
}

// fraction of layer l's units that did not fire since the last gpt_reset_fired
template <typename T>
double gpt_dead_fraction(const GPT<T>* model, int l) {
    int H = model->config.hidden, dead = 0;
    for (int n = 0; n < H; n++) { dead += !model->fired[(size_t)l * H + n]; }
    return (double)dead / H;
}

// Forward over B sequences of T tokens. With targets, computes the mean CE into
// model->ce; with dloss > 0 also leaves dlogits = dloss * dCE/dlogits in place
// of the logits for gpt_backward. Returns the mean CE (0 without targets).
template <typename T>
double gpt_forward(GPT<T>* model, const int* inputs, const int* targets, int B, int T_, T dloss) {
    const GPTConfig* c = &model->config;
    if (T_ > c->max_seq_len) { fatal("sequence length %d exceeds max_seq_len %d", T_, c->max_seq_len); }
    if (model->acts_memory == NULL) { gpt_alloc_activations(model, B, T_); }
    if (B != model->B || T_ != model->T_) {
        fatal("batch %dx%d differs from the %dx%d the activations were sized for", B, T_, model->B, model->T_);
    }
    int L = c->num_layers, D = c->channels, H = c->hidden, M = B * T_;
    int QKV = qkv_dim(c), KVD = kv_dim(c), hd = head_size(c), NH = c->num_heads;
    Activations<T>* a = &model->acts;
    size_t MD = (size_t)M * D, MH = (size_t)M * H;

    encoder_forward(a->x_res, inputs, model->param[P_WTE], M, D);
    double l1_total = 0;
    for (int l = 0; l < L; l++) {
        T* x = a->x_res + l * MD;
        T* x_mid = a->x_mid + l * MD;
        T* attn_in = a->attn_in + l * MD;
        T* qkv = a->qkv + (size_t)l * M * QKV;
        T* att = a->att + l * MD;
        T* ffn_in = a->ffn_in + l * MD;
        T *g = a->g + l * MH, *u = a->u + l * MH, *h = a->h + l * MH;
        T* x_out = a->x_res + (l + 1) * MD;

        rmsnorm_forward(attn_in, a->attn_rstd + (size_t)l * M, x, model->param[P_ATTN_NORM] + (size_t)l * D, M, D, c->norm_eps);
        matmul_forward(qkv, attn_in, model->param[P_WQKV] + (size_t)l * QKV * D, M, D, QKV);
        rope_rotate(qkv, B, T_, 0, QKV, NH, c->num_kv_heads, hd, c->rope_theta, 0);
        AttentionShape s = {B, T_, 0, NH, c->num_kv_heads, hd, QKV, QKV, D,
                            (size_t)T_ * QKV, (size_t)T_ * QKV, (size_t)T_ * D};
        attention_forward(att, a->probs + (size_t)l * B * NH * T_ * T_, qkv, qkv + D, qkv + D + KVD, s);
        matmul_forward(x_mid, att, model->param[P_WO] + (size_t)l * D * D, M, D, D);
        residual_add(x_mid, x, MD);

        rmsnorm_forward(ffn_in, a->ffn_rstd + (size_t)l * M, x_mid, model->param[P_FFN_NORM] + (size_t)l * D, M, D, c->norm_eps);
        matmul_forward(g, ffn_in, model->param[P_WG] + (size_t)l * H * D, M, D, H);
        matmul_forward(u, ffn_in, model->param[P_WU] + (size_t)l * H * D, M, D, H);
        GateStats st = relu_gate_forward(h, g, u, model->fired + (size_t)l * H, M, H);
        gemm_nn(x_out, h, model->param[P_WDT] + (size_t)l * H * D, M, D, H, 0);
        residual_add(x_out, x_mid, MD);

        model->stats[l].l1 = st.l1_sum / M;
        model->stats[l].l0_mean = (double)st.active / M;
        model->stats[l].l0_max = st.max_active;
        l1_total += st.l1_sum / M;
    }
    model->l1_term = l1_total / L;

    rmsnorm_forward(a->final_out, a->final_rstd, a->x_res + L * MD, model->param[P_FINAL_NORM], M, D, c->norm_eps);
    matmul_forward(a->logits, a->final_out, model->param[P_WTE], M, D, c->padded_vocab_size);
    model->ce = 0;
    if (targets) {
        double sum = crossentropy_forward_backward(dloss > 0 ? a->logits : (T*)NULL, model->losses, a->logits,
                                                   targets, M, c->vocab_size, c->padded_vocab_size, dloss);
        model->ce = sum / M;
    }
    return model->ce;
}

// Backward of the last forward (which must have been given dloss > 0).
// Gradients accumulate into model->grads. l1_scale = lambda / (L * M * accum)
// is the derivative of the L1 term with respect to each |h|.
template <typename T>
void gpt_backward(GPT<T>* model, const int* inputs, T l1_scale) {
    const GPTConfig* c = &model->config;
    if (model->grads == NULL) { gpt_zero_grad(model); }
    int B = model->B, T_ = model->T_, M = B * T_;
    int L = c->num_layers, D = c->channels, H = c->hidden, Vp = c->padded_vocab_size;
    int QKV = qkv_dim(c), hd = head_size(c), NH = c->num_heads, NKV = c->num_kv_heads;
    Activations<T>* a = &model->acts;
    size_t MD = (size_t)M * D, MH = (size_t)M * H;
    T* d_res = a->d_res; // gradient of the loss wrt the residual stream, walking down

    // classifier and final norm
    gemm_nn(a->d_tmp, a->logits, model->param[P_WTE], M, D, Vp, 0);
    gemm_tn(model->grad[P_WTE], a->logits, a->final_out, Vp, D, M, 1);
    memset(d_res, 0, MD * sizeof(T));
    rmsnorm_backward(d_res, model->grad[P_FINAL_NORM], a->d_tmp, a->x_res + L * MD, model->param[P_FINAL_NORM],
                     a->final_rstd, M, D);

    for (int l = L - 1; l >= 0; l--) {
        const T* wg = model->param[P_WG] + (size_t)l * H * D;
        const T* wu = model->param[P_WU] + (size_t)l * H * D;
        const T* wdT = model->param[P_WDT] + (size_t)l * H * D;
        const T *g = a->g + l * MH, *u = a->u + l * MH, *h = a->h + l * MH;
        const T* ffn_in = a->ffn_in + l * MD;

        // FFN: x_out = x_mid + h Wd^T; d_res is dL/dx_out and passes through to x_mid
        gemm_nt(a->d_h, d_res, wdT, M, H, D, 0);
        gemm_tn(model->grad[P_WDT] + (size_t)l * H * D, h, d_res, H, D, M, 1);
        relu_gate_backward(a->d_h, a->d_u, a->d_h, g, u, h, l1_scale, M, H);
        gemm_nn(a->d_tmp, a->d_u, wu, M, D, H, 0);
        gemm_nn(a->d_tmp, a->d_h, wg, M, D, H, 1);
        gemm_tn(model->grad[P_WU] + (size_t)l * H * D, a->d_u, ffn_in, H, D, M, 1);
        gemm_tn(model->grad[P_WG] + (size_t)l * H * D, a->d_h, ffn_in, H, D, M, 1);
        rmsnorm_backward(d_res, model->grad[P_FFN_NORM] + (size_t)l * D, a->d_tmp, a->x_mid + l * MD,
                         model->param[P_FFN_NORM] + (size_t)l * D, a->ffn_rstd + (size_t)l * M, M, D);

        // attention: x_mid = x + att Wo^T
        memset(a->d_tmp, 0, MD * sizeof(T));
        matmul_backward(a->d_tmp, model->grad[P_WO] + (size_t)l * D * D, d_res, a->att + l * MD,
                        model->param[P_WO] + (size_t)l * D * D, M, D, D);
        memset(a->d_qkv, 0, (size_t)M * QKV * sizeof(T));
        attention_backward(a->d_qkv, a->d_probs, a->d_tmp, a->qkv + (size_t)l * M * QKV,
                           a->probs + (size_t)l * B * NH * T_ * T_, B, T_, NH, NKV, hd);
        rope_rotate(a->d_qkv, B, T_, 0, QKV, NH, NKV, hd, c->rope_theta, 1);
        memset(a->d_tmp, 0, MD * sizeof(T));
        matmul_backward(a->d_tmp, model->grad[P_WQKV] + (size_t)l * QKV * D, a->d_qkv, a->attn_in + l * MD,
                        model->param[P_WQKV] + (size_t)l * QKV * D, M, D, QKV);
        rmsnorm_backward(d_res, model->grad[P_ATTN_NORM] + (size_t)l * D, a->d_tmp, a->x_res + l * MD,
                         model->param[P_ATTN_NORM] + (size_t)l * D, a->attn_rstd + (size_t)l * M, M, D);
    }
    encoder_backward(model->grad[P_WTE], d_res, inputs, M, D);
}

// ----------------------------------------------------------------------------
// inference: one sequence, a key/value cache, any number of new tokens at a time

template <typename T>
struct InferState {
    int capacity;  // most new tokens per call
    T* k_cache;    // [L, T_max, KVD] keys after RoPE
    T* v_cache;    // [L, T_max, KVD]
    T *x, *normed, *qkv, *att, *tmp, *g, *u, *h, *probs, *logits;
    T* memory;
};

template <typename T>
void infer_state_alloc(InferState<T>* s, const GPTConfig* c, int capacity) {
    size_t L = c->num_layers, Tm = c->max_seq_len, KVD = kv_dim(c), D = c->channels, H = c->hidden;
    size_t n = capacity;
    struct { T** ptr; size_t count; } parts[] = {
        {&s->k_cache, L * Tm * KVD}, {&s->v_cache, L * Tm * KVD}, {&s->x, n * D}, {&s->normed, n * D},
        {&s->qkv, n * qkv_dim(c)}, {&s->att, n * D}, {&s->tmp, n * D}, {&s->g, n * H}, {&s->u, n * H},
        {&s->h, n * H}, {&s->probs, (size_t)c->num_heads * n * Tm}, {&s->logits, (size_t)c->padded_vocab_size},
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) { total += parts[i].count; }
    s->memory = (T*)mallocCheck(total * sizeof(T));
    T* p = s->memory;
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) { *parts[i].ptr = p; p += parts[i].count; }
    s->capacity = capacity;
}

template <typename T>
void infer_state_free(InferState<T>* s) {
    free(s->memory);
    memset(s, 0, sizeof(*s));
}

// Feeds tokens[0..n) at positions pos0..pos0+n-1 (earlier positions are in the
// cache) and leaves the logits of the last one in s->logits.
template <typename T>
void gpt_forward_cached(const GPT<T>* model, InferState<T>* s, const int* tokens, int n, int pos0) {
    const GPTConfig* c = &model->config;
    if (n < 1 || n > s->capacity) { fatal("%d new tokens, the inference state holds 1 to %d", n, s->capacity); }
    if (pos0 + n > c->max_seq_len) { fatal("position %d exceeds max_seq_len %d", pos0 + n, c->max_seq_len); }
    int L = c->num_layers, D = c->channels, H = c->hidden, QKV = qkv_dim(c), KVD = kv_dim(c);
    int hd = head_size(c), NH = c->num_heads, NKV = c->num_kv_heads;
    size_t cache_layer = (size_t)c->max_seq_len * KVD;

    encoder_forward(s->x, tokens, model->param[P_WTE], n, D);
    for (int l = 0; l < L; l++) {
        T* kc = s->k_cache + l * cache_layer;
        T* vc = s->v_cache + l * cache_layer;
        rmsnorm_forward(s->normed, (T*)NULL, s->x, model->param[P_ATTN_NORM] + (size_t)l * D, n, D, c->norm_eps);
        matmul_forward(s->qkv, s->normed, model->param[P_WQKV] + (size_t)l * QKV * D, n, D, QKV);
        rope_rotate(s->qkv, 1, n, pos0, QKV, NH, NKV, hd, c->rope_theta, 0);
        for (int t = 0; t < n; t++) {
            memcpy(kc + (size_t)(pos0 + t) * KVD, s->qkv + (size_t)t * QKV + D, KVD * sizeof(T));
            memcpy(vc + (size_t)(pos0 + t) * KVD, s->qkv + (size_t)t * QKV + D + KVD, KVD * sizeof(T));
        }
        AttentionShape shape = {1, n, pos0, NH, NKV, hd, QKV, KVD, D, 0, 0, 0};
        attention_forward(s->att, s->probs, s->qkv, kc, vc, shape);
        matmul_forward(s->tmp, s->att, model->param[P_WO] + (size_t)l * D * D, n, D, D);
        residual_add(s->x, s->tmp, (size_t)n * D);

        rmsnorm_forward(s->normed, (T*)NULL, s->x, model->param[P_FFN_NORM] + (size_t)l * D, n, D, c->norm_eps);
        matmul_forward(s->g, s->normed, model->param[P_WG] + (size_t)l * H * D, n, D, H);
        matmul_forward(s->u, s->normed, model->param[P_WU] + (size_t)l * H * D, n, D, H);
        relu_gate_forward(s->h, s->g, s->u, (uint8_t*)NULL, n, H);
        gemm_nn(s->tmp, s->h, model->param[P_WDT] + (size_t)l * H * D, n, D, H, 0);
        residual_add(s->x, s->tmp, (size_t)n * D);
    }
    const T* last = s->x + (size_t)(n - 1) * D;
    rmsnorm_forward(s->normed, (T*)NULL, last, model->param[P_FINAL_NORM], 1, D, c->norm_eps);
    matmul_forward(s->logits, s->normed, model->param[P_WTE], 1, D, c->padded_vocab_size);
}

#endif // LLMC_GPT_H
