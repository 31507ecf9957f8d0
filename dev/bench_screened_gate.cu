/*
 Times the screened decode gate (llmc/ffn/cuda_screened_gate.cuh) in the sparse
 decode FFN against today's sparse decode FFN and the dense decode FFN, at
 the standard width (D 2048, H 5632), for B = 1, 2, 3 rows (the GEMV's), on the
 synthetic-sparse gates of docs/SPARSE.md (sparse_synthetic_ffn: uniform k = 30,
 and realistic k = 30):
 - dense: g and u by the decode GEMV, h = relu(g) u, y = h WdT by cuBLASLt
   (the kernels of gpu_ffn_dense_decode);
 - sparse: gemv(GateUpRow), then sparse_down_active_kernel (those of
   gpu_ffn_sparse_decode);
 - screened: screened_gate(GateUpRow), then sparse_down_active_kernel;
 - the two gates (+ up) alone.
 Per B: units fired and candidates per row (the screen's !(U <= 0)), units
 whose bf16 row was read, the bytes each gate reads, and y (and a) of the
 sparse and screened paths compared bit for bit. Each time is the median of
 `iters` runs after 3 warm-up runs of each; L2 is flushed (256 MB of writes)
 before each run, as a decode step finds each layer's weights in DRAM; the
 paths are timed in turn, round by round, so that they see the same clock.
 Also the time of screen_quantize for one layer (once, at load).
 usage: build/dev/bench_screened_gate [iters (default 50)]
*/
#include <stdio.h>
#include <stdlib.h>
#include <vector>
#include "llmc/ffn/cuda_screened_gate.cuh"
#include "llmc/ffn/cuda_decode.cuh"
#include "llmc/synthetic.h"
#include "test/gpu/gpu_util.cuh"

static const int D = 2048, H = 5632, MAX_B = GEMV_MAX_ROWS;

static bf16* upload_bf16(const std::vector<float>& x) {
    std::vector<bf16> b(x.size());
    for (size_t i = 0; i < x.size(); i++) { b[i] = __float2bfloat16_rn(x[i]); }
    return upload(b);
}

