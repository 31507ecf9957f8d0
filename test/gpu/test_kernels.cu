/*
 The GPU's non-attention kernels against the CPU reference (llmc/cpu_ops.h, llmc/adamw.h), and of the
 matmuls the batched pair (gemm_pair) against fp64 sums.
 Every check draws fresh seeded random inputs; bf16 inputs are rounded once and the same values, as
 doubles, feed the reference (as floats where the reference must add in fp32 in the GPU's order).
 Every output buffer is poisoned with NaN bytes (0xFF) before a GPU run; outputs that accumulate are
 pre-filled with the same random values on both sides. Any NaN fails. Counts and greedy tokens must match
 exactly, and every kernel that reduces runs twice and must give the same bits.

 Thresholds, on max|gpu - ref| / max|ref| (ref in double, so the error is the GPU's):
 - bf16 outputs: 1e-2. One rounding to bf16 (8 significant bits) is at most 2^-8 = 0.4% of the
   value; fp32 math before it adds ~1e-6. 1e-2 leaves room for that, and an indexing or math error is
   O(1). Where the value is exactly representable (the embedding, relu(g) * u, the residual add),
   the check is exact instead (silu(g) * u is not: the GPU's fp32 exponential may round to the
   neighbouring bf16, within the 1e-2).
 - fp32 outputs (rstd, losses, row sums, dw, the norm, the optimizer state): 1e-5 (1e-6 for the
   optimizer): fp32 sums of up to a few thousand terms in a different order differ by ~1e-7 relative.
 - double sums (the statistics): 1e-12.
 - dlogits spans orders of magnitude (the target's p - 1 against p ~ 1/V), so it is also checked per
   element, |gpu - ref| / (|ref| + 1e-6 max|ref|) < 1e-2, which also catches a wrong tiny probability.

 `test_kernels --bench` then times every kernel at the paper's shapes (median of 20) and prints its
 bandwidth next to a device-to-device copy's.
*/
#include <algorithm>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <vector>
#include "llmc/adamw.h"
#include "llmc/cpu_ops.h"
#include "llmc/rng.h"
#include "llmc/sampler.h"
#include "llmc/cuda_common.cuh"
#include "llmc/cuda_adamw.cuh"
#include "llmc/cuda_classifier.cuh"
#include "llmc/cuda_encoder.cuh"
#include "llmc/ffn/cuda_dense.cuh"
#include "llmc/cuda_matmul.cuh"
#include "llmc/cuda_rmsnorm.cuh"
#include "llmc/cuda_rope.cuh"
#include "test/gpu/gpu_util.cuh"
#include "test/test.h"

static uint64_t rng = 20240520; // one seeded stream: every check draws new values from it

// ----------------------------------------------------------------------------
// host and device buffers

// a device buffer full of 0xFF bytes: NaN as bf16, float and double, -1 as int
template <typename T>
static T* poisoned(size_t n) {
    T* dev = (T*)cuda_malloc(n * sizeof(T));
    cudaCheck(cudaMemset(dev, 0xFF, n * sizeof(T)));
    return dev;
}

template <typename T>
static void reupload(T* dev, const std::vector<T>& host) {
    cudaCheck(cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
}

template <typename T>
static bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// ----------------------------------------------------------------------------
// random inputs

static std::vector<bf16> random_bf16(size_t n, double mean, double std) {
    std::vector<bf16> x(n);
    for (size_t i = 0; i < n; i++) { x[i] = __float2bfloat16_rn((float)(mean + std * rng_normal(&rng))); }
    return x;
}

static std::vector<float> random_float(size_t n, double mean, double std) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; i++) { x[i] = (float)(mean + std * rng_normal(&rng)); }
    return x;
}

static double as_double(bf16 x) { return __bfloat162float(x); }
static double as_double(float x) { return x; }
static double as_double(double x) { return x; }

template <typename T>
static std::vector<double> to_double(const std::vector<T>& x) {
    std::vector<double> d(x.size());
    for (size_t i = 0; i < x.size(); i++) { d[i] = as_double(x[i]); }
    return d;
}

// ----------------------------------------------------------------------------
// comparisons, and the worst error seen per kernel

struct Worst { char output[64]; double err, tol; }; // tol 0: an exact check, err counts mismatches
static Worst worst[64];
static int num_worst = 0;

static void record(const char* kernel, const char* what, double err, double tol) {
    char output[64];
    snprintf(output, sizeof(output), "%s %s", kernel, what);
    int i = 0;
    while (i < num_worst && strcmp(worst[i].output, output) != 0) { i++; }
    if (i == num_worst) {
        if (num_worst == 64) { fatal("too many outputs to record"); }
        worst[num_worst++] = Worst{{0}, 0.0, tol};
        snprintf(worst[i].output, sizeof(worst[i].output), "%s", output);
    }
    if (!(err <= worst[i].err)) { worst[i].err = err; } // a NaN stays
}

// max|gpu - ref| / max|ref|; NaN if any gpu value is NaN
template <typename T>
static double rel_err(const std::vector<T>& gpu, const std::vector<double>& ref) {
    double max_diff = 0, max_ref = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        double g = as_double(gpu[i]);
        if (isnan(g)) { return NAN; }
        max_diff = fmax(max_diff, fabs(g - ref[i]));
        max_ref = fmax(max_ref, fabs(ref[i]));
    }
    return max_ref > 0 ? max_diff / max_ref : max_diff;
}

template <typename T>
static void check_close(const char* kernel, const char* what, const char* shape, const std::vector<T>& gpu,
                        const std::vector<double>& ref, double tol) {
    double err = rel_err(gpu, ref);
    record(kernel, what, err, tol);
    CHECK(err < tol, "%s %s (%s): max|gpu - ref| / max|ref| = %.3g (NaN: unwritten or NaN output), limit %.0e",
          kernel, what, shape, err, tol);
}

template <typename T>
static void check_exact(const char* kernel, const char* what, const char* shape, const std::vector<T>& gpu,
                        const std::vector<T>& ref) {
    size_t mismatches = 0;
    for (size_t i = 0; i < ref.size(); i++) { mismatches += memcmp(&gpu[i], &ref[i], sizeof(T)) != 0; }
    record(kernel, what, (double)mismatches, 0);
    CHECK(mismatches == 0, "%s %s (%s): %zu of %zu values differ from the exact result", kernel, what, shape,
          mismatches, ref.size());
}

static void check_deterministic(const char* kernel, const char* what, const char* shape, bool same) {
    CHECK(same, "%s %s (%s): a second run gave different bits", kernel, what, shape);
}

// ----------------------------------------------------------------------------
// the batched pair of products of the dense FFN: C1 = A B1^T, C2 = A B2^T, with
// B2 after B1 in one allocation (one batched call) and before it (two calls)

