/*
 Checks of the CPU reference model:
 - the blocked matrix products against naive triple loops at ragged sizes;
 - every parameter group's gradient against central finite differences, in
   double precision on a tiny config, with lambda = 0 and lambda > 0, for the
   ReLU and the SiLU FFN, with the output head tied and untied;
 - the cached inference forward (a prefill, then one token at a time; one
   prompt, and a batch of prompts of different lengths) against the training
   forward's logits, for both activations and heads.
*/
#include "llmc/inference.h"
#include "llmc/optimizer.h"
#include "test/test.h"

static double rel_err(double a, double b) { return fabs(a - b) / fmax(fmax(fabs(a), fabs(b)), 1e-7); }

static void test_gemm(void) {
    uint64_t rng = 7;
    int sizes[][3] = {{1, 1, 1}, {5, 7, 3}, {4, 4, 4}, {67, 70, 33}, {130, 9, 257}};
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        int M = sizes[s][0], N = sizes[s][1], K = sizes[s][2];
        double* A = (double*)mallocCheck(sizeof(double) * M * K);
        double* B = (double*)mallocCheck(sizeof(double) * N * K);
        double* C = (double*)mallocCheck(sizeof(double) * M * N);
        double* R = (double*)mallocCheck(sizeof(double) * M * N);
        for (int i = 0; i < M * K; i++) { A[i] = rng_normal(&rng); }
        for (int i = 0; i < N * K; i++) { B[i] = rng_normal(&rng); }
        // nt: C = A B^T, with B as [N, K]
        for (int acc = 0; acc < 2; acc++) {
            for (int i = 0; i < M * N; i++) { C[i] = acc ? 1.0 : NAN; }
            gemm_nt(C, A, B, M, N, K, acc);
            double worst = 0;
            for (int i = 0; i < M; i++) {
                for (int j = 0; j < N; j++) {
                    double r = acc;
                    for (int k = 0; k < K; k++) { r += A[i * K + k] * B[j * K + k]; }
                    worst = fmax(worst, rel_err(C[i * N + j], r));
                    if (isnan(C[i * N + j])) { worst = INFINITY; }
                }
            }
            CHECK(worst < 1e-9, "gemm_nt %dx%dx%d acc=%d rel err %g", M, N, K, acc, worst);
        }
        // nn: C[M,N] = A[M,K] B[K,N], with B as [K, N]
        for (int i = 0; i < M * N; i++) { C[i] = NAN; }
        gemm_nn(C, A, B, M, N, K, 0);
        double worst = 0;
        for (int i = 0; i < M; i++) {
            for (int j = 0; j < N; j++) {
                double r = 0;
                for (int k = 0; k < K; k++) { r += A[i * K + k] * B[k * N + j]; }
                worst = isnan(C[i * N + j]) ? INFINITY : fmax(worst, rel_err(C[i * N + j], r));
            }
        }
        CHECK(worst < 1e-9, "gemm_nn %dx%dx%d rel err %g", M, N, K, worst);
        // tn: C[M,N] = A[K,M]^T B[K,N]
        for (int i = 0; i < M * N; i++) { R[i] = C[i] = rng_normal(&rng); }
        gemm_tn(C, A, B, M, N, K, 1);
        worst = 0;
        for (int i = 0; i < M; i++) {
            for (int j = 0; j < N; j++) {
                double r = R[i * N + j];
                for (int k = 0; k < K; k++) { r += A[k * M + i] * B[k * N + j]; }
                worst = isnan(C[i * N + j]) ? INFINITY : fmax(worst, rel_err(C[i * N + j], r));
            }
        }
        CHECK(worst < 1e-9, "gemm_tn %dx%dx%d rel err %g", M, N, K, worst);
        free(A); free(B); free(C); free(R);
    }
}

