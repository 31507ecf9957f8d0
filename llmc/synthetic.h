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
 - a whole model on the GPU, calibrated by one prefill (init_params_synthetic_gpu
   and synthetic_calibrate, below).
*/
#ifndef LLMC_SYNTHETIC_H
#define LLMC_SYNTHETIC_H

#include <math.h>
#include <stdint.h>
#include "llmc/inference.h"
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

// p[n], the rate at which unit n fires: k / H (uniform), or the realistic skew
static inline void sparse_synthetic_rates(double* p, int H, double k, int realistic, uint64_t* rng) {
    double sum = 0;
    for (int n = 0; n < H; n++) {
        p[n] = realistic ? (rng_uniform(rng) < 0.3 ? 0.0 : exp(1.5 * rng_normal(rng))) : 1.0;
        sum += p[n];
    }
    // rescale to mean k / H; the cap at 0.5 takes a little mass off the largest
    for (int n = 0; n < H; n++) { p[n] = fmin(0.5, p[n] * (k / H) * H / sum); }
}

// M rows of FFN inputs f [M, D] and one layer's weights for about k of H units per row (see the top)
static inline void sparse_synthetic_ffn(float* f, float* wg, float* wu, float* wdT, int M, int D, int H, double k,
                                        int realistic, uint64_t seed) {
    uint64_t rng = seed;
    double* p = (double*)mallocCheck(H * sizeof(double));
    sparse_synthetic_rates(p, H, k, realistic, &rng);
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
// in every layer (docs/SPARSE.md's synthetic sparsity inside the model). The
// last embedding channel becomes a constant 0.02, the scale of the others, so
// the normed FFN input carries a feature of about 1; W_o and W_d are scaled by
// 1e-3, so the residual stream stays the embedding and that feature survives
// every layer; and the last column of W_g is -t_n sd(g), t_n = Phi^-1(1 - p_n),
// with p_n = k / H (uniform) or skewed as the realistic pattern (log-normal
// rates, 30% of the units never firing; sparse_synthetic_rates).
static inline void init_params_synthetic_sparse(float* params, const GPTConfig* c, double k, uint64_t seed,
                                                int skewed = 0) {
    init_params_random(params, c, seed);
    float* p[NUM_PARAM_TENSORS];
    gpt_point_tensors(params, p, c);
    size_t L = c->num_layers, D = c->channels, H = c->hidden;
    for (int v = 0; v < c->vocab_size; v++) { p[P_WTE][(size_t)v * D + D - 1] = 0.02f; }
    for (size_t i = 0; i < L * D * D; i++) { p[P_WO][i] *= 1e-3f; }
    for (size_t i = 0; i < L * H * D; i++) { p[P_WDT][i] *= 1e-3f; }
    double* rate = (double*)mallocCheck(H * sizeof(double));
    uint64_t rng = seed ^ 0x5eed5eedull;
    for (size_t l = 0; l < L; l++) {
        sparse_synthetic_rates(rate, (int)H, k, skewed, &rng);
        double t = 0;
        for (size_t n = 0; n < H; n++) {
            if (n == 0 || rate[n] != rate[n - 1]) { t = rate[n] > 0 ? normal_quantile(1.0 - rate[n]) : 40.0; }
            p[P_WG][(l * H + n) * D + D - 1] = (float)(-t * 0.02 * sqrt((double)D - 1)); // (40 sd: never)
        }
    }
    free(rate);
}

#ifdef __CUDACC__
// ----------------------------------------------------------------------------
// A synthetic-sparse model on the GPU, made and calibrated there (bench_infer
// --preset: shapes too large for the host to make quickly). A constant feature
// carries the biases: channel D-1 of the residual stream is set to e = 0.02 in
// every embedding row, and nothing writes to it (row D-1 of Wo and column D-1
// of WdT are 0; column D-1 of Wqkv and Wu are 0 too, so attention and u ignore
// it). Then f = RMSNorm(x) has f[D-1] = e w / rms(x), and
// g_n = f_data . Wg[n]_data + f[D-1] Wg[n][D-1]. The test g_n > 0 does not
// depend on rms(x), and f_data . Wg[n]_data is about
// N(0, |f_data|^2 |Wg[n]_data|^2 / (D - 1)); so with
//     Wg[n][D-1] = -t rho_l |Wg[n]_data| / sqrt(D - 1),   rho_l = mean |f_data| / f[D-1],
// t = Phi^-1(1 - k / H), unit n fires for about k / H of the tokens (skewed: t_n
// from the realistic pattern's rates p_n, a draw per layer, so a few units fire
// for many tokens and 30% for none). rho_l is measured on layer l's FFN input
// during one calibration prefill, before layer l's gate runs (so it sees the
// already-sparse layers below it).

namespace synthetic_detail {

// N(0, std^2) from a hash of (seed, i): Box-Muller on two 24-bit uniforms
__global__ void fill_normal_kernel(bf16* x, size_t n, float std, uint32_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h1 = (uint32_t)i * 2654435761u ^ seed, h2 = (uint32_t)(i >> 32) * 2246822519u ^ (seed * 3266489917u + (uint32_t)i);
        h1 ^= h1 >> 15; h1 *= 2246822519u; h1 ^= h1 >> 13; h1 *= 3266489917u; h1 ^= h1 >> 16;
        h2 ^= h2 >> 15; h2 *= 2654435761u; h2 ^= h2 >> 13; h2 *= 2246822519u; h2 ^= h2 >> 16;
        float u1 = ((h1 >> 8) + 1) * (1.0f / 16777217.0f), u2 = (h2 >> 8) * (1.0f / 16777216.0f);
        x[i] = __float2bfloat16_rn(std * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2));
    }
}

