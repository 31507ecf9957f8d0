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

 Backends: the CPU reference path runs everywhere; the GPU path with the TwELL
 sparse kernels is the project's next step.
*/
#include <cuda_runtime.h>
#include <time.h>
#include <unistd.h>

#include "llmc/checkpoint.h"
#include "llmc/cli.h"
#include "llmc/dataloader.h"
#include "llmc/gpt.h"
#include "llmc/sampler.h"
#include "llmc/tokenizer.h"

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

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

int main(int argc, char** argv) {
    const char* model_path = "out/model_00002000.bin";
    const char* prompt = NULL;
    const char* prompt_file = NULL;
    const char* tokenizer_path = TOKENIZER_DEFAULT_PATH;
    const char* analyze_pattern = NULL;
    const char* analyze_out = NULL;
    const char* dump_logits = NULL;
    int max_tokens = 256, top_k = 0, seed = 42, quiet = 0;
    int analyze_batches = 16, analyze_batch = 4, analyze_seq_len = 0, analyze_min_count = 10, analyze_top = 20;
    float temperature = 1.0f, top_p = 1.0f;
    ArgSpec specs[] = {
        {'m', "model", ARG_STRING, &model_path, 0, 0, "model checkpoint written by train_gpt_sparse", 0},
        {'p', "prompt", ARG_STRING, &prompt, 0, 0, "prompt text (default: stdin if it is not a terminal, else none)", 0},
        {'f', "prompt-file", ARG_STRING, &prompt_file, 0, 0, "read the prompt from this file ('-' = stdin)", 0},
        {'n', "max-tokens", ARG_INT, &max_tokens, 1, 1 << 24, "most tokens to generate", 0},
        {'t', "temperature", ARG_FLOAT, &temperature, 0, 100, "sampling temperature (0 = greedy)", 0},
        {'k', "top-k", ARG_INT, &top_k, 0, 1 << 24, "sample among the k likeliest tokens (0 = all)", 0},
        {0, "top-p", ARG_FLOAT, &top_p, 1e-6, 1, "sample within the smallest set of probability >= p", 0},
        {'s', "seed", ARG_INT, &seed, 0, 2147483647, "sampling seed", 0},
        {0, "tokenizer", ARG_STRING, &tokenizer_path, 0, 0, "tiktoken rank file or Hugging Face tokenizer.json", 0},
        {0, "dump-logits", ARG_STRING, &dump_logits, 0, 0, "write each sampled token's id (int32) and its V logits (fp32) here", 0},
        {'q', "quiet", ARG_INT, &quiet, 0, 1, "1 = print only the generated text, no prompt or statistics", 0},
        {0, "analyze", ARG_STRING, &analyze_pattern, 0, 0, "instead of generating, measure FFN sparsity on these shards (a glob)", 0},
        {0, "analyze-batches", ARG_INT, &analyze_batches, 1, 1 << 30, "batches to analyze (capped at what the shards hold)", 0},
        {0, "analyze-batch", ARG_INT, &analyze_batch, 1, 1 << 16, "sequences per analyzed batch", 0},
        {0, "analyze-seq-len", ARG_INT, &analyze_seq_len, 0, 1 << 20, "tokens per sequence (0 = the model's max_seq_len)", 0},
        {0, "analyze-min-count", ARG_INT, &analyze_min_count, 1, 1 << 30, "rank only token ids seen at least this often", 0},
        {0, "analyze-top", ARG_INT, &analyze_top, 1, 1 << 20, "tokens in each of the most and least active lists", 0},
        {0, "analyze-out", ARG_STRING, &analyze_out, 0, 0, "also write the analysis as JSON to this file", 0},
    };
    int num_specs = (int)(sizeof(specs) / sizeof(specs[0]));
    cli_parse(argc, argv, "usage: ./infer [flags]\nGenerates text with a train_gpt_sparse checkpoint, or with --analyze,\n"
              "measures the sparsity of its FFN activations on shards of text.", specs, num_specs);
    if (prompt && prompt_file) { fatal("give the prompt with --prompt or --prompt-file, not both"); }
    if (analyze_pattern && (prompt || prompt_file)) { fatal("--analyze reads shards, not a prompt: drop --prompt/--prompt-file"); }
    if (analyze_pattern && dump_logits) { fatal("--dump-logits writes the logits of generation: drop --analyze"); }
    if (analyze_pattern == NULL) {
        const char* needs[] = {"analyze-batches", "analyze-batch", "analyze-seq-len", "analyze-min-count", "analyze-top", "analyze-out"};
        for (size_t i = 0; i < sizeof(needs) / sizeof(needs[0]); i++) {
            if (cli_given(specs, num_specs, needs[i])) { fatal("--%s needs --analyze", needs[i]); }
        }
    }

    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess) { gpus = 0; }

    GPTConfig config;
    int step = 0;
    float* params = checkpoint_load_model(model_path, &config, &step);
    GPT<float, float> model;
    gpt_build(&model, &config, DEVICE_CPU);
    memcpy(model.params, params, model.num_parameters * sizeof(float));
    free(params);

    Tokenizer tok;
    tokenizer_load(&tok, tokenizer_path);
    if (tok.vocab_size != config.vocab_size) {
        fatal("%s has %d tokens but the model %s has vocab_size %d", tokenizer_path, tok.vocab_size, model_path,
              config.vocab_size);
    }

    if (analyze_pattern) {
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

    // the prompt: argument, file, or piped stdin
    size_t prompt_len = 0;
    char* prompt_buf = NULL;
    const char* prompt_name = "--prompt";
    if (prompt_file) {
        FILE* fp = strcmp(prompt_file, "-") == 0 ? stdin : fopenCheck(prompt_file, "rb");
        prompt_name = strcmp(prompt_file, "-") == 0 ? "stdin" : prompt_file;
        prompt_buf = read_all(fp, prompt_name, &prompt_len);
        if (fp != stdin) { fcloseCheck(fp); }
        prompt = prompt_buf;
    } else if (prompt == NULL && !isatty(STDIN_FILENO)) {
        prompt_name = "stdin";
        prompt_buf = read_all(stdin, prompt_name, &prompt_len);
        prompt = prompt_buf;
    } else if (prompt) {
        prompt_len = strlen(prompt);
    } else {
        prompt = "";
    }
    size_t bad = 0;
    if (!utf8_valid(prompt, prompt_len, &bad)) { fatal("the prompt (%s) is not valid UTF-8 at byte %zu", prompt_name, bad); }

    // documents start with end-of-text in the training data (and bos = eos = <|endoftext|> in SmolLM2's), so prompts do too
    size_t n_ids = 0, cap = 0;
    int* ids = NULL;
    tokenizer_push(tok.eot_token, &ids, &n_ids, &cap);
    tokenizer_encode(&tok, prompt, prompt_len, &ids, &n_ids, &cap);
    if ((int)n_ids >= config.max_seq_len) {
        fatal("the prompt is %zu tokens, the model's max_seq_len is %d", n_ids, config.max_seq_len);
    }
    if (!quiet) {
        fprintf(stderr, "model: %s (step %d, %d layers, D %d, H %d) on the CPU reference path%s\n", model_path, step,
                config.num_layers, config.channels, config.hidden,
                gpus ? " (the GPU path is not built yet)" : " (no CUDA GPU present)");
    }

    InferState<float> state;
    infer_state_alloc(&state, &config, (int)n_ids);
    SamplerConfig sampler = {temperature, top_k, top_p};
    uint64_t rng = (uint64_t)seed;
    ProbIndex* scratch = (ProbIndex*)mallocCheck(config.vocab_size * sizeof(ProbIndex));

    FILE* dump = dump_logits ? fopenCheck(dump_logits, "wb") : NULL;
    if (!quiet) { fwrite(prompt, 1, prompt_len, stdout); }
    double t0 = now_seconds();
    gpt_forward_cached(&model, &state, ids, (int)n_ids, 0);
    double t_prefill = now_seconds();
    int pos = (int)n_ids, generated = 0;
    const char* stop = "token limit";
    while (generated < max_tokens) {
        int token = sample_token(state.logits, config.vocab_size, &sampler, &rng, scratch);
        if (dump) {
            fwriteCheck(&token, sizeof(int), 1, dump);
            fwriteCheck(state.logits, sizeof(float), config.vocab_size, dump);
        }
        if (token == tok.eot_token) { stop = "end of text"; break; }
        size_t len = 0;
        const unsigned char* bytes = tokenizer_decode(&tok, token, &len);
        fwrite(bytes, 1, len, stdout);
        fflush(stdout);
        generated++;
        if (pos == config.max_seq_len) { stop = "max_seq_len"; break; }
        if (generated < max_tokens) { gpt_forward_cached(&model, &state, &token, 1, pos++); }
    }
    double t_end = now_seconds();
    printf("\n");
    if (dump) { fcloseCheck(dump); }
    if (!quiet) {
        fprintf(stderr, "prompt %zu tokens in %.1f ms | generated %d tokens at %.1f tok/s | stopped at %s\n", n_ids,
                (t_prefill - t0) * 1000, generated, generated / (t_end - t_prefill), stop);
    }

    free(scratch);
    free(ids);
    free(prompt_buf);
    infer_state_free(&state);
    tokenizer_free(&tok);
    gpt_free(&model);
    return 0;
}