static GPTConfig tiny_config(int activation = ACT_RELU, int untied_head = 0) {
    GPTConfig c = {};
    c.activation = activation;
    c.untied_head = untied_head;
    c.vocab_size = 37;
    c.padded_vocab_size = 128;
    c.num_layers = 2;
    c.channels = 8;
    c.num_heads = 2;
    c.num_kv_heads = 1;
    c.hidden = 12;
    c.max_seq_len = 8;
    c.rope_theta = 10000.0f;
    c.norm_eps = 1e-5f;
    return c;
}

// weights larger than the training init so that every path carries signal
static void init_for_check(GPT<double, double>* model, uint64_t seed) {
    size_t sizes[NUM_PARAM_TENSORS];
    param_sizes(sizes, &model->config);
    uint64_t rng = seed;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        for (size_t j = 0; j < sizes[i]; j++) {
            model->param[i][j] = param_is_matrix(i) ? 0.5 * rng_normal(&rng) : 1.0 + 0.2 * rng_normal(&rng);
        }
    }
}

static double total_loss(GPT<double, double>* model, const int* inputs, const int* targets, int B, int T, double lambda) {
    gpt_stats_reset(model);
    gpt_forward(model, inputs, targets, B, T, 0.0f);
    gpt_stats_read(model, B * T);
    return model->ce + lambda * model->l1_term;
}

// M random inputs and targets from the vocabulary, drawn in turn from rng
static void random_tokens(int* inputs, int* targets, int M, int vocab, uint64_t* rng) {
    for (int i = 0; i < M; i++) {
        inputs[i] = (int)rng_below(rng, vocab);
        targets[i] = (int)rng_below(rng, vocab);
    }
}

// one micro-batch's forward and backward (its gradients added to the model's), then its statistics read
static void forward_backward(GPT<double, double>* model, const int* inputs, const int* targets, int B, int T,
                             float l1_scale) {
    gpt_stats_reset(model);
    gpt_forward(model, inputs, targets, B, T, 1.0f / (B * T));
    gpt_backward(model, inputs, l1_scale);
    gpt_stats_read(model, B * T);
}

// logits_rows > 0: the forward's logits in slices of that many rows (the head's backward in the forward)
static void test_gradients(double lambda, int activation, int untied_head, int logits_rows = 0) {
    GPTConfig c = tiny_config(activation, untied_head);
    const char* what = activation_names[activation];
    const char* head = untied_head ? "untied" : "tied";
    GPT<double, double> model;
    gpt_build(&model, &c, DEVICE_CPU);
    if (logits_rows > 0) { model.logits_bytes = (size_t)logits_rows * c.padded_vocab_size * sizeof(double); }
    init_for_check(&model, 42);
    int B = 2, T = 5, M = B * T;
    int inputs[10], targets[10];
    uint64_t rng = 3;
    random_tokens(inputs, targets, M, c.vocab_size, &rng);
    gpt_zero_grad(&model);
    forward_backward(&model, inputs, targets, B, T, (float)(lambda / (c.num_layers * M)));
    int any_active = 0;
    for (int l = 0; l < c.num_layers; l++) { any_active += model.stats[l].l0_mean > 0; }
    CHECK(any_active == c.num_layers, "%s: every layer should have firing units", what);

    size_t sizes[NUM_PARAM_TENSORS];
    param_sizes(sizes, &c);
    double eps = 1e-6;
    for (int p = 0; p < NUM_PARAM_TENSORS; p++) {
        if (sizes[p] == 0) { continue; } // (lm_head of a tied model)
        double worst = 0;
        size_t checks = sizes[p] < 60 ? sizes[p] : 60;
        for (size_t k = 0; k < checks; k++) {
            size_t j = sizes[p] < 60 ? k : rng_below(&rng, sizes[p]);
            double saved = model.param[p][j];
            model.param[p][j] = saved + eps;
            double up = total_loss(&model, inputs, targets, B, T, lambda);
            model.param[p][j] = saved - eps;
            double down = total_loss(&model, inputs, targets, B, T, lambda);
            model.param[p][j] = saved;
            double numeric = (up - down) / (2 * eps);
            double analytic = model.grad[p][j];
            double err = fabs(numeric - analytic) / fmax(fabs(numeric) + fabs(analytic), 1e-6);
            if (isnan(analytic)) { err = INFINITY; }
            worst = fmax(worst, err);
        }
        CHECK(worst < 1e-5, "%s, %s head, lambda %g, logits in slices of %d rows: %s gradient rel err %g vs finite "
              "differences", what, head, lambda, model.acts.logits_rows, param_names[p], worst);
    }
    // the padded vocab rows never receive gradient (of the embedding, and of an untied head)
    const int vocab_rows[2] = {P_WTE, P_LM_HEAD};
    for (int k = 0; k <= c.untied_head; k++) {
        int p = vocab_rows[k];
        double padded = 0;
        for (size_t j = (size_t)c.vocab_size * c.channels; j < sizes[p]; j++) { padded += fabs(model.grad[p][j]); }
        CHECK(padded == 0, "%s: padded vocab rows got gradient %g", param_names[p], padded);
    }
    gpt_free(&model);
}

