/*
 Times the TwELL sparse FFN forward (llmc/ffn/cuda_twell.cuh) against the dense
 cuBLAS gated FFN at the standard point of docs/SPARSE.md: M 16384 tokens, D 2048,
 H 5632, bf16, inputs as its "Measuring" section says (f rows N(0, 1) with the
 last feature a carrier 1.0, 0.5 on the first 1% of rows of the realistic
 pattern; Wg rows N(0, 1/(D-1)) with last column -Phi^-1(1 - p_n); Wu N(0, 1/D),
 WdT N(0, 1/H)); p_n = k/H (uniform, k = 8, 30, 100, 200, 300) or log-normal
 (sigma 1.5) scaled to mean k/H, capped at 0.5, 30% of units never firing
 (realistic, k = 30 and 100).
 Per pattern, in one run:
 - dense: g = f Wg^T and u = f Wu^T as two GEMMs, as one batched product (our
   dense path, ffn_dense_forward) or as one [2H, D] GEMM, the relu * mul
   kernel, y = h WdT; the fastest of the three is "dense";
 - the gate GEMM alone (cuBLAS, bf16 g);
 - gate + packing: (a) cuBLAS g then the packer, (c) fused wgmma (compute
   capability 9.0);
 - up + down from the packed gate (the fused kernel);
 - sparse = the fastest gate + up/down, back to back (the sparse path forced);
 - auto = twell_ffn_forward as a model calls it, after 3 calls with
   twell_ffn_status that measure the activity and the costs it chooses from;
   the path it took; ratio = dense / auto; and the relative error
   max|y_sparse - y_dense| / max|y_dense|.
 BENCH_HOT="256 512" adds, per count h, a probe of running the h most active
 units of realistic k=30 as dense GEMMs: the pattern without them (their p_n
 set to 0, so the sparse path does the rest), and the time of their part as
 cuBLASLt would run it (u = f Wu[hot]^T, relu * mul, y += h WdT[hot] in fp32),
 side by side with the sparse path: what that split could reach at best (the
 merge of the two y's is not counted).
 Each time is the median of `iters` runs between two cudaEvents, each run
 after 256 MB of writes that push the previous run's data out of L2, after 3
 warm-up runs; dense, sparse and auto are timed in turn, round by round, so
 that the GPU's clock (it drops as the card heats) is the same for all three. Buffers start with a capacity from k and grow (and the pattern
 runs again) if the status asks for more.
 With `trained MODEL [LAYER]` the FFN of that layer of a checkpoint on its real inputs comes last
 (dev/trained_layer.cuh; "trained" in BENCH_ONLY runs it alone).
 BENCH_SHAPE="M D H" runs another shape than the standard point's.
 BENCH_DUMP=DIR writes, per pattern, what dev/bench_twell_reference.py needs to run
 the paper's kernels on the same inputs, into DIR/<name> (the pattern's name, spaces
 as '_', '=' dropped: DIR/uniform_k30, DIR/realistic_k30, DIR/trained_l0):
   f.bin [M, D], wg.bin, wu.bin, wdT.bin [H, D]: the inputs (y = (relu(f Wg^T) *
     (f Wu^T)) WdT), and y.bin [M, D]: our output on the forced sparse path;
     raw bf16, little-endian, row-major, no header;
   meta.json: name, M, D, H, gpu, iters, active (units per row), records (overflow
     records), err (ours against our dense path), and our medians in ms, timed as the
     reference script times the paper's kernels (the dense FFN, the sparse total, the
     faster gate + packing and up + down in turn): dense_ms, sparse_ms, gate_ms,
     up_down_ms; and auto_ms.
 usage: build/dev/bench_twell [iters (default 20)] [trained MODEL [LAYER]]; BENCH_ONLY="uniform k=30" runs that pattern only
*/
#include <algorithm>
#include <functional>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <vector>
#include "dev/trained_layer.cuh"
#include "llmc/ffn/cuda_twell.cuh"
#include "llmc/rng.h"
#include "llmc/synthetic.h"

static int M = 16384, D = 2048, H = 5632; // the standard point, or BENCH_SHAPE
static unsigned char* l2_flush = NULL;
static const size_t l2_flush_bytes = 256u << 20;

