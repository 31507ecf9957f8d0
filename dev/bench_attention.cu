/*
 Times the CUDA attention (llmc/cuda_attention.cuh) at B 4, T 2048, D 2048:
 32 heads of 64 (the paper's 1.5B shape) and 16 heads of 128, NKV = NH.
 - forward, and forward + backward, through the entry points gpt.h calls
   (the wgmma path on a Hopper GPU), and on the mma.sync path;
 - each kernel alone: the mma.sync ones at their default warps, the wgmma
   ones at their default tiles and a few others (warpgroups per CTA x keys or
   queries per shared tile);
 - a naive baseline on the same inputs: S = Q K^T for all T x T pairs with
   cublasGemmStridedBatchedEx (bf16 out, fp32 accumulation), a causal softmax
   kernel in place, O = P V, as a framework without fused attention would do;
   its output is compared with ours as a check.
 Each time is the median of `iters` runs (after 3 warm-up runs), between two
 cudaEvents. TFLOP/s counts causal flops: a T x T x hd product over the
 causal half is B NH T^2 hd flops; the forward has 2 (fwd = 2*2*B*NH*T*T*hd/2),
 the backward is counted as 2.5x the forward (5 products), whatever a kernel
 recomputes; the per-kernel lines count the products each kernel does.
 usage: build/dev/bench_attention [iters (default 20)]
*/
#include <algorithm>
#include <type_traits>
#include <vector>
#include <cublas_v2.h>
#include "llmc/cuda_attention.cuh"
#include "llmc/rng.h"
#include "test/gpu/gpu_util.cuh"

static void cublas_check(cublasStatus_t status, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS) { fatal("cuBLAS error %d at %s:%d", (int)status, file, line); }
}
#define cublasCheck(status) cublas_check((status), __FILE__, __LINE__)

// uniform values of mean 0 and variance 1 from a hash of the index: random data, made on the device
__global__ void fill_random_kernel(bf16* x, size_t n, uint64_t seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    uint64_t z = seed + i * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    x[i] = __float2bfloat16(((float)(z >> 40) / 16777216.0f - 0.5f) * 3.4641016f);
}

static void fill_random(bf16* x, size_t n, uint64_t seed) {
    fill_random_kernel<<<(unsigned)((n + 255) / 256), 256, 0, main_stream>>>(x, n, seed);
    cudaCheck(cudaGetLastError());
}

// the baseline's softmax: a block per row t of one (b, h), in place on
// s[t][0..T): p = softmax(scale * s) over j <= t, 0 after
__global__ void causal_softmax_kernel(bf16* s, int T, float scale) {
    size_t row = blockIdx.x;
    int t = (int)(row % T);
    bf16* x = s + row * T;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j <= t; j += blockDim.x) { mx = fmaxf(mx, __bfloat162float(x[j]) * scale); }
    mx = block_reduce<Max>(mx);
    float sum = 0.0f;
    for (int j = threadIdx.x; j <= t; j += blockDim.x) { sum += expf(__bfloat162float(x[j]) * scale - mx); }
    sum = block_reduce<Sum>(sum);
    for (int j = threadIdx.x; j < T; j += blockDim.x) {
        x[j] = __float2bfloat16(j <= t ? expf(__bfloat162float(x[j]) * scale - mx) / sum : 0.0f);
    }
}

