/*
 train_gpt_sparse: trains a Llama-style language model with a ReLU-gated FFN
 and an L1 penalty on the FFN activations that makes them sparse.

     loss = CE + lambda * (1/L) sum_l (1/M) sum_{m,n} |h_l[m, n]|

 With no arguments it trains the small default model on the corpus shipped in
 data/. This file is the training loop: flags, data, the optimizer step, the
 logs, validation, samples and checkpoints. The model's forward and backward
 live in llmc/gpt.h over the kernels of the backend.

 Backends: the CPU reference path (fp32, OpenMP) runs everywhere. The CUDA
 path is the next step of the project; until it lands a GPU is detected and
 reported, and the CPU path trains.
*/
#include <cuda_runtime.h>
#include <dirent.h>
#include <omp.h>
#include <sys/stat.h>
#include <time.h>

#include "llmc/adamw.h"
#include "llmc/checkpoint.h"
#include "llmc/cli.h"
#include "llmc/dataloader.h"
#include "llmc/gpt.h"
#include "llmc/logger.h"
#include "llmc/sampler.h"
#include "llmc/tokenizer.h"

// ----------------------------------------------------------------------------
// model presets: the small default for the embedded corpus and the paper's shapes

typedef struct { const char* name; int layers, dim, heads, kv_heads, hidden; } ModelPreset;

static const ModelPreset presets[] = {
    {"default", 4, 256, 4, 4, 704},
    {"124m", 12, 768, 12, 12, 2048},
    {"0.5b", 8, 2048, 32, 32, 5632},
    {"1b", 18, 2048, 32, 32, 5632},
    {"1.5b", 28, 2048, 32, 32, 5632},
    {"2b", 38, 2048, 32, 32, 5632},
};

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// number of CUDA GPUs; 0 when there is no GPU or no usable driver
static int cuda_device_count(void) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) { return 0; }
    if (err != cudaSuccess) {
        fprintf(stderr, "warning: CUDA device query failed (%s); using the CPU\n", cudaGetErrorString(err));
        return 0;
    }
    return count;
}

// mkdir -p
static void make_dir(const char* path) {
    char buf[4096];
    if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf)) { fatal("path too long: %s", path); }
    for (char* p = buf + 1; ; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) { fatal("cannot create directory %s: %s", buf, strerror(errno)); }
            *p = c;
            if (c == '\0') { break; }
        }
    }
}

// the largest step s with both <dir>/model_s.bin and <dir>/state_s_00000.bin; -1 if none
static int latest_checkpoint(const char* dir) {
    DIR* d = opendir(dir);
    if (d == NULL) { return -1; }
    int best = -1;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        int step;
        char tail;
        if (sscanf(e->d_name, "state_%d_00000.bi%c", &step, &tail) == 2 && tail == 'n' && step > best) {
            char model_path[4096];
            snprintf(model_path, sizeof(model_path), "%s/model_%08d.bin", dir, step);
            if (access(model_path, R_OK) == 0) { best = step; }
        }
    }
    closedir(d);
    return best;
}

// prints `count` sampled tokens that follow an end-of-text token
static void print_sample(const GPT<float, float>* model, InferState<float>* state, const Tokenizer* tok,
                         const SamplerConfig* cfg, uint64_t* rng, int count, ProbIndex* scratch) {
    int token = tok->eot_token;
    int V = model->config.vocab_size;
    printf("---\n");
    for (int pos = 0; pos < count && pos < model->config.max_seq_len; pos++) {
        gpt_forward_cached(model, state, &token, 1, pos);
        token = sample_token(state->logits, V, cfg, rng, scratch);
        if (token == tok->eot_token) { break; }
        size_t len = 0;
        const unsigned char* bytes = tokenizer_decode(tok, token, &len);
        fwrite(bytes, 1, len, stdout);
    }
    printf("\n---\n");
}

