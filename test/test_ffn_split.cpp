/*
 Checks of the hot/cold split of a sparse FFN layer (llmc/ffn/split.h, the choice and
 permutation in llmc/ffn/hot.h, the optimizer's hook) on the CPU reference, in
 double (so to ~1e-12) where the math is exact:
 - forward y, l1, row counts, fired marks; backward df, the three weight
   gradients and the units' firing counts, against the dense FFN, at every
   number of hot units from 0 to H (the pattern then holds the rest), with the
   hot part's scratch overwritten between the two: the backward makes the
   forward's g and u again, to the bit;
 - a permutation of the units leaves the FFN the same function;
 - the path (hot units; --ffn auto: the dense layer too): who joins and who
   leaves with the hysteresis, the rounding to FFN_HOT_ALIGN, the order (hot by
   decreasing count, cold as before), no change when nothing crosses a
   threshold; dense, all cold or the split from given costs, the same path for
   the same inputs; a layer swinging around a boundary does not flap; a layer
   whose busy units' pairs cost less than its others' is priced by its own
   measurements (ffn_prices_fit) and leaves the split it tried; a layer whose
   moves are modelled up to 15% off what they measure flaps by the margin
   alone and moves once when held to its prices' last miss; a cold part's
   constant makes a busy layer keep dense over the split with 64 cold units
   and leaves a quiet one all cold; the constant and the pair price fitted
   from two times of the sparse part (ffn_costs), within bounds on noisy ones;
   the last units alone as a cold part (FfnColdPart) equal the dense FFN over
   them; the policy, the last change and the prices (their miss too) as a
   checkpoint keeps them (older ones too, of 11 ints a layer and of 5 floats
   of costs among them);
 - the model: a layer's units permuted in the weights and in the optimizer
   state (rows of Wg, Wu, WdT and their moments) give the same loss; a short
   training with the hot set re-chosen stays within float noise of
   the dense path, with hot sets that changed.
*/
#include <algorithm>
#include <vector>
#include "llmc/gpt.h"
#include "llmc/optimizer.h"
#include "test/test.h"

typedef double real;
static uint64_t rng = 11;

static std::vector<real> normal(size_t n, double scale, double shift = 0) {
    std::vector<real> v(n);
    for (size_t i = 0; i < n; i++) { v[i] = shift + scale * rng_normal(&rng); }
    return v;
}

