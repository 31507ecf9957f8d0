/*
 The model's configuration and the layout of its parameters in one flat buffer.
 The same layout serves the CPU path, the GPU path and the checkpoint files.

 Per layer l (tensors of all layers are stacked, layer-major):
   attn_norm [D], wqkv [D + 2*KVD, D] (q, k, v rows of the HF q/k/v_proj),
   wo [D, D], ffn_norm [D], wg [H, D], wu [H, D],
   wdT [H, D] (W_d transposed: row n is the weights of hidden unit n, which is
   what the sparse kernels want contiguous; the HF down_proj is its transpose).
 Plus wte [Vp, D] (input embedding, and the output head unless it is untied),
 final_norm [D], and lm_head [Vp, D], the output head of a model whose head is
 untied (0 elements when tied, so a tied model's layout is the same as before
 the field existed).
*/
#ifndef LLMC_MODEL_H
#define LLMC_MODEL_H

#include <stddef.h>
#include <string.h>
#include "llmc/utils.h"

typedef struct {
    int vocab_size;        // V: real tokens; logits past it are never sampled nor trained
    int padded_vocab_size; // Vp: V rounded up to a multiple of 128
    int num_layers;        // L
    int channels;          // D
    int num_heads;         // NH
    int num_kv_heads;      // NKV (grouped-query attention when < NH)
    int hidden;            // H: FFN width
    int max_seq_len;       // T_max
    float rope_theta;
    float norm_eps;
    int activation;        // FfnActivation of the FFN's gate (0, ReLU, in every config that predates the field)
    int untied_head;       // 1: the output head is its own tensor lm_head; 0: it is wte (tied)
} GPTConfig;

// the FFN's gate activation, h = act(g) * u: ReLU, which the sparse paths and the L1 term need, or SiLU
// (Llama's), which trains and runs dense only
typedef enum { ACT_RELU = 0, ACT_SILU = 1 } FfnActivation;

static const char* const activation_names[2] = {"relu", "silu"};

// the FfnActivation called name, or -1
static inline int find_activation(const char* name) {
    for (int i = 0; i < 2; i++) {
        if (strcmp(activation_names[i], name) == 0) { return i; }
    }
    return -1;
}

enum {
    P_WTE, P_ATTN_NORM, P_WQKV, P_WO, P_FFN_NORM, P_WG, P_WU, P_WDT, P_FINAL_NORM, P_LM_HEAD,
    NUM_PARAM_TENSORS
};

static const char* const param_names[NUM_PARAM_TENSORS] = {
    "wte", "attn_norm", "wqkv", "wo", "ffn_norm", "wg", "wu", "wdT", "final_norm", "lm_head",
};

// the tensor that holds the output head: lm_head when untied, else the embedding
static inline int output_head(const GPTConfig* c) { return c->untied_head ? P_LM_HEAD : P_WTE; }

static inline int head_size(const GPTConfig* c) { return c->channels / c->num_heads; }
static inline int kv_dim(const GPTConfig* c) { return c->num_kv_heads * head_size(c); }
static inline int qkv_dim(const GPTConfig* c) { return c->channels + 2 * kv_dim(c); }

static inline int round_up(int x, int multiple) { return (x + multiple - 1) / multiple * multiple; }

// the FFN state a checkpoint keeps (llmc/ffn/ffn.h, ffn_state_get): 12 ints per layer and the hot-unit policy
// (6 floats); older files still read hold 3 per layer (before the hot/cold split), 4 per layer and 4 (before
// the layers' paths were measured), 9 per layer and 5 (before the cold part's constant), 9 per layer and 6
// (before the busiest units' own pair price) or 11 per layer and 6 (before the prices' miss)
static inline int ffn_state_ints(int num_layers) { return 12 * num_layers + 6; }
static inline int ffn_state_ints_known(int n, int num_layers) {
    return n == ffn_state_ints(num_layers) || n == 11 * num_layers + 6 || n == 9 * num_layers + 6 ||
           n == 9 * num_layers + 5 || n == 3 * num_layers || n == 4 * num_layers + 4;
}

static inline void param_sizes(size_t sizes[NUM_PARAM_TENSORS], const GPTConfig* c) {
    size_t L = c->num_layers, D = c->channels, H = c->hidden;
    sizes[P_WTE] = (size_t)c->padded_vocab_size * D;
    sizes[P_ATTN_NORM] = L * D;
    sizes[P_WQKV] = L * qkv_dim(c) * D;
    sizes[P_WO] = L * D * D;
    sizes[P_FFN_NORM] = L * D;
    sizes[P_WG] = L * H * D;
    sizes[P_WU] = L * H * D;
    sizes[P_WDT] = L * H * D;
    sizes[P_FINAL_NORM] = D;
    sizes[P_LM_HEAD] = c->untied_head ? (size_t)c->padded_vocab_size * D : 0;
}

static inline size_t num_parameters(const GPTConfig* c) {
    size_t sizes[NUM_PARAM_TENSORS], total = 0;
    param_sizes(sizes, c);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) { total += sizes[i]; }
    return total;
}

// the model's own parameters, for people: without the padding rows of wte (and lm_head), which are zero and
// never read (Hugging Face's count of the same model)
static inline size_t num_model_parameters(const GPTConfig* c) {
    return num_parameters(c) - (size_t)(c->padded_vocab_size - c->vocab_size) * c->channels * (1 + c->untied_head);
}

// per-layer sparsity statistics over the forwards since gpt_stats_reset (llmc/gpt.h)
typedef struct {
    double l1;       // mean over tokens of sum_n |h[m, n]|
    double l0_mean;  // mean number of firing units per token
    int l0_max;      // most firing units of any token
    double dead;     // fraction of units that fired for no token
} LayerStats;

