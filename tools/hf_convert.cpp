/*
 hf_convert: Hugging Face Llama-family checkpoints to ours and back, with no Python.

   ./hf_convert --import HF_DIR -o OUT_DIR
       HF_DIR/config.json and model.safetensors (or model.safetensors.index.json and its shards)
       -> OUT_DIR/model.bin, our checkpoint (fp32, step 0); HF_DIR/tokenizer.json (and
       tokenizer_config.json) are checked with our tokenizer and copied to OUT_DIR.
   ./hf_convert --export MODEL.bin [--tokenizer FILE] [--dtype f32|bf16|f16] -o OUT_DIR
       -> OUT_DIR/config.json, model.safetensors (one file), tokenizer.json (a copy of FILE if it is
       one, else written from the rank file) and tokenizer_config.json: a LlamaForCausalLM with the
       model's hidden_act (relu or silu) and output head (tied, or lm_head.weight) that transformers
       loads.
   ./hf_convert --tokenizer FILE --encode TEXT
       prints the token ids of TEXT, to compare a tokenizer with Hugging Face's.

 The tensors (L layers; our layout in llmc/model.h):
   model.embed_tokens.weight [V, D]                   wte rows 0..V-1 (rows V..Vp-1 are zero)
   model.layers.l.input_layernorm.weight [D]          attn_norm[l]
   model.layers.l.self_attn.{q,k,v}_proj.weight       wqkv[l] rows [0, D), [D, D+KVD), [D+KVD, D+2KVD)
   model.layers.l.self_attn.o_proj.weight [D, D]      wo[l]
   model.layers.l.post_attention_layernorm.weight [D] ffn_norm[l]
   model.layers.l.mlp.{gate,up}_proj.weight [H, D]    wg[l], wu[l]
   model.layers.l.mlp.down_proj.weight [D, H]         wdT[l] transposed
   model.norm.weight [D]                              final_norm
   lm_head.weight [V, D]                              lm_head rows 0..V-1, when the head is untied
 F32, BF16 and F16 tensors are read (exactly) into fp32; export writes F32, or BF16 / F16 rounded to
 nearest even, so a checkpoint imported from one dtype goes back to the same bits.

 config.json: model_type llama, mistral (without a sliding window) or llama_sparse_relu (the
 SakanaAI SparseLM models, whose FFN is ReLU-gated whatever hidden_act says; sparsity_gated_mlp,
 sparsity_new_intermediate_size and sparsity_use_hybrid_kernel are honoured). hidden_size,
 intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads (GQA), head_dim,
 rms_norm_eps, rope_theta (or transformers 5's rope_parameters), max_position_embeddings (our
 max_seq_len) and vocab_size (padded with zero rows to a multiple of 128) are read, with HF's
 defaults where a field is absent. hidden_act relu or silu (Llama's: the model is then a dense
 SiLU one, which train_gpt_sparse can turn into a sparse ReLU one) is the FFN's activation, and
 tie_word_embeddings (false by default, as in HF) says whether the output head is the embedding or
 lm_head.weight. What our model cannot represent is a one-line error naming the field: another
 hidden_act, RoPE scaling, interleaved RoPE, biases, a head_dim that is not hidden_size /
 num_attention_heads, a sliding window. So is every malformed file, a missing tensor, a wrong shape
 or dtype, and any tensor the model does not have (the rotary inv_freq buffers of old checkpoints
 and the sparsity tracker's tensors of SakanaAI's training code are skipped; a tied model's
 lm_head.weight is accepted only when equal to the embedding). Like SakanaAI's own loader, the import also reads a layer's FFN saved as
 mlp.gate_weight [D, H], mlp.up_weight and mlp.down_weight [H, D], or mlp.GATE, UP, DOWN [H, D].
*/
#include <sys/stat.h>

#include "llmc/checkpoint.h"
#include "llmc/cli.h"
#include "llmc/json.h"
#include "llmc/safetensors.h"
#include "llmc/tokenizer.h"

// ----------------------------------------------------------------------------
// small file helpers

typedef struct { char s[4096]; } HFPath;

static HFPath hf_join(const char* dir, const char* name) {
    HFPath p;
    if (snprintf(p.s, sizeof(p.s), "%s/%s", dir, name) >= (int)sizeof(p.s)) { fatal("path too long: %s/%s", dir, name); }
    return p;
}

static int hf_exists(const char* path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

// copies a file byte for byte (atomically)
static void hf_copy(const char* from, const char* to) {
    FILE* in = fopenCheck(from, "rb");
    long size = file_size(in);
    char* buf = (char*)mallocCheck((size_t)size + 1);
    freadCheck(buf, 1, (size_t)size, in);
    fcloseCheck(in);
    char tmp[4096];
    FILE* out = atomic_open(to, tmp, sizeof(tmp));
    fwriteCheck(buf, 1, (size_t)size, out);
    atomic_commit(out, tmp, to);
    free(buf);
}

// the shortest decimal that reads back as f, with a '.' or exponent so that JSON readers see a float
static void hf_float_string(float f, char* out, size_t len) {
    if (f == floorf(f) && fabsf(f) < 1e15f) {
        snprintf(out, len, "%.1f", (double)f); // 10000.0, not 1e+04
        return;
    }
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(out, len, "%.*g", prec, (double)f);
        if ((float)strtod(out, NULL) == f) { break; }
    }
}