// max |a - b| over max |b|; NaN in a is infinite
template <typename A, typename B>
static double rel_err(const A* a, const B* b, size_t n) {
    double diff = 0, scale = 1e-30;
    for (size_t i = 0; i < n; i++) {
        if (isnan((double)a[i])) { return INFINITY; }
        diff = fmax(diff, fabs((double)a[i] - (double)b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    return diff / scale;
}

// the split FFN with `hot` hot units against the dense one on the same inputs; f's last feature carries
// a per-unit offset in Wg so that units fire at very different rates (the first ones most)
static void test_split(int M, int D, int H, int hot) {
    size_t MD = (size_t)M * D, HD = (size_t)H * D, MH = (size_t)M * H;
    std::vector<real> f = normal(MD, 1), wg = normal(HD, 1.0 / sqrt(D)), wu = normal(HD, 1.0 / sqrt(D));
    std::vector<real> wdT = normal(HD, 1.0 / sqrt(H)), dy = normal(MD, 1);
    for (int m = 0; m < M; m++) { f[(size_t)m * D + D - 1] = 1; }
    for (int n = 0; n < H; n++) { wg[(size_t)n * D + D - 1] = -2.5 * n / H; }
    const float l1_scale = 0.01f;

    // dense
    std::vector<real> g(MH), u(MH), h(MH), l1(M), y(MD), dh(MH), du(MH), df(MD);
    std::vector<real> dwg(HD, 0.5), dwu(HD, -0.5), dwdT(HD, 0.25);
    std::vector<int> active(M);
    std::vector<uint8_t> fired(H, 0);
    std::vector<uint32_t> count(H, 3);
    gemm(g.data(), f.data(), wg.data(), M, H, D, 0, 1, 0);
    gemm(u.data(), f.data(), wu.data(), M, H, D, 0, 1, 0);
    relu_gate_forward(h.data(), l1.data(), active.data(), fired.data(), g.data(), u.data(), M, H);
    gemm(y.data(), h.data(), wdT.data(), M, D, H, 0, 0, 0);
    gemm(dh.data(), dy.data(), wdT.data(), M, H, D, 0, 1, 0);
    gemm(dwdT.data(), h.data(), dy.data(), H, D, M, 1, 0, 1);
    relu_gate_backward(dh.data(), du.data(), dh.data(), g.data(), u.data(), h.data(), l1_scale, M, H);
    gemm(df.data(), du.data(), wu.data(), M, D, H, 0, 0, 0);
    gemm(df.data(), dh.data(), wg.data(), M, D, H, 0, 0, 1);
    gemm(dwu.data(), du.data(), f.data(), H, D, M, 1, 0, 1);
    gemm(dwg.data(), dh.data(), f.data(), H, D, M, 1, 0, 1);
    unit_count_add(count.data(), g.data(), M, H);

    // split: the cold pattern wide enough for every row (the tail is tested in test_sparse_ffn)
    int cold_units = H - hot;
    SparsePattern<real> p = {};
    int tail_used = 0;
    size_t entries = 0;
    SparseTransposed t = {};
    if (cold_units > 0) {
        sparse_pattern_alloc(&p, M, cold_units, cold_units, 0, &tail_used, DEVICE_CPU);
        entries = sparse_entries(M, cold_units, cold_units, 0);
        sparse_transposed_alloc(&t, cold_units, D, entries, DEVICE_CPU);
    }
    std::vector<real> hot_scratch(ffn_hot_scratch_elems(M, hot) + 1);
    std::vector<real> s_g(MH), s_l1(M, NAN), s_y(MD, NAN), s_du(entries + 1), s_dg(entries + 1), s_df(MD, NAN);
    std::vector<real> s_dwg(HD, 0.5), s_dwu(HD, -0.5), s_dwdT(HD, 0.25);
    std::vector<int> s_active(M, -1);
    std::vector<uint8_t> s_fired(H, 0);
    std::vector<uint32_t> s_count(H, 3);
    ffn_split_forward(s_y.data(), s_l1.data(), s_active.data(), s_fired.data(), &p, hot, hot_scratch.data(), s_g.data(),
                      f.data(), wg.data(), wu.data(), wdT.data(), M, D, H, (SparseScratch*)NULL);
    // the hot part's g and u of the forward; the backward makes them again in a scratch that other layers used
    // in between (NaN here), to the same bits, and leaves them there
    const size_t hot_gu = 2 * (size_t)M * hot;
    std::vector<real> fwd_gu(hot_scratch.begin(), hot_scratch.begin() + hot_gu);
    std::fill(hot_scratch.begin(), hot_scratch.end(), (real)NAN);
    ffn_split_backward(s_df.data(), s_dwg.data(), s_dwu.data(), s_dwdT.data(), s_count.data(), &p, hot, &t, s_du.data(),
                       s_dg.data(), hot_scratch.data(), dy.data(), f.data(),
                       wg.data(), wu.data(), wdT.data(), l1_scale, M, D, H, (SparseScratch*)NULL);
    char what[64];
    snprintf(what, sizeof(what), "M %d D %d H %d hot %d", M, D, H, hot);
    CHECK(rel_err(s_y.data(), y.data(), MD) < 1e-12, "%s: y %g", what, rel_err(s_y.data(), y.data(), MD));
    CHECK(rel_err(s_l1.data(), l1.data(), M) < 1e-12, "%s: l1", what);
    CHECK(s_active == active, "%s: active units per token", what);
    CHECK(s_fired == fired, "%s: fired marks", what);
    CHECK(rel_err(s_df.data(), df.data(), MD) < 1e-12, "%s: df %g", what, rel_err(s_df.data(), df.data(), MD));
    CHECK(rel_err(s_dwg.data(), dwg.data(), HD) < 1e-12 && rel_err(s_dwu.data(), dwu.data(), HD) < 1e-12 &&
          rel_err(s_dwdT.data(), dwdT.data(), HD) < 1e-12, "%s: weight gradients", what);
    CHECK(s_count == count, "%s: firing counts", what);
    CHECK(hot == 0 || memcmp(fwd_gu.data(), hot_scratch.data(), hot_gu * sizeof(real)) == 0,
          "%s: the backward's g, u are the forward's", what);
    if (cold_units > 0) {
        sparse_pattern_free(&p, DEVICE_CPU);
        sparse_transposed_free(&t, DEVICE_CPU);
    }
}

// y = FFN(f) of units in any order: the same function
static void test_permutation(void) {
    const int M = 12, D = 16, H = 24;
    std::vector<real> f = normal((size_t)M * D, 1), w[3] = {normal((size_t)H * D, 0.3), normal((size_t)H * D, 0.3),
                                                            normal((size_t)H * D, 0.3)};
    std::vector<int> perm(H);
    for (int n = 0; n < H; n++) { perm[n] = n; }
    for (int n = H - 1; n > 0; n--) { std::swap(perm[n], perm[rng_below(&rng, (uint64_t)n + 1)]); }
    std::vector<real> y[2];
    for (int pass = 0; pass < 2; pass++) {
        std::vector<real> g((size_t)M * H), u((size_t)M * H), h((size_t)M * H), l1(M);
        std::vector<int> active(M);
        y[pass].assign((size_t)M * D, 0);
        gemm(g.data(), f.data(), w[0].data(), M, H, D, 0, 1, 0);
        gemm(u.data(), f.data(), w[1].data(), M, H, D, 0, 1, 0);
        relu_gate_forward(h.data(), l1.data(), active.data(), (uint8_t*)NULL, g.data(), u.data(), M, H);
        gemm(y[pass].data(), h.data(), w[2].data(), M, D, H, 0, 0, 0);
        for (std::vector<real>& x : w) {
            std::vector<real> moved(x.size());
            permute_rows(moved.data(), x.data(), perm.data(), H, D);
            x = moved;
        }
    }
    CHECK(rel_err(y[1].data(), y[0].data(), y[0].size()) < 1e-13, "permuted units: the same FFN");
}

// the hot set from counts: H 256 over 1000 tokens; a hot unit costs 0.1 a token, a cold pair 1 (so a unit
// pays its way hot above a rate of 0.1), in blocks of FFN_HOT_ALIGN
static FfnHotPolicy measured(FfnCosts costs) {
    FfnHotPolicy p = ffn_hot_policy(FFN_HOT_MEASURED, 0);
    p.measured = 1, p.costs = costs;
    return p;
}

// the path a layer with these counts chooses from path `now` (ffn_hot_order, then ffn_path_choose)
static int choose_path(std::vector<int>& perm, const std::vector<uint32_t>& count, int now, double tokens,
                       const FfnCosts& c, const FfnPairPrices& prices, int dense, int hot_ok, int since,
                       double* times = NULL) {
    const int H = (int)count.size();
    perm.resize(H);
    std::vector<double> prefix(H + 1);
    ffn_hot_order(perm.data(), prefix.data(), count.data(), H, tokens);
    return ffn_path_choose(perm.data(), prefix.data(), count.data(), H, now, tokens, &c, &prices, dense, hot_ok,
                           since, times);
}

// the hot set under a rate and under measured costs with --ffn sparse (no dense layer): who joins and who
// leaves, the margin, the order
static void test_choose(void) {
    const int H = 256, free_to = FFN_PATH_MIN_STEPS;
    FfnHotPolicy rate = ffn_hot_policy(FFN_HOT_RATE, 0.1f);
    std::vector<int> perm;
    std::vector<uint32_t> count(H);
    int hot = 0;
    auto choose = [&](const FfnHotPolicy* p) {
        FfnCosts c = ffn_hot_model(p);
        return choose_path(perm, count, hot, 1000, c, ffn_no_prices, 0, ffn_hot_active(p), free_to);
    };
    for (int n = 0; n < H; n++) { count[n] = n % 7; } // all cold
    CHECK(choose(&rate) == -1, "no unit above the rate: no hot units");
    count[200] = 300, count[10] = 126;
    CHECK(choose(&rate) == -1, "two busy units do not pay for a block of 64");
    for (int n = 100; n < 164; n++) { count[n] = 300 + n; }
    int units = choose(&rate);
    CHECK(units == FFN_HOT_ALIGN, "64 busy units: one block (%d)", units);
    CHECK(perm[0] == 163 && perm[63] == 100, "the busiest first, by count (%d .. %d)", perm[0], perm[63]);
    std::vector<int> seen(H, 0);
    int ordered = 1;
    for (int n = 0; n < H; n++) { seen[perm[n]]++; }
    for (int n = units + 1; n < H; n++) { ordered &= perm[n] > perm[n - 1]; }
    CHECK(std::count(seen.begin(), seen.end(), 1) == H && ordered, "a permutation; the cold units in order");

    // as if applied: units [0, 64) hot
    hot = 64;
    for (int n = 0; n < H; n++) { count[n] = n < 64 ? 99 : n % 7; }
    CHECK(choose(&rate) == -1, "hysteresis: a hot set just below the rate stays");
    for (int n = 0; n < 64; n++) { count[n] = 95; }
    CHECK(choose(&rate) == 0, "once it costs more than the margin: none hot");
    for (int n = 0; n < H; n++) { count[n] = 500; }
    CHECK(choose(&rate) == H, "every unit busy: all hot");
    // a fixed cost of the dense part: worth it for enough units only
    hot = 0;
    for (int n = 0; n < H; n++) { count[n] = n < 64 ? 300 : n % 7; }
    FfnHotPolicy fixed5 = measured({5.0f, 0.1f, 0.0f, 1.0f, 0.0f, 0.0f}),
                 fixed20 = measured({20.0f, 0.1f, 0.0f, 1.0f, 0.0f, 0.0f});
    CHECK(choose(&fixed5) == 64, "64 units pay for a fixed cost of 5");
    CHECK(choose(&fixed20) == -1, "not for one of 20");
    FfnHotPolicy off = ffn_hot_policy(FFN_HOT_OFF, 0), later = ffn_hot_policy(FFN_HOT_MEASURED, 0);
    CHECK(!ffn_hot_active(&off) && !ffn_hot_active(&later) && ffn_hot_active(&rate) && ffn_hot_active(&fixed5),
          "hot sets are chosen under a rate or measured costs only");
    FfnCosts prior = ffn_hot_model(&later), prior_off = ffn_hot_model(&off);
    CHECK(prior.dense1 == 1 && prior.pair1 == (float)FFN_PRIOR_PAIR && memcmp(&prior, &prior_off, sizeof(prior)) == 0,
          "until measured, and with hot units off: the prior costs");
}

// --ffn auto: dense, all cold or the split, whichever the costs say; only dense or all cold without hot units;
// the same inputs, the same path
static void test_auto_path(void) {
    const int H = 256;
    const FfnCosts c = {0.0f, 1.0f, 0.1f, 50.0f, 256.0f, 0.0f}; // (the dense layer: H dense units)
    std::vector<int> perm, perm2;
    std::vector<uint32_t> count(H);
    double t[2];
    for (int n = 0; n < H; n++) { count[n] = 10; } // 2.56 pairs a token: all cold 25.6 + 128
    int h = choose_path(perm, count, H, 1000, c, ffn_no_prices, 1, 1, 100, t);
    CHECK(h == 0 && fabs(t[0] - 256) < 1e-4 && fabs(t[1] - 153.6) < 1e-4, "a quiet layer: dense -> sparse (%d, %g -> %g)", h, t[0], t[1]);
    for (int n = 0; n < H; n++) { count[n] = 200; }
    CHECK(choose_path(perm, count, H, 1000, c, ffn_no_prices, 1, 1, 100) == -1, "a busy layer stays dense");
    CHECK(choose_path(perm, count, 0, 1000, c, ffn_no_prices, 1, 1, 100) == H, "a busy sparse layer turns dense");
    for (int n = 0; n < H; n++) { count[n] = (n * 37) % H < 64 ? 500 : 10; } // 64 units fire for half the tokens
    h = choose_path(perm, count, H, 1000, c, ffn_no_prices, 1, 1, 100, t);
    CHECK(h == 64 && fabs(t[1] - (64 + 19.2 + 96)) < 1e-4, "a skewed layer: the split with its 64 busy units hot (%d, %g)", h, t[1]);
    int busy_first = 1;
    for (int i = 0; i < 64; i++) { busy_first &= count[perm[i]] == 500; }
    CHECK(busy_first, "... which come first");
    CHECK(choose_path(perm, count, 0, 1000, c, ffn_no_prices, 1, 0, 100) == H,
          "without hot units the same layer turns dense (all cold costs 1722)");
    h = choose_path(perm2, count, H, 1000, c, ffn_no_prices, 1, 1, 100);
    CHECK(h == 64 && perm == perm2, "the same inputs: the same path and order");
    CHECK(choose_path(perm, count, H, 1000, c, ffn_no_prices, 1, 1, FFN_PATH_MIN_STEPS - 1) == -1,
          "no change within FFN_PATH_MIN_STEPS of the last");
    const FfnCosts unmeasured_dense = {0.0f, 1.0f, 0.1f, 50.0f, 0.0f, 0.0f};
    CHECK(choose_path(perm, count, H, 1000, unmeasured_dense, ffn_no_prices, 1, 1, 100, t) == 64 && t[0] == 256,
          "the dense layer unmeasured: dense0 + dense1 H");
}

// A layer whose activity swings around the boundary between dense and all cold, re-chosen every FFN_HOT_EVERY
// steps: a swing within the margin never changes its path, a larger one no more often than every
// FFN_PATH_MIN_STEPS steps
static void test_hysteresis(void) {
    const int H = 256;
    const FfnCosts c = {0.0f, 1.0f, 0.1f, 50.0f, 256.0f, 0.0f};
    std::vector<int> perm;
    for (int swing : {4, 60}) { // counts 182 / 178 (all cold 1% above / below dense), 210 / 150 (15%)
        std::vector<uint32_t> count(H);
        int now = H, changed = -FFN_PATH_MIN_STEPS, changes = 0, closest = 1 << 30;
        for (int step = 0; step <= 400; step += FFN_HOT_EVERY) {
            for (int n = 0; n < H; n++) { count[n] = (step / FFN_HOT_EVERY) % 2 ? 180 + swing / 2 : 180 - swing / 2; }
            int h = choose_path(perm, count, now, 10000, c, ffn_no_prices, 1, 1, step - changed);
            if (h < 0) { continue; }
            if (changes++) { closest = std::min(closest, step - changed); }
            now = h, changed = step;
        }
        if (swing == 4) { CHECK(changes == 0, "a swing of 1%%: the path never changes (%d changes)", changes); }
        else {
            CHECK(changes > 1 && closest >= FFN_PATH_MIN_STEPS, "a swing of 15%%: %d changes, at least %d steps apart",
                  changes, closest);
        }
    }
}

// The marginal measurement: a layer whose busiest units' pairs cost much less than its others' (as the
// unit-major backward makes them) is priced at the average pair after its all-cold time, so the split looks
// 29% faster; timed on the split, its prices say what moving those units saved, the split loses by 6.7%,
// the layer goes back to all cold and stays there (a path timed: the margin, not the split's larger miss)
static void test_prices(void) {
    const int H = 256;
    const double tokens = 1000;
    const FfnCosts c = {12.8f, 0.5f, 0.1f, 0.0f, 200.0f, 0.0f}; // (the split with 64 hot: 64 but its cold pairs)
    std::vector<uint32_t> count(H);
    for (int n = 0; n < H; n++) { count[n] = n < 64 ? 500 : 10; } // 32 busy pairs a token, 1.92 others
    // the layer's true time: a busy unit's cold pair 1, another 20
    auto true_time = [&](int h) { return ffn_path_fixed(&c, H, h) + (h < 64 ? 32.0 : 0.0) + 20 * 1.92; };
    std::vector<int> perm(H);
    std::vector<double> prefix(H + 1);
    ffn_hot_order(perm.data(), prefix.data(), count.data(), H, tokens);
    FfnPairPrices p = ffn_prices_fit(&c, &ffn_no_prices, H, 0, true_time(0), prefix.data());
    CHECK(p.at == 0 && fabs(p.busy - 70.4 / 33.92) < 1e-5 && p.busy == p.rest, "timed all cold: one price (%g)", p.busy);
    CHECK(fabs(ffn_path_time(&c, &p, H, 0, 1, prefix.data()) - true_time(0)) < 1e-4, "which gives the time measured");
    double t[2];
    int now = 0, step = 0, changed = -FFN_PATH_MIN_STEPS, changes = 0;
    int h = choose_path(perm, count, now, tokens, c, p, 1, 1, step - changed, t);
    CHECK(h == 64 && t[1] < 0.75 * t[0], "the average price: the split looks faster (%d, %g -> %g)", h, t[0], t[1]);
    for (; step <= 200; step += FFN_HOT_EVERY) {
        if (now < H && now != p.at) { p = ffn_prices_fit(&c, &p, H, now, true_time(now), prefix.data()); }
        h = choose_path(perm, count, now, tokens, c, p, 1, 1, step - changed, t);
        if (h >= 0) { now = h, changed = step, changes++; }
    }
    CHECK(p.split == 64 && fabs(p.busy - 1) < 1e-4 && fabs(p.rest - 20) < 1e-4,
          "timed on both paths: the busy pairs 1, the rest 20 (%d, %g, %g)", p.split, p.busy, p.rest);
    CHECK(now == 0 && changes == 2 && p.miss > FFN_PATH_MISS_MAX,
          "the split tried once (modelled %.0f%% off its time), then all cold, timed, for good (%d changes, now %d)",
          100 * p.miss, changes, now);
    CHECK(fabs(ffn_path_time(&c, &p, H, 64, 1, prefix.data()) - true_time(64)) < 1e-4 &&
          fabs(ffn_path_time(&c, &p, H, 0, 1, prefix.data()) - true_time(0)) < 1e-4, "both paths priced as measured");
}

// Three measured paths: a layer whose busiest 64 units' cold pairs cost 1, the next 64 units' 0.2 and the rest
// 20 (the busiest pairs gain from the split, the next ones barely), timed all cold, on the split of 64 hot units,
// then of 128. The prices after the third time still give every time measured (all cold 185.6, not the 83.2
// of the middle units' price applied to the busiest), and the layer moves back to the split of 64 (96), not
// to all cold
static void test_prices_three(void) {
    const int H = 256;
    const double tokens = 1000;
    const FfnCosts c = {12.8f, 0.5f, 0.1f, 0.0f, 200.0f, 0.0f};
    std::vector<uint32_t> count(H);
    for (int n = 0; n < H; n++) { count[n] = n < 64 ? 2000 : n < 128 ? 500 : 10; } // 128, 32, 1.28 pairs a token
    auto true_time = [&](int h) {
        return ffn_path_fixed(&c, H, h) + (h < 64 ? 128.0 : 0.0) + (h < 128 ? 0.2 * 32 : 0.0) + 20 * 1.28;
    };
    std::vector<int> perm(H);
    std::vector<double> prefix(H + 1);
    ffn_hot_order(perm.data(), prefix.data(), count.data(), H, tokens);
    FfnPairPrices p = ffn_no_prices;
    for (int h : {0, 64, 128}) { p = ffn_prices_fit(&c, &p, H, h, true_time(h), prefix.data()); }
    CHECK(p.lo == 64 && p.split == 128 && fabs(p.low - 1) < 1e-4 && fabs(p.busy - 0.2) < 1e-4 && fabs(p.rest - 20) < 1e-4,
          "three times: the busiest pairs 1, the next 0.2, the rest 20 (%d %g, %d %g, %g)", p.lo, p.low, p.split, p.busy,
          p.rest);
    for (int h : {0, 64, 128}) {
        double t = ffn_path_time(&c, &p, H, h, 1, prefix.data());
        CHECK(fabs(t - true_time(h)) < 1e-3, "the path of %d hot units priced as measured (%g, %g)", h, t, true_time(h));
    }
    CHECK(ffn_path_timed(&c, &p, H, 64, 1) && ffn_path_timed(&c, &p, H, 128, 1) && !ffn_path_timed(&c, &p, H, 0, 1) &&
          !ffn_path_timed(&c, &p, H, 192, 1) && ffn_path_timed(&c, &p, H, H, 1),
          "timed: the last two paths and the dense layer, not all cold (three times ago) nor a path never run");
    double t[2];
    int h = choose_path(perm, count, 128, tokens, c, p, 1, 1, 100, t);
    CHECK(h == 64 && fabs(t[1] - true_time(64)) < 1e-3, "back to the split of 64 (%d, %g -> %g)", h, t[0], t[1]);
}

// Flapping: a layer of 256 units whose activity swings between re-choices (each unit's rate 0.5 exp(-rank / 80),
// then / 120) and whose busiest units' pairs cost less (5 a pair for a quiet unit, 0.2 for one firing for half
// the tokens: the unit-major backward), re-chosen every FFN_HOT_EVERY steps for 300 steps, each path it moves to
// timed. The units just past a timed path are priced at the average beyond it, so its moves are modelled off
// what they then measure by up to 15%, mostly under (as the pattern model's were on a GPU). By the margin alone
// (the prices' miss dropped: the rule before) it changes path 10 times or more, to the end; held to its prices'
// last miss it moves once, to the path that is best over both swings, and stays
static void test_flapping(void) {
    const int H = 256;
    const double tokens = 1000;
    const FfnCosts c = {10.0f, 0.5f, 0.05f, 5.0f, 138.0f, 5.0f}; // (the dense layer timed: the dense part at H)
    std::vector<uint32_t> swing[2] = {std::vector<uint32_t>(H), std::vector<uint32_t>(H)};
    for (int n = 0; n < H; n++) {
        swing[0][n] = (uint32_t)(500 * exp(-n / 80.0) + 1), swing[1][n] = (uint32_t)(500 * exp(-n / 120.0) + 1);
    }
    auto true_time = [&](const std::vector<uint32_t>& count, int h) {
        double t = h == H ? c.dense : ffn_path_fixed(&c, H, h);
        for (int n = h; n < H; n++) {
            double share = count[n] / 501.0; // (of the busiest unit's count)
            t += (0.2 * share + 5 * (1 - share)) * count[n] / tokens;
        }
        return t;
    };
    int changes[2], last[2], now[2];
    double worst_miss = 0;
    for (int rule = 0; rule < 2; rule++) { // 0: the margin alone, 1: the prices' miss too
        FfnPairPrices p = ffn_no_prices;
        int changed = -FFN_PATH_MIN_STEPS;
        changes[rule] = 0, last[rule] = -1, now[rule] = 0;
        for (int step = 0; step < 300; step += FFN_HOT_EVERY) {
            const std::vector<uint32_t>& count = swing[step / FFN_HOT_EVERY % 2];
            std::vector<int> perm(H);
            std::vector<double> prefix(H + 1);
            ffn_hot_order(perm.data(), prefix.data(), count.data(), H, tokens);
            int h = now[rule];
            if (h < H && h != p.at) {
                p = ffn_prices_fit(&c, &p, H, h, true_time(count, h), prefix.data());
                // (the first time is off the costs' pair price, not a move's model)
                if (rule == 0) { worst_miss = fmax(worst_miss, changes[0] ? p.miss : 0.0), p.miss = 0; }
            }
            h = ffn_path_choose(perm.data(), prefix.data(), count.data(), H, h, tokens, &c, &p, 1, 1, step - changed,
                                (double*)NULL);
            if (h >= 0) { now[rule] = h, changed = last[rule] = step, changes[rule]++; }
        }
    }
    int best = 0;
    auto both = [&](int h) { return true_time(swing[0], h) + true_time(swing[1], h); };
    for (int h = FFN_HOT_ALIGN; h <= H; h += FFN_HOT_ALIGN) { best = both(h) < both(best) ? h : best; }
    CHECK(changes[0] >= 10 && last[0] >= 250 && worst_miss > 0.1,
          "the margin alone: %d changes, the last at step %d, moves modelled up to %.0f%% off their time",
          changes[0], last[0], 100 * worst_miss);
    CHECK(changes[1] == 1 && now[1] == best, "held to the last miss: %d change, to %d hot (the best: %d)", changes[1],
          now[1], best);
}

// A cold part's constant (cold0): a uniform busy layer whose dense part is a little cheaper per unit than the
// dense layer (H 1024, the dense layer 1024, the dense part 0.95 per unit, a cold pair 20) gains 4% from the
// split with 64 cold units when a cold part costs nothing beyond its gate and pairs, and stays dense when one
// costs 80 (each cold part runs its whole pipeline of kernels, however few its units); a quiet layer runs all
// cold either way; a split's time fits its pairs' price without the constant
static void test_cold_constant(void) {
    const int H = 1024;
    const double tokens = 1000;
    const FfnCosts free_part = {0.0f, 0.95f, 0.1f, 20.0f, 1024.0f, 0.0f};
    const FfnCosts priced = {0.0f, 0.95f, 0.1f, 20.0f, 1024.0f, 80.0f};
    std::vector<int> perm;
    std::vector<uint32_t> busy(H, 50), quiet(H, 10); // 51.2 pairs a token (3.2 in 64 units), 10.24
    double t[2];
    int h = choose_path(perm, busy, H, tokens, free_part, ffn_no_prices, 1, 1, 100, t);
    CHECK(h == H - 64 && fabs(t[1] - (0.95 * 960 + 6.4 + 64)) < 1e-3,
          "no constant: the busy layer leaves dense for the split with 64 cold units (%d, %g -> %g)", h, t[0], t[1]);
    CHECK(choose_path(perm, busy, H, tokens, priced, ffn_no_prices, 1, 1, 100) == -1,
          "a constant of 80: the busy layer stays dense");
    h = choose_path(perm, busy, 0, tokens, priced, ffn_no_prices, 1, 1, 100, t);
    CHECK(h == H && fabs(t[0] - (80 + 102.4 + 1024)) < 1e-3 && t[1] == 1024,
          "... and turns dense from all cold (%d, %g -> %g)", h, t[0], t[1]);
    h = choose_path(perm, quiet, H, tokens, priced, ffn_no_prices, 1, 1, 100, t);
    CHECK(h == 0 && fabs(t[1] - (80 + 102.4 + 204.8)) < 1e-3, "the quiet layer: all cold (%d, %g)", h, t[1]);
    CHECK(choose_path(perm, quiet, 0, tokens, priced, ffn_no_prices, 0, 1, 100) == -1,
          "... also without the dense layer (--ffn sparse)");
    std::vector<double> prefix(H + 1);
    ffn_hot_order(perm.data(), prefix.data(), busy.data(), H, tokens);
    const double split_time = 0.95 * 960 + 80 + 6.4 + 40 * 3.2; // (its cold pairs at 40)
    FfnPairPrices p = ffn_prices_fit(&priced, &ffn_no_prices, H, H - 64, split_time, prefix.data());
    CHECK(fabs(p.busy - 40) < 1e-3 && fabs(ffn_path_time(&priced, &p, H, H - 64, 1, prefix.data()) - split_time) < 1e-3,
          "a split timed: its pairs priced without the constant (%g)", p.busy);
}

// The costs from their timings (ffn_costs): given a dense part, gate, cold part constant and pair price, the
// times they make (the layer all cold and its last 64 units alone) give them back; noisy times keep the
// constant within [0, the layer's time beyond its gate] and give back the all-cold time; no part timed: no
// constant
static void test_cold_fit(void) {
    const int H = 5632, M = 16384, part = ffn_cold_probe_units(H);
    const double dense0 = 2e-8, dense1 = 4.5e-11, gate1 = 1e-11, cold0 = 3e-8, pair1 = 3e-9; // (H200-like)
    const double pairs = 100.0 * M, part_pairs = 1.2 * M; // (a few more than 64 / H of the pairs)
    auto dense = [&](int units) { return (dense0 + dense1 * units) * M; };
    double gate = gate1 * H * M, sparse = cold0 * M + gate + pair1 * pairs;
    double cold_part = (cold0 + gate1 * part) * M + pair1 * part_pairs;
    FfnCosts c = ffn_costs(dense(128), 128, dense(512), 512, gate, sparse, pairs, cold_part, part, part_pairs, H, M);
    auto near = [](double a, double b) { return fabs(a - b) < 1e-5 * fabs(b); };
    CHECK(part == FFN_HOT_ALIGN && ffn_cold_probe_units(FFN_HOT_ALIGN) == 0 && ffn_cold_probe_units(100) == 64,
          "the part timed: the fewest units a split leaves cold, where there is a split");
    CHECK(near(c.dense0, dense0) && near(c.dense1, dense1) && near(c.gate1, gate1) && near(c.cold0, cold0) &&
          near(c.pair1, pair1) && c.dense == 0, "the costs given back: cold0 %g, pair1 %g, gate1 %g", c.cold0, c.pair1,
          c.gate1);
    FfnCosts none = ffn_costs(dense(128), 128, dense(512), 512, gate, sparse, pairs, 0.0, 0, 0.0, H, M);
    CHECK(none.cold0 == 0 && near(none.pair1, (sparse - gate) / pairs), "no part timed: no constant (%g)", none.pair1);
    for (double noise : {0.3, 20.0, -3.0}) { // the part's time: 30% off, more than the layer's, 0
        FfnCosts n = ffn_costs(dense(128), 128, dense(512), 512, gate, sparse, pairs,
                               noise < 0 ? 0.0 : cold_part * (1 + noise), part, part_pairs, H, M);
        double all_cold = (n.cold0 + n.gate1 * H + (double)n.pair1 * pairs / M) * M;
        CHECK(n.cold0 >= 0 && n.cold0 * M <= (sparse - gate) * (1 + 1e-6) && n.pair1 > 0 && near(all_cold, sparse),
              "noise %g: cold0 %g within bounds, a pair %g, the all-cold time %g (%g)", noise, n.cold0, n.pair1,
              all_cold, sparse);
    }
}

// the cold part timed alone (FfnColdPart): the last units of a layer as a split's cold part, against the dense FFN
// over those units (a layer of them alone, all hot); the other units' gradients, counts and marks untouched
static void test_cold_part(void) {
    const int M = 40, D = 24, H = 48, units = 16, first = H - units;
    const size_t MD = (size_t)M * D, HD = (size_t)H * D, off = (size_t)first * D;
    std::vector<real> f = normal(MD, 1), wg = normal(HD, 1.0 / sqrt(D)), wu = normal(HD, 1.0 / sqrt(D));
    std::vector<real> wdT = normal(HD, 1.0 / sqrt(H)), dy = normal(MD, 1);
    struct Out {
        std::vector<real> y, df, l1, dw[3];
        std::vector<int> active;
        std::vector<uint8_t> fired;
        std::vector<uint32_t> count;
    } out[2];
    for (Out& o : out) {
        o.y.assign(MD, NAN), o.df.assign(MD, NAN), o.l1.assign(M, NAN), o.active.assign(M, -1);
        for (int i = 0; i < 3; i++) { o.dw[i].assign(HD, 0.5 * i); }
        o.fired.assign(H, 0), o.count.assign(H, 3);
    }
    std::vector<real> g_scratch((size_t)M * H), hot(ffn_hot_scratch_elems(M, units));
    FfnColdPart<real> part;
    ffn_cold_part_alloc(&part, M, units, D, DEVICE_CPU);
    Out* o = &out[0];
    ffn_cold_part_run(&part, o->y.data(), o->l1.data(), o->active.data(), o->fired.data(), o->df.data(),
                      o->dw[0].data(), o->dw[1].data(), o->dw[2].data(), o->count.data(), g_scratch.data(), dy.data(),
                      f.data(), wg.data(), wu.data(), wdT.data(), M, D, H, (SparseScratch*)NULL);
    ffn_cold_part_free(&part, DEVICE_CPU);
    o = &out[1]; // the layer of the last units alone, every one hot (the dense FFN)
    ffn_split_forward(o->y.data(), o->l1.data(), o->active.data(), o->fired.data() + first, (SparsePattern<real>*)NULL,
                      units, hot.data(), g_scratch.data(), f.data(), wg.data() + off, wu.data() + off, wdT.data() + off, M,
                      D, units, (SparseScratch*)NULL);
    ffn_split_backward(o->df.data(), o->dw[0].data() + off, o->dw[1].data() + off, o->dw[2].data() + off,
                       o->count.data() + first, (SparsePattern<real>*)NULL, units, (SparseTransposed*)NULL,
                       (real*)NULL, (real*)NULL, hot.data(), dy.data(), f.data(), wg.data() + off, wu.data() + off,
                       wdT.data() + off, 0.0f, M, D, units, (SparseScratch*)NULL);
    double e = fmax(rel_err(out[0].y.data(), out[1].y.data(), MD), rel_err(out[0].df.data(), out[1].df.data(), MD));
    for (int i = 0; i < 3; i++) { e = fmax(e, rel_err(out[0].dw[i].data(), out[1].dw[i].data(), HD)); }
    CHECK(e < 1e-12 && rel_err(out[0].l1.data(), out[1].l1.data(), M) < 1e-12 && out[0].active == out[1].active &&
          out[0].fired == out[1].fired && out[0].count == out[1].count,
          "the last %d units as a cold part: the dense FFN over them (%g)", units, e);
}

// the model: permuting a layer's units in the weights and the optimizer state keeps the loss, the
// moments follow their rows; then training with hot sets chosen every step against the dense path
static void test_model(void) {
    GPTConfig c = {37, 128, 2, 16, 2, 1, 128, 8, 10000.0f, 1e-5f, ACT_RELU, 0};
    int B = 2, T = 8, M = B * T, H = c.hidden, D = c.channels;
    std::vector<int> inputs(M), targets(M);
    for (int i = 0; i < M; i++) { inputs[i] = (int)rng_below(&rng, 37); targets[i] = (int)rng_below(&rng, 37); }
    GPT<float, float> model;
    gpt_build(&model, &c, DEVICE_CPU);
    model.ffn.mode = FFN_SPARSE;
    std::vector<float> w(model.num_parameters);
    init_params_random(w.data(), &c, 5);
    memcpy(model.params, w.data(), w.size() * sizeof(float));
    Optimizer opt;
    optimizer_init(&opt, &model, NULL);
    for (size_t i = 0; i < opt.owned; i++) { opt.m[i] = (float)i, opt.v[i] = -(float)i; }
    gpt_forward(&model, inputs.data(), targets.data(), B, T, 0.0f);
    std::vector<float> loss0(model.acts.losses, model.acts.losses + M);
    std::vector<int> perm(H);
    for (int n = 0; n < H; n++) { perm[n] = (n * 37 + 5) % H; }
    const FfnLayer<float>* layer = &model.ffn.layer[1];
    ffn_hot_permute(layer->wg, layer->wu, layer->wdT, 1, perm.data(), H, D, &model.ffn.hooks, DEVICE_CPU);
    gpt_forward(&model, inputs.data(), targets.data(), B, T, 0.0f);
    CHECK(rel_err(model.acts.losses, loss0.data(), M) < 1e-5, "permuted layer: the same losses (%g)",
          rel_err(model.acts.losses, loss0.data(), M));
    size_t at = (size_t)(model.param[P_WU] - model.params) + (size_t)H * D + 3 * D; // row 3 of layer 1's Wu
    CHECK(opt.m[at] == (float)(at - 3 * D + perm[3] * D) && model.param[P_WU][H * D + 3 * D] == w[at - 3 * D + perm[3] * D],
          "the row and its moments moved together");
    optimizer_free(&opt);
    gpt_free(&model);

    // training: dense, and sparse with a hot set re-chosen after every step (a low rate: most units of
    // this random model fire often, so they join and leave)
    double loss[2][12];
    int changes = 0;
    for (int mode = 0; mode < 2; mode++) {
        GPT<float, float> m;
        gpt_build(&m, &c, DEVICE_CPU);
        m.ffn.mode = mode ? FFN_SPARSE : FFN_DENSE;
        m.ffn.hot = ffn_hot_policy(mode ? FFN_HOT_RATE : FFN_HOT_OFF, 0.3f);
        memcpy(m.params, w.data(), w.size() * sizeof(float));
        Optimizer o;
        optimizer_init(&o, &m, NULL);
        OptimConfig oc = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 0, 12, 0.1f};
        for (int step = 0; step < 12; step++) {
            gpt_zero_grad(&m);
            gpt_stats_reset(&m);
            gpt_forward(&m, inputs.data(), targets.data(), B, T, 1.0f / M);
            gpt_backward(&m, inputs.data(), 1e-3f / (c.num_layers * M));
            optimizer_step(&o, &m, &oc, lr_at_step(&oc, step), step + 1);
            gpt_stats_read(&m, M);
            int before = m.ffn.layer[0].hot_units + 1000 * m.ffn.layer[1].hot_units;
            gpt_ffn_update(&m, step, M, 0);
            changes += mode && before != m.ffn.layer[0].hot_units + 1000 * m.ffn.layer[1].hot_units;
            loss[mode][step] = m.ce;
        }
        optimizer_free(&o);
        gpt_free(&m);
    }
    // --ffn sparse with hot units off (--hot-rate 0): no layer leaves all cold, however busy
    GPT<float, float> off;
    gpt_build(&off, &c, DEVICE_CPU);
    off.ffn.mode = FFN_SPARSE;
    memcpy(off.params, w.data(), w.size() * sizeof(float));
    gpt_stats_reset(&off);
    gpt_forward(&off, inputs.data(), targets.data(), B, T, 1.0f / M);
    gpt_backward(&off, inputs.data(), 0.0f);
    gpt_stats_read(&off, M);
    gpt_ffn_update(&off, 0, M, 0);
    CHECK(off.ffn.layer[0].on && off.ffn.layer[0].hot_units == 0 && off.ffn.layer[1].hot_units == 0,
          "--ffn sparse, hot units off: all cold (%d, %d hot)", off.ffn.layer[0].hot_units, off.ffn.layer[1].hot_units);
    gpt_free(&off);
    double worst = 0;
    for (int step = 0; step < 12; step++) { worst = fmax(worst, fabs(loss[1][step] - loss[0][step]) / loss[0][step]); }
    CHECK(changes > 0, "the hot sets changed during the run (%d times)", changes);
    CHECK(worst < 1e-4, "sparse with hot units tracks dense: worst relative loss difference %g", worst);
}

// the FFN state a checkpoint keeps: the hot units, the last change, the prices (their miss too) and the costs
// round-trip; a state from before the prices' miss (11 ints per layer) loads with a miss of 0, one from before
// the split (3 ints per layer) with no hot units, one from before the measured paths (4 ints per layer, 4
// floats) with its hot units and costs
static void test_state(void) {
    GPTConfig c = {37, 128, 2, 16, 2, 1, 64, 8, 10000.0f, 1e-5f, ACT_RELU, 0};
    GPT<float, float> a, b;
    gpt_build(&a, &c, DEVICE_CPU);
    gpt_build(&b, &c, DEVICE_CPU);
    a.ffn.mode = b.ffn.mode = FFN_AUTO;
    FfnLayer<float>* l0 = &a.ffn.layer[0];
    FfnLayer<float>* l1 = &a.ffn.layer[1];
    l0->on = 1, l0->W = 32, l0->tail_capacity = 100, l0->hot_units = 64;
    l0->changed = 30, l0->prices = (FfnPairPrices){48, 48, 1.5e-9f, 4.25e-9f, 16, 2.5e-9f, 0.0625f};
    l1->on = 0, l1->W = 16, l1->tail_capacity = 50, l1->hot_units = 0;
    std::vector<int32_t> state(ffn_state_ints(2));
    const FfnHotPolicy policies[] = {measured({1.5e-8f, 2.25e-9f, 1e-10f, 3.3e-9f, 3e-7f, 2e-8f}), ffn_hot_policy(FFN_HOT_RATE, 0.05f),
                                     ffn_hot_policy(FFN_HOT_MEASURED, 0), ffn_hot_policy(FFN_HOT_OFF, 0)};
    for (const FfnHotPolicy& p : policies) {
        a.ffn.hot = p;
        ffn_state_get(&a.ffn, state.data());
        ffn_state_set(&b.ffn, state.data(), (int)state.size(), "a state");
        const FfnHotPolicy* q = &b.ffn.hot;
        CHECK(b.ffn.layer[0].on == 1 && b.ffn.layer[0].W == 32 && b.ffn.layer[0].tail_capacity == 100 &&
              b.ffn.layer[0].hot_units == 64 && b.ffn.layer[1].on == 0 && b.ffn.layer[1].hot_units == 0 &&
              b.ffn.layer[0].changed == 30 && memcmp(&b.ffn.layer[0].prices, &l0->prices, sizeof(FfnPairPrices)) == 0 &&
              b.ffn.layer[1].changed == -FFN_PATH_MIN_STEPS && b.ffn.layer[1].prices.at == -1 &&
              q->mode == p.mode && q->measured == p.measured && q->rate == p.rate &&
              (!p.measured || memcmp(&q->costs, &p.costs, sizeof(FfnCosts)) == 0),
              "FFN state round trip (hot policy %d, measured %d)", p.mode, p.measured);
    }
    // from before the prices' miss (11 ints per layer and 6 floats): its prices with a miss of 0 (the margin
    // alone, as it chose with)
    a.ffn.hot = measured({1.5e-8f, 2.25e-9f, 1e-10f, 3.3e-9f, 3e-7f, 2e-8f});
    ffn_state_get(&a.ffn, state.data());
    std::vector<int32_t> eleven(11 * 2 + 6);
    for (int l = 0; l < 2; l++) { memcpy(eleven.data() + 11 * l, state.data() + FFN_STATE_PER_LAYER * l, 11 * sizeof(int32_t)); }
    memcpy(eleven.data() + 11 * 2, state.data() + FFN_STATE_PER_LAYER * 2, 6 * sizeof(int32_t));
    ffn_state_set(&b.ffn, eleven.data(), (int)eleven.size(), "a state of 11 ints a layer");
    FfnPairPrices no_miss = l0->prices;
    no_miss.miss = 0;
    CHECK(b.ffn.layer[0].hot_units == 64 && b.ffn.layer[0].changed == 30 &&
          memcmp(&b.ffn.layer[0].prices, &no_miss, sizeof(FfnPairPrices)) == 0 && b.ffn.hot.costs.cold0 == 2e-8f,
          "an FFN state of 11 ints a layer: the paths, the prices with no miss, the costs");
    // from before the busiest units' own price (9 ints per layer and 6 floats) and before the cold part's
    // constant (9 and 5): their prices without it, and the constant 0, as they chose with
    const FfnPairPrices nine = {48, 48, 1.5e-9f, 4.25e-9f, 0, 0.0f, 0.0f};
    for (int floats : {6, 5}) {
        std::vector<int32_t> older(9 * 2 + floats);
        for (int l = 0; l < 2; l++) { memcpy(older.data() + 9 * l, state.data() + FFN_STATE_PER_LAYER * l, 9 * sizeof(int32_t)); }
        memcpy(older.data() + 9 * 2, state.data() + FFN_STATE_PER_LAYER * 2, floats * sizeof(int32_t));
        ffn_state_set(&b.ffn, older.data(), (int)older.size(), "an older state");
        CHECK(b.ffn.layer[0].hot_units == 64 && b.ffn.layer[0].changed == 30 &&
              memcmp(&b.ffn.layer[0].prices, &nine, sizeof(FfnPairPrices)) == 0 && b.ffn.hot.measured &&
              b.ffn.hot.costs.pair1 == 3.3e-9f && b.ffn.hot.costs.dense == 3e-7f &&
              b.ffn.hot.costs.cold0 == (floats == 6 ? 2e-8f : 0.0f),
              "an FFN state of 9 ints a layer and %d floats of costs: the paths, prices (no busiest units' own) and "
              "costs", floats);
    }
    a.ffn.hot = ffn_hot_policy(FFN_HOT_RATE, 0.05f);
    ffn_state_get(&a.ffn, state.data());
    std::vector<int32_t> older(9 * 2 + 5);
    for (int l = 0; l < 2; l++) { memcpy(older.data() + 9 * l, state.data() + FFN_STATE_PER_LAYER * l, 9 * sizeof(int32_t)); }
    memcpy(older.data() + 9 * 2, state.data() + FFN_STATE_PER_LAYER * 2, 5 * sizeof(int32_t));
    ffn_state_set(&b.ffn, older.data(), (int)older.size(), "a state of 5 floats of costs");
    CHECK(b.ffn.hot.mode == FFN_HOT_RATE && b.ffn.hot.rate == 0.05f, "... and its rate");
    const int32_t old[6] = {1, 48, 20, 1, 32, 10};
    b.ffn.hot = ffn_hot_policy(FFN_HOT_MEASURED, 0);
    ffn_state_set(&b.ffn, old, 6, "an old state");
    CHECK(b.ffn.layer[0].W == 48 && b.ffn.layer[1].tail_capacity == 10 && b.ffn.layer[0].hot_units == 0 &&
          b.ffn.layer[1].hot_units == 0 && b.ffn.hot.mode == FFN_HOT_MEASURED && !b.ffn.hot.measured,
          "an FFN state from before the hot/cold split");
    // from before the layers' paths were measured: 4 ints per layer and 4 floats of costs, no change yet, no prices
    std::vector<int32_t> v2 = {1, 48, 20, 64, 0, 32, 10, 0, 0, 0, 0, 0};
    const float costs4[4] = {1.5e-8f, 2.25e-9f, 1e-10f, 3.3e-9f};
    memcpy(v2.data() + 8, costs4, sizeof(costs4));
    b.ffn.layer[0].changed = 40, b.ffn.layer[0].prices = l0->prices;
    ffn_state_set(&b.ffn, v2.data(), (int)v2.size(), "a state of 4 ints a layer");
    CHECK(b.ffn.layer[0].hot_units == 64 && b.ffn.layer[1].W == 32 && b.ffn.hot.measured &&
          b.ffn.hot.costs.pair1 == costs4[3] && b.ffn.hot.costs.dense == 0 &&
          b.ffn.layer[0].changed == -FFN_PATH_MIN_STEPS && b.ffn.layer[0].prices.at == -1,
          "an FFN state of 4 ints a layer: the hot units and the costs, the dense layer not measured");
    CHECK(ffn_state_ints_known(12, 2) && ffn_state_ints_known(6, 2) && ffn_state_ints_known(23, 2) &&
          ffn_state_ints_known(24, 2) && ffn_state_ints_known(28, 2) && ffn_state_ints_known(30, 2) &&
          !ffn_state_ints_known(13, 2) && !ffn_state_ints_known(25, 2) && !ffn_state_ints_known(27, 2) &&
          !ffn_state_ints_known(29, 2),
          "the sizes of older FFN states are known");
    // a tail of more rows than the micro-batch has (from a run of larger micro-batches) is cut to it
    gpt_alloc_activations(&b, 2, 8);
    CHECK(b.ffn.layer[0].tail_capacity == 16 && b.ffn.layer[1].tail_capacity == 10, "tails %d and %d for 16 rows",
          b.ffn.layer[0].tail_capacity, b.ffn.layer[1].tail_capacity);
    gpt_free(&a);
    gpt_free(&b);
}

int main(void) {
    make_tmp_dir("test_ffn_split");
    const int H = 48;
    for (int hot : {0, 1, 8, 17, H - 1, H}) { test_split(40, 24, H, hot); }
    test_split(33, 16, 8, 8); // all hot, the smallest layer
    test_permutation();
    test_choose();
    test_auto_path();
    test_hysteresis();
    test_prices();
    test_prices_three();
    test_flapping();
    test_cold_constant();
    test_cold_fit();
    test_cold_part();
    test_model();
    test_state();
    return test_summary("test_ffn_split");
}
