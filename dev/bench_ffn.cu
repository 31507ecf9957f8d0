/*
 FFN benchmark of training at the standard point of SPARSE.md (M 16384, D 2048,
 H 5632, synthetic sparsity): the dense cuBLASLt FFN (llmc/gpt.h's path) and the
 sparse one (llmc/cuda_sparse_ffn.cuh) on the same inputs, forward, backward
 and forward + backward, per k and pattern, with the bytes each keeps for the
 backward, the sparse path's relative error against the dense one, the ratios,
 and the time of each sparse stage. The ELL width and tail are sized from the dense run's
 counts, as the model does from the previous step's statistics.

 With "model", the whole model instead: training steps of a preset shape with
 the synthetic-sparse initialisation of llmc/gpt.h (benchmark-only), --ffn
 dense against --ffn sparse on the same micro-batch: tok/s and device memory.

 usage: build/dev/bench_ffn [M D H]      BENCH_ONLY="uniform k=30" runs that pattern only
        build/dev/bench_ffn model PRESET B T [steps] [k]     e.g. model 1.5b 8 2048 5 30
*/
#include <time.h>
#include <vector>
#include "llmc/cuda_gate.cuh"
#include "llmc/cuda_matmul.cuh"
#include "llmc/cuda_sparse_ffn.cuh"
#include "llmc/gpt.h"
#include "llmc/optimizer.h"
#include "test/gpu/gpu_util.cuh"

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double used_gib(void) {
    size_t free_b, total_b;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    return (total_b - free_b) / 1073741824.0;
}

static int bench_model(int argc, char** argv) {
    if (argc < 5) { fatal("usage: %s model PRESET B T [steps] [k]", argv[0]); }
    const ModelPreset* shape = find_preset(argv[2]);
    if (shape == NULL) { fatal("unknown preset %s", argv[2]); }
    int B = atoi(argv[3]), T = atoi(argv[4]), steps = argc > 5 ? atoi(argv[5]) : 5, M = B * T;
    double k = argc > 6 ? atof(argv[6]) : 30;
    GPTConfig c = {50257, 50304, shape->layers, shape->dim, shape->heads, shape->heads, shape->hidden, T, 10000.0f, 1e-5f};
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("model %s B%d T%d on %s, synthetic-sparse init (benchmark-only) with k = %g of %d, lr 0: %d timed steps after 3\n",
           argv[2], B, T, prop.name, k, c.hidden, steps);
    size_t n = num_parameters(&c);
    float* host = (float*)mallocCheck(n * sizeof(float));
    init_params_synthetic_sparse(host, &c, k, 1);
    TokenBatch batch = upload_random_batch(M, c.vocab_size, 3);
    const int *d_in = batch.inputs, *d_tg = batch.targets;
    // lr 0: the step costs the same, and the weights keep their synthetic sparsity
    // (Adam would move the 1e-3-scaled W_o and W_d by their own size in a step)
    OptimConfig oc = {0.0f, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0f, 0, 1000, 0.1f};
    double tps[2], mem[2];
    for (int mode = 0; mode < 2; mode++) {
        cudaCheck(cudaDeviceSynchronize());
        double base = used_gib();
        GPT<bf16, float> model;
        gpt_build(&model, &c, DEVICE_CUDA);
        model.ffn_mode = mode == 0 ? FFN_DENSE : FFN_SPARSE;
        Optimizer opt;
        optimizer_init(&opt, &model, NULL);
        set_params_from_fp32(&model, &opt, host);
        double t = 0;
        for (int i = 0; i < steps + 3; i++) {
            double t0 = seconds();
            gpt_zero_grad(&model);
            gpt_stats_reset(&model);
            gpt_forward(&model, d_in, d_tg, B, T, 1.0f / M);
            gpt_backward(&model, d_in, 2e-5f / (c.num_layers * M));
            optimizer_step(&opt, &model, &oc, 0.0f, i + 1);
            gpt_stats_read(&model, M);
            if (i >= 3) { t += seconds() - t0; }
        }
        tps[mode] = (double)M * steps / t;
        mem[mode] = used_gib() - base;
        double l0 = 0;
        for (int l = 0; l < c.num_layers; l++) { l0 += model.stats[l].l0_mean / c.num_layers; }
        printf("--ffn %-6s train %8.0f tok/s | device memory %.2f GiB | loss %.4f | mean active units %.1f | forwards "
               "redone %d\n", mode == 0 ? "dense" : "sparse", tps[mode], mem[mode], model.ce, l0, model.ffn_redone);
        optimizer_free(&opt);
        gpt_free(&model);
    }
    printf("sparse / dense: %.2fx tok/s, %.2fx device memory\n", tps[1] / tps[0], mem[1] / mem[0]);
    free(host);
    cuda_free(batch.inputs);
    cuda_free(batch.targets);
    cublaslt_free();
    return 0;
}

