/*
 train_gpt_sparse: trains a Llama-style language model with a ReLU-gated FFN
 and an L1 penalty on the FFN activations that makes them sparse.

     loss = CE + lambda * (1/L) sum_l (1/M) sum_{m,n} |h_l[m, n]|

 With no arguments it trains the small default model on the corpus shipped in
 data/. It also trains dense SiLU models (--activation silu, lambda 0), and
 sparsifies a pretrained dense one (ReLUfication): --init-from takes a model
 file's weights (hf_convert --import writes one from a Hugging Face Llama) with
 a fresh optimizer from step 0, --activation relu replaces its SiLU, and
 --l1-ramp grows lambda from lambda / R so that the model first adapts to
 ReLU. The default model ramps lambda over its whole run (llmc/model.h). This
 file is the training loop: flags, data, the optimizer step, the
 logs, validation, multiple-choice evaluation (--eval-file, llmc/eval.h),
 samples and checkpoints. The model's forward and backward
 live in llmc/gpt.h over the kernels of the backend.

 Backends: on a CUDA GPU, bf16 weights and activations with fp32 gradients,
 master weights and AdamW moments; everywhere else, the CPU reference path
 (fp32, OpenMP). The same training function runs both: train<T> with T = bf16
 or float. Several processes (one per GPU, on one or many machines) train one
 model with data parallelism and a sharded optimizer (llmc/zero.cuh).
*/
#include <cuda_runtime.h>
#include <omp.h>
#include <signal.h>
#include <sys/stat.h>

#include "llmc/adamw.h"
#include "llmc/checkpoint.h"
#include "llmc/cli.h"
#include "llmc/dataloader.h"
#include "llmc/eval.h"
#include "llmc/inference.h"
#include "llmc/logger.h"
#include "llmc/optimizer.h"
#include "llmc/sampler.h"
#include "llmc/synthetic.h"
#include "llmc/tokenizer.h"
#include "llmc/watchdog.h"

// steps of the default run on the CPU when -x is not given (10 to 15 minutes on two cores)
#define CPU_SHORT_STEPS 150
#define STR_(x) #x
#define STR(x) STR_(x)

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

// Ctrl-C (SIGINT) and SIGTERM, which schedulers send before they end a job:
// the first asks the run to stop after its current step, with a checkpoint; a
// second one ends the process at once. A signal that was ignored when the
// process started (a background job of a script, which forwards it) stays
// ignored. The handler only sets the flag and writes a line (async-signal-safe).
static volatile sig_atomic_t stop_signal = 0;

static void write_stderr(const char* msg) {
    ssize_t ignored = write(STDERR_FILENO, msg, strlen(msg));
    (void)ignored;
}

static void on_stop_signal(int sig) {
    if (stop_signal != 0) {
        write_stderr("\nsecond signal: stopping at once, without a checkpoint (the newest complete one is intact)\n");
        signal(sig, SIG_DFL);
        raise(sig); // delivered when the handler returns: the process ends by this signal
        return;
    }
    stop_signal = sig;
    write_stderr("\nstop requested: finishing this step, then writing a checkpoint (a second signal stops at once)\n");
}

static void catch_stop_signals(void) {
    const int signals[] = {SIGINT, SIGTERM};
    for (int i = 0; i < 2; i++) {
        struct sigaction old, sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_stop_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;
        if (sigaction(signals[i], NULL, &old) != 0 || (old.sa_handler != SIG_IGN && sigaction(signals[i], &sa, NULL) != 0)) {
            fatal("cannot catch signal %d: %s", signals[i], strerror(errno));
        }
    }
}

// Whether to stop, agreed by every process so that all stop at the same step:
// each one's request (a signal) is max-reduced once per step, queued on the
// main stream with the step's other collectives, and read where the host waits
// for the step anyway. One process: its own request.
typedef struct {
    Zero* zero;   // NULL with one process
    int* host;    // pinned: [0] this process's request, [1] the agreed answer
    int* device;
} StopVote;

static void stop_vote_init(StopVote* v, Zero* zero) {
    memset(v, 0, sizeof(*v));
    v->zero = zero;
    if (zero == NULL) { return; }
    cudaCheck(cudaMallocHost((void**)&v->host, 2 * sizeof(int)));
    v->device = (int*)cuda_malloc(sizeof(int));
}

// every process calls it at the same point, after the second stream's collectives were joined
static void stop_vote_send(StopVote* v) {
    if (v->zero == NULL) { return; }
    v->host[0] = stop_signal != 0;
    cudaCheck(cudaMemcpyAsync(v->device, v->host, sizeof(int), cudaMemcpyHostToDevice, main_stream));
    zero_all_reduce_max(v->zero, v->device);
    cudaCheck(cudaMemcpyAsync(v->host + 1, v->device, sizeof(int), cudaMemcpyDeviceToHost, main_stream));
}

// the agreed answer of the last vote sent (waits for the main stream)
static int stop_vote_result(StopVote* v) {
    if (v->zero == NULL) { return stop_signal != 0; }
    cudaCheck(cudaStreamSynchronize(main_stream));
    return v->host[1];
}

static void stop_vote_free(StopVote* v) {
    if (v->zero == NULL) { return; }
    cudaCheck(cudaFreeHost(v->host));
    cuda_free(v->device);
}

// the step of a checkpoint file of a run (model_<step>.bin, state_<step>_<rank>.bin, or either with .tmp);
// RUN_LOG for its log (log.jsonl, or with .tmp); NOT_RUN for anything else
enum { RUN_LOG = -1, NOT_RUN = -2 };
static int run_file_step(const char* name) {
    int step, rank, end = 0;
    if (sscanf(name, "model_%d.bin%n", &step, &end) == 1 || sscanf(name, "state_%d_%d.bin%n", &step, &rank, &end) == 2) {
        return end > 0 && (name[end] == '\0' || strcmp(name + end, ".tmp") == 0) ? step : NOT_RUN;
    }
    return strcmp(name, "log.jsonl") == 0 || strcmp(name, "log.jsonl.tmp") == 0 ? RUN_LOG : NOT_RUN;
}

// the number of files of a run in dir whose step is above `after` (NOT_RUN: every file of the run, the log
// too; an empty log.jsonl is none); with remove = 1 they are deleted
static int run_files(const char* dir, int after, int remove) {
    DIR* d = opendir(dir);
    if (d == NULL) { return 0; }
    int count = 0;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        int empty_log = strcmp(e->d_name, "log.jsonl") == 0 && stat(path, &st) == 0 && st.st_size == 0;
        int step = run_file_step(e->d_name);
        if (step == NOT_RUN || step <= after || empty_log) { continue; }
        count++;
        if (remove && unlink(path) != 0) { fatal("cannot delete %s: %s", path, strerror(errno)); }
    }
    closedir(d);
    return count;
}

// "the newest complete checkpoint is <path>" or "<dir> holds no complete checkpoint", for messages
static void describe_newest(char* out, size_t len, const char* dir) {
    int newest = checkpoint_newest(dir, CKPT_COMPLETE, INT_MAX);
    if (newest < 0) { snprintf(out, len, "%s holds no complete checkpoint", dir); return; }
    char path[4096];
    model_path(path, sizeof(path), dir, newest);
    snprintf(out, len, "the newest complete checkpoint is %s", path);
}

typedef struct {
    const char* train_pattern;
    const char* val_pattern;
    const char* out_dir;
    const char* tokenizer_path;
    const char* eval_file;     // multiple-choice eval file (llmc/evalset.h), or NULL
    int eval_every, eval_examples; // steps between evaluations (0: only at the end); examples each (0: all)
    GPTConfig config;
    OptimConfig optim;
    int B, T, total_batch, grad_accum;
    int val_every, val_batches, sample_every, sample_tokens, ckpt_every;
    int final_val_batches;     // micro-batches of the last validation (0: the whole val set)
    int resume, seed, recompute;
    int resume_step;           // with resume: the checkpoint to continue (-1: the newest)
    int keep_schedule;         // on resume: 1 = the lr schedule the checkpoint was trained with, 0 = this run's
    int overwrite;             // 1: delete the run in out_dir and start over
    int max_nonfinite;         // steps in a row with a non-finite loss or gradient norm before the run stops
    int inject_nan;            // tests: a NaN at this step (0 = never) in the gradients, or in a moment with
                               // inject_nan_moment
    int inject_nan_moment;
    float lambda;
    int l1_ramp;               // lambda grows linearly from lambda / l1_ramp to lambda over this many steps (0: none)
    const char* init_from;     // a model file whose weights start the run (NULL: a random init)
    int ffn_mode;              // FfnMode (llmc/ffn/ffn.h)
    int dead_reinit;           // 1: docs/MODEL.md's dead-neuron re-initialisation after each step
    float synthetic_k;         // > 0: benchmark-only synthetic-sparse init (llmc/gpt.h), no checkpoints
    float hot_rate;            // a fixed firing rate above which an FFN unit is hot (llmc/ffn/split.h); 0: none, < 0: measured costs
    ProcessInfo proc;          // this process of the data-parallel run
    const char* init_method;   // how the processes meet (llmc/zero.cuh)
    const char* init_address;
    const char* init_file;
    int timeout;               // seconds a step may wait for the other processes
} Options;

