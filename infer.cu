/*
 infer: loads a checkpoint of train_gpt_sparse and generates text.

 The prompt (an argument, a file, or stdin) is encoded with the tokenizer (a
 tiktoken rank file, GPT-2's by default, or a Hugging Face tokenizer.json) after
 the token that starts documents (GPT-2's and SmolLM2's <|endoftext|>), run
 through the model once (prefill, filling the key/value cache), and then one
 token at a time is sampled (temperature, top-k, top-p, seed) and streamed to
 stdout until that token comes again, the token limit or the model's
 max_seq_len. --dump-logits writes the logits each token was sampled from.

 With --analyze PATTERN it generates nothing and instead measures the sparsity
 of the FFN activations on shards of text (a val shard, say): how many FFN
 units fire per token in each layer, at each position of the sequence, and for
 each token id (the most and the least active tokens), printed as tables and,
 with --analyze-out, written as JSON.

 Backends (--device): the CPU reference path (fp32) runs everywhere; the GPU
 path (llmc/cuda_infer.cuh, bf16) prefills every prompt at once and decodes
 all sequences together, one token each per step, with the FFN dense (cuBLAS)
 or sparse (--ffn twell, the default: TwELL in the prefill, a kernel that reads
 only the active units' weight rows in the decode).

 Prompts: --prompt is one; --prompt-file holds one per line (a batch; empty
 lines are skipped; '-' reads stdin); piped stdin without either is one. One
 prompt streams its tokens as they come; a batch prints each sequence at the
 end as "[i] prompt completion" (the prompt left out with -q 1), in order.
 Prompt i of a batch samples with seed + i; each stops at end-of-text, the
 token limit or max_seq_len.

 --bench measures prefill tokens/ms and decode tokens/s of the dense and the
 TwELL GPU paths in one run, three rounds of each in turn, medians (and energy
 per token from NVML when the driver has it), on a checkpoint or on a random
 model of a preset shape, by default with the synthetic-sparse gates of
 llmc/cuda_infer.cuh (benchmark only).
*/
#include <cuda_runtime.h>
#include <time.h>
#include <unistd.h>

#include "llmc/checkpoint.h"
#include "llmc/cli.h"
#include "llmc/cuda_infer.cuh"
#include "llmc/dataloader.h"
#include "llmc/gpt.h"
#include "llmc/nvml.h"
#include "llmc/sampler.h"
#include "llmc/tokenizer.h"

// reads all of fp into a malloc'd, NUL-terminated buffer
static char* read_all(FILE* fp, const char* name, size_t* len) {
    size_t cap = 1 << 16, n = 0;
    char* buf = (char*)mallocCheck(cap);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, fp)) > 0) {
        n += got;
        if (n + 1 == cap) { cap *= 2; buf = (char*)reallocCheck(buf, cap); }
    }
    if (ferror(fp)) { fatal("cannot read the prompt from %s", name); }
    buf[n] = '\0';
    *len = n;
    return buf;
}

// ----------------------------------------------------------------------------
// --analyze: how many FFN units fire, per layer, per position and per token,
// over batches of a shard set read in file order (as validation reads it)

typedef struct {
    const char* pattern;  // glob of shards
    const char* out_path; // JSON copy of the report, or NULL
    int B, T, batches, min_count, top;
    int quiet;            // 1 = no "model:" line on stderr
} AnalyzeOptions;

typedef struct {
    int id, count;
    double l0; // mean over its occurrences of the firing units, averaged over layers
} TokenActivity;

// most active first; ties by id, so the order is deterministic
static int token_activity_cmp(const void* a, const void* b) {
    const TokenActivity* x = (const TokenActivity*)a;
    const TokenActivity* y = (const TokenActivity*)b;
    if (x->l0 != y->l0) { return x->l0 < y->l0 ? 1 : -1; }
    return (x->id > y->id) - (x->id < y->id);
}

// writes s[0..len) as the inside of a quoted string: a C-style one for the
// tables (json = 0) or a JSON one. Valid UTF-8 passes through; quotes,
// backslashes and control bytes are escaped; a byte that is not part of a
// valid UTF-8 sequence (GPT-2 tokens can hold half a character) is written as
// the four characters \xNN.
static void write_quoted(FILE* fp, const unsigned char* s, size_t len, int json) {
    for (size_t i = 0; i < len;) {
        unsigned char c = s[i];
        size_t n = utf8_sequence_length(s, len, i);
        if (n > 1) {
            fwrite(s + i, 1, n, fp);
            i += n;
            continue;
        }
        i++;
        if (c == '"') { fputs("\\\"", fp); }
        else if (c == '\\') { fputs("\\\\", fp); }
        else if (c == '\n') { fputs("\\n", fp); }
        else if (c == '\t') { fputs("\\t", fp); }
        else if (c == '\r') { fputs("\\r", fp); }
        else if (n == 1 && c >= 0x20 && c != 0x7f) { fputc(c, fp); }
        else if (n == 1 && json) { fprintf(fp, "\\u%04x", c); }
        else { fprintf(fp, json ? "\\\\x%02x" : "\\x%02x", c); }
    }
}

static void write_json_string(FILE* fp, const char* s) {
    fputc('"', fp);
    write_quoted(fp, (const unsigned char*)s, strlen(s), 1);
    fputc('"', fp);
}

// positions 0, 1, 2, 3, then 4-7, 8-15, 16-31, ...: bucket k covers [first, last]
static int position_buckets(int T, int* first, int* last) {
    int n = 0;
    for (int p = 0; p < T && p < 4; p++) { first[n] = last[n] = p; n++; }
    for (int p = 4; p < T; p *= 2) {
        first[n] = p;
        last[n] = 2 * p - 1 < T - 1 ? 2 * p - 1 : T - 1;
        n++;
    }
    return n;
}