// mean CE over the first `batches` batches of the validation set
static double evaluate(GPT<float, float>* model, DataLoader* val, int batches) {
    dataloader_reset(val);
    gpt_stats_reset(model);
    for (int i = 0; i < batches; i++) {
        dataloader_next_batch(val);
        gpt_forward(model, val->inputs, val->targets, val->B, val->T, 0.0f);
    }
    gpt_stats_read(model, (double)batches * val->B * val->T);
    return model->ce;
}

int main(int argc, char** argv) {
    // ------------------------------------------------------------------------
    // flags
    const char* train_pattern = "data/corpus_train_*.bin";
    const char* val_pattern = "data/corpus_val_*.bin";
    const char* out_dir = "out";
    const char* preset_name = "default";
    const char* tokenizer_path = TOKENIZER_DEFAULT_PATH;
    const char* device = "auto";
    int B = 8, T = 256, total_batch = -1, max_steps = 2000, warmup = 100;
    int val_every = 100, val_batches = 20, sample_every = 500, sample_tokens = 64, ckpt_every = 500;
    int resume = 0, seed = 1337, vocab = 50257, layers = 0, dim = 0, heads = 0, kv_heads = 0, hidden = 0;
    float lr = 1e-3f, final_lr_frac = 0.1f, weight_decay = 0.1f, grad_clip = 1.0f, lambda = 2e-5f;
    float beta1 = 0.9f, beta2 = 0.95f, adam_eps = 1e-8f, rope_theta = 10000.0f, norm_eps = 1e-5f;
    ArgSpec specs[] = {
        {'i', "train-data", ARG_STRING, &train_pattern, 0, 0, "glob of training shards", 0},
        {'j', "val-data", ARG_STRING, &val_pattern, 0, 0, "glob of validation shards", 0},
        {'o', "output-dir", ARG_STRING, &out_dir, 0, 0, "directory for the logs and checkpoints", 0},
        {'e', "model", ARG_STRING, &preset_name, 0, 0, "model shape: default, 124m, 0.5b, 1b, 1.5b, 2b", 0},
        {0, "layers", ARG_INT, &layers, 1, 1024, "number of layers (default: the preset's)", 0},
        {0, "dim", ARG_INT, &dim, 2, 65536, "model width D (default: the preset's)", 0},
        {0, "heads", ARG_INT, &heads, 1, 1024, "attention heads (default: the preset's)", 0},
        {0, "kv-heads", ARG_INT, &kv_heads, 1, 1024, "key/value heads, < heads for GQA (default: heads)", 0},
        {0, "hidden", ARG_INT, &hidden, 1, 1 << 20, "FFN width H (default: the preset's)", 0},
        {0, "vocab", ARG_INT, &vocab, 2, 1 << 24, "vocabulary size of the shards", 0},
        {0, "rope-theta", ARG_FLOAT, &rope_theta, 1, 1e9, "RoPE base", 0},
        {0, "norm-eps", ARG_FLOAT, &norm_eps, 1e-12, 1, "RMSNorm epsilon", 0},
        {'b', "batch", ARG_INT, &B, 1, 1 << 16, "micro-batch size in sequences", 0},
        {'t', "seq-len", ARG_INT, &T, 2, 1 << 20, "sequence length (also the model's max_seq_len)", 0},
        {'d', "total-batch", ARG_INT, &total_batch, -1, 1 << 30, "tokens per optimizer step (-1 = one micro-batch)", 0},
        {'x', "max-steps", ARG_INT, &max_steps, 1, 1 << 30, "optimizer steps", 0},
        {'l', "lr", ARG_FLOAT, &lr, 0, 10, "peak learning rate", 0},
        {'u', "warmup", ARG_INT, &warmup, 0, 1 << 30, "warmup steps", 0},
        {'q', "final-lr-frac", ARG_FLOAT, &final_lr_frac, 0, 1, "cosine floor as a fraction of the peak lr", 0},
        {'c', "weight-decay", ARG_FLOAT, &weight_decay, 0, 10, "AdamW weight decay on matrices", 0},
        {0, "beta1", ARG_FLOAT, &beta1, 0, 0.999999, "AdamW beta1", 0},
        {0, "beta2", ARG_FLOAT, &beta2, 0, 0.999999, "AdamW beta2", 0},
        {0, "adam-eps", ARG_FLOAT, &adam_eps, 0, 1, "AdamW epsilon", 0},
        {0, "grad-clip", ARG_FLOAT, &grad_clip, 0, 1e9, "max global gradient norm (0 = off)", 0},
        {'a', "l1", ARG_FLOAT, &lambda, 0, 1e3, "L1 coefficient lambda on the FFN activations", 0},
        {'v', "val-every", ARG_INT, &val_every, 0, 1 << 30, "steps between validations (0 = only at the end)", 0},
        {'m', "val-batches", ARG_INT, &val_batches, 1, 1 << 30, "micro-batches per validation", 0},
        {'s', "sample-every", ARG_INT, &sample_every, 0, 1 << 30, "steps between text samples (0 = never)", 0},
        {'g', "sample-tokens", ARG_INT, &sample_tokens, 1, 1 << 20, "tokens per text sample", 0},
        {'n', "ckpt-every", ARG_INT, &ckpt_every, 0, 1 << 30, "steps between checkpoints (0 = only at the end)", 0},
        {'y', "resume", ARG_INT, &resume, 0, 1, "1 = continue from the latest checkpoint in the output dir", 0},
        {'r', "seed", ARG_INT, &seed, 0, 2147483647, "seed of the init, the data order and the samples", 0},
        {0, "tokenizer", ARG_STRING, &tokenizer_path, 0, 0, "GPT-2 rank file, for the text samples", 0},
        {0, "device", ARG_STRING, &device, 0, 0, "auto, cpu or cuda", 0},
    };
    int num_specs = (int)(sizeof(specs) / sizeof(specs[0]));
    setvbuf(stdout, NULL, _IOLBF, 0); // keep the log in order with errors on stderr
    cli_parse(argc, argv, "usage: ./train_gpt_sparse [flags]\n"
              "Trains a sparse ReLU language model; with no flags, the default model on data/.", specs, num_specs);

    const ModelPreset* preset = NULL;
    for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++) {
        if (strcmp(presets[i].name, preset_name) == 0) { preset = &presets[i]; }
    }
    if (preset == NULL) { fatal("unknown model '%s' (default, 124m, 0.5b, 1b, 1.5b, 2b)", preset_name); }
    GPTConfig config;
    config.vocab_size = vocab;
    config.padded_vocab_size = round_up(vocab, 128);
    config.num_layers = layers ? layers : preset->layers;
    config.channels = dim ? dim : preset->dim;
    config.num_heads = heads ? heads : preset->heads;
    config.num_kv_heads = kv_heads ? kv_heads : config.num_heads;
    config.hidden = hidden ? hidden : preset->hidden;
    config.max_seq_len = T;
    config.rope_theta = rope_theta;
    config.norm_eps = norm_eps;
    config_validate(&config);

    int tokens_per_micro = B * T;
    if (total_batch == -1) { total_batch = tokens_per_micro; }
    if (total_batch % tokens_per_micro != 0) {
        fatal("--total-batch %d is not a multiple of batch x seq-len = %d", total_batch, tokens_per_micro);
    }
    int grad_accum = total_batch / tokens_per_micro;
    if (strcmp(device, "auto") != 0 && strcmp(device, "cpu") != 0 && strcmp(device, "cuda") != 0) {
        fatal("--device must be auto, cpu or cuda, not '%s'", device);
    }

    int gpus = cuda_device_count();
    if (strcmp(device, "cuda") == 0) {
        fatal(gpus ? "the CUDA training path is not built yet: use --device cpu"
                   : "--device cuda, but no CUDA GPU is present");
    }
    printf("device: CPU reference path, fp32, %d OpenMP threads (%s)\n", omp_get_max_threads(),
           gpus ? "a CUDA GPU is present, but the CUDA training path is not built yet"
                : "no CUDA GPU present");

    // ------------------------------------------------------------------------
    // data, model, optimizer
    DataLoader train_loader, val_loader;
    dataloader_init(&train_loader, train_pattern, B, T, 0, 1, 1, (uint64_t)seed, vocab);
    dataloader_init(&val_loader, val_pattern, B, T, 0, 1, 0, 0, vocab);
    int val_available = (int)dataloader_num_batches(&val_loader);
    if (val_batches > val_available) {
        printf("val: %s has %d batches of %dx%d, using all of them\n", val_pattern, val_available, B, T);
        val_batches = val_available;
    }
    printf("train: %zu tokens in %zu shards | val: %zu tokens\n", dataloader_num_tokens(&train_loader),
           train_loader.num_shards, dataloader_num_tokens(&val_loader));

    Tokenizer tokenizer;
    int have_tokenizer = 0;
    if (sample_every > 0) {
        tokenizer_init(&tokenizer, tokenizer_path);
        have_tokenizer = tokenizer.vocab_size == vocab;
        if (!have_tokenizer) {
            printf("samples: off (the tokenizer has %d tokens, the data %d)\n", tokenizer.vocab_size, vocab);
        }
    }

    GPT<float, float> model;
    gpt_build(&model, &config, DEVICE_CPU);
    size_t n_params = model.num_parameters;
    float* adam_m = (float*)callocCheck(n_params, sizeof(float));
    float* adam_v = (float*)callocCheck(n_params, sizeof(float));
    OptimConfig optim = {lr, beta1, beta2, adam_eps, weight_decay, grad_clip, warmup, max_steps, final_lr_frac};
    TrainState state = {0, B, T, grad_accum, 1, 0, (uint64_t)seed ^ 0x5A4D504C45ull};

    make_dir(out_dir);
    char path[4096], log_path[4096];
    snprintf(log_path, sizeof(log_path), "%s/log.jsonl", out_dir);
    int start_step = resume ? latest_checkpoint(out_dir) : -1;
    if (resume && start_step < 0) { fatal("--resume 1, but %s holds no complete checkpoint", out_dir); }
    if (start_step >= 0) {
        GPTConfig ckpt_config;
        snprintf(path, sizeof(path), "%s/model_%08d.bin", out_dir, start_step);
        float* params = checkpoint_load_model(path, &ckpt_config, NULL);
        char msg[256];
        if (config_mismatch(&ckpt_config, &config, msg, sizeof(msg))) { fatal("%s is for another model: %s", path, msg); }
        memcpy(model.params, params, n_params * sizeof(float));
        free(params);
        snprintf(path, sizeof(path), "%s/state_%08d_00000.bin", out_dir, start_step);
        DataLoaderState loader_state;
        checkpoint_load_state(path, &config, &state, &loader_state, sizeof(loader_state), adam_m, adam_v);
        if (state.B != B || state.T != T || state.grad_accum != grad_accum) {
            fatal("%s was written with batch %d, seq-len %d, %d accumulation steps; this run has %d, %d, %d",
                  path, state.B, state.T, state.grad_accum, B, T, grad_accum);
        }
        dataloader_set_state(&train_loader, &loader_state);
        log_truncate_after_step(log_path, start_step);
        printf("resumed from %s/model_%08d.bin at step %d\n", out_dir, start_step, start_step);
    } else {
        init_params_random(model.params, &config, (uint64_t)seed);
        log_truncate_after_step(log_path, -1);
    }
    printf("model: %d layers, D %d, %d heads (%d kv), H %d, vocab %d, T %d: %.2fM parameters\n",
           config.num_layers, config.channels, config.num_heads, config.num_kv_heads, config.hidden,
           config.vocab_size, T, n_params / 1e6);
    printf("batch: %d x %d tokens x %d accumulation = %d tokens per step | lambda %g | lr %g\n",
           B, T, grad_accum, total_batch, lambda, lr);

    InferState<float> sample_state;
    ProbIndex* sample_scratch = NULL;
    SamplerConfig sampler = {1.0f, 0, 1.0f};
    if (have_tokenizer) {
        infer_state_alloc(&sample_state, &config, 1);
        sample_scratch = (ProbIndex*)mallocCheck(vocab * sizeof(ProbIndex));
    }

    // ------------------------------------------------------------------------
    // training loop
    int L = config.num_layers, H = config.hidden;
    size_t sizes[NUM_PARAM_TENSORS];
    param_sizes(sizes, &config);
    float dloss = 1.0f / ((float)tokens_per_micro * grad_accum);
    float l1_scale = lambda / ((float)L * tokens_per_micro * grad_accum);
    double val_ce = -1;

    int first_step = state.step;
    for (int step = first_step; step <= max_steps; step++) {
        int last = step == max_steps;
        // a resumed run already validated and sampled at its first step before the checkpoint
        int done_before = start_step >= 0 && step == first_step;
        if (!done_before && ((val_every > 0 && step % val_every == 0) || last)) {
            val_ce = evaluate(&model, &val_loader, val_batches);
            printf("step %d | val ce %.4f\n", step, val_ce);
            log_val(log_path, step, val_ce);
        }
        if (!done_before && have_tokenizer && ((sample_every > 0 && step > 0 && step % sample_every == 0) || last)) {
            print_sample(&model, &sample_state, &tokenizer, &sampler, &state.sample_rng, sample_tokens, sample_scratch);
        }
        if (step > first_step && ((ckpt_every > 0 && step % ckpt_every == 0) || last)) {
            state.step = step;
            snprintf(path, sizeof(path), "%s/model_%08d.bin", out_dir, step);
            checkpoint_save_model(path, &config, model.params, step);
            DataLoaderState loader_state = dataloader_get_state(&train_loader);
            snprintf(path, sizeof(path), "%s/state_%08d_00000.bin", out_dir, step);
            checkpoint_save_state(path, &config, &state, &loader_state, sizeof(loader_state), adam_m, adam_v);
            printf("checkpoint: %s/model_%08d.bin\n", out_dir, step);
        }
        if (last) { break; }

        // one optimizer step over grad_accum micro-batches
        double t0 = now_seconds();
        gpt_zero_grad(&model);
        gpt_stats_reset(&model);
        for (int micro = 0; micro < grad_accum; micro++) {
            dataloader_next_batch(&train_loader);
            gpt_forward(&model, train_loader.inputs, train_loader.targets, B, T, dloss);
            gpt_backward(&model, train_loader.inputs, l1_scale);
        }
        gpt_stats_read(&model, (double)total_batch);
        double grad_norm = global_norm(model.grads, n_params);
        float clip_scale = (grad_clip > 0 && grad_norm > grad_clip) ? (float)(grad_clip / grad_norm) : 1.0f;
        float step_lr = lr_at_step(&optim, step);
        for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
            size_t off = model.param[i] - model.params;
            adamw_update(model.param[i], model.grad[i], adam_m + off, adam_v + off, sizes[i], step_lr, &optim,
                         step + 1, clip_scale, param_is_matrix(i));
        }
        double ms = (now_seconds() - t0) * 1000;

        StepLog entry;
        entry.step = step + 1;
        entry.loss = model.ce + lambda * model.l1_term;
        entry.ce = model.ce;
        entry.l1 = lambda * model.l1_term;
        entry.lr = step_lr;
        entry.grad_norm = grad_norm;
        entry.tok_per_s = total_batch / (ms / 1000);
        entry.ms = ms;
        entry.num_layers = L;
        entry.hidden = H;
        entry.layers = model.stats;
        log_step(log_path, &entry, max_steps);
    }

    // ------------------------------------------------------------------------
    if (have_tokenizer) {
        infer_state_free(&sample_state);
        free(sample_scratch);
    }
    if (sample_every > 0) { tokenizer_free(&tokenizer); }
    free(adam_m);
    free(adam_v);
    gpt_free(&model);
    dataloader_free(&train_loader);
    dataloader_free(&val_loader);
    return 0;
}
