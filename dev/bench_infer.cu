/*
 bench_infer: prefill tokens/ms and decode tokens/s of the dense and the TwELL
 GPU paths of inference (llmc/inference.h) in one run, three rounds of each in
 turn, medians (the card's clock drops as it heats, so the paths are timed side
 by side), and energy per token from NVML when the driver has it; then the
 parts of one decode step. The model is a checkpoint (-m), or a random model of
 a preset shape (--preset), by default with the synthetic-sparse gates of
 llmc/synthetic.h (about --sparse-k units fire per token; benchmark only). The
 prompts are random token ids; by default a calibration prefill of them picks
 each layer's hot units first (--hot). With --write-model DIR it writes the
 calibrated --preset model as a checkpoint there instead of timing it: a model
 with a sparse pattern of the paper's shape for the server's load benchmark
 (dev/bench_serve.sh), random weights otherwise.

 The decode step's bytes model: what a step must read at least, by part (the
 attention's and the head's weights; the FFN's: all three matrices dense, or
 the gate (bf16, or its int8 copy where the screen runs) and the rows of W_u
 and W_d^T of the units that fired: W_u once per step for the units any row
 fired up to 3 rows (the fused gate + up), W_d^T once per row and unit it
 fired; the K and V of every position the step attends to), beside the
 fraction of the GPU's bandwidth the step reaches, that bandwidth measured
 in the same run by a streaming read of 2 GiB. The fired counts come from an
 extra pass of counted steps. The model counts W_u's rows as W_d^T's (per row
 and unit): up to 3 rows that overstates what up reads by the rows' overlap.

   build/dev/bench_infer --preset 1.5b --batch 1 --length 128 -n 128
   build/dev/bench_infer -m out --batch 8 --length 512 -n 64
   build/dev/bench_infer --preset 1.5b --sparse-skew 1 --write-model out_1.5b_synthetic
*/
#include <cuda_runtime.h>
#include "llmc/checkpoint.h"
#include "llmc/cli.h"
#include "llmc/inference.h"
#include "llmc/nvml.h"
#include "llmc/synthetic.h"
#include "test/gpu/gpu_util.cuh"

typedef struct {
    const char *model_path, *preset_name, *write_model;
    int batch, length, steps, cache, seed, graph, twell_min_rows, hot, sparse_skew;
    float sparse_k;
    char gpu_name[256];
    char model_file[4096]; // the newest model file of the directory -m names (or out/)
} BenchOptions;

// ----------------------------------------------------------------------------
// the timing

typedef struct {
    double prefill_ms, decode_s, prefill_j, decode_j, active;
} BenchResult;

// one path: a prefill of the B prompts (after two that size TwELL's buffers and pick its paths), repeated for
// about half a second, then steps decode steps; times, joules where NVML has them, TwELL's active units
static BenchResult bench_path(GPT<bf16, float>* model, InferState<bf16>* s, int ffn_mode, const int* tokens,
                              const int* lens, int B, int T, int steps, const Nvml* nvml, int have_nvml) {
    BenchResult r = {0, 0, -1, -1, -1};
    model->ffn.mode = ffn_mode;
    for (int i = 0; i < 2; i++) { gpt_prefill(model, s, tokens, lens, B, NULL); } // TwELL sizes its buffers and picks paths
    double t0 = now_seconds();
    gpt_prefill(model, s, tokens, lens, B, NULL);
    double once = now_seconds() - t0;
    int reps = (int)ceil(0.5 / once);
    reps = reps < 3 ? 3 : reps > 100 ? 100 : reps;
    double e0 = have_nvml ? nvml_energy_joules(nvml) : 0;
    t0 = now_seconds();
    for (int i = 0; i < reps; i++) { gpt_prefill(model, s, tokens, lens, B, NULL); }
    r.prefill_ms = (now_seconds() - t0) * 1e3 / reps;
    if (have_nvml) { r.prefill_j = (nvml_energy_joules(nvml) - e0) / reps; }
    if (ffn_mode == FFN_SPARSE) {
        twell_prefill_settle(&s->ffn.twell);
        double sum = 0;
        for (int l = 0; l < model->config.num_layers; l++) { sum += s->ffn.twell.layer_active[l]; }
        r.active = sum / model->config.num_layers;
    }
    int* next = (int*)mallocCheck(B * sizeof(int));
    int* pos = (int*)mallocCheck(B * sizeof(int));
    for (int b = 0; b < B; b++) { next[b] = tokens[b * T + T - 1]; pos[b] = T; }
    gpt_decode(model, s, next, pos, B, NULL); // the graph is made here
    e0 = have_nvml ? nvml_energy_joules(nvml) : 0;
    t0 = now_seconds();
    for (int i = 0; i < steps; i++) { // the model's step: the logits stay on the GPU (no copy, no sampling)
        for (int b = 0; b < B; b++) { pos[b] = T + i; next[b] = (int)((tokens[b * T + i % T] + i) % model->config.vocab_size); }
        gpt_decode(model, s, next, pos, B, NULL);
    }
    r.decode_s = now_seconds() - t0;
    if (have_nvml) { r.decode_j = nvml_energy_joules(nvml) - e0; }
    free(pos);
    free(next);
    return r;
}

