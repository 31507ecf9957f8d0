/*
 The screened decode gate (llmc/ffn/cuda_screened_gate.cuh) against the decode
 GEMV's gate (gemv of llmc/cuda_matmul.cuh) and the CPU reference
 (llmc/ffn/screened_gate.h), on fresh random inputs:
 - the int8 copy of Wg: q, scale words and outliers equal to the CPU's, bit
   for bit, on the adversarial rows of the CPU test (test/screened_gate_rows.h)
   at D 16, 336, 2048 and 4096; outputs poisoned (0xFF) first;
 - the gate for 1 to GEMV_MAX_ROWS (3) rows at D 2048 (H 1000: a partial
   block), D 336 (a short group and step), D 3072 and D 4096 (the widest),
   on random gates (half fire), the synthetic-sparse ones (uniform and
   realistic k = 30), units at the threshold with f outliers, and the
   adversarial rows with f holding outliers, a NaN and an inf:
   - with StoreRow: g = bf16(G) equal to the GEMV's, bit for bit, wherever
     the GEMV's g > 0, and equal or +0 elsewhere (so relu(g) is the same);
   - with GateUpRow: every a word equal to gemv(GateUpRow)'s (what
     sparse_down_active_kernel reads);
   - the candidates of each row and the units recomputed equal to the CPU
     reference's (it computes the same U bits), and the recomputed G equal
     to the CPU's emulation of the GEMV;
   - the GateUpRow launch captured in a CUDA graph gives the same bits.
 Every output is poisoned (0xFF: NaN) before each run, so a word not written
 fails the bit comparison, and so does a NaN where the GEMV has none.
*/
#include <vector>
#include "llmc/ffn/cuda_screened_gate.cuh"
#include "llmc/ffn/cuda_decode.cuh"
#include "llmc/synthetic.h"
#include "test/gpu/gpu_util.cuh"
#include "test/screened_gate_rows.h"
#include "test/test.h"

static uint64_t rng = 2024;

// the copy made on the GPU against the CPU's, for every adversarial row kind
static void test_quantize(int D) {
    const int H = 5 * ROW_KINDS;
    std::vector<uint16_t> w((size_t)H * D);
    for (int n = 0; n < H; n++) { make_row(&w[(size_t)n * D], D, n % ROW_KINDS, &rng); }
    ScreenedGate cpu = screen_gate_create(H, D, DEVICE_CPU), gpu = screen_gate_create(H, D, DEVICE_CUDA);
    screen_quantize(&cpu, w.data());
    uint16_t* w_d = upload(w);
    cudaCheck(cudaMemset(gpu.q, 0xFF, (size_t)H * D));
    cudaCheck(cudaMemset(gpu.scales, 0xFF, (size_t)H * gpu.groups * sizeof(uint32_t)));
    cudaCheck(cudaMemset(gpu.outlier, 0xFF, (size_t)H * sizeof(uint32_t)));
    screen_quantize(&gpu, reinterpret_cast<const bf16*>(w_d));
    std::vector<uint8_t> q = download(gpu.q, (size_t)H * D);
    std::vector<uint32_t> scales = download(gpu.scales, (size_t)H * gpu.groups), outlier = download(gpu.outlier, H);
    CHECK(memcmp(q.data(), cpu.q, q.size()) == 0, "int8 copy D %d: q differs from the CPU's", D);
    CHECK(memcmp(scales.data(), cpu.scales, scales.size() * sizeof(uint32_t)) == 0, "int8 copy D %d: scales differ", D);
    CHECK(memcmp(outlier.data(), cpu.outlier, outlier.size() * sizeof(uint32_t)) == 0, "int8 copy D %d: outliers differ", D);
    printf("  int8 copy D %4d: %d rows of %d kinds, the CPU's bits\n", D, H, ROW_KINDS);
    cuda_free(w_d);
    screen_gate_free(&cpu, DEVICE_CPU);
    screen_gate_free(&gpu, DEVICE_CUDA);
}

enum GateKind { GATE_RANDOM, GATE_UNIFORM, GATE_REALISTIC, GATE_THRESHOLD, GATE_ADVERSARIAL, GATE_KINDS };
static const char* gate_names[GATE_KINDS] = {"random", "synthetic uniform", "synthetic realistic", "threshold",
                                             "adversarial"};

