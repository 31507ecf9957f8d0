/*
 Checks of the sparse FFN CPU reference (llmc/ffn/ell.h) against the dense
 CPU FFN of llmc/cpu_ops.h, in double (so to ~1e-12):
 - the pattern: true counts, entries in increasing unit order with g, rows
   past W in the tail in row order, ELL rows in place;
 - forward y and l1, backward du and dg at the entries, df and the three weight
   gradients, for rows of every density from empty to full (rows at W, W + 1
   and H included);
 - the transposed pattern: every entry once, tokens increasing per unit;
 - a tail too small: tail_used counts every row that needed a slot, the rows
   past the capacity are lost and their y, l1, df are NaN, every other row
   and nothing else is exact;
 - the whole model (llmc/gpt.h) with --ffn sparse against --ffn dense on the
   same weights and batch: the loss, the statistics and every gradient, with
   the first forward's tail too small (so it is grown and the forward redone),
   then with most units hot (the shared backward scratch shrinks with what the
   layers ask for); and --ffn auto with a layer turned sparse, split (its hot
   part in the gate's scratch, the dense layers' d_h) and dense again (its
   buffers follow);
 - dead-neuron re-initialisation: only the rows of units that did not fire
   move, by 0.9 W + 0.1 N(0, 0.02^2), the same for the same seed.
*/
#include <algorithm>
#include <vector>
#include "llmc/cpu_ops.h"
#include "llmc/gpt.h"
#include "llmc/rng.h"
#include "llmc/ffn/ell.h"
#include "test/test.h"

typedef double real;
static uint64_t rng = 7;

static std::vector<real> normal(size_t n, double scale) {
    std::vector<real> v(n);
    for (size_t i = 0; i < n; i++) { v[i] = scale * rng_normal(&rng); }
    return v;
}

// max |a - b| over max |b|; NaN in a is infinite
static double rel_err(const real* a, const real* b, size_t n) {
    double diff = 0, scale = 1e-30;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i])) { return INFINITY; }
        diff = fmax(diff, fabs(a[i] - b[i]));
        scale = fmax(scale, fabs(b[i]));
    }
    return diff / scale;
}

// g [M, H] whose row m has a chosen number of positives: empty, 1, W, W + 1, H / 2, H, random
static std::vector<real> gate_with_counts(int M, int H, int W, std::vector<int>* counts) {
    std::vector<real> g((size_t)M * H);
    counts->assign(M, 0);
    for (int m = 0; m < M; m++) {
        int kinds[] = {0, 1, W, W + 1, H / 2, H};
        int c = m % 8 < 6 ? kinds[m % 8] : (int)rng_below(&rng, (uint64_t)W + 1);
        if (c > H) { c = H; }
        (*counts)[m] = c;
        std::vector<int> order(H);
        for (int n = 0; n < H; n++) { order[n] = n; }
        for (int n = H - 1; n > 0; n--) { int j = (int)rng_below(&rng, (uint64_t)n + 1); std::swap(order[n], order[j]); }
        for (int n = 0; n < H; n++) {
            double mag = 0.1 + rng_uniform(&rng);
            g[(size_t)m * H + order[n]] = n < c ? mag : -mag;
        }
    }
    return g;
}

