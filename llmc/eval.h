/*
 Multiple-choice evaluation (HellaSwag, as llm.c evaluates it) of a model on a
 tokenized set (llmc/evalset.h). Each ending k of an example is scored by the
 loss the model gives its tokens after the context,

     nll_k = - sum_i log p(ending_k[i] | context, ending_k[0..i)),

 and the model chooses the ending with the lowest nll_k ("acc") or the lowest
 nll_k / len_k, the mean per token, which does not favour short endings
 ("acc_norm"); the first such ending on ties. The accuracy is the fraction of
 examples whose choice is the label.

 Rows: ending k of an example is one row, the context followed by the ending,
 padded to T positions. Rows are packed B to a forward of B x T (the trainer's
 micro-batch shape: its activations are sized for it), several examples to a
 forward, and an example's rows may span two forwards, so any B works. The
 forward is gpt_forward with targets on either backend, which leaves each
 position's loss in model->acts.losses; the losses at the positions that
 predict the ending's tokens are summed on the host in double, in order. A
 context that does not fit T beside the example's longest ending loses tokens
 from its left, the same for all the example's endings, and such examples are
 counted. With P processes, process r scores examples r, r + P, r + 2P, ...
 and the caller sums the counts (the trainer over NCCL).

 The forwards add to the model's loss and sparsity sums (gpt_stats_reset
 starts new ones), as a validation's do. eval_checkpoint is `infer --eval`.
*/
#ifndef LLMC_EVAL_H
#define LLMC_EVAL_H

#include <signal.h>
#include "llmc/checkpoint.h"
#include "llmc/evalset.h"
#include "llmc/gpt.h"
#include "llmc/logger.h"

typedef struct {
    int examples;      // scored
    int correct;       // acc: the lowest summed loss is the label
    int correct_norm;  // acc_norm: the lowest mean loss per token is the label
    int truncated;     // contexts cut from the left to fit T
} EvalCounts;

typedef struct {
    int examples;            // the first `examples` of the set are scored (at most its count)
    int rank, processes;     // this process scores examples rank, rank + processes, ...
    int B, T;                // rows per forward, positions per row
    const volatile sig_atomic_t* stop; // NULL, or a flag that ends the scoring early once it is set
    FILE* progress;          // NULL, or where a line "<label>: 42% | ETA 1m10s" goes every 5 seconds
    const char* label;
} EvalRun;

// one example's choices from its endings' summed losses nll[K] and token counts len[K]
static inline void eval_choose(const double* nll, const size_t* len, int K, int* choice, int* choice_norm) {
    *choice = *choice_norm = 0;
    for (int k = 1; k < K; k++) {
        if (nll[k] < nll[*choice]) { *choice = k; }
        if (nll[k] / len[k] < nll[*choice_norm] / len[*choice_norm]) { *choice_norm = k; }
    }
}

// the context tokens of example i that its rows keep: all of them, or the last ones that leave room for the
// longest ending in T positions (a row of n tokens fills n - 1 positions: the last token is only predicted)
static inline size_t eval_context_kept(const EvalSet* s, int i, int T) {
    size_t n_ctx, longest = 0;
    evalset_list(s, i, 0, &n_ctx);
    for (int k = 0; k < s->num_endings; k++) {
        size_t n;
        evalset_list(s, i, 1 + k, &n);
        if (n > longest) { longest = n; }
    }
    size_t room = (size_t)T + 1 - longest; // eval_check: longest <= T, so at least one token of context
    return n_ctx < room ? n_ctx : room;
}

// before any forward: the set's tokens are the model's (vocab_size), and every ending of the first `examples`
// fits T positions after a token of context
static inline void eval_check(const EvalSet* s, const char* path, int examples, int vocab_size, int T) {
    if (s->vocab_size > vocab_size) {
        fatal("%s was tokenized for a vocabulary of %d tokens, the model has %d: tokenize it with the model's "
              "tokenizer", path, s->vocab_size, vocab_size);
    }
    for (int i = 0; i < examples; i++) {
        for (int k = 0; k < s->num_endings; k++) {
            size_t n;
            evalset_list(s, i, 1 + k, &n);
            if (n > (size_t)T) {
                fatal("%s: example %d's ending %d is %zu tokens, more than the %d positions of a row can score after "
                      "a token of context: a longer sequence length, or fewer examples", path, i, k, n, T);
            }
        }
    }
}