// out = softmax(causal(Q K^T / sqrt(hd))) V with the whole score matrix s [B, NH, T, T] in memory (NKV == NH)
static void naive_attention_forward(cublasHandle_t handle, bf16* out, bf16* s, const bf16* qkv, int B, int T,
                                    int NH, int hd) {
    const float one = 1.0f, zero = 0.0f;
    long long QKV = 3LL * NH * hd, D = (long long)NH * hd, TT = (long long)T * T;
    for (int b = 0; b < B; b++) {
        const bf16* q = qkv + (size_t)b * T * QKV;
        const bf16* k = q + D;
        bf16* sb = s + (size_t)b * NH * TT;
        // column-major view: S^T[j, t] = sum_i K[j, i] Q[t, i], so S is row-major [t][j]
        cublasCheck(cublasGemmStridedBatchedEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, &one, k, CUDA_R_16BF,
                                               (int)QKV, hd, q, CUDA_R_16BF, (int)QKV, hd, &zero, sb, CUDA_R_16BF, T,
                                               TT, NH, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    causal_softmax_kernel<<<(unsigned)(B * NH * T), 256, 0, main_stream>>>(s, T, 1.0f / sqrtf((float)hd));
    cudaCheck(cudaGetLastError());
    for (int b = 0; b < B; b++) {
        const bf16* v = qkv + (size_t)b * T * QKV + 2 * D;
        // O^T[i, t] = sum_j V[j, i] P[t, j]
        cublasCheck(cublasGemmStridedBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, &one, v, CUDA_R_16BF,
                                               (int)QKV, hd, s + (size_t)b * NH * TT, CUDA_R_16BF, T, TT, &zero,
                                               out + (size_t)b * T * D, CUDA_R_16BF, (int)D, hd, NH,
                                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
}

static void report(const char* what, float ms, double flops) {
    printf("  %-40s %8.3f ms %7.1f TFLOP/s\n", what, ms, flops / (ms * 1e-3) / 1e12);
}

template <int HD>
static void bench_shape(cublasHandle_t handle, int B, int T, int NH, int iters) {
    using namespace attention_detail;
    int NKV = NH, hd = HD;
    size_t M = (size_t)B * T, D = (size_t)NH * hd, QKV = D + 2 * (size_t)NKV * hd;
    bf16* qkv = (bf16*)cuda_malloc(M * QKV * sizeof(bf16));
    bf16* dqkv = (bf16*)cuda_malloc(M * QKV * sizeof(bf16));
    bf16* out = (bf16*)cuda_malloc(M * D * sizeof(bf16));
    bf16* out_naive = (bf16*)cuda_malloc(M * D * sizeof(bf16));
    bf16* dout = (bf16*)cuda_malloc(M * D * sizeof(bf16));
    float* lse = (float*)cuda_malloc(M * NH * sizeof(float));
    float* scratch = (float*)cuda_malloc(M * NH * sizeof(float));
    bf16* scores = (bf16*)cuda_malloc((size_t)B * NH * T * T * sizeof(bf16));
    fill_random(qkv, M * QKV, 1);
    fill_random(dout, M * D, 2);

    double fwd_flops = 2.0 * 2.0 * B * NH * (double)T * T * hd / 2; // one causal product is fwd_flops / 2
    printf("B %d T %d NH %d NKV %d hd %d\n", B, T, NH, NKV, hd);
    float fwd = median_ms([&] { attention_forward(out, lse, qkv, B, T, NH, NKV, hd); }, iters, 3);
    float fwd_bwd = median_ms([&] {
        attention_forward(out, lse, qkv, B, T, NH, NKV, hd);
        attention_backward(dqkv, scratch, dout, out, qkv, lse, B, T, NH, NKV, hd);
    }, iters, 3);
    float mma_fwd = median_ms([&] { attention_forward_on(kMmaPath, out, lse, qkv, B, T, NH, NKV, hd); }, iters, 3);
    float mma_fwd_bwd = median_ms([&] {
        attention_forward_on(kMmaPath, out, lse, qkv, B, T, NH, NKV, hd);
        attention_backward_on(kMmaPath, dqkv, scratch, dout, out, qkv, lse, B, T, NH, NKV, hd);
    }, iters, 3);
    float naive = median_ms([&] { naive_attention_forward(handle, out_naive, scores, qkv, B, T, NH, hd); }, iters, 3);
    printf("  entry points (%s path):\n", attention_path(hd, out, qkv) == kWgmmaPath ? "wgmma" : "mma.sync");
    report("forward", fwd, fwd_flops);
    report("forward + backward", fwd_bwd, 3.5 * fwd_flops);
    report("backward (difference)", fwd_bwd - fwd, 2.5 * fwd_flops);
    printf("  mma.sync path:\n");
    report("forward", mma_fwd, fwd_flops);
    report("forward + backward", mma_fwd_bwd, 3.5 * fwd_flops);
    report("backward (difference)", mma_fwd_bwd - mma_fwd, 2.5 * fwd_flops);
    report("naive cuBLAS forward (causal flops)", naive, fwd_flops);
    printf("  forward speedup over naive: %.2fx\n", naive / fwd);

    // each kernel alone (out, lse, delta from the runs above); flops of the products each does
    printf("  kernels, mma.sync path:\n");
    attention_delta(scratch, dout, out, B, T, NH, hd);
    float delta_ms = median_ms([&] { attention_delta(scratch, dout, out, B, T, NH, hd); }, iters, 3);
    printf("  %-40s %8.3f ms %7.1f GB/s\n", "delta", delta_ms, 2.0 * M * D * sizeof(bf16) / (delta_ms * 1e-3) / 1e9);
    char what[64];
    snprintf(what, sizeof(what), "forward, %d warps", kFwdWarps);
    report(what, median_ms([&] { attention_forward_mma<HD, kFwdWarps>(out, lse, qkv, B, T, NH, NKV); }, iters, 3),
           fwd_flops);
    snprintf(what, sizeof(what), "dK dV, %d warps", kDkvWarps);
    report(what, median_ms([&] {
        attention_backward_dkdv_mma<HD, kDkvWarps>(dqkv, dout, qkv, lse, scratch, B, T, NH, NKV);
    }, iters, 3), 2.0 * fwd_flops);
    snprintf(what, sizeof(what), "dQ, %d warps", kDqWarps);
    report(what, median_ms([&] {
        attention_backward_dq_mma<HD, kDqWarps>(dqkv, dout, qkv, lse, scratch, B, T, NH, NKV);
    }, iters, 3), 1.5 * fwd_flops);
    if (device_has_wgmma()) {
        printf("  kernels, wgmma path (warpgroups x rows of a shared tile, stages; * the default):\n");
        using Tiles = WgmmaTiles<HD>;
        auto fwd_variant = [&](auto bk, auto nwg, auto stages) {
            constexpr int BK = decltype(bk)::value, NWG = decltype(nwg)::value, S = decltype(stages)::value;
            bool dflt = BK == Tiles::kFwdBlockK && NWG == Tiles::kFwdWarpgroups && S == Tiles::kFwdStages;
            snprintf(what, sizeof(what), "forward, %d x %d keys, %d%s", NWG, BK, S, dflt ? " *" : "");
            report(what, median_ms([&] { attention_forward_wgmma<HD, BK, NWG, S>(out, lse, qkv, B, T, NH, NKV); }, iters, 3),
                   fwd_flops);
        };
        auto dq_variant = [&](auto bk, auto nwg, auto stages) {
            constexpr int BK = decltype(bk)::value, NWG = decltype(nwg)::value, S = decltype(stages)::value;
            bool dflt = BK == Tiles::kDqBlockK && NWG == Tiles::kDqWarpgroups && S == Tiles::kDqStages;
            snprintf(what, sizeof(what), "dQ + delta, %d x %d keys, %d%s", NWG, BK, S, dflt ? " *" : "");
            report(what, median_ms([&] {
                attention_backward_dq_wgmma<HD, BK, NWG, S>(dqkv, scratch, dout, out, qkv, lse, B, T, NH, NKV);
            }, iters, 3), 1.5 * fwd_flops);
        };
        auto dkdv_variant = [&](auto bq, auto nwg, auto stages) {
            constexpr int BQ = decltype(bq)::value, NWG = decltype(nwg)::value, S = decltype(stages)::value;
            bool dflt = BQ == Tiles::kDkvBlockQ && NWG == Tiles::kDkvWarpgroups && S == Tiles::kDkvStages;
            snprintf(what, sizeof(what), "dK dV, %d x %d queries, %d%s", NWG, BQ, S, dflt ? " *" : "");
            report(what, median_ms([&] {
                attention_backward_dkdv_wgmma<HD, BQ, NWG, S>(dqkv, dout, qkv, lse, scratch, B, T, NH, NKV);
            }, iters, 3), 2.0 * fwd_flops);
        };
        using I1 = std::integral_constant<int, 1>;
        using I2 = std::integral_constant<int, 2>;
        using I3 = std::integral_constant<int, 3>;
        using I64 = std::integral_constant<int, 64>;
        using I128 = std::integral_constant<int, 128>;
        if constexpr (HD == 64) {
            fwd_variant(I64(), I2(), I3());
            fwd_variant(I64(), I2(), I2());
            fwd_variant(I128(), I2(), I2());
            dq_variant(I128(), I2(), I2());
            dq_variant(I64(), I2(), I2());
            dkdv_variant(I128(), I1(), I2());
            dkdv_variant(I64(), I1(), I2());
        } else {
            fwd_variant(I128(), I2(), I2());
            fwd_variant(I64(), I2(), I2());
            dq_variant(I64(), I2(), I2());
            dkdv_variant(I64(), I1(), I2());
            dkdv_variant(I64(), I2(), I2());
        }
    }

    // the two forwards agree up to the baseline's bf16 scores and probabilities
    attention_forward(out, lse, qkv, B, T, NH, NKV, hd);
    naive_attention_forward(handle, out_naive, scores, qkv, B, T, NH, hd);
    std::vector<bf16> a(M * D), b(M * D);
    cudaCheck(cudaMemcpy(a.data(), out, M * D * sizeof(bf16), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(b.data(), out_naive, M * D * sizeof(bf16), cudaMemcpyDeviceToHost));
    double diff = 0, largest = 0;
    for (size_t i = 0; i < M * D; i++) {
        double x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
        diff = isnan(x) || isnan(y) ? INFINITY : fmax(diff, fabs(x - y));
        largest = fmax(largest, fabs(y));
    }
    printf("  check: max |ours - naive| / max |naive| = %.2e%s\n", diff / largest,
           diff / largest < 5e-2 ? "" : "  MISMATCH");

    cuda_free(qkv);
    cuda_free(dqkv);
    cuda_free(out);
    cuda_free(out_naive);
    cuda_free(dout);
    cuda_free(lse);
    cuda_free(scratch);
    cuda_free(scores);
}

int main(int argc, char** argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 20;
    if (iters < 1) { fatal("iters must be positive"); }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
    cublasHandle_t handle;
    cublasCheck(cublasCreate(&handle));
    cublasCheck(cublasSetStream(handle, main_stream));
    bench_shape<64>(handle, 4, 2048, 32, iters);
    bench_shape<128>(handle, 4, 2048, 16, iters);
    cublasCheck(cublasDestroy(handle));
    return 0;
}