// Text samples run on the CPU path from an fp32 copy of the weights (the GPU
// inference kernels belong to infer); prints `count` tokens after end-of-text.
typedef struct {
    GPT<float, float> model;
    InferState<float> state;
    ProbIndex* scratch;
    Tokenizer tokenizer;
    float* params; // fp32 host copy of the training model's weights
} Sampler;

static void print_sample(Sampler* s, const SamplerConfig* cfg, uint64_t* rng, int count) {
    GPT<float, float>* model = &s->model;
    int token = s->tokenizer.eot_token, one = 1;
    printf("---\n");
    for (int pos = 0; pos < count && pos < model->config.max_seq_len; pos++) {
        if (pos == 0) { gpt_prefill(model, &s->state, &token, &one, 1, (float*)NULL); }
        else { gpt_decode(model, &s->state, &token, &pos, 1, (float*)NULL); }
        token = sample_token(s->state.logits, model->config.vocab_size, cfg, rng, s->scratch);
        if (token == s->tokenizer.eot_token) { break; }
        size_t len = 0;
        const unsigned char* bytes = tokenizer_decode(&s->tokenizer, token, &len);
        fwrite(bytes, 1, len, stdout);
    }
    printf("\n---\n");
}

// Batches of token ids where the model reads them. On the CPU path, the
// loader's own buffers. On the GPU, two pinned host buffers and two device
// buffers used in turn: a batch is copied into pinned memory, then sent with an
// asynchronous copy queued behind the work already on the stream, so the host
// runs ahead and reads the next batch while the GPU computes. Before a pinned
// buffer is refilled, the host waits for the copy made from it two batches ago.
typedef struct {
    Device device;
    int n;                // tokens per batch
    int* pinned[2];       // [2n]: inputs, then targets
    int* on_device[2];    // [2n]
    void* copied[2];      // cudaEvent_t: the copy out of pinned[k] has finished
    int next;
    const int* inputs;    // the current batch, where the model reads it
    const int* targets;
} BatchUploader;

static void uploader_init(BatchUploader* u, int n, Device device) {
    memset(u, 0, sizeof(*u));
    u->device = device;
    u->n = n;
    if (device == DEVICE_CPU) { return; }
    for (int k = 0; k < 2; k++) {
        cudaCheck(cudaMallocHost((void**)&u->pinned[k], 2 * n * sizeof(int)));
        u->on_device[k] = (int*)device_malloc(2 * n * sizeof(int), device);
        cudaEvent_t event;
        cudaCheck(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
        cudaCheck(cudaEventRecord(event, main_stream));
        u->copied[k] = event;
    }
}

static void uploader_put(BatchUploader* u, const int* inputs, const int* targets) {
    if (u->device == DEVICE_CPU) {
        u->inputs = inputs;
        u->targets = targets;
        return;
    }
    int k = u->next;
    u->next ^= 1;
    cudaCheck(cudaEventSynchronize((cudaEvent_t)u->copied[k]));
    memcpy(u->pinned[k], inputs, u->n * sizeof(int));
    memcpy(u->pinned[k] + u->n, targets, u->n * sizeof(int));
    cudaCheck(cudaMemcpyAsync(u->on_device[k], u->pinned[k], 2 * u->n * sizeof(int), cudaMemcpyHostToDevice, main_stream));
    cudaCheck(cudaEventRecord((cudaEvent_t)u->copied[k], main_stream));
    u->inputs = u->on_device[k];
    u->targets = u->on_device[k] + u->n;
}

static void uploader_free(BatchUploader* u) {
    if (u->device == DEVICE_CPU) { return; }
    for (int k = 0; k < 2; k++) {
        cudaCheck(cudaFreeHost(u->pinned[k]));
        device_free(u->on_device[k], u->device);
        cudaCheck(cudaEventDestroy((cudaEvent_t)u->copied[k]));
    }
}

// the statistics of the forwards since gpt_stats_reset, summed over all processes
template <typename T>
void reduce_stats(GPT<T, float>* model, Zero* zero) {
    if (zero) {
        // stats_acc: the loss, then per layer the L1 sum, firing pairs and most firing units (a maximum)
        zero_reduce_stats(zero, model->stats_acc, 1 + 3 * model->config.num_layers, 3, 3, model->fired,
                          model->unit_count, (size_t)model->config.num_layers * model->config.hidden);
    }
}

// mean CE over the first `batches` global batches of the validation set, the
// validation of step `step`; with `progress`, a line every 5 seconds says how
// far it is. A stop request cuts it short (the caller then discards it).
template <typename T>
double evaluate(GPT<T, float>* model, Zero* zero, DataLoader* val, int batches, BatchUploader* uploader, int step,
                int progress) {
    dataloader_reset(val);
    gpt_stats_reset(model);
    double start = now_seconds(), shown = start;
    for (int i = 0; i < batches && !stop_signal; i++) {
        dataloader_next_batch(val);
        uploader_put(uploader, val->inputs, val->targets);
        gpt_forward(model, uploader->inputs, uploader->targets, val->B, val->T, 0.0f);
        double now = now_seconds();
        if (progress && now - shown >= 5 && i + 1 < batches) {
            char eta[32];
            format_duration(eta, sizeof(eta), (now - start) / (i + 1) * (batches - i - 1));
            printf("step %d | validation: %d/%d batches | ETA %s\n", step, i + 1, batches, eta);
            shown = now;
        }
    }
    // (the forwards waited for the last step's all-gather; one cut short before any did not)
    if (zero) { zero_join(zero); }
    reduce_stats(model, zero);
    gpt_stats_read(model, (double)batches * val->B * val->T * val->num_processes);
    return model->ce;
}

// the evaluation's counts summed over every process, in fp32 (exact: an eval file holds fewer than 2^24
// examples), after the forwards (which waited for the last step's all-gather, unless a process had none)
static void reduce_eval_counts(Zero* zero, EvalCounts* c) {
    if (zero == NULL) { return; }
    float v[4] = {(float)c->examples, (float)c->correct, (float)c->correct_norm, (float)c->truncated};
    float* d = (float*)cuda_malloc(sizeof(v));
    zero_join(zero);
    device_copy(d, v, sizeof(v), DEVICE_CUDA);
    zero_all_reduce_sum(zero, d, 4);
    device_copy(v, d, sizeof(v), DEVICE_CUDA);
    cuda_free(d);
    *c = (EvalCounts){(int)v[0], (int)v[1], (int)v[2], (int)v[3]};
}

// rank 0 writes the model; every process its optimizer state (`owned` moments)
// and the layers' FFN choices (3 ints per layer)
static void save_checkpoint(const Options* o, int step, const float* params, const TrainState* state,
                            const DataLoaderState* loader_state, const float* m, const float* v, size_t owned,
                            const int32_t* ffn) {
    char path[4096], model[4096];
    model_path(model, sizeof(model), o->out_dir, step);
    if (o->proc.rank == 0) { checkpoint_save_model(model, &o->config, params, step); }
    state_path(path, sizeof(path), o->out_dir, step, o->proc.rank);
    checkpoint_save_state(path, &o->config, state, loader_state, sizeof(*loader_state), m, v, owned, ffn);
    if (o->proc.rank == 0) { printf("checkpoint: %s\n", model); }
}

// what to do when the checkpoint of `step` cannot be resumed: continue from the complete one before it
static void older_checkpoint_hint(char* out, size_t len, const char* dir, int step) {
    int older = checkpoint_newest(dir, CKPT_COMPLETE, step);
    if (older < 0) {
        snprintf(out, len, "no complete checkpoint comes before it (--overwrite 1 starts over)");
    } else {
        snprintf(out, len, "--resume-step %d continues from the complete checkpoint before it (and deletes the files of "
                 "the later steps)", older);
    }
}

// What the run does with its output directory, said in one line: continue the
// newest checkpoint (--resume 1) or the one --resume-step names, start a new run
// where there is no other, or delete the other and start over (--overwrite 1);
// otherwise it is refused, so that two runs never mix. A newest checkpoint that
// is incomplete is an error, never a silent step back to an older one. Returns
// the step to resume, or -1.
static int choose_start(const Options* o) {
    int master = o->proc.rank == 0;
    if (o->resume) {
        int newest = checkpoint_newest(o->out_dir, CKPT_ANY_FILE, INT_MAX);
        if (newest < 0) {
            fatal("--resume 1, but %s holds no checkpoint (model_<step>.bin and its state files): leave out --resume to "
                  "start a new run there", o->out_dir);
        }
        int step = o->resume_step >= 0 ? o->resume_step : newest;
        char why[4200], hint[256];
        if (checkpoint_incomplete(o->out_dir, step, why, sizeof(why))) {
            if (o->resume_step >= 0) { fatal("--resume-step %d: the checkpoint is incomplete: %s", step, why); }
            older_checkpoint_hint(hint, sizeof(hint), o->out_dir, step);
            fatal("the newest checkpoint in %s, step %d, is incomplete: %s; %s", o->out_dir, step, why, hint);
        }
        return step;
    }
    int files = run_files(o->out_dir, NOT_RUN, 0);
    if (files > 0 && !o->overwrite) {
        char newest[4200];
        describe_newest(newest, sizeof(newest), o->out_dir);
        fatal("%s holds another run (%d checkpoint and log files; %s): give --resume 1 to continue it, --overwrite 1 "
              "to delete it and start over, or another --output-dir", o->out_dir, files, newest);
    }
    if (master) {
        if (files > 0) {
            run_files(o->out_dir, NOT_RUN, 1);
            printf("output: %s, a new run (--overwrite 1: deleted the %d checkpoint and log files of the run there)\n",
                   o->out_dir, files);
        } else {
            printf("output: %s, a new run\n", o->out_dir);
        }
    }
    return -1;
}

// a checkpoint never holds a NaN or inf: the run stops with an error instead
static void refuse_nonfinite(const Options* o, int step, const float* x, size_t n, const char* what) {
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) {
            char newest[4200];
            describe_newest(newest, sizeof(newest), o->out_dir);
            fatal("step %d: the %s hold a non-finite value (%g at index %zu): no checkpoint written; %s", step, what,
                  x[i], i, newest);
        }
    }
}