// ----------------------------------------------------------------------------
// config.json

typedef struct {
    GPTConfig c;
    char model_type[32];
    int down_proj_transposed; // sparsity_use_hybrid_kernel: down_proj is stored [H, D]
    int bos, eos;             // bos_token_id, eos_token_id; -1 where absent
} HFConfig;

// an integer field in [min, max]; def if absent or null and not required
static int hf_int(const JsonValue* cfg, const char* key, const char* path, int required, int def, int min, int max) {
    const JsonValue* v = json_get(cfg, key);
    if (v == NULL || v->type == JSON_NULL) {
        if (required) { fatal("%s: %s is missing", path, key); }
        return def;
    }
    if (v->type != JSON_NUMBER || !v->is_integer) { fatal("%s: %s is %s, not an integer", path, key, json_type_name(v->type)); }
    if (v->integer < min || v->integer > max) {
        fatal("%s: %s %lld is out of range [%d, %d]", path, key, (long long)v->integer, min, max);
    }
    return (int)v->integer;
}

static double hf_number(const JsonValue* cfg, const char* key, const char* path, double def) {
    const JsonValue* v = json_get(cfg, key);
    if (v == NULL || v->type == JSON_NULL) { return def; }
    if (v->type != JSON_NUMBER) { fatal("%s: %s is %s, not a number", path, key, json_type_name(v->type)); }
    if (!(v->number > 0) || !isfinite((float)v->number)) { fatal("%s: %s %g must be a positive float32", path, key, v->number); }
    return v->number;
}

static int hf_bool(const JsonValue* cfg, const char* key, const char* path, int def) {
    const JsonValue* v = json_get(cfg, key);
    if (v == NULL || v->type == JSON_NULL) { return def; }
    if (v->type != JSON_TRUE && v->type != JSON_FALSE) { fatal("%s: %s is %s, not true or false", path, key, json_type_name(v->type)); }
    return v->type == JSON_TRUE;
}

static const char* hf_string(const JsonValue* cfg, const char* key, const char* path, const char* def) {
    const JsonValue* v = json_get(cfg, key);
    if (v == NULL || v->type == JSON_NULL) {
        if (def == NULL) { fatal("%s: %s is missing", path, key); }
        return def;
    }
    if (v->type != JSON_STRING) { fatal("%s: %s is %s, not a string", path, key, json_type_name(v->type)); }
    return v->string;
}

// a token id field: an integer, or a list whose first element is one (eos_token_id may be a list); -1 if absent
static int hf_token_id(const JsonValue* cfg, const char* key) {
    const JsonValue* v = json_get(cfg, key);
    if (v != NULL && v->type == JSON_ARRAY && v->length > 0) { v = &v->items[0]; }
    return v != NULL && v->type == JSON_NUMBER && v->is_integer && v->integer >= 0 && v->integer < TOKENIZER_MAX_TOKENS
               ? (int)v->integer : -1;
}

// the RoPE base: transformers 5 writes rope_parameters {"rope_type": "default", "rope_theta": ...},
// earlier versions rope_theta and rope_scaling null; anything but plain RoPE is an error
static double hf_rope_theta(const JsonValue* cfg, const char* path) {
    const char* keys[] = {"rope_parameters", "rope_scaling"};
    double theta = hf_number(cfg, "rope_theta", path, 10000.0);
    for (int k = 0; k < 2; k++) {
        const JsonValue* v = json_get(cfg, keys[k]);
        if (v == NULL || v->type == JSON_NULL) { continue; }
        if (v->type != JSON_OBJECT) { fatal("%s: %s is %s, not an object or null", path, keys[k], json_type_name(v->type)); }
        const JsonValue* type = json_get(v, "rope_type");
        if (type == NULL) { type = json_get(v, "type"); }
        if (!json_string_is(type, "default")) {
            char shown[64];
            fatal("%s: %s (rope_type %s) is not supported: only plain RoPE", path, keys[k],
                  type && type->type == JSON_STRING ? json_escaped(shown, sizeof(shown), type->string, type->length) : "missing");
        }
        if (json_get(v, "rope_theta") != NULL) { theta = hf_number(v, "rope_theta", path, theta); }
    }
    return theta;
}