static void test_ffn(int M, int H, int D, int W, int tail_capacity) {
    std::vector<int> counts;
    std::vector<real> g = gate_with_counts(M, H, W, &counts);
    std::vector<real> f = normal((size_t)M * D, 1), wu = normal((size_t)H * D, 0.2), wg = normal((size_t)H * D, 0.2);
    std::vector<real> wdT = normal((size_t)H * D, 0.2), dy = normal((size_t)M * D, 1);
    const float l1_scale = 0.01f;
    int needed = 0;
    for (int m = 0; m < M; m++) { needed += counts[m] > W; }

    // dense reference
    size_t MH = (size_t)M * H, MD = (size_t)M * D, HD = (size_t)H * D;
    std::vector<real> u(MH), h(MH), l1(M), y(MD), dh(MH), du(MH), dg(MH), df(MD);
    std::vector<real> dwu(HD, 0.5), dwg(HD, -0.5), dwdT(HD, 0.25);
    std::vector<int> active(M);
    std::vector<uint8_t> fired(H, 0);
    gemm(u.data(), f.data(), wu.data(), M, H, D, 0, 1, 0);
    relu_gate_forward(h.data(), l1.data(), active.data(), fired.data(), g.data(), u.data(), M, H);
    gemm(y.data(), h.data(), wdT.data(), M, D, H, 0, 0, 0);
    gemm(dh.data(), dy.data(), wdT.data(), M, H, D, 0, 1, 0);
    gemm(dwdT.data(), h.data(), dy.data(), H, D, M, 1, 0, 1);
    relu_gate_backward(dg.data(), du.data(), dh.data(), g.data(), u.data(), h.data(), l1_scale, M, H);
    gemm(df.data(), du.data(), wu.data(), M, D, H, 0, 0, 0);
    gemm(df.data(), dg.data(), wg.data(), M, D, H, 0, 0, 1);
    gemm(dwu.data(), du.data(), f.data(), H, D, M, 1, 0, 1);
    gemm(dwg.data(), dg.data(), f.data(), H, D, M, 1, 0, 1);

    // sparse
    SparsePattern<real> p;
    int tail_used = -1;
    sparse_pattern_alloc(&p, M, H, W, tail_capacity, &tail_used, DEVICE_CPU);
    size_t entries = sparse_entries(M, H, W, tail_capacity);
    SparseTransposed t;
    sparse_transposed_alloc(&t, H, D, entries, DEVICE_CPU);
    std::vector<real> s_l1(M), s_y(MD), s_du(entries + 1), s_dg(entries + 1), s_df(MD);
    std::vector<real> s_dwu(HD, 0.5), s_dwg(HD, -0.5), s_dwdT(HD, 0.25);
    std::vector<int> s_active(M);
    std::vector<uint8_t> s_fired(H, 0);
    sparse_pack(&p, s_active.data(), s_fired.data(), g.data(), (SparseScratch*)NULL);
    sparse_up(&p, s_l1.data(), f.data(), wu.data(), D);
    sparse_down(s_y.data(), &p, wdT.data(), D);
    sparse_transpose(&t, &p, (SparseScratch*)NULL);
    sparse_dh_weight_grads(s_du.data(), s_dg.data(), s_dwu.data(), s_dwg.data(), s_dwdT.data(), &p, &t, f.data(),
                           dy.data(), wdT.data(), l1_scale, D);
    sparse_df(s_df.data(), &p, s_du.data(), s_dg.data(), wu.data(), wg.data(), D);

    // the pattern
    CHECK(*p.tail_used == needed, "tail_used %d, %d rows exceed W", *p.tail_used, needed);
    int pattern_ok = 1, slots_ok = 1, lost = 0;
    for (int m = 0, next_slot = 0; m < M; m++) {
        pattern_ok &= p.count[m] == counts[m] && s_active[m] == counts[m];
        int expect = counts[m] <= W ? -1 : (next_slot < tail_capacity ? next_slot : SPARSE_ROW_LOST);
        if (counts[m] > W) { next_slot++; }
        slots_ok &= p.tail_slot[m] == expect;
        if (expect == SPARSE_ROW_LOST) { lost++; continue; }
        size_t e = sparse_row_base(M, H, W, m, expect);
        for (int n = 0, j = 0; n < H; n++) {
            if (g[(size_t)m * H + n] > 0) {
                pattern_ok &= p.unit[e + j] == n && p.g[e + j] == g[(size_t)m * H + n];
                j++;
            }
        }
    }
    CHECK(pattern_ok, "counts and entries in unit order");
    CHECK(slots_ok, "tail slots in row order, lost past the capacity");
    CHECK(lost == (needed > tail_capacity ? needed - tail_capacity : 0), "lost rows %d", lost);

    // the transposed pattern: each stored entry once, tokens increasing per unit
    int stored = 0;
    for (int m = 0; m < M; m++) { stored += p.tail_slot[m] == SPARSE_ROW_LOST ? 0 : counts[m]; }
    int tr_ok = t.unit_start[0] == 0 && t.unit_start[H] == stored;
    std::vector<int> seen(entries + 1, 0);
    for (int n = 0; n < H; n++) {
        for (int i = t.unit_start[n]; i < t.unit_start[n + 1]; i++) {
            tr_ok &= p.unit[t.entry[i]] == n && seen[t.entry[i]]++ == 0;
            tr_ok &= i == t.unit_start[n] || t.token[i] > t.token[i - 1];
            int m = t.token[i];
            size_t base = sparse_row_base(M, H, W, m, p.tail_slot[m]);
            tr_ok &= (size_t)t.entry[i] >= base && (size_t)t.entry[i] < base + counts[m];
        }
    }
    CHECK(tr_ok, "transposed pattern");

    // du and dg at every stored entry (dh taken unit by unit) equal the dense path's
    double dudg_err = 0, dudg_scale = 1e-30;
    for (int m = 0; m < M; m++) {
        if (p.tail_slot[m] == SPARSE_ROW_LOST) { continue; }
        size_t e = sparse_row_base(M, H, W, m, p.tail_slot[m]);
        for (int j = 0; j < counts[m]; j++, e++) {
            size_t mn = (size_t)m * H + p.unit[e];
            dudg_err = fmax(dudg_err, fmax(fabs(s_du[e] - du[mn]), fabs(s_dg[e] - dg[mn])));
            dudg_scale = fmax(dudg_scale, fmax(fabs(du[mn]), fabs(dg[mn])));
        }
    }
    CHECK(dudg_err / dudg_scale < 1e-12, "du, dg at the entries: %g", dudg_err / dudg_scale);

    if (lost == 0) {
        CHECK(rel_err(s_l1.data(), l1.data(), M) < 1e-12, "l1 %g", rel_err(s_l1.data(), l1.data(), M));
        CHECK(rel_err(s_y.data(), y.data(), MD) < 1e-12, "y %g", rel_err(s_y.data(), y.data(), MD));
        CHECK(rel_err(s_df.data(), df.data(), MD) < 1e-12, "df %g", rel_err(s_df.data(), df.data(), MD));
        CHECK(rel_err(s_dwu.data(), dwu.data(), HD) < 1e-12, "dWu %g", rel_err(s_dwu.data(), dwu.data(), HD));
        CHECK(rel_err(s_dwg.data(), dwg.data(), HD) < 1e-12, "dWg %g", rel_err(s_dwg.data(), dwg.data(), HD));
        CHECK(rel_err(s_dwdT.data(), dwdT.data(), HD) < 1e-12, "dWdT %g", rel_err(s_dwdT.data(), dwdT.data(), HD));
        CHECK(fired == s_fired, "fired marks");
    } else {
        // lost rows are NaN; every other row is exact
        int nan_ok = 1;
        double worst = 0;
        for (int m = 0; m < M; m++) {
            int is_lost = p.tail_slot[m] == SPARSE_ROW_LOST;
            nan_ok &= isnan(s_l1[m]) == is_lost && isnan(s_y[(size_t)m * D]) == is_lost && isnan(s_df[(size_t)m * D]) == is_lost;
            if (!is_lost) {
                worst = fmax(worst, rel_err(&s_y[(size_t)m * D], &y[(size_t)m * D], D));
                worst = fmax(worst, fabs(s_l1[m] - l1[m]) / fmax(fabs(l1[m]), 1e-30));
            }
        }
        CHECK(nan_ok, "lost rows are NaN, and only they");
        CHECK(worst < 1e-12, "rows kept are exact: %g", worst);
    }
    sparse_pattern_free(&p, DEVICE_CPU);
    sparse_transposed_free(&t, DEVICE_CPU);
}