// the run's last lines: how sparse the model is, from the last statistics (the final validation's), and the
// FFN path each layer ran
template <typename T, typename G>
static void print_sparsity(const GPT<T, G>* model) {
    int L = model->config.num_layers, H = model->config.hidden;
    double l0 = 0, dead = 0;
    char per_layer[2048] = "", paths[4096] = "";
    size_t n = 0, m = 0;
    for (int l = 0; l < L; l++) {
        const LayerStats* s = &model->stats[l];
        l0 += s->l0_mean / L;
        dead += s->dead / L;
        if (n < sizeof(per_layer)) {
            n += snprintf(per_layer + n, sizeof(per_layer) - n, "%s%.1f", l ? " / " : "", s->l0_mean);
        }
        const FfnLayer<T>* f = &model->ffn.layer[l];
        char hot[32] = "";
        if (f->on && f->hot_units > 0) { snprintf(hot, sizeof(hot), " (%d hot units)", f->hot_units); }
        if (m < sizeof(paths)) {
            m += snprintf(paths + m, sizeof(paths) - m, "%s%d %s%s", l ? ", " : "", l, f->on ? "sparse" : "dense", hot);
        }
    }
    printf("sparsity: %.1f of %d FFN units fire per token (%.2f%% of H; per layer %s), %.1f%% never fired\n", l0, H,
           100 * l0 / H, per_layer, 100 * dead);
    printf("ffn path per layer: %s\n", paths);
}

// "peak 0.001 after 15 warmup steps, cosine to 0.0001 at step 150", for messages
static void describe_schedule(char* out, size_t len, const OptimConfig* c) {
    snprintf(out, len, "peak %g after %d warmup steps, cosine to %g at step %d", c->lr, c->warmup_steps,
             c->lr * c->final_lr_frac, c->total_steps);
}

// lambda for optimizer step `step` (0-based; logged as step + 1): with --l1-ramp R it is lambda (step + 1) / R
// until step R, a function of the step alone, so that a resumed run goes on as the uninterrupted one
static float lambda_at_step(const Options* o, int step) {
    if (o->l1_ramp == 0 || step + 1 >= o->l1_ramp) { return o->lambda; }
    return (float)((double)o->lambda * (step + 1) / o->l1_ramp);
}

// validations (or evaluations) every `every` steps, at step 0 and at the last, still to come after `step`
static int due_left(int every, int step, int total) {
    int left = every > 0 ? total / every - step / every : 0;
    return left + (every == 0 || total % every != 0);
}