// f [B, D] (bf16 values as floats) and wg [H, D] (bf16 bits) of the kind
static void make_gate(std::vector<float>& f, std::vector<uint16_t>& wg, int kind, int B, int H, int D) {
    std::vector<float> wgf((size_t)H * D);
    for (float& x : f) { x = (float)rng_normal(&rng); }
    for (float& x : wgf) { x = (float)(rng_normal(&rng) / sqrt((double)D)); }
    if (kind == GATE_UNIFORM || kind == GATE_REALISTIC) {
        std::vector<float> wu((size_t)H * D), wd((size_t)H * D);
        sparse_synthetic_ffn(f.data(), wgf.data(), wu.data(), wd.data(), B, D, H, 30.0 * H / 5632, kind == GATE_REALISTIC,
                             rng_next(&rng));
    }
    if (kind == GATE_THRESHOLD || kind == GATE_ADVERSARIAL) { // f outliers in rows 1.., a carrier in column D - 1
        for (int b = 1; b < B; b++) {
            for (int j = 0; j < 3; j++) { f[(size_t)b * D + rng_below(&rng, D - 1)] = 100.0f * (float)rng_normal(&rng); }
        }
        for (int b = 0; b < B; b++) { f[(size_t)b * D + D - 1] = 1.0f; }
    }
    for (float& x : f) { x = round_bf16(x); }
    for (size_t i = 0; i < wg.size(); i++) { wg[i] = bf16_from_float(wgf[i]); }
    if (kind == GATE_THRESHOLD) { // w[D-1] = bf16(-G of the rest): G is a rounding error of either sign for row 0
        for (int n = 0; n < H; n++) {
            wg[(size_t)n * D + D - 1] = 0;
            wg[(size_t)n * D + D - 1] = bf16_from_float(-screen_gemv_dot(f.data(), &wg[(size_t)n * D], D));
        }
    }
    if (kind == GATE_ADVERSARIAL) { // every row kind; a NaN and an inf in the last row of f
        for (int n = 0; n < H; n++) { make_row(&wg[(size_t)n * D], D, n % ROW_KINDS, &rng); }
        if (B > 1) {
            f[(size_t)(B - 1) * D + rng_below(&rng, D)] = NAN;
            f[(size_t)(B - 1) * D + rng_below(&rng, D)] = -INFINITY;
        }
    }
}