// recomputing the FFN activations in the backward gives the same gradients, bit for bit
static void test_recompute(void) {
    GPTConfig c = tiny_config();
    GPT<double, double> kept, recomputed;
    gpt_build(&kept, &c, DEVICE_CPU);
    gpt_build(&recomputed, &c, DEVICE_CPU);
    recomputed.ffn.recompute = 1;
    init_for_check(&kept, 42);
    memcpy(recomputed.params, kept.params, kept.num_parameters * sizeof(double));
    int B = 2, T = 5, M = B * T;
    int inputs[10], targets[10];
    uint64_t rng = 8;
    random_tokens(inputs, targets, M, c.vocab_size, &rng);
    GPT<double, double>* models[2] = {&kept, &recomputed};
    for (int i = 0; i < 2; i++) {
        gpt_zero_grad(models[i]);
        forward_backward(models[i], inputs, targets, B, T, 0.01f);
    }
    CHECK(memcmp(kept.grads, recomputed.grads, kept.num_parameters * sizeof(double)) == 0,
          "recomputed FFN activations change the gradients");
    CHECK(kept.ce == recomputed.ce && kept.l1_term == recomputed.l1_term, "recomputation changes the statistics");
    gpt_free(&kept);
    gpt_free(&recomputed);
}

// the logits in slices (3 rows, and 4: uneven last slices of 1 and 2 of the 10) give the unsliced losses bit for
// bit, and its gradients: bit for bit but for the head's, whose sums over the rows run in another order
static void test_logit_slices(int untied_head) {
    GPTConfig c = tiny_config(ACT_RELU, untied_head);
    int B = 2, T = 5, M = B * T;
    int inputs[10], targets[10];
    uint64_t rng = 9;
    random_tokens(inputs, targets, M, c.vocab_size, &rng);
    GPT<double, double> models[3];
    const int rows[3] = {0, 3, 4};
    for (int i = 0; i < 3; i++) {
        gpt_build(&models[i], &c, DEVICE_CPU);
        if (rows[i] > 0) { models[i].logits_bytes = (size_t)rows[i] * c.padded_vocab_size * sizeof(double); }
        init_for_check(&models[i], 42);
        for (int micro = 0; micro < 2; micro++) { // (two micro-batches: the head's gradient sums over both)
            if (micro == 0) { gpt_zero_grad(&models[i]); }
            forward_backward(&models[i], inputs, targets, B, T, 0.01f);
        }
    }
    size_t sizes[NUM_PARAM_TENSORS];
    param_sizes(sizes, &c);
    const int head = output_head(&c);
    for (int i = 1; i < 3; i++) {
        CHECK(models[i].acts.logits_rows == rows[i], "logits in slices of %d rows (%d)", rows[i], models[i].acts.logits_rows);
        CHECK(models[i].ce == models[0].ce && models[i].l1_term == models[0].l1_term, "slices of %d rows: the loss "
              "%.17g, unsliced %.17g", rows[i], models[i].ce, models[0].ce);
        int same = 1;
        double head_err = 0;
        for (int p = 0; p < NUM_PARAM_TENSORS; p++) {
            if (p == head || (p == P_WTE && !untied_head)) {
                for (size_t j = 0; j < sizes[p]; j++) {
                    head_err = fmax(head_err, fabs(models[i].grad[p][j] - models[0].grad[p][j]) /
                                                  fmax(fabs(models[0].grad[p][j]), 1e-7));
                }
            } else {
                same &= memcmp(models[i].grad[p], models[0].grad[p], sizes[p] * sizeof(double)) == 0;
            }
        }
        CHECK(same && head_err < 1e-13, "slices of %d rows, %s head: the gradients but the head's the same bits (%d), "
              "the head's within %g", rows[i], untied_head ? "untied" : "tied", same, head_err);
    }
    for (GPT<double, double>& m : models) { gpt_free(&m); }
}

