/*
 The sparsity analysis of a checkpoint: how many FFN units fire per token in
 each layer, at each position of the sequence, and for each token id (the most
 and the least active tokens), and how unevenly the units fire, measured on
 batches of a shard set read in file order (as the trainer's validation reads
 it, so with its batch shape and count the CE is its val CE). The model runs on
 the CPU reference path (fp32). The report is printed as tables and, with an
 output path, written as one JSON object.

 ./analyze (tools/analyze.cpp) and infer --analyze run it; ANALYZE_FLAGS gives
 both the same flags, named --NAME by the one and --analyze-NAME by the other.
*/
#ifndef LLMC_ANALYZE_H
#define LLMC_ANALYZE_H

#include <algorithm>
#include <vector>
#include "llmc/checkpoint.h"
#include "llmc/cli.h"
#include "llmc/dataloader.h"
#include "llmc/gpt.h"
#include "llmc/tokenizer.h"

typedef struct {
    const char* model_path;     // a model file (not a directory)
    const char* tokenizer_path;
    const char* pattern;        // glob of shards
    const char* out_path;       // JSON copy of the report, or NULL
    int batches, batch, seq_len, min_count, top; // seq_len 0: the model's max_seq_len
    int quiet;                  // 1 = no "model:" line on stderr
    const char* flag_prefix;    // what the caller puts between "--" and a flag's name ("analyze-" in infer), for errors
} AnalyzeOptions;

static inline void analyze_defaults(AnalyzeOptions* o, const char* flag_prefix) {
    memset(o, 0, sizeof(*o));
    o->tokenizer_path = TOKENIZER_DEFAULT_PATH;
    o->batches = 16, o->batch = 4, o->min_count = 10, o->top = 20;
    o->flag_prefix = flag_prefix;
}

// The analysis' flags as rows of a cli.h table, named prefix + NAME (prefix a string literal); with shorts, the
// trainer's letters for the batch shape and -o (infer leaves them out: its letters mean other things)
#define ANALYZE_FLAGS(o, prefix, shorts) \
    {0, prefix "batches", ARG_INT, &(o)->batches, 1, 1 << 30, "batches to analyze (capped at what the shards hold)", 0}, \
    {(shorts) ? 'b' : 0, prefix "batch", ARG_INT, &(o)->batch, 1, 1 << 16, "sequences per analyzed batch", 0}, \
    {(shorts) ? 't' : 0, prefix "seq-len", ARG_INT, &(o)->seq_len, 0, 1 << 20, "tokens per sequence (0 = the model's max_seq_len)", 0}, \
    {0, prefix "min-count", ARG_INT, &(o)->min_count, 1, 1 << 30, "rank only token ids seen at least this often", 0}, \
    {0, prefix "top", ARG_INT, &(o)->top, 1, 1 << 20, "tokens in each of the most and least active lists", 0}, \
    {(shorts) ? 'o' : 0, prefix "out", ARG_STRING, &(o)->out_path, 0, 0, "also write the analysis as JSON to this file", 0}

typedef struct {
    int id, count;
    double l0; // mean over its occurrences of the firing units, averaged over layers
} TokenActivity;