static void hf_read_config(const char* dir, HFConfig* h) {
    HFPath path = hf_join(dir, "config.json");
    if (!hf_exists(path.s)) { fatal("%s: no config.json (not a Hugging Face checkpoint directory?)", dir); }
    JsonValue cfg;
    json_parse_file(path.s, &cfg);
    const char* p = path.s;
    if (cfg.type != JSON_OBJECT) { fatal("%s: the top level is %s, not an object", p, json_type_name(cfg.type)); }
    memset(h, 0, sizeof(*h));
    const char* type = hf_string(&cfg, "model_type", p, NULL);
    int sparse = strcmp(type, "llama_sparse_relu") == 0;
    if (!sparse && strcmp(type, "llama") != 0 && strcmp(type, "mistral") != 0) {
        fatal("%s: model_type %.40s is not supported: only the Llama family (llama, mistral, llama_sparse_relu)", p, type);
    }
    snprintf(h->model_type, sizeof(h->model_type), "%s", type);
    const char* act = hf_string(&cfg, "hidden_act", p, "silu");
    GPTConfig* c = &h->c;
    if (sparse) {
        // SakanaAI's SparseLlamaForCausalLM replaces every MLP with a ReLU-gated one (its config
        // keeps the base model's hidden_act, which the sparse MLP never reads)
        if (!hf_bool(&cfg, "sparsity_gated_mlp", p, 1)) {
            fatal("%s: sparsity_gated_mlp false (an FFN without a gate) is not supported", p);
        }
        h->down_proj_transposed = hf_bool(&cfg, "sparsity_use_hybrid_kernel", p, 0);
        c->activation = ACT_RELU;
    } else {
        c->activation = find_activation(act);
        if (c->activation < 0) {
            fatal("%s: hidden_act %.40s is not supported: the FFN's gate is relu or silu", p, act);
        }
    }
    c->channels = hf_int(&cfg, "hidden_size", p, 1, 0, 2, 1 << 20);
    c->hidden = hf_int(&cfg, "intermediate_size", p, 1, 0, 1, 1 << 22);
    if (sparse) { c->hidden = hf_int(&cfg, "sparsity_new_intermediate_size", p, 0, c->hidden, 1, 1 << 22); }
    c->num_layers = hf_int(&cfg, "num_hidden_layers", p, 1, 0, 1, 1 << 12);
    c->num_heads = hf_int(&cfg, "num_attention_heads", p, 1, 0, 1, 1 << 16);
    c->num_kv_heads = hf_int(&cfg, "num_key_value_heads", p, 0, c->num_heads, 1, 1 << 16);
    if (c->channels % c->num_heads != 0) {
        fatal("%s: hidden_size %d is not a multiple of num_attention_heads %d", p, c->channels, c->num_heads);
    }
    int head_dim = hf_int(&cfg, "head_dim", p, 0, c->channels / c->num_heads, 1, 1 << 20);
    if (head_dim != c->channels / c->num_heads) {
        fatal("%s: head_dim %d is not supported: it must be hidden_size / num_attention_heads = %d", p, head_dim,
              c->channels / c->num_heads);
    }
    if (head_dim % 2 != 0) { fatal("%s: head_dim %d is odd: RoPE needs an even head size", p, head_dim); }
    if (c->num_heads % c->num_kv_heads != 0) {
        fatal("%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", p, c->num_heads, c->num_kv_heads);
    }
    c->vocab_size = hf_int(&cfg, "vocab_size", p, 1, 0, 2, TOKENIZER_MAX_TOKENS);
    c->padded_vocab_size = round_up(c->vocab_size, 128);
    c->max_seq_len = hf_int(&cfg, "max_position_embeddings", p, 0, 2048, 1, 1 << 24);
    c->norm_eps = (float)hf_number(&cfg, "rms_norm_eps", p, 1e-6);
    c->rope_theta = (float)hf_rope_theta(&cfg, p);
    if (hf_bool(&cfg, "rope_interleaved", p, 0)) {
        fatal("%s: rope_interleaved true is not supported: RoPE rotates halves, as HF Llama does", p);
    }
    if (hf_bool(&cfg, "attention_bias", p, 0)) { fatal("%s: attention_bias true is not supported: the model has no biases", p); }
    if (hf_bool(&cfg, "mlp_bias", p, 0)) { fatal("%s: mlp_bias true is not supported: the model has no biases", p); }
    c->untied_head = !hf_bool(&cfg, "tie_word_embeddings", p, 0); // (absent: false, HF's default)
    const JsonValue* window = json_get(&cfg, "sliding_window");
    if (window != NULL && window->type != JSON_NULL && hf_int(&cfg, "sliding_window", p, 0, 0, 0, 1 << 30) < c->max_seq_len) {
        fatal("%s: sliding_window %lld is not supported: attention is full causal", p, (long long)window->integer);
    }
    h->bos = hf_token_id(&cfg, "bos_token_id");
    h->eos = hf_token_id(&cfg, "eos_token_id");
    json_free(&cfg);
    config_validate(c);
}

// ----------------------------------------------------------------------------
// the tensors of the HF model and where they live in ours

typedef struct {
    char name[96];
    int ndim;
    int64_t shape[2];
    float* ours;   // its place in our flat parameters
    int transpose; // 1: the HF tensor is the transpose of ours (down_proj)
} HFTensor;