static void test_gemm_pair(int M, int N, int K) {
    char shape[64];
    snprintf(shape, sizeof(shape), "M %d, N %d, K %d", M, N, K);
    const size_t NK = (size_t)N * K, MN = (size_t)M * N;
    std::vector<bf16> a = random_bf16((size_t)M * K, 0, 1), b = random_bf16(2 * NK, 0, 1);
    std::vector<double> ref(2 * MN, 0.0); // ref[i MN + m N + n] = A_m . B_i[n]
    for (int i = 0; i < 2; i++) {
        for (int m = 0; m < M; m++) {
            for (int n = 0; n < N; n++) {
                double acc = 0;
                for (int k = 0; k < K; k++) { acc += as_double(a[(size_t)m * K + k]) * as_double(b[i * NK + (size_t)n * K + k]); }
                ref[i * MN + (size_t)m * N + n] = acc;
            }
        }
    }
    bf16 *d_a = upload(a), *d_b = upload(b);
    for (int order = 0; order < 2; order++) { // 0: B2 = B1 + NK (batched), 1: B2 = B1 - NK (two products)
        bf16* d_c = poisoned<bf16>(2 * MN);
        const bf16* b1 = d_b + (order == 0 ? 0 : NK);
        const bf16* b2 = d_b + (order == 0 ? NK : 0);
        gemm_pair(d_c, d_c + MN, d_a, b1, b2, M, N, K);
        std::vector<bf16> c = download(d_c, 2 * MN);
        std::vector<double> expected(2 * MN);
        for (size_t j = 0; j < MN; j++) {
            expected[j] = ref[(order == 0 ? 0 : MN) + j];
            expected[MN + j] = ref[(order == 0 ? MN : 0) + j];
        }
        check_close("gemm_pair", order == 0 ? "C (batched)" : "C (two products)", shape, c, expected, 1e-2);
        cuda_free(d_c);
    }
    cuda_free(d_a);
    cuda_free(d_b);
}

// ----------------------------------------------------------------------------
// embedding

static void test_encoder(int M, int D, int V) {
    char shape[64];
    snprintf(shape, sizeof(shape), "M %d, D %d, V %d", M, D, V);
    std::vector<int> tokens(M);
    // half the tokens from 8 ids, so that ids repeat many times (the backward's hard case)
    for (int m = 0; m < M; m++) { tokens[m] = (int)(rng_below(&rng, 2) ? rng_below(&rng, 8) : rng_below(&rng, V)); }
    std::vector<bf16> wte = random_bf16((size_t)V * D, 0, 1);
    int* d_tokens = upload(tokens);
    bf16* d_wte = upload(wte);

    bf16* d_out = poisoned<bf16>((size_t)M * D);
    encoder_forward(d_out, d_tokens, d_wte, M, D);
    std::vector<bf16> expected((size_t)M * D);
    for (int m = 0; m < M; m++) { memcpy(&expected[(size_t)m * D], &wte[(size_t)tokens[m] * D], D * sizeof(bf16)); }
    check_exact("encoder_forward", "out", shape, download(d_out, (size_t)M * D), expected);

    // the reference adds in fp32 in the same order as the GPU: the sums must match bit for bit
    std::vector<bf16> dout = random_bf16((size_t)M * D, 0, 1);
    std::vector<float> dwte_start = random_float((size_t)V * D, 0, 1), dwte_ref = dwte_start;
    std::vector<float> dout_f = to_float(dout);
    encoder_backward(dwte_ref.data(), dout_f.data(), tokens.data(), M, D);
    bf16* d_dout = upload(dout);
    float* d_dwte = upload(dwte_start);
    encoder_backward(d_dwte, d_dout, d_tokens, M, D);
    std::vector<float> first = download(d_dwte, dwte_start.size());
    check_exact("encoder_backward", "dwte", shape, first, dwte_ref);
    reupload(d_dwte, dwte_start);
    encoder_backward(d_dwte, d_dout, d_tokens, M, D);
    check_deterministic("encoder_backward", "dwte", shape, same_bits(first, download(d_dwte, dwte_start.size())));

    cuda_free(d_tokens); cuda_free(d_wte); cuda_free(d_out); cuda_free(d_dout); cuda_free(d_dwte);
}

// ----------------------------------------------------------------------------
// RMSNorm