// most active first; ties by id, so the order is deterministic
static inline int token_activity_cmp(const void* a, const void* b) {
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
static inline void write_quoted(FILE* fp, const unsigned char* s, size_t len, int json) {
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

static inline void write_json_string(FILE* fp, const char* s) {
    fputc('"', fp);
    write_quoted(fp, (const unsigned char*)s, strlen(s), 1);
    fputc('"', fp);
}

// positions 0, 1, 2, 3, then 4-7, 8-15, 16-31, ...: bucket k covers [first, last]
static inline int position_buckets(int T, int* first, int* last) {
    int n = 0;
    for (int p = 0; p < T && p < 4; p++) { first[n] = last[n] = p; n++; }
    for (int p = 4; p < T; p *= 2) {
        first[n] = p;
        last[n] = 2 * p - 1 < T - 1 ? 2 * p - 1 : T - 1;
        n++;
    }
    return n;
}

static inline void print_token_rows(const Tokenizer* tok, const TokenActivity* ranked, int n_ranked, int count,
                                    int from_top, int H) {
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

static inline void write_token_json(FILE* fp, const Tokenizer* tok, const TokenActivity* ranked, int n_ranked,
                                    int count, int from_top) {
    for (int r = 0; r < count; r++) {
        const TokenActivity* t = &ranked[from_top ? r : n_ranked - 1 - r];
        size_t len = 0;
        const unsigned char* bytes = tokenizer_decode(tok, t->id, &len);
        fprintf(fp, "%s{\"id\":%d,\"count\":%d,\"l0_mean\":%.6g,\"text\":\"", r ? "," : "", t->id, t->count, t->l0);
        write_quoted(fp, bytes, len, 1);
        fprintf(fp, "\"}");
    }
}

// How a layer's firing is spread, over the analyzed tokens (docs/SPARSE.md: trained models fire unevenly,
// which the hot/cold split uses): each unit's count; and, over blocks of REUSE_BLOCK tokens, the pairs
// (token, unit that fires) per distinct unit, for consecutive tokens of a sequence and for the same
// batch's tokens shuffled
constexpr int REUSE_BLOCK = 128;

typedef struct {
    std::vector<double> count;          // [H]
    double pairs, distinct, distinct_shuffled;
} UnitSpread;

// the units that fire for any of the tokens rows[0..n) of g [*, H], as bits
static inline double distinct_units(const float* g, const int* rows, int n, int H, std::vector<uint64_t>* bits) {
    std::fill(bits->begin(), bits->end(), 0);
    for (int i = 0; i < n; i++) {
        const float* gm = g + (size_t)rows[i] * H;
        for (int u = 0; u < H; u++) { (*bits)[u / 64] |= (uint64_t)(gm[u] > 0) << (u % 64); }
    }
    double d = 0;
    for (uint64_t w : *bits) { d += __builtin_popcountll(w); }
    return d;
}

// adds a batch of B sequences of T tokens (g [B T, H], the layer's gate) to sp
static inline void unit_spread_add(UnitSpread* sp, const float* g, int B, int T, int H, uint64_t* rng) {
    int M = B * T, block = T < REUSE_BLOCK ? T : REUSE_BLOCK;
    std::vector<uint64_t> bits((H + 63) / 64);
    std::vector<int> rows(M);
    for (int m = 0; m < M; m++) {
        for (int u = 0; u < H; u++) { sp->count[u] += g[(size_t)m * H + u] > 0; }
        rows[m] = m;
    }
    for (int b = 0; b < B; b++) {
        for (int t0 = 0; t0 + block <= T; t0 += block) {
            sp->distinct += distinct_units(g, rows.data() + b * T + t0, block, H, &bits);
            for (int m = b * T + t0; m < b * T + t0 + block; m++) {
                for (int u = 0; u < H; u++) { sp->pairs += g[(size_t)m * H + u] > 0; }
            }
        }
    }
    for (int m = M - 1; m > 0; m--) { std::swap(rows[m], rows[rng_below(rng, (uint64_t)m + 1)]); }
    for (int b = 0; b < B; b++) { // the same number of blocks, of shuffled tokens
        for (int t0 = 0; t0 + block <= T; t0 += block) { sp->distinct_shuffled += distinct_units(g, rows.data() + b * T + t0, block, H, &bits); }
    }
}

// the share of the pairs that the busiest eighth of the units hold
static inline double top_eighth_share(const std::vector<double>& count) {
    std::vector<double> c = count;
    std::sort(c.begin(), c.end(), [](double a, double b) { return a > b; });
    double top = 0, all = 0;
    for (size_t i = 0; i < c.size(); i++) {
        all += c[i];
        top += i < c.size() / 8 ? c[i] : 0;
    }
    return all > 0 ? top / all : 0;
}

// the report of the model over the shards in batches of o->batch x T tokens: tables on stdout, the JSON to o->out_path
static inline void analyze(GPT<float, float>* model, const Tokenizer* tok, const AnalyzeOptions* o, int T, int step) {
    const GPTConfig* c = &model->config;
    int L = c->num_layers, H = c->hidden, V = c->vocab_size, B = o->batch, M = B * T;
    DataLoader loader;
    dataloader_init(&loader, o->pattern, B, T, 0, 1, 0, 0, V); // file order, no shuffle
    if (!o->quiet) {
        fprintf(stderr, "model: %s (step %d, %d layers, D %d, H %d) on the CPU reference path\n", o->model_path, step,
                L, c->channels, H);
    }
    size_t available = dataloader_num_batches(&loader);
    int batches = (size_t)o->batches > available ? (int)available : o->batches;
    double* pos_sum = (double*)callocCheck(T, sizeof(double));
    double* tok_sum = (double*)callocCheck(V, sizeof(double));
    int* tok_count = (int*)callocCheck(V, sizeof(int));

    std::vector<UnitSpread> spread(L);
    for (UnitSpread& sp : spread) { sp = {std::vector<double>(H, 0.0), 0, 0, 0}; }
    uint64_t rng = 17;

    double t0 = now_seconds();
    gpt_stats_reset(model);
    for (int i = 0; i < batches; i++) {
        dataloader_next_batch(&loader);
        gpt_forward(model, loader.inputs, loader.targets, B, T, 0.0f);
        for (int l = 0; l < L; l++) { unit_spread_add(&spread[l], model->ffn.layer[l].dense, B, T, H, &rng); }
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
    printf("how unevenly units fire, per layer: the share of the (token, unit) pairs that the busiest eighth of the\n"
           "units hold; per block of %d consecutive tokens, pairs per distinct unit, and the same for the batch's\n"
           "tokens shuffled (their ratio: how much more consecutive tokens share units)\n", T < REUSE_BLOCK ? T : REUSE_BLOCK);
    printf("layer  top 1/8 %%  dead %%  reuse  shuffled  ratio\n");
    for (int l = 0; l < L; l++) {
        const UnitSpread* sp = &spread[l];
        double reuse = sp->pairs / fmax(sp->distinct, 1), shuffled = sp->pairs / fmax(sp->distinct_shuffled, 1);
        printf("%5d %10.1f %7.1f %6.2f %9.2f %6.2f\n", l, 100 * top_eighth_share(sp->count), 100 * model->stats[l].dead,
               reuse, shuffled, reuse / fmax(shuffled, 1e-30));
    }
    printf("\n");
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
        write_json_string(fp, o->model_path);
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
        fprintf(fp, "],\"top_eighth_share\":[");
        for (int l = 0; l < L; l++) { fprintf(fp, "%s%.6g", l ? "," : "", top_eighth_share(spread[l].count)); }
        fprintf(fp, "],\"block_reuse\":[");
        for (int l = 0; l < L; l++) { fprintf(fp, "%s%.6g", l ? "," : "", spread[l].pairs / fmax(spread[l].distinct, 1)); }
        fprintf(fp, "],\"block_reuse_shuffled\":[");
        for (int l = 0; l < L; l++) {
            fprintf(fp, "%s%.6g", l ? "," : "", spread[l].pairs / fmax(spread[l].distinct_shuffled, 1));
        }
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

// the checkpoint of o->model_path on the CPU reference path over the shards
static inline void analyze_checkpoint(const AnalyzeOptions* o) {
    GPTConfig config;
    int step = 0;
    Tokenizer tok;
    float* params = checkpoint_load_model(o->model_path, &config, &step);
    tokenizer_load_for_model(&tok, o->tokenizer_path, config.vocab_size, o->model_path);
    GPT<float, float> model;
    gpt_build(&model, &config, DEVICE_CPU);
    gpt_load_params(&model, params);
    free(params);
    int T = o->seq_len ? o->seq_len : config.max_seq_len;
    if (T > config.max_seq_len || T < 2) {
        fatal("--%sseq-len %d: the model %s takes 2 to %d tokens", o->flag_prefix, T, o->model_path, config.max_seq_len);
    }
    if ((long long)o->batch * T > (1 << 24)) {
        fatal("--%sbatch %d x %d tokens is too many for one batch (at most %d)", o->flag_prefix, o->batch, T, 1 << 24);
    }
    analyze(&model, &tok, o, T, step);
    tokenizer_free(&tok);
    gpt_free(&model);
}

#endif // LLMC_ANALYZE_H
