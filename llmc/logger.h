/*
 The training log: one console line per optimizer step, and the same numbers
 as one JSON object per line in <output dir>/log.jsonl, with the per-layer
 sparsity statistics (mean and max L0, dead fraction) as arrays. A step skipped
 for a non-finite loss or gradient norm is a "skip" line (JSON has no NaN: a
 non-finite value is null); validations and evaluations have lines of their own.
*/
#ifndef LLMC_LOGGER_H
#define LLMC_LOGGER_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "llmc/model.h"
#include "llmc/utils.h"

typedef struct {
    int step;
    double loss, ce, l1;   // l1 = lambda * the L1 term, so loss = ce + l1
    double lambda;         // this step's lambda (less than the run's while --l1-ramp ramps it)
    int show_lambda;       // 1: the console line shows lambda (a ramped run)
    double lr, grad_norm, tok_per_s, ms;
    double mfu, mem_gib;   // GPU only: model FLOPs utilisation and peak device memory (< 0: not shown)
    double eta_s;          // seconds the rest of the run will take (< 0: not shown)
    int num_layers, hidden;
    const LayerStats* layers; // [L]
} StepLog;

// a duration for people: 41s, 9m41s, 2h05m
static inline void format_duration(char* out, size_t len, double seconds) {
    long s = seconds < 0 ? 0 : (long)(seconds + 0.5);
    if (s < 60) { snprintf(out, len, "%lds", s); }
    else if (s < 3600) { snprintf(out, len, "%ldm%02lds", s / 60, s % 60); }
    else { snprintf(out, len, "%ldh%02ldm", s / 3600, (s % 3600) / 60); }
}

static inline void log_step(const char* path, const StepLog* e, int max_steps) {
    double l0 = 0, dead = 0;
    int l0_max = 0;
    for (int l = 0; l < e->num_layers; l++) {
        l0 += e->layers[l].l0_mean / e->num_layers;
        dead += e->layers[l].dead / e->num_layers;
        if (e->layers[l].l0_max > l0_max) { l0_max = e->layers[l].l0_max; }
    }
    printf("step %5d/%d | loss %.4f | ce %.4f | l1 %.4f", e->step, max_steps, e->loss, e->ce, e->l1);
    if (e->show_lambda) { printf(" | lambda %.2e", e->lambda); }
    printf(" | l0 %.1f/%d (max %d) | dead %.1f%% | lr %.2e | norm %.3f | %.0f tok/s", l0, e->hidden, l0_max, 100 * dead,
           e->lr, e->grad_norm, e->tok_per_s);
    if (e->mfu >= 0) { printf(" | MFU %.1f%% | %.1f GiB", 100 * e->mfu, e->mem_gib); }
    printf(" | %.0f ms", e->ms);
    if (e->eta_s >= 0) {
        char eta[32];
        format_duration(eta, sizeof(eta), e->eta_s);
        printf(" | ETA %s", eta);
    }
    printf("\n");
    fflush(stdout);
    FILE* fp = fopenCheck(path, "a");
    fprintf(fp, "{\"type\":\"train\",\"step\":%d,\"loss\":%.9g,\"ce\":%.9g,\"l1\":%.9g,\"lambda\":%.9g,\"l0_mean\":%.6g,"
                "\"l0_max\":%d,\"dead\":%.6g,\"lr\":%.9g,\"grad_norm\":%.9g,\"tok_per_s\":%.1f,\"ms\":%.3f",
            e->step, e->loss, e->ce, e->l1, e->lambda, l0, l0_max, dead, e->lr, e->grad_norm, e->tok_per_s, e->ms);
    if (e->mfu >= 0) { fprintf(fp, ",\"mfu\":%.4f,\"mem_gib\":%.3f", e->mfu, e->mem_gib); }
    fprintf(fp, ",\"layers\":{\"l0_mean\":[");
    for (int l = 0; l < e->num_layers; l++) { fprintf(fp, "%s%.6g", l ? "," : "", e->layers[l].l0_mean); }
    fprintf(fp, "],\"l0_max\":[");
    for (int l = 0; l < e->num_layers; l++) { fprintf(fp, "%s%d", l ? "," : "", e->layers[l].l0_max); }
    fprintf(fp, "],\"dead\":[");
    for (int l = 0; l < e->num_layers; l++) { fprintf(fp, "%s%.6g", l ? "," : "", e->layers[l].dead); }
    fprintf(fp, "]}}\n");
    fcloseCheck(fp);
}

// step `step` was skipped (weights and moments unchanged): the `in_row`-th of at most `limit` in a row
static inline void log_skip(const char* path, int step, int max_steps, double loss, double grad_norm, int in_row,
                            int limit) {
    printf("step %5d/%d | loss %.4f | norm %.3f | skipped: not finite, weights and moments unchanged (%d in a row; "
           "the run stops after %d)\n", step, max_steps, loss, grad_norm, in_row, limit);
    fflush(stdout);
    FILE* fp = fopenCheck(path, "a");
    fprintf(fp, "{\"type\":\"skip\",\"step\":%d", step);
    const char* names[2] = {"loss", "grad_norm"};
    double values[2] = {loss, grad_norm};
    for (int i = 0; i < 2; i++) {
        if (isfinite(values[i])) { fprintf(fp, ",\"%s\":%.9g", names[i], values[i]); }
        else { fprintf(fp, ",\"%s\":null", names[i]); }
    }
    fprintf(fp, "}\n");
    fcloseCheck(fp);
}

// the validation of step `step`: its CE over `tokens` tokens
static inline void log_val(const char* path, int step, double val_ce, long tokens) {
    FILE* fp = fopenCheck(path, "a");
    fprintf(fp, "{\"type\":\"val\",\"step\":%d,\"val_ce\":%.9g,\"tokens\":%ld}\n", step, val_ce, tokens);
    fcloseCheck(fp);
}

// a multiple-choice evaluation (llmc/eval.h): accuracies by summed and by mean loss, of n examples, `truncated`
// of them with their context cut to fit
static inline void log_eval(const char* path, int step, double acc, double acc_norm, int n, int truncated) {
    FILE* fp = fopenCheck(path, "a");
    fprintf(fp, "{\"type\":\"eval\",\"step\":%d,\"acc\":%.9g,\"acc_norm\":%.9g,\"n\":%d,\"truncated\":%d}\n", step, acc,
            acc_norm, n, truncated);
    fcloseCheck(fp);
}

// On resume from step s the log keeps its entries up to step s (those after it
// are redone); a fresh run (s = -1) starts an empty log. Rewritten atomically.
static inline void log_truncate_after_step(const char* path, int s) {
    FILE* in = fopen(path, "r");
    char tmp[4096];
    FILE* out = atomic_open(path, tmp, sizeof(tmp));
    if (in) {
        char line[65536];
        while (s >= 0 && fgets(line, sizeof(line), in)) {
            int step = -1;
            const char* p = strstr(line, "\"step\":");
            if (p) { step = atoi(p + 7); }
            if (step <= s) { fputs(line, out); }
        }
        fclose(in);
    }
    atomic_commit(out, tmp, path);
}

#endif // LLMC_LOGGER_H