static void test_model(void) {
    GPTConfig c = {37, 128, 3, 16, 2, 1, 64, 8, 10000.0f, 1e-5f, ACT_RELU, 0};
    int B = 2, T = 8, M = B * T;
    std::vector<int> inputs(M), targets(M);
    for (int i = 0; i < M; i++) { inputs[i] = (int)rng_below(&rng, 37); targets[i] = (int)rng_below(&rng, 37); }
    GPT<real, real> dense, sparse;
    gpt_build(&dense, &c, DEVICE_CPU);
    gpt_build(&sparse, &c, DEVICE_CPU);
    sparse.ffn.mode = FFN_SPARSE;
    std::vector<real> w = normal(dense.num_parameters, 0.3);
    memcpy(dense.params, w.data(), w.size() * sizeof(real));
    memcpy(sparse.params, w.data(), w.size() * sizeof(real));
    // a narrow ELL part and a tail of 2 rows: about half of the 64 units fire, so most rows overflow it
    gpt_alloc_activations(&sparse, B, T);
    for (int l = 0; l < c.num_layers; l++) { sparse.ffn.layer[l].W = 8, sparse.ffn.layer[l].tail_capacity = 2; }
    GPT<real, real>* models[2] = {&dense, &sparse};
    for (GPT<real, real>* m : models) {
        gpt_zero_grad(m);
        gpt_stats_reset(m);
        gpt_forward(m, inputs.data(), targets.data(), B, T, 1.0f / M);
        gpt_backward(m, inputs.data(), 0.01f);
        gpt_stats_read(m, M);
    }
    CHECK(sparse.ffn.redone == 1, "the forward was redone once after the tail overflow (%d)", sparse.ffn.redone);
    CHECK(fabs(sparse.ce - dense.ce) < 1e-12 && fabs(sparse.l1_term - dense.l1_term) < 1e-12, "ce %.15g vs %.15g",
          sparse.ce, dense.ce);
    int stats_same = 1;
    for (int l = 0; l < c.num_layers; l++) {
        stats_same &= sparse.stats[l].l0_mean == dense.stats[l].l0_mean && sparse.stats[l].l0_max == dense.stats[l].l0_max &&
                      sparse.stats[l].dead == dense.stats[l].dead;
    }
    CHECK(stats_same, "sparsity statistics");
    size_t sizes[NUM_PARAM_TENSORS];
    param_sizes(sizes, &c);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        double e = rel_err(sparse.grad[i], dense.grad[i], sizes[i]);
        CHECK(e < 1e-10, "gradient of tensor %d: rel err %g", i, e);
    }
    // the shared backward scratch follows the sparse layers' sizes down as well as up: with all but 8 units hot
    // (the hot part in a buffer of its own: 4 x 56 > 64) the layers ask for under half the first step's entries
    size_t first = sparse.ffn.sparse_scratch_entries, asked = 0;
    for (int l = 0; l < c.num_layers; l++) { sparse.ffn.layer[l].hot_units = c.hidden - 8; }
    gpt_zero_grad(&sparse);
    gpt_forward(&sparse, inputs.data(), targets.data(), B, T, 1.0f / M);
    gpt_backward(&sparse, inputs.data(), 0.01f);
    for (int l = 0; l < c.num_layers; l++) {
        const SparsePattern<real>* p = &sparse.ffn.layer[l].p;
        asked = std::max(asked, sparse_entries(M, p->H, p->W, p->tail_capacity));
    }
    CHECK(first > 2 * asked && sparse.ffn.sparse_scratch_entries == asked,
          "the backward scratch shrank: %zu -> %zu (%zu asked)", first, sparse.ffn.sparse_scratch_entries, asked);
    CHECK(sparse.ffn.hot_scratch != NULL && sparse.ffn.hot_scratch_units == c.hidden - 8, "the hot part's own scratch");
    double worst_hot = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        worst_hot = fmax(worst_hot, rel_err(sparse.grad[i], dense.grad[i], sizes[i]));
    }
    CHECK(worst_hot < 1e-10, "mostly hot: the dense gradients (rel err %g)", worst_hot);

    // auto: dense until its path is chosen (llmc/ffn/hot.h, tested in test_ffn_split); turned sparse, then
    // dense again, a layer holds and gives back the buffers of its path
    GPT<real, real> autom;
    gpt_build(&autom, &c, DEVICE_CPU);
    autom.ffn.mode = FFN_AUTO;
    memcpy(autom.params, w.data(), w.size() * sizeof(real));
    gpt_stats_reset(&autom);
    gpt_forward(&autom, inputs.data(), targets.data(), B, T, 0.0f);
    CHECK(!autom.ffn.layer[0].on, "auto starts dense");
    gpt_stats_read(&autom, M);
    CHECK(!autom.ffn.layer[0].on, "statistics alone keep a layer dense");
    CHECK(autom.ffn.g == autom.ffn.d_h, "auto: the sparse gate's scratch is the dense backward's d_h");
    std::vector<int> order(c.hidden);
    for (int n = 0; n < c.hidden; n++) { order[n] = n; }
    ffn_set_path(&autom.ffn, 0, 0, order.data(), 0, 0.004 * c.hidden);
    CHECK(autom.ffn.layer[0].on && autom.ffn.layer[0].changed == 0, "a layer turned sparse");
    // layer 0 sparse, the others dense (the one's gate scratch is the others' d_h): the dense model's numbers
    gpt_zero_grad(&autom);
    gpt_forward(&autom, inputs.data(), targets.data(), B, T, 1.0f / M);
    gpt_backward(&autom, inputs.data(), 0.01f);
    double worst = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) { worst = fmax(worst, rel_err(autom.grad[i], dense.grad[i], sizes[i])); }
    CHECK(worst < 1e-10, "auto, one layer sparse: the dense gradients (rel err %g)", worst);
    CHECK(autom.ffn.layer[0].p.M > 0 && autom.ffn.sparse_scratch_entries > 0, "a sparse layer holds its pattern and the scratch");
    // the split with H / 4 hot units: its hot part runs in the gate's scratch, which under auto is the dense
    // layers' d_h (each layer's use of it ends with its forward or backward)
    ffn_set_path(&autom.ffn, 0, c.hidden / 4, order.data(), 10, 0.004 * c.hidden);
    gpt_zero_grad(&autom);
    gpt_forward(&autom, inputs.data(), targets.data(), B, T, 1.0f / M);
    gpt_backward(&autom, inputs.data(), 0.01f);
    worst = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) { worst = fmax(worst, rel_err(autom.grad[i], dense.grad[i], sizes[i])); }
    CHECK(autom.ffn.layer[0].on && autom.ffn.layer[0].hot_units == c.hidden / 4 && autom.ffn.hot_scratch == NULL &&
          worst < 1e-10, "auto, one layer split, its hot part in d_h: the dense gradients (rel err %g)", worst);
    ffn_set_path(&autom.ffn, 0, c.hidden, order.data(), 20, 0.0);
    CHECK(!autom.ffn.layer[0].on && autom.ffn.layer[0].dense == NULL, "the layer turned dense again");
    CHECK(autom.ffn.layer[0].p.M == 0 && autom.ffn.layer[0].p.g == NULL,
          "a layer turned dense gives its pattern back");
    CHECK(autom.ffn.sparse_scratch_entries == 0 && autom.ffn.transposed.token == NULL && autom.ffn.sparse_du == NULL,
          "every layer dense: the shared sparse scratch is given back");
    gpt_stats_reset(&autom);
    gpt_forward(&autom, inputs.data(), targets.data(), B, T, 1.0f / M);
    CHECK(autom.ffn.layer[0].dense != NULL, "a dense layer's forward takes its g, u, h again");
    gpt_free(&autom);
    gpt_free(&dense);
    gpt_free(&sparse);
}