// the norms' outputs the backward recomputes (rmsnorm_apply from the forward's rstd) are the forward's, bit for bit
template <typename T>
static void test_norm_apply(int M, int D) {
    uint64_t rng = 11;
    std::vector<T> x((size_t)M * D), w(D), out((size_t)M * D), again((size_t)M * D, (T)NAN), rstd(M);
    for (T& v : x) { v = (T)(rng_uniform(&rng) * 4 - 2); }
    for (T& v : w) { v = (T)(rng_uniform(&rng) + 0.5); }
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), M, D, 1e-5f);
    rmsnorm_apply(again.data(), x.data(), rstd.data(), w.data(), M, D);
    CHECK(memcmp(out.data(), again.data(), out.size() * sizeof(T)) == 0, "rmsnorm_apply (%zu-byte values, M %d, D %d) "
          "differs from the forward's output", sizeof(T), M, D);
}

// prompts of the given lengths prefilled as one batch, then decode steps of all
// sequences until the longest fills max_seq_len, against each sequence's
// training forward
static void test_cached_forward(int nseq, const int* lens, int activation = ACT_RELU, int untied_head = 0) {
    GPTConfig c = tiny_config(activation, untied_head);
    GPT<double, double> model;
    gpt_build(&model, &c, DEVICE_CPU);
    init_for_check(&model, 9);
    int T = c.max_seq_len, Vp = c.padded_vocab_size, total = 0, longest = 0;
    int* tokens = (int*)mallocCheck((size_t)nseq * T * sizeof(int));       // [nseq, T]
    double* ref = (double*)mallocCheck((size_t)nseq * T * Vp * sizeof(double)); // [nseq, T, Vp]
    uint64_t rng = 5;
    for (int i = 0; i < nseq * T; i++) { tokens[i] = (int)rng_below(&rng, c.vocab_size); }
    for (int i = 0; i < nseq; i++) {
        gpt_forward(&model, tokens + (size_t)i * T, (const int*)NULL, 1, T, 0.0f);
        memcpy(ref + (size_t)i * T * Vp, model.acts.logits, (size_t)T * Vp * sizeof(double));
        total += lens[i];
        longest = lens[i] > longest ? lens[i] : longest;
    }
    InferState<double> s;
    infer_state_alloc(&s, &model, nseq, total, T);
    int* prompts = (int*)mallocCheck(total * sizeof(int));
    for (int i = 0, off = 0; i < nseq; off += lens[i], i++) {
        memcpy(prompts + off, tokens + (size_t)i * T, lens[i] * sizeof(int));
    }
    int next[8], pos[8];
    double worst = 0;
    for (int step = 0; longest + step <= T; step++) {
        if (step == 0) {
            gpt_prefill(&model, &s, prompts, lens, nseq, (float*)NULL);
        } else {
            for (int i = 0; i < nseq; i++) { pos[i] = lens[i] + step - 1; next[i] = tokens[(size_t)i * T + pos[i]]; }
            gpt_decode(&model, &s, next, pos, nseq, (float*)NULL);
        }
        for (int i = 0; i < nseq; i++) { // the logits after position lens[i] + step - 1
            const double* r = ref + ((size_t)i * T + lens[i] + step - 1) * Vp;
            for (int v = 0; v < c.vocab_size; v++) {
                worst = fmax(worst, rel_err(s.logits[(size_t)i * Vp + v], r[v]));
            }
        }
    }
    CHECK(worst < 1e-10, "cached forward (%d prompts, %s, %s head) logits differ from the full forward: rel err %g", nseq,
          activation_names[activation], untied_head ? "untied" : "tied", worst);
    infer_state_free(&s, &model);
    free(prompts);
    free(ref);
    free(tokens);
    gpt_free(&model);
}

