/*
 Synthetic sparsity, for tests and benchmarks only (docs/SPARSE.md,
 "Measuring"; never written into a checkpoint). A unit n fires with about the
 probability p_n we choose when its gate's bias is -t_n, t_n = Phi^-1(1 - p_n),
 on a pre-activation of unit variance; our model has no biases, so a constant
 input feature (the last one, a "carrier") takes their place:
 - FFN inputs: f rows N(0, 1) with the last feature a bias carrier of 1; Wg
   rows N(0, 1/(D-1)) with the last column -t_n. uniform: p_n = k / H.
   realistic: p_n log-normal (sigma 1.5) with mean k / H, capped at 0.5, 30% of
   units never firing, and the carrier 0.5 on the first 1% of rows (which then
   fire many times the mean). Wu N(0, 1/D), WdT N(0, 1/H).
 - a whole model (init_params_synthetic_sparse): gates that fire for about k of
   H units per token in every layer from the first step.
*/
#ifndef LLMC_SYNTHETIC_H
#define LLMC_SYNTHETIC_H

#include <math.h>
#include <stdint.h>
#include "llmc/gpt.h"
#include "llmc/rng.h"
#include "llmc/utils.h"

// Phi^-1(q), the standard normal quantile, by bisection on the normal CDF (host, once per unit at most)
static inline double normal_quantile(double q) {
    double lo = -40, hi = 40;
    for (int i = 0; i < 200; i++) {
        double mid = 0.5 * (lo + hi);
        if (0.5 * erfc(-mid / sqrt(2.0)) < q) { lo = mid; } else { hi = mid; }
    }
    return 0.5 * (lo + hi);
}

// M rows of FFN inputs f [M, D] and one layer's weights for about k of H units per row (see the top)
static inline void sparse_synthetic_ffn(float* f, float* wg, float* wu, float* wdT, int M, int D, int H, double k,
                                        int realistic, uint64_t seed) {
    uint64_t rng = seed;
    double* p = (double*)mallocCheck(H * sizeof(double));
    double sum = 0;
    for (int n = 0; n < H; n++) {
        p[n] = realistic ? (rng_uniform(&rng) < 0.3 ? 0.0 : exp(1.5 * rng_normal(&rng))) : 1.0;
        sum += p[n];
    }
    // rescale to mean k / H; the cap at 0.5 takes a little mass off the largest
    for (int n = 0; n < H; n++) { p[n] = fmin(0.5, p[n] * (k / H) * H / sum); }
    for (int m = 0; m < M; m++) {
        for (int i = 0; i < D - 1; i++) { f[(size_t)m * D + i] = (float)rng_normal(&rng); }
        f[(size_t)m * D + D - 1] = realistic && m < M / 100 ? 0.5f : 1.0f;
    }
    double sd = 1.0 / sqrt((double)(D - 1));
    for (int n = 0; n < H; n++) {
        for (int i = 0; i < D - 1; i++) { wg[(size_t)n * D + i] = (float)(sd * rng_normal(&rng)); }
        wg[(size_t)n * D + D - 1] = p[n] > 0 ? (float)-normal_quantile(1.0 - p[n]) : -1e4f;
    }
    for (size_t i = 0; i < (size_t)H * D; i++) { wu[i] = (float)(rng_normal(&rng) / sqrt((double)D)); }
    for (size_t i = 0; i < (size_t)H * D; i++) { wdT[i] = (float)(rng_normal(&rng) / sqrt((double)H)); }
    free(p);
}

// Benchmark-only (never written into a checkpoint): init_params_random, then
// gates that are sparse from the start, about k of H units firing per token
// in every layer (docs/SPARSE.md's synthetic sparsity inside the model). The last
// embedding channel becomes a constant 0.02, the scale of the others, so the
// normed FFN input carries a feature of about 1; W_o and W_d are scaled by
// 1e-3, so the residual stream stays the embedding and that feature survives
// every layer; and the last column of W_g is -t sd(g), t = Phi^-1(1 - k/H).
static inline void init_params_synthetic_sparse(float* params, const GPTConfig* c, double k, uint64_t seed) {
    init_params_random(params, c, seed);
    float* p[NUM_PARAM_TENSORS];
    gpt_point_tensors(params, p, c);
    size_t L = c->num_layers, D = c->channels, H = c->hidden;
    for (int v = 0; v < c->vocab_size; v++) { p[P_WTE][(size_t)v * D + D - 1] = 0.02f; }
    for (size_t i = 0; i < L * D * D; i++) { p[P_WO][i] *= 1e-3f; }
    for (size_t i = 0; i < L * H * D; i++) { p[P_WDT][i] *= 1e-3f; }
    float offset = (float)(-normal_quantile(1.0 - k / H) * 0.02 * sqrt((double)D - 1));
    for (size_t r = 0; r < L * H; r++) { p[P_WG][r * D + D - 1] = offset; }
}

#endif // LLMC_SYNTHETIC_H