static void print_token_rows(const Tokenizer* tok, const TokenActivity* ranked, int n_ranked, int count, int from_top,
                             int H) {
    printf(" rank      id   count  mean L0  %% of H  text\n");
    for (int r = 0; r < count; r++) {
        const TokenActivity* t = &ranked[from_top ? r : n_ranked - 1 - r];
        size_t len = 0;
        const unsigned char* bytes = tokenizer_decode(tok, t->id, &len);
        printf("%5d %7d %7d %8.2f %7.2f  \"", r + 1, t->id, t->count, t->l0, 100 * t->l0 / H);
        write_quoted(stdout, bytes, len, 0);
        printf("\"\n");
    }
}

static void write_token_json(FILE* fp, const Tokenizer* tok, const TokenActivity* ranked, int n_ranked, int count,
                             int from_top) {
    for (int r = 0; r < count; r++) {
        const TokenActivity* t = &ranked[from_top ? r : n_ranked - 1 - r];
        size_t len = 0;
        const unsigned char* bytes = tokenizer_decode(tok, t->id, &len);
        fprintf(fp, "%s{\"id\":%d,\"count\":%d,\"l0_mean\":%.6g,\"text\":\"", r ? "," : "", t->id, t->count, t->l0);
        write_quoted(fp, bytes, len, 1);
        fprintf(fp, "\"}");
    }
}

static void analyze(GPT<float, float>* model, const Tokenizer* tok, const AnalyzeOptions* o, const char* model_path,
                    int step) {
    const GPTConfig* c = &model->config;
    int L = c->num_layers, H = c->hidden, V = c->vocab_size, B = o->B, T = o->T, M = B * T;
    DataLoader loader;
    dataloader_init(&loader, o->pattern, B, T, 0, 1, 0, 0, V); // file order, no shuffle
    if (!o->quiet) {
        fprintf(stderr, "model: %s (step %d, %d layers, D %d, H %d) on the CPU reference path\n", model_path, step, L,
                c->channels, H);
    }
    size_t available = dataloader_num_batches(&loader);
    int batches = (size_t)o->batches > available ? (int)available : o->batches;
    double* pos_sum = (double*)callocCheck(T, sizeof(double));
    double* tok_sum = (double*)callocCheck(V, sizeof(double));
    int* tok_count = (int*)callocCheck(V, sizeof(int));

    double t0 = now_seconds();
    gpt_stats_reset(model);
    for (int i = 0; i < batches; i++) {
        dataloader_next_batch(&loader);
        gpt_forward(model, loader.inputs, loader.targets, B, T, 0.0f);
        const int* active = model->acts.row_active; // [L, M], host memory on the CPU path
        for (int m = 0; m < M; m++) {
            double sum = 0;
            for (int l = 0; l < L; l++) { sum += active[(size_t)l * M + m]; }
            pos_sum[m % T] += sum / L;
            tok_sum[loader.inputs[m]] += sum / L;
            tok_count[loader.inputs[m]]++;
        }
    }
    double tokens = (double)batches * M, seconds = now_seconds() - t0;
    gpt_stats_read(model, tokens);

    // the token ids seen at least min_count times, most active first
    TokenActivity* ranked = (TokenActivity*)mallocCheck(V * sizeof(TokenActivity));
    int n_ranked = 0, n_seen = 0;
    for (int id = 0; id < V; id++) {
        n_seen += tok_count[id] > 0;
        if (tok_count[id] >= o->min_count) {
            ranked[n_ranked++] = (TokenActivity){id, tok_count[id], tok_sum[id] / tok_count[id]};
        }
    }
    qsort(ranked, n_ranked, sizeof(TokenActivity), token_activity_cmp);
    int shown = n_ranked < o->top ? n_ranked : o->top;
    int first[64], last[64];
    int n_buckets = position_buckets(T, first, last);
    double l0_all = 0, dead_all = 0;
    int max_all = 0;
    for (int l = 0; l < L; l++) {
        l0_all += model->stats[l].l0_mean / L;
        dead_all += model->stats[l].dead / L;
        if (model->stats[l].l0_max > max_all) { max_all = model->stats[l].l0_max; }
    }

    printf("analysis of %s: %d batches of %d x %d tokens = %.0f tokens (%.1f s)\n", o->pattern, batches, B, T, tokens,
           seconds);
    printf("ce %.4f (mean next-token cross-entropy)\n\n", model->ce);
    printf("L0 per layer: FFN units that fire per token, of H = %d (dead: fired for none of the tokens)\n", H);
    printf("layer  mean L0  max L0  %% of H  dead %%\n");
    for (int l = 0; l < L; l++) {
        const LayerStats* s = &model->stats[l];
        printf("%5d %8.2f %7d %7.2f %7.1f\n", l, s->l0_mean, s->l0_max, 100 * s->l0_mean / H, 100 * s->dead);
    }
    printf("  all %8.2f %7d %7.2f %7.1f\n\n", l0_all, max_all, 100 * l0_all / H, 100 * dead_all);
    printf("L0 per position in the sequence (mean over layers)\n");
    printf(" position   tokens  mean L0  %% of H\n");
    for (int k = 0; k < n_buckets; k++) {
        double sum = 0;
        for (int p = first[k]; p <= last[k]; p++) { sum += pos_sum[p]; }
        double n = (double)batches * B * (last[k] - first[k] + 1);
        char range[32];
        if (first[k] == last[k]) { snprintf(range, sizeof(range), "%d", first[k]); }
        else { snprintf(range, sizeof(range), "%d-%d", first[k], last[k]); }
        printf("%9s %8.0f %8.2f %7.2f\n", range, n, sum / n, 100 * sum / n / H);
    }
    printf("\nthe %d most active tokens (mean over layers; of %d token ids seen, %d occur at least %d times)\n", shown,
           n_seen, n_ranked, o->min_count);
    print_token_rows(tok, ranked, n_ranked, shown, 1, H);
    printf("\nthe %d least active tokens\n", shown);
    print_token_rows(tok, ranked, n_ranked, shown, 0, H);

    if (o->out_path) {
        char tmp[4096];
        FILE* fp = atomic_open(o->out_path, tmp, sizeof(tmp));
        fprintf(fp, "{\"model\":");
        write_json_string(fp, model_path);
        fprintf(fp, ",\"step\":%d,\"data\":", step);
        write_json_string(fp, o->pattern);
        fprintf(fp, ",\"batches\":%d,\"batch\":%d,\"seq_len\":%d,\"tokens\":%.0f,\"layers\":%d,\"hidden\":%d,\"ce\":%.6g,",
                batches, B, T, tokens, L, H, model->ce);
        fprintf(fp, "\"l0_mean\":%.6g,\"l0_max\":%d,\"l0_pct\":%.6g,\"dead\":%.6g,", l0_all, max_all, 100 * l0_all / H,
                dead_all);
        fprintf(fp, "\"layer\":{\"l0_mean\":[");
        for (int l = 0; l < L; l++) { fprintf(fp, "%s%.6g", l ? "," : "", model->stats[l].l0_mean); }
        fprintf(fp, "],\"l0_max\":[");
        for (int l = 0; l < L; l++) { fprintf(fp, "%s%d", l ? "," : "", model->stats[l].l0_max); }
        fprintf(fp, "],\"l0_pct\":[");
        for (int l = 0; l < L; l++) { fprintf(fp, "%s%.6g", l ? "," : "", 100 * model->stats[l].l0_mean / H); }
        fprintf(fp, "],\"dead\":[");
        for (int l = 0; l < L; l++) { fprintf(fp, "%s%.6g", l ? "," : "", model->stats[l].dead); }
        fprintf(fp, "]},\"position\":{\"l0_mean\":[");
        for (int p = 0; p < T; p++) { fprintf(fp, "%s%.6g", p ? "," : "", pos_sum[p] / ((double)batches * B)); }
        fprintf(fp, "]},\"position_buckets\":[");
        for (int k = 0; k < n_buckets; k++) {
            double sum = 0;
            for (int p = first[k]; p <= last[k]; p++) { sum += pos_sum[p]; }
            double n = (double)batches * B * (last[k] - first[k] + 1);
            fprintf(fp, "%s{\"first\":%d,\"last\":%d,\"l0_mean\":%.6g}", k ? "," : "", first[k], last[k], sum / n);
        }
        fprintf(fp, "],\"token_ids_seen\":%d,\"min_count\":%d,\"tokens_ranked\":%d,\"most_active\":[", n_seen,
                o->min_count, n_ranked);
        write_token_json(fp, tok, ranked, n_ranked, shown, 1);
        fprintf(fp, "],\"least_active\":[");
        write_token_json(fp, tok, ranked, n_ranked, shown, 0);
        fprintf(fp, "]}\n");
        atomic_commit(fp, tmp, o->out_path);
        printf("\nwrote %s\n", o->out_path);
    }
    free(ranked);
    free(tok_count);
    free(tok_sum);
    free(pos_sum);
    dataloader_free(&loader);
}

