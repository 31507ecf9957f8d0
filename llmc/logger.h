/*
 The training log: one console line per optimizer step, and the same numbers
 as one JSON object per line in <output dir>/log.jsonl, with the per-layer
 sparsity statistics (mean and max L0, dead fraction) as arrays.
*/
#ifndef LLMC_LOGGER_H
#define LLMC_LOGGER_H

#include <stdio.h>
#include <stdlib.h>
#include "llmc/model.h"
#include "llmc/utils.h"

typedef struct {
    int step;
    double loss, ce, l1;   // l1 = lambda * the L1 term, so loss = ce + l1
    double lr, grad_norm, tok_per_s, ms;
    double mfu, mem_gib;   // GPU only: model FLOPs utilisation and peak device memory (< 0: not shown)
    int num_layers, hidden;
    const LayerStats* layers; // [L]
} StepLog;

static inline void log_step(const char* path, const StepLog* e, int max_steps) {
    double l0 = 0, dead = 0;
    int l0_max = 0;
    for (int l = 0; l < e->num_layers; l++) {
        l0 += e->layers[l].l0_mean / e->num_layers;
        dead += e->layers[l].dead / e->num_layers;
        if (e->layers[l].l0_max > l0_max) { l0_max = e->layers[l].l0_max; }
    }
    printf("step %5d/%d | loss %.4f | ce %.4f | l1 %.4f | l0 %.1f/%d (max %d) | dead %.1f%% | lr %.2e | norm %.3f | %.0f tok/s",
           e->step, max_steps, e->loss, e->ce, e->l1, l0, e->hidden, l0_max, 100 * dead, e->lr, e->grad_norm,
           e->tok_per_s);
    if (e->mfu >= 0) { printf(" | MFU %.1f%% | %.1f GiB", 100 * e->mfu, e->mem_gib); }
    printf(" | %.0f ms\n", e->ms);
    fflush(stdout);
    FILE* fp = fopenCheck(path, "a");
    fprintf(fp, "{\"type\":\"train\",\"step\":%d,\"loss\":%.9g,\"ce\":%.9g,\"l1\":%.9g,\"l0_mean\":%.6g,\"l0_max\":%d,"
                "\"dead\":%.6g,\"lr\":%.9g,\"grad_norm\":%.9g,\"tok_per_s\":%.1f,\"ms\":%.3f",
            e->step, e->loss, e->ce, e->l1, l0, l0_max, dead, e->lr, e->grad_norm, e->tok_per_s, e->ms);
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

static inline void log_val(const char* path, int step, double val_ce) {
    FILE* fp = fopenCheck(path, "a");
    fprintf(fp, "{\"type\":\"val\",\"step\":%d,\"val_ce\":%.9g}\n", step, val_ce);
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