static void test_rmsnorm(int M, int D) {
    char shape[64];
    snprintf(shape, sizeof(shape), "M %d, D %d", M, D);
    const float eps = 1e-5f;
    const size_t MD = (size_t)M * D;
    std::vector<bf16> x = random_bf16(MD, 0, 1), y = random_bf16(MD, 0, 1), w = random_bf16(D, 1, 0.1);
    std::vector<double> xd = to_double(x), wd = to_double(w);
    bf16 *d_x = upload(x), *d_y = upload(y), *d_w = upload(w);

    // forward
    std::vector<double> out_ref(MD), rstd_ref(M);
    rmsnorm_forward(out_ref.data(), rstd_ref.data(), xd.data(), wd.data(), M, D, eps);
    bf16* d_out = poisoned<bf16>(MD);
    float* d_rstd = poisoned<float>(M);
    rmsnorm_forward(d_out, d_rstd, d_x, d_w, M, D, eps);
    std::vector<bf16> out = download(d_out, MD);
    std::vector<float> rstd = download(d_rstd, M);
    check_close("rmsnorm_forward", "out", shape, out, out_ref, 1e-2);
    check_close("rmsnorm_forward", "rstd", shape, rstd, rstd_ref, 1e-5);
    cudaCheck(cudaMemset(d_out, 0xFF, MD * sizeof(bf16)));
    cudaCheck(cudaMemset(d_rstd, 0xFF, M * sizeof(float)));
    rmsnorm_forward(d_out, d_rstd, d_x, d_w, M, D, eps);
    check_deterministic("rmsnorm_forward", "out and rstd", shape,
                        same_bits(out, download(d_out, MD)) && same_bits(rstd, download(d_rstd, M)));
    cudaCheck(cudaMemset(d_out, 0xFF, MD * sizeof(bf16)));
    rmsnorm_forward(d_out, (float*)NULL, d_x, d_w, M, D, eps);
    check_deterministic("rmsnorm_forward", "out without rstd", shape, same_bits(out, download(d_out, MD)));

    // fused residual: x_out = bf16(x + y), the sum of two bf16 in fp32 rounded once, as on the host
    std::vector<bf16> x_out_ref(MD);
    for (size_t i = 0; i < MD; i++) {
        x_out_ref[i] = __float2bfloat16_rn(__bfloat162float(x[i]) + __bfloat162float(y[i]));
    }
    std::vector<double> x_out_d = to_double(x_out_ref), norm_ref(MD), rstd2_ref(M);
    rmsnorm_forward(norm_ref.data(), rstd2_ref.data(), x_out_d.data(), wd.data(), M, D, eps);
    bf16 *d_x_out = poisoned<bf16>(MD), *d_norm = poisoned<bf16>(MD);
    cudaCheck(cudaMemset(d_rstd, 0xFF, M * sizeof(float)));
    fused_residual_rmsnorm_forward(d_x_out, d_norm, d_rstd, d_x, d_y, d_w, M, D, eps);
    std::vector<bf16> norm = download(d_norm, MD);
    check_exact("fused_residual_rmsnorm", "x_out", shape, download(d_x_out, MD), x_out_ref);
    check_close("fused_residual_rmsnorm", "norm_out", shape, norm, norm_ref, 1e-2);
    check_close("fused_residual_rmsnorm", "rstd", shape, download(d_rstd, M), rstd2_ref, 1e-5);
    cudaCheck(cudaMemset(d_norm, 0xFF, MD * sizeof(bf16)));
    fused_residual_rmsnorm_forward(d_x_out, d_norm, d_rstd, d_x, d_y, d_w, M, D, eps);
    check_deterministic("fused_residual_rmsnorm", "norm_out", shape, same_bits(norm, download(d_norm, MD)));

    // apply: a forward's output again from its input and rstd, to the bit (what the backward recomputes), and
    // the CPU's apply on the same rstd
    bf16* d_apply = poisoned<bf16>(MD);
    rmsnorm_apply(d_apply, d_x_out, d_rstd, d_w, M, D);
    check_exact("rmsnorm_apply", "the fused norm's output", shape, download(d_apply, MD), norm);
    std::vector<double> rstd2 = to_double(download(d_rstd, M)), apply_ref(MD);
    rmsnorm_apply(apply_ref.data(), x_out_d.data(), rstd2.data(), wd.data(), M, D);
    check_close("rmsnorm_apply", "out", shape, download(d_apply, MD), apply_ref, 1e-2);
    rmsnorm_forward(d_out, d_rstd, d_x, d_w, M, D, eps);
    cudaCheck(cudaMemset(d_apply, 0xFF, MD * sizeof(bf16)));
    rmsnorm_apply(d_apply, d_x, d_rstd, d_w, M, D);
    check_exact("rmsnorm_apply", "the forward's output", shape, download(d_apply, MD), out);
    cuda_free(d_apply);

    // backward, from the forward's rstd (as fp32 on both sides); dinp and dw accumulate
    std::vector<float> rstd_f(M);
    for (int m = 0; m < M; m++) { rstd_f[m] = (float)rstd_ref[m]; }
    std::vector<bf16> dout = random_bf16(MD, 0, 1), dinp_start = random_bf16(MD, 0, 1);
    std::vector<float> dw_start = random_float(D, 0, 1);
    std::vector<double> dinp_ref = to_double(dinp_start), dw_ref = to_double(dw_start);
    std::vector<double> doutd = to_double(dout), rstdd = to_double(rstd_f);
    rmsnorm_backward(dinp_ref.data(), dw_ref.data(), (double*)NULL, doutd.data(), xd.data(), wd.data(), rstdd.data(),
                     M, D);
    bf16 *d_dout = upload(dout), *d_dinp = upload(dinp_start);
    float *d_dw = upload(dw_start), *d_rstd_f = upload(rstd_f);
    float* d_scratch = poisoned<float>((size_t)1024 * D);
    rmsnorm_backward(d_dinp, d_dw, d_scratch, d_dout, d_x, d_w, d_rstd_f, M, D);
    std::vector<bf16> dinp = download(d_dinp, MD);
    std::vector<float> dw = download(d_dw, D);
    check_close("rmsnorm_backward", "dinp", shape, dinp, dinp_ref, 1e-2);
    check_close("rmsnorm_backward", "dw", shape, dw, dw_ref, 1e-5);
    reupload(d_dinp, dinp_start);
    reupload(d_dw, dw_start);
    cudaCheck(cudaMemset(d_scratch, 0xFF, (size_t)1024 * D * sizeof(float)));
    rmsnorm_backward(d_dinp, d_dw, d_scratch, d_dout, d_x, d_w, d_rstd_f, M, D);
    check_deterministic("rmsnorm_backward", "dinp and dw", shape,
                        same_bits(dinp, download(d_dinp, MD)) && same_bits(dw, download(d_dw, D)));

    cuda_free(d_x); cuda_free(d_y); cuda_free(d_w); cuda_free(d_out); cuda_free(d_rstd); cuda_free(d_x_out);
    cuda_free(d_norm); cuda_free(d_dout); cuda_free(d_dinp); cuda_free(d_dw); cuda_free(d_rstd_f); cuda_free(d_scratch);
}

// ----------------------------------------------------------------------------
// RoPE (in place: nothing to poison; the v heads must come back untouched)

static void test_rope(int B, int T, int pos0, int NH, int NKV, int hd) {
    char shape[96];
    snprintf(shape, sizeof(shape), "B %d, T %d, pos0 %d, NH %d, NKV %d, hd %d", B, T, pos0, NH, NKV, hd);
    const float theta = 10000.0f;
    const int stride = (NH + 2 * NKV) * hd, M = B * T;
    std::vector<bf16> qkv = random_bf16((size_t)M * stride, 0, 1);
    for (int backward = 0; backward <= 1; backward++) {
        const char* kernel = backward ? "rope_backward" : "rope_forward";
        std::vector<double> ref = to_double(qkv);
        bf16* d_qkv = upload(qkv);
        if (backward) {
            rope_backward(ref.data(), B, T, NH, NKV, hd, theta);
            rope_backward(d_qkv, B, T, NH, NKV, hd, theta);
        } else {
            rope_forward(ref.data(), B, T, pos0, NH, NKV, hd, theta);
            rope_forward(d_qkv, B, T, pos0, NH, NKV, hd, theta);
        }
        std::vector<bf16> out = download(d_qkv, qkv.size());
        check_close(kernel, "q and k", shape, out, ref, 1e-2);
        size_t v_changed = 0;
        for (int m = 0; m < M; m++) {
            size_t v0 = (size_t)m * stride + (size_t)(NH + NKV) * hd;
            v_changed += memcmp(&out[v0], &qkv[v0], (size_t)NKV * hd * sizeof(bf16)) != 0;
        }
        CHECK(v_changed == 0, "%s (%s): %zu rows of v heads changed", kernel, shape, v_changed);
        cuda_free(d_qkv);
    }
}

// ----------------------------------------------------------------------------
// the gate activation: ReLU, and SiLU (a dense model's)

