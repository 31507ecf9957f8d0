/*
 Tests of the multiple-choice evaluation (llmc/eval.h) and its file
 (llmc/evalset.h): the file's exact round trip and a one-line error for each
 kind of bad file; the choice of an example from its endings' losses (acc,
 acc_norm, ties); each ending's summed loss against a log-softmax computed
 here from the logits of an unpadded forward of that row alone, for every
 packing of rows into forwards (B = 1, 3, 8: examples across forwards) and a
 split over 3 processes, with contexts cut from the left to fit T; and a
 model whose answers are known by design (it predicts that the last token
 repeats), where acc and acc_norm disagree and a tie goes to the first ending.
*/
#include <initializer_list>
#include "llmc/eval.h"
#include "test/test.h"

static GPTConfig small_config(void) {
    GPTConfig c = {100, 128, 2, 32, 4, 2, 48, 24, 10000.0f, 1e-5f, ACT_RELU, 0};
    return c;
}

// a set of n random examples of K endings: contexts of 2 to 21 tokens that start with token 99, endings of 1 to
// 6, labels at random
static void random_set(EvalSet* s, int n, int K, uint64_t seed) {
    evalset_init(s, K, 100);
    for (int i = 0; i < n; i++) {
        int lists[EVALSET_MAX_ENDINGS + 1][32];
        const int* ptrs[EVALSET_MAX_ENDINGS + 1];
        size_t lens[EVALSET_MAX_ENDINGS + 1];
        for (int j = 0; j <= K; j++) {
            lens[j] = j == 0 ? 2 + rng_next(&seed) % 20 : 1 + rng_next(&seed) % 6;
            for (size_t t = 0; t < lens[j]; t++) { lists[j][t] = (int)(rng_next(&seed) % 99); }
            ptrs[j] = lists[j];
        }
        lists[0][0] = 99;
        evalset_append(s, (int)(rng_next(&seed) % K), ptrs, lens);
    }
}

// ----------------------------------------------------------------------------
// the file

static void load_path(const void* path) {
    EvalSet s;
    evalset_load(&s, (const char*)path);
}

// a bad file made from the good one: its first `bytes` bytes, then `zeros` zero bytes, then one int32 poked at
// offset (< 0: none)
static void expect_bad(const char* good, const char* name, long bytes, long zeros, long offset, int32_t value,
                       const char* want) {
    Path p = tmp_path(name);
    copy_prefix(good, p.s, bytes);
    FILE* fp = fopenCheck(p.s, "ab");
    for (long i = 0; i < zeros; i++) { fputc(0, fp); }
    fcloseCheck(fp);
    if (offset >= 0) { poke(p.s, offset, value); }
    expect_child_error(load_path, p.s, want);
}

static void append_bad_label(const void*) {
    EvalSet s;
    evalset_init(&s, 2, 10);
    int ctx[1] = {1}, a[1] = {2}, b[1] = {3};
    const int* lists[3] = {ctx, a, b};
    size_t lens[3] = {1, 1, 1};
    evalset_append(&s, 2, lists, lens);
}