// ----------------------------------------------------------------------------
// generation: the prompts, one sequence each, on the CPU reference path or the GPU

typedef struct {
    const char* text; // the prompt (not owned)
    size_t len;
    int* ids;         // <|endoftext|> + the prompt's tokens
    size_t n_ids;
    char* out;        // generated bytes, kept for the batch printout
    size_t out_len, out_cap;
    int generated, done;
    const char* stop;
    uint64_t rng;
} Sequence;

typedef struct {
    const Tokenizer* tok;
    SamplerConfig sampler;
    ProbIndex* scratch;
    FILE* dump;
    int max_tokens, max_seq_len, stream; // stream: print tokens as they come (one sequence)
} GenerateOptions;

// samples sequence s's next token from its logits, prints or keeps it, and says
// whether s goes on (pos = the position the token would take)
static bool take_token(Sequence* s, const float* logits, int V, int pos, const GenerateOptions* o, int* token_out) {
    for (int i = 0; i < V; i++) { // a NaN would make every comparison false and pick a token silently
        if (!isfinite(logits[i])) {
            fatal("the logits at position %d are not finite (token %d: %g): the model's weights or activations hold "
                  "NaN or overflow", pos, i, logits[i]);
        }
    }
    int token = sample_token(logits, V, &o->sampler, &s->rng, o->scratch);
    if (o->dump) {
        fwriteCheck(&token, sizeof(int), 1, o->dump);
        fwriteCheck(logits, sizeof(float), V, o->dump);
    }
    if (token == o->tok->eot_token) { s->stop = "end of text"; s->done = 1; return false; }
    size_t len = 0;
    const unsigned char* bytes = tokenizer_decode(o->tok, token, &len);
    if (o->stream) {
        fwrite(bytes, 1, len, stdout);
        fflush(stdout);
    } else {
        while (s->out_len + len > s->out_cap) {
            s->out_cap = s->out_cap ? 2 * s->out_cap : 256;
            s->out = (char*)reallocCheck(s->out, s->out_cap);
        }
        memcpy(s->out + s->out_len, bytes, len);
        s->out_len += len;
    }
    s->generated++;
    if (pos == o->max_seq_len) { s->stop = "max_seq_len"; s->done = 1; return false; }
    if (s->generated == o->max_tokens) { s->stop = "token limit"; s->done = 1; return false; }
    *token_out = token;
    return true;
}