// the noise that re-initialisation added to the rows that moved: its sd, and whether others stayed
static void check_reinit(const std::vector<float>& before, const std::vector<float>& after, const uint8_t* fired,
                         int rows, int D, const char* what) {
    int fired_same = 1;
    double sum = 0, sq = 0;
    long n = 0;
    for (int j = 0; j < rows; j++) {
        for (int i = 0; i < D; i++) {
            size_t idx = (size_t)j * D + i;
            if (fired[j]) { fired_same &= after[idx] == before[idx]; continue; }
            double noise = after[idx] - 0.9 * before[idx];
            sum += noise, sq += noise * noise, n++;
        }
    }
    double mean = sum / n, sd = sqrt(sq / n - mean * mean);
    CHECK(fired_same, "%s: rows that fired are unchanged", what);
    CHECK(fabs(mean) < 2e-4 && fabs(sd - 0.002) < 2e-4, "%s: noise mean %g sd %g (0.1 * 0.02 = 0.002)", what, mean, sd);
}

static void test_dead_reinit(void) {
    const int rows = 64, D = 256;
    std::vector<uint8_t> fired(rows);
    for (int j = 0; j < rows; j++) { fired[j] = j % 3 == 0; }
    std::vector<float> w(rows * D);
    for (float& x : w) { x = (float)(0.02 * rng_normal(&rng)); }
    std::vector<float> a = w, b = w;
    gate_dead_reinit(a.data(), (float*)NULL, fired.data(), rows, D, 5);
    gate_dead_reinit(b.data(), (float*)NULL, fired.data(), rows, D, 5);
    CHECK(a == b, "same seed, same result");
    check_reinit(w, a, fired.data(), rows, D, "gate_dead_reinit");

    // through the model: the fired marks of the step say which rows
    GPTConfig c = {37, 128, 2, 16, 2, 1, 64, 8, 10000.0f, 1e-5f, ACT_RELU, 0};
    GPT<float, float> model;
    gpt_build(&model, &c, DEVICE_CPU);
    std::vector<float> params(model.num_parameters);
    init_params_random(params.data(), &c, 3);
    memcpy(model.params, params.data(), params.size() * sizeof(float));
    // a zero gate row never fires (g = 0): every 4th unit is dead
    for (int n = 0; n < 2 * 64; n += 4) { memset(model.param[P_WG] + n * 16, 0, 16 * sizeof(float)); }
    std::vector<int> tokens(8);
    for (int& t : tokens) { t = (int)rng_below(&rng, 37); }
    gpt_stats_reset(&model);
    gpt_forward(&model, tokens.data(), tokens.data(), 1, 8, 0.0f);
    gpt_stats_read(&model, 8);
    int dead = 0;
    for (int n = 0; n < 2 * 64; n++) { dead += !model.fired[n]; }
    std::vector<float> wg(model.param[P_WG], model.param[P_WG] + 2 * 64 * 16);
    CHECK(gpt_dead_reinit(&model, (float*)NULL, 9) == dead && dead > 0, "%d dead units", dead);
    std::vector<float> wg_after(model.param[P_WG], model.param[P_WG] + 2 * 64 * 16);
    int moved = 0, kept = 1;
    for (int n = 0; n < 2 * 64; n++) {
        int same = memcmp(&wg[n * 16], &wg_after[n * 16], 16 * sizeof(float)) == 0;
        moved += !same;
        kept &= model.fired[n] ? same : 1;
    }
    CHECK(moved == dead && kept, "exactly the dead units' rows moved (%d of %d)", moved, dead);
    gpt_free(&model);
}