// model shapes by name: the small default for the embedded corpus and the paper's family, each with the L1
// coefficient it trains with unless -a says otherwise, and its ramp (-1: lambda grows over the whole run). The
// default model on one epoch of the embedded corpus needs a far larger lambda than the paper's 1.5B for the same
// sparsity, and the ramp keeps its val CE close to lambda 0's (dev/RESULTS.md, "The default run's lambda").
#define L1_RAMP_WHOLE_RUN (-1)
#define LAMBDA_PAPER 2e-5f
typedef struct {
    const char* name;
    int layers, dim, heads, hidden;
    float lambda;
    int l1_ramp;
} ModelPreset;

static const ModelPreset model_presets[] = {
    {"default", 4, 256, 4, 704, 2e-2f, L1_RAMP_WHOLE_RUN},
    {"124m", 12, 768, 12, 2048, LAMBDA_PAPER, 0},
    {"0.5b", 8, 2048, 32, 5632, LAMBDA_PAPER, 0},
    {"1b", 18, 2048, 32, 5632, LAMBDA_PAPER, 0},
    {"1.5b", 28, 2048, 32, 5632, LAMBDA_PAPER, 0},
    {"2b", 38, 2048, 32, 5632, LAMBDA_PAPER, 0},
};

// the preset called name, or NULL
static inline const ModelPreset* find_preset(const char* name) {
    for (size_t i = 0; i < sizeof(model_presets) / sizeof(model_presets[0]); i++) {
        if (strcmp(model_presets[i].name, name) == 0) { return &model_presets[i]; }
    }
    return NULL;
}

// training FLOPs per token at sequence length T, the numerator of MFU: 6 per
// parameter (forward 2, backward 4) plus causal attention, whose q.k and p.v
// products cost 2 * 2 * D * (T/2) per token and layer forward, times 3
static inline double training_flops_per_token(const GPTConfig* c, int T) {
    return 6.0 * (double)num_parameters(c) + 6.0 * c->num_layers * (double)c->channels * T;
}

// weight decay applies to matrices only, never to norm weights
static inline int param_is_matrix(int i) {
    return i != P_ATTN_NORM && i != P_FFN_NORM && i != P_FINAL_NORM;
}

// the element offset of each tensor in the flat buffer
static inline void param_offsets(size_t offsets[NUM_PARAM_TENSORS], const GPTConfig* c) {
    size_t sizes[NUM_PARAM_TENSORS], off = 0;
    param_sizes(sizes, c);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) { offsets[i] = off; off += sizes[i]; }
}

// Bounds of every config field (the trainer's flags allow the same). They keep all size arithmetic
// in range: qkv_dim <= 3 * D fits an int, and a tensor's elements (at most L * H * D < 2^47) and
// the parameter count fit a size_t with room to multiply by 4 bytes.
#define GPT_MAX_VOCAB (1 << 24)
#define GPT_MAX_LAYERS 1024
#define GPT_MAX_CHANNELS 65536
#define GPT_MAX_HEADS 1024
#define GPT_MAX_HIDDEN (1 << 20)
#define GPT_MAX_SEQ_LEN (1 << 20)
#define GPT_MAX_ROPE_THETA 1e12f

// one-line error (naming `what`, the file or flags it came from) for a config out of bounds or
// that no kernel supports; each field is checked before anything is computed from it
static inline void config_validate_from(const GPTConfig* c, const char* what) {
    const struct { const char* name; int value, min, max; } fields[] = {
        {"vocab_size", c->vocab_size, 2, GPT_MAX_VOCAB},
        {"num_layers", c->num_layers, 1, GPT_MAX_LAYERS},
        {"channels", c->channels, 2, GPT_MAX_CHANNELS},
        {"num_heads", c->num_heads, 1, GPT_MAX_HEADS},
        {"num_kv_heads", c->num_kv_heads, 1, GPT_MAX_HEADS},
        {"hidden", c->hidden, 1, GPT_MAX_HIDDEN},
        {"max_seq_len", c->max_seq_len, 1, GPT_MAX_SEQ_LEN},
        {"activation", c->activation, ACT_RELU, ACT_SILU},
        {"untied_head", c->untied_head, 0, 1},
    };
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        if (fields[i].value < fields[i].min || fields[i].value > fields[i].max) {
            fatal("%s: %s %d is outside [%d, %d]", what, fields[i].name, fields[i].value, fields[i].min, fields[i].max);
        }
    }
    if (c->padded_vocab_size != round_up(c->vocab_size, 128)) {
        fatal("%s: padded_vocab_size %d must be vocab_size %d rounded up to a multiple of 128", what,
              c->padded_vocab_size, c->vocab_size);
    }
    if (c->channels % c->num_heads != 0) {
        fatal("%s: channels %d must be a multiple of num_heads %d", what, c->channels, c->num_heads);
    }
    if (head_size(c) % 2 != 0) { fatal("%s: head size %d must be even for RoPE", what, head_size(c)); }
    if (c->num_heads % c->num_kv_heads != 0) {
        fatal("%s: num_heads %d must be a multiple of num_kv_heads %d", what, c->num_heads, c->num_kv_heads);
    }
    // !(x <= max) is also true for NaN
    if (!(c->rope_theta > 0 && c->rope_theta <= GPT_MAX_ROPE_THETA)) {
        fatal("%s: rope_theta %g must be in (0, %g]", what, c->rope_theta, GPT_MAX_ROPE_THETA);
    }
    if (!(c->norm_eps > 0 && c->norm_eps <= 1)) { fatal("%s: norm_eps %g must be in (0, 1]", what, c->norm_eps); }
}

static inline void config_validate(const GPTConfig* c) { config_validate_from(c, "model config"); }

#endif // LLMC_MODEL_H