// the CPU reference path: one sequence after the other
static void generate_cpu(GPT<float, float>* model, Sequence* seqs, int nseq, const GenerateOptions* o, double* prefill_s) {
    const GPTConfig* c = &model->config;
    *prefill_s = 0;
    for (int i = 0; i < nseq; i++) {
        Sequence* s = &seqs[i];
        InferState<float> state;
        infer_state_alloc(&state, c, (int)s->n_ids);
        double t0 = now_seconds();
        gpt_forward_cached(model, &state, s->ids, (int)s->n_ids, 0);
        *prefill_s += now_seconds() - t0;
        int pos = (int)s->n_ids, token = 0;
        while (take_token(s, state.logits, c->vocab_size, pos, o, &token)) { gpt_forward_cached(model, &state, &token, 1, pos++); }
        infer_state_free(&state);
    }
}

// the GPU path: every prompt in one prefill, then one decode step per token for all sequences
static void generate_gpu(GpuModel* m, Sequence* seqs, int nseq, const GenerateOptions* o, double* prefill_s) {
    const GPTConfig* c = &m->config;
    int Vp = c->padded_vocab_size, total = 0;
    int* lens = (int*)mallocCheck(nseq * sizeof(int));
    for (int i = 0; i < nseq; i++) { lens[i] = (int)seqs[i].n_ids; total += lens[i]; }
    int* tokens = (int*)mallocCheck(total * sizeof(int));
    for (int i = 0, off = 0; i < nseq; off += lens[i], i++) { memcpy(tokens + off, seqs[i].ids, lens[i] * sizeof(int)); }
    float* logits = (float*)mallocCheck((size_t)nseq * Vp * sizeof(float));
    int* next = (int*)mallocCheck(nseq * sizeof(int));
    int* pos = (int*)mallocCheck(nseq * sizeof(int));
    int* step_pos = (int*)mallocCheck(nseq * sizeof(int));
    double t0 = now_seconds();
    gpu_model_prefill(m, tokens, lens, nseq, logits);
    *prefill_s = now_seconds() - t0;
    for (int i = 0; i < nseq; i++) { pos[i] = lens[i]; }
    for (;;) {
        int running = 0;
        for (int i = 0; i < nseq; i++) {
            if (!seqs[i].done && take_token(&seqs[i], logits + (size_t)i * Vp, c->vocab_size, pos[i], o, &next[i])) {
                running++;
            }
        }
        if (running == 0) { break; }
        // a finished sequence rides along at position 0 of its own cache slot, which nothing reads again
        for (int i = 0; i < nseq; i++) {
            if (seqs[i].done) { next[i] = 0; step_pos[i] = 0; } else { step_pos[i] = pos[i]++; }
        }
        gpu_model_decode(m, next, step_pos, nseq, logits);
    }
    free(step_pos);
    free(pos);
    free(next);
    free(logits);
    free(tokens);
    free(lens);
}

// ----------------------------------------------------------------------------
// --bench: prefill tokens/ms and decode tokens/s, dense and TwELL, in one run

typedef struct {
    double prefill_ms, decode_s, prefill_j, decode_j, active;
} BenchResult;