static void test_file(void) {
    EvalSet s, t;
    random_set(&s, 9, 4, 1);
    Path good = tmp_path("set.bin");
    evalset_save(&s, good.s);
    evalset_load(&t, good.s);
    size_t lists = (size_t)9 * 5, tokens = s.starts[lists];
    CHECK(t.num_examples == 9 && t.num_endings == 4 && t.vocab_size == 100, "header %d %d %d", t.num_examples,
          t.num_endings, t.vocab_size);
    CHECK(memcmp(s.labels, t.labels, 9 * sizeof(int)) == 0, "labels differ");
    CHECK(memcmp(s.starts, t.starts, (lists + 1) * sizeof(size_t)) == 0, "list bounds differ");
    CHECK(memcmp(s.tokens, t.tokens, tokens * sizeof(int)) == 0, "tokens differ");
    CHECK(size_of(good.s) == (long)(1024 + 9 * (4 + 5 * 4) + 4 * tokens), "file size %ld", size_of(good.s));
    CHECK(!file_exists(tmp_path("set.bin.tmp").s), "a temporary file is left");

    // one line per kind of bad file; example 0 starts at 1024: its label, then the context's count and tokens
    long size = size_of(good.s);
    size_t n_ctx;
    evalset_list(&s, 0, 0, &n_ctx);
    long first_ending = 1024 + 8 + 4 * (long)n_ctx; // example 0's first ending: its count
    expect_bad(good.s, "short.bin", 1000, 0, -1, 0, "is 1000 bytes, shorter than the 1024-byte header of an eval file");
    expect_bad(good.s, "magic.bin", size, 0, 0, 20240520, "is not an eval file: magic 20240520, expected 20261124");
    expect_bad(good.s, "version.bin", size, 0, 4, 2, "eval file version 2, expected 1");
    expect_bad(good.s, "count.bin", size, 0, 8, 0, "0 examples, expected 1 to");
    expect_bad(good.s, "endings.bin", size, 0, 12, 1, "1 endings per example, expected 2 to 64");
    expect_bad(good.s, "vocab.bin", size, 0, 16, -5, "vocabulary size -5, expected 2 to");
    expect_bad(good.s, "many.bin", size, 0, 8, 100000, "cannot hold 100000 examples");
    expect_bad(good.s, "cut.bin", size - 6, 0, -1, 0, "ends early, in example 8 of 9");
    expect_bad(good.s, "label.bin", size, 0, 1024, 4, "example 0 has label 4, expected 0 to 3");
    expect_bad(good.s, "negative.bin", size, 0, 1024, -1, "example 0 has label -1, expected 0 to 3");
    expect_bad(good.s, "token.bin", size, 0, 1024 + 8, 100, "example 0 has token 100, expected 0 to 99");
    expect_bad(good.s, "empty.bin", size, 0, first_ending, 0, "example 0 has an empty ending");
    expect_bad(good.s, "huge.bin", size, 0, 1024 + 4, 2000000000, "ends early, in example 0 of 9");
    expect_bad(good.s, "trailing.bin", size, 8, -1, 0, "has 8 bytes after its 9 examples");
    expect_child_error(append_bad_label, NULL, "example 0: label 2, expected 0 to 1");
    evalset_free(&s);
    evalset_free(&t);
}

// ----------------------------------------------------------------------------
// the choice of an example

static void test_choose(void) {
    int choice, norm;
    double nll1[4] = {4.0, 3.0, 6.0, 3.0};
    size_t len1[4] = {1, 3, 3, 1};
    eval_choose(nll1, len1, 4, &choice, &norm);
    CHECK(choice == 1 && norm == 1, "lowest sum 3 at 1 and 3 (the first wins), lowest mean 1 at 1: got %d %d", choice,
          norm);
    double nll2[2] = {2.0, 3.0};
    size_t len2[2] = {1, 6};
    eval_choose(nll2, len2, 2, &choice, &norm);
    CHECK(choice == 0 && norm == 1, "sum favours the short ending, the mean the long one: got %d %d", choice, norm);
    double nll3[3] = {5.0, 5.0, 5.0};
    size_t len3[3] = {2, 2, 2};
    eval_choose(nll3, len3, 3, &choice, &norm);
    CHECK(choice == 0 && norm == 0, "all tied: the first, got %d %d", choice, norm);
}

// ----------------------------------------------------------------------------
// each ending's loss against the model's logits, however the rows are packed

