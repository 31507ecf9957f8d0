/*
 The hot/cold split of a sparse FFN layer on the GPU (llmc/ffn/split.h), on fresh
 synthetic-sparse inputs (uniform k = 30 and the skewed realistic pattern,
 whose busiest units are put first as training would):
 - y, l1, df and the three weight gradients of the split equal the dense GPU
   path's on the same weights and batch within bf16 tolerance at every number
   of hot units from 0 to H; outputs poisoned (NaN) first, NaN fails; the
   units' firing counts match the dense g's; two runs give the same bits; the
   backward makes the forward's hot g and u again, to the bit, in a scratch
   overwritten between the two;
 - its kernels against their CPU references: relu_gate_forward adding to the
   row sums, unit_count_add, sparse_unit_count_add, permute_rows_cuda;
 - the model (llmc/gpt.h, llmc/optimizer.h): a layer's units permuted in the
   bf16 weights, the master weights and the moments keep the losses; training
   with --ffn sparse and the hot sets re-chosen every step follows --ffn dense;
   the hot/cold costs measured on the GPU are positive and finite (the cold
   part's constant at least 0).
*/
#include <algorithm>
#include <vector>
#include "llmc/gpt.h"
#include "llmc/optimizer.h"
#include "llmc/synthetic.h"
#include "test/gpu/gpu_util.cuh"
#include "test/test.h"

static const float l1_scale = 1e-3f;

struct Outputs { std::vector<float> y, l1, df, dwg, dwu, dwdT; std::vector<int> active; std::vector<uint32_t> count; };

// the layer's inputs on the device and its outputs
struct Layer {
    int M, D, H;
    bf16 *f, *wg, *wu, *wdT, *dy, *y, *df;
    float *l1, *dwg, *dwu, *dwdT;
    int* active;
    uint8_t* fired;
    uint32_t* count;
};

static Outputs outputs(const Layer& c) {
    size_t MD = (size_t)c.M * c.D, HD = (size_t)c.H * c.D;
    return {to_float(download(c.y, MD)), download(c.l1, c.M), to_float(download(c.df, MD)), download(c.dwg, HD),
            download(c.dwu, HD), download(c.dwdT, HD), download(c.active, c.M), download(c.count, c.H)};
}

static void reset(const Layer& c) {
    size_t MD = (size_t)c.M * c.D, HD = (size_t)c.H * c.D;
    poison(c.y, MD * 2), poison(c.df, MD * 2), poison(c.l1, c.M * 4), poison(c.active, c.M * 4);
    for (float* g : {c.dwg, c.dwu, c.dwdT}) { cudaCheck(cudaMemset(g, 0, HD * 4)); }
    cudaCheck(cudaMemset(c.count, 0, c.H * 4));
    cudaCheck(cudaMemset(c.fired, 0, c.H));
}

// the dense path (llmc/gpt.h's for a dense layer), with the counts of the dense g
static Outputs dense(const Layer& c) {
    int M = c.M, D = c.D, H = c.H;
    size_t MH = (size_t)M * H;
    bf16 *g = (bf16*)cuda_malloc(MH * 2), *u = (bf16*)cuda_malloc(MH * 2), *h = (bf16*)cuda_malloc(MH * 2);
    bf16 *dh = (bf16*)cuda_malloc(MH * 2), *du = (bf16*)cuda_malloc(MH * 2);
    reset(c);
    gemm(g, c.f, c.wg, M, H, D, 0, 1, 0);
    gemm(u, c.f, c.wu, M, H, D, 0, 1, 0);
    relu_gate_forward(h, c.l1, c.active, c.fired, g, u, M, H);
    gemm(c.y, h, c.wdT, M, D, H, 0, 0, 0);
    gemm(dh, c.dy, c.wdT, M, H, D, 0, 1, 0);
    gemm(c.dwdT, h, c.dy, H, D, M, 1, 0, 1);
    relu_gate_backward(dh, du, dh, g, u, h, l1_scale, M, H);
    gemm(c.df, du, c.wu, M, D, H, 0, 0, 0);
    gemm(c.df, dh, c.wg, M, D, H, 0, 0, 1);
    gemm(c.dwu, du, c.f, H, D, M, 1, 0, 1);
    gemm(c.dwg, dh, c.f, H, D, M, 1, 0, 1);
    unit_count_add(c.count, g, M, H);
    Outputs o = outputs(c);
    for (bf16* p : {g, u, h, dh, du}) { cuda_free(p); }
    return o;
}