static double median3(double a, double b, double c) { return fmax(fmin(a, b), fmin(fmax(a, b), c)); }

// each field's median over three runs
static BenchResult bench_median(const BenchResult (&r)[3]) {
    BenchResult m;
    m.prefill_ms = median3(r[0].prefill_ms, r[1].prefill_ms, r[2].prefill_ms);
    m.decode_s = median3(r[0].decode_s, r[1].decode_s, r[2].decode_s);
    m.prefill_j = median3(r[0].prefill_j, r[1].prefill_j, r[2].prefill_j);
    m.decode_j = median3(r[0].decode_j, r[1].decode_j, r[2].decode_j);
    m.active = median3(r[0].active, r[1].active, r[2].active);
    return m;
}

// the median time of fn over 20 runs on the model's stream, in microseconds
static double time_us(const std::function<void()>& fn) { return 1e3 * median_ms(fn); }

// the parts of one decode step of B sequences (layer 0, the cache as the last step left it)
static void bench_decode_parts(GPT<bf16, float>* model, InferState<bf16>* m, int B) {
    const GPTConfig* c = &model->config;
    int D = c->channels, H = c->hidden, QKV = qkv_dim(c);
    bf16* const* param = model->param;
    double qkv = time_us([&] { decode_linear(m->qkv, m->normed, param[P_WQKV], B, QKV, D); });
    double att = time_us([&] {
        attention_decode(m->att, m->dev.part_o, m->dev.part_ml, m->dev.splits_done, m->qkv, m->k_cache, m->v_cache,
                         m->row_slot, m->row_pos, B, c->num_heads, c->num_kv_heads, head_size(c), m->cache_len,
                         m->cache_len, c->rope_theta);
    });
    double gate = time_us([&] { decode_linear(m->gu, m->normed, param[P_WG], B, H, D); });
    double gate_cublas = time_us([&] { gemm(m->gu, m->normed, param[P_WG], B, H, D, 0, 1, 0); });
    double down = time_us([&] { gemm(m->proj, m->gu, param[P_WDT], B, D, H, 0, 0, 0); });
    double logits = time_us([&] { decode_linear(m->logits, m->normed, param[P_WTE], B, c->padded_vocab_size, D); });
    printf("decode parts at batch %d (us, one layer): qkv %.1f, attention %.1f, gate (or up) %.1f (cuBLASLt: %.1f), "
           "dense down %.1f; logits %.1f; weights %.1f MB per layer dense\n", B, qkv, att, gate, gate_cublas, down,
           logits, (double)(QKV + D + 3 * H) * D * 2 / 1e6);
}

// ----------------------------------------------------------------------------
// the bytes model

// the bytes one decode step of B rows must read, by part (per step, all layers)
typedef struct {
    double attention, ffn, head, kv;
} StepBytes;

static double step_total(const StepBytes* b) { return b->attention + b->ffn + b->head + b->kv; }