// - sum log p(ending | kept context) from the logits of a forward of the row alone (B 1, no padding), in double
static double reference_nll(const GPTConfig* c, const float* params, const int* ctx, size_t kept, const int* end,
                            size_t n_end) {
    int n = (int)(kept + n_end), V = c->vocab_size, Vp = c->padded_vocab_size;
    int* row = (int*)mallocCheck(n * sizeof(int));
    memcpy(row, ctx, kept * sizeof(int));
    memcpy(row + kept, end, n_end * sizeof(int));
    GPT<float, float> m;
    gpt_build(&m, c, DEVICE_CPU);
    gpt_load_params(&m, params);
    gpt_forward(&m, row, (const int*)NULL, 1, n - 1, 0.0f);
    double nll = 0;
    for (size_t p = kept - 1; p + 1 < (size_t)n; p++) {
        const float* logits = m.acts.logits + p * Vp;
        double max = logits[0], sum = 0;
        for (int v = 1; v < V; v++) { max = logits[v] > max ? logits[v] : max; }
        for (int v = 0; v < V; v++) { sum += exp(logits[v] - max); }
        nll += max + log(sum) - logits[row[p + 1]];
    }
    gpt_free(&m);
    free(row);
    return nll;
}

static EvalCounts score(GPT<float, float>* m, const EvalSet* s, int examples, int rank, int P, int B, int T,
                        double* nll) {
    EvalRun run = {examples, rank, P, B, T, NULL, NULL, NULL};
    return eval_score(m, s, &run, nll);
}

static void test_losses(void) {
    GPTConfig c = small_config();
    int N = 11, K = 4, T = 16;
    EvalSet s;
    random_set(&s, N, K, 5);
    float* params = (float*)mallocCheck(num_parameters(&c) * sizeof(float));
    init_params_random(params, &c, 3);
    double ref[11 * 4], nll[11 * 4];
    int truncated = 0, correct = 0, correct_norm = 0;
    for (int i = 0; i < N; i++) {
        size_t n_ctx, longest = 0, len[4];
        const int* ctx = evalset_list(&s, i, 0, &n_ctx);
        for (int k = 0; k < K; k++) {
            evalset_list(&s, i, 1 + k, &len[k]);
            longest = len[k] > longest ? len[k] : longest;
        }
        // a row of context + ending holds at most T + 1 tokens
        size_t kept = n_ctx + longest <= (size_t)T + 1 ? n_ctx : T + 1 - longest;
        CHECK(eval_context_kept(&s, i, T) == kept, "example %d keeps %zu of %zu context tokens, expected %zu", i,
              eval_context_kept(&s, i, T), n_ctx, kept);
        truncated += kept < n_ctx;
        for (int k = 0; k < K; k++) {
            size_t n_end;
            const int* end = evalset_list(&s, i, 1 + k, &n_end);
            ref[i * K + k] = reference_nll(&c, params, ctx + n_ctx - kept, kept, end, n_end);
        }
        int best = 0, best_norm = 0;
        for (int k = 1; k < K; k++) {
            if (ref[i * K + k] < ref[i * K + best]) { best = k; }
            if (ref[i * K + k] / len[k] < ref[i * K + best_norm] / len[best_norm]) { best_norm = k; }
        }
        correct += best == s.labels[i];
        correct_norm += best_norm == s.labels[i];
    }
    CHECK(truncated > 0 && truncated < N, "the set has both cut and whole contexts (%d of %d cut)", truncated, N);

    int batches[3] = {1, 3, 8};
    for (int bi = 0; bi < 3; bi++) {
        int B = batches[bi];
        GPT<float, float> m;
        gpt_build(&m, &c, DEVICE_CPU);
        gpt_load_params(&m, params);
        EvalCounts got = score(&m, &s, N, 0, 1, B, T, nll);
        double worst = 0;
        for (int r = 0; r < N * K; r++) { worst = fmax(worst, fabs(nll[r] - ref[r]) / fmax(1.0, fabs(ref[r]))); }
        CHECK(worst < 1e-5, "B %d: summed losses differ from the logits' log-softmax by %g (relative)", B, worst);
        CHECK(got.examples == N && got.truncated == truncated, "B %d: %d examples, %d cut (expected %d, %d)", B,
              got.examples, got.truncated, N, truncated);
        CHECK(got.correct == correct && got.correct_norm == correct_norm, "B %d: %d / %d right, expected %d / %d", B,
              got.correct, got.correct_norm, correct, correct_norm);
        gpt_free(&m);
    }

    // 3 processes: example i on rank i % 3, the first 10 examples only; the counts add up
    EvalCounts sum = {0, 0, 0, 0}, one;
    GPT<float, float> m;
    gpt_build(&m, &c, DEVICE_CPU);
    gpt_load_params(&m, params);
    one = score(&m, &s, 10, 0, 1, 4, T, nll);
    for (int rank = 0; rank < 3; rank++) {
        double part[4 * 4];
        EvalCounts got = score(&m, &s, 10, rank, 3, 4, T, part);
        int share = (10 - rank + 2) / 3;
        CHECK(got.examples == share, "rank %d scored %d examples, expected %d", rank, got.examples, share);
        double worst = 0;
        for (int j = 0; j < share; j++) {
            for (int k = 0; k < K; k++) { worst = fmax(worst, fabs(part[j * K + k] - nll[(rank + 3 * j) * K + k])); }
        }
        CHECK(worst < 1e-4, "rank %d: its examples' losses differ from one process's by %g", rank, worst);
        sum.examples += got.examples, sum.correct += got.correct, sum.correct_norm += got.correct_norm;
        sum.truncated += got.truncated;
    }
    CHECK(sum.examples == 10 && sum.correct == one.correct && sum.correct_norm == one.correct_norm &&
          sum.truncated == one.truncated, "3 processes' counts %d %d %d %d, one process's %d %d %d %d", sum.examples,
          sum.correct, sum.correct_norm, sum.truncated, one.examples, one.correct, one.correct_norm, one.truncated);

    // a stop before the first forward scores nothing
    volatile sig_atomic_t stop = 1;
    EvalRun run = {N, 0, 1, 4, T, &stop, NULL, NULL};
    EvalCounts none = eval_score(&m, &s, &run, (double*)NULL);
    CHECK(none.examples == 0 && none.correct == 0, "stopped: %d examples scored", none.examples);
    gpt_free(&m);
    free(params);
    evalset_free(&s);
}