// Scores this process's share of the examples and counts its right choices. nll, if not NULL, receives the
// summed loss of every ending of this process's examples in order ([share x K]).
template <typename T, typename G>
EvalCounts eval_score(GPT<T, G>* model, const EvalSet* s, const EvalRun* run, double* nll) {
    int K = s->num_endings, B = run->B, T_ = run->T, M = B * T_, P = run->processes;
    int share = run->examples > run->rank ? (run->examples - run->rank + P - 1) / P : 0;
    size_t rows = (size_t)share * K;
    double* sums = nll ? nll : (double*)mallocCheck((rows ? rows : 1) * sizeof(double));
    int* host = (int*)mallocCheck(2 * (size_t)M * sizeof(int)); // inputs, then targets
    int* dev = (int*)device_malloc(2 * (size_t)M * sizeof(int), model->device);
    G* losses = (G*)mallocCheck((size_t)M * sizeof(G));
    long* row_of = (long*)mallocCheck(B * sizeof(long));  // the row each sequence of the batch holds, -1: none
    size_t* first = (size_t*)mallocCheck(B * sizeof(size_t)); // its position that predicts the ending's first token
    EvalCounts c = {0, 0, 0, 0};
    double start = now_seconds(), shown = start;
    size_t next = 0;
    while (next < rows && !(run->stop && *run->stop)) {
        memset(host, 0, 2 * (size_t)M * sizeof(int)); // padding: token 0, whose losses nothing reads
        for (int b = 0; b < B; b++, next++) {
            row_of[b] = next < rows ? (long)next : -1;
            if (next >= rows) { continue; }
            int i = run->rank + (int)(next / K) * P, k = (int)(next % K);
            size_t n_ctx, n_end;
            const int* ctx = evalset_list(s, i, 0, &n_ctx);
            const int* end = evalset_list(s, i, 1 + k, &n_end);
            size_t kept = eval_context_kept(s, i, T_);
            int* in = host + (size_t)b * T_;
            int* target = host + M + (size_t)b * T_;
            // the row's tokens: ctx[n_ctx - kept ..], then the ending; position p reads token p, predicts p + 1
            for (size_t p = 0; p + 1 < kept + n_end; p++) {
                in[p] = p < kept ? ctx[n_ctx - kept + p] : end[p - kept];
                target[p] = p + 1 < kept ? ctx[n_ctx - kept + p + 1] : end[p + 1 - kept];
            }
            first[b] = kept - 1;
        }
        device_upload(dev, host, 2 * (size_t)M * sizeof(int), model->device);
        gpt_forward(model, dev, dev + M, B, T_, 0.0f);
        device_copy(losses, model->acts.losses, (size_t)M * sizeof(G), model->device);
        for (int b = 0; b < B && row_of[b] >= 0; b++) {
            size_t n_end;
            evalset_list(s, run->rank + (int)(row_of[b] / K) * P, 1 + (int)(row_of[b] % K), &n_end);
            double sum = 0;
            for (size_t p = 0; p < n_end; p++) { sum += (double)losses[(size_t)b * T_ + first[b] + p]; }
            sums[row_of[b]] = sum;
        }
        double now = now_seconds();
        if (run->progress && now - shown >= 5 && next < rows) {
            char eta[32];
            format_duration(eta, sizeof(eta), (now - start) / next * (rows - next));
            fprintf(run->progress, "%s: %.0f%% | ETA %s\n", run->label, 100.0 * next / rows, eta);
            fflush(run->progress);
            shown = now;
        }
    }
    // the examples whose every ending was scored (all of them unless stopped)
    size_t done = next < rows ? next : rows;
    for (size_t j = 0; (j + 1) * K <= done; j++) {
        int i = run->rank + (int)j * P, choice, choice_norm;
        size_t len[EVALSET_MAX_ENDINGS], n_ctx;
        for (int k = 0; k < K; k++) { evalset_list(s, i, 1 + k, &len[k]); }
        eval_choose(sums + j * K, len, K, &choice, &choice_norm);
        evalset_list(s, i, 0, &n_ctx);
        c.examples++;
        c.truncated += eval_context_kept(s, i, T_) < n_ctx;
        c.correct += choice == s->labels[i];
        c.correct_norm += choice_norm == s->labels[i];
    }
    if (!nll) { free(sums); }
    free(host);
    device_free(dev, model->device);
    free(losses);
    free(row_of);
    free(first);
    return c;
}