static void test_gate(int M, int H, bool with_fired, int activation = ACT_RELU) {
    char shape[64];
    snprintf(shape, sizeof(shape), "M %d, H %d%s, %s", M, H, with_fired ? "" : ", fired NULL", activation_names[activation]);
    const int act = activation;
    const size_t MH = (size_t)M * H;
    std::vector<bf16> g = random_bf16(MH, -0.5, 1), u = random_bf16(MH, 0, 1);
    std::vector<double> gd = to_double(g), ud = to_double(u);
    std::vector<uint8_t> fired_start(H);
    for (int n = 0; n < H; n++) { fired_start[n] = rng_below(&rng, 8) == 0; } // some marks are already set

    // forward: relu(g) * u of two bf16 is exact in double and in fp32, so h must be its rounding, bit for bit;
    // silu(g) * u within bf16's rounding
    std::vector<double> h_ref(MH), l1_unused(M);
    std::vector<int> active_ref(M);
    std::vector<uint8_t> fired_ref = fired_start;
    relu_gate_forward(h_ref.data(), l1_unused.data(), active_ref.data(), with_fired ? fired_ref.data() : (uint8_t*)NULL,
                      gd.data(), ud.data(), M, H, 0, act);
    std::vector<bf16> h_expected(MH);
    for (size_t i = 0; i < MH; i++) { h_expected[i] = __float2bfloat16_rn((float)h_ref[i]); }

    bf16 *d_g = upload(g), *d_u = upload(u), *d_h = poisoned<bf16>(MH);
    float* d_l1 = poisoned<float>(M);
    int* d_active = poisoned<int>(M);
    uint8_t* d_fired = with_fired ? upload(fired_start) : NULL;
    relu_gate_forward(d_h, d_l1, d_active, d_fired, d_g, d_u, M, H, 0, act);
    std::vector<bf16> h = download(d_h, MH);
    std::vector<float> l1 = download(d_l1, M);
    std::vector<int> active = download(d_active, M);
    if (act == ACT_RELU) { check_exact("relu_gate_forward", "h", shape, h, h_expected); }
    else { check_close("relu_gate_forward", "h", shape, h, h_ref, 1e-2); }
    std::vector<double> l1_ref(M, 0.0); // the sum of |h| as stored (bf16; checked above)
    for (size_t i = 0; i < MH; i++) { l1_ref[i / H] += fabs(as_double(h[i])); }
    check_close("relu_gate_forward", "row_l1", shape, l1, l1_ref, 1e-5);
    check_exact("relu_gate_forward", "row_active", shape, active, active_ref);
    std::vector<uint8_t> fired;
    if (with_fired) {
        fired = download(d_fired, H);
        check_exact("relu_gate_forward", "fired", shape, fired, fired_ref);
    }
    cudaCheck(cudaMemset(d_h, 0xFF, MH * sizeof(bf16)));
    cudaCheck(cudaMemset(d_l1, 0xFF, M * sizeof(float)));
    cudaCheck(cudaMemset(d_active, 0xFF, M * sizeof(int)));
    if (with_fired) { reupload(d_fired, fired_start); }
    relu_gate_forward(d_h, d_l1, d_active, d_fired, d_g, d_u, M, H, 0, act);
    check_deterministic("relu_gate_forward", "h, row_l1, row_active, fired", shape,
                        same_bits(h, download(d_h, MH)) && same_bits(l1, download(d_l1, M)) &&
                        same_bits(active, download(d_active, M)) &&
                        (!with_fired || same_bits(fired, download(d_fired, H))));

    // backward, at the h the forward stored
    const float l1_scale = 0.3f;
    std::vector<bf16> dh = random_bf16(MH, 0, 1);
    std::vector<double> dhd = to_double(dh), h_d = to_double(h), dg_ref(MH), du_ref(MH);
    relu_gate_backward(dg_ref.data(), du_ref.data(), dhd.data(), gd.data(), ud.data(), h_d.data(), l1_scale, M, H, act);
    bf16 *d_dh = upload(dh), *d_dg = poisoned<bf16>(MH), *d_du = poisoned<bf16>(MH);
    relu_gate_backward(d_dg, d_du, d_dh, d_g, d_u, d_h, l1_scale, M, H, act);
    std::vector<bf16> dg = download(d_dg, MH), du = download(d_du, MH);
    check_close("relu_gate_backward", "dg", shape, dg, dg_ref, 1e-2);
    check_close("relu_gate_backward", "du", shape, du, du_ref, 1e-2);
    // dg written over dh, as the model calls it
    cudaCheck(cudaMemset(d_du, 0xFF, MH * sizeof(bf16)));
    relu_gate_backward(d_dh, d_du, d_dh, d_g, d_u, d_h, l1_scale, M, H, act);
    check_deterministic("relu_gate_backward", "dg over dh", shape,
                        same_bits(dg, download(d_dh, MH)) && same_bits(du, download(d_du, MH)));

    cuda_free(d_g); cuda_free(d_u); cuda_free(d_h); cuda_free(d_l1); cuda_free(d_active); cuda_free(d_fired);
    cuda_free(d_dh); cuda_free(d_dg); cuda_free(d_du);
}

// the dense FFN forward of inference, y = bf16(act(f Wg^T) * (f Wu^T)) WdT, against its CPU reference
// in double (which rounds nothing: the GPU rounds g, u, h and y to bf16, within the 1e-2)
static void test_dense_ffn(int M, int D, int H, int activation) {
    char shape[64];
    snprintf(shape, sizeof(shape), "M %d, D %d, H %d, %s", M, D, H, activation_names[activation]);
    const double w_std = 1.0 / sqrt((double)D);
    std::vector<bf16> f = random_bf16((size_t)M * D, 0, 1), wg = random_bf16((size_t)H * D, 0, w_std),
                      wu = random_bf16((size_t)H * D, 0, w_std), wdT = random_bf16((size_t)H * D, 0, w_std);
    std::vector<double> fd = to_double(f), wgd = to_double(wg), wud = to_double(wu), wdTd = to_double(wdT);
    std::vector<double> y_ref((size_t)M * D), g_ref((size_t)M * H), u_ref((size_t)M * H);
    ffn_dense_forward(y_ref.data(), g_ref.data(), u_ref.data(), fd.data(), wgd.data(), wud.data(), wdTd.data(), M, D, H,
                      (unsigned long long*)NULL, false, 0, activation);
    bf16 *d_f = upload(f), *d_wg = upload(wg), *d_wu = upload(wu), *d_wdT = upload(wdT);
    bf16 *d_y = poisoned<bf16>((size_t)M * D), *d_g = poisoned<bf16>((size_t)M * H), *d_u = poisoned<bf16>((size_t)M * H);
    ffn_dense_forward(d_y, d_g, d_u, d_f, d_wg, d_wu, d_wdT, M, D, H, (unsigned long long*)NULL, false, 0, activation);
    std::vector<bf16> y = download(d_y, (size_t)M * D);
    check_close("ffn_dense_forward", "y", shape, y, y_ref, 1e-2);
    cudaCheck(cudaMemset(d_y, 0xFF, (size_t)M * D * sizeof(bf16)));
    ffn_dense_forward(d_y, d_g, d_u, d_f, d_wg, d_wu, d_wdT, M, D, H, (unsigned long long*)NULL, false, 0, activation);
    check_deterministic("ffn_dense_forward", "y", shape, same_bits(y, download(d_y, (size_t)M * D)));
    cuda_free(d_f); cuda_free(d_wg); cuda_free(d_wu); cuda_free(d_wdT); cuda_free(d_y); cuda_free(d_g); cuda_free(d_u);
}