// ----------------------------------------------------------------------------
// a model that predicts that the last token repeats: every weight 0 but the embedding, whose rows 1..8 are
// one-hot, so that after token t the logits are a = 1 / sqrt(1/D + eps) at t and 0 elsewhere. A repeat costs
// e = log(1 + (V - 1) e^-a), any other token L = log(e^a + V - 1).

static void add(EvalSet* s, int label, std::initializer_list<std::initializer_list<int>> lists) {
    int store[8][32];
    const int* ptrs[8];
    size_t lens[8];
    int j = 0;
    for (auto& l : lists) {
        lens[j] = 0;
        for (int t : l) { store[j][lens[j]++] = t; }
        ptrs[j] = store[j];
        j++;
    }
    evalset_append(s, label, ptrs, lens);
}

static void test_known(void) {
    GPTConfig c = small_config();
    float* params = (float*)callocCheck(num_parameters(&c), sizeof(float));
    size_t offsets[NUM_PARAM_TENSORS], sizes[NUM_PARAM_TENSORS];
    param_offsets(offsets, &c);
    param_sizes(sizes, &c);
    for (int t = 1; t <= 8; t++) { params[offsets[P_WTE] + (size_t)t * c.channels + t] = 1.0f; }
    for (int i : {P_ATTN_NORM, P_FFN_NORM, P_FINAL_NORM}) {
        for (size_t j = 0; j < sizes[i]; j++) { params[offsets[i] + j] = 1.0f; }
    }
    double a = 1 / sqrt(1.0 / c.channels + c.norm_eps), V = c.vocab_size;
    double e = log(1 + (V - 1) * exp(-a)), L = log(exp(a) + V - 1);

    EvalSet s;
    evalset_init(&s, 4, c.vocab_size);
    // 0: the repeats are right, by sum and by mean
    add(&s, 0, {{99, 5, 1}, {1, 1, 1}, {2, 3, 4}, {3}, {4, 2}});
    // 1: the sum prefers one costly token and a repeat (L + e) to six repeats and one costly token (6e + L), the
    // mean the other way round: acc wrong, acc_norm right
    add(&s, 0, {{99, 1}, {1, 1, 1, 1, 1, 1, 8}, {8, 8}, {2, 3, 4, 5}, {3, 4}});
    // 2: two repeats and one have the same mean (a tie: the first), one alone the lowest sum; the label is neither
    add(&s, 3, {{99, 3}, {3, 3}, {3}, {4, 4, 4}, {5}});
    // 3: a context longer than the row: cut from the left (the model reads only its last token); both right
    add(&s, 1, {{99, 2, 3, 4, 5, 6, 7, 8, 2, 3, 4, 5, 6, 7, 8, 2, 3, 4, 5, 6, 7}, {1}, {7, 7}, {8}, {2}});
    double want[4][4] = {{3 * e, 3 * L, L, 2 * L}, {6 * e + L, L + e, 4 * L, 2 * L}, {2 * e, e, L + 2 * e, L},
                         {L, 2 * e, L, L}};
    GPT<float, float> m;
    gpt_build(&m, &c, DEVICE_CPU);
    gpt_load_params(&m, params);
    double nll[16];
    EvalCounts got = score(&m, &s, 4, 0, 1, 6, 12, nll);
    double worst = 0;
    for (int r = 0; r < 16; r++) { worst = fmax(worst, fabs(nll[r] - want[r / 4][r % 4])); }
    CHECK(worst < 1e-4, "losses differ from the closed form (e %.4f, L %.4f) by %g", e, L, worst);
    CHECK(got.examples == 4 && got.truncated == 1, "%d examples, %d cut (expected 4, 1)", got.examples, got.truncated);
    CHECK(got.correct == 2, "acc: examples 0 and 3 right, got %d", got.correct);
    CHECK(got.correct_norm == 3, "acc_norm: examples 0, 1 and 3 right, got %d", got.correct_norm);
    char line[256];
    eval_describe(line, sizeof(line), &got, "set.bin");
    CHECK(strcmp(line, "acc_norm 0.7500 (acc 0.5000, 4 examples of set.bin, 1 context cut to fit)") == 0, "%s",
          line);
    gpt_free(&m);
    free(params);
    evalset_free(&s);
}

