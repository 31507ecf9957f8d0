/*
 FFN benchmark of training at the standard point of docs/SPARSE.md (M 16384,
 D 2048, H 5632): the dense cuBLASLt FFN (llmc/gpt.h's path), the sparse one
 with no hot units (llmc/ffn/cuda_ell.cuh) and the hot/cold split that the
 model runs (llmc/ffn/split.h), on the same inputs, forward and forward + backward,
 per pattern: synthetic uniform k = 8, 30, 100, 300 and realistic k = 30, and
 "trained", the FFN of one layer of a checkpoint on its real inputs (f of the
 embedded corpus's val tokens; dy random). Per pattern: the times and ratios
 against dense, the hot/cold costs measured as training measures them
 (ffn_costs: the dense part over two numbers of units, the gate, the sparse
 layer per pair and its constant, from the last 64 units alone as a cold part) and the hot
 units it gives (ffn_path_choose, the busiest first, as training orders them),
 what --ffn auto runs (the path training's choice takes with the dense layer
 and the layer's paths timed here; one not timed yet is timed for it; then
 the path it settles on as training times each path it moves to), the
 bytes each keeps for the backward, the errors
 against dense and the sparse stages' times. The ELL width and tail are sized
 from the dense run's counts, as the model does from the previous step's.

 With "model", the whole model instead: training steps of a preset shape with
 the synthetic-sparse initialisation of llmc/synthetic.h (benchmark-only), --ffn
 dense against --ffn sparse on the same micro-batch: tok/s and device memory.

 usage: build/dev/bench_ffn [M D H] [trained MODEL [LAYER]]   BENCH_ONLY="uniform k=30" runs that pattern only
        build/dev/bench_ffn model PRESET B T [steps] [k]     e.g. model 1.5b 8 2048 5 30
*/
#include <algorithm>
#include <vector>
#include "dev/trained_layer.cuh"
#include "llmc/optimizer.h"
#include "llmc/synthetic.h"

static double used_gib(void) {
    size_t free_b, total_b;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    return (total_b - free_b) / 1073741824.0;
}