// ----------------------------------------------------------------------------
// classifier

static void test_crossentropy(int M, int V, int Vp) {
    char shape[64];
    snprintf(shape, sizeof(shape), "M %d, V %d, Vp %d", M, V, Vp);
    const size_t MV = (size_t)M * Vp;
    const float dloss = 1.0f / M;
    std::vector<bf16> logits = random_bf16(MV, 0, 2); // the padding holds junk too: it must be ignored
    std::vector<int> targets(M);
    for (int m = 0; m < M; m++) { targets[m] = (int)rng_below(&rng, V); }
    std::vector<double> logits_d = to_double(logits), dlogits_ref(MV), losses_ref(M);
    crossentropy_forward_backward(dlogits_ref.data(), losses_ref.data(), logits_d.data(), targets.data(), M, V, Vp,
                                  dloss);

    bf16 *d_logits = upload(logits), *d_dlogits = poisoned<bf16>(MV);
    int* d_targets = upload(targets);
    float* d_losses = poisoned<float>(M);
    crossentropy_forward_backward(d_dlogits, d_losses, d_logits, d_targets, M, V, Vp, dloss);
    std::vector<bf16> dlogits = download(d_dlogits, MV);
    std::vector<float> losses = download(d_losses, M);
    check_close("crossentropy", "losses", shape, losses, losses_ref, 1e-5);
    check_close("crossentropy", "dlogits", shape, dlogits, dlogits_ref, 1e-2);
    double max_ref = 0, elem_err = 0;
    for (size_t i = 0; i < MV; i++) { max_ref = fmax(max_ref, fabs(dlogits_ref[i])); }
    for (size_t i = 0; i < MV; i++) {
        double e = fabs(as_double(dlogits[i]) - dlogits_ref[i]) / (fabs(dlogits_ref[i]) + 1e-6 * max_ref);
        elem_err = isnan(e) ? e : fmax(elem_err, e);
        if (isnan(e)) { break; }
    }
    record("crossentropy", "dlogits per element", elem_err, 1e-2);
    CHECK(elem_err < 1e-2, "crossentropy dlogits (%s): per-element relative error %.3g", shape, elem_err);

    cudaCheck(cudaMemset(d_dlogits, 0xFF, MV * sizeof(bf16)));
    cudaCheck(cudaMemset(d_losses, 0xFF, M * sizeof(float)));
    crossentropy_forward_backward(d_dlogits, d_losses, d_logits, d_targets, M, V, Vp, dloss);
    check_deterministic("crossentropy", "dlogits and losses", shape,
                        same_bits(dlogits, download(d_dlogits, MV)) && same_bits(losses, download(d_losses, M)));
    // in place, as the model calls it
    bf16* d_inplace = upload(logits);
    cudaCheck(cudaMemset(d_losses, 0xFF, M * sizeof(float)));
    crossentropy_forward_backward(d_inplace, d_losses, d_inplace, d_targets, M, V, Vp, dloss);
    check_deterministic("crossentropy", "in place", shape,
                        same_bits(dlogits, download(d_inplace, MV)) && same_bits(losses, download(d_losses, M)));
    // loss only
    cudaCheck(cudaMemset(d_losses, 0xFF, M * sizeof(float)));
    crossentropy_forward_backward((bf16*)NULL, d_losses, d_logits, d_targets, M, V, Vp, dloss);
    check_deterministic("crossentropy", "losses without dlogits", shape, same_bits(losses, download(d_losses, M)));

    cuda_free(d_logits); cuda_free(d_dlogits); cuda_free(d_targets); cuda_free(d_losses); cuda_free(d_inplace);
}

// greedy_kernel against logits_greedy (llmc/sampler.h) on rows of bf16 logits:
// random (few distinct values, so the largest often repeats: the first wins),
// a row whose largest is 0 and -0, rows with a NaN or an infinity (-1), the
// padding holding a larger value (ignored); the output poisoned first
static void test_greedy(int M, int V, int Vp) {
    char shape[64];
    snprintf(shape, sizeof(shape), "M %d, V %d, Vp %d", M, V, Vp);
    std::vector<bf16> logits(M * (size_t)Vp);
    for (bf16& z : logits) { z = __float2bfloat16((float)rng_below(&rng, 64) / 8.0f - 6.0f); }
    for (int m = 0; m < M; m++) {
        bf16* row = logits.data() + (size_t)m * Vp;
        for (int i = V; i < Vp; i++) { row[i] = __float2bfloat16(100.0f); }
        if (m % 5 == 1) { row[rng_below(&rng, V)] = __float2bfloat16(NAN); }
        if (m % 5 == 2) { row[rng_below(&rng, V)] = __float2bfloat16(m % 2 ? INFINITY : -INFINITY); }
        if (m % 5 == 3) {
            for (int i = 0; i < V; i++) { row[i] = __float2bfloat16(-1.0f); }
            row[V / 2] = __float2bfloat16(-0.0f);
            row[V - 1] = __float2bfloat16(0.0f);
        }
    }
    std::vector<int> want(M);
    for (int m = 0; m < M; m++) { want[m] = logits_greedy(logits.data() + (size_t)m * Vp, V); }
    bf16* d_logits = upload(logits);
    int* d_best = poisoned<int>(M);
    greedy_kernel<<<M, 1024>>>(d_best, d_logits, V, Vp);
    cudaCheck(cudaGetLastError());
    std::vector<int> best = download(d_best, M);
    int wrong = 0;
    for (int m = 0; m < M; m++) { wrong += best[m] != want[m]; }
    CHECK(wrong == 0, "greedy (%s): %d of %d rows differ from logits_greedy (row 0: %d, want %d)", shape, wrong, M,
          best[0], want[0]);
    cuda_free(d_logits); cuda_free(d_best);
}

