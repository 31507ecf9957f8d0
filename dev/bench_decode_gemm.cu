/*
 The decode step's products: what cuBLASLt's heuristic's first choice takes
 against the other algorithms it offers, and against decode_mma (our tensor-core
 product, llmc/cuda_matmul.cuh), for the few rows of a decode step
 (y[B, N] = x[B, K] W[N, K]^T) at the 1.5B preset's shapes: qkv, Wo, the gate,
 the dense FFN's g and u (one batched product; decode_mma: one of 2N rows),
 the down, the head.
 For each shape and row count, up to 32 algorithms the heuristic returns are
 timed (the median of `iters` runs, taken in turn, round by round, so that all
 see the same clock); before each run a 256 MB read evicts the weights from
 L2 (a decode step finds them in DRAM; a read leaves no dirty lines behind, as a
 memset would). Printed: the first choice's time, the fastest's, its place in
 the heuristic's list, its split-K count and tile, decode_mma's time (and its
 largest difference from cuBLASLt's result, relative to the largest |y|), and
 the share of the read bandwidth (measured in the same run) each reaches on the
 weights' bytes.
 usage: build/dev/bench_decode_gemm [iters (default 30)]
*/
#include <stdio.h>
#include <stdlib.h>
#include <vector>
#include "llmc/cuda_matmul.cuh"
#include "test/gpu/gpu_util.cuh"

struct Product {
    const char* name;
    int N, K, batch; // batch 2: two products sharing x (g and u), their W and y one after the other
};

static int algo_config(const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
    int value = 0;
    size_t written = 0;
    cublasCheck(cublasLtMatmulAlgoConfigGetAttribute(algo, attr, &value, sizeof(value), &written));
    return value;
}

int main(int argc, char** argv) {
    const int iters = argc > 1 ? atoi(argv[1]) : 30;
    if (iters < 1) { fatal("bench_decode_gemm: iters %s must be a positive count", argv[1]); }
    cudaCheck(cudaStreamCreateWithFlags(&main_stream, cudaStreamNonBlocking));
    cublaslt_init();
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    const double bw = measure_read_bandwidth();
    printf("%s, %d SMs, reads %.2f TB/s (measured). Median of %d runs, L2 evicted by a 256 MB read before each\n",
           prop.name, prop.multiProcessorCount, bw / 1e12, iters);
    const Product products[] = {{"qkv", 6144, 2048, 1}, {"Wo", 2048, 2048, 1}, {"gate", 5632, 2048, 1},
                                {"g and u", 5632, 2048, 2}, {"down", 2048, 5632, 1}, {"head", 50304, 2048, 1}};
    const size_t flush_bytes = (size_t)256 << 20;
    uint4* flush = (uint4*)cuda_malloc(flush_bytes);
    cudaCheck(cudaMemset(flush, 0, flush_bytes));
    unsigned int* sink = (unsigned int*)cuda_malloc(sizeof(unsigned int));
    const size_t max_w = (size_t)2 * 50304 * 2048, max_y = (size_t)16 * 2 * 50304;
    bf16* w = (bf16*)cuda_malloc(max_w * sizeof(bf16));
    bf16* x = (bf16*)cuda_malloc((size_t)16 * 5632 * sizeof(bf16));
    bf16* y = (bf16*)cuda_malloc(max_y * sizeof(bf16));
    cudaCheck(cudaMemset(w, 0x3c, max_w * sizeof(bf16))); // (bf16 0.0115 everywhere: nonzero operands)
    cudaCheck(cudaMemset(x, 0x3c, (size_t)16 * 5632 * sizeof(bf16)));
    printf("\n%-8s %2s %5s %5s | %8s %8s %6s | %5s %6s %6s | %8s %9s | %9s %9s %9s\n", "product", "B", "N", "K", "first",
           "fastest", "gain", "place", "splitK", "tile", "ours", "ours diff", "first BW", "best BW", "ours BW");
    for (const Product& p : products) {
        for (int B : {4, 8, 16}) {
            MatmulShape shape = matmul_shape(CUDA_R_16BF, B, p.N, p.K, 0, 1, p.batch, (long long)p.N * p.K,
                                             (long long)B * p.N);
            cublasLtMatmulHeuristicResult_t results[32];
            const int found = matmul_algorithms(&shape, results, 32);
            std::vector<std::function<void()>> runs;
            for (int i = 0; i < found; i++) {
                runs.push_back([&, i] { matmul_run(&shape, &results[i].algo, y, x, w, 0); });
            }
            const int N_all = p.N * p.batch;
            runs.push_back([&] { decode_mma(y, x, w, B, N_all, p.K); });
            std::vector<float> t = median_ms_interleaved(runs, iters, 2, [&](int) {
                stream_read_kernel<<<4 * prop.multiProcessorCount, 1024, 0, main_stream>>>(flush, flush_bytes / 16, sink);
                cudaCheck(cudaGetLastError());
            });
            int best = 0; // (of cuBLASLt's)
            for (int i = 1; i < found; i++) { best = t[i] < t[best] ? i : best; }
            // decode_mma's result against cuBLASLt's first choice (batch 2: cuBLASLt's [2][B][N], ours [B][2N])
            matmul_run(&shape, &results[0].algo, y, x, w, 0);
            std::vector<bf16> y_blas = download(y, (size_t)B * N_all);
            decode_mma(y, x, w, B, N_all, p.K);
            std::vector<bf16> y_ours = download(y, (size_t)B * N_all);
            double diff = 0, largest = 0;
            for (int i = 0; i < p.batch; i++) {
                for (int b = 0; b < B; b++) {
                    for (int n = 0; n < p.N; n++) {
                        const double blas = __bfloat162float(y_blas[((size_t)i * B + b) * p.N + n]);
                        diff = fmax(diff, fabs((double)__bfloat162float(y_ours[(size_t)b * N_all + i * p.N + n]) - blas));
                        largest = fmax(largest, fabs(blas));
                    }
                }
            }
            const double bytes = (double)p.batch * p.N * p.K * sizeof(bf16);
            const float ours = t[found];
            printf("%-8s %2d %5d %5d | %8.2f %8.2f %5.2fx | %2d/%2d %6d %6d | %8.2f %9.1e | %8.0f%% %8.0f%% %8.0f%%\n", p.name,
                   B, N_all, p.K, 1e3 * t[0], 1e3 * t[best], t[0] / t[best], best, found,
                   algo_config(&results[best].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                   algo_config(&results[best].algo, CUBLASLT_ALGO_CONFIG_TILE_ID), 1e3 * ours, diff / largest,
                   100 * bytes / (t[0] * 1e-3) / bw, 100 * bytes / (t[best] * 1e-3) / bw, 100 * bytes / (ours * 1e-3) / bw);
            matmul_shape_free(&shape);
        }
    }
    printf("  (us; first: the heuristic's first choice, which gemm runs; place: the fastest's index in its list of"
           " the found; ours: decode_mma; BW: the weights' bytes over the time, as a share of the measured read"
           " bandwidth)\n");
    cuda_free(flush); cuda_free(sink); cuda_free(w); cuda_free(x); cuda_free(y);
    return 0;
}