// rows: units whose W_u and W_d^T rows a step reads per layer (the dense path: H); gate_bytes: what its gate
// reads per layer; context: the positions a row attends to (mean over the steps)
static StepBytes step_bytes(const GPTConfig* c, int B, double context, double gate_bytes, double rows) {
    const double D = c->channels, L = c->num_layers, QKV = qkv_dim(c), KVD = kv_dim(c);
    StepBytes b;
    b.attention = L * (QKV + D) * D * 2;
    b.ffn = L * (gate_bytes + 2 * rows * D * 2);
    b.head = (double)c->padded_vocab_size * D * 2;
    b.kv = L * B * context * KVD * 2 * 2;
    return b;
}

// the units a step's rows fire per layer, summed over the rows and as their union (each row of W_u and W_d^T
// the step must read once)
typedef struct {
    double pairs, units;
} StepFired;

// the bytes model of both paths beside their measured step times
static void report_bytes(GPT<bf16, float>* model, InferState<bf16>* s, int B, int T, int steps, double dense_s,
                         double twell_s, StepFired fired) {
    const GPTConfig* c = &model->config;
    const double D = c->channels, H = c->hidden, context = T + (steps + 1) / 2.0, bw = measure_read_bandwidth();
    const int screened = ffn_policy_decode_screened(B) && screened_gate_fits(B, c->channels);
    const double screen_bytes = H * D + H * ceil_div(c->channels, SCREEN_GROUP) * 4 + H * 4;
    StepBytes dense = step_bytes(c, B, context, H * D * 2, H);
    StepBytes twell = step_bytes(c, B, context, screened ? screen_bytes : H * D * 2, fired.units);
    printf("bytes model per decode step (batch %d, mean context %.0f; the GPU reads %.2f TB/s, measured here):\n", B,
           context, bw / 1e12);
    const StepBytes* bs[2] = {&dense, &twell};
    const double secs[2] = {dense_s / steps, twell_s / steps};
    const char* names[2] = {"dense", "twell"};
    for (int i = 0; i < 2; i++) {
        const StepBytes* b = bs[i];
        double total = step_total(b);
        printf("  %-5s %8.1f MB: attention weights %.1f, FFN %.1f, head %.1f, K and V %.1f | %7.1f us a step = "
               "%.2f TB/s, %.0f%% of the bandwidth\n", names[i], total / 1e6, b->attention / 1e6, b->ffn / 1e6,
               b->head / 1e6, b->kv / 1e6, secs[i] * 1e6, total / secs[i] / 1e12, 100 * total / secs[i] / bw);
    }
    printf("  twell's FFN per layer: the gate %s, then the rows of the %.1f units the step's rows fire (%.1f per row, "
           "%.1f summed over the rows)\n", screened ? "from its int8 copy" : "in bf16", fired.units, fired.pairs / B,
           fired.pairs);
    // the most the sparse step can gain where both paths read at the same share of the bandwidth
    printf("  at equal shares of the bandwidth twell / dense would be %.2fx (the bytes' ratio); measured %.2fx\n",
           step_total(&dense) / step_total(&twell), dense_s / twell_s);
}

// the fired units per layer and step of the sparse path, from `steps` counted decode steps (the counting is
// not part of the timed steps)
static StepFired decode_fired(GPT<bf16, float>* model, InferState<bf16>* s, const int* tokens, int B, int T, int steps) {
    const int L = model->config.num_layers;
    model->ffn.mode = FFN_SPARSE;
    infer_state_count_fired(s, model, 1);
    cuda_graph_free(&s->dev.graphs[B - 1]); // captured again with the counters
    std::vector<int> next(B), pos(B);
    for (int i = 0; i < steps; i++) {
        for (int b = 0; b < B; b++) { pos[b] = T + i; next[b] = (int)((tokens[b * T + i % T] + i) % model->config.vocab_size); }
        gpt_decode(model, s, next.data(), pos.data(), B, NULL);
    }
    std::vector<uint64_t> pairs(L, 0), units(L, 0);
    gpt_fired_read(model, s, pairs.data(), units.data());
    StepFired f = {0.0, 0.0};
    for (int l = 0; l < L; l++) { f.pairs += (double)pairs[l] / ((double)L * steps); f.units += (double)units[l] / ((double)L * steps); }
    return f;
}