static void test_stats(int L, int M, int H) {
    char shape[64];
    snprintf(shape, sizeof(shape), "L %d, M %d", L, M);
    std::vector<float> losses(M), row_l1((size_t)L * M);
    std::vector<int> row_active((size_t)L * M);
    for (auto& x : losses) { x = (float)(12 * rng_uniform(&rng)); }
    for (auto& x : row_l1) { x = (float)(100 * rng_uniform(&rng)); }
    for (auto& x : row_active) { x = (int)rng_below(&rng, H + 1); }
    std::vector<double> acc_start(1 + 3 * L);
    for (int i = 0; i < 1 + 3 * L; i++) { acc_start[i] = 1000 * rng_uniform(&rng); }
    for (int l = 0; l < L; l++) { acc_start[3 + 3 * l] = (double)rng_below(&rng, H + 1); } // an earlier max
    std::vector<double> acc_ref = acc_start;
    forward_stats_accumulate(acc_ref.data(), losses.data(), row_l1.data(), row_active.data(), L, M);

    double* d_acc = upload(acc_start);
    float *d_losses = upload(losses), *d_l1 = upload(row_l1);
    int* d_active = upload(row_active);
    forward_stats_accumulate_cuda(d_acc, d_losses, d_l1, d_active, L, M);
    std::vector<double> acc = download(d_acc, acc_start.size());
    check_close("forward_stats", "sums", shape, acc, acc_ref, 1e-12);
    std::vector<double> max_gpu(L), max_ref(L);
    for (int l = 0; l < L; l++) { max_gpu[l] = acc[3 + 3 * l]; max_ref[l] = acc_ref[3 + 3 * l]; }
    check_exact("forward_stats", "max firing units", shape, max_gpu, max_ref);
    reupload(d_acc, acc_start);
    forward_stats_accumulate_cuda(d_acc, d_losses, d_l1, d_active, L, M);
    check_deterministic("forward_stats", "acc", shape, same_bits(acc, download(d_acc, acc_start.size())));
    cuda_free(d_acc); cuda_free(d_losses); cuda_free(d_l1); cuda_free(d_active);
}

// ----------------------------------------------------------------------------
// optimizer

static void test_adamw(size_t n, double grad_std, float grad_clip, int t, float weight_decay) {
    char shape[96];
    snprintf(shape, sizeof(shape), "n %zu, clip %g, t %d, wd %g", n, grad_clip, t, weight_decay);
    std::vector<float> grads = random_float(n, 0, grad_std);
    double norm_sq_ref = 0;
    for (float g : grads) { norm_sq_ref += (double)g * g; }
    float *d_grads = upload(grads), *d_norm_sq = poisoned<float>(1), *d_scratch = poisoned<float>(GLOBAL_NORM_BLOCKS);
    global_norm_squared_cuda(d_norm_sq, d_grads, n, d_scratch);
    std::vector<float> norm_sq = download(d_norm_sq, 1);
    check_close("global_norm_squared", "norm^2", shape, norm_sq, std::vector<double>{norm_sq_ref}, 1e-6);
    cudaCheck(cudaMemset(d_norm_sq, 0xFF, sizeof(float)));
    cudaCheck(cudaMemset(d_scratch, 0xFF, GLOBAL_NORM_BLOCKS * sizeof(float)));
    global_norm_squared_cuda(d_norm_sq, d_grads, n, d_scratch);
    check_deterministic("global_norm_squared", "norm^2", shape, same_bits(norm_sq, download(d_norm_sq, 1)));

    // the reference takes the clip factor that the device computes from the device's norm
    OptimConfig opt = {1e-3f, 0.9f, 0.95f, 1e-8f, weight_decay, grad_clip, 0, 0, 0.0f};
    float norm = sqrtf(norm_sq[0]);
    float scale = grad_clip > 0 && norm > grad_clip ? grad_clip / norm : 1.0f;
    std::vector<float> master = random_float(n, 0, 0.02), m = random_float(n, 0, 1e-3), v(n);
    for (auto& x : v) { x = (float)(1e-6 * rng_uniform(&rng)); }
    float *d_master = upload(master), *d_m = upload(m), *d_v = upload(v);
    bf16* d_params = poisoned<bf16>(n);
    double* d_loss = upload(std::vector<double>{3.5});
    adamw_update(master.data(), grads.data(), m.data(), v.data(), n, opt.lr, &opt, t, scale, 1);
    adamw_update_cuda(d_master, d_params, d_grads, d_m, d_v, n, opt.lr, opt.beta1, opt.beta2, opt.eps, weight_decay, t,
                      d_norm_sq, grad_clip, d_loss);
    std::vector<float> master_gpu = download(d_master, n);
    check_close("adamw_update", "master", shape, master_gpu, to_double(master), 1e-6);
    check_close("adamw_update", "m", shape, download(d_m, n), to_double(m), 1e-6);
    check_close("adamw_update", "v", shape, download(d_v, n), to_double(v), 1e-6);
    std::vector<bf16> params_expected(n);
    for (size_t i = 0; i < n; i++) { params_expected[i] = __float2bfloat16_rn(master_gpu[i]); }
    check_exact("adamw_update", "params = bf16(master)", shape, download(d_params, n), params_expected);

    // a NaN gradient norm or an infinite loss: the step changes nothing
    std::vector<float> m_gpu = download(d_m, n), v_gpu = download(d_v, n);
    std::vector<bf16> params_gpu = download(d_params, n);
    for (int bad = 0; bad < 2; bad++) {
        reupload(d_norm_sq, std::vector<float>{bad == 0 ? NAN : norm_sq[0]});
        reupload(d_loss, std::vector<double>{bad == 0 ? 3.5 : INFINITY});
        adamw_update_cuda(d_master, d_params, d_grads, d_m, d_v, n, opt.lr, opt.beta1, opt.beta2, opt.eps, weight_decay,
                          t + 1, d_norm_sq, grad_clip, d_loss);
        const char* what = bad == 0 ? "skipped on a NaN norm: master, m, v, params unchanged"
                                    : "skipped on an inf loss: master, m, v, params unchanged";
        CHECK(same_bits(master_gpu, download(d_master, n)) && same_bits(m_gpu, download(d_m, n)) &&
              same_bits(v_gpu, download(d_v, n)) && same_bits(params_gpu, download(d_params, n)),
              "adamw_update %s (%s)", what, shape);
    }
    cuda_free(d_grads); cuda_free(d_norm_sq); cuda_free(d_scratch); cuda_free(d_master); cuda_free(d_m);
    cuda_free(d_v); cuda_free(d_params); cuda_free(d_loss);
}

// ----------------------------------------------------------------------------
// timings at the paper's shapes (--bench): inputs filled on the device, never zeros

