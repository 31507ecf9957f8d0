/*
 The dense FFN on the CPU: the reference of llmc/ffn/cuda_dense.cuh (same
 signatures, T = bf16 there) and the FFN every sparse format is checked
 against. Per layer, M token rows f of width D, H units:
     g = f Wg^T,  u = f Wu^T,  h = act(g) * u,  y = h WdT
 with act = ReLU (what the sparse formats skip) or SiLU (a dense model's).
*/
#ifndef LLMC_FFN_DENSE_H
#define LLMC_FFN_DENSE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include "llmc/cpu_ops.h"
#include "llmc/model.h"
#include "llmc/rng.h"

// the gated FFN activation h = act(g) * u, act = ReLU (the default, and all the
// sparse paths know) or SiLU (a dense model's, FfnActivation), with what the L1
// term and the sparsity statistics need: per token, sum_n |h| and the number of
// firing units (g > 0, for either act); per unit, a "fired at least once" mark
// (only ever set to 1). accumulate adds the row sums to row_l1 and row_active
// (the hot units of a layer whose cold units wrote them first, llmc/ffn/split.h).
//     relu(g) = max(g, 0)            relu'(g) = [g > 0]
//     silu(g) = g s(g)               silu'(g) = s(g) (1 + g (1 - s(g))),  s(g) = 1 / (1 + e^-g)

template <typename T>
static inline T gate_act(T g, int activation) {
    if (activation == ACT_SILU) { return g / (1 + exp(-g)); }
    return g > 0 ? g : 0;
}

template <typename T>
static inline T gate_act_grad(T g, int activation) {
    if (activation == ACT_SILU) {
        T s = 1 / (1 + exp(-g));
        return s * (1 + g * (1 - s));
    }
    return g > 0;
}

template <typename T>
void relu_gate_forward(T* h, T* row_l1, int* row_active, uint8_t* fired, const T* g, const T* u, int M, int H,
                       int accumulate = 0, int activation = ACT_RELU) {
    #pragma omp parallel for
    for (int m = 0; m < M; m++) {
        const T* gm = g + (size_t)m * H;
        const T* um = u + (size_t)m * H;
        T* hm = h + (size_t)m * H;
        int count = 0;
        T l1 = 0;
        for (int n = 0; n < H; n++) {
            hm[n] = gate_act(gm[n], activation) * um[n];
            l1 += fabs(hm[n]);
            count += gm[n] > 0;
        }
        row_l1[m] = accumulate ? row_l1[m] + l1 : l1;
        row_active[m] = accumulate ? row_active[m] + count : count;
    }
    if (fired) {
        #pragma omp parallel for
        for (int n = 0; n < H; n++) {
            for (int m = 0; m < M && !fired[n]; m++) { fired[n] = g[(size_t)m * H + n] > 0; }
        }
    }
}

// h = act(g) * u over n values without the statistics (a hot unit's h, recomputed in the backward; the
// dense FFN of inference); active (if not NULL) gets the number of g > 0
template <typename T>
void relu_mul(T* h, const T* g, const T* u, size_t n, unsigned long long* active, int activation = ACT_RELU) {
    unsigned long long count = 0;
    #pragma omp parallel for reduction(+:count)
    for (size_t i = 0; i < n; i++) {
        count += g[i] > 0;
        h[i] = gate_act(g[i], activation) * u[i];
    }
    if (active) { *active += count; }
}

// count[n] += #{m : g[m, n] > 0}: how often each unit fired (the hot/cold choice)
template <typename T>
void unit_count_add(uint32_t* count, const T* g, int M, int H) {
    #pragma omp parallel for
    for (int n = 0; n < H; n++) {
        uint32_t c = 0;
        for (int m = 0; m < M; m++) { c += g[(size_t)m * H + n] > 0; }
        count[n] += c;
    }
}

// with dh_total = dh + l1_scale * sign(h):  du = dh_total * act(g),  dg = dh_total * u * act'(g)
// (dg may be dh and du may be h, as llmc/ffn/split.h has them: h and dh are read before du and dg are written)
template <typename T>
void relu_gate_backward(T* dg, T* du, const T* dh, const T* g, const T* u, const T* h, float l1_scale, int M, int H,
                        int activation = ACT_RELU) {
    #pragma omp parallel for
    for (size_t i = 0; i < (size_t)M * H; i++) {
        T sign = h[i] > 0 ? 1 : (h[i] < 0 ? -1 : 0);
        T d = dh[i] + (T)l1_scale * sign;
        du[i] = d * gate_act(g[i], activation);
        dg[i] = d * u[i] * gate_act_grad(g[i], activation);
    }
}

// the dense FFN forward of inference: g = f Wg^T, u = f Wu^T, h = act(g) * u
// (over g), y = h WdT (y += with accumulate); g and u [M, H] are scratch;
// `active` (if not NULL) gets the number of g > 0 added. (decode: the GPU's
// choice of kernels for few rows)
template <typename T>
void ffn_dense_forward(T* y, T* g, T* u, const T* f, const T* wg, const T* wu, const T* wdT, int M, int D, int H,
                       unsigned long long* active, bool decode = false, int accumulate = 0, int activation = ACT_RELU) {
    gemm(g, f, wg, M, H, D, 0, 1, 0);
    gemm(u, f, wu, M, H, D, 0, 1, 0);
    relu_mul(g, g, u, (size_t)M * H, active, activation);
    gemm(y, g, wdT, M, D, H, 0, 0, accumulate);
}

// ----------------------------------------------------------------------------
// dead-neuron re-initialisation (docs/MODEL.md): each of the `rows` rows j of a gate
// matrix whose unit did not fire (fired[j] == 0) becomes
// (1 - 0.1) W[j] + 0.1 N(0, 0.02^2), the noise a function of (seed, element).
// master is NULL here (the parameters are the master weights).

template <typename T>
void gate_dead_reinit(T* wg, float* master, const uint8_t* fired, int rows, int D, uint64_t seed) {
    #pragma omp parallel for
    for (int j = 0; j < rows; j++) {
        if (fired[j]) { continue; }
        for (int i = 0; i < D; i++) {
            size_t idx = (size_t)j * D + i;
            uint64_t state = rng_mix64(seed ^ rng_mix64(idx));
            wg[idx] = (T)(0.9 * wg[idx] + 0.1 * 0.02 * rng_normal(&state));
        }
    }
}

#endif // LLMC_FFN_DENSE_H