// fills out[2 + 9 L (+ 1 with an untied head)] in HF's order; down_proj_transposed: HF stores down_proj as
// [H, D] already
static int hf_tensors(const GPTConfig* c, float* params, int down_proj_transposed, HFTensor* out) {
    size_t off[NUM_PARAM_TENSORS];
    param_offsets(off, c);
    int64_t D = c->channels, H = c->hidden, KVD = kv_dim(c), QKV = qkv_dim(c);
    int n = 0;
    struct { const char* fmt; int64_t d0, d1; int param; int64_t row; int transpose; } per_layer[] = {
        {"model.layers.%d.input_layernorm.weight", D, 0, P_ATTN_NORM, 0, 0},
        {"model.layers.%d.self_attn.q_proj.weight", D, D, P_WQKV, 0, 0},
        {"model.layers.%d.self_attn.k_proj.weight", KVD, D, P_WQKV, D, 0},
        {"model.layers.%d.self_attn.v_proj.weight", KVD, D, P_WQKV, D + KVD, 0},
        {"model.layers.%d.self_attn.o_proj.weight", D, D, P_WO, 0, 0},
        {"model.layers.%d.post_attention_layernorm.weight", D, 0, P_FFN_NORM, 0, 0},
        {"model.layers.%d.mlp.gate_proj.weight", H, D, P_WG, 0, 0},
        {"model.layers.%d.mlp.up_proj.weight", H, D, P_WU, 0, 0},
        {"model.layers.%d.mlp.down_proj.weight", down_proj_transposed ? H : D, down_proj_transposed ? D : H, P_WDT, 0,
         !down_proj_transposed},
    };
    // the size of one layer's slice of each stacked tensor
    size_t layer_size[NUM_PARAM_TENSORS] = {0};
    layer_size[P_ATTN_NORM] = D; layer_size[P_WQKV] = QKV * D; layer_size[P_WO] = D * D; layer_size[P_FFN_NORM] = D;
    layer_size[P_WG] = H * D; layer_size[P_WU] = H * D; layer_size[P_WDT] = H * D;
    HFTensor* t = &out[n++];
    snprintf(t->name, sizeof(t->name), "model.embed_tokens.weight");
    t->ndim = 2; t->shape[0] = c->vocab_size; t->shape[1] = D; t->ours = params + off[P_WTE]; t->transpose = 0;
    for (int l = 0; l < c->num_layers; l++) {
        for (size_t k = 0; k < sizeof(per_layer) / sizeof(per_layer[0]); k++) {
            t = &out[n++];
            snprintf(t->name, sizeof(t->name), per_layer[k].fmt, l);
            t->ndim = per_layer[k].d1 ? 2 : 1;
            t->shape[0] = per_layer[k].d0;
            t->shape[1] = per_layer[k].d1;
            t->ours = params + off[per_layer[k].param] + l * layer_size[per_layer[k].param] + per_layer[k].row * D;
            t->transpose = per_layer[k].transpose;
        }
    }
    t = &out[n++];
    snprintf(t->name, sizeof(t->name), "model.norm.weight");
    t->ndim = 1; t->shape[0] = D; t->shape[1] = 0; t->ours = params + off[P_FINAL_NORM]; t->transpose = 0;
    if (c->untied_head) {
        t = &out[n++];
        snprintf(t->name, sizeof(t->name), "lm_head.weight");
        t->ndim = 2; t->shape[0] = c->vocab_size; t->shape[1] = D; t->ours = params + off[P_LM_HEAD]; t->transpose = 0;
    }
    return n;
}

// ----------------------------------------------------------------------------
// the safetensors files of a checkpoint: one model.safetensors, or the shards of an index

typedef struct {
    int n_files;
    SafeTensors* files;
    char** used;      // used[f][k]: tensor k of file f was read (or knowingly skipped)
} HFWeights;

static int hf_file_index(const HFWeights* w, const char* name) {
    for (int f = 0; f < w->n_files; f++) {
        const char* base = strrchr(w->files[f].path, '/');
        if (strcmp(base ? base + 1 : w->files[f].path, name) == 0) { return f; }
    }
    return -1;
}

static void hf_open_weights(const char* dir, HFWeights* w) {
    memset(w, 0, sizeof(*w));
    HFPath index = hf_join(dir, "model.safetensors.index.json");
    HFPath single = hf_join(dir, "model.safetensors");
    if (hf_exists(index.s)) {
        JsonValue idx;
        json_parse_file(index.s, &idx);
        const JsonValue* map = json_get(&idx, "weight_map");
        if (map == NULL || map->type != JSON_OBJECT) { fatal("%s: no weight_map object", index.s); }
        w->files = (SafeTensors*)callocCheck(map->length ? map->length : 1, sizeof(SafeTensors));
        for (size_t k = 0; k < map->length; k++) {
            const JsonValue* file = &map->members[k].value;
            char key[64]; // as the messages show it (escaped)
            json_escaped(key, sizeof(key), map->members[k].key, map->members[k].key_length);
            if (strlen(map->members[k].key) != map->members[k].key_length) {
                fatal("%s: weight_map key \"%s\" holds a NUL byte (\\u0000)", index.s, key);
            }
            if (file->type != JSON_STRING || file->length == 0 || strlen(file->string) != file->length ||
                strchr(file->string, '/') != NULL ||
                strcmp(file->string, "..") == 0 || strcmp(file->string, ".") == 0) {
                fatal("%s: weight_map[\"%s\"] is not a file name in the same directory", index.s, key);
            }
            if (hf_file_index(w, file->string) < 0) {
                HFPath shard = hf_join(dir, file->string);
                if (!hf_exists(shard.s)) { fatal("%s: shard %s is missing", index.s, shard.s); }
                safetensors_open(&w->files[w->n_files++], shard.s);
            }
        }
        // the index and the shards must agree, tensor for tensor
        for (size_t k = 0; k < map->length; k++) {
            int f = hf_file_index(w, map->members[k].value.string);
            if (safetensors_find(&w->files[f], map->members[k].key) == NULL) {
                fatal("%s: weight_map puts %.80s in %s, which has no such tensor", index.s, map->members[k].key, w->files[f].path);
            }
        }
        for (int f = 0; f < w->n_files; f++) {
            for (int k = 0; k < w->files[f].n; k++) {
                const JsonValue* file = json_get(map, w->files[f].tensors[k].name);
                if (file == NULL || hf_file_index(w, file->string) != f) {
                    fatal("%s: tensor %.80s is not in the weight_map of %s", w->files[f].path, w->files[f].tensors[k].name, index.s);
                }
            }
        }
        json_free(&idx);
    } else if (hf_exists(single.s)) {
        w->files = (SafeTensors*)callocCheck(1, sizeof(SafeTensors));
        safetensors_open(&w->files[w->n_files++], single.s);
    } else {
        fatal("%s: no model.safetensors or model.safetensors.index.json (only safetensors checkpoints are read)", dir);
    }
    w->used = (char**)mallocCheck(w->n_files * sizeof(char*));
    for (int f = 0; f < w->n_files; f++) { w->used[f] = (char*)callocCheck(w->files[f].n ? w->files[f].n : 1, 1); }
}