__device__ __forceinline__ float hash_uniform(size_t i, uint32_t seed) { // in [0, 1)
    uint32_t x = (uint32_t)i * 0x9E3779B1u ^ (uint32_t)(i >> 32) ^ seed * 0x85EBCA77u;
    x ^= x >> 16; x *= 0x7FEB352Du; x ^= x >> 15; x *= 0x846CA68Bu; x ^= x >> 16;
    return (x >> 8) * (1.0f / 16777216.0f);
}

template <typename T>
__global__ void fill_uniform_kernel(T* x, size_t n, uint32_t seed, float lo, float hi) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        x[i] = (T)(lo + (hi - lo) * hash_uniform(i, seed));
    }
}

template <typename T>
static T* device_uniform(size_t n, float lo, float hi) {
    static uint32_t seed = 1;
    T* x = (T*)cuda_malloc(n * sizeof(T));
    fill_uniform_kernel<<<1024, 256>>>(x, n, seed++, lo, hi);
    cudaCheck(cudaGetLastError());
    return x;
}

static double copy_gbps = 0;

static void bench_row(const char* kernel, const char* shape, float ms, double bytes) {
    double gbps = bytes / (ms * 1e-3) / 1e9;
    printf("%-28s %-34s %9.3f ms %8.0f GB/s %5.0f%%\n", kernel, shape, ms, gbps,
           copy_gbps > 0 ? 100 * gbps / copy_gbps : 100.0);
}

static void bench(void) {
    const int M = 16384, D = 2048, H = 5632, V = 50257, Vp = 50304, L = 28, B = 8, T = 2048, NH = 32, hd = 64;
    const size_t MD = (size_t)M * D, MH = (size_t)M * H, MV = (size_t)M * Vp;
    printf("\n%-28s %-34s %12s %13s %6s\n", "kernel", "shape", "median", "bandwidth", "/copy");

    const size_t copy_bytes = (size_t)1 << 31;
    char *src = device_uniform<char>(copy_bytes, 0, 100), *dst = (char*)cuda_malloc(copy_bytes);
    float ms = median_ms([&] {
        cudaCheck(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, main_stream));
    });
    copy_gbps = 2.0 * copy_bytes / (ms * 1e-3) / 1e9;
    bench_row("device-to-device copy", "2 GiB", ms, 2.0 * copy_bytes);
    cuda_free(src); cuda_free(dst);

    // tokens with a Zipf-like (p ~ 1/rank) law: the most frequent id is ~9% of the batch
    std::vector<int> tokens(M);
    for (int m = 0; m < M; m++) { tokens[m] = std::min(V - 1, (int)exp(rng_uniform(&rng) * log((double)V)) - 1); }
    std::vector<int> sorted = tokens;
    std::sort(sorted.begin(), sorted.end());
    size_t unique = std::unique(sorted.begin(), sorted.end()) - sorted.begin();
    int* d_tokens = upload(tokens);
    bf16* wte = device_uniform<bf16>((size_t)Vp * D, -1, 1);
    float* dwte = device_uniform<float>((size_t)Vp * D, -1, 1);
    bf16 *x = device_uniform<bf16>(MD, -1, 1), *y = device_uniform<bf16>(MD, -1, 1);
    bf16* out = device_uniform<bf16>(MD, -1, 1);
    bf16 *x_out = device_uniform<bf16>(MD, -1, 1), *w = device_uniform<bf16>(D, 0.5, 1.5);
    float *rstd = device_uniform<float>(M, 0.5, 1.5), *dw = device_uniform<float>(D, -1, 1);
    float* scratch = device_uniform<float>((size_t)1024 * D, -1, 1);
    char shape[64];
    snprintf(shape, sizeof(shape), "M %d, D %d", M, D);
    bench_row("encoder_forward", shape, median_ms([&] { encoder_forward(out, d_tokens, wte, M, D); }), 4.0 * MD);
    snprintf(shape, sizeof(shape), "M %d, D %d, %zu ids", M, D, unique);
    bench_row("encoder_backward", shape, median_ms([&] { encoder_backward(dwte, x, d_tokens, M, D); }),
              2.0 * MD + 8.0 * unique * D);
    snprintf(shape, sizeof(shape), "M %d, D %d", M, D);
    bench_row("rmsnorm_forward", shape, median_ms([&] { rmsnorm_forward(out, rstd, x, w, M, D, 1e-5f); }), 4.0 * MD);
    bench_row("fused_residual_rmsnorm", shape,
              median_ms([&] { fused_residual_rmsnorm_forward(x_out, out, rstd, x, y, w, M, D, 1e-5f); }), 8.0 * MD);
    bench_row("rmsnorm_backward", shape, median_ms([&] { rmsnorm_backward(out, dw, scratch, y, x, w, rstd, M, D); }),
              8.0 * MD);
    cuda_free(d_tokens); cuda_free(wte); cuda_free(dwte); cuda_free(x); cuda_free(y); cuda_free(out);
    cuda_free(x_out); cuda_free(w); cuda_free(rstd); cuda_free(dw); cuda_free(scratch);

    const size_t qkv_n = (size_t)B * T * 3 * NH * hd;
    bf16* qkv = device_uniform<bf16>(qkv_n, -1, 1);
    snprintf(shape, sizeof(shape), "B %d, T %d, NH=NKV %d, hd %d", B, T, NH, hd);
    bench_row("rope_forward", shape, median_ms([&] { rope_forward(qkv, B, T, 0, NH, NH, hd, 10000.0f); }),
              qkv_n * 2.0 * 2 / 3 * 2);
    cuda_free(qkv);

    bf16 *g = device_uniform<bf16>(MH, -1, 1), *u = device_uniform<bf16>(MH, -1, 1);
    bf16 *h = device_uniform<bf16>(MH, -1, 1), *dh = device_uniform<bf16>(MH, -1, 1);
    bf16 *dg = device_uniform<bf16>(MH, -1, 1), *du = device_uniform<bf16>(MH, -1, 1);
    float* row_l1 = device_uniform<float>((size_t)L * M, 0, 1);
    int* row_active = (int*)cuda_malloc((size_t)L * M * sizeof(int));
    cudaCheck(cudaMemset(row_active, 0, (size_t)L * M * sizeof(int)));
    uint8_t* fired = (uint8_t*)cuda_malloc(H);
    snprintf(shape, sizeof(shape), "M %d, H %d", M, H);
    bench_row("relu_gate_forward", shape, median_ms([&] {
        cudaCheck(cudaMemsetAsync(fired, 0, H, main_stream)); // each step starts with no marks
        relu_gate_forward(h, row_l1, row_active, fired, g, u, M, H);
    }), 6.0 * MH);
    bench_row("relu_gate_backward", shape, median_ms([&] { relu_gate_backward(dg, du, dh, g, u, h, 1e-6f, M, H); }),
              12.0 * MH);
    // SiLU's (a dense model's): the same bytes, a few more flops
    bench_row("relu_gate_forward silu", shape, median_ms([&] {
        cudaCheck(cudaMemsetAsync(fired, 0, H, main_stream));
        relu_gate_forward(h, row_l1, row_active, fired, g, u, M, H, 0, ACT_SILU);
    }), 6.0 * MH);
    bench_row("relu_gate_backward silu", shape,
              median_ms([&] { relu_gate_backward(dg, du, dh, g, u, h, 0.0f, M, H, ACT_SILU); }), 12.0 * MH);
    cuda_free(g); cuda_free(u); cuda_free(h); cuda_free(dh); cuda_free(dg); cuda_free(du); cuda_free(fired);

    bf16 *logits = device_uniform<bf16>(MV, -4, 4), *dlogits = device_uniform<bf16>(MV, -1, 1);
    std::vector<int> targets(M);
    for (int m = 0; m < M; m++) { targets[m] = (int)rng_below(&rng, V); }
    int* d_targets = upload(targets);
    float* losses = device_uniform<float>(M, 0, 1);
    double* acc = device_uniform<double>(1 + 3 * L, 0, 1);
    snprintf(shape, sizeof(shape), "M %d, V %d, Vp %d", M, V, Vp);
    bench_row("crossentropy", shape,
              median_ms([&] { crossentropy_forward_backward(dlogits, losses, logits, d_targets, M, V, Vp, 1.0f / M); }),
              4.0 * MV);
    bench_row("crossentropy (loss only)", shape,
              median_ms([&] {
                  crossentropy_forward_backward((bf16*)NULL, losses, logits, d_targets, M, V, Vp, 1.0f / M);
              }),
              2.0 * MV);
    snprintf(shape, sizeof(shape), "L %d, M %d", L, M);
    bench_row("forward_stats", shape,
              median_ms([&] { forward_stats_accumulate_cuda(acc, losses, row_l1, row_active, L, M); }),
              4.0 * M + 8.0 * L * M);
    cuda_free(logits); cuda_free(dlogits); cuda_free(d_targets); cuda_free(losses); cuda_free(acc);
    cuda_free(row_l1); cuda_free(row_active);

    const size_t n = (size_t)1 << 28;
    float *master = device_uniform<float>(n, -0.05f, 0.05f), *grads = device_uniform<float>(n, -1e-4f, 1e-4f);
    float *m = device_uniform<float>(n, -1e-4f, 1e-4f), *v = device_uniform<float>(n, 0, 1e-8f);
    float *norm_sq = device_uniform<float>(1, 0, 1), *norm_scratch = device_uniform<float>(GLOBAL_NORM_BLOCKS, 0, 1);
    bf16* params = device_uniform<bf16>(n, -1, 1);
    snprintf(shape, sizeof(shape), "n 2^28");
    bench_row("global_norm_squared", shape, median_ms([&] { global_norm_squared_cuda(norm_sq, grads, n, norm_scratch); }),
              4.0 * n);
    bench_row("adamw_update", shape, median_ms([&] {
        adamw_update_cuda(master, params, grads, m, v, n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 10, norm_sq, 1.0f, NULL);
    }), 30.0 * n);
    cuda_free(master); cuda_free(grads); cuda_free(m); cuda_free(v); cuda_free(norm_sq); cuda_free(norm_scratch);
    cuda_free(params);
}