// an AdamW step with a NaN or inf in a gradient or the loss changes nothing; a finite one changes the weights
static void test_optimizer_skips_nonfinite(void) {
    GPTConfig c = tiny_config();
    GPT<float, float> model;
    gpt_build(&model, &c, DEVICE_CPU);
    init_params_random(model.params, &c, 7);
    gpt_zero_grad(&model); // allocates the gradients
    Optimizer opt;
    optimizer_init(&opt, &model, NULL);
    OptimConfig cfg = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 0, 10, 0.1f};
    size_t n = model.num_parameters;
    uint64_t rng = 11;
    for (size_t i = 0; i < n; i++) { opt.m[i] = 1e-3f * (float)rng_normal(&rng); opt.v[i] = 1e-6f; }
    float* before = (float*)mallocCheck(3 * n * sizeof(float));
    const char* cases[] = {"a NaN gradient", "an inf gradient", "a NaN loss", "an inf loss"};
    for (int k = 0; k < 5; k++) {
        for (size_t i = 0; i < n; i++) { model.grads[i] = 1e-2f * (float)rng_normal(&rng); }
        model.stats_acc[0] = 3.0;
        if (k == 0) { model.grads[n / 2] = NAN; }
        if (k == 1) { model.grads[0] = INFINITY; }
        if (k == 2) { model.stats_acc[0] = NAN; }
        if (k == 3) { model.stats_acc[0] = INFINITY; }
        memcpy(before, model.params, n * sizeof(float));
        memcpy(before + n, opt.m, n * sizeof(float));
        memcpy(before + 2 * n, opt.v, n * sizeof(float));
        optimizer_step(&opt, &model, &cfg, cfg.lr, k + 1);
        int same = memcmp(before, model.params, n * sizeof(float)) == 0 &&
                   memcmp(before + n, opt.m, n * sizeof(float)) == 0 && memcmp(before + 2 * n, opt.v, n * sizeof(float)) == 0;
        if (k < 4) { CHECK(same, "a step with %s changed the weights or moments", cases[k]); }
        else { CHECK(!same && isfinite(opt.grad_norm), "a finite step changed nothing"); }
    }
    free(before);
    optimizer_free(&opt);
    gpt_free(&model);
}

int main(void) {
    test_gemm();
    test_optimizer_skips_nonfinite();
    test_gradients(0.0, ACT_RELU, 0);
    test_gradients(0.05, ACT_RELU, 0);
    test_gradients(0.05, ACT_RELU, 1);
    test_gradients(0.0, ACT_SILU, 0);
    test_gradients(0.0, ACT_SILU, 1);
    test_gradients(0.05, ACT_SILU, 1); // (the trainer keeps lambda 0 for SiLU; the math holds either way)
    test_gradients(0.05, ACT_RELU, 0, 3); // the logits in slices of 3 rows
    test_gradients(0.05, ACT_SILU, 1, 4);
    test_recompute();
    test_logit_slices(0);
    test_logit_slices(1);
    test_norm_apply<float>(7, 48);
    test_norm_apply<double>(3, 16);
    const int one[1] = {3}, batch[3] = {3, 1, 5};
    test_cached_forward(1, one);
    test_cached_forward(3, batch);
    test_cached_forward(3, batch, ACT_SILU, 1);
    return test_summary("test_model");
}