// a tail far larger than the forwards need (over 4x) is given back only after FFN_TAIL_SHRINK_AFTER forwards in a
// row (a forward that needs it starts the count again); an overflow grows it at once and asks for a redo; after a
// new ELL width, one forward that needs little gives it back, after a new hot set alone the count goes on
static void test_tail_shrink(void) {
    const int M = 256, H = 64, W = 8;
    Ffn<real> ffn = {};
    ffn.L = 1, ffn.D = 16, ffn.H = H, ffn.M = M, ffn.device = DEVICE_CPU;
    ffn.layer = (FfnLayer<real>*)callocCheck(1, sizeof(FfnLayer<real>));
    ffn.tail_used = (int*)callocCheck(2, sizeof(int)); // (the layer's rows, then the records a fused gate asked for)
    FfnLayer<real>* f = &ffn.layer[0];
    f->on = 1, f->W = W, f->tail_capacity = 200;
    sparse_pattern_alloc(&f->p, M, H, W, f->tail_capacity, ffn.tail_used, DEVICE_CPU);
    auto forwards = [&](int n, int used) {
        int redo = 0;
        for (int i = 0; i < n; i++) {
            *ffn.tail_used = used;
            redo |= ffn_overflowed(&ffn);
        }
        return redo;
    };
    int redo = forwards(FFN_TAIL_SHRINK_AFTER - 1, 10) | forwards(1, 100) | forwards(FFN_TAIL_SHRINK_AFTER - 1, 10);
    CHECK(!redo && f->tail_capacity == 200, "a tail of 200 rows kept through %d forwards needing 10 but one needing "
          "100 (%d rows)", 2 * FFN_TAIL_SHRINK_AFTER - 2, f->tail_capacity);
    redo = forwards(1, 10);
    CHECK(!redo && f->tail_capacity == 2 * sparse_choose_tail(10, M), "given back after %d in a row: %d rows",
          FFN_TAIL_SHRINK_AFTER, f->tail_capacity);
    redo = forwards(1, 230);
    CHECK(redo && f->tail_capacity == M && f->tail_oversized == 0, "an overflow of the allocated 200: a redo, the "
          "tail grown to %d rows", f->tail_capacity);
    f->hot_units = 8;
    ffn_sparse_ensure(&ffn, 0);
    redo = forwards(1, 10);
    CHECK(!redo && f->p.tail_capacity == M && f->tail_capacity == M && f->tail_oversized == 1,
          "a new hot set: the tail of %d rows kept, the count goes on (%d)", f->tail_capacity, f->tail_oversized);
    f->W = 2 * W;
    ffn_sparse_ensure(&ffn, 0);
    redo = forwards(FFN_TAIL_SHRINK_AFTER_RESHAPE, 10);
    CHECK(!redo && f->tail_capacity == 2 * sparse_choose_tail(10, M), "a new ELL width: the tail given back after "
          "%d forward(s) (%d rows)", FFN_TAIL_SHRINK_AFTER_RESHAPE, f->tail_capacity);
    ffn_scratch_free(&ffn);
    sparse_pattern_free(&f->p, DEVICE_CPU);
    free(ffn.tail_used);
    free(ffn.layer);
}

int main(void) {
    test_ffn(64, 96, 40, 8, 64);  // every row fits (the tail holds all overflow)
    test_ffn(50, 64, 24, 16, 8);  // the tail exactly or more than needed, uneven shapes
    test_ffn(64, 96, 40, 8, 3);   // tail overflow: rows lost, NaN, counted
    test_ffn(16, 32, 8, 32, 0);   // W = H: no tail needed
    test_model();
    test_dead_reinit();
    test_tail_shrink();
    return test_summary("test_sparse_ffn");
}