int main(int argc, char** argv) {
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s\n", prop.name);

    test_gemm_pair(1, 8, 16);
    test_gemm_pair(77, 136, 64);
    test_gemm_pair(256, 5632, 256); // the FFN's width

    for (int M : {1, 7, 1000}) {
        for (int D : {64, 768, 2048}) { test_encoder(M, D, 1000); }
    }
    test_encoder(16384, 2048, 5000); // long scans and ids repeated ~1000 times
    test_encoder(300, 4096, 50);     // more columns than threads: two column passes

    for (int M : {1, 7, 1000}) {
        for (int D : {64, 768, 2048}) { test_rmsnorm(M, D); }
    }
    test_rmsnorm(40000, 64); // more than 1024 * 32 rows: rows per block grows past 32

    test_rope(1, 7, 0, 4, 2, 16);       // the e2e tiny model (hd 16, GQA)
    test_rope(2, 1000, 0, 12, 12, 64);  // 124M class
    test_rope(1, 7, 1000, 12, 12, 64);  // inference at a later position
    test_rope(1, 2048, 0, 16, 4, 128);  // hd 128, GQA, long positions
    test_rope(3, 5, 0, 3, 1, 6);        // an odd half (3 pairs)

    for (int M : {1, 7, 1000}) {
        for (int H : {128, 2048, 5632}) {
            test_gate(M, H, true);
            test_gate(M, H, true, ACT_SILU);
        }
    }
    test_gate(33, 5632, false);
    test_gate(33, 5632, false, ACT_SILU);
    for (int act : {ACT_RELU, ACT_SILU}) { test_dense_ffn(7, 64, 128, act); test_dense_ffn(300, 256, 704, act); }

    test_crossentropy(1, 50257, 50304);
    test_crossentropy(7, 50257, 50304);
    test_crossentropy(64, 50257, 50304);
    test_crossentropy(1000, 100, 128);   // a small vocab: most threads own no logit
    test_crossentropy(3, 70000, 70016);  // two tiles: the first one is read twice
    test_greedy(16, 50257, 50304);
    test_greedy(5, 100, 128);            // fewer logits than threads
    test_greedy(3, 70000, 70016);

    test_stats(1, 1, 128);
    test_stats(2, 7, 128);
    test_stats(28, 16384, 5632);

    for (size_t n : {(size_t)1, (size_t)7, (size_t)1000, ((size_t)1 << 20) + 3}) {
        test_adamw(n, 1.0, 1.0f, 1, 0.1f);     // clipped (the norm is ~sqrt(n) for n > 1)
        test_adamw(n, 1e-4, 1.0f, 10, 0.1f);   // not clipped
        test_adamw(n, 1.0, 0.0f, 100, 0.0f);   // no clipping, no decay
    }

    printf("\n%-52s %12s %10s\n", "output", "worst error", "limit");
    for (int i = 0; i < num_worst; i++) {
        if (worst[i].tol == 0) {
            printf("%-52s %12.0f %10s\n", worst[i].output, worst[i].err, "exact");
        } else {
            printf("%-52s %12.3g %10.0e\n", worst[i].output, worst[i].err, worst[i].tol);
        }
    }
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) { bench(); }
    return test_summary("test_kernels");
}