static int hf_has(const HFWeights* w, const char* name) {
    for (int f = 0; f < w->n_files; f++) {
        if (safetensors_find(&w->files[f], name) != NULL) { return 1; }
    }
    return 0;
}

// the tensor called name in any file (marked used), NULL if none has it
static const SafeTensor* hf_find(HFWeights* w, const char* name, const SafeTensors** file) {
    for (int f = 0; f < w->n_files; f++) {
        const SafeTensor* t = safetensors_find(&w->files[f], name);
        if (t != NULL) {
            w->used[f][t - w->files[f].tensors] = 1;
            *file = &w->files[f];
            return t;
        }
    }
    return NULL;
}

static void hf_close_weights(HFWeights* w) {
    for (int f = 0; f < w->n_files; f++) {
        safetensors_close(&w->files[f]);
        free(w->used[f]);
    }
    free(w->files);
    free(w->used);
}

// reads tensor name with the expected shape into dst (fp32, HF's layout)
static void hf_read_tensor(HFWeights* w, const char* name, int ndim, const int64_t* shape, float* dst) {
    const SafeTensors* file = NULL;
    const SafeTensor* t = hf_find(w, name, &file);
    if (t == NULL) { fatal("%s: no tensor %s", w->n_files == 1 ? w->files[0].path : "the checkpoint's shards", name); }
    int ok = t->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++) { ok = t->shape[d] == shape[d]; }
    if (!ok) {
        char got[128], want[128];
        SafeTensor expect = *t;
        expect.ndim = ndim;
        for (int d = 0; d < ndim; d++) { expect.shape[d] = shape[d]; }
        safetensors_shape_string(t, got, sizeof(got));
        safetensors_shape_string(&expect, want, sizeof(want));
        fatal("%s: tensor %s has shape %s, config.json needs %s", file->path, name, got, want);
    }
    safetensors_read(file, t, dst);
}