// the medians over `iters` rounds of each of fns, in ms, after 3 warm-up runs
// of each, L2 flushed before each run; rounds run every fn in turn, since the
// GPU's clock drops as it heats (a dense FFN timed again 10 s into a pattern
// took 8% longer on an H100), so only times taken side by side are compared
static std::vector<float> time_interleaved(const std::vector<std::function<void()>>& fns, int iters) {
    return median_ms_interleaved(fns, iters, 3, [](int round) {
        cudaCheck(cudaMemsetAsync(l2_flush, round & 0xff, l2_flush_bytes, main_stream));
    });
}

static float time_ms(const std::function<void()>& fn, int iters) { return time_interleaved({fn}, iters)[0]; }

// the dense FFN's elementwise step on the stacked product gu [M, 2H]: h = relu(g) * u
__global__ void relu_mul_stacked_kernel(bf16* h, const bf16* gu, int M, int H) {
    size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x, per_row = H / 8;
    if (k >= (size_t)M * per_row) { return; }
    size_t m = k / per_row, n = (k % per_row) * 8;
    Bf16x8 gv = load_bf16x8(gu + m * 2 * H + n), uv = load_bf16x8(gu + m * 2 * H + H + n), hv;
    #pragma unroll
    for (int e = 0; e < 8; e++) {
        float gate = __bfloat162float(gv.v[e]);
        hv.v[e] = __float2bfloat16_rn(gate > 0.0f ? gate * __bfloat162float(uv.v[e]) : 0.0f);
    }
    store_bf16x8(h + m * H + n, hv);
}

// rows x cols of N(0, std^2) in bf16, each row from its own seed (OpenMP)
static void fill_normal(std::vector<bf16>& x, int rows, int cols, double std, uint64_t seed) {
    x.resize((size_t)rows * cols);
    #pragma omp parallel for
    for (int r = 0; r < rows; r++) {
        uint64_t state = rng_mix64(seed * 0x9E3779B97F4A7C15ull + (uint64_t)r);
        for (int c = 0; c < cols; c++) { x[(size_t)r * cols + c] = __float2bfloat16_rn((float)(std * rng_normal(&state))); }
    }
}

static std::vector<double> firing_probabilities(double k, bool realistic, uint64_t seed) {
    std::vector<double> p(H, k / H);
    if (!realistic) { return p; }
    uint64_t state = seed;
    for (int n = 0; n < H; n++) { p[n] = rng_uniform(&state) < 0.3 ? 0.0 : exp(1.5 * rng_normal(&state)); }
    for (int pass = 0; pass < 20; pass++) {
        double sum = 0;
        for (int n = 0; n < H; n++) { sum += p[n]; }
        for (int n = 0; n < H; n++) { p[n] = std::min(0.5, p[n] * k / sum); }
    }
    return p;
}

static double max_rel_diff(const bf16* a_dev, const bf16* ref_dev, size_t n) {
    std::vector<bf16> a(n), ref(n);
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaMemcpy(a.data(), a_dev, n * sizeof(bf16), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(ref.data(), ref_dev, n * sizeof(bf16), cudaMemcpyDeviceToHost));
    double max_diff = 0, max_ref = 0;
    for (size_t k = 0; k < n; k++) {
        double x = __bfloat162float(a[k]), r = __bfloat162float(ref[k]);
        if (isnan(x)) { return NAN; }
        max_diff = fmax(max_diff, fabs(x - r));
        max_ref = fmax(max_ref, fabs(r));
    }
    return max_diff / max_ref;
}

// BENCH_DUMP: the directory of one pattern, DIR/<name> with spaces as '_' and '=' dropped
static std::string dump_dir(const char* root, const char* name) {
    std::string dir = std::string(root) + "/";
    for (const char* c = name; *c; c++) {
        if (*c != '=') { dir += *c == ' ' ? '_' : *c; }
    }
    make_dir(dir.c_str());
    return dir;
}

// n bf16 of device memory as a raw file (the host's byte order: little-endian on x86 and Arm Linux)
static void dump_tensor(const std::string& dir, const char* file, const bf16* dev, size_t n) {
    std::vector<bf16> host(n);
    cudaCheck(cudaMemcpy(host.data(), dev, n * sizeof(bf16), cudaMemcpyDeviceToHost));
    FILE* fp = fopenCheck((dir + "/" + file).c_str(), "wb");
    fwriteCheck(host.data(), sizeof(bf16), n, fp);
    fcloseCheck(fp);
}