// ----------------------------------------------------------------------------
// the checks before scoring

typedef struct { const EvalSet* s; int vocab, T; } CheckArgs;

static void run_check(const void* arg) {
    const CheckArgs* a = (const CheckArgs*)arg;
    eval_check(a->s, "set.bin", a->s->num_examples, a->vocab, a->T);
}

static void test_check(void) {
    EvalSet s;
    evalset_init(&s, 2, 100);
    add(&s, 0, {{99, 1}, {1, 2, 3, 4, 5}, {1}});
    CheckArgs fits = {&s, 100, 5}, vocab = {&s, 90, 5}, longer = {&s, 100, 4};
    char err[256];
    CHECK(run_child(run_check, &fits, err, sizeof(err)) == 0, "an ending of T tokens fits: %s", err);
    expect_child_error(run_check, &vocab, "set.bin was tokenized for a vocabulary of 100 tokens, the model has 90");
    expect_child_error(run_check, &longer, "example 0's ending 0 is 5 tokens, more than the 4 positions of a row");
    evalset_free(&s);
}

int main(void) {
    make_tmp_dir("test_eval");
    test_file();
    test_choose();
    test_check(); // (its children fork before any OpenMP thread exists, which LeakSanitizer's exit would trip on)
    test_losses();
    test_known();
    remove_tmp_dir();
    return test_summary("test_eval");
}