// "acc_norm 0.2950 (acc 0.2900, 1000 examples of FILE, 3 contexts cut to fit)": what the trainer and infer print
static inline void eval_describe(char* out, size_t len, const EvalCounts* c, const char* path) {
    double n = c->examples > 0 ? c->examples : 1;
    char cut[64] = "";
    if (c->truncated) {
        snprintf(cut, sizeof(cut), ", %d context%s cut to fit", c->truncated, c->truncated > 1 ? "s" : "");
    }
    snprintf(out, len, "acc_norm %.4f (acc %.4f, %d examples of %s%s)", c->correct_norm / n, c->correct / n,
             c->examples, path, cut);
}

// infer --eval: the model file's accuracy on the first `examples` of the set at eval_path (0: all), B rows per
// forward of as many positions as the longest row needs (at most max_seq_len), on the GPU (bf16, dense FFN) or
// the CPU reference path; the result on stdout, the model on stderr unless quiet
static inline void eval_checkpoint(const char* model_path, const char* eval_path, int examples, int B, int use_gpu,
                                   int quiet) {
    GPTConfig config;
    int step = 0;
    float* params = checkpoint_load_model(model_path, &config, &step);
    EvalSet set;
    evalset_load(&set, eval_path);
    if (examples == 0 || examples > set.num_examples) { examples = set.num_examples; }
    size_t longest = 2; // positions of the longest row (and at least 2, as training has)
    for (int i = 0; i < examples; i++) {
        size_t n_ctx, n;
        evalset_list(&set, i, 0, &n_ctx);
        for (int k = 0; k < set.num_endings; k++) {
            evalset_list(&set, i, 1 + k, &n);
            if (n_ctx + n - 1 > longest) { longest = n_ctx + n - 1; }
        }
    }
    int T = longest < (size_t)config.max_seq_len ? (int)longest : config.max_seq_len;
    eval_check(&set, eval_path, examples, config.vocab_size, T);
    if (!quiet) {
        fprintf(stderr, "model: %s (step %d, %d layers, D %d, H %d) on %s | %d examples, %d rows of %d positions per "
                "forward\n", model_path, step, config.num_layers, config.channels, config.hidden,
                use_gpu ? "the GPU (bf16, dense FFN)" : "the CPU reference path", examples, B, T);
    }
    EvalRun run = {examples, 0, 1, B, T, NULL, quiet ? NULL : stderr, "eval"};
    EvalCounts c;
    if (use_gpu) {
#ifdef __CUDACC__
        GPT<bf16, float> model;
        gpt_build(&model, &config, DEVICE_CUDA);
        gpt_load_params(&model, params);
        c = eval_score(&model, &set, &run, (double*)NULL);
        gpt_free(&model);
#else
        fatal("this build has no CUDA path");
#endif
    } else {
        GPT<float, float> model;
        gpt_build(&model, &config, DEVICE_CPU);
        gpt_load_params(&model, params);
        c = eval_score(&model, &set, &run, (double*)NULL);
        gpt_free(&model);
    }
    char line[4400];
    eval_describe(line, sizeof(line), &c, eval_path);
    printf("eval %s\n", line);
    free(params);
    evalset_free(&set);
}

#endif // LLMC_EVAL_H