// the split with `hot` hot units; the cold pattern sized from the dense run's counts
static Outputs split(const Layer& c, int hot, const Outputs& ref) {
    int M = c.M, D = c.D, H = c.H, cold = H - hot;
    SparsePattern<bf16> p = {};
    SparseTransposed t = {};
    SparseScratch s;
    sparse_scratch_alloc_cuda(&s, M, H);
    int* tail_used = (int*)cuda_malloc(sizeof(int));
    bf16 *du = NULL, *dg = NULL;
    bf16* g = (bf16*)cuda_malloc((size_t)M * H * 2);
    if (cold > 0) {
        int W = 64, needed = 0;
        for (int a : ref.active) { needed += a > W; }
        sparse_pattern_alloc(&p, M, cold, std::min(W, cold), sparse_choose_tail(needed, M), tail_used, DEVICE_CUDA);
        size_t entries = sparse_entries(M, cold, p.W, p.tail_capacity);
        sparse_transposed_alloc(&t, cold, D, entries, DEVICE_CUDA);
        du = (bf16*)cuda_malloc(entries * 2 + 16), dg = (bf16*)cuda_malloc(entries * 2 + 16);
    }
    const size_t scratch_elems = ffn_hot_scratch_elems(M, hot), hot_gu = 2 * (size_t)M * hot;
    bf16* hot_scratch = (bf16*)cuda_malloc(scratch_elems * 2 + 16);
    reset(c);
    ffn_split_forward(c.y, c.l1, c.active, c.fired, &p, hot, hot_scratch, g, c.f, c.wg, c.wu, c.wdT, M, D, H, &s);
    // the hot part's g and u of the forward; the backward makes them again in a scratch that other layers used
    // in between (NaN here: 0xffff), to the same bits (the same cuBLASLt product), and leaves them there
    std::vector<bf16> fwd_gu = download(hot_scratch, hot_gu);
    cudaCheck(cudaMemset(hot_scratch, 0xff, scratch_elems * 2));
    ffn_split_backward(c.df, c.dwg, c.dwu, c.dwdT, c.count, &p, hot, &t, du, dg, hot_scratch, c.dy, c.f, c.wg, c.wu,
                       c.wdT, l1_scale, M, D, H, &s);
    if (cold > 0) { CHECK(download(tail_used, 1)[0] <= p.tail_capacity, "hot %d: the tail held every row", hot); }
    std::vector<bf16> bwd_gu = download(hot_scratch, hot_gu);
    CHECK(hot == 0 || memcmp(fwd_gu.data(), bwd_gu.data(), hot_gu * 2) == 0,
          "hot %d: the backward's g, u are the forward's", hot);
    Outputs o = outputs(c);
    sparse_pattern_free(&p, DEVICE_CUDA);
    sparse_transposed_free(&t, DEVICE_CUDA);
    sparse_scratch_free_cuda(&s);
    for (void* q : {(void*)tail_used, (void*)du, (void*)dg, (void*)g, (void*)hot_scratch}) { cuda_free(q); }
    return o;
}

// rows of a [H, D] matrix in the order perm
static std::vector<float> permuted(const std::vector<float>& w, const std::vector<int>& perm, int D) {
    std::vector<float> out(w.size());
    permute_rows(out.data(), w.data(), perm.data(), (int)perm.size(), D);
    return out;
}