static BenchResult bench_path(GpuModel* m, InferFFN ffn, const int* tokens, const int* lens, int B, int T, int steps,
                              const Nvml* nvml, int have_nvml) {
    BenchResult r = {0, 0, -1, -1, -1};
    m->ffn = ffn;
    for (int i = 0; i < 2; i++) { gpu_model_prefill(m, tokens, lens, B, NULL); } // TwELL sizes its buffers and picks paths
    double t0 = now_seconds();
    gpu_model_prefill(m, tokens, lens, B, NULL);
    double once = now_seconds() - t0;
    int reps = (int)ceil(0.5 / once);
    reps = reps < 3 ? 3 : reps > 100 ? 100 : reps;
    double e0 = have_nvml ? nvml_energy_joules(nvml) : 0;
    t0 = now_seconds();
    for (int i = 0; i < reps; i++) { gpu_model_prefill(m, tokens, lens, B, NULL); }
    r.prefill_ms = (now_seconds() - t0) * 1e3 / reps;
    if (have_nvml) { r.prefill_j = (nvml_energy_joules(nvml) - e0) / reps; }
    if (ffn == INFER_FFN_TWELL) {
        double sum = 0;
        for (int l = 0; l < m->config.num_layers; l++) { sum += m->layer_active[l]; }
        r.active = sum / m->config.num_layers;
    }
    int* next = (int*)mallocCheck(B * sizeof(int));
    int* pos = (int*)mallocCheck(B * sizeof(int));
    for (int b = 0; b < B; b++) { next[b] = tokens[b * T + T - 1]; pos[b] = T; }
    gpu_model_decode(m, next, pos, B, NULL); // the graph is made here
    e0 = have_nvml ? nvml_energy_joules(nvml) : 0;
    t0 = now_seconds();
    for (int i = 0; i < steps; i++) { // the model's step: the logits stay on the GPU (no copy, no sampling)
        for (int b = 0; b < B; b++) { pos[b] = T + i; next[b] = (int)((tokens[b * T + i % T] + i) % m->config.vocab_size); }
        gpu_model_decode(m, next, pos, B, NULL);
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
template <typename F>
static double time_us(F fn) {
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    fn();
    float ms[20];
    for (int i = 0; i < 20; i++) {
        cudaCheck(cudaEventRecord(start, main_stream));
        fn();
        cudaCheck(cudaEventRecord(stop, main_stream));
        cudaCheck(cudaEventSynchronize(stop));
        cudaCheck(cudaEventElapsedTime(&ms[i], start, stop));
    }
    qsort(ms, 20, sizeof(float), [](const void* a, const void* b) {
        float x = *(const float*)a, y = *(const float*)b;
        return (x > y) - (x < y);
    });
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    return ms[10] * 1e3;
}

// the parts of one decode step of B sequences (layer 0, the cache as the last step left it)
static void bench_decode_parts(GpuModel* m, int B) {
    using namespace infer_detail;
    const GPTConfig* c = &m->config;
    int D = c->channels, H = c->hidden, QKV = qkv_dim(c);
    double qkv = time_us([&] { decode_linear(m->qkv, m->normed, m->param[P_WQKV], B, QKV, D); });
    double att = time_us([&] {
        decode_attention(m->att, m->part_o, m->part_ml, m->splits_done, m->qkv, m->k_cache, m->v_cache, m->row_pos, B,
                         c->num_heads, c->num_kv_heads, head_size(c), m->cache_len, c->rope_theta);
    });
    double gate = time_us([&] { decode_linear(m->gu, m->normed, m->param[P_WG], B, H, D); });
    double gate_cublas = time_us([&] { gemm(m->gu, m->normed, m->param[P_WG], B, H, D, 0, 1, 0); });
    double down = time_us([&] { gemm(m->proj, m->gu, m->param[P_WDT], B, D, H, 0, 0, 0); });
    double logits = time_us([&] { decode_linear(m->logits, m->normed, m->param[P_WTE], B, c->padded_vocab_size, D); });
    printf("decode parts at batch %d (us, one layer): qkv %.1f, attention %.1f, gate (or up) %.1f (cuBLASLt: %.1f), "
           "dense down %.1f; logits %.1f; weights %.1f MB per layer dense\n", B, qkv, att, gate, gate_cublas, down,
           logits, (double)(QKV + D + 3 * H) * D * 2 / 1e6);
}

static void bench(GpuModel* m, int B, int T, int steps, const char* what, uint64_t seed) {
    const GPTConfig* c = &m->config;
    int* tokens = (int*)mallocCheck((size_t)B * T * sizeof(int));
    int* lens = (int*)mallocCheck(B * sizeof(int));
    uint64_t rng = seed;
    for (int i = 0; i < B * T; i++) { tokens[i] = (int)rng_below(&rng, c->vocab_size); }
    for (int b = 0; b < B; b++) { lens[b] = T; }
    if (m->calibrate_k > 0) { gpu_model_prefill(m, tokens, lens, B, NULL); } // sets the synthetic gate offsets
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
        runs[0][round] = bench_path(m, INFER_FFN_DENSE, tokens, lens, B, T, steps, &nvml, have_nvml);
        runs[1][round] = bench_path(m, INFER_FFN_TWELL, tokens, lens, B, T, steps, &nvml, have_nvml);
    }
    BenchResult dense = bench_median(runs[0]), twell = bench_median(runs[1]);
    printf("bench: %s, batch %d x %d prompt tokens, %d decode steps%s\n", what, B, T, steps,
           m->sparse_prefill_ok ? "" : " (TwELL prefill unsupported for this shape: dense)");
    if (twell.active >= 0) {
        printf("TwELL: %.1f active FFN units per token (mean over layers, of H = %d), %lld buffer growths\n", twell.active,
               c->hidden, m->regrows);
    } else {
        printf("TwELL: the prefill of %d tokens ran the dense FFN (--twell-min-rows %d)\n", B * T, m->twell_min_rows);
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
    bench_decode_parts(m, B);
    free(lens);
    free(tokens);
}

// ----------------------------------------------------------------------------

// the prompts: each line of a file is one (a batch; empty lines are skipped), an
// argument or piped stdin is one
static int split_lines(char* buf, size_t len, const char** texts, size_t* lens, int cap) {
    int n = 0;
    size_t start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i == len || buf[i] == '\n') {
            size_t end = i;
            if (end > start && buf[end - 1] == '\r') { end--; }
            if (end > start) {
                if (n == cap) { fatal("the prompt file holds more than %d prompts", cap); }
                texts[n] = buf + start;
                lens[n++] = end - start;
            }
            start = i + 1;
        }
    }
    return n;
}