// SakanaAI's training code may also save a layer's FFN as gate_weight [D, H] (transposed), up_weight
// and down_weight [H, D], or as its TwELL kernels' GATE, UP and DOWN [H, D]; their own loader
// (sparse_to_hf_state_dict) reads all three layouts, and so does this. If the file has one of these in
// place of HF's FFN tensor t, t becomes it and 1 is returned.
static int hf_ffn_alternative(const HFWeights* w, const GPTConfig* c, HFTensor* t) {
    static const char* const hf[3] = {"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};
    static const char* const alt[3][2] = {{"mlp.gate_weight", "mlp.GATE"}, {"mlp.up_weight", "mlp.UP"}, {"mlp.down_weight", "mlp.DOWN"}};
    size_t len = strlen(t->name);
    for (int k = 0; k < 3; k++) {
        size_t n = strlen(hf[k]);
        if (len < n || strcmp(t->name + len - n, hf[k]) != 0) { continue; }
        for (int a = 0; a < 2; a++) {
            char name[sizeof(t->name)];
            snprintf(name, sizeof(name), "%.*s%s", (int)(len - n), t->name, alt[k][a]);
            if (!hf_has(w, name)) { continue; }
            int transposed = k == 0 && a == 0; // only gate_weight is [D, H]
            memcpy(t->name, name, sizeof(name));
            t->shape[0] = transposed ? c->channels : c->hidden;
            t->shape[1] = transposed ? c->hidden : c->channels;
            t->transpose = transposed;
            return 1;
        }
    }
    return 0;
}

// tensors a checkpoint may hold that are no weights: old transformers' rotary inv_freq buffers (RoPE
// recomputes them) and SakanaAI's sparsity tracker and metrics (their loader drops them too)
static int hf_skippable(const char* name) {
    const char* freq = ".rotary_emb.inv_freq";
    size_t len = strlen(name), n = strlen(freq);
    return (len >= n && strcmp(name + len - n, freq) == 0) || strncmp(name, "tracker.", 8) == 0 ||
           strstr(name, ".tracker.") != NULL || strncmp(name, "metrics_accumulator.", 20) == 0 ||
           strstr(name, ".metrics_accumulator.") != NULL;
}

// ----------------------------------------------------------------------------
// --import

static void hf_import(const char* dir, const char* out_dir) {
    HFConfig h;
    hf_read_config(dir, &h);
    GPTConfig* c = &h.c;
    HFWeights w;
    hf_open_weights(dir, &w);
    size_t n_params = num_parameters(c);
    float* params = (float*)callocCheck(n_params, sizeof(float)); // the padded vocab rows stay zero
    HFTensor* ts = (HFTensor*)mallocCheck((3 + 9 * (size_t)c->num_layers) * sizeof(HFTensor));
    int n = hf_tensors(c, params, h.down_proj_transposed, ts);
    if (c->untied_head && !hf_has(&w, "lm_head.weight")) {
        fatal("%s: tie_word_embeddings is false (or absent: false by default), but there is no lm_head.weight", dir);
    }
    float* scratch = (float*)mallocCheck((size_t)c->vocab_size * c->channels > (size_t)c->hidden * c->channels
                                             ? (size_t)c->vocab_size * c->channels * sizeof(float)
                                             : (size_t)c->hidden * c->channels * sizeof(float));
    for (int k = 0; k < n; k++) {
        if (!hf_has(&w, ts[k].name)) { hf_ffn_alternative(&w, c, &ts[k]); }
        if (!ts[k].transpose) {
            hf_read_tensor(&w, ts[k].name, ts[k].ndim, ts[k].shape, ts[k].ours);
            continue;
        }
        hf_read_tensor(&w, ts[k].name, ts[k].ndim, ts[k].shape, scratch);
        int64_t R = ts[k].shape[0], C = ts[k].shape[1]; // [D, H] -> ours [H, D]
        for (int64_t i = 0; i < R; i++) {
            for (int64_t j = 0; j < C; j++) { ts[k].ours[j * R + i] = scratch[i * C + j]; }
        }
    }
    // a tied checkpoint may still hold lm_head.weight: accepted if it is the embedding, bit for bit
    const SafeTensors* file = NULL;
    const SafeTensor* head = c->untied_head ? NULL : hf_find(&w, "lm_head.weight", &file);
    if (head != NULL) {
        hf_read_tensor(&w, "lm_head.weight", ts[0].ndim, ts[0].shape, scratch);
        if (memcmp(scratch, ts[0].ours, (size_t)c->vocab_size * c->channels * sizeof(float)) != 0) {
            fatal("%s: lm_head.weight differs from model.embed_tokens.weight but tie_word_embeddings is true", file->path);
        }
    }
    // nothing else may be left over
    int seen[3] = {0, 0, 0}; // the dtypes read: F32, BF16, F16
    for (int f = 0; f < w.n_files; f++) {
        for (int k = 0; k < w.files[f].n; k++) {
            const SafeTensor* t = &w.files[f].tensors[k];
            if (!w.used[f][k] && !hf_skippable(t->name)) {
                fatal("%s: tensor %s is not part of a %d-layer Llama model with %s embeddings", w.files[f].path, t->name,
                      c->num_layers, c->untied_head ? "untied" : "tied");
            }
            if (w.used[f][k]) { seen[t->dtype] = 1; }
        }
    }
    char dtypes[32];
    snprintf(dtypes, sizeof(dtypes), "%s%s%s", seen[ST_F32] ? "F32 " : "", seen[ST_BF16] ? "BF16 " : "", seen[ST_F16] ? "F16 " : "");
    dtypes[strlen(dtypes) - 1] = '\0'; // at least one tensor was read

    make_dir(out_dir);
    HFPath model_out = hf_join(out_dir, "model.bin");
    checkpoint_save_model(model_out.s, c, params, 0);
    printf("config: %s, %d layers, D %d, %d heads (%d kv), H %d, vocab %d (padded to %d), max_seq_len %d, rope_theta %g, "
           "norm_eps %g, hidden_act %s\n", h.model_type, c->num_layers, c->channels, c->num_heads, c->num_kv_heads, c->hidden,
           c->vocab_size, c->padded_vocab_size, c->max_seq_len, c->rope_theta, c->norm_eps, activation_names[c->activation]);
    printf("weights: %d tensors (%s) from %d file%s, %s head, %.2fM parameters\n", n, dtypes, w.n_files,
           w.n_files == 1 ? "" : "s", c->untied_head ? "untied" : "tied", (double)num_model_parameters(c) / 1e6);
    printf("wrote %s\n", model_out.s);

    HFPath tok_in = hf_join(dir, "tokenizer.json");
    if (hf_exists(tok_in.s)) {
        Tokenizer tok;
        tokenizer_init_json(&tok, tok_in.s);
        size_t len = 0;
        const unsigned char* eot = tokenizer_decode(&tok, tok.eot_token, &len);
        printf("tokenizer: %d tokens, %d merges, documents start with id %d %.*s\n", tok.vocab_size, tok.n_merges,
               tok.eot_token, (int)len, (const char*)eot);
        if (tok.vocab_size != c->vocab_size) {
            fprintf(stderr, "warning: the tokenizer has %d tokens but vocab_size is %d: infer needs them equal\n", tok.vocab_size,
                    c->vocab_size);
        }
        int config_doc = h.bos >= 0 ? h.bos : h.eos;
        if (config_doc >= 0 && config_doc != tok.eot_token) {
            fprintf(stderr, "warning: config.json's %s is %d, but infer starts documents with %d\n",
                    h.bos >= 0 ? "bos_token_id" : "eos_token_id", config_doc, tok.eot_token);
        }
        tokenizer_free(&tok);
        HFPath tok_out = hf_join(out_dir, "tokenizer.json");
        hf_copy(tok_in.s, tok_out.s);
        printf("wrote %s\n", tok_out.s);
        HFPath tok_cfg_in = hf_join(dir, "tokenizer_config.json"), tok_cfg_out = hf_join(out_dir, "tokenizer_config.json");
        if (hf_exists(tok_cfg_in.s)) { hf_copy(tok_cfg_in.s, tok_cfg_out.s); }
    } else {
        fprintf(stderr, "warning: %s has no tokenizer.json: give infer one with --tokenizer\n", dir);
    }
    free(scratch);
    free(ts);
    free(params);
    hf_close_weights(&w);
}

// ----------------------------------------------------------------------------
// --export

static void hf_export(const char* model_path, const char* tokenizer_path, SafeDtype dtype, const char* out_dir) {
    GPTConfig c;
    int step = 0;
    float* params = checkpoint_load_model(model_path, &c, &step);
    Tokenizer tok;
    tokenizer_load(&tok, tokenizer_path);
    if (tok.vocab_size != c.vocab_size) {
        fprintf(stderr, "warning: %s has %d tokens, the model's vocab_size is %d\n", tokenizer_path, tok.vocab_size, c.vocab_size);
    }
    size_t off[NUM_PARAM_TENSORS];
    param_offsets(off, &c);
    for (int head = 0; head <= c.untied_head; head++) {
        const float* rows = params + off[head ? P_LM_HEAD : P_WTE];
        for (size_t k = (size_t)c.vocab_size * c.channels; k < (size_t)c.padded_vocab_size * c.channels; k++) {
            if (rows[k] != 0.0f) {
                fprintf(stderr, "warning: %s: the padded rows of %s are not zero; they are not exported\n", model_path,
                        head ? "lm_head" : "wte");
                break;
            }
        }
    }
    HFTensor* ts = (HFTensor*)mallocCheck((3 + 9 * (size_t)c.num_layers) * sizeof(HFTensor));
    int n = hf_tensors(&c, params, 0, ts);
    SafeTensorOut* outs = (SafeTensorOut*)callocCheck(n, sizeof(SafeTensorOut));
    for (int k = 0; k < n; k++) {
        outs[k].name = ts[k].name;
        outs[k].ndim = ts[k].ndim;
        outs[k].shape[0] = ts[k].shape[0];
        outs[k].shape[1] = ts[k].shape[1];
        outs[k].data = ts[k].ours;
        outs[k].transposed = ts[k].transpose;
    }
    make_dir(out_dir);
    HFPath weights = hf_join(out_dir, "model.safetensors");
    safetensors_write(weights.s, outs, n, dtype);

    // config.json: a plain LlamaForCausalLM with the model's gate activation and head
    char eps[32], theta[32];
    hf_float_string(c.norm_eps, eps, sizeof(eps));
    hf_float_string(c.rope_theta, theta, sizeof(theta));
    HFPath config = hf_join(out_dir, "config.json");
    char tmp[4096];
    FILE* fp = atomic_open(config.s, tmp, sizeof(tmp));
    fprintf(fp, "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n  \"hidden_act\": \"%s\",\n",
            activation_names[c.activation]);
    fprintf(fp, "  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n  \"num_hidden_layers\": %d,\n", c.channels, c.hidden,
            c.num_layers);
    fprintf(fp, "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n", c.num_heads,
            c.num_kv_heads, head_size(&c));
    fprintf(fp, "  \"max_position_embeddings\": %d,\n  \"vocab_size\": %d,\n  \"rms_norm_eps\": %s,\n", c.max_seq_len,
            c.vocab_size, eps);
    fprintf(fp, "  \"rope_theta\": %s,\n  \"rope_scaling\": null,\n", theta);
    fprintf(fp, "  \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": %s},\n", theta);
    fprintf(fp, "  \"attention_bias\": false,\n  \"attention_dropout\": 0.0,\n  \"mlp_bias\": false,\n");
    fprintf(fp, "  \"tie_word_embeddings\": %s,\n  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n",
            c.untied_head ? "false" : "true", tok.eot_token, tok.eot_token);
    fprintf(fp, "  \"initializer_range\": 0.02,\n  \"use_cache\": true,\n  \"torch_dtype\": \"%s\"\n}\n",
            dtype == ST_F32 ? "float32" : dtype == ST_BF16 ? "bfloat16" : "float16");
    atomic_commit(fp, tmp, config.s);

    // the tokenizer: a tokenizer.json is copied (with its tokenizer_config.json), a rank file written as one
    HFPath tok_out = hf_join(out_dir, "tokenizer.json"), tok_cfg_out = hf_join(out_dir, "tokenizer_config.json");
    char src_dir[4096];
    snprintf(src_dir, sizeof(src_dir), "%s", tokenizer_path);
    char* slash = strrchr(src_dir, '/');
    if (slash) { *slash = '\0'; } else { snprintf(src_dir, sizeof(src_dir), "."); }
    HFPath tok_cfg_in = hf_join(src_dir, "tokenizer_config.json");
    if (tok.hf_bpe) { hf_copy(tokenizer_path, tok_out.s); }
    else { tokenizer_write_json(&tok, tok_out.s); }
    if (tok.hf_bpe && hf_exists(tok_cfg_in.s)) {
        hf_copy(tok_cfg_in.s, tok_cfg_out.s);
    } else {
        size_t len = 0;
        const unsigned char* eot = tokenizer_decode(&tok, tok.eot_token, &len);
        fp = atomic_open(tok_cfg_out.s, tmp, sizeof(tmp));
        fprintf(fp, "{\n  \"tokenizer_class\": \"PreTrainedTokenizerFast\",\n  \"bos_token\": ");
        json_write_string(fp, (const char*)eot, len);
        fprintf(fp, ",\n  \"eos_token\": ");
        json_write_string(fp, (const char*)eot, len);
        fprintf(fp, ",\n  \"model_max_length\": %d,\n  \"clean_up_tokenization_spaces\": false\n}\n", c.max_seq_len);
        atomic_commit(fp, tmp, tok_cfg_out.s);
    }
    printf("model: %s (step %d): %d layers, D %d, %d heads (%d kv), H %d, vocab %d, %s, %s head, %.2fM parameters\n",
           model_path, step, c.num_layers, c.channels, c.num_heads, c.num_kv_heads, c.hidden, c.vocab_size,
           activation_names[c.activation], c.untied_head ? "untied" : "tied",
           (double)num_model_parameters(&c) / 1e6);
    printf("wrote %s (%d tensors, %s), %s, %s, %s\n", weights.s, n, dtype == ST_F32 ? "F32" : dtype == ST_BF16 ? "BF16" : "F16",
           config.s, tok_out.s, tok_cfg_out.s);
    free(outs);
    free(ts);
    tokenizer_free(&tok);
    free(params);
}

// ----------------------------------------------------------------------------
// --encode

static void hf_encode(const char* tokenizer_path, const char* text) {
    Tokenizer tok;
    tokenizer_load(&tok, tokenizer_path);
    size_t len = strlen(text), bad = 0, n = 0, cap = 0;
    if (!utf8_valid(text, len, &bad)) { fatal("--encode: the text is not valid UTF-8 at byte %zu", bad); }
    int* ids = NULL;
    tokenizer_encode(&tok, text, len, &ids, &n, &cap);
    for (size_t k = 0; k < n; k++) { printf(k ? " %d" : "%d", ids[k]); }
    printf("\n");
    free(ids);
    tokenizer_free(&tok);
}

static int hf_convert_main(int argc, char** argv) {
    const char* import_dir = NULL;
    const char* export_model = NULL;
    const char* out_dir = NULL;
    const char* tokenizer_path = TOKENIZER_DEFAULT_PATH;
    const char* dtype_name = "f32";
    const char* encode_text = NULL;
    ArgSpec specs[] = {
        {'i', "import", ARG_STRING, &import_dir, 0, 0, "Hugging Face checkpoint directory to convert to ours", 0},
        {'e', "export", ARG_STRING, &export_model, 0, 0, "our model checkpoint to convert to Hugging Face's format, or a directory: its newest", 0},
        {'o', "output", ARG_STRING, &out_dir, 0, 0, "output directory (created if missing)", 0},
        {0, "tokenizer", ARG_STRING, &tokenizer_path, 0, 0, "--export, --encode: rank file or tokenizer.json", 0},
        {0, "dtype", ARG_STRING, &dtype_name, 0, 0, "--export: f32, bf16 or f16", 0},
        {0, "encode", ARG_STRING, &encode_text, 0, 0, "print the token ids of this text under --tokenizer", 0},
    };
    int num_specs = (int)(sizeof(specs) / sizeof(specs[0]));
    cli_parse(argc, argv, "usage: ./hf_convert --import HF_DIR -o OUT_DIR\n"
              "       ./hf_convert --export MODEL.bin|RUN_DIR [--tokenizer FILE] [--dtype f32|bf16|f16] -o OUT_DIR\n"
              "       ./hf_convert --tokenizer FILE --encode TEXT\n"
              "Converts Hugging Face Llama-family checkpoints (ReLU- or SiLU-gated FFN, tied or untied head) to ours and back.",
              specs, num_specs);
    if ((import_dir != NULL) + (export_model != NULL) + (encode_text != NULL) != 1) {
        fatal("give exactly one of --import, --export and --encode (see --help)");
    }
    if (encode_text == NULL && out_dir == NULL) { fatal("--%s needs --output", import_dir ? "import" : "export"); }
    if (encode_text != NULL && out_dir != NULL) { fatal("--encode prints the ids: drop --output"); }
    if (import_dir != NULL && cli_given(specs, num_specs, "tokenizer")) {
        fatal("--import reads the tokenizer.json of the checkpoint directory: drop --tokenizer");
    }
    if (export_model == NULL && cli_given(specs, num_specs, "dtype")) { fatal("--dtype needs --export"); }
    SafeDtype dtype = ST_F32;
    if (strcmp(dtype_name, "bf16") == 0) { dtype = ST_BF16; }
    else if (strcmp(dtype_name, "f16") == 0) { dtype = ST_F16; }
    else if (strcmp(dtype_name, "f32") != 0) { fatal("--dtype %s: use f32, bf16 or f16", dtype_name); }

    // a run's directory stands for its newest model file; the default tokenizer is found from the working
    // directory or from the binary's
    char model_file[4096];
    if (export_model && !checkpoint_model_file(export_model, model_file, sizeof(model_file))) {
        fatal("--export %s: the directory holds no checkpoint (model_<step>.bin)", export_model);
    }
    if (import_dir == NULL && !cli_given(specs, num_specs, "tokenizer")) {
        tokenizer_path = default_input(tokenizer_path, "--tokenizer");
    }
    if (import_dir) { hf_import(import_dir, out_dir); }
    else if (export_model) { hf_export(model_file, tokenizer_path, dtype, out_dir); }
    else { hf_encode(tokenizer_path, encode_text); }
    return 0;
}

#ifndef HF_CONVERT_NO_MAIN // the tests include this file and call hf_convert_main
int main(int argc, char** argv) { return hf_convert_main(argc, argv); }
#endif