// the model's weights as a checkpoint, step 0, in the directory dir
static void write_model(const GPT<bf16, float>* model, const char* dir) {
    size_t n = model->num_parameters;
    bf16* weights = (bf16*)mallocCheck(n * sizeof(bf16));
    float* params = (float*)mallocCheck(n * sizeof(float));
    cudaCheck(cudaMemcpy(weights, model->params, n * sizeof(bf16), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) { params[i] = __bfloat162float(weights[i]); }
    char path[4096];
    make_dir(dir);
    model_path(path, sizeof(path), dir, 0);
    checkpoint_save_model(path, &model->config, params, 0);
    printf("bench_infer: wrote the calibrated synthetic-sparse model to %s (benchmarks only: random weights)\n", path);
    free(params);
    free(weights);
}

// both paths on B random prompts of T tokens (and the synthetic gates' calibration, the hot units), the report;
// or, with write_to, the calibrated model written there instead
static void bench(GPT<bf16, float>* model, InferState<bf16>* s, int B, int T, int steps, double synthetic_k,
                  int skewed, int hot, const char* what, uint64_t seed, const char* write_to) {
    const GPTConfig* c = &model->config;
    int* tokens = (int*)mallocCheck((size_t)B * T * sizeof(int));
    int* lens = (int*)mallocCheck(B * sizeof(int));
    uint64_t rng = seed;
    for (int i = 0; i < B * T; i++) { tokens[i] = (int)rng_below(&rng, c->vocab_size); }
    for (int b = 0; b < B; b++) { lens[b] = T; }
    if (synthetic_k > 0) { synthetic_calibrate(model, s, tokens, lens, B, synthetic_k, skewed, seed ^ 0x5eedull); }
    if (write_to) {
        write_model(model, write_to);
        free(lens);
        free(tokens);
        return;
    }
    // the TwELL prefill's hot units, from a calibration prefill of the same prompts (when TwELL runs at this size)
    model->ffn.mode = FFN_SPARSE;
    if (hot) { infer_hot_calibrate(model, s, tokens, lens, B, 1); }
    char bus[32];
    int device = 0;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetPCIBusId(bus, sizeof(bus), device));
    Nvml nvml;
    int have_nvml = nvml_open(&nvml, bus);
    // three rounds of dense then TwELL, the median of each field: the GPU's clock
    // drops as it heats, so the paths are timed side by side, not one after the other
    BenchResult runs[2][3];
    for (int round = 0; round < 3; round++) {
        runs[0][round] = bench_path(model, s, FFN_DENSE, tokens, lens, B, T, steps, &nvml, have_nvml);
        runs[1][round] = bench_path(model, s, FFN_SPARSE, tokens, lens, B, T, steps, &nvml, have_nvml);
    }
    BenchResult dense = bench_median(runs[0]), twell = bench_median(runs[1]);
    printf("bench: %s, batch %d x %d prompt tokens, %d decode steps%s\n", what, B, T, steps,
           twell_prefill_supports(c->channels) ? "" : " (TwELL prefill unsupported for this shape: dense)");
    double hot_units = 0;
    for (int l = 0; l < c->num_layers; l++) { hot_units += model->ffn.layer[l].hot_units; }
    hot_units /= c->num_layers;
    if (twell.active >= 0 && hot_units > 0) { // TwELL counts the cold tail only: the hot units run dense
        printf("TwELL: %.1f active FFN units per token in the cold tail, %.0f hot units a layer run dense (means over "
               "layers, of H = %d)\n", twell.active, hot_units, c->hidden);
    } else if (twell.active >= 0) {
        printf("TwELL: %.1f active FFN units per token (mean over layers, of H = %d)\n", twell.active, c->hidden);
    } else {
        printf("TwELL: the prefill of %d tokens ran the dense FFN (--twell-min-rows %d)\n", B * T, s->ffn.twell.min_rows);
    }
    printf("%-6s %14s %14s %16s %16s\n", "ffn", "prefill tok/ms", "decode tok/s", "prefill mJ/tok", "decode mJ/tok");
    const BenchResult* rs[2] = {&dense, &twell};
    const char* names[2] = {"dense", "twell"};
    for (int i = 0; i < 2; i++) {
        const BenchResult* r = rs[i];
        printf("%-6s %14.2f %14.1f", names[i], B * T / r->prefill_ms, (double)B * steps / r->decode_s);
        // the counter moves in steps of some ms: a run too short to move it has no figure
        if (have_nvml && r->prefill_j > 0) { printf(" %16.3f", r->prefill_j * 1e3 / (B * T)); } else { printf(" %16s", "n/a"); }
        if (have_nvml && r->decode_j > 0) { printf(" %16.3f\n", r->decode_j * 1e3 / ((double)B * steps)); } else { printf(" %16s\n", "n/a"); }
    }
    printf("twell / dense: prefill %.2fx, decode %.2fx%s\n", dense.prefill_ms / twell.prefill_ms,
           dense.decode_s / twell.decode_s, have_nvml ? "" : " (energy: NVML unavailable)");
    StepFired fired = decode_fired(model, s, tokens, B, T, steps);
    report_bytes(model, s, B, T, steps, dense.decode_s, twell.decode_s, fired);
    bench_decode_parts(model, s, B);
    free(lens);
    free(tokens);
}