int main(int argc, char** argv) {
    const char* model_path = NULL;
    const char* prompt = NULL;
    const char* prompt_file = NULL;
    const char* tokenizer_path = TOKENIZER_DEFAULT_PATH;
    const char* analyze_pattern = NULL;
    const char* analyze_out = NULL;
    const char* dump_logits = NULL;
    const char* device_name = "auto";
    const char* ffn_name = "twell";
    const char* preset_name = NULL;
    int max_tokens = 256, top_k = 0, seed = 42, quiet = 0, graph = 1, twell_min_rows = TWELL_PREFILL_MIN_ROWS;
    int analyze_batches = 16, analyze_batch = 4, analyze_seq_len = 0, analyze_min_count = 10, analyze_top = 20;
    int bench_on = 0, bench_batch = 1, bench_length = 512, max_batch = 64;
    float temperature = 1.0f, top_p = 1.0f, sparse_k = 30.0f;
    ArgSpec specs[] = {
        {'m', "model", ARG_STRING, &model_path, 0, 0, "train_gpt_sparse checkpoint, or a directory: its newest (default: out)", 0},
        {'p', "prompt", ARG_STRING, &prompt, 0, 0, "prompt text (default: stdin if it is not a terminal, else none)", 0},
        {'f', "prompt-file", ARG_STRING, &prompt_file, 0, 0, "one prompt per line, a batch ('-' = stdin; empty lines skipped)", 0},
        {'n', "max-tokens", ARG_INT, &max_tokens, 1, 1 << 24, "most tokens to generate per prompt (--bench: decode steps)", 0},
        {'t', "temperature", ARG_FLOAT, &temperature, 0, 100, "sampling temperature (0 = greedy)", 0},
        {'k', "top-k", ARG_INT, &top_k, 0, 1 << 24, "sample among the k likeliest tokens (0 = all)", 0},
        {0, "top-p", ARG_FLOAT, &top_p, 1e-6, 1, "sample within the smallest set of probability >= p", 0},
        {'s', "seed", ARG_INT, &seed, 0, 2147483647, "sampling seed (prompt i of a batch uses seed + i)", 0},
        {0, "tokenizer", ARG_STRING, &tokenizer_path, 0, 0, "tiktoken rank file or Hugging Face tokenizer.json", 0},
        {0, "dump-logits", ARG_STRING, &dump_logits, 0, 0, "write each sampled token's id (int32) and its V logits (fp32) here", 0},
        {'q', "quiet", ARG_INT, &quiet, 0, 1, "1 = print only the generated text, no prompt or statistics", 0},
        {0, "device", ARG_STRING, &device_name, 0, 0, "auto, cpu or cuda", 0},
        {0, "ffn", ARG_STRING, &ffn_name, 0, 0, "GPU FFN: twell (sparse) or dense (cuBLAS)", 0},
        {0, "graph", ARG_INT, &graph, 0, 1, "1 = each GPU decode step is one CUDA graph", 0},
        {0, "twell-min-rows", ARG_INT, &twell_min_rows, 0, 1 << 30, "TwELL: prefills of fewer tokens run the dense FFN (0 = never)", 0},
        {0, "max-batch", ARG_INT, &max_batch, 1, 4096, "most prompts of one GPU run", 0},
        {0, "bench", ARG_INT, &bench_on, 0, 1, "1 = measure prefill tok/ms and decode tok/s, dense and TwELL (GPU)", 0},
        {0, "batch", ARG_INT, &bench_batch, 1, 4096, "--bench: sequences", 0},
        {0, "length", ARG_INT, &bench_length, 1, 1 << 20, "--bench: prompt tokens per sequence", 0},
        {0, "preset", ARG_STRING, &preset_name, 0, 0, "--bench: a random model of this shape (1.5b, ...) instead of --model", 0},
        {0, "sparse-k", ARG_FLOAT, &sparse_k, 0, 1e6, "--bench --preset: synthetic-sparse init, ~k active units per token (0 = off)", 0},
        {0, "analyze", ARG_STRING, &analyze_pattern, 0, 0, "instead of generating, measure FFN sparsity on these shards (a glob)", 0},
        {0, "analyze-batches", ARG_INT, &analyze_batches, 1, 1 << 30, "batches to analyze (capped at what the shards hold)", 0},
        {0, "analyze-batch", ARG_INT, &analyze_batch, 1, 1 << 16, "sequences per analyzed batch", 0},
        {0, "analyze-seq-len", ARG_INT, &analyze_seq_len, 0, 1 << 20, "tokens per sequence (0 = the model's max_seq_len)", 0},
        {0, "analyze-min-count", ARG_INT, &analyze_min_count, 1, 1 << 30, "rank only token ids seen at least this often", 0},
        {0, "analyze-top", ARG_INT, &analyze_top, 1, 1 << 20, "tokens in each of the most and least active lists", 0},
        {0, "analyze-out", ARG_STRING, &analyze_out, 0, 0, "also write the analysis as JSON to this file", 0},
    };
    int num_specs = (int)(sizeof(specs) / sizeof(specs[0]));
    cli_parse(argc, argv, "usage: ./infer [flags]\nGenerates text with a train_gpt_sparse checkpoint, with --bench measures\n"
              "the GPU paths, or with --analyze measures the sparsity of its FFN activations on shards of text.",
              specs, num_specs);
    if (prompt && prompt_file) { fatal("give the prompt with --prompt or --prompt-file, not both"); }
    if (analyze_pattern && (prompt || prompt_file)) { fatal("--analyze reads shards, not a prompt: drop --prompt/--prompt-file"); }
    if (analyze_pattern && dump_logits) { fatal("--dump-logits writes the logits of generation: drop --analyze"); }
    if (analyze_pattern && bench_on) { fatal("--analyze and --bench are separate runs"); }
    if (analyze_pattern == NULL) {
        const char* needs[] = {"analyze-batches", "analyze-batch", "analyze-seq-len", "analyze-min-count", "analyze-top", "analyze-out"};
        for (size_t i = 0; i < sizeof(needs) / sizeof(needs[0]); i++) {
            if (cli_given(specs, num_specs, needs[i])) { fatal("--%s needs --analyze", needs[i]); }
        }
    }
    if (!bench_on) {
        const char* needs[] = {"batch", "length", "preset", "sparse-k"};
        for (size_t i = 0; i < sizeof(needs) / sizeof(needs[0]); i++) {
            if (cli_given(specs, num_specs, needs[i])) { fatal("--%s needs --bench", needs[i]); }
        }
    }
    if (strcmp(device_name, "auto") != 0 && strcmp(device_name, "cpu") != 0 && strcmp(device_name, "cuda") != 0) {
        fatal("--device %s: expected auto, cpu or cuda", device_name);
    }
    if (strcmp(ffn_name, "twell") != 0 && strcmp(ffn_name, "dense") != 0) { fatal("--ffn %s: expected twell or dense", ffn_name); }
    InferFFN ffn = strcmp(ffn_name, "dense") == 0 ? INFER_FFN_DENSE : INFER_FFN_TWELL;

    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess) { gpus = 0; }
    bool use_gpu = strcmp(device_name, "cuda") == 0 || (strcmp(device_name, "auto") == 0 && gpus > 0);
    if (use_gpu && gpus == 0) { fatal("--device cuda: no CUDA GPU is present"); }
    if (analyze_pattern && strcmp(device_name, "cuda") == 0) { fatal("--analyze runs on the CPU reference path: drop --device cuda"); }
    if (analyze_pattern) { use_gpu = false; }
    if (!use_gpu && cli_given(specs, num_specs, "ffn")) { fatal("--ffn chooses a GPU path; the CPU reference path is dense"); }
    char gpu_name[256] = "";
    if (use_gpu) {
        cudaDeviceProp prop;
        cudaCheck(cudaGetDeviceProperties(&prop, 0));
        snprintf(gpu_name, sizeof(gpu_name), "%s", prop.name);
    }

    // a directory (out when no -m is given) stands for its newest model file
    char newest_path[4096];
    struct stat model_stat;
    int is_dir = model_path != NULL && stat(model_path, &model_stat) == 0 && S_ISDIR(model_stat.st_mode);
    if (!(bench_on && preset_name) && (model_path == NULL || is_dir)) {
        const char* dir = model_path ? model_path : "out";
        int newest = checkpoint_latest(dir, 0);
        if (newest < 0 && model_path == NULL) {
            fatal("no -m given, and out/ holds no checkpoint (model_<step>.bin): train one with ./train_gpt_sparse "
                  "(on a CPU a short first run, about 10 minutes), or give -m FILE");
        }
        if (newest < 0) { fatal("-m %s: the directory holds no checkpoint (model_<step>.bin)", dir); }
        snprintf(newest_path, sizeof(newest_path), "%s/model_%08d.bin", dir, newest);
        model_path = newest_path;
    }

    if (bench_on) {
        if (!use_gpu) { fatal("--bench measures the GPU paths: no CUDA GPU here (or --device cpu)"); }
        GPTConfig config;
        char what[512];
        GpuModel m;
        int steps = max_tokens;
        if (preset_name) {
            const ModelPreset* p = find_preset(preset_name);
            if (p == NULL) { fatal("--preset %s: not a model shape (default, 124m, 0.5b, 1b, 1.5b, 2b)", preset_name); }
            config = (GPTConfig){50257, round_up(50257, 128), p->layers, p->dim, p->heads, p->heads, p->hidden, 2048, 10000.0f, 1e-5f};
        } else {
            int step = 0;
            free(checkpoint_load_model(model_path, &config, &step)); // the config now, the weights below
        }
        if (bench_length + steps > config.max_seq_len) {
            steps = config.max_seq_len - bench_length;
            if (steps < 1) { fatal("--length %d leaves no room to decode in max_seq_len %d", bench_length, config.max_seq_len); }
        }
        gpu_model_create(&m, &config, bench_batch, bench_batch * bench_length, bench_length + steps);
        m.use_graph = graph;
        m.twell_min_rows = twell_min_rows;
        if (preset_name) {
            gpu_model_init_synthetic(&m, (uint32_t)seed, sparse_k);
            if (sparse_k > 0) {
                snprintf(what, sizeof(what), "random %s model (L %d, D %d, H %d) with the SYNTHETIC-SPARSE init (k = %g "
                         "target units per token; benchmark only, never written to a checkpoint) on %s", preset_name,
                         config.num_layers, config.channels, config.hidden, sparse_k, gpu_name);
            } else {
                snprintf(what, sizeof(what), "random %s model (L %d, D %d, H %d, dense-random gates) on %s", preset_name,
                         config.num_layers, config.channels, config.hidden, gpu_name);
            }
        } else {
            int step = 0;
            float* params = checkpoint_load_model(model_path, &config, &step);
            gpu_model_upload(&m, params);
            free(params);
            snprintf(what, sizeof(what), "%s (step %d, L %d, D %d, H %d) on %s", model_path, step, config.num_layers,
                     config.channels, config.hidden, gpu_name);
        }
        bench(&m, bench_batch, bench_length, steps, what, (uint64_t)seed);
        gpu_model_free(&m);
        return 0;
    }

    GPTConfig config;
    int step = 0;
    float* params = checkpoint_load_model(model_path, &config, &step);
    Tokenizer tok;
    tokenizer_load(&tok, tokenizer_path);
    if (tok.vocab_size != config.vocab_size) {
        fatal("%s has %d tokens but the model %s has vocab_size %d", tokenizer_path, tok.vocab_size, model_path,
              config.vocab_size);
    }

    GPT<float, float> model;
    if (!use_gpu) {
        gpt_build(&model, &config, DEVICE_CPU);
        memcpy(model.params, params, model.num_parameters * sizeof(float));
    }
    if (analyze_pattern) {
        free(params);
        int T = analyze_seq_len ? analyze_seq_len : config.max_seq_len;
        if (T > config.max_seq_len || T < 2) {
            fatal("--analyze-seq-len %d: the model %s takes 2 to %d tokens", T, model_path, config.max_seq_len);
        }
        if ((long long)analyze_batch * T > (1 << 24)) {
            fatal("--analyze-batch %d x %d tokens is too many for one batch (at most %d)", analyze_batch, T, 1 << 24);
        }
        AnalyzeOptions o = {analyze_pattern, analyze_out, analyze_batch, T, analyze_batches, analyze_min_count, analyze_top,
                            quiet};
        analyze(&model, &tok, &o, model_path, step);
        tokenizer_free(&tok);
        gpt_free(&model);
        return 0;
    }

    // the prompts: argument, file (a line each), or piped stdin
    size_t buf_len = 0;
    char* buf = NULL;
    const char* source = "--prompt";
    const char** texts = (const char**)mallocCheck(max_batch * sizeof(char*));
    size_t* text_lens = (size_t*)mallocCheck(max_batch * sizeof(size_t));
    int nseq = 1;
    if (prompt_file) {
        FILE* fp = strcmp(prompt_file, "-") == 0 ? stdin : fopenCheck(prompt_file, "rb");
        source = strcmp(prompt_file, "-") == 0 ? "stdin" : prompt_file;
        buf = read_all(fp, source, &buf_len);
        if (fp != stdin) { fcloseCheck(fp); }
        nseq = split_lines(buf, buf_len, texts, text_lens, max_batch);
        if (nseq == 0) { fatal("%s holds no prompt (every line is empty)", source); }
    } else if (prompt == NULL && !isatty(STDIN_FILENO)) {
        source = "stdin";
        buf = read_all(stdin, source, &buf_len);
        texts[0] = buf;
        text_lens[0] = buf_len;
    } else {
        texts[0] = prompt ? prompt : "";
        text_lens[0] = prompt ? strlen(prompt) : 0;
    }
    if (dump_logits && nseq > 1) { fatal("--dump-logits takes one prompt, %s holds %d", source, nseq); }
    Sequence* seqs = (Sequence*)callocCheck(nseq, sizeof(Sequence));
    int total_tokens = 0, longest = 0;
    for (int i = 0; i < nseq; i++) {
        Sequence* s = &seqs[i];
        size_t bad = 0;
        if (!utf8_valid(texts[i], text_lens[i], &bad)) {
            if (prompt_file) { fatal("the prompt (%s, line %d) is not valid UTF-8 at byte %zu", source, i + 1, bad); }
            fatal("the prompt (%s) is not valid UTF-8 at byte %zu", source, bad);
        }
        s->text = texts[i];
        s->len = text_lens[i];
        // documents start with end-of-text in the training data (and bos = eos = <|endoftext|> in SmolLM2's), so prompts do too
        size_t cap = 0;
        tokenizer_push(tok.eot_token, &s->ids, &s->n_ids, &cap);
        tokenizer_encode(&tok, s->text, s->len, &s->ids, &s->n_ids, &cap);
        if ((int)s->n_ids >= config.max_seq_len) {
            fatal("prompt %d is %zu tokens, the model's max_seq_len is %d", i + 1, s->n_ids, config.max_seq_len);
        }
        s->stop = "token limit";
        s->rng = (uint64_t)seed + (uint64_t)i;
        total_tokens += (int)s->n_ids;
        if ((int)s->n_ids > longest) { longest = (int)s->n_ids; }
    }
    if (!quiet) {
        if (use_gpu) {
            fprintf(stderr, "model: %s (step %d, %d layers, D %d, H %d) on the GPU (%s), FFN %s, bf16\n", model_path,
                    step, config.num_layers, config.channels, config.hidden, gpu_name, ffn_name);
        } else {
            fprintf(stderr, "model: %s (step %d, %d layers, D %d, H %d) on the CPU reference path%s\n", model_path, step,
                    config.num_layers, config.channels, config.hidden, gpus ? "" : " (no CUDA GPU present)");
        }
    }

    GenerateOptions o;
    o.tok = &tok;
    o.sampler = (SamplerConfig){temperature, top_k, top_p};
    o.scratch = (ProbIndex*)mallocCheck(config.vocab_size * sizeof(ProbIndex));
    o.dump = dump_logits ? fopenCheck(dump_logits, "wb") : NULL;
    o.max_tokens = max_tokens;
    o.max_seq_len = config.max_seq_len;
    o.stream = nseq == 1;
    if (o.stream && !quiet) { fwrite(texts[0], 1, text_lens[0], stdout); }
    double t0 = now_seconds(), prefill_s = 0;
    if (use_gpu) {
        GpuModel m;
        long long cache_len = (long long)longest + max_tokens;
        gpu_model_create(&m, &config, nseq, total_tokens, cache_len < config.max_seq_len ? (int)cache_len : config.max_seq_len);
        m.ffn = ffn;
        m.use_graph = graph;
        m.twell_min_rows = twell_min_rows;
        gpu_model_upload(&m, params);
        free(params);
        params = NULL;
        t0 = now_seconds();
        generate_gpu(&m, seqs, nseq, &o, &prefill_s);
        if (!quiet && m.regrows) { fprintf(stderr, "TwELL grew its buffers %lld times (each reran a layer)\n", m.regrows); }
        gpu_model_free(&m);
    } else {
        free(params);
        params = NULL;
        generate_cpu(&model, seqs, nseq, &o, &prefill_s);
    }
    double decode_s = now_seconds() - t0 - prefill_s;
    int generated = 0;
    for (int i = 0; i < nseq; i++) { generated += seqs[i].generated; }
    if (o.stream) {
        printf("\n");
    } else { // a batch: each sequence on its own, in order
        for (int i = 0; i < nseq; i++) {
            printf("[%d] ", i + 1);
            if (!quiet) { fwrite(seqs[i].text, 1, seqs[i].len, stdout); }
            fwrite(seqs[i].out, 1, seqs[i].out_len, stdout);
            printf("\n");
        }
    }
    if (o.dump) { fcloseCheck(o.dump); }
    if (!quiet) {
        if (nseq == 1) {
            fprintf(stderr, "prompt %zu tokens in %.1f ms | generated %d tokens at %.1f tok/s | stopped at %s\n",
                    seqs[0].n_ids, prefill_s * 1000, generated, generated / decode_s, seqs[0].stop);
        } else {
            int eot = 0, limit = 0, full = 0;
            for (int i = 0; i < nseq; i++) {
                eot += strcmp(seqs[i].stop, "end of text") == 0;
                limit += strcmp(seqs[i].stop, "token limit") == 0;
                full += strcmp(seqs[i].stop, "max_seq_len") == 0;
            }
            fprintf(stderr, "%d prompts, %d tokens in %.1f ms | generated %d tokens at %.1f tok/s | stopped: %d at end "
                    "of text, %d at the token limit, %d at max_seq_len\n", nseq, total_tokens, prefill_s * 1000,
                    generated, generated / decode_s, eot, limit, full);
        }
    }

    for (int i = 0; i < nseq; i++) { free(seqs[i].ids); free(seqs[i].out); }
    free(seqs);
    free(o.scratch);
    free(texts);
    free(text_lens);
    free(buf);
    tokenizer_free(&tok);
    if (!use_gpu) { gpt_free(&model); }
    return 0;
}