static void test_split(int M, int D, int H, double k, int realistic) {
    size_t MD = (size_t)M * D, HD = (size_t)H * D;
    std::vector<float> f(MD), wg(HD), wu(HD), wdT(HD), dy(MD);
    sparse_synthetic_ffn(f.data(), wg.data(), wu.data(), wdT.data(), M, D, H, k, realistic, 31 + realistic);
    uint64_t rng = 77;
    for (float& x : dy) { x = (float)rng_normal(&rng); }
    Layer c = {};
    c.M = M, c.D = D, c.H = H;
    c.f = upload(to_bf16(f)), c.dy = upload(to_bf16(dy));
    for (bf16** p : {&c.wg, &c.wu, &c.wdT}) { *p = (bf16*)cuda_malloc(HD * 2); }
    c.y = (bf16*)cuda_malloc(MD * 2), c.df = (bf16*)cuda_malloc(MD * 2), c.l1 = (float*)cuda_malloc(M * 4);
    for (float** p : {&c.dwg, &c.dwu, &c.dwdT}) { *p = (float*)cuda_malloc(HD * 4); }
    c.active = (int*)cuda_malloc(M * 4), c.fired = (uint8_t*)cuda_malloc(H), c.count = (uint32_t*)cuda_malloc(H * 4);
    // the busiest units first, as the hot/cold choice orders them (by the counts of a first dense run)
    std::vector<int> perm(H);
    for (int n = 0; n < H; n++) { perm[n] = n; }
    for (int pass = 0; pass < 2; pass++) {
        cudaCheck(cudaMemcpy(c.wg, to_bf16(permuted(wg, perm, D)).data(), HD * 2, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(c.wu, to_bf16(permuted(wu, perm, D)).data(), HD * 2, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(c.wdT, to_bf16(permuted(wdT, perm, D)).data(), HD * 2, cudaMemcpyHostToDevice));
        if (pass == 1) { break; }
        std::vector<uint32_t> count = dense(c).count;
        std::stable_sort(perm.begin(), perm.end(), [&](int a, int b) { return count[a] > count[b]; });
    }
    Outputs ref = dense(c);
    for (int hot : {0, 64, 256, H - 64, H}) {
        Outputs got = split(c, hot, ref);
        char what[96];
        snprintf(what, sizeof(what), "%s k=%g, M %d D %d H %d, %d hot", realistic ? "realistic" : "uniform", k, M, D, H, hot);
        double e[6] = {norm_rel_err(got.y, ref.y), norm_rel_err(got.l1, ref.l1), norm_rel_err(got.df, ref.df),
                       norm_rel_err(got.dwg, ref.dwg), norm_rel_err(got.dwu, ref.dwu), norm_rel_err(got.dwdT, ref.dwdT)};
        const char* names[6] = {"y", "l1", "df", "dWg", "dWu", "dWdT"};
        for (int i = 0; i < 6; i++) { CHECK(e[i] < 2e-2, "%s: %s rel err %.3g", what, names[i], e[i]); }
        // the cold gate is a product of its own, so a g within rounding of 0 may fire on one side only
        long active_diff = 0, count_diff = 0, pairs = 0;
        for (int m = 0; m < M; m++) { active_diff += labs((long)got.active[m] - ref.active[m]), pairs += ref.active[m]; }
        for (int n = 0; n < H; n++) { count_diff += labs((long)got.count[n] - (long)ref.count[n]); }
        CHECK(active_diff <= pairs / 1000 + 2 && count_diff <= pairs / 1000 + 2, "%s: active %ld, counts %ld of %ld pairs differ",
              what, active_diff, count_diff, pairs);
        Outputs again = split(c, hot, ref);
        CHECK(again.y == got.y && again.df == got.df && again.dwg == got.dwg && again.dwdT == got.dwdT, "%s: same bits twice", what);
        long hot_pairs = 0;
        for (int n = 0; n < hot; n++) { hot_pairs += ref.count[n]; }
        printf("  %s (%.0f%% of the pairs hot): rel err y %.1e l1 %.1e df %.1e dWg %.1e dWu %.1e dWdT %.1e\n", what,
               100.0 * hot_pairs / std::max(pairs, 1L), e[0], e[1], e[2], e[3], e[4], e[5]);
    }
    for (void* p : {(void*)c.f, (void*)c.dy, (void*)c.wg, (void*)c.wu, (void*)c.wdT, (void*)c.y, (void*)c.df, (void*)c.l1,
                    (void*)c.dwg, (void*)c.dwu, (void*)c.dwdT, (void*)c.active, (void*)c.fired, (void*)c.count}) {
        cuda_free(p);
    }
}

// the small kernels against their CPU references on the same bf16 inputs
static void test_kernels(void) {
    const int M = 300, H = 136, D = 40;
    uint64_t rng = 5;
    std::vector<float> g(M * H), u(M * H);
    for (float& x : g) { x = (float)(rng_normal(&rng) - 1.0); }
    for (float& x : u) { x = (float)rng_normal(&rng); }
    std::vector<float> gr = to_float(to_bf16(g)), ur = to_float(to_bf16(u));
    bf16 *dg = upload(to_bf16(g)), *du = upload(to_bf16(u)), *dh = (bf16*)cuda_malloc(M * H * 2);
    // relu_gate_forward adding to what the cold part wrote
    std::vector<float> l1_start(M), h(M * H), l1(M);
    std::vector<int> active_start(M), active(M);
    for (int m = 0; m < M; m++) { l1_start[m] = (float)m, active_start[m] = 3 * m; }
    float* d_l1 = upload(l1_start);
    int* d_active = upload(active_start);
    relu_gate_forward(dh, d_l1, d_active, (uint8_t*)NULL, dg, du, M, H, 1);
    l1 = l1_start, active = active_start;
    relu_gate_forward(h.data(), l1.data(), active.data(), (uint8_t*)NULL, gr.data(), ur.data(), M, H, 1);
    std::vector<float> got_l1 = download(d_l1, M);
    double worst = 0;
    for (int m = 0; m < M; m++) { worst = fmax(worst, fabs(got_l1[m] - l1[m]) / fmax(1.0, fabs(l1[m]))); }
    CHECK(download(d_active, M) == active && worst < 1e-2, "relu_gate_forward accumulate: counts, l1 (rel %.2g)", worst);
    // unit counts of a dense g
    std::vector<uint32_t> count(H, 7);
    uint32_t* d_count = upload(count);
    unit_count_add(d_count, dg, M, H);
    unit_count_add(count.data(), gr.data(), M, H);
    CHECK(download(d_count, H) == count, "unit_count_add");
    // unit counts of a transposed pattern
    SparsePattern<bf16> p;
    int* tail_used = (int*)cuda_malloc(4);
    sparse_pattern_alloc(&p, M, H, H, 0, tail_used, DEVICE_CUDA);
    SparseScratch s;
    sparse_scratch_alloc_cuda(&s, M, H);
    SparseTransposed t;
    sparse_transposed_alloc(&t, H, D, sparse_entries(M, H, H, 0), DEVICE_CUDA);
    sparse_pack(&p, d_active, (uint8_t*)NULL, dg, &s);
    sparse_transpose(&t, &p, &s);
    cudaCheck(cudaMemset(d_count, 0, H * 4));
    sparse_unit_count_add(d_count, &p, &t);
    std::fill(count.begin(), count.end(), 0);
    unit_count_add(count.data(), gr.data(), M, H);
    CHECK(download(d_count, H) == count, "sparse_unit_count_add");
    // a permutation of rows
    std::vector<int> perm(H);
    for (int n = 0; n < H; n++) { perm[n] = (n * 53 + 11) % H; }
    int* d_perm = upload(perm);
    bf16* moved = (bf16*)cuda_malloc(M * H * 2);
    permute_rows_cuda(moved, dg, d_perm, H, M); // rows of M here
    std::vector<float> want(M * H);
    permute_rows(want.data(), gr.data(), perm.data(), H, M);
    CHECK(to_float(download(moved, M * H)) == want, "permute_rows_cuda, bf16");
    float *d_gf = upload(gr), *movedf = (float*)cuda_malloc(M * H * 4);
    permute_rows_cuda(movedf, d_gf, d_perm, H, M);
    CHECK(download(movedf, M * H) == want, "permute_rows_cuda, fp32");
    sparse_pattern_free(&p, DEVICE_CUDA);
    sparse_transposed_free(&t, DEVICE_CUDA);
    sparse_scratch_free_cuda(&s);
    for (void* q : {(void*)dg, (void*)du, (void*)dh, (void*)d_l1, (void*)d_active, (void*)d_count, (void*)tail_used,
                    (void*)d_perm, (void*)moved, (void*)d_gf, (void*)movedf}) {
        cuda_free(q);
    }
}

// the model: permuted units keep the losses; training with hot sets follows the dense path
static void test_model(void) {
    GPTConfig c = {512, 512, 2, 128, 4, 4, 512, 64, 10000.0f, 1e-5f, ACT_RELU, 0};
    int B = 4, T = 64, M = B * T;
    TokenBatch batch = upload_random_batch(M, c.vocab_size, 9);
    std::vector<float> w(num_parameters(&c));
    init_params_synthetic_sparse(w.data(), &c, 24, 3);
    GPT<bf16, float> model;
    gpt_build(&model, &c, DEVICE_CUDA);
    model.ffn.mode = FFN_SPARSE;
    Optimizer opt;
    optimizer_init(&opt, &model, NULL);
    set_params_from_fp32(&model, &opt, w.data());
    gpt_forward(&model, batch.inputs, batch.targets, B, T, 0.0f);
    std::vector<float> loss0 = download(model.acts.losses, M);
    std::vector<int> perm(c.hidden);
    for (int n = 0; n < c.hidden; n++) { perm[n] = (n * 101 + 7) % c.hidden; }
    const FfnLayer<bf16>* layer = &model.ffn.layer[1];
    ffn_hot_permute(layer->wg, layer->wu, layer->wdT, 1, perm.data(), c.hidden, c.channels, &model.ffn.hooks,
                    DEVICE_CUDA);
    gpt_forward(&model, batch.inputs, batch.targets, B, T, 0.0f);
    double e = norm_rel_err(download(model.acts.losses, M), loss0);
    CHECK(e < 1e-2, "a permuted layer keeps the losses (rel %.2g)", e);
    optimizer_free(&opt);
    gpt_free(&model);

    // training: dense, then sparse with the costs measured and the hot sets re-chosen every step;
    // then with a low fixed rate so that hot sets surely change
    const int steps = 8;
    double loss[3][steps];
    int changed = 0;
    for (int mode = 0; mode < 3; mode++) {
        GPT<bf16, float> m;
        gpt_build(&m, &c, DEVICE_CUDA);
        m.ffn.mode = mode ? FFN_SPARSE : FFN_DENSE;
        m.ffn.hot = ffn_hot_policy(mode == 0 ? FFN_HOT_OFF : mode == 1 ? FFN_HOT_MEASURED : FFN_HOT_RATE, 0.02f);
        Optimizer o;
        optimizer_init(&o, &m, NULL);
        set_params_from_fp32(&m, &o, w.data());
        OptimConfig oc = {1e-4f, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0f, 0, steps, 0.1f};
        for (int step = 0; step < steps; step++) {
            gpt_zero_grad(&m);
            gpt_stats_reset(&m);
            gpt_forward(&m, batch.inputs, batch.targets, B, T, 1.0f / M);
            gpt_backward(&m, batch.inputs, 1e-4f / (c.num_layers * M));
            optimizer_step(&o, &m, &oc, lr_at_step(&oc, step), step + 1);
            gpt_stats_read(&m, M);
            int before = m.ffn.layer[0].hot_units + 10000 * m.ffn.layer[1].hot_units;
            gpt_ffn_update(&m, step, M, 0);
            changed += mode == 2 && before != m.ffn.layer[0].hot_units + 10000 * m.ffn.layer[1].hot_units;
            loss[mode][step] = m.ce;
        }
        if (mode == 1) {
            const FfnCosts* hc = &m.ffn.hot.costs;
            CHECK(m.ffn.hot.measured && hc->dense0 >= 0 && hc->dense1 > 0 && hc->gate1 > 0 && hc->pair1 > 0 &&
                  hc->dense1 < 1e-3 && hc->cold0 >= 0 && hc->cold0 < 1e-3,
                  "measured costs per token: dense %g + %g per unit, cold %g + gate %g per unit + %g per pair",
                  hc->dense0, hc->dense1, hc->cold0, hc->gate1, hc->pair1);
        }
        optimizer_free(&o);
        gpt_free(&m);
    }
    double worst = 0;
    for (int mode = 1; mode < 3; mode++) {
        for (int step = 0; step < steps; step++) { worst = fmax(worst, fabs(loss[mode][step] - loss[0][step]) / loss[0][step]); }
    }
    CHECK(changed > 0, "hot sets changed during training (%d)", changed);
    CHECK(worst < 1e-2, "sparse with hot units follows dense: worst relative loss difference %.2g", worst);
    cuda_free(batch.inputs);
    cuda_free(batch.targets);
}

int main(void) {
    test_kernels();
    test_split(4096, 256, 1024, 30, 0);
    test_split(4096, 256, 1024, 30, 1);
    test_split(2048, 128, 576, 8, 1); // H not a multiple of 256 (the gate's tiles)
    test_model();
    cublaslt_free();
    return test_summary("test_ffn_split");
}