int main(int argc, char** argv) {
    using namespace sparse_decode_detail;
    const int iters = argc > 1 ? atoi(argv[1]) : 50;
    if (iters < 1) { fatal("bench_screened_gate: iters %s must be a positive count", argv[1]); }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("%s, %d SMs. Decode FFN at D %d, H %d; median of %d runs, L2 flushed before each\n", prop.name,
           prop.multiProcessorCount, D, H, iters);
    cudaCheck(cudaStreamCreateWithFlags(&main_stream, cudaStreamNonBlocking));
    cublaslt_init();
    sparse_down_allow_smem(H);
    const size_t flush_bytes = (size_t)256 << 20;
    unsigned char* flush = (unsigned char*)cuda_malloc(flush_bytes);
    bf16 *gu = (bf16*)cuda_malloc((size_t)2 * MAX_B * H * sizeof(bf16));
    float *a_sparse = (float*)cuda_malloc((size_t)MAX_B * H * sizeof(float));
    float *a_screen = (float*)cuda_malloc((size_t)MAX_B * H * sizeof(float));
    bf16 *y_dense = (bf16*)cuda_malloc((size_t)MAX_B * D * sizeof(bf16));
    bf16 *y_sparse = (bf16*)cuda_malloc((size_t)MAX_B * D * sizeof(bf16));
    bf16 *y_screen = (bf16*)cuda_malloc((size_t)MAX_B * D * sizeof(bf16));
    int* candidates = (int*)cuda_malloc((MAX_B + 1) * sizeof(int));
    ScreenedGate sg = screen_gate_create(H, D, DEVICE_CUDA);
    const double bf16_gate_mb = (double)H * D * 2 / 1e6;
    const double screen_mb = ((double)H * D + (double)H * sg.groups * 4 + H * 4) / 1e6;

    printf("\n%-10s %2s %7s %7s %8s | %8s %8s %8s | %8s %8s | %6s %6s %6s  %s\n", "pattern", "B", "fired", "cand",
           "rows", "dense", "sparse", "screened", "gate", "screen g", "vs dns", "vs spr", "gate", "y, a");
    for (int realistic = 0; realistic < 2; realistic++) {
        std::vector<float> f((size_t)MAX_B * D), wg((size_t)H * D), wu((size_t)H * D), wdT((size_t)H * D);
        sparse_synthetic_ffn(f.data(), wg.data(), wu.data(), wdT.data(), MAX_B, D, H, 30.0, realistic, 11);
        bf16 *f_d = upload_bf16(f), *wg_d = upload_bf16(wg), *wu_d = upload_bf16(wu), *wdT_d = upload_bf16(wdT);
        cudaEvent_t start, stop;
        cudaCheck(cudaEventCreate(&start));
        cudaCheck(cudaEventCreate(&stop));
        cudaCheck(cudaEventRecord(start, main_stream));
        screen_quantize(&sg, wg_d);
        cudaCheck(cudaEventRecord(stop, main_stream));
        cudaCheck(cudaEventSynchronize(stop));
        float quantize_ms;
        cudaCheck(cudaEventElapsedTime(&quantize_ms, start, stop));
        cudaCheck(cudaEventDestroy(start));
        cudaCheck(cudaEventDestroy(stop));
        for (int B = 1; B <= MAX_B; B++) {
            const dim3 down_grid(ceil_div(D, SPARSE_DOWN_COLS), B);
            auto dense = [&] {
                bf16 *g = gu, *u = gu + (size_t)B * H;
                decode_linear(g, f_d, wg_d, B, H, D);
                decode_linear(u, f_d, wu_d, B, H, D);
                relu_mul(g, g, u, (size_t)B * H, NULL);
                gemm(y_dense, g, wdT_d, B, D, H, 0, 0, 0);
            };
            auto gate = [&] { gemv(GateUpRow{a_sparse, wu_d, D, H, NULL, NULL}, f_d, wg_d, B, H, D); };
            auto screen_gate = [&] { screened_gate(GateUpRow{a_screen, wu_d, D, H, NULL, NULL}, sg, wg_d, f_d, B, NULL); };
            auto sparse = [&] {
                gate();
                launch_early(sparse_down_active_kernel, down_grid, SPARSE_THREADS, sparse_down_smem(H), y_sparse,
                             (const float*)a_sparse, (const bf16*)wdT_d, D, H);
            };
            auto screened = [&] {
                screen_gate();
                launch_early(sparse_down_active_kernel, down_grid, SPARSE_THREADS, sparse_down_smem(H), y_screen,
                             (const float*)a_screen, (const bf16*)wdT_d, D, H);
            };
            // the counts, and the two sparse paths' outputs, bit for bit
            cudaCheck(cudaMemsetAsync(candidates, 0, (MAX_B + 1) * sizeof(int), main_stream));
            screened_gate(GateUpRow{a_screen, wu_d, D, H, NULL, NULL}, sg, wg_d, f_d, B, candidates);
            sparse();
            screened();
            std::vector<int> count = download(candidates, B + 1);
            std::vector<float> a1 = download(a_sparse, (size_t)B * H), a2 = download(a_screen, (size_t)B * H);
            std::vector<bf16> y1 = download(y_sparse, (size_t)B * D), y2 = download(y_screen, (size_t)B * D);
            const bool same = memcmp(a1.data(), a2.data(), a1.size() * sizeof(float)) == 0 &&
                              memcmp(y1.data(), y2.data(), y1.size() * sizeof(bf16)) == 0;
            double fired = 0, cand = 0;
            for (int b = 0; b < B; b++) {
                cand += (double)count[b] / B;
                for (int n = 0; n < H; n++) { fired += (a1[(size_t)b * H + n] != 0.0f) / (double)B; }
            }
            std::vector<float> t = median_ms_interleaved({dense, sparse, screened, gate, screen_gate}, iters, 3, [&](int round) {
                cudaCheck(cudaMemsetAsync(flush, round & 0xff, flush_bytes, main_stream));
            });
            printf("%-10s %2d %7.1f %7.1f %8d | %8.2f %8.2f %8.2f | %8.2f %8.2f | %5.2fx %5.2fx %5.2fx  %s\n",
                   realistic ? "realistic" : "uniform", B, fired, cand, count[B], 1e3 * t[0], 1e3 * t[1], 1e3 * t[2],
                   1e3 * t[3], 1e3 * t[4], t[0] / t[2], t[1] / t[2], t[3] / t[4], same ? "identical" : "DIFFER");
        }
        printf("  (us; fired: units with a != 0 per row (h rounded to 0 not counted); cand: candidates per row; rows: bf16"
               " rows of Wg read by the screen; gate reads %.1f MB, the screen %.1f MB + 4 KB a row; screen_quantize of"
               " the layer %.2f ms)\n", bf16_gate_mb, screen_mb, quantize_ms);
        cuda_free(f_d); cuda_free(wg_d); cuda_free(wu_d); cuda_free(wdT_d);
    }
    screen_gate_free(&sg, DEVICE_CUDA);
    cuda_free(flush); cuda_free(gu); cuda_free(a_sparse); cuda_free(a_screen); cuda_free(y_dense);
    cuda_free(y_sparse); cuda_free(y_screen); cuda_free(candidates);
    return 0;
}
