/*
 Picking the next token from logits: temperature, top-k, top-p (nucleus), and
 greedy at temperature 0. Only the first V logits (the real vocabulary) are
 ever candidates. Deterministic for a given RNG state.
*/
#ifndef LLMC_SAMPLER_H
#define LLMC_SAMPLER_H

#include <math.h>
#include <stdlib.h>
#include "llmc/rng.h"
#include "llmc/utils.h"

typedef struct {
    float temperature; // 0 = greedy
    int top_k;         // 0 = all
    float top_p;       // 1 = all
} SamplerConfig;

typedef struct { float prob; int id; } ProbIndex;

static inline int compare_prob_desc(const void* a, const void* b) {
    const ProbIndex* x = (const ProbIndex*)a;
    const ProbIndex* y = (const ProbIndex*)b;
    if (x->prob != y->prob) { return x->prob > y->prob ? -1 : 1; }
    return x->id - y->id; // ties in id order so the result never depends on qsort
}

// greedy decoding's token: the first index of the largest of the V logits; -1 where one is not finite
// (the GPU's greedy_kernel, llmc/cuda_classifier.cuh, gives the same)
template <typename T>
int logits_greedy(const T* logits, int V) {
    int best = 0;
    for (int i = 0; i < V; i++) {
        float x = (float)logits[i];
        if (!isfinite(x)) { return -1; }
        if (x > (float)logits[best]) { best = i; }
    }
    return best;
}

// scratch must hold V entries
template <typename T>
int sample_token(const T* logits, int V, const SamplerConfig* cfg, uint64_t* rng, ProbIndex* scratch) {
    int best = 0;
    for (int i = 1; i < V; i++) { if (logits[i] > logits[best]) { best = i; } }
    if (cfg->temperature <= 0) { return best; }
    double sum = 0;
    for (int i = 0; i < V; i++) {
        scratch[i].prob = (float)exp(((double)logits[i] - (double)logits[best]) / cfg->temperature);
        scratch[i].id = i;
        sum += scratch[i].prob;
    }
    int n = V;
    if ((cfg->top_k > 0 && cfg->top_k < V) || cfg->top_p < 1.0f) {
        qsort(scratch, V, sizeof(ProbIndex), compare_prob_desc);
        if (cfg->top_k > 0 && cfg->top_k < n) { n = cfg->top_k; }
        double kept = 0;
        for (int i = 0; i < n; i++) { kept += scratch[i].prob; }
        if (cfg->top_p < 1.0f) {
            double cumulative = 0;
            for (int i = 0; i < n; i++) {
                cumulative += scratch[i].prob;
                if (cumulative >= cfg->top_p * kept) { n = i + 1; break; }
            }
        }
        sum = 0;
        for (int i = 0; i < n; i++) { sum += scratch[i].prob; }
    }
    double r = rng_uniform(rng) * sum, cumulative = 0;
    for (int i = 0; i < n; i++) {
        cumulative += scratch[i].prob;
        if (r < cumulative) { return scratch[i].id; }
    }
    return scratch[n - 1].id;
}

#endif // LLMC_SAMPLER_H