static std::vector<bf16> to_bf16(const std::vector<float>& x) {
    std::vector<bf16> y(x.size());
    for (size_t i = 0; i < x.size(); i++) { y[i] = __float2bfloat16(x[i]); }
    return y;
}

// ||a - b|| / ||b|| of two device tensors (bf16 or fp32)
template <typename A>
static double rel_err(const A* a, const A* b, size_t n) {
    std::vector<A> x = download(a, n), y = download(b, n);
    double diff = 0, ref = 0;
    for (size_t i = 0; i < n; i++) {
        double xi = (float)x[i], yi = (float)y[i];
        if (isnan(xi)) { return INFINITY; }
        diff += (xi - yi) * (xi - yi);
        ref += yi * yi;
    }
    return sqrt(diff / fmax(ref, 1e-30));
}

int main(int argc, char** argv) {
    if (argc > 1 && strcmp(argv[1], "model") == 0) { return bench_model(argc, argv); }
    int M = argc > 3 ? atoi(argv[1]) : 16384, D = argc > 3 ? atoi(argv[2]) : 2048, H = argc > 3 ? atoi(argv[3]) : 5632;
    size_t MD = (size_t)M * D, HD = (size_t)H * D, MH = (size_t)M * H;
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("FFN fwd / fwd+bwd, M %d D %d H %d, %s; times are medians of 20 (ms)\n", M, D, H, prop.name);
    const float l1_scale = 1e-3f;
    bf16 *f = (bf16*)cuda_malloc(MD * 2), *wg = (bf16*)cuda_malloc(HD * 2), *wu = (bf16*)cuda_malloc(HD * 2);
    bf16 *wdT = (bf16*)cuda_malloc(HD * 2), *dy = (bf16*)cuda_malloc(MD * 2);
    bf16 *g = (bf16*)cuda_malloc(MH * 2), *u = (bf16*)cuda_malloc(MH * 2), *h = (bf16*)cuda_malloc(MH * 2);
    bf16 *dh = (bf16*)cuda_malloc(MH * 2), *du_dense = (bf16*)cuda_malloc(MH * 2);
    bf16 *y_dense = (bf16*)cuda_malloc(MD * 2), *y_sparse = (bf16*)cuda_malloc(MD * 2);
    bf16 *df_dense = (bf16*)cuda_malloc(MD * 2), *df_sparse = (bf16*)cuda_malloc(MD * 2);
    float* grads[2][3];
    for (int s = 0; s < 2; s++) { for (int i = 0; i < 3; i++) { grads[s][i] = (float*)cuda_malloc(HD * 4); } }
    float* l1 = (float*)cuda_malloc(M * 4);
    int* active = (int*)cuda_malloc(M * 4);
    uint8_t* fired = (uint8_t*)cuda_malloc(H);
    SparseScratch scratch;
    sparse_scratch_alloc_cuda(&scratch, M, H);
    int* tail_used = (int*)cuda_malloc(sizeof(int));

    printf("%-10s %5s %5s %5s | %8s %8s %6s | %8s %8s %6s | %8s %8s %6s | %6s %6s | %9s %9s %6s | %8s %8s %8s | stages fwd: gate+pack (its pack, cuBLAS gate+pack) up down, bwd: transpose dh+wgrad df\n",
           "pattern", "k", "W", "tail", "dense f", "sparse f", "ratio", "dense b", "sparse b", "ratio", "dense fb", "sparse fb", "ratio", "auto", "ratio",
           "dense MB", "sparse MB", "ratio", "err y", "err df", "err dW");
    struct { double k; int realistic; } cases[] = {{8, 0}, {30, 0}, {100, 0}, {300, 0}, {30, 1}};
    std::vector<float> hf(MD), hwg(HD), hwu(HD), hwdT(HD), hdy(MD);
    uint64_t rng = 5;
    for (float& x : hdy) { x = (float)rng_normal(&rng); }
    cudaCheck(cudaMemcpy(dy, to_bf16(hdy).data(), MD * 2, cudaMemcpyHostToDevice));
    const char* only = getenv("BENCH_ONLY"); // run only the patterns of this name, e.g. "uniform k=30"
    for (auto cs : cases) {
        char name[32];
        snprintf(name, sizeof(name), "%s k=%g", cs.realistic ? "realistic" : "uniform", cs.k);
        if (only && strcmp(name, only) != 0) { continue; }
        sparse_synthetic_ffn(hf.data(), hwg.data(), hwu.data(), hwdT.data(), M, D, H, cs.k, cs.realistic, 1);
        cudaCheck(cudaMemcpy(f, to_bf16(hf).data(), MD * 2, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(wg, to_bf16(hwg).data(), HD * 2, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(wu, to_bf16(hwu).data(), HD * 2, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(wdT, to_bf16(hwdT).data(), HD * 2, cudaMemcpyHostToDevice));

        auto dense_fwd = [&] {
            gemm(g, f, wg, M, H, D, 0, 1, 0);
            gemm(u, f, wu, M, H, D, 0, 1, 0);
            relu_gate_forward(h, l1, active, fired, g, u, M, H);
            gemm(y_dense, h, wdT, M, D, H, 0, 0, 0);
        };
        auto dense_bwd = [&] {
            gemm(dh, dy, wdT, M, H, D, 0, 1, 0);
            gemm(grads[0][2], h, dy, H, D, M, 1, 0, 1);
            relu_gate_backward(dh, du_dense, dh, g, u, h, l1_scale, M, H);
            gemm(df_dense, du_dense, wu, M, D, H, 0, 0, 0);
            gemm(df_dense, dh, wg, M, D, H, 0, 0, 1);
            gemm(grads[0][0], du_dense, f, H, D, M, 1, 0, 1);
            gemm(grads[0][1], dh, f, H, D, M, 1, 0, 1);
        };
        for (int i = 0; i < 3; i++) { cudaCheck(cudaMemset(grads[0][i], 0, HD * 4)); }
        dense_fwd();
        dense_bwd();
        std::vector<int> counts = download(active, M);
        double mean = 0;
        for (int c : counts) { mean += c; }
        mean /= M;
        int W = sparse_choose_width(mean, H), needed = 0;
        for (int c : counts) { needed += c > W; }
        int tail = sparse_choose_tail(needed, M);
        SparsePattern<bf16> p;
        sparse_pattern_alloc(&p, M, H, W, tail, tail_used, DEVICE_CUDA);
        size_t n = sparse_entries(M, H, W, tail);
        SparseTransposed t;
        sparse_transposed_alloc(&t, H, D, n, DEVICE_CUDA);
        bf16 *du = (bf16*)cuda_malloc(n * 2 + 16), *dg = (bf16*)cuda_malloc(n * 2 + 16);
        auto cublas_gate_pack = [&] {
            gemm(g, f, wg, M, H, D, 0, 1, 0);
            sparse_pack(&p, active, fired, g, &scratch);
        };
        auto gate_pack = [&] { // as llmc/gpt.h runs it: fused on Hopper
            if (!sparse_gate_pack(&p, active, fired, g, f, wg, D, &scratch)) { cublas_gate_pack(); }
        };
        auto sparse_fwd = [&] {
            gate_pack();
            sparse_up(&p, l1, f, wu, D);
            sparse_down(y_sparse, &p, wdT, D);
        };
        auto dh_weight_grads = [&] {
            sparse_dh_weight_grads(du, dg, grads[1][0], grads[1][1], grads[1][2], &p, &t, f, dy, wdT, l1_scale, D);
        };
        auto sparse_bwd = [&] { // as llmc/gpt.h runs it
            sparse_transpose(&t, &p, &scratch);
            dh_weight_grads();
            sparse_df(df_sparse, &p, du, dg, wu, wg, D);
        };
        for (int i = 0; i < 3; i++) { cudaCheck(cudaMemset(grads[1][i], 0, HD * 4)); }
        sparse_fwd();
        sparse_bwd();
        if (download(p.tail_used, 1)[0] > tail) { fatal("tail overflow in the benchmark"); }
        double err_y = rel_err(y_sparse, y_dense, MD), err_df = rel_err(df_sparse, df_dense, MD), err_dw = 0;
        for (int i = 0; i < 3; i++) { err_dw = fmax(err_dw, rel_err(grads[1][i], grads[0][i], HD)); }

        // side by side (the clock drops as the GPU heats)
        std::vector<float> side = median_ms_interleaved({dense_fwd, sparse_fwd, dense_bwd, sparse_bwd,
                                                      [&] { dense_fwd(); dense_bwd(); }, [&] { sparse_fwd(); sparse_bwd(); }});
        float t_df = side[0], t_sf = side[1], t_db = side[2], t_sb = side[3], t_dfb = side[4], t_sfb = side[5];
        float st[8] = {
            median_ms(gate_pack),
            scratch.gate_words ? median_ms([&] { sparse_pack_twell(&p, active, fired, sparse_gate_records(&scratch, g), &scratch); }) : 0.0f,
            median_ms(cublas_gate_pack),
            median_ms([&] { sparse_up(&p, l1, f, wu, D); }),
            median_ms([&] { sparse_down(y_sparse, &p, wdT, D); }),
            median_ms([&] { sparse_transpose(&t, &p, &scratch); }),
            median_ms(dh_weight_grads),
            median_ms([&] { sparse_df(df_sparse, &p, du, dg, wu, wg, D); }),
        };
        double dense_mb = 3.0 * MH * 2 / 1e6, sparse_mb = sparse_pattern_bytes(M, H, W, tail, 2) / 1e6;
        // what --ffn auto would run for a layer with this activity (llmc/gpt.h): sparse up to the limit, else dense
        int auto_sparse = mean <= FFN_AUTO_MAX_ACTIVE * H;
        float t_auto = auto_sparse ? t_sfb : t_dfb;
        printf("%-10s %5.1f %5d %5d | %8.3f %8.3f %5.2fx | %8.3f %8.3f %5.2fx | %8.3f %9.3f %5.2fx | %6s %5.2fx | %9.1f %9.1f %5.1fx |"
               " %8.1e %8.1e %8.1e | %.3f (%.3f, %.3f) %.3f %.3f | %.3f %.3f %.3f\n",
               cs.realistic ? "realistic" : "uniform", mean, W, tail, t_df, t_sf, t_df / t_sf, t_db, t_sb, t_db / t_sb, t_dfb,
               t_sfb, t_dfb / t_sfb,
               auto_sparse ? "sparse" : "dense", t_dfb / t_auto, dense_mb, sparse_mb, dense_mb / sparse_mb, err_y, err_df, err_dw, st[0], st[1], st[2], st[3], st[4], st[5],
               st[6], st[7]);
        sparse_pattern_free(&p, DEVICE_CUDA);
        sparse_transposed_free(&t, DEVICE_CUDA);
        cuda_free(du);
        cuda_free(dg);
    }
    printf("ratio = dense time / sparse time (> 1: sparse faster); auto = the path --ffn auto picks at this k (fwd+bwd);"
           " MB = FFN state kept for the backward (dense: g, u, h; sparse: the pattern with g and u at it, as allocated);"
           " err = ||sparse - dense|| / ||dense||\n");
    sparse_scratch_free_cuda(&scratch);
    cuda_free(tail_used);
    cublaslt_free();
    return 0;
}