// x[r * stride + col] = value for r < rows
__global__ void set_column_kernel(bf16* x, int rows, size_t stride, int col, float value) {
    for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x) {
        x[(size_t)r * stride + col] = __float2bfloat16_rn(value);
    }
}

// rho = mean over the first rows (at most 1024) of |f_data| / f[D-1]: one block, fixed order
__global__ void carrier_ratio_kernel(float* rho, const bf16* f, int M, int D) {
    const int rows = M < 1024 ? M : 1024, lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    float total = 0.0f;
    for (int m = warp; m < rows; m += warps) {
        float sq = 0.0f;
        for (int d = lane; d < D - 1; d += 32) { float v = __bfloat162float(f[(size_t)m * D + d]); sq += v * v; }
        sq = warp_reduce<Sum>(sq);
        total += sqrtf(sq) / fabsf(__bfloat162float(f[(size_t)m * D + D - 1]));
    }
    total = block_reduce<Sum>(lane == 0 ? total : 0.0f);
    if (threadIdx.x == 0) { *rho = total / rows; }
}

// Wg[n][D-1] = -t[n] rho |Wg[n]_data| / sqrt(D - 1): a warp per unit
__global__ void gate_offset_kernel(bf16* wg, const float* rho, int H, int D, const float* t) {
    const int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= H) { return; }
    float sq = 0.0f;
    for (int d = lane; d < D - 1; d += 32) { float v = __bfloat162float(wg[(size_t)n * D + d]); sq += v * v; }
    sq = warp_reduce<Sum>(sq);
    if (lane == 0) { wg[(size_t)n * D + D - 1] = __float2bfloat16_rn(-t[n] * *rho * sqrtf(sq / (D - 1))); }
}

// the calibration prefill's state (the cached forward calls calibrate_layer before each layer's FFN)
struct Calibration {
    GPT<bf16, float>* model;
    InferState<bf16>* s;
    float* rho; // [L] on the device
    float* t;   // [L, H] on the device: Phi^-1(1 - p_n) of each layer's units
};

// layer l's gate offsets from its FFN input f = s->normed [M, D]
static void calibrate_layer(void* ctx, int l, int M) {
    const Calibration* cal = (const Calibration*)ctx;
    const GPTConfig* c = &cal->model->config;
    bf16* wg = cal->model->param[P_WG] + (size_t)l * c->hidden * c->channels;
    carrier_ratio_kernel<<<1, 1024, 0, main_stream>>>(cal->rho + l, cal->s->normed, M, c->channels);
    cudaCheck(cudaGetLastError());
    gate_offset_kernel<<<ceil_div(c->hidden, 8), 256, 0, main_stream>>>(wg, cal->rho + l, c->hidden, c->channels,
                                                                        cal->t + (size_t)l * c->hidden);
    cudaCheck(cudaGetLastError());
}

} // namespace synthetic_detail