// a checkpoint, or a random model of a preset shape (synthetic-sparse unless --sparse-k 0), on the GPU
static void bench_main(const BenchOptions* opt) {
    GPTConfig config;
    char what[512];
    float* params = NULL; // a checkpoint's weights (NULL: a preset)
    int step = 0, steps = opt->steps, B = opt->batch, T = opt->length;
    if (opt->preset_name) {
        const ModelPreset* p = find_preset(opt->preset_name);
        if (p == NULL) { fatal("--preset %s: not a model shape (default, 124m, 0.5b, 1b, 1.5b, 2b)", opt->preset_name); }
        config = (GPTConfig){50257, round_up(50257, 128), p->layers, p->dim, p->heads, p->heads, p->hidden, 2048, 10000.0f,
                             1e-5f, ACT_RELU, 0};
    } else {
        params = checkpoint_load_model(opt->model_path, &config, &step);
        if (config.activation != ACT_RELU) {
            fatal("bench_infer compares the dense and TwELL paths, and TwELL needs ReLU: %s is %s", opt->model_path,
                  activation_names[config.activation]);
        }
    }
    if (T + steps > config.max_seq_len) {
        steps = config.max_seq_len - T;
        if (steps < 1) { fatal("--length %d leaves no room to decode in max_seq_len %d", T, config.max_seq_len); }
    }
    GPT<bf16, float> model;
    InferState<bf16> s;
    gpt_build(&model, &config, DEVICE_CUDA);
    if (opt->cache && opt->cache < T + steps) { fatal("--cache %d holds fewer than --length + -n = %d positions", opt->cache, T + steps); }
    infer_state_alloc(&s, &model, B, B * T, opt->cache ? opt->cache : T + steps);
    s.dev.use_graph = opt->graph;
    s.ffn.twell.min_rows = opt->twell_min_rows;
    if (opt->preset_name) {
        init_params_synthetic_gpu(&model, (uint32_t)opt->seed, opt->sparse_k);
        if (opt->sparse_k > 0) {
            snprintf(what, sizeof(what), "random %s model (L %d, D %d, H %d) with the %s SYNTHETIC-SPARSE init (k = %g "
                     "target units per token; benchmark only) on %s", opt->preset_name,
                     config.num_layers, config.channels, config.hidden, opt->sparse_skew ? "skewed" : "uniform",
                     opt->sparse_k, opt->gpu_name);
        } else {
            snprintf(what, sizeof(what), "random %s model (L %d, D %d, H %d, dense-random gates) on %s",
                     opt->preset_name, config.num_layers, config.channels, config.hidden, opt->gpu_name);
        }
    } else {
        gpt_load_params(&model, params);
        free(params);
        snprintf(what, sizeof(what), "%s (step %d, L %d, D %d, H %d) on %s", opt->model_path, step, config.num_layers,
                 config.channels, config.hidden, opt->gpu_name);
    }
    bench(&model, &s, B, T, steps, opt->preset_name ? opt->sparse_k : 0, opt->sparse_skew, opt->hot, what,
          (uint64_t)opt->seed, opt->write_model);
    infer_state_free(&s, &model);
    gpt_free(&model);
}