static void test_gate(int B, int H, int D, int kind, cudaStream_t capture_stream) {
    using namespace sparse_decode_detail;
    std::vector<float> f((size_t)B * D);
    std::vector<uint16_t> wg((size_t)H * D), fb((size_t)B * D);
    make_gate(f, wg, kind, B, H, D);
    for (size_t i = 0; i < f.size(); i++) { fb[i] = bf16_from_float(f[i]); }
    std::vector<bf16> wu((size_t)H * D);
    for (bf16& x : wu) { x = __float2bfloat16((float)(rng_normal(&rng) / sqrt((double)D))); }
    const bf16 *f_d = reinterpret_cast<const bf16*>(upload(fb)), *wg_d = reinterpret_cast<const bf16*>(upload(wg));
    bf16* wu_d = upload(wu);
    ScreenedGate sg = screen_gate_create(H, D, DEVICE_CUDA), cpu = screen_gate_create(H, D, DEVICE_CPU);
    screen_quantize(&sg, wg_d);
    screen_quantize(&cpu, wg.data());
    bf16 *g_ref = (bf16*)cuda_malloc((size_t)B * H * sizeof(bf16)), *g_scr = (bf16*)cuda_malloc((size_t)B * H * sizeof(bf16));
    float *a_ref = (float*)cuda_malloc((size_t)B * H * sizeof(float)), *a_scr = (float*)cuda_malloc((size_t)B * H * sizeof(float));
    int* cand_d = (int*)cuda_malloc((B + 1) * sizeof(int));
    cudaCheck(cudaMemset(g_ref, 0xFF, (size_t)B * H * sizeof(bf16)));
    cudaCheck(cudaMemset(a_ref, 0xFF, (size_t)B * H * sizeof(float)));
    gemv(StoreRow{g_ref, H}, f_d, wg_d, B, H, D);
    gemv(GateUpRow{a_ref, wu_d, D, H, NULL, NULL}, f_d, wg_d, B, H, D);

    // g with StoreRow: the GEMV's bits where it fires; its bits or +0 elsewhere
    cudaCheck(cudaMemset(g_scr, 0xFF, (size_t)B * H * sizeof(bf16)));
    cudaCheck(cudaMemset(cand_d, 0, (B + 1) * sizeof(int)));
    screened_gate(StoreRow{g_scr, H}, sg, wg_d, f_d, B, cand_d);
    std::vector<uint16_t> ref = download(reinterpret_cast<const uint16_t*>(g_ref), (size_t)B * H);
    std::vector<uint16_t> scr = download(reinterpret_cast<const uint16_t*>(g_scr), (size_t)B * H);
    std::vector<int> cand = download(cand_d, B + 1);
    std::vector<float> G((size_t)B * H);
    std::vector<int> cand_cpu(B + 1);
    screen_gate_reference(G.data(), cand_cpu.data(), &cpu, wg.data(), f.data(), B);
    long fired = 0, wrong = 0, emulation = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        const bool fires = float_from_bf16(ref[i]) > 0;
        fired += fires;
        wrong += scr[i] != ref[i] && (fires || scr[i] != 0);
        const uint16_t cpu_g = bf16_from_float(G[i]);
        emulation += G[i] != 0.0f && !isnan(G[i]) && cpu_g != scr[i]; // recomputed: the CPU's emulation of the GEMV
    }
    CHECK(wrong == 0, "%s B %d D %d: %ld g differ from the GEMV's where they matter", gate_names[kind], B, D, wrong);
    CHECK(cand == cand_cpu, "%s B %d D %d: candidate counts differ from the CPU reference's", gate_names[kind], B, D);
    CHECK(emulation == 0, "%s B %d D %d: %ld recomputed G differ from the CPU's emulation", gate_names[kind], B, D, emulation);

    // a with GateUpRow, launched directly and from a graph: gemv(GateUpRow)'s every word
    for (int graph = 0; graph < 2; graph++) {
        cudaCheck(cudaMemset(a_scr, 0xFF, (size_t)B * H * sizeof(float)));
        if (graph) {
            cudaCheck(cudaDeviceSynchronize()); // the poison, on the default stream, before the capture stream runs
            cudaStream_t saved = main_stream;
            main_stream = capture_stream;
            cudaGraph_t g;
            cudaGraphExec_t exec;
            cudaCheck(cudaStreamBeginCapture(main_stream, cudaStreamCaptureModeThreadLocal));
            screened_gate(GateUpRow{a_scr, wu_d, D, H, NULL, NULL}, sg, wg_d, f_d, B, NULL);
            cudaCheck(cudaStreamEndCapture(main_stream, &g));
            cudaCheck(cudaGraphInstantiate(&exec, g, 0));
            cudaCheck(cudaGraphLaunch(exec, main_stream));
            cudaCheck(cudaStreamSynchronize(main_stream));
            cudaCheck(cudaGraphExecDestroy(exec));
            cudaCheck(cudaGraphDestroy(g));
            main_stream = saved;
        } else {
            screened_gate(GateUpRow{a_scr, wu_d, D, H, NULL, NULL}, sg, wg_d, f_d, B, NULL);
        }
        std::vector<float> a1 = download(a_ref, (size_t)B * H), a2 = download(a_scr, (size_t)B * H);
        CHECK(memcmp(a1.data(), a2.data(), a1.size() * sizeof(float)) == 0, "%s B %d D %d: a differs from gemv(GateUpRow)'s%s",
              gate_names[kind], B, D, graph ? " (graph)" : "");
    }
    double per_row = 0;
    for (int b = 0; b < B; b++) { per_row += (double)cand[b] / B; }
    printf("  %-19s B %d, D %4d, H %4d: %6.1f fire, %6.1f candidates a row, %4d of %d units recomputed\n",
           gate_names[kind], B, D, H, (double)fired / B, per_row, cand[B], H);
    cuda_free((void*)f_d); cuda_free((void*)wg_d); cuda_free(wu_d); cuda_free(g_ref); cuda_free(g_scr);
    cuda_free(a_ref); cuda_free(a_scr); cuda_free(cand_d);
    screen_gate_free(&sg, DEVICE_CUDA);
    screen_gate_free(&cpu, DEVICE_CPU);
}

int main(void) {
    cudaStream_t capture_stream;
    cudaCheck(cudaStreamCreateWithFlags(&capture_stream, cudaStreamNonBlocking));
    for (int D : {16, 336, 2048, 4096}) { test_quantize(D); }
    for (int B = 1; B <= GEMV_MAX_ROWS; B++) {
        for (int kind = 0; kind < GATE_KINDS; kind++) { test_gate(B, 1000, 2048, kind, capture_stream); }
    }
    for (int kind = 0; kind < GATE_KINDS; kind++) {
        test_gate(3, 500, 336, kind, capture_stream);
        test_gate(2, 300, 3072, kind, capture_stream);
        test_gate(3, 200, 4096, kind, capture_stream);
    }
    cudaCheck(cudaStreamDestroy(capture_stream));
    return test_summary("test_screened_gate (GPU)");
}