// trains to o->optim.total_steps; returns 1 if a signal stopped the run first
template <typename T>
int train(const Options* o, Device device) {
    catch_stop_signals();
    const GPTConfig* config = &o->config;
    int B = o->B, T_ = o->T, M = B * T_, L = config->num_layers;
    int P = o->proc.size, rank = o->proc.rank, master = rank == 0;
    // with several processes, a phase (step, validation, checkpoint) that waits longer than this on the
    // others ends the run
    Watchdog watchdog;
    watchdog_start(&watchdog, P > 1);
    Zero zero_group, *zero = NULL;
    if (P > 1) {
        watchdog_arm(&watchdog, o->timeout, "rank %d: meeting the other %d processes", rank, P - 1);
        zero_init(&zero_group, &o->proc, config, o->init_method, o->init_address, o->init_file, o->timeout);
        watchdog_disarm(&watchdog);
        zero = &zero_group;
    }
    DataLoader train_loader, val_loader;
    dataloader_init(&train_loader, o->train_pattern, B, T_, rank, P, 1, (uint64_t)o->seed, config->vocab_size);
    dataloader_init(&val_loader, o->val_pattern, B, T_, rank, P, 0, 0, config->vocab_size);
    // every validation but the last reads the first val_batches; the last one the whole val set, or as many
    // as --final-val-batches says
    int all_val_batches = (int)dataloader_num_batches(&val_loader), val_batches = o->val_batches;
    if (val_batches > all_val_batches) {
        val_batches = all_val_batches;
        if (master) { printf("val: %s has %d batches of %dx%d, using all of them\n", o->val_pattern, val_batches, B * P, T_); }
    }
    int final_val_batches = o->final_val_batches > 0 && o->final_val_batches < all_val_batches ? o->final_val_batches
                                                                                                 : all_val_batches;
    if (master) {
        printf("train: %zu tokens in %zu shards | val: %zu tokens\n", dataloader_num_tokens(&train_loader),
               train_loader.num_shards, dataloader_num_tokens(&val_loader));
    }
    EvalSet eval_set;
    int eval_examples = 0;
    if (o->eval_file) {
        evalset_load(&eval_set, o->eval_file);
        eval_examples = o->eval_examples > 0 && o->eval_examples < eval_set.num_examples ? o->eval_examples
                                                                                          : eval_set.num_examples;
        eval_check(&eval_set, o->eval_file, eval_examples, config->vocab_size, T_);
        if (master) {
            char every[32] = "at the end";
            if (o->eval_every > 0) { snprintf(every, sizeof(every), "every %d steps", o->eval_every); }
            printf("eval: %s, %d of its %d examples (%d endings each), %s; an ending a row of %d positions, %d rows a "
                   "forward\n", o->eval_file, eval_examples, eval_set.num_examples, eval_set.num_endings, every, T_, B);
        }
    }

    GPT<T, float> model;
    gpt_build(&model, config, device);
    model.ffn.recompute = o->recompute;
    model.ffn.mode = o->ffn_mode;
    // hot units (llmc/ffn/hot.h): a fixed firing rate above which a unit is hot, or the costs measured on the
    // GPU; the CPU path is the reference, hot units only where the run asks for them
    model.ffn.hot = o->hot_rate > 0 ? ffn_hot_policy(FFN_HOT_RATE, o->hot_rate)
                    : ffn_hot_policy(o->hot_rate < 0 && device == DEVICE_CUDA ? FFN_HOT_MEASURED : FFN_HOT_OFF, 0);
    Optimizer opt;
    optimizer_init(&opt, &model, zero);
    size_t n_params = model.num_parameters, owned = opt.owned;
    // host copies of what checkpoints hold (on the CPU path they alias the live buffers)
    float* host_params = (float*)mallocCheck(n_params * sizeof(float));
    float* host_m = device == DEVICE_CPU ? opt.m : (float*)mallocCheck(owned * sizeof(float));
    float* host_v = device == DEVICE_CPU ? opt.v : (float*)mallocCheck(owned * sizeof(float));
    int32_t* ffn_state = (int32_t*)mallocCheck(ffn_state_ints(L) * sizeof(int32_t));
    BatchUploader uploader;
    uploader_init(&uploader, M, device);
    OptimConfig optim = o->optim; // the lr schedule: this run's, or on resume perhaps the checkpoint's
    TrainState state = {0, B, T_, o->grad_accum, P, rank, (uint64_t)o->seed ^ 0x5A4D504C45ull, 0, 0, 0, 0, 0, 0};

    make_dir(o->out_dir);
    char path[4096], log_path[4096];
    snprintf(log_path, sizeof(log_path), "%s/log.jsonl", o->out_dir);
    int start_step = choose_start(o);
    if (start_step >= 0) {
        // a file found damaged while it loads: the error says how to continue from the checkpoint before it
        char hint[256];
        older_checkpoint_hint(hint, sizeof(hint), o->out_dir, start_step);
        GPTConfig ckpt_config;
        model_path(path, sizeof(path), o->out_dir, start_step);
        int model_step;
        fatal_hint = hint;
        float* params = checkpoint_load_model(path, &ckpt_config, &model_step);
        if (model_step != start_step) {
            fatal("%s holds step %d, not the %d of its name", path, model_step, start_step);
        }
        fatal_hint = NULL;
        char msg[256];
        if (config_mismatch(&ckpt_config, config, msg, sizeof(msg))) { fatal("%s is for another model: %s", path, msg); }
        set_params_from_fp32(&model, &opt, params);
        free(params);
        DataLoaderState loader_state;
        fatal_hint = hint;
        int ffn_ints = checkpoint_load_state(o->out_dir, start_step, config, P, rank, &state, &loader_state,
                                             sizeof(loader_state), host_m, host_v, ffn_state);
        // the same sparse/dense and hot/cold choices as the run that wrote it (in this rank's own file
        // when as many processes wrote it, else in rank 0's)
        if (ffn_ints) {
            state_path(path, sizeof(path), o->out_dir, start_step, state.num_processes == P ? rank : 0);
            ffn_state_set(&model.ffn, ffn_state, ffn_ints, path);
        }
        if (state.step != start_step) {
            state_path(path, sizeof(path), o->out_dir, start_step, 0);
            fatal("%s holds step %d, but its model file is step %d: they are not one checkpoint", path, state.step,
                  start_step);
        }
        fatal_hint = NULL;
        // nothing left to do: an error, not a run that silently trains nothing
        if (start_step > o->optim.total_steps) {
            fatal("the newest checkpoint in %s is step %d, past -x %d: give a larger -x to train on, or --overwrite 1 "
                  "to start over", o->out_dir, start_step, o->optim.total_steps);
        }
        if (start_step == o->optim.total_steps && !state.eval_pending) {
            fatal("the run in %s already reached step %d = -x: nothing to train (give a larger -x to train on)",
                  o->out_dir, start_step);
        }
        long saved_batch = (long)state.B * state.T * state.grad_accum * state.num_processes;
        if (state.T != T_ || saved_batch != o->total_batch) {
            fatal("checkpoint step %d was trained with seq-len %d and %ld tokens per step (%d x %d x %d accumulation x "
                  "%d processes); this run has seq-len %d and %d", start_step, state.T, saved_batch, state.B, state.T,
                  state.grad_accum, state.num_processes, T_, o->total_batch);
        }
        if (master && state.num_processes != P) {
            printf("resuming %d processes' optimizer state on %d: re-sharded\n", state.num_processes, P);
        }
        state.B = B;
        state.grad_accum = o->grad_accum;
        state.num_processes = P;
        state.rank = rank;
        device_copy(opt.m, host_m, owned * sizeof(float), device);
        device_copy(opt.v, host_v, owned * sizeof(float), device);
        state_path(path, sizeof(path), o->out_dir, start_step, 0); // (the loader state is rank 0's)
        dataloader_set_state(&train_loader, &loader_state, path);
        if (state.unverified) {
            fprintf(stderr, "note: the optimizer state of step %d in %s is in version 1 files: they have no checksum, "
                    "loaded unverified\n", start_step, o->out_dir);
        }
        if (master) {
            log_truncate_after_step(log_path, start_step);
            model_path(path, sizeof(path), o->out_dir, start_step);
            printf("resumed from %s at step %d (of %d)\n", path, start_step, o->optim.total_steps);
            // --resume-step: the later checkpoints would be taken for this run's
            int later = run_files(o->out_dir, start_step, 1);
            if (later > 0) {
                printf("--resume-step %d: deleted %d file%s of later checkpoints\n", start_step, later, later > 1 ? "s" : "");
            }
        }
        // a run resumed with another schedule (-x, -u, -l, -q): kept or changed, said in one line
        OptimConfig saved = optim;
        saved.total_steps = state.sched_steps;
        saved.warmup_steps = state.sched_warmup;
        saved.lr = state.sched_lr;
        saved.final_lr_frac = state.sched_final_frac;
        if (state.sched_steps == 0) {
            if (master) { printf("lr schedule: the checkpoint does not say its own (an older file): this run's\n"); }
        } else if (saved.total_steps != optim.total_steps || saved.warmup_steps != optim.warmup_steps ||
                   saved.lr != optim.lr || saved.final_lr_frac != optim.final_lr_frac) {
            char mine[128], theirs[128];
            describe_schedule(mine, sizeof(mine), &optim);
            describe_schedule(theirs, sizeof(theirs), &saved);
            float lr_mine = lr_at_step(&optim, start_step), lr_theirs = lr_at_step(&saved, start_step);
            if (master && o->keep_schedule) {
                printf("lr schedule: the checkpoint's (%s), not this run's (%s): step %d at lr %.2e (--lr-schedule new: "
                       "%.2e)\n", theirs, mine, start_step + 1, lr_theirs, lr_mine);
            } else if (master) {
                printf("lr schedule: this run's (%s), not the checkpoint's (%s) (--lr-schedule new): step %d at lr %.2e "
                       "instead of %.2e\n", mine, theirs, start_step + 1, lr_mine, lr_theirs);
            }
            if (o->keep_schedule) { optim = saved; }
        }
    } else {
        if (o->init_from) {
            // the shape the run took from its header; the run's own max_seq_len and activation
            GPTConfig ckpt_config;
            int ckpt_step;
            float* params = checkpoint_load_model(o->init_from, &ckpt_config, &ckpt_step);
            int ckpt_activation = ckpt_config.activation;
            ckpt_config.max_seq_len = config->max_seq_len;
            ckpt_config.activation = config->activation;
            char msg[256];
            if (config_mismatch(&ckpt_config, config, msg, sizeof(msg))) { fatal("%s changed under the run: %s", o->init_from, msg); }
            memcpy(host_params, params, n_params * sizeof(float));
            free(params);
            if (master) {
                printf("init: the weights of %s (step %d of the run that wrote it), a fresh optimizer from step 0\n",
                       o->init_from, ckpt_step);
                if (ckpt_activation != config->activation) {
                    printf("init: the FFN activation %s of the checkpoint becomes %s\n", activation_names[ckpt_activation],
                           activation_names[config->activation]);
                }
            }
        } else if (o->synthetic_k > 0) {
            init_params_synthetic_sparse(host_params, config, o->synthetic_k, (uint64_t)o->seed);
            if (master) { printf("init: synthetic-sparse gates, about %g units per token (benchmark only)\n", o->synthetic_k); }
        } else {
            init_params_random(host_params, config, (uint64_t)o->seed);
        }
        set_params_from_fp32(&model, &opt, host_params);
        if (master) { log_truncate_after_step(log_path, -1); }
    }
    if (master) {
        printf("model: %d layers, D %d, %d heads (%d kv), H %d, vocab %d, T %d, %s FFN, %s head: %.2fM parameters\n", L,
               config->channels, config->num_heads, config->num_kv_heads, config->hidden, config->vocab_size, T_,
               config->activation == ACT_SILU ? "SiLU" : "ReLU", config->untied_head ? "untied" : "tied",
               num_model_parameters(config) / 1e6);
        char processes[32] = "", ramp[64] = "";
        if (P > 1) { snprintf(processes, sizeof(processes), " x %d processes", P); }
        if (o->l1_ramp > 0) { snprintf(ramp, sizeof(ramp), " (ramped up from lambda / %d over %d steps)", o->l1_ramp, o->l1_ramp); }
        printf("batch: %d x %d tokens x %d accumulation%s = %d tokens per step | lambda %g%s | lr %g\n", B, T_,
               o->grad_accum, processes, o->total_batch, o->lambda, ramp, optim.lr);
        const char* ffn_names[] = {"dense", "sparse", "auto (each layer dense, sparse or split, whichever its measured costs say is fastest)"};
        printf("ffn: %s\n", ffn_names[o->ffn_mode]);
        if (o->ffn_mode != FFN_DENSE && model.ffn.hot.mode != FFN_HOT_OFF) {
            char hot[256];
            ffn_hot_policy_describe(hot, sizeof(hot), &model.ffn.hot);
            printf("ffn: hot units: %s\n", hot);
        }
    }

    Sampler sampler;
    int sampling = 0;
    if (o->sample_every > 0 && master) {
        tokenizer_init(&sampler.tokenizer, o->tokenizer_path);
        sampling = sampler.tokenizer.vocab_size == config->vocab_size;
        if (!sampling) {
            printf("samples: off (the tokenizer has %d tokens, the data %d)\n", sampler.tokenizer.vocab_size,
                   config->vocab_size);
            tokenizer_free(&sampler.tokenizer);
        } else {
            gpt_build(&sampler.model, config, DEVICE_CPU);
            infer_state_alloc(&sampler.state, &sampler.model, 1, 1, config->max_seq_len);
            sampler.scratch = (ProbIndex*)mallocCheck(config->vocab_size * sizeof(ProbIndex));
        }
    }
    SamplerConfig sample_cfg = {1.0f, 0, 1.0f};

    // on the GPU: the bf16 rate of a large GEMM here, for MFU
    double peak_flops = device == DEVICE_CUDA ? measure_peak_bf16_flops() * P : 0;
    double flops_per_step = training_flops_per_token(config, T_) * o->total_batch, peak_mem_gib = 0;
    // the gradients are summed over processes, so each one's losses are scaled by 1/P too
    float dloss = 1.0f / ((float)M * o->grad_accum * P);
    int first_step = state.step, total = o->optim.total_steps;
    // a resumed run validated and sampled at its first step before the checkpoint, unless a stop came first
    int first_evaluated = start_step >= 0 && !state.eval_pending;
    StopVote vote;
    stop_vote_init(&vote, zero);
    int stopping = 0;         // every process agreed to stop (a signal)
    int nonfinite = 0;        // steps in a row skipped for a non-finite loss or gradient norm
    // for the ETA: this process's step times (but its first, which warms up), its last validation's per batch and
    // its last evaluation's
    double step_seconds = 0, val_batch_seconds = -1, eval_seconds = -1;
    int timed_steps = 0;
    for (int step = first_step;; step++) {
        int last = step == total;
        int done_before = step == first_step && first_evaluated;
        int val_due = !done_before && ((o->val_every > 0 && step % o->val_every == 0) || last);
        int sample_due = !done_before && o->sample_every > 0 && ((step > 0 && step % o->sample_every == 0) || last);
        int eval_due = o->eval_file && !done_before && ((o->eval_every > 0 && step % o->eval_every == 0) || last);
        if ((val_due || eval_due) && !stopping) {
            double val_ce = 0, t0 = now_seconds(), val_s = 0;
            int batches = last ? final_val_batches : val_batches;
            if (val_due) {
                watchdog_arm(&watchdog, o->timeout, "rank %d: validation at step %d", rank, step);
                val_ce = evaluate(&model, zero, &val_loader, batches, &uploader, step, master);
                watchdog_disarm(&watchdog);
                val_s = now_seconds() - t0;
            }
            EvalCounts counts = {0, 0, 0, 0};
            if (eval_due) {
                // each process scores its share with no collective in between, so the deadline covers only the sum
                char label[64];
                snprintf(label, sizeof(label), "step %d | evaluation", step);
                EvalRun run = {eval_examples, rank, P, B, T_, &stop_signal, master ? stdout : NULL, label};
                counts = eval_score(&model, &eval_set, &run, (double*)NULL);
            }
            watchdog_arm(&watchdog, o->timeout, "rank %d: %s at step %d", rank, eval_due ? "evaluation" : "validation", step);
            if (eval_due) { reduce_eval_counts(zero, &counts); }
            stop_vote_send(&vote);
            stopping = stop_vote_result(&vote);
            watchdog_disarm(&watchdog);
            if (stopping) {
                if (master) {
                    printf("step %d | %s cut short by the stop; %s when the run continues\n", step,
                           val_due && eval_due ? "validation and evaluation" : val_due ? "validation" : "evaluation",
                           val_due && eval_due ? "they run" : "it runs");
                }
            } else {
                if (val_due) { val_batch_seconds = val_s / batches; }
                if (eval_due) { eval_seconds = now_seconds() - t0 - val_s; }
                if (master && val_due) {
                    long tokens = (long)batches * B * T_ * P;
                    if (batches == all_val_batches) {
                        printf("step %d | val ce %.4f on %ld tokens (the whole val set: %d batches)\n", step, val_ce,
                               tokens, batches);
                    } else {
                        printf("step %d | val ce %.4f on %ld tokens (%d of the val set's %d batches%s)\n", step, val_ce,
                               tokens, batches, all_val_batches, last ? ": --final-val-batches" : "");
                    }
                    log_val(log_path, step, val_ce, tokens);
                }
                if (master && eval_due) {
                    char line[4400];
                    eval_describe(line, sizeof(line), &counts, o->eval_file);
                    printf("step %d | eval %s\n", step, line);
                    log_eval(log_path, step, (double)counts.correct / counts.examples,
                             (double)counts.correct_norm / counts.examples, counts.examples, counts.truncated);
                }
            }
        }
        // a stop writes a checkpoint of this step, marked when its validation and sample are still to do; a run
        // resumed from such a checkpoint writes it again once they are done
        int resumed_pending = start_step >= 0 && step == first_step && !done_before;
        int checkpoint = !done_before && o->ckpt_every >= 0 &&
                         (stopping || last || resumed_pending ||
                          (step > first_step && o->ckpt_every > 0 && step % o->ckpt_every == 0));
        int sample = sample_due && !stopping;
        watchdog_arm(&watchdog, o->timeout, "rank %d: checkpoint of step %d", rank, step);
        // a collective with several processes, so all take part whether or not rank 0 can sample
        if (checkpoint || (sample && (sampling || P > 1))) { get_params_fp32(&model, &opt, host_params); }
        if (sample && sampling) {
            memcpy(sampler.model.params, host_params, n_params * sizeof(float));
            print_sample(&sampler, &sample_cfg, &state.sample_rng, o->sample_tokens);
        }
        if (checkpoint) {
            state.step = step;
            state.eval_pending = stopping && (val_due || sample_due || eval_due);
            state.sched_steps = optim.total_steps;
            state.sched_warmup = optim.warmup_steps;
            state.sched_lr = optim.lr;
            state.sched_final_frac = optim.final_lr_frac;
            DataLoaderState loader_state = dataloader_get_state(&train_loader);
            device_copy(host_m, opt.m, owned * sizeof(float), device);
            device_copy(host_v, opt.v, owned * sizeof(float), device);
            refuse_nonfinite(o, step, host_params, n_params, "weights");
            refuse_nonfinite(o, step, host_m, owned, "first moments");
            refuse_nonfinite(o, step, host_v, owned, "second moments");
            ffn_state_get(&model.ffn, ffn_state);
            save_checkpoint(o, step, host_params, &state, &loader_state, host_m, host_v, owned, ffn_state);
        }
        watchdog_disarm(&watchdog);
        if (stopping) {
            if (master) {
                char why[64] = "another process was asked to stop";
                if (stop_signal) { snprintf(why, sizeof(why), "%s", stop_signal == SIGINT ? "SIGINT" : "SIGTERM"); }
                if (o->ckpt_every < 0) {
                    printf("stopped at step %d of %d (%s); no checkpoint (-n -1)\n", step, total, why);
                } else {
                    char model[4096];
                    model_path(model, sizeof(model), o->out_dir, step);
                    printf("stopped at step %d of %d (%s): the checkpoint is %s; to continue, run the same command %s\n",
                           step, total, why, model, o->resume ? "again" : "with --resume 1");
                }
            }
            break;
        }
        if (last) {
            if (master) { print_sparsity(&model); }
            break;
        }

        // one optimizer step over grad_accum micro-batches
        watchdog_arm(&watchdog, o->timeout, "rank %d: step %d", rank, step + 1);
        double t0 = now_seconds();
        float step_lambda = lambda_at_step(o, step);
        float l1_scale = step_lambda / ((float)L * M * o->grad_accum * P);
        gpt_zero_grad(&model);
        gpt_stats_reset(&model);
        for (int micro = 0; micro < o->grad_accum; micro++) {
            dataloader_next_batch(&train_loader);
            uploader_put(&uploader, train_loader.inputs, train_loader.targets);
            gpt_forward(&model, uploader.inputs, uploader.targets, B, T_, dloss);
            if (zero) { zero->reduce_in_backward = micro == o->grad_accum - 1; } // the sums overlap the last backward
            gpt_backward(&model, uploader.inputs, l1_scale);
        }
        if (zero) { zero_join(zero); }
        // summed before the optimizer's collectives, whose all-gather then overlaps the next forward
        reduce_stats(&model, zero);
        stop_vote_send(&vote);
        if (o->inject_nan == step + 1) {
            const float nan = NAN;
            float* poisoned = o->inject_nan_moment ? opt.m : device == DEVICE_CPU ? model.grads : opt.grads;
            device_copy(poisoned, &nan, sizeof(float), device);
        }
        float step_lr = lr_at_step(&optim, step);
        optimizer_step(&opt, &model, &optim, step_lr, step + 1); // skipped if the loss or norm is not finite
        gpt_stats_read(&model, (double)o->total_batch); // waits for the step (but not its all-gather)
        stopping = stop_vote_result(&vote);
        double grad_norm = optimizer_grad_norm(&opt), loss = model.ce + step_lambda * model.l1_term;
        int skipped = !isfinite(grad_norm) || !isfinite(model.ce);
        if (o->dead_reinit && !skipped) {
            gpt_dead_reinit(&model, opt.master, (uint64_t)o->seed * 1000003u + (uint64_t)step);
        }
        if (!skipped) { gpt_ffn_update(&model, step + 1, (double)o->total_batch, master); }
        double ms = (now_seconds() - t0) * 1000;
        watchdog_disarm(&watchdog);
        if (step > first_step) {
            step_seconds += ms / 1000;
            timed_steps++;
        }

        if (skipped) {
            nonfinite++;
            if (master) { log_skip(log_path, step + 1, total, loss, grad_norm, nonfinite, o->max_nonfinite); }
            if (nonfinite >= o->max_nonfinite) {
                char newest[4200];
                describe_newest(newest, sizeof(newest), o->out_dir);
                int any = checkpoint_newest(o->out_dir, CKPT_COMPLETE, INT_MAX) >= 0;
                fatal("steps %d to %d: the loss or gradient norm was not finite %d times in a row (--max-nonfinite "
                      "%d), stopping; %s%s", step + 2 - nonfinite, step + 1, nonfinite, o->max_nonfinite, newest,
                      any ? " (to continue from it: --resume 1, perhaps with a lower --lr)" : "");
            }
            continue;
        }
        nonfinite = 0;
        StepLog entry;
        entry.step = step + 1;
        entry.loss = loss;
        entry.ce = model.ce;
        entry.l1 = step_lambda * model.l1_term;
        entry.lambda = step_lambda;
        entry.show_lambda = o->l1_ramp > 0;
        entry.lr = step_lr;
        entry.grad_norm = grad_norm;
        entry.tok_per_s = o->total_batch / (ms / 1000);
        entry.ms = ms;
        entry.mfu = entry.mem_gib = -1;
        if (device == DEVICE_CUDA) {
            size_t free_bytes, total_bytes;
            cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
            peak_mem_gib = fmax(peak_mem_gib, (total_bytes - free_bytes) / 1073741824.0);
            entry.mfu = flops_per_step / (ms / 1000) / peak_flops;
            entry.mem_gib = peak_mem_gib;
        }
        // the steps left at the mean step time, the validation batches left at the last validation's time per batch
        // (before one ran: a forward is about a third of a training micro-batch; the last validation is one of
        // them), and the evaluations left at the last one's time
        double mean_step = timed_steps ? step_seconds / timed_steps : ms / 1000;
        double forward = mean_step / o->grad_accum / 3;
        int vals_left = due_left(o->val_every, step, total);
        double batch_time = val_batch_seconds >= 0 ? val_batch_seconds : forward;
        entry.eta_s = (total - step - 1) * mean_step + ((vals_left - 1.0) * val_batches + final_val_batches) * batch_time;
        if (o->eval_file) {
            double rows = ceil((double)eval_examples / P) * eval_set.num_endings;
            double eval_time = eval_seconds >= 0 ? eval_seconds : ceil(rows / B) * forward;
            entry.eta_s += due_left(o->eval_every, step, total) * eval_time;
        }
        entry.num_layers = L;
        entry.hidden = config->hidden;
        entry.layers = model.stats;
        if (master) { log_step(log_path, &entry, total); }
    }

    if (zero) { cudaCheck(cudaStreamSynchronize(zero->stream)); } // the last all-gather, before anything is freed
    if (sampling) {
        infer_state_free(&sampler.state, &sampler.model);
        free(sampler.scratch);
        gpt_free(&sampler.model);
        tokenizer_free(&sampler.tokenizer);
    }
    if (device != DEVICE_CPU) {
        free(host_m);
        free(host_v);
    }
    uploader_free(&uploader);
    free(ffn_state);
    free(host_params);
    optimizer_free(&opt);
    gpt_free(&model);
    dataloader_free(&train_loader);
    dataloader_free(&val_loader);
    if (o->eval_file) { evalset_free(&eval_set); }
    stop_vote_free(&vote);
    if (zero) { zero_free(zero); }
    watchdog_stop(&watchdog);
    return stopping;
}