// ----------------------------------------------------------------------------

// the flags into o, checked, and the GPU's name; a bad flag is a one-line error
static void parse_options(int argc, char** argv, BenchOptions* o) {
    memset(o, 0, sizeof(*o));
    o->batch = 1, o->length = 512, o->steps = 256, o->seed = 42, o->graph = 1, o->twell_min_rows = TWELL_PREFILL_MIN_ROWS;
    o->hot = 1, o->sparse_k = 30.0f;
    ArgSpec specs[] = {
        {'m', "model", ARG_STRING, &o->model_path, 0, 0, "train_gpt_sparse checkpoint, or a directory: its newest (default: out)", 0},
        {0, "preset", ARG_STRING, &o->preset_name, 0, 0, "a random model of this shape (default, 124m, 0.5b, 1b, 1.5b, 2b) instead of --model", 0},
        {0, "sparse-k", ARG_FLOAT, &o->sparse_k, 0, 1e6, "--preset: synthetic-sparse init, ~k active units per token (0 = off)", 0},
        {0, "sparse-skew", ARG_INT, &o->sparse_skew, 0, 1, "--preset: 1 = the units' rates skewed as trained models' (log-normal, 30% never firing), 0 = uniform", 0},
        {0, "batch", ARG_INT, &o->batch, 1, 4096, "sequences", 0},
        {0, "length", ARG_INT, &o->length, 1, 1 << 20, "prompt tokens per sequence", 0},
        {'n', "max-tokens", ARG_INT, &o->steps, 1, 1 << 24, "decode steps (fewer where max_seq_len ends first)", 0},
        {0, "cache", ARG_INT, &o->cache, 0, 1 << 24, "positions per sequence in the cache, at most max_seq_len (0 = --length + -n; a server's is its model's max_seq_len)", 0},
        {0, "hot", ARG_INT, &o->hot, 0, 1, "1 = TwELL prefills run each layer's busiest units as dense products (chosen by a calibration prefill of the benchmark's prompts), 0 = all units by TwELL", 0},
        {0, "twell-min-rows", ARG_INT, &o->twell_min_rows, 0, 1 << 30, "TwELL: prefills of fewer tokens run the dense FFN (0 = never)", 0},
        {0, "graph", ARG_INT, &o->graph, 0, 1, "1 = each decode step is one CUDA graph", 0},
        {'s', "seed", ARG_INT, &o->seed, 0, 2147483647, "seed of the prompts' token ids and of a --preset model", 0},
        {0, "write-model", ARG_STRING, &o->write_model, 0, 0, "--preset: write the calibrated model as a checkpoint in this directory and stop (for dev/bench_serve.sh)", 0},
    };
    int num_specs = (int)(sizeof(specs) / sizeof(specs[0]));
    cli_parse(argc, argv, "usage: build/dev/bench_infer [flags]\nTimes prefill tok/ms and decode tok/s of the dense and the "
              "TwELL GPU paths on a checkpoint or a random model.", specs, num_specs);
    if (o->preset_name && o->model_path) { fatal("--preset makes a random model: drop -m"); }
    if (o->preset_name == NULL) {
        const char* needs[] = {"sparse-k", "sparse-skew", "write-model"};
        for (size_t i = 0; i < sizeof(needs) / sizeof(needs[0]); i++) {
            if (cli_given(specs, num_specs, needs[i])) { fatal("--%s needs --preset (a checkpoint's gates are its own)", needs[i]); }
        }
    }
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) { fatal("bench_infer measures the GPU paths: no CUDA GPU is present"); }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    snprintf(o->gpu_name, sizeof(o->gpu_name), "%s", prop.name);
    if (o->preset_name == NULL) {
        o->model_path = checkpoint_model_arg(o->model_path ? o->model_path : "out", o->model_path != NULL, o->model_file,
                                             sizeof(o->model_file));
    }
}

int main(int argc, char** argv) {
    BenchOptions o;
    parse_options(argc, argv, &o);
    bench_main(&o);
    return 0;
}