struct Row {
    char name[32];
    double active, dense, gate_cublas, gate_a, gate_wgmma, up_down, sparse, auto_ms, err;
    TwellPath auto_path;
    float dense_above;
};

int main(int argc, char** argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 20;
    const char* trained = argc > 3 && strcmp(argv[2], "trained") == 0 ? argv[3] : NULL;
    int trained_layer = argc > 4 ? atoi(argv[4]) : 0;
    const char* shape = getenv("BENCH_SHAPE");
    if (shape && *shape && (sscanf(shape, "%d %d %d", &M, &D, &H) != 3 || M < 100 || D < 2 || H < 16)) {
        fatal("BENCH_SHAPE: \"%s\" is not \"M D H\" (M >= 100, D >= 2, H >= 16)", shape);
    }
    const char* dump = getenv("BENCH_DUMP"); // the inputs, our y and times per pattern (header)
    if (dump && !*dump) { dump = NULL; }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    bool has_wgmma = prop.major == 9;
    printf("%s, %d SMs. M %d D %d H %d, median of %d runs, L2 flushed before each\n", prop.name,
           prop.multiProcessorCount, M, D, H, iters);
    l2_flush = (unsigned char*)cuda_malloc(l2_flush_bytes);
    cublaslt_init();

    std::vector<bf16> f, wg, wu, wdT;
    fill_normal(f, M, D, 1.0, 1);
    fill_normal(wg, H, D, 1.0 / sqrt(D - 1.0), 2);
    fill_normal(wu, H, D, 1.0 / sqrt((double)D), 3);
    fill_normal(wdT, H, D, 1.0 / sqrt((double)H), 4);
    bf16* f_d = (bf16*)cuda_malloc((size_t)M * D * sizeof(bf16));
    bf16* wgu_d = (bf16*)cuda_malloc((size_t)2 * H * D * sizeof(bf16)); // Wg then Wu: the stacked weights
    bf16* wg_d = wgu_d;
    bf16* wu_d = wgu_d + (size_t)H * D;
    bf16* wdT_d = (bf16*)cuda_malloc((size_t)H * D * sizeof(bf16));
    bf16* g_d = (bf16*)cuda_malloc((size_t)M * H * sizeof(bf16));
    bf16* u_d = (bf16*)cuda_malloc((size_t)M * H * sizeof(bf16));
    bf16* gu_d = (bf16*)cuda_malloc((size_t)M * 2 * H * sizeof(bf16));
    bf16* y_dense = (bf16*)cuda_malloc((size_t)M * D * sizeof(bf16));
    bf16* y_sparse = (bf16*)cuda_malloc((size_t)M * D * sizeof(bf16));
    cudaCheck(cudaMemcpy(wu_d, wu.data(), wu.size() * sizeof(bf16), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(wdT_d, wdT.data(), wdT.size() * sizeof(bf16), cudaMemcpyHostToDevice));

    struct Pattern { char name[32]; double k; bool realistic; int hot; bool trained; };
    std::vector<Pattern> patterns = {{"uniform k=8", 8, false, 0, false},    {"uniform k=30", 30, false, 0, false},
                                     {"uniform k=100", 100, false, 0, false}, {"uniform k=200", 200, false, 0, false},
                                     {"uniform k=300", 300, false, 0, false}, {"realistic k=30", 30, true, 0, false},
                                     {"realistic k=100", 100, true, 0, false}};
    if (trained) { // last: it replaces the weights the synthetic patterns share
        Pattern pat = {"", 0, false, 0, true};
        snprintf(pat.name, sizeof(pat.name), "trained l=%d", trained_layer);
        patterns.push_back(pat);
    }
    for (const char* h = getenv("BENCH_HOT"); h && *h;) {
        char* end;
        long hot = strtol(h, &end, 10);
        if (end == h || hot < 8 || hot > H / 2 || hot % 8 != 0) { // (u_hot and h_hot share g's buffer)
            fatal("BENCH_HOT: \"%s\" is not a list of unit counts, multiples of 8 from 8 to %d", h, H / 2);
        }
        Pattern pat = {"", 30, true, (int)hot, false};
        snprintf(pat.name, sizeof(pat.name), "realistic-%ld k=30", hot);
        patterns.push_back(pat);
        h = end + strspn(end, " ,");
    }
    std::vector<Row> rows;
    const double gate_flops = 2.0 * M * (double)D * H;
    const char* only = getenv("BENCH_ONLY"); // run only the patterns of this name, e.g. "uniform k=30"
    for (const Pattern& pat : patterns) {
        if (only && strcmp(pat.name, only) != 0 && !(pat.trained && strcmp(only, "trained") == 0)) { continue; }
        std::vector<double> p = firing_probabilities(pat.trained ? 30 : pat.k, pat.realistic, 5);
        double hot_share = 0, total = 0; // the hot units' share of the expected pairs
        if (pat.hot) {
            std::vector<int> order(H);
            for (int n = 0; n < H; n++) { order[n] = n; total += p[n]; }
            std::sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
            for (int i = 0; i < pat.hot; i++) { hot_share += p[order[i]] / total; p[order[i]] = 0.0; }
        }
        for (int n = 0; n < H; n++) {
            wg[(size_t)n * D + D - 1] = __float2bfloat16_rn((float)-(p[n] > 0 ? normal_quantile(1.0 - p[n]) : 40.0));
        }
        for (int m = 0; m < M; m++) {
            f[(size_t)m * D + D - 1] = __float2bfloat16_rn(pat.realistic && m < M / 100 ? 0.5f : 1.0f);
        }
        if (pat.trained) {
            load_trained_layer(trained, trained_layer, M, D, H, f_d, wg_d, wu_d, wdT_d);
        } else {
            cudaCheck(cudaMemcpy(f_d, f.data(), f.size() * sizeof(bf16), cudaMemcpyHostToDevice));
            cudaCheck(cudaMemcpy(wg_d, wg.data(), wg.size() * sizeof(bf16), cudaMemcpyHostToDevice));
        }
        Row r = {};
        snprintf(r.name, sizeof(r.name), "%s", pat.name);
        printf("\n%s\n", pat.name);
        if (pat.hot) {
            printf("  the %d most active units (%.1f%% of the pairs) left out: the probe below\n", pat.hot, 100 * hot_share);
        }

        auto dense_batched = [&] { ffn_dense_forward(y_dense, gu_d, gu_d + (size_t)M * H, f_d, wg_d, wu_d, wdT_d, M, D, H, NULL); };
        auto dense_two = [&] {
            gemm(g_d, f_d, wg_d, M, H, D, 0, 1, 0);
            gemm(u_d, f_d, wu_d, M, H, D, 0, 1, 0);
            relu_mul(g_d, g_d, u_d, (size_t)M * H, NULL);
            gemm(y_dense, g_d, wdT_d, M, D, H, 0, 0, 0);
        };
        auto dense_stacked = [&] {
            gemm(gu_d, f_d, wgu_d, M, 2 * H, D, 0, 1, 0);
            relu_mul_stacked_kernel<<<(unsigned int)(((size_t)M * H / 8 + 255) / 256), 256, 0, main_stream>>>(g_d, gu_d, M, H);
            cudaCheck(cudaGetLastError());
            gemm(y_dense, g_d, wdT_d, M, D, H, 0, 0, 0);
        };
        r.gate_cublas = time_ms([&] { gemm(g_d, f_d, wg_d, M, H, D, 0, 1, 0); }, iters);
        printf("  gate GEMM alone (cuBLAS, bf16 g) %.3f ms, %.0f TFLOP/s\n", r.gate_cublas,
               gate_flops / (r.gate_cublas * 1e-3) / 1e12);
        ffn_dense_forward(y_dense, g_d, u_d, f_d, wg_d, wu_d, wdT_d, M, D, H, NULL); // the reference y

        // a record buffer grown until the status is ok (the sparse path forced)
        TwellFFN ffn = twell_ffn_create(M, D, H, TWELL_SLOTS, 16384);
        ffn.choice = TWELL_FORCE_SPARSE;
        for (;;) {
            twell_ffn_forward(&ffn, y_sparse, f_d, wg_d, wu_d, wdT_d, gu_d);
            TwellStatus st = twell_ffn_status(&ffn);
            if (st.ok) { break; }
            printf("  grow: records %d -> %lld, and run again\n", ffn.tw.record_capacity, st.records_needed);
            long long records = std::max(st.records_needed + st.records_needed / 4, (long long)ffn.tw.record_capacity);
            twell_ffn_grow(&ffn, (int)records);
        }
        r.err = max_rel_diff(y_sparse, y_dense, (size_t)M * D);
        std::string dir = dump ? dump_dir(dump, pat.name) : "";
        if (dump) { // y now: the timed runs below write y_sparse again, auto's perhaps on the dense path
            dump_tensor(dir, "f.bin", f_d, (size_t)M * D);
            dump_tensor(dir, "wg.bin", wg_d, (size_t)H * D);
            dump_tensor(dir, "wu.bin", wu_d, (size_t)H * D);
            dump_tensor(dir, "wdT.bin", wdT_d, (size_t)H * D);
            dump_tensor(dir, "y.bin", y_sparse, (size_t)M * D);
        }
        TwellStatus st = twell_ffn_status(&ffn);
        r.active = st.active_per_row;
        printf("  %.1f active units per row, %lld overflow records\n", r.active, st.records_needed);

        r.gate_a = time_ms([&] { twell_gate_cublas(&ffn, g_d, f_d, wg_d); }, iters);
        r.gate_wgmma = has_wgmma ? time_ms([&] { twell_gate_wgmma(&ffn, f_d, wg_d); }, iters) : NAN;
        printf("  gate + packing: (a) cuBLAS + pack %.3f ms", r.gate_a);
        if (has_wgmma) { printf(", (c) fused wgmma %.3f ms (%.0f TFLOP/s)", r.gate_wgmma, gate_flops / (r.gate_wgmma * 1e-3) / 1e12); }
        printf("\n");
        bool wgmma_best = has_wgmma && r.gate_wgmma < r.gate_a;
        auto gate = [&] {
            if (wgmma_best) { twell_gate_wgmma(&ffn, f_d, wg_d); } else { twell_gate_cublas(&ffn, g_d, f_d, wg_d); }
        };
        auto up_down = [&] { twell_up_down(&ffn, y_sparse, f_d, wu_d, wdT_d); };
        auto sparse_total = [&] {
            gate();
            up_down();
        };
        gate();
        r.up_down = time_ms(up_down, iters);
        printf("  up + down %.3f ms\n", r.up_down);

        // twell_ffn_forward choosing its path from what twell_ffn_status measured
        ffn.choice = TWELL_AUTO;
        for (int i = 0; i < 3; i++) {
            twell_ffn_forward(&ffn, y_sparse, f_d, wg_d, wu_d, wdT_d, gu_d);
            if (!twell_ffn_status(&ffn).ok) { fatal("bench_twell: the buffers grown above are too small now"); }
        }
        r.dense_above = (float)ffn.dense_above;
        // dense, sparse and auto side by side
        std::vector<float> t = time_interleaved({dense_two, dense_batched, dense_stacked, sparse_total,
                                                 [&] { r.auto_path = twell_ffn_forward(&ffn, y_sparse, f_d, wg_d, wu_d, wdT_d, gu_d); }},
                                                iters);
        r.dense = std::min(t[0], std::min(t[1], t[2]));
        r.sparse = t[3];
        r.auto_ms = t[4];
        printf("  dense FFN: gate and up as two GEMMs %.3f ms, as one batched product (ours) %.3f ms, as one [2H, D] GEMM"
               " %.3f ms\n", t[0], t[1], t[2]);
        printf("  sparse total %.3f ms: %.2fx dense; max|y - y_dense| / max|y_dense| = %.2e\n", r.sparse,
               r.dense / r.sparse, r.err);
        double auto_err = max_rel_diff(y_sparse, y_dense, (size_t)M * D);
        printf("  auto (twell_ffn_forward) %.3f ms, %s path (dense above %.1f active per row): %.2fx dense; "
               "rel diff %.2e\n", r.auto_ms, r.auto_path == TWELL_DENSE ? "dense" : "sparse", r.dense_above,
               r.dense / r.auto_ms, auto_err);
        if (pat.hot) { // u_hot into g's second part, h_hot over g's first, y_hot (fp32) in u's buffer
            bf16 *h_hot = g_d, *u_hot = g_d + (size_t)M * pat.hot;
            float* y_hot = (float*)u_d;
            auto hot_part = [&] {
                gemm(u_hot, f_d, wu_d, M, pat.hot, D, 0, 1, 0);
                relu_mul(h_hot, h_hot, u_hot, (size_t)M * pat.hot, NULL);
                gemm(y_hot, h_hot, wdT_d, M, D, pat.hot, 0, 0, 0);
            };
            std::vector<float> th = time_interleaved({dense_batched, hot_part, sparse_total}, iters);
            printf("  probe: hot part %.3f ms + sparse rest %.3f = %.3f ms, %.2fx dense (%.3f ms)\n", th[1], th[2],
                   th[1] + th[2], th[0] / (th[1] + th[2]), th[0]);
        } else { // (a probe's pattern is not one of the standard point's)
            rows.push_back(r);
        }
        if (dump) {
            // timed as dev/bench_twell_reference.py times the paper's kernels: one dense FFN, the whole and its
            // two stages in turn (the times above come from runs beside three dense FFNs, a hotter card, or alone)
            std::vector<float> tr = time_interleaved({dense_batched, sparse_total, gate, up_down}, iters);
            printf("  timed as the reference script times its kernels: dense %.3f, sparse total %.3f, gate + packing "
                   "%.3f, up + down %.3f ms\n", tr[0], tr[1], tr[2], tr[3]);
            char err[32]; // (JSON spells a NaN "NaN", printf "nan")
            if (isnan(r.err)) { snprintf(err, sizeof(err), "NaN"); } else { snprintf(err, sizeof(err), "%.4e", r.err); }
            FILE* fp = fopenCheck((dir + "/meta.json").c_str(), "w");
            fprintf(fp, "{\"name\": \"%s\", \"M\": %d, \"D\": %d, \"H\": %d, \"gpu\": \"%s\", \"iters\": %d,\n"
                        " \"active\": %.3f, \"records\": %lld, \"err\": %s,\n"
                        " \"sparse_ms\": %.4f, \"gate_ms\": %.4f, \"up_down_ms\": %.4f, \"dense_ms\": %.4f, "
                        "\"auto_ms\": %.4f}\n", pat.name, M, D, H, prop.name, iters, r.active, st.records_needed,
                    err, tr[1], tr[2], tr[3], tr[0], r.auto_ms);
            fcloseCheck(fp);
            printf("  inputs, y and times written to %s\n", dir.c_str());
        }
        twell_ffn_free(&ffn);
    }

    printf("\nms (median); gate (a) = cuBLAS + pack, (c) = fused wgmma; sparse = best gate + up/down; auto = twell_ffn_forward\n");
    printf("%-16s %7s %7s %7s %7s %7s %7s %7s %7s %6s %7s %8s\n", "pattern", "active", "dense", "gemm g", "gate a",
           "gate c", "up+dn", "sparse", "auto", "path", "ratio", "err");
    for (const Row& r : rows) {
        printf("%-16s %7.1f %7.3f %7.3f %7.3f %7.3f %7.3f %7.3f %7.3f %6s %6.2fx %8.1e\n", r.name, r.active, r.dense,
               r.gate_cublas, r.gate_a, r.gate_wgmma, r.up_down, r.sparse, r.auto_ms,
               r.auto_path == TWELL_DENSE ? "dense" : "sparse", r.dense / r.auto_ms, r.err);
    }
    const Row* last_faster = NULL;
    const Row* first_slower = NULL;
    for (const Row& r : rows) {
        if (strncmp(r.name, "uniform", 7) != 0) { continue; }
        if (r.sparse < r.dense && first_slower == NULL) { last_faster = &r; }
        if (r.sparse >= r.dense && first_slower == NULL) { first_slower = &r; }
    }
    if (first_slower == NULL) {
        printf("crossover: the sparse path is faster than dense at every uniform k measured\n");
    } else {
        printf("crossover (uniform): the sparse path is faster at %s, slower from %s\n",
               last_faster ? last_faster->name : "none", first_slower->name);
    }
    printf("targets: auto >= 2.2x at uniform k=30, >= 2.0x realistic k=30, >= 1x everywhere (dense above the crossover)\n");
    cuda_free(l2_flush);
    return 0;
}