int main(int argc, char** argv) {
    omp_wait_passively(argv);
    // ------------------------------------------------------------------------
    // flags
    const char* train_pattern = "data/corpus_train_*.bin";
    const char* val_pattern = "data/corpus_val_*.bin";
    const char* out_dir = "out";
    const char* preset_name = "default";
    const char* tokenizer_path = TOKENIZER_DEFAULT_PATH;
    const char* eval_file = NULL;
    int eval_every = 0, eval_examples = 0;
    const char* device_name = "auto";
    const char* ffn_name = "auto";
    int dead_reinit = 0, untied_head = 0, l1_ramp = L1_RAMP_WHOLE_RUN;
    const char* activation_name = NULL;
    const char* init_from = NULL;
    float synthetic_k = 0, hot_rate = -1;
    int B = 8, T = 256, total_batch = -1, max_steps = 2000, warmup = 100;
    int val_every = 100, val_batches = 20, final_val_batches = 0, sample_every = 500, sample_tokens = 64, ckpt_every = 500;
    int resume_step = -1;
    const char* lr_schedule = "keep";
    const char* inject_nan = NULL;
    const char* init_method = "auto";
    const char* init_address = "";
    const char* init_file = "";
    int num_processes = 0, process_rank = -1, timeout = 300;
    int overwrite = 0, max_nonfinite = 5;
    int resume = 0, seed = 1337, recompute = 0, vocab = 50257, layers = 0, dim = 0, heads = 0, kv_heads = 0, hidden = 0;
    float lr = 1e-3f, final_lr_frac = 0.1f, weight_decay = 0.1f, grad_clip = 1.0f, lambda = 2e-2f;
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
        {0, "activation", ARG_STRING, &activation_name, 0, 0, "FFN gate activation: relu (sparse, L1) or silu (dense, lambda 0) (default: --init-from's, else relu)", 0},
        {0, "untied-head", ARG_INT, &untied_head, 0, 1, "1 = an output head of its own, not the embedding (default: --init-from's, else 0)", 0},
        {0, "init-from", ARG_STRING, &init_from, 0, 0, "start from this model file's weights and shape (e.g. hf_convert's model.bin), with a fresh optimizer at step 0", 0},
        {'b', "batch", ARG_INT, &B, 1, 1 << 16, "micro-batch size in sequences", 0},
        {'t', "seq-len", ARG_INT, &T, 2, 1 << 20, "sequence length (also the model's max_seq_len)", 0},
        {'d', "total-batch", ARG_INT, &total_batch, -1, 1 << 30, "tokens per optimizer step (-1 = one micro-batch)", 0},
        {'x', "max-steps", ARG_INT, &max_steps, 1, 1 << 30, "optimizer steps (on the CPU, if not given: a short first run of " STR(CPU_SHORT_STEPS) ")", 0},
        {'l', "lr", ARG_FLOAT, &lr, 0, 10, "peak learning rate", 0},
        {'u', "warmup", ARG_INT, &warmup, 0, 1 << 30, "warmup steps", 0},
        {'q', "final-lr-frac", ARG_FLOAT, &final_lr_frac, 0, 1, "cosine floor as a fraction of the peak lr", 0},
        {'c', "weight-decay", ARG_FLOAT, &weight_decay, 0, 10, "AdamW weight decay on matrices", 0},
        {0, "beta1", ARG_FLOAT, &beta1, 0, 0.999999, "AdamW beta1", 0},
        {0, "beta2", ARG_FLOAT, &beta2, 0, 0.999999, "AdamW beta2", 0},
        {0, "adam-eps", ARG_FLOAT, &adam_eps, 0, 1, "AdamW epsilon", 0},
        {0, "grad-clip", ARG_FLOAT, &grad_clip, 0, 1e9, "max global gradient norm (0 = off)", 0},
        {'a', "l1", ARG_FLOAT, &lambda, 0, 1e3, "L1 coefficient lambda on the FFN activations (default: the model's: 2e-2 for default, 2e-5 for the other shapes and --init-from, 0 with --activation silu)", 0},
        {0, "l1-ramp", ARG_INT, &l1_ramp, -1, 1 << 30, "R: lambda grows linearly from -a / R at step 1 to -a at step R (0 = full from the start, -1 = over the whole run; default: -1 for the default model, else 0)", 0},
        {'v', "val-every", ARG_INT, &val_every, 0, 1 << 30, "steps between validations (0 = only at the end)", 0},
        {'m', "val-batches", ARG_INT, &val_batches, 1, 1 << 30, "micro-batches per validation, but the last", 0},
        {0, "final-val-batches", ARG_INT, &final_val_batches, 0, 1 << 30, "micro-batches of the last validation (0 = the whole val set)", 0},
        {0, "eval-file", ARG_STRING, &eval_file, 0, 0, "multiple-choice eval file (dev/data/hellaswag.sh writes HellaSwag's) to score during the run", 0},
        {0, "eval-every", ARG_INT, &eval_every, 0, 1 << 30, "steps between evaluations on --eval-file (also at step 0 and the end; 0 = only at the end; default: --val-every's)", 0},
        {0, "eval-examples", ARG_INT, &eval_examples, 0, EVALSET_MAX_EXAMPLES, "examples of --eval-file per evaluation, its first (0 = all)", 0},
        {'s', "sample-every", ARG_INT, &sample_every, 0, 1 << 30, "steps between text samples (0 = never)", 0},
        {'g', "sample-tokens", ARG_INT, &sample_tokens, 1, 1 << 20, "tokens per text sample", 0},
        {'n', "ckpt-every", ARG_INT, &ckpt_every, -1, 1 << 30, "steps between checkpoints (0 = only at the end, -1 = never)", 0},
        {'y', "resume", ARG_INT, &resume, 0, 1, "1 = continue from the newest checkpoint in the output dir", 0},
        {0, "resume-step", ARG_INT, &resume_step, -1, 1 << 30, "continue from the checkpoint of this step, not the newest, deleting the later checkpoints' files (-1 = with --resume 1, the newest)", 0},
        {0, "lr-schedule", ARG_STRING, &lr_schedule, 0, 0, "on resume with another -x, -u, -l or -q: keep (the checkpoint's schedule) or new (this run's)", 0},
        {0, "overwrite", ARG_INT, &overwrite, 0, 1, "1 = delete the checkpoints and log of another run in the output dir and start over", 0},
        {0, "max-nonfinite", ARG_INT, &max_nonfinite, 1, 1 << 30, "steps in a row skipped for a NaN/inf loss or gradient norm before the run stops", 0},
        {0, "inject-nan", ARG_STRING, &inject_nan, 0, 0, "tests: gradient:STEP or moment:STEP puts a NaN there at that step", 0},
        {'r', "seed", ARG_INT, &seed, 0, 2147483647, "seed of the init, the data order and the samples", 0},
        {0, "tokenizer", ARG_STRING, &tokenizer_path, 0, 0, "GPT-2 rank file, for the text samples", 0},
        {0, "device", ARG_STRING, &device_name, 0, 0, "auto, cpu or cuda", 0},
        {0, "recompute", ARG_INT, &recompute, 0, 1, "1 = recompute the FFN activations in the backward (less memory)", 0},
        {0, "ffn", ARG_STRING, &ffn_name, 0, 0, "FFN path: auto (each layer dense, sparse or split with hot units, whichever its measured costs say is fastest), dense or sparse", 0},
        {0, "hot-rate", ARG_FLOAT, &hot_rate, -1, 1, "sparse layers run their busiest units as dense products: -1 = as many as the costs measured on the GPU say (none on the CPU), 0 = none, R = those firing for more than R of the tokens", 0},
        {0, "dead-reinit", ARG_INT, &dead_reinit, 0, 1, "1 = move gate rows that fired for no token of a step a tenth toward new noise", 0},
        {0, "synthetic-sparse", ARG_FLOAT, &synthetic_k, 0, 1e6, "benchmarks: init with about this many units firing per token (needs -n -1)", 0},
        {0, "init", ARG_STRING, &init_method, 0, 0, "how data-parallel processes meet: auto, mpi, tcp or file", 0},
        {0, "init-address", ARG_STRING, &init_address, 0, 0, "host:port of rank 0, for --init tcp", 0},
        {0, "init-file", ARG_STRING, &init_file, 0, 0, "a path all processes see, for --init file", 0},
        {0, "num-processes", ARG_INT, &num_processes, 1, 1 << 20, "processes of the run (default: from the launcher)", 0},
        {0, "process-rank", ARG_INT, &process_rank, 0, (1 << 20) - 1, "this process's rank (with --num-processes)", 0},
        {0, "timeout", ARG_INT, &timeout, 1, 1 << 20, "seconds a step may wait for the other processes", 0},
    };
    int num_specs = (int)(sizeof(specs) / sizeof(specs[0]));
    setvbuf(stdout, NULL, _IOLBF, 0); // keep the log in order with errors on stderr
    cli_parse(argc, argv, "usage: ./train_gpt_sparse [flags]\n"
              "Trains a sparse ReLU language model; with no flags, the default model on data/.", specs, num_specs);
    // the default data is found from the working directory or from the binary's
    if (!cli_given(specs, num_specs, "train-data")) { train_pattern = default_input(train_pattern, "-i"); }
    if (!cli_given(specs, num_specs, "val-data")) { val_pattern = default_input(val_pattern, "-j"); }
    if (!cli_given(specs, num_specs, "tokenizer") && sample_every > 0) {
        tokenizer_path = default_input(tokenizer_path, "--tokenizer (or -s 0)");
    }

    const ModelPreset* preset = find_preset(preset_name);
    if (preset == NULL) { fatal("unknown model '%s' (default, 124m, 0.5b, 1b, 1.5b, 2b)", preset_name); }
    Options o;
    o.train_pattern = train_pattern;
    o.val_pattern = val_pattern;
    o.out_dir = out_dir;
    o.tokenizer_path = tokenizer_path;
    o.eval_file = eval_file;
    o.eval_examples = eval_examples;
    if (!eval_file) {
        const char* needs[] = {"eval-every", "eval-examples"};
        for (int i = 0; i < 2; i++) {
            if (cli_given(specs, num_specs, needs[i])) { fatal("--%s needs --eval-file (the examples to score)", needs[i]); }
        }
    }
    GPTConfig* c = &o.config;
    if (init_from) {
        // the shape is the checkpoint's; the run sets max_seq_len (RoPE has no length) and may set the activation
        const char* shape_flags[] = {"model", "layers", "dim", "heads", "kv-heads", "hidden", "vocab", "rope-theta",
                                     "norm-eps", "untied-head"};
        for (size_t i = 0; i < sizeof(shape_flags) / sizeof(shape_flags[0]); i++) {
            if (cli_given(specs, num_specs, shape_flags[i])) {
                fatal("--init-from takes the model's shape from %s: drop --%s", init_from, shape_flags[i]);
            }
        }
        *c = checkpoint_read_config(init_from, NULL);
    } else {
        c->vocab_size = vocab;
        c->padded_vocab_size = round_up(vocab, 128);
        c->num_layers = layers ? layers : preset->layers;
        c->channels = dim ? dim : preset->dim;
        c->num_heads = heads ? heads : preset->heads;
        c->num_kv_heads = kv_heads ? kv_heads : c->num_heads;
        c->hidden = hidden ? hidden : preset->hidden;
        c->rope_theta = rope_theta;
        c->norm_eps = norm_eps;
        c->activation = ACT_RELU;
        c->untied_head = untied_head;
    }
    c->max_seq_len = T;
    // lambda and its ramp: the model shape's unless given (--init-from: the paper's lambda, no ramp)
    if (!cli_given(specs, num_specs, "l1")) { lambda = init_from ? LAMBDA_PAPER : preset->lambda; }
    if (!cli_given(specs, num_specs, "l1-ramp")) { l1_ramp = init_from || lambda == 0 ? 0 : preset->l1_ramp; }
    if (activation_name) {
        c->activation = find_activation(activation_name);
        if (c->activation < 0) { fatal("--activation must be relu or silu, not '%s'", activation_name); }
    }
    config_validate(c);
    // SiLU never zeroes a unit: its FFN is dense and the L1 term has nothing to make sparse
    if (c->activation == ACT_SILU) {
        if (!cli_given(specs, num_specs, "l1")) { lambda = 0, l1_ramp = 0; }
        if (lambda > 0 || l1_ramp != 0) {
            fatal("the L1 term needs ReLU: a SiLU model (--activation silu%s) trains with -a 0 and no --l1-ramp",
                  activation_name ? "" : ", from --init-from");
        }
        if (strcmp(ffn_name, "sparse") == 0) { fatal("--ffn sparse needs ReLU: a SiLU model trains dense"); }
        if (dead_reinit) { fatal("--dead-reinit 1 needs ReLU: a SiLU unit is never dead"); }
    }
    if (l1_ramp != 0 && lambda == 0) { fatal("--l1-ramp %d ramps lambda up to -a, which is 0", l1_ramp); }
    o.optim = (OptimConfig){lr, beta1, beta2, adam_eps, weight_decay, grad_clip, warmup, max_steps, final_lr_frac};
    o.B = B;
    o.T = T;
    o.proc = process_info(process_rank, num_processes ? num_processes : -1);
    int P = o.proc.size;
    if ((long)B * T * P > INT32_MAX) { fatal("batch x seq-len x %d processes is more than 2^31 tokens", P); }
    o.total_batch = total_batch == -1 ? B * T * P : total_batch;
    if (o.total_batch % (B * T * P) != 0) {
        fatal("--total-batch %d is not a multiple of batch x seq-len x processes = %d x %d x %d", o.total_batch, B, T, P);
    }
    o.grad_accum = o.total_batch / (B * T * P);
    o.init_method = init_method;
    o.init_address = init_address;
    o.init_file = init_file;
    o.timeout = timeout;
    o.val_every = val_every;
    o.val_batches = val_batches;
    o.final_val_batches = final_val_batches;
    o.sample_every = sample_every;
    o.sample_tokens = sample_tokens;
    o.ckpt_every = ckpt_every;
    o.resume = resume || resume_step >= 0;
    o.resume_step = resume_step;
    if (strcmp(lr_schedule, "keep") != 0 && strcmp(lr_schedule, "new") != 0) {
        fatal("--lr-schedule must be keep or new, not '%s'", lr_schedule);
    }
    o.keep_schedule = strcmp(lr_schedule, "keep") == 0;
    o.overwrite = overwrite;
    o.max_nonfinite = max_nonfinite;
    o.inject_nan = 0;
    o.inject_nan_moment = 0;
    if (inject_nan) {
        char where[16];
        int at, end = 0;
        if (sscanf(inject_nan, "%15[a-z]:%d%n", where, &at, &end) != 2 || inject_nan[end] != '\0' || at < 1 ||
            (strcmp(where, "gradient") != 0 && strcmp(where, "moment") != 0)) {
            fatal("--inject-nan %s: expected gradient:STEP or moment:STEP with STEP >= 1", inject_nan);
        }
        o.inject_nan = at;
        o.inject_nan_moment = strcmp(where, "moment") == 0;
    }
    if (o.resume && overwrite) {
        fatal("--resume 1 continues the run in the output dir, --overwrite 1 deletes it: give one");
    }
    o.seed = seed;
    o.lambda = lambda;
    o.l1_ramp = l1_ramp;
    o.init_from = init_from;
    o.recompute = recompute;
    if (strcmp(ffn_name, "auto") != 0 && strcmp(ffn_name, "dense") != 0 && strcmp(ffn_name, "sparse") != 0) {
        fatal("--ffn must be auto, dense or sparse, not '%s'", ffn_name);
    }
    // without the L1 term nothing makes the gates sparse: auto is dense
    o.ffn_mode = strcmp(ffn_name, "sparse") == 0 ? FFN_SPARSE : strcmp(ffn_name, "dense") == 0 || lambda == 0 ? FFN_DENSE : FFN_AUTO;
    o.dead_reinit = dead_reinit;
    o.synthetic_k = synthetic_k;
    o.hot_rate = hot_rate;
    if (synthetic_k >= c->hidden) { fatal("--synthetic-sparse %g must be below the FFN width %d", synthetic_k, c->hidden); }
    if (synthetic_k > 0 && init_from) { fatal("--synthetic-sparse and --init-from are two inits: give one"); }
    if (synthetic_k > 0 && (ckpt_every != -1 || o.resume)) {
        fatal("--synthetic-sparse makes a benchmark-only model: give -n -1 (no checkpoints) and no --resume");
    }
    if (dead_reinit && P > 1) { fatal("--dead-reinit 1 needs one process (the master weights are sharded over %d)", P); }

    if (strcmp(device_name, "auto") != 0 && strcmp(device_name, "cpu") != 0 && strcmp(device_name, "cuda") != 0) {
        fatal("--device must be auto, cpu or cuda, not '%s'", device_name);
    }
    int gpus = cuda_device_count();
    if (strcmp(device_name, "cuda") == 0 && gpus == 0) { fatal("--device cuda, but no CUDA GPU is present"); }
    if (P > 1 && (gpus == 0 || strcmp(device_name, "cpu") == 0)) {
        fatal("%d processes (from %s): data parallelism needs a CUDA GPU per process", P, o.proc.launcher);
    }
    int on_gpu = gpus > 0 && strcmp(device_name, "cpu") != 0;
    // the default run takes hours on a CPU: unless -x is given, a short first run of the same model
    int cpu_short = !on_gpu && !cli_given(specs, num_specs, "max-steps");
    if (cpu_short) {
        o.optim.total_steps = CPU_SHORT_STEPS;
        if (!cli_given(specs, num_specs, "warmup")) { o.optim.warmup_steps = CPU_SHORT_STEPS / 10; }
        if (!cli_given(specs, num_specs, "val-every")) { o.val_every = CPU_SHORT_STEPS / 3; }
        if (!cli_given(specs, num_specs, "val-batches")) { o.val_batches = 4; }
    }
    if (o.l1_ramp == L1_RAMP_WHOLE_RUN) { o.l1_ramp = o.optim.total_steps; }
    o.eval_every = cli_given(specs, num_specs, "eval-every") ? eval_every : o.val_every;
    int stopped;
    if (on_gpu) {
        int gpu = o.proc.local_rank >= 0 ? o.proc.local_rank : o.proc.rank % gpus;
        if (gpu >= gpus) { fatal("rank %d wants GPU %d of this machine, which has %d", o.proc.rank, gpu, gpus); }
        cudaCheck(cudaSetDevice(gpu));
        cudaDeviceProp prop;
        cudaCheck(cudaGetDeviceProperties(&prop, gpu));
        if (o.proc.rank == 0) {
            if (P > 1) { printf("processes: %d (from %s), one GPU each\n", P, o.proc.launcher); }
            printf("device: %s, bf16 with fp32 master weights\n", prop.name);
        }
        stopped = train<bf16>(&o, DEVICE_CUDA);
        cublaslt_free();
    } else {
        printf("device: CPU reference path, fp32, %d OpenMP threads%s\n", omp_get_max_threads(),
               gpus ? "" : " (no CUDA GPU present)");
        if (cpu_short) {
            char last_val[64] = "the whole val set";
            if (final_val_batches > 0) { snprintf(last_val, sizeof(last_val), "%d batches", final_val_batches); }
            printf("a short first run on the CPU: %d steps with %d of warmup (10 to 15 minutes on 2 cores), validating "
                   "every %d on %d batches and at the end on %s; the full run is -x %d (hours on a CPU, a minute on a "
                   "GPU)\n", o.optim.total_steps, o.optim.warmup_steps, o.val_every, o.val_batches, last_val, max_steps);
        }
        stopped = train<float>(&o, DEVICE_CPU);
    }
    if (stopped) {
        // stopped by a signal: end by it, so that a shell or scheduler sees what happened; stopped because another
        // process was: an error
        if (stop_signal) {
            signal(stop_signal, SIG_DFL);
            raise(stop_signal);
        }
        return EXIT_FAILURE;
    }
    return 0;
}