static int bench_model(int argc, char** argv) {
    if (argc < 5) { fatal("usage: %s model PRESET B T [steps] [k] [uniform|skewed]", argv[0]); }
    const ModelPreset* shape = find_preset(argv[2]);
    if (shape == NULL) { fatal("unknown preset %s", argv[2]); }
    int B = atoi(argv[3]), T = atoi(argv[4]), steps = argc > 5 ? atoi(argv[5]) : 5, M = B * T;
    double k = argc > 6 ? atof(argv[6]) : 30;
    int skewed = argc > 7 && strcmp(argv[7], "skewed") == 0;
    GPTConfig c = {50257, 50304, shape->layers, shape->dim, shape->heads, shape->heads, shape->hidden, T, 10000.0f, 1e-5f, ACT_RELU, 0};
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("model %s B%d T%d on %s, %s synthetic-sparse init (benchmark-only) with k = %g of %d, lr 0: %d timed steps "
           "after 3 (sparse: hot units from the costs measured in the first)\n", argv[2], B, T, prop.name,
           skewed ? "skewed" : "uniform", k, c.hidden, steps);
    size_t n = num_parameters(&c);
    float* host = (float*)mallocCheck(n * sizeof(float));
    init_params_synthetic_sparse(host, &c, k, 1, skewed);
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
        model.ffn.mode = mode == 0 ? FFN_DENSE : FFN_SPARSE;
        model.ffn.hot = ffn_hot_policy(mode == 0 ? FFN_HOT_OFF : FFN_HOT_MEASURED, 0);
        Optimizer opt;
        optimizer_init(&opt, &model, NULL);
        set_params_from_fp32(&model, &opt, host);
        double t = 0;
        for (int i = 0; i < steps + 3; i++) {
            double t0 = now_seconds();
            gpt_zero_grad(&model);
            gpt_stats_reset(&model);
            gpt_forward(&model, d_in, d_tg, B, T, 1.0f / M);
            gpt_backward(&model, d_in, 2e-5f / (c.num_layers * M));
            optimizer_step(&opt, &model, &oc, 0.0f, i + 1);
            gpt_stats_read(&model, M);
            gpt_ffn_update(&model, i, M, i == 0); // (the costs measured, the first hot sets)
            if (i >= 3) { t += now_seconds() - t0; }
        }
        tps[mode] = (double)M * steps / t;
        mem[mode] = used_gib() - base;
        double l0 = 0;
        int hot = 0;
        for (int l = 0; l < c.num_layers; l++) {
            l0 += model.stats[l].l0_mean / c.num_layers;
            hot += model.ffn.layer[l].hot_units;
        }
        printf("--ffn %-6s train %8.0f tok/s | device memory %.2f GiB | loss %.4f | mean active units %.1f | forwards "
               "redone %d | hot units %.0f per layer\n", mode == 0 ? "dense" : "sparse", tps[mode], mem[mode], model.ce,
               l0, model.ffn.redone, (double)hot / c.num_layers);
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

// One layer's inputs (f, dy [M, D]; Wg, Wu, WdT [H, D]) and every buffer of the three paths
struct Bench {
    int M, D, H;
    bf16 *f, *wg, *wu, *wdT, *dy;           // the pattern's inputs
    bf16 *pwg, *pwu, *pwdT;                 // the weights with the hot units first
    bf16 *g, *u, *h, *dh, *du, *y[2], *df[2];
    float* grads[2][3];                     // dense; sparse or split (Wg, Wu, WdT)
    float* grad_perm;                       // a dense gradient in the split's unit order
    float* l1;
    int* active;
    uint8_t* fired;
    uint32_t* count;
    int* perm;
    SparseScratch scratch;
    int* tail_used;
};

static const float l1_scale = 1e-3f;

// the cold pattern of `units` units, sized from their counts over the M tokens
struct Cold {
    SparsePattern<bf16> p;
    SparseTransposed t;
    bf16 *du, *dg;
};

static Cold cold_alloc(Bench* b, int units, const std::vector<int>& row_counts) {
    Cold c = {};
    if (units == 0) { return c; }
    double mean = 0;
    for (int r : row_counts) { mean += r; }
    mean /= b->M;
    int W = std::min(sparse_choose_width(mean, units), units), needed = 0;
    for (int r : row_counts) { needed += r > W; }
    sparse_pattern_alloc(&c.p, b->M, units, W, sparse_choose_tail(needed, b->M), b->tail_used, DEVICE_CUDA);
    size_t n = sparse_entries(b->M, units, W, c.p.tail_capacity);
    sparse_transposed_alloc(&c.t, units, b->D, n, DEVICE_CUDA);
    c.du = (bf16*)cuda_malloc(n * 2 + 16), c.dg = (bf16*)cuda_malloc(n * 2 + 16);
    return c;
}

static void cold_free(Cold* c) {
    if (c->p.M == 0) { return; }
    sparse_pattern_free(&c->p, DEVICE_CUDA);
    sparse_transposed_free(&c->t, DEVICE_CUDA);
    cuda_free(c->du);
    cuda_free(c->dg);
}

static void bench_pattern(Bench* b, const char* name) {
    const int M = b->M, D = b->D, H = b->H;
    const size_t MD = (size_t)M * D, HD = (size_t)H * D, MH = (size_t)M * H;
    auto dense_fwd = [&] {
        gemm(b->g, b->f, b->wg, M, H, D, 0, 1, 0);
        gemm(b->u, b->f, b->wu, M, H, D, 0, 1, 0);
        relu_gate_forward(b->h, b->l1, b->active, b->fired, b->g, b->u, M, H);
        gemm(b->y[0], b->h, b->wdT, M, D, H, 0, 0, 0);
    };
    auto dense_bwd = [&] {
        gemm(b->dh, b->dy, b->wdT, M, H, D, 0, 1, 0);
        gemm(b->grads[0][2], b->h, b->dy, H, D, M, 1, 0, 1);
        relu_gate_backward(b->dh, b->du, b->dh, b->g, b->u, b->h, l1_scale, M, H);
        gemm(b->df[0], b->du, b->wu, M, D, H, 0, 0, 0);
        gemm(b->df[0], b->dh, b->wg, M, D, H, 0, 0, 1);
        gemm(b->grads[0][1], b->du, b->f, H, D, M, 1, 0, 1);
        gemm(b->grads[0][0], b->dh, b->f, H, D, M, 1, 0, 1);
    };
    for (int i = 0; i < 3; i++) { cudaCheck(cudaMemset(b->grads[0][i], 0, HD * 4)); }
    cudaCheck(cudaMemset(b->count, 0, H * 4));
    dense_fwd();
    dense_bwd();
    unit_count_add(b->count, b->g, M, H);
    std::vector<int> row_counts = download(b->active, M);
    std::vector<uint32_t> counts = download(b->count, H);
    double pairs = 0;
    for (int r : row_counts) { pairs += r; }
    double mean = pairs / M;

    // the sparse FFN with no hot units, as llmc/ffn/split.h runs it
    Cold all = cold_alloc(b, H, row_counts);
    auto sparse_fwd = [&] {
        ffn_split_forward(b->y[1], b->l1, b->active, b->fired, &all.p, 0, (bf16*)NULL, b->g, b->f, b->wg, b->wu, b->wdT, M, D, H,
                          &b->scratch);
    };
    auto sparse_bwd = [&] {
        ffn_split_backward(b->df[1], b->grads[1][0], b->grads[1][1], b->grads[1][2], b->count, &all.p, 0, &all.t,
                           all.du, all.dg, (bf16*)NULL, b->dy, b->f, b->wg, b->wu, b->wdT, l1_scale, M, D,
                           H, &b->scratch);
    };
    auto gate_pack = [&] { ffn_cold_gate(&all.p, b->active, b->fired, b->g, b->f, b->wg, D, &b->scratch); };
    for (int i = 0; i < 3; i++) { cudaCheck(cudaMemset(b->grads[1][i], 0, HD * 4)); }
    sparse_fwd();
    sparse_bwd();
    if (download(b->tail_used, 1)[0] > all.p.tail_capacity) { fatal("tail overflow in the benchmark"); }
    double err_sparse = fmax(rel_err(b->y[1], b->y[0], MD), rel_err(b->df[1], b->df[0], MD));
    for (int i = 0; i < 3; i++) { err_sparse = fmax(err_sparse, rel_err(b->grads[1][i], b->grads[0][i], HD)); }
    std::vector<float> side = median_ms_interleaved({dense_fwd, sparse_fwd, [&] { dense_fwd(); dense_bwd(); },
                                                     [&] { sparse_fwd(); sparse_bwd(); }, gate_pack});
    float t_df = side[0], t_sf = side[1], t_dfb = side[2], t_sfb = side[3], t_gate = side[4];
    float st[5] = {
        median_ms([&] { sparse_up(&all.p, b->l1, b->f, b->wu, D); }),
        median_ms([&] { sparse_down(b->y[1], &all.p, b->wdT, D); }),
        median_ms([&] { sparse_transpose(&all.t, &all.p, &b->scratch); }),
        median_ms([&] { sparse_dh_weight_grads(all.du, all.dg, b->grads[1][1], b->grads[1][0], b->grads[1][2], &all.p,
                                               &all.t, b->f, b->dy, b->wdT, l1_scale, D); }),
        median_ms([&] { sparse_df(b->df[1], &all.p, all.du, all.dg, b->wu, b->wg, D); }),
    };

    // the hot/cold split: the costs as training measures them (ffn_hot_costs: the dense part alone over
    // FFN_HOT_PROBE and 4 FFN_HOT_PROBE units, the gate, the sparse layer, the last units alone as a cold part),
    // the hot units they give
    const int large = std::min(H, 4 * FFN_HOT_PROBE), small = large / 4, part_units = ffn_cold_probe_units(H);
    bf16* probe_buf = (bf16*)cuda_malloc(ffn_hot_scratch_elems(M, large) * 2);
    auto dense_part = [&](int units) {
        return median_ms([&] {
            ffn_split_forward(b->y[1], b->l1, b->active, b->fired, &all.p, units, probe_buf, b->g, b->f, b->wg, b->wu,
                              b->wdT, M, D, units, &b->scratch);
            ffn_split_backward(b->df[1], b->grads[1][0], b->grads[1][1], b->grads[1][2], b->count, &all.p, units, &all.t,
                               all.du, all.dg, probe_buf, b->dy, b->f, b->wg, b->wu, b->wdT, l1_scale, M, D, units,
                               &b->scratch);
        });
    };
    float t_small = dense_part(small), t_large = dense_part(large), t_part = 0.0f;
    double part_pairs = 0;
    if (part_units > 0) {
        FfnColdPart<bf16> part;
        ffn_cold_part_alloc(&part, M, part_units, D, DEVICE_CUDA);
        t_part = median_ms([&] {
            ffn_cold_part_run(&part, b->y[1], b->l1, b->active, b->fired, b->df[1], b->grads[1][0], b->grads[1][1],
                              b->grads[1][2], b->count, b->g, b->dy, b->f, b->wg, b->wu, b->wdT, M, D, H, &b->scratch);
        });
        ffn_cold_part_free(&part, DEVICE_CUDA);
        for (int n = H - part_units; n < H; n++) { part_pairs += counts[n]; }
    }
    cuda_free(probe_buf);
    cold_free(&all);
    FfnHotPolicy measured = ffn_hot_policy(FFN_HOT_MEASURED, 0);
    measured.costs = ffn_costs(t_small, small, t_large, large, t_gate, t_sfb, pairs, t_part, part_units, part_pairs, H, M);
    measured.measured = 1;
    std::vector<int> perm(H);
    std::vector<double> prefix(H + 1);
    ffn_hot_order(perm.data(), prefix.data(), counts.data(), H, M);
    int units = ffn_path_choose(perm.data(), prefix.data(), counts.data(), H, 0, M, &measured.costs, &ffn_no_prices, 0,
                                1, FFN_PATH_MIN_STEPS, (double*)NULL);
    if (units < 0) { // no hot set pays: all cold, in their order
        units = 0;
        for (int n = 0; n < H; n++) { perm[n] = n; }
    }
    // the split with the first `units` units of `order` hot (the weights permuted to that order): its times
    // beside dense's, its halves alone, its error against dense and the state it keeps
    struct SplitRun {
        float t_df, t_hf, t_dfb, t_hfb, t_hot, t_cold;
        double err, mb, hot_share;
    };
    auto run_split = [&](const std::vector<int>& order, int units) {
        SplitRun r;
        double hot_pairs = 0;
        for (int n = 0; n < units; n++) { hot_pairs += counts[order[n]]; }
        cudaCheck(cudaMemcpy(b->perm, order.data(), H * sizeof(int), cudaMemcpyHostToDevice));
        permute_rows_cuda(b->pwg, b->wg, b->perm, H, D);
        permute_rows_cuda(b->pwu, b->wu, b->perm, H, D);
        permute_rows_cuda(b->pwdT, b->wdT, b->perm, H, D);
        // the dense run again: the sparse path used g's buffer as its scratch, and the timing added to the gradients
        for (int i = 0; i < 3; i++) { cudaCheck(cudaMemset(b->grads[0][i], 0, HD * 4)); }
        dense_fwd();
        dense_bwd();
        std::vector<int> cold_counts(M); // the cold units' count per row, for the pattern's sizes
        {
            std::vector<int> is_cold(H, 0);
            for (int n = units; n < H; n++) { is_cold[order[n]] = 1; }
            std::vector<bf16> g = download(b->g, MH);
            for (int m = 0; m < M; m++) {
                int c = 0;
                for (int n = 0; n < H; n++) { c += is_cold[n] && __bfloat162float(g[(size_t)m * H + n]) > 0.0f; }
                cold_counts[m] = c;
            }
        }
        Cold cold = cold_alloc(b, H - units, cold_counts);
        bf16* hot_scratch = (bf16*)cuda_malloc(ffn_hot_scratch_elems(M, units) * 2 + 16);
        auto split_fwd = [&] {
            ffn_split_forward(b->y[1], b->l1, b->active, b->fired, &cold.p, units, hot_scratch, b->g, b->f, b->pwg, b->pwu, b->pwdT, M,
                              D, H, &b->scratch);
        };
        auto split_bwd = [&] {
            ffn_split_backward(b->df[1], b->grads[1][0], b->grads[1][1], b->grads[1][2], b->count, &cold.p, units, &cold.t,
                               cold.du, cold.dg, hot_scratch, b->dy, b->f, b->pwg, b->pwu, b->pwdT, l1_scale, M, D, H,
                               &b->scratch);
        };
        for (int i = 0; i < 3; i++) { cudaCheck(cudaMemset(b->grads[1][i], 0, HD * 4)); }
        split_fwd();
        split_bwd();
        if (units < H && download(b->tail_used, 1)[0] > cold.p.tail_capacity) { fatal("tail overflow in the benchmark"); }
        double err_split = fmax(rel_err(b->y[1], b->y[0], MD), rel_err(b->df[1], b->df[0], MD));
        for (int i = 0; i < 3; i++) { // against the dense gradients in the split's unit order
            permute_rows_cuda(b->grad_perm, b->grads[0][i], b->perm, H, D);
            err_split = fmax(err_split, rel_err(b->grads[1][i], b->grad_perm, HD));
        }
        std::vector<float> side2 = median_ms_interleaved({dense_fwd, split_fwd, [&] { dense_fwd(); dense_bwd(); },
                                                          [&] { split_fwd(); split_bwd(); }});
        float t_df2 = side2[0], t_hf = side2[1], t_dfb2 = side2[2], t_hfb = side2[3];
        // the split's two halves alone: all units cold but the hot ones (pointers past them), and the hot ones alone
        const size_t off = (size_t)units * D;
        float t_cold = units < H ? median_ms([&] {
            ffn_split_forward(b->y[1], b->l1, b->active, b->fired, &cold.p, 0, (bf16*)NULL, b->g, b->f, b->pwg + off, b->pwu + off,
                              b->pwdT + off, M, D, H - units, &b->scratch);
            ffn_split_backward(b->df[1], b->grads[1][0], b->grads[1][1], b->grads[1][2], b->count, &cold.p, 0, &cold.t,
                               cold.du, cold.dg, hot_scratch, b->dy, b->f, b->pwg + off, b->pwu + off, b->pwdT + off,
                               l1_scale, M, D, H - units, &b->scratch);
        }) : 0.0f;
        float t_hot = units > 0 ? median_ms([&] {
            ffn_split_forward(b->y[1], b->l1, b->active, b->fired, &cold.p, units, hot_scratch, b->g, b->f, b->pwg, b->pwu, b->pwdT,
                              M, D, units, &b->scratch);
            ffn_split_backward(b->df[1], b->grads[1][0], b->grads[1][1], b->grads[1][2], b->count, &cold.p, units,
                               &cold.t, cold.du, cold.dg, hot_scratch, b->dy, b->f, b->pwg, b->pwu, b->pwdT, l1_scale,
                               M, D, units, &b->scratch);
        }) : 0.0f;
        double split_mb = (units < H ? sparse_pattern_bytes(M, H - units, cold.p.W, cold.p.tail_capacity, 2) : 0) / 1e6;
        cold_free(&cold);
        cuda_free(hot_scratch);
        r.t_df = t_df2, r.t_hf = t_hf, r.t_dfb = t_dfb2, r.t_hfb = t_hfb, r.t_hot = t_hot, r.t_cold = t_cold;
        r.err = err_split, r.mb = split_mb, r.hot_share = pairs > 0 ? hot_pairs / pairs : 0.0;
        return r;
    };
    SplitRun split = run_split(perm, units);
    // what --ffn auto runs on this layer (llmc/ffn/hot.h): with the dense layer and the layer's paths timed as
    // training times them (its prices from all cold, then from the split it tries), the path with the least
    // modelled time (a layer starts dense); one neither timed here nor dense is timed now
    FfnCosts costs = measured.costs;
    costs.dense = split.t_dfb / M;
    FfnPairPrices prices = ffn_prices_fit(&costs, &ffn_no_prices, H, 0, t_sfb / M, prefix.data());
    if (units > 0 && units < H) { prices = ffn_prices_fit(&costs, &prices, H, units, split.t_hfb / M, prefix.data()); }
    std::vector<int> auto_perm(H);
    ffn_hot_order(auto_perm.data(), prefix.data(), counts.data(), H, M);
    int auto_h = ffn_path_choose(auto_perm.data(), prefix.data(), counts.data(), H, H, M, &costs, &prices, 1, 1,
                                 FFN_PATH_MIN_STEPS, (double*)NULL);
    if (auto_h < 0) { auto_h = H; } // (it stays dense)
    // the ratio of the path of h hot units (0: all sparse, H: dense) in the order `order`, timed for it where
    // no earlier run gives it; `at` gets a split's run
    SplitRun at = split;
    auto path_ratio = [&](const std::vector<int>& order, int h) {
        if (h == 0) { return (double)(t_dfb / t_sfb); }
        if (h == H) { return 1.0; }
        if (h != units || order != perm) { at = run_split(order, h); }
        return (double)(at.t_dfb / at.t_hfb);
    };
    double first_ratio = path_ratio(auto_perm, auto_h), auto_ratio = first_ratio;
    char first_name[32], auto_name[32];
    ffn_path_name(first_name, sizeof(first_name), auto_h, H, 1);
    // then as training goes on (ffn_path_update): the split it moved to is timed, its prices fitted again with
    // that time, and the path chosen again from there, until it stays (at most 4 moves)
    int moves = 0;
    while (moves < 4 && auto_h > 0 && auto_h < H) {
        prices = ffn_prices_fit(&costs, &prices, H, auto_h, at.t_hfb / M, prefix.data());
        std::vector<uint32_t> now_counts(H); // the counts in today's order (the units as auto_perm put them)
        for (int i = 0; i < H; i++) { now_counts[i] = counts[auto_perm[i]]; }
        std::vector<int> next(H);
        std::vector<double> next_prefix(H + 1);
        ffn_hot_order(next.data(), next_prefix.data(), now_counts.data(), H, M);
        int h = ffn_path_choose(next.data(), next_prefix.data(), now_counts.data(), H, auto_h, M, &costs, &prices, 1,
                                1, FFN_PATH_MIN_STEPS, (double*)NULL);
        if (h < 0) { break; }
        std::vector<int> order(H);
        for (int i = 0; i < H; i++) { order[i] = auto_perm[next[i]]; }
        auto_perm = order;
        auto_h = h;
        moves++;
        auto_ratio = path_ratio(auto_perm, auto_h);
    }
    ffn_path_name(auto_name, sizeof(auto_name), auto_h, H, 1);
    printf("%-13s %5.1f | %7.3f %7.3f %5.2fx %7.3f %5.2fx | %7.3f %7.3f %5.2fx %7.3f %5.2fx | %5d %4.0f%% | %10s %5.2fx |"
           " %7.1f %7.1f | %7.1e %7.1e\n",
           name, mean, t_df, t_sf, t_df / t_sf, split.t_hf, split.t_df / split.t_hf, t_dfb, t_sfb, t_dfb / t_sfb,
           split.t_hfb, split.t_dfb / split.t_hfb, units, 100 * split.hot_share, auto_name, auto_ratio,
           3.0 * MH * 2 / 1e6, split.mb, err_sparse, split.err);
    printf("%-13s stages of the sparse path (ms): gate+pack %.3f | up %.3f | down %.3f | transpose %.3f | dh+wgrad %.3f |"
           " df %.3f; the split's fwd+bwd: hot units alone %.3f, cold alone %.3f; dense part over %d / %d units %.3f / "
           "%.3f; the last %d units alone as a cold part %.3f, the cold part's constant %.3f; the dense layer %.3f, "
           "modelled from the dense part %.3f\n", "", t_gate, st[0], st[1], st[2], st[3], st[4], split.t_hot,
           split.t_cold, small, large, t_small, t_large, part_units, t_part, M * measured.costs.cold0, split.t_dfb,
           M * ffn_path_fixed(&measured.costs, H, H));
    printf("%-13s auto's first choice %s (%.2fx), then %d moves as training re-times its path: %s (%.2fx)\n", "",
           first_name, first_ratio, moves, auto_name, auto_ratio);
}

int main(int argc, char** argv) {
    if (argc > 1 && strcmp(argv[1], "model") == 0) { return bench_model(argc, argv); }
    int sized = argc > 3 && strcmp(argv[1], "trained") != 0, arg = sized ? 4 : 1;
    Bench b = {};
    b.M = sized ? atoi(argv[1]) : 16384, b.D = sized ? atoi(argv[2]) : 2048, b.H = sized ? atoi(argv[3]) : 5632;
    const char* trained = argc > arg + 1 && strcmp(argv[arg], "trained") == 0 ? argv[arg + 1] : NULL;
    int trained_layer = trained && argc > arg + 2 ? atoi(argv[arg + 2]) : 0;
    const int M = b.M, D = b.D, H = b.H;
    size_t MD = (size_t)M * D, HD = (size_t)H * D, MH = (size_t)M * H;
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("FFN fwd / fwd+bwd, M %d D %d H %d, %s; times are medians of 20 (ms), ratios against dense\n", M, D, H, prop.name);
    for (bf16** p : {&b.f, &b.dy, &b.y[0], &b.y[1], &b.df[0], &b.df[1]}) { *p = (bf16*)cuda_malloc(MD * 2); }
    for (bf16** p : {&b.wg, &b.wu, &b.wdT, &b.pwg, &b.pwu, &b.pwdT}) { *p = (bf16*)cuda_malloc(HD * 2); }
    for (bf16** p : {&b.g, &b.u, &b.h, &b.dh, &b.du}) { *p = (bf16*)cuda_malloc(MH * 2); }
    for (int s = 0; s < 2; s++) { for (int i = 0; i < 3; i++) { b.grads[s][i] = (float*)cuda_malloc(HD * 4); } }
    b.l1 = (float*)cuda_malloc(M * 4);
    b.active = (int*)cuda_malloc(M * 4);
    b.fired = (uint8_t*)cuda_malloc(H);
    b.count = (uint32_t*)cuda_malloc(H * 4);
    b.perm = (int*)cuda_malloc(H * 4);
    b.grad_perm = (float*)cuda_malloc(HD * 4);
    b.tail_used = (int*)cuda_malloc(sizeof(int));
    sparse_scratch_alloc_cuda(&b.scratch, M, H);

    printf("%-13s %5s | %7s %7s %6s %7s %6s | %7s %7s %6s %7s %6s | %5s %5s | %10s %6s | %7s %7s | %7s %7s\n",
           "pattern", "k", "dense f", "sparse", "ratio", "split", "ratio", "dense fb", "sparse", "ratio", "split",
           "ratio", "hot", "pairs", "auto", "ratio", "dense MB", "split MB", "err sp", "err spl");
    std::vector<float> hdy(MD);
    uint64_t rng = 5;
    for (float& x : hdy) { x = (float)rng_normal(&rng); }
    cudaCheck(cudaMemcpy(b.dy, to_bf16(hdy).data(), MD * 2, cudaMemcpyHostToDevice));
    const char* only = getenv("BENCH_ONLY"); // run only the patterns of this name, e.g. "uniform k=30"
    struct { double k; int realistic; } cases[] = {{8, 0}, {30, 0}, {100, 0}, {300, 0}, {30, 1}};
    std::vector<float> hf(MD), hwg(HD), hwu(HD), hwdT(HD);
    for (auto cs : cases) {
        char name[32];
        snprintf(name, sizeof(name), "%s k=%g", cs.realistic ? "realistic" : "uniform", cs.k);
        if (only && strcmp(name, only) != 0) { continue; }
        sparse_synthetic_ffn(hf.data(), hwg.data(), hwu.data(), hwdT.data(), M, D, H, cs.k, cs.realistic, 1);
        cudaCheck(cudaMemcpy(b.f, to_bf16(hf).data(), MD * 2, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(b.wg, to_bf16(hwg).data(), HD * 2, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(b.wu, to_bf16(hwu).data(), HD * 2, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(b.wdT, to_bf16(hwdT).data(), HD * 2, cudaMemcpyHostToDevice));
        bench_pattern(&b, name);
    }
    if (trained && (!only || strcmp(only, "trained") == 0)) {
        load_trained_layer(trained, trained_layer, M, D, H, b.f, b.wg, b.wu, b.wdT);
        char name[32];
        snprintf(name, sizeof(name), "trained l=%d", trained_layer);
        bench_pattern(&b, name);
    }
    printf("ratio = dense time / that path's time (> 1: faster than dense); split = hot units dense, the rest sparse"
           " (llmc/ffn/split.h), with the hot units the costs measured on this pattern give, as in training; hot ="
           " hot units, pairs = their share of the (token, unit) pairs; auto = the path --ffn auto settles on for this"
           " pattern (llmc/ffn/hot.h, with this run's times, each path it moves to timed as training times it; fwd+bwd);"
           " MB = FFN state kept for the backward (dense: g, u, h; split: the cold pattern, the hot part recomputes its g, u);"
           " err = max over y, df, dW of ||path - dense|| / ||dense||\n");
    sparse_scratch_free_cuda(&b.scratch);
    cublaslt_free();
    return 0;
}
