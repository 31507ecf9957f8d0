/*
 The whole model on the GPU against the CPU reference path: one forward and
 backward of a small GQA config on the same bf16-rounded weights and batch.
 Checks the loss, the L1 term and sparsity statistics, every parameter
 group's gradient, and that two GPU runs are bit-identical; with the ReLU
 FFN and a tied head, and with the SiLU FFN and an untied head (Llama's). Also checks the
 GPU matrix products (all three forms, bf16 and fp32 results) on their own.
*/
#include "llmc/gpt.h"
#include "test/gpu/gpu_util.cuh"
#include "test/test.h"

static float bf16_round(float x) { return __bfloat162float(__float2bfloat16(x)); }

// max |a - b| / max |b| over n values, infinite if a holds a NaN
static double max_rel_err(const float* a, const float* b, size_t n) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i])) { return INFINITY; }
        diff = fmax(diff, fabs((double)a[i] - b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    return diff / fmax(scale, 1e-30);
}

static void test_gemm(void) {
    uint64_t rng = 11;
    int shapes[][3] = {{64, 96, 128}, {37, 200, 72}, {256, 8, 1024}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        size_t big = (size_t)(M > N ? M : N) * K;
        float* a = (float*)mallocCheck(big * sizeof(float));
        float* b = (float*)mallocCheck(big * sizeof(float));
        float* c0 = (float*)mallocCheck((size_t)M * N * sizeof(float));
        float* ref = (float*)mallocCheck((size_t)M * N * sizeof(float));
        float* got = (float*)mallocCheck((size_t)M * N * sizeof(float));
        bf16* hb = (bf16*)mallocCheck(big * sizeof(bf16));
        for (size_t i = 0; i < big; i++) { a[i] = bf16_round((float)rng_normal(&rng)); b[i] = bf16_round((float)rng_normal(&rng)); }
        for (int i = 0; i < M * N; i++) { c0[i] = bf16_round((float)rng_normal(&rng)); }
        bf16 *da = (bf16*)cuda_malloc(big * sizeof(bf16)), *db = (bf16*)cuda_malloc(big * sizeof(bf16));
        bf16* dc16 = (bf16*)cuda_malloc((size_t)M * N * sizeof(bf16));
        float* dc32 = (float*)cuda_malloc((size_t)M * N * sizeof(float));
        for (size_t i = 0; i < big; i++) { hb[i] = __float2bfloat16(a[i]); }
        cudaCheck(cudaMemcpy(da, hb, big * sizeof(bf16), cudaMemcpyHostToDevice));
        for (size_t i = 0; i < big; i++) { hb[i] = __float2bfloat16(b[i]); }
        cudaCheck(cudaMemcpy(db, hb, big * sizeof(bf16), cudaMemcpyHostToDevice));
        int forms[3][2] = {{0, 1}, {0, 0}, {1, 0}};
        for (int f = 0; f < 3; f++) {
            for (int acc = 0; acc < 2; acc++) {
                int ta = forms[f][0], tb = forms[f][1];
                memcpy(ref, c0, (size_t)M * N * sizeof(float));
                gemm(ref, a, b, M, N, K, ta, tb, acc);
                // fp32 result; poisoned (NaN) unless it is accumulated into
                if (acc) { cudaCheck(cudaMemcpy(dc32, c0, (size_t)M * N * sizeof(float), cudaMemcpyHostToDevice)); }
                else { cudaCheck(cudaMemset(dc32, 0xFF, (size_t)M * N * sizeof(float))); }
                gemm(dc32, da, db, M, N, K, ta, tb, acc);
                cudaCheck(cudaMemcpy(got, dc32, (size_t)M * N * sizeof(float), cudaMemcpyDeviceToHost));
                double e32 = max_rel_err(got, ref, (size_t)M * N);
                // bf16 result
                for (int i = 0; i < M * N; i++) { hb[i] = __float2bfloat16(c0[i]); }
                if (acc) { cudaCheck(cudaMemcpy(dc16, hb, (size_t)M * N * sizeof(bf16), cudaMemcpyHostToDevice)); }
                else { cudaCheck(cudaMemset(dc16, 0xFF, (size_t)M * N * sizeof(bf16))); }
                gemm(dc16, da, db, M, N, K, ta, tb, acc);
                cudaCheck(cudaMemcpy(hb, dc16, (size_t)M * N * sizeof(bf16), cudaMemcpyDeviceToHost));
                for (int i = 0; i < M * N; i++) { got[i] = __bfloat162float(hb[i]); }
                double e16 = max_rel_err(got, ref, (size_t)M * N);
                // fp32 accumulation of exact bf16 products: only summation order differs;
                // a bf16 result adds one rounding (2^-9 relative)
                CHECK(e32 < 1e-5, "gemm %dx%dx%d trans %d%d acc %d: fp32 result rel err %g", M, N, K, ta, tb, acc, e32);
                CHECK(e16 < 8e-3, "gemm %dx%dx%d trans %d%d acc %d: bf16 result rel err %g", M, N, K, ta, tb, acc, e16);
            }
        }
        cuda_free(da); cuda_free(db); cuda_free(dc16); cuda_free(dc32);
        free(a); free(b); free(c0); free(ref); free(got); free(hb);
    }
}

// runs forward + backward on the GPU model and returns its gradients on the host
static void gpu_step(GPT<bf16, float>* model, const int* d_in, const int* d_tg, int B, int T, float dloss,
                     float l1_scale, float* grads_out) {
    gpt_zero_grad(model);
    gpt_stats_reset(model);
    if (model->acts_memory) { cudaCheck(cudaMemset(model->acts_memory, 0xFF, model->acts_bytes)); }
    for (int l = 0; l < model->config.num_layers; l++) { // the layers' own g, u, h
        if (model->ffn.layer[l].dense) {
            cudaCheck(cudaMemset(model->ffn.layer[l].dense, 0xFF, 3 * (size_t)B * T * model->config.hidden * sizeof(bf16)));
        }
    }
    gpt_forward(model, d_in, d_tg, B, T, dloss);
    gpt_backward(model, d_in, l1_scale);
    gpt_stats_read(model, (double)B * T);
    cudaCheck(cudaMemcpy(grads_out, model->grads, model->num_parameters * sizeof(float), cudaMemcpyDeviceToHost));
}

// max relative error of a GPU bf16 activation against the CPU's fp32 one
static double act_err(const bf16* gpu_acts, const float* cpu_acts, size_t n) {
    bf16* h = (bf16*)mallocCheck(n * sizeof(bf16));
    float* f = (float*)mallocCheck(n * sizeof(float));
    cudaCheck(cudaMemcpy(h, gpu_acts, n * sizeof(bf16), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) { f[i] = __bfloat162float(h[i]); }
    double err = max_rel_err(f, cpu_acts, n);
    free(h);
    free(f);
    return err;
}

static void test_model(int NKV, float lambda, int activation = ACT_RELU, int untied_head = 0) {
    GPTConfig c = {1000, 1024, 2, 256, 4, NKV, 512, 128, 10000.0f, 1e-5f, activation, untied_head};
    int B = 4, T = 128, M = B * T;
    size_t n = num_parameters(&c);
    float* params = (float*)mallocCheck(n * sizeof(float));
    init_params_random(params, &c, 5);
    // bf16-exact weights, so that both paths see the same numbers
    for (size_t i = 0; i < n; i++) { params[i] = bf16_round(params[i]); }

    GPT<float, float> cpu;
    gpt_build(&cpu, &c, DEVICE_CPU);
    memcpy(cpu.params, params, n * sizeof(float));
    GPT<bf16, float> gpu;
    gpt_build(&gpu, &c, DEVICE_CUDA);
    bf16* hp = (bf16*)mallocCheck(n * sizeof(bf16));
    for (size_t i = 0; i < n; i++) { hp[i] = __float2bfloat16(params[i]); }
    cudaCheck(cudaMemcpy(gpu.params, hp, n * sizeof(bf16), cudaMemcpyHostToDevice));

    int* in = (int*)mallocCheck(M * sizeof(int));
    int* tg = (int*)mallocCheck(M * sizeof(int));
    uint64_t rng = 17;
    for (int i = 0; i < M; i++) { in[i] = (int)rng_below(&rng, c.vocab_size); tg[i] = (int)rng_below(&rng, c.vocab_size); }
    int* d_in = (int*)cuda_malloc(M * sizeof(int));
    int* d_tg = (int*)cuda_malloc(M * sizeof(int));
    cudaCheck(cudaMemcpy(d_in, in, M * sizeof(int), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d_tg, tg, M * sizeof(int), cudaMemcpyHostToDevice));

    float dloss = 1.0f / M, l1_scale = lambda / (c.num_layers * M);
    gpt_zero_grad(&cpu);
    gpt_stats_reset(&cpu);
    gpt_forward(&cpu, in, tg, B, T, dloss);
    gpt_backward(&cpu, in, l1_scale);
    gpt_stats_read(&cpu, M);

    float* g1 = (float*)mallocCheck(n * sizeof(float));
    float* g2 = (float*)mallocCheck(n * sizeof(float));
    gpu_step(&gpu, d_in, d_tg, B, T, dloss, l1_scale, g1);
    double ce1 = gpu.ce;
    gpu_step(&gpu, d_in, d_tg, B, T, dloss, l1_scale, g2);
    CHECK(gpu.ce == ce1 && memcmp(g1, g2, n * sizeof(float)) == 0, "NKV %d: two GPU steps differ", NKV);

    printf("%s, %s head: ", activation_names[activation], untied_head ? "untied" : "tied");
    printf("NKV %d lambda %g: loss cpu %.6f gpu %.6f | l1 cpu %.6f gpu %.6f | l0 layer0 cpu %.2f gpu %.2f\n",
           NKV, lambda, cpu.ce, gpu.ce, cpu.l1_term, gpu.l1_term, cpu.stats[0].l0_mean, gpu.stats[0].l0_mean);
    // the forward's activations, each within a few bf16 roundings of the fp32 path
    // (attn_in and ffn_in hold one layer's, the last the backward recomputed)
    size_t MD = (size_t)M * c.num_layers * c.channels, MH = (size_t)M * c.num_layers * c.hidden, M1D = (size_t)M * c.channels;
    struct { const char* name; const bf16* gpu; const float* cpu; size_t n; } acts[] = {
        {"x_res", gpu.acts.x_res, cpu.acts.x_res, MD + (size_t)M * c.channels}, {"attn_in", gpu.acts.attn_in, cpu.acts.attn_in, M1D},
        {"qkv", gpu.acts.qkv, cpu.acts.qkv, (size_t)M * c.num_layers * qkv_dim(&c)}, {"att", gpu.acts.att, cpu.acts.att, MD},
        {"x_mid", gpu.acts.x_mid, cpu.acts.x_mid, MD}, {"ffn_in", gpu.acts.ffn_in, cpu.acts.ffn_in, M1D},
        {"final_out", gpu.acts.final_out, cpu.acts.final_out, M1D},
        {"dlogits", gpu.acts.logits, cpu.acts.logits, (size_t)M * c.padded_vocab_size},
        {"d_res", gpu.acts.d_res, cpu.acts.d_res, M1D},
    };
    for (int l = 0; l < c.num_layers; l++) { // each layer's g, u, h, kept in the layer's own buffer
        double err = act_err(gpu.ffn.layer[l].dense, cpu.ffn.layer[l].dense, 3 * MH / c.num_layers);
        printf("  act  g,u,h of %d max rel err %.2e\n", l, err);
        CHECK(err < 2e-2, "NKV %d: layer %d's g, u, h rel err %g", NKV, l, err);
    }
    for (size_t i = 0; i < sizeof(acts) / sizeof(acts[0]); i++) {
        double err = act_err(acts[i].gpu, acts[i].cpu, acts[i].n);
        printf("  act  %-10s max rel err %.2e\n", acts[i].name, err);
        // forward: a few bf16 roundings (2^-9 each) per value, measured <= 0.8% on an H200;
        // d_res is the backward's result after two layers of bf16 gradients, measured <= 3.3%
        double limit = strcmp(acts[i].name, "d_res") == 0 ? 6e-2 : 2e-2;
        CHECK(err < limit, "NKV %d: activation %s rel err %g", NKV, acts[i].name, err);
    }
    CHECK(fabs(gpu.ce - cpu.ce) < 1e-2, "NKV %d: loss %g vs %g", NKV, gpu.ce, cpu.ce);
    CHECK(fabs(gpu.l1_term - cpu.l1_term) < 2e-2 * cpu.l1_term, "NKV %d: l1 %g vs %g", NKV, gpu.l1_term, cpu.l1_term);
    for (int l = 0; l < c.num_layers; l++) {
        // a unit whose gate is within bf16 rounding of 0 may fire on one path only
        CHECK(fabs(gpu.stats[l].l0_mean - cpu.stats[l].l0_mean) < 0.01 * cpu.stats[l].l0_mean,
              "NKV %d layer %d: l0 %g vs %g", NKV, l, gpu.stats[l].l0_mean, cpu.stats[l].l0_mean);
    }
    // Gradients, as ||gpu - cpu|| / ||cpu||: bf16 activations and activation gradients carry
    // 2^-9 relative error per rounding, and a gate unit whose g lies within that of 0 fires on
    // one path only, which changes its whole gradient contribution (why wg is the worst).
    // Measured <= 5.4% on an H200; dev/compare_hf.py holds the GPU path to HF's own bf16 error.
    size_t sizes[NUM_PARAM_TENSORS], off = 0;
    param_sizes(sizes, &c);
    for (int p = 0; p < NUM_PARAM_TENSORS; p++) {
        if (sizes[p] == 0) { continue; } // (lm_head of a tied model)
        double err = norm_rel_err(g1 + off, cpu.grads + off, sizes[p]);
        printf("  grad %-10s rel err %.2e\n", param_names[p], err);
        CHECK(err < 8e-2, "NKV %d: %s gradient rel err %g", NKV, param_names[p], err);
        off += sizes[p];
    }
    gpt_free(&cpu);
    gpt_free(&gpu);
    cuda_free(d_in); cuda_free(d_tg);
    free(params); free(hp); free(in); free(tg); free(g1); free(g2);
}

int main(void) {
    test_gemm();
    test_model(4, 0.0f);
    test_model(2, 0.0f);
    test_model(2, 1e-3f);
    test_model(2, 0.0f, ACT_SILU, 1);
    cublaslt_free();
    return test_summary("test_model_gpu");
}