// A random model (every matrix N(0, 0.02), norms 1, the padded vocab rows 0),
// with the carrier above when k > 0; synthetic_calibrate sets the gate offsets.
static inline void init_params_synthetic_gpu(GPT<bf16, float>* model, uint32_t seed, double k) {
    using namespace synthetic_detail;
    const GPTConfig* c = &model->config;
    int L = c->num_layers, D = c->channels, H = c->hidden, QKV = qkv_dim(c);
    size_t sizes[NUM_PARAM_TENSORS];
    param_sizes(sizes, c);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        if (param_is_matrix(i)) {
            fill_normal_kernel<<<4096, 256, 0, main_stream>>>(model->param[i], sizes[i], 0.02f, seed + 7919u * i);
            cudaCheck(cudaGetLastError());
        } else {
            set_column_kernel<<<ceil_div((int)sizes[i], 256), 256, 0, main_stream>>>(model->param[i], (int)sizes[i], 1,
                                                                                    0, 1.0f);
            cudaCheck(cudaGetLastError());
        }
    }
    size_t real = (size_t)c->vocab_size * D;
    cudaCheck(cudaMemsetAsync(model->param[P_WTE] + real, 0, (sizes[P_WTE] - real) * sizeof(bf16), main_stream));
    if (k <= 0) { return; }
    auto column = [&](bf16* x, int rows, float value) {
        set_column_kernel<<<ceil_div(rows, 256), 256, 0, main_stream>>>(x, rows, D, D - 1, value);
        cudaCheck(cudaGetLastError());
    };
    column(model->param[P_WTE], c->vocab_size, 0.02f);
    for (int l = 0; l < L; l++) {
        cudaCheck(cudaMemsetAsync(model->param[P_WO] + ((size_t)l * D + D - 1) * D, 0, D * sizeof(bf16), main_stream));
        column(model->param[P_WQKV] + (size_t)l * QKV * D, QKV, 0.0f);
        column(model->param[P_WU] + (size_t)l * H * D, H, 0.0f);
        column(model->param[P_WDT] + (size_t)l * H * D, H, 0.0f);
    }
    cudaCheck(cudaStreamSynchronize(main_stream));
}

// The gate offsets of init_params_synthetic_gpu's model for about k of H units
// per token (skewed: the realistic pattern's rates): one prefill of the given
// prompts with the dense FFN, each layer's offsets set from its FFN input just
// before its gate runs.
static inline void synthetic_calibrate(GPT<bf16, float>* model, InferState<bf16>* s, const int* tokens,
                                       const int* lens, int nseq, double k, int skewed, uint64_t seed) {
    int L = model->config.num_layers, H = model->config.hidden;
    float* t = (float*)mallocCheck((size_t)L * H * sizeof(float));
    double* p = (double*)mallocCheck(H * sizeof(double));
    for (int l = 0; l < L; l++) {
        sparse_synthetic_rates(p, H, k, skewed, &seed);
        for (int n = 0; n < H; n++) {
            int same = n > 0 && p[n] == p[n - 1]; // (uniform: one quantile)
            t[(size_t)l * H + n] = same ? t[(size_t)l * H + n - 1] : p[n] > 0 ? (float)normal_quantile(1.0 - p[n]) : 40.0f;
        }
    }
    synthetic_detail::Calibration cal = {model, s, (float*)cuda_malloc(L * sizeof(float)),
                                         (float*)cuda_malloc((size_t)L * H * sizeof(float))};
    cudaCheck(cudaMemcpy(cal.t, t, (size_t)L * H * sizeof(float), cudaMemcpyHostToDevice));
    free(t);
    free(p);
    int ffn_mode = model->ffn.mode;
    model->ffn.mode = FFN_DENSE;
    s->before_ffn = synthetic_detail::calibrate_layer;
    s->before_ffn_ctx = &cal;
    gpt_prefill(model, s, tokens, lens, nseq, (float*)NULL);
    s->before_ffn = NULL;
    s->before_ffn_ctx = NULL;
    model->ffn.mode = ffn_mode;
    ffn_cache_stale(&s->ffn); // the gates changed
    cuda_free(cal.rho);
    cuda_free(cal.t);
}
#endif

#endif // LLMC_SYNTHETIC_H
