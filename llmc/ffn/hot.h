/*
 The path of an FFN layer (llmc/ffn/split.h): which of its units run as dense
 GEMMs (hot), the rest through the sparse format (cold), and under --ffn auto
 whether it runs as the dense layer instead; everything that decides and
 applies that, for training and for the prefill of inference alike.

 A unit that fires for a share p of the tokens costs the sparse part p
 gathered pairs per token and the dense part a fixed amount per token. With
 the costs of the running device (FfnCosts, in seconds per token),
     time(h hot units) = dense0 + dense1 h + cold0 + gate1 (H - h) + (the cold units' pairs per token, priced)
 (with h = 0 no dense0, with h = H no cold0: a cold part of any size runs its
 whole pipeline of kernels, which 64 cold units beside 5568 hot ones did not
 save over the dense layer, dev/RESULTS.md "The measured paths' first choice"),
 and a layer's path is the number h of busiest units, 0, a multiple of
 FFN_HOT_ALIGN (llmc/ffn/policy.h) or H, with the least time. h = H is every
 unit hot: under --ffn auto the dense layer itself, whose time is measured
 where one runs (dense0 + dense1 H until then). A cold pair
 is priced pair1 until the layer's own time is measured on a path
 (FfnPairPrices): then at what that path costs, and after a second path at
 what moving the units between the two saved (the busiest units' pairs cost
 less than an average pair: the unit-major backward keeps a busy unit's row),
 so a layer's path is priced by a marginal measurement where it ran. The
 policy says where the costs come from:
     FFN_HOT_OFF       no hot units: dense or all cold by the prior costs of policy.h
     FFN_HOT_RATE      the units firing for more than a share `rate` of the tokens: the cost model with a
                       hot unit costing `rate` pairs per token and nothing else
     FFN_HOT_MEASURED  the costs timed on the running device (ffn_hot_measure), once per run; until then
                       dense or all cold by the prior costs
 Training and the prefill's calibration both measure with ffn_hot_measure,
 each passing what running its layer with h hot units means. Applying a new
 set reorders the layer's units in its weights (the rows of Wg, Wu and WdT
 together: the same function); whoever keeps other copies of those rows (the
 optimizer's master weights and moments) follows through FfnHotHooks, which
 also make every data-parallel process agree on what was timed, so that
 every process makes the same choices.
*/
#ifndef LLMC_FFN_HOT_H
#define LLMC_FFN_HOT_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <algorithm>
#include <vector>
#include "llmc/device_ops.h"
#include "llmc/ffn/policy.h"
#include "llmc/ffn/split.h"
#include "llmc/memory.h"

template <typename T>
struct Ffn;
template <typename T>
struct FfnLayer;
template <typename T>
struct FfnCache;

// how training runs the FFN (--ffn; llmc/ffn/ffn.h): every layer dense, every layer by split.h, or each its path
typedef enum { FFN_DENSE = 0, FFN_SPARSE = 1, FFN_AUTO = 2 } FfnMode;

// per token: the dense part's constant and cost per unit, the gate's per cold unit, a cold pair's; the dense
// layer's time where one was measured (0: not measured); the cold part's constant (its kernels' cost beyond
// the gate's per unit and the pairs', whatever its size)
typedef struct {
    float dense0, dense1, gate1, pair1, dense, cold0;
} FfnCosts;

#define FFN_COSTS_FLOATS 6

typedef enum { FFN_HOT_OFF = 0, FFN_HOT_RATE = 1, FFN_HOT_MEASURED = 2 } FfnHotMode;

typedef struct {
    int mode;       // FfnHotMode
    float rate;     // FFN_HOT_RATE
    int measured;   // FFN_HOT_MEASURED: costs holds the measured costs
    FfnCosts costs;
} FfnHotPolicy;

static inline FfnHotPolicy ffn_hot_policy(int mode, float rate) {
    FfnHotPolicy p = {mode, rate, 0, {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}};
    return p;
}

// the costs a choice is made with: a rate's, the measured ones, or else the prior of policy.h (in units of the
// dense layer's cost per unit and token; no cold part's constant: the prior chooses between dense and all
// cold only, and stays optimistic)
static inline FfnCosts ffn_hot_model(const FfnHotPolicy* p) {
    if (p->mode == FFN_HOT_RATE) { return (FfnCosts){0.0f, p->rate, 0.0f, 1.0f, 0.0f, 0.0f}; }
    if (p->mode == FFN_HOT_MEASURED && p->measured) { return p->costs; }
    return (FfnCosts){0.0f, 1.0f, (float)FFN_PRIOR_GATE, (float)FFN_PRIOR_PAIR, 0.0f, 0.0f};
}

// whether paths with hot units are chosen now (off, or measured costs not yet taken: dense or all cold only)
static inline int ffn_hot_active(const FfnHotPolicy* p) {
    return p->mode == FFN_HOT_RATE || (p->mode == FFN_HOT_MEASURED && p->measured);
}

// the policy as the FFN_COSTS_FLOATS floats a checkpoint keeps (llmc/model.h): off all 0, a rate (0, rate, 0, 1,
// 0, 0), measured costs as they are, costs still to measure (0, -1, 0, 0, 0, 0); and back from n of them (a file
// of an older version holds fewer: 4 from before the dense layer's time was measured, 5 from before the cold
// part's constant, which is then 0, the model those costs chose with; a corrupt value is fatal, naming source)
static inline void ffn_hot_policy_pack(float out[FFN_COSTS_FLOATS], const FfnHotPolicy* p) {
    FfnCosts c = p->mode == FFN_HOT_OFF ? (FfnCosts){0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}
                 : p->mode == FFN_HOT_MEASURED && !p->measured ? (FfnCosts){0.0f, -1.0f, 0.0f, 0.0f, 0.0f, 0.0f}
                 : ffn_hot_model(p);
    out[0] = c.dense0, out[1] = c.dense1, out[2] = c.gate1, out[3] = c.pair1, out[4] = c.dense, out[5] = c.cold0;
}

static inline FfnHotPolicy ffn_hot_policy_unpack(const float* in, int n, const char* source) {
    float v[FFN_COSTS_FLOATS] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < n; i++) {
        if (!isfinite(in[i]) || in[i] < -1 || in[i] > 1) { fatal("%s: hot/cold cost %g is corrupt", source, in[i]); }
        v[i] = in[i];
    }
    int rest_zero = v[4] == 0 && v[5] == 0;
    if (v[0] == 0 && v[1] == 0 && v[2] == 0 && v[3] == 0 && rest_zero) { return ffn_hot_policy(FFN_HOT_OFF, 0); }
    if (v[0] == 0 && v[2] == 0 && v[3] == 1 && rest_zero && v[1] > 0) { return ffn_hot_policy(FFN_HOT_RATE, v[1]); }
    FfnHotPolicy p = ffn_hot_policy(FFN_HOT_MEASURED, 0);
    if (v[1] >= 0) { p.measured = 1, p.costs = (FfnCosts){v[0], v[1], v[2], v[3], v[4], v[5]}; }
    return p;
}

// the policy in words, for the log
static inline void ffn_hot_policy_describe(char* out, size_t n, const FfnHotPolicy* p) {
    if (p->mode == FFN_HOT_OFF) { snprintf(out, n, "none"); }
    else if (p->mode == FFN_HOT_RATE) {
        snprintf(out, n, "a sparse layer's units firing for more than %.3f%% of the tokens run dense", 100 * p->rate);
    } else if (!p->measured) { snprintf(out, n, "their costs are measured after the first sparse step"); }
    else {
        snprintf(out, n, "as the measured costs say (per token: the dense part %.3g s + %.3g s per unit, the cold "
                 "part %.3g s + a cold unit's gate %.3g s + a cold pair %.3g s; the dense layer %.3g s)",
                 p->costs.dense0, p->costs.dense1, p->costs.cold0, p->costs.gate1, p->costs.pair1, p->costs.dense);
    }
}

// What a layer's own measurements say its cold pairs cost (per pair, as FfnCosts), by the rank of the pair's
// unit: a pair of one of its `lo` busiest units `low`, of the others of its `split` busiest `busy`, of any other
// unit `rest`; `at`: the path (hot units) they were last measured on, -1 never (then the costs' pair1); miss:
// how far the prices before modelled that path's time off what it measured (|measured - modelled| / measured)
typedef struct {
    int at, split;
    float busy, rest;
    int lo;
    float low, miss;
} FfnPairPrices;

static const FfnPairPrices ffn_no_prices = {-1, 0, 0.0f, 0.0f, 0, 0.0f, 0.0f};

// A layer's units by decreasing count over `tokens` tokens (perm[i] = the unit at rank i; a stable order), and
// prefix[i] = the pairs per token of the units of rank below i (prefix [H + 1])
static inline void ffn_hot_order(int* perm, double* prefix, const uint32_t* count, int H, double tokens) {
    for (int n = 0; n < H; n++) { perm[n] = n; }
    std::stable_sort(perm, perm + H, [&](int x, int y) { return count[x] > count[y]; });
    prefix[0] = 0;
    for (int i = 0; i < H; i++) { prefix[i + 1] = prefix[i] + count[perm[i]] / tokens; }
}

// a path's time per token but its cold pairs: the dense part over h units, the cold part's constant and the
// gate of the other H - h
static inline double ffn_path_fixed(const FfnCosts* c, int H, int h) {
    return (h > 0 ? c->dense0 + (double)c->dense1 * h : 0.0) + (h < H ? c->cold0 + (double)c->gate1 * (H - h) : 0.0);
}

// the price of a cold pair of the unit of rank r
static inline double ffn_pair_price(const FfnCosts* c, const FfnPairPrices* p, int r) {
    return p->at < 0 ? c->pair1 : r < p->lo ? p->low : r < p->split ? p->busy : p->rest;
}

// the modelled time per token of a layer of H units with its h busiest units hot (prefix: ffn_hot_order); dense:
// h = H is the dense layer (--ffn auto), timed where c->dense holds its time
static inline double ffn_path_time(const FfnCosts* c, const FfnPairPrices* p, int H, int h, int dense,
                                   const double* prefix) {
    if (h == H && dense && c->dense > 0) { return c->dense; }
    if (p->at < 0) { return ffn_path_fixed(c, H, h) + c->pair1 * (prefix[H] - prefix[h]); }
    // the cold pairs (ranks h and up) of the units of ranks [a, b)
    auto pairs = [&](int a, int b) { return prefix[std::max(b, h)] - prefix[std::max(a, h)]; };
    int lo = std::min(p->lo, H), s = std::max(lo, std::min(p->split, H));
    return ffn_path_fixed(c, H, h) + p->low * pairs(0, lo) + p->busy * pairs(lo, s) + p->rest * pairs(s, H);
}

// whether the modelled time of path h is a measured one: a path the layer's prices were fitted to the time of,
// or the dense layer (dense) once timed; any other is the prices' extrapolation, which missed by prices->miss
static inline int ffn_path_timed(const FfnCosts* c, const FfnPairPrices* p, int H, int h, int dense) {
    return (p->at >= 0 && (h == p->lo || h == p->split)) || (h == H && dense && c->dense > 0);
}

// A layer's prices after its path h (0 <= h < H) took `time` per token (measured), its units ranked as prefix
// says: its cold pairs at that time's price; after an earlier measurement on another path, the pairs of the
// units between the two paths at what moving them saved (busy), those of the units beyond both at the price of
// the path with more hot units (rest), and those of the units busier than both at the average the old prices
// gave them (low): so a path with fewer hot units than either keeps the time it was modelled (or timed) at,
// not the moved units' price. The paths whose times they give as measured are lo and split (both h after one
// time). miss: how far the old prices' extrapolation missed this time (when they gave h as measured, their
// own miss: a path timed again checks no extrapolation). (A price is never below FLT_MIN: timing noise does
// not make a pair free.)
static inline FfnPairPrices ffn_prices_fit(const FfnCosts* c, const FfnPairPrices* old, int H, int h, double time,
                                           const double* prefix) {
    double cold = prefix[H] - prefix[h], modelled = ffn_path_time(c, old, H, h, 0, prefix);
    float price = (float)fmax(cold > 0 ? (time - ffn_path_fixed(c, H, h)) / cold : c->pair1, FLT_MIN);
    float miss = ffn_path_timed(c, old, H, h, 0) ? old->miss : (float)(time > 0 ? fabs(time - modelled) / time : 0.0);
    FfnPairPrices p = {h, h, price, price, h, price, miss};
    if (old->at < 0 || old->at == h) { return p; }
    int lo = std::min(old->at, h), hi = std::max(old->at, h);
    double moved = prefix[hi] - prefix[lo], beyond = prefix[H] - prefix[hi];
    if (moved <= 0 || beyond <= 0) { return p; }
    double t_old = ffn_path_time(c, old, H, old->at, 0, prefix); // (the old path's prices on today's counts)
    double t_lo = h == lo ? time : t_old, t_hi = h == hi ? time : t_old;
    p.split = hi, p.lo = lo;
    p.busy = (float)fmax((t_lo - ffn_path_fixed(c, H, lo) - (t_hi - ffn_path_fixed(c, H, hi))) / moved, FLT_MIN);
    p.rest = (float)fmax((t_hi - ffn_path_fixed(c, H, hi)) / beyond, FLT_MIN);
    if (prefix[lo] > 0) {
        double above = ffn_path_time(c, old, H, 0, 0, prefix) - ffn_path_fixed(c, H, 0) -
                       (ffn_path_time(c, old, H, lo, 0, prefix) - ffn_path_fixed(c, H, lo));
        p.low = (float)fmax(above / prefix[lo], FLT_MIN);
    }
    return p;
}

// The path of a layer of H units (prefix, perm: ffn_hot_order) whose path is `now` (its first `now` units hot in
// today's order; H: every unit, under --ffn auto (dense) the dense layer), `since` steps after its last change:
// the h busiest units hot, h 0, a multiple of FFN_HOT_ALIGN or H (hot_ok 0: 0 or H only) with the least
// modelled time. Returns -1 when the path stays (ffn_policy_path_change: a path not timed must save more than
// the prices' last miss), else h with perm[i] = the unit (in today's order) that goes to position i: the hot
// units by decreasing count, then the cold ones in today's order. times (if not NULL): the modelled times per
// token now and of the best path.
static inline int ffn_path_choose(int* perm, const double* prefix, const uint32_t* count, int H, int now,
                                  double tokens, const FfnCosts* c, const FfnPairPrices* prices, int dense,
                                  int hot_ok, int since, double* times) {
    // now: today's hot units, its cold pairs priced by their units' ranks
    std::vector<int> rank(H);
    for (int i = 0; i < H; i++) { rank[perm[i]] = i; }
    double cold = 0;
    for (int n = now; n < H; n++) { cold += ffn_pair_price(c, prices, rank[n]) * count[n]; }
    double t_now = now < H ? ffn_path_fixed(c, H, now) + cold / tokens
                           : ffn_path_time(c, prices, H, now, dense, prefix);
    int best = 0;
    double best_time = ffn_path_time(c, prices, H, 0, dense, prefix);
    for (int h = hot_ok ? FFN_HOT_ALIGN : H;; h += FFN_HOT_ALIGN) {
        h = std::min(h, H);
        double t = ffn_path_time(c, prices, H, h, dense, prefix);
        if (t < best_time) { best_time = t, best = h; }
        if (h == H) { break; }
    }
    if (times) { times[0] = t_now, times[1] = best_time; }
    double miss = ffn_path_timed(c, prices, H, best, dense) ? 0.0 : prices->miss;
    if (!ffn_policy_path_change(t_now, best_time, since, miss)) { return -1; }
    std::sort(perm + best, perm + H); // the cold units in today's order
    return best;
}

// the share of a layer's firing (count per unit) that its first `units` units
// in the order perm hold (0 when none fired)
static inline double ffn_hot_share(const uint32_t* count, const int* perm, int H, int units) {
    double pairs = 0, hot_pairs = 0;
    for (int n = 0; n < H; n++) {
        pairs += count[perm[n]];
        hot_pairs += n < units ? count[perm[n]] : 0;
    }
    return pairs > 0 ? hot_pairs / pairs : 0.0;
}

// ----------------------------------------------------------------------------
// measuring the costs

// the median of 5 timed runs of fn (after one untimed), in seconds
template <typename F>
static double ffn_time(Device device, F fn) {
    double t[5];
    fn();
    for (int i = 0; i < 5; i++) {
        device_synchronize(device);
        double t0 = now_seconds();
        fn();
        device_synchronize(device);
        t[i] = now_seconds() - t0;
    }
    std::sort(t, t + 5);
    return t[2];
}

// The costs from times (seconds) on M tokens: the dense part alone over
// `small` and `large` units, the sparse part's gate alone over all H units,
// the layer all sparse over `pairs` (token, unit) pairs, and the sparse part
// over `part` units alone (0: not timed) over `part_pairs` pairs. The dense
// part's time is a constant and a slope in its units (small sets use the
// tensor cores less well); the sparse part's beyond its gate is a constant
// and a cost per pair, the line through its two times. Timing noise never
// makes the constant negative nor more than the whole layer's time beyond its
// gate, whose all-sparse time the costs give back; a pair is never free
// (FLT_MIN at least).
static inline FfnCosts ffn_costs(double dense_small, int small, double dense_large, int large, double gate,
                                 double sparse, double pairs, double cold_part, int part, double part_pairs, int H,
                                 int M) {
    FfnCosts c;
    double slope = (dense_large - dense_small) / (large - small), base = dense_small - slope * small;
    if (slope <= 0 || base < 0) { slope = dense_large / large, base = 0; } // (noise: the larger set's mean)
    c.dense0 = (float)(base / M);
    c.dense1 = (float)(slope / M);
    c.gate1 = (float)(gate / ((double)H * M));
    // beyond the gate's per unit: cold0 M + pair1 pairs for the whole layer, cold0 M + pair1 part_pairs for the part
    double beyond = fmax(sparse - gate, 0.0), part_beyond = cold_part - gate * part / H, fixed = 0;
    if (part > 0 && pairs > part_pairs) {
        double per_pair = (beyond - part_beyond) / (pairs - part_pairs);
        fixed = fmin(fmax(part_beyond - per_pair * part_pairs, 0.0), beyond);
    }
    c.cold0 = (float)(fixed / M);
    c.pair1 = (float)fmax((beyond - fixed) / fmax(pairs, 1.0), FLT_MIN);
    c.dense = 0.0f; // (the dense layer itself is timed where one runs)
    return c;
}

// run(FFN_RUN_GATE): the gate of the layer's sparse part alone; run(FFN_RUN_COLD): the sparse part over the
// layer's last ffn_cold_probe_units(H) units alone (the others excluded, not hot)
#define FFN_RUN_GATE (-1)
#define FFN_RUN_COLD (-2)

// the units of the cold part timed alone: the fewest a split leaves cold (FFN_HOT_ALIGN), where a layer has a
// split at all (else 0: only all cold and all hot remain, and all cold is timed whole)
static inline int ffn_cold_probe_units(int H) { return H > FFN_HOT_ALIGN ? FFN_HOT_ALIGN : 0; }

// The costs of a layer of H units over M tokens that fire `pairs` (token,
// unit) pairs, `part_pairs` of them in its last ffn_cold_probe_units(H)
// units, from timed runs of run(h) on `device`: h > 0 the layer's dense part
// alone over its first h units (FFN_HOT_PROBE and four times as many), h = 0
// the layer all sparse, h = FFN_RUN_GATE the sparse part's gate alone, h =
// FFN_RUN_COLD the sparse part over the last units alone (ffn_costs). `what`
// (verbose) names the run in the log line.
template <typename F>
FfnCosts ffn_hot_measure(Device device, F run, double pairs, double part_pairs, int H, int M, int verbose,
                         const char* what) {
    int large = H < 4 * FFN_HOT_PROBE ? H : 4 * FFN_HOT_PROBE, small = large / 4 > 0 ? large / 4 : 1;
    int part = ffn_cold_probe_units(H);
    double dense_small = ffn_time(device, [&] { run(small); });
    double dense_large = ffn_time(device, [&] { run(large); });
    double gate = ffn_time(device, [&] { run(FFN_RUN_GATE); });
    double cold_part = part > 0 ? ffn_time(device, [&] { run(FFN_RUN_COLD); }) : 0.0;
    double sparse = ffn_time(device, [&] { run(0); });
    if (verbose) {
        printf("ffn: hot units: costs measured on %s: the dense part over %d / %d units %.3f / %.3f ms, the layer "
               "all sparse %.3f ms (its gate %.3f) at %.1f pairs per token, its last %d units alone %.3f ms at %.2f\n",
               what, small, large, 1e3 * dense_small, 1e3 * dense_large, 1e3 * sparse, 1e3 * gate, pairs / M, part,
               1e3 * cold_part, part_pairs / M);
    }
    return ffn_costs(dense_small, small, dense_large, large, gate, sparse, pairs, cold_part, part, part_pairs, H, M);
}

// ----------------------------------------------------------------------------
// applying a hot set

// Whoever keeps copies of an FFN's weights or needs to know of its hot sets
// (NULL members: nothing to do). weights_needed(ctx, l): before layer l's
// weights are read or moved (data parallelism may still be gathering them);
// units_permuted(ctx, l, perm): layer l's units were reordered, perm on the
// device (perm[i] = the unit that went to i), so reorder your copies the same
// way; agree(ctx, v, n): n values (host) this process timed, which become
// their mean over the processes (every process must choose the same paths).
typedef struct {
    void (*weights_needed)(void* ctx, int layer);
    void (*units_permuted)(void* ctx, int layer, const int* perm);
    void (*agree)(void* ctx, float* v, int n);
    void* ctx;
} FfnHotHooks;

// a layer's units in the order perm (host, perm[i] = the unit that goes to i)
// in its weights wg, wu, wdT [H, D] on the device, then in the hooks' copies
template <typename T>
void ffn_hot_permute(T* wg, T* wu, T* wdT, int l, const int* perm, int H, int D, const FfnHotHooks* hooks,
                     Device device) {
    if (hooks->weights_needed) { hooks->weights_needed(hooks->ctx, l); }
    int* dev_perm = (int*)device_malloc(H * sizeof(int), device);
    device_copy(dev_perm, perm, H * sizeof(int), device);
    T* tmp = (T*)device_malloc((size_t)H * D * sizeof(T), device);
    for (T* w : {wg, wu, wdT}) { device_permute_rows(w, tmp, dev_perm, H, D, device); }
    device_free(tmp, device);
    if (hooks->units_permuted) { hooks->units_permuted(hooks->ctx, l, dev_perm); }
    device_free(dev_perm, device);
}

// ----------------------------------------------------------------------------
// the hot sets of a model's FFN (llmc/ffn/ffn.h's Ffn; these templates see its
// members where they are instantiated, after ffn.h defined it)

// The units of the first `units` positions of perm that were not among the
// first `now` before (the hot units that joined)
static inline int ffn_hot_joined(const int* perm, int units, int now) {
    int joined = 0;
    for (int n = 0; n < units; n++) { joined += perm[n] >= now; }
    return joined;
}

// Every layer's hot set for a prefill, from each unit's firing count [L, H]
// over `tokens` tokens under `policy`: training's choice of path with no dense
// layer and no wait. A layer whose set changes has its units permuted. Logs
// each change when verbose.
template <typename T>
void ffn_hot_rechoose(Ffn<T>* ffn, const uint32_t* count, double tokens, const FfnHotPolicy* policy, int verbose) {
    const int H = ffn->H;
    if (!ffn_hot_active(policy)) { return; }
    const FfnCosts costs = ffn_hot_model(policy);
    std::vector<int> perm(H);
    std::vector<double> prefix(H + 1);
    for (int l = 0; l < ffn->L; l++) {
        FfnLayer<T>* f = &ffn->layer[l];
        const uint32_t* c = count + (size_t)l * H;
        ffn_hot_order(perm.data(), prefix.data(), c, H, tokens);
        int units = ffn_path_choose(perm.data(), prefix.data(), c, H, f->hot_units, tokens, &costs, &ffn_no_prices,
                                    0, 1, FFN_PATH_MIN_STEPS, (double*)NULL);
        if (units < 0) { continue; }
        ffn_hot_permute(f->wg, f->wu, f->wdT, l, perm.data(), H, ffn->D, &ffn->hooks, ffn->device);
        if (verbose) {
            int joined = ffn_hot_joined(perm.data(), units, f->hot_units);
            printf("ffn: layer %d: %d -> %d hot units (%d joined, %d left), %.0f%% of the firing\n", l, f->hot_units,
                   units, joined, f->hot_units - (units - joined), 100 * ffn_hot_share(c, perm.data(), H, units));
        }
        f->hot_units = units;
    }
}

// what measuring a training layer's costs may use: its input and buffers of the last step that are scratch
// until the next forward (the projection and gradient buffers, the weight gradients, which the next step
// zeroes, the pattern, recomputed by the next forward)
template <typename T, typename G>
struct FfnProbe {
    const T* f;        // [M, D] the layer's input
    T *y, *df;         // [M, D] scratch
    const T* dy;       // [M, D]
    G *dwg, *dwu, *dwdT;
    G* row_l1;
    int* row_active;
};

// the costs of moving units between the hot and cold parts, measured on
// sparse layer l (no hot units yet) with the last step's inputs (its last
// units alone as a cold part of their own: FfnColdPart)
template <typename T, typename G>
FfnCosts ffn_hot_costs(Ffn<T>* ffn, int l, const FfnProbe<T, G>* b, int verbose) {
    int M = ffn->M, D = ffn->D, H = ffn->H;
    FfnLayer<T>* f = &ffn->layer[l];
    if (!f->on || f->hot_units != 0 || f->p.M == 0 || H < 2) { fatal("ffn_hot_costs: layer %d is not sparse and cold", l); }
    if (ffn->hooks.weights_needed) { ffn->hooks.weights_needed(ffn->hooks.ctx, l); }
    uint8_t* fired = (uint8_t*)device_malloc(H, ffn->device);
    uint32_t* count = (uint32_t*)device_malloc(H * sizeof(uint32_t), ffn->device);
    device_zero(fired, H, ffn->device);
    device_zero(count, H * sizeof(uint32_t), ffn->device);
    int large = H < 4 * FFN_HOT_PROBE ? H : 4 * FFN_HOT_PROBE, part_units = ffn_cold_probe_units(H);
    T* probe = (T*)device_malloc(ffn_hot_scratch_elems(M, large) * sizeof(T), ffn->device);
    FfnColdPart<T> part = {};
    if (part_units > 0) { ffn_cold_part_alloc(&part, M, part_units, D, ffn->device); }
    auto run = [&](int hot) {
        if (hot == FFN_RUN_GATE) {
            ffn_cold_gate(&f->p, b->row_active, fired, ffn->g, b->f, f->wg, D, &ffn->sparse_scratch);
            return;
        }
        if (hot == FFN_RUN_COLD) {
            ffn_cold_part_run(&part, b->y, b->row_l1, b->row_active, fired, b->df, b->dwg, b->dwu, b->dwdT, count,
                              ffn->g, b->dy, b->f, f->wg, f->wu, f->wdT, M, D, H, &ffn->sparse_scratch);
            return;
        }
        // hot > 0: the dense part alone, `hot` hot units and no cold ones; 0: every unit cold
        int units = hot ? hot : H;
        ffn_split_forward(b->y, b->row_l1, b->row_active, fired, &f->p, hot, probe, ffn->g, b->f, f->wg, f->wu,
                          f->wdT, M, D, units, &ffn->sparse_scratch);
        ffn_split_backward(b->df, b->dwg, b->dwu, b->dwdT, count, &f->p, hot, &ffn->transposed, ffn->sparse_du,
                           ffn->sparse_dg, probe, b->dy, b->f, f->wg, f->wu, f->wdT, 0.0f, M, D, units,
                           &ffn->sparse_scratch);
    };
    // the pairs of the last forward's (all cold), then of the part's units alone (their forward's row counts)
    auto row_pairs = [&] {
        std::vector<int> active(M);
        device_copy(active.data(), b->row_active, M * sizeof(int), ffn->device);
        double pairs = 0;
        for (int m = 0; m < M; m++) { pairs += active[m]; }
        return pairs;
    };
    double pairs = row_pairs(), part_pairs = 0;
    if (part_units > 0) {
        run(FFN_RUN_COLD);
        part_pairs = row_pairs();
    }
    char what[64];
    snprintf(what, sizeof(what), "layer %d", l);
    FfnCosts costs = ffn_hot_measure(ffn->device, run, pairs, part_pairs, H, M, verbose, what);
    if (part_units > 0) { ffn_cold_part_free(&part, ffn->device); }
    device_free(probe, ffn->device);
    device_free(fired, ffn->device);
    device_free(count, ffn->device);
    return costs;
}

// the time (seconds) of layer l's forward and backward as it runs now, on the
// last step's input (b: the buffers it may use; the firing counts go to a
// scratch of its own)
template <typename T, typename G>
double ffn_layer_time(Ffn<T>* ffn, int l, const FfnProbe<T, G>* b) {
    const int H = ffn->H;
    if (ffn->hooks.weights_needed) { ffn->hooks.weights_needed(ffn->hooks.ctx, l); }
    uint8_t* fired = (uint8_t*)device_malloc(H, ffn->device);
    uint32_t* count = (uint32_t*)device_malloc(H * sizeof(uint32_t), ffn->device);
    device_zero(fired, H, ffn->device);
    device_zero(count, H * sizeof(uint32_t), ffn->device);
    double t = ffn_time(ffn->device, [&] {
        ffn_forward(ffn, l, b->y, b->row_l1, b->row_active, fired, b->f);
        ffn_backward(ffn, l, b->df, b->dwg, b->dwu, b->dwdT, count, b->dy, b->f, b->row_l1, b->row_active, fired, 0.0f);
    });
    device_free(fired, ffn->device);
    device_free(count, ffn->device);
    return t;
}

// a value this process timed, as every process agrees it (the hooks' mean)
static inline float ffn_agreed(const FfnHotHooks* hooks, double v) {
    float x = (float)v;
    if (hooks->agree) { hooks->agree(hooks->ctx, &x, 1); }
    return x;
}

// a layer's path in words: "dense", "sparse" (no hot units) or "split h=N"
static inline void ffn_path_name(char* out, size_t n, int h, int H, int dense) {
    if (h == H && dense) { snprintf(out, n, "dense"); }
    else if (h == 0) { snprintf(out, n, "sparse"); }
    else { snprintf(out, n, "split h=%d", h); }
}

// The paths after training step `step` of `tokens` tokens, from each unit's
// firing count [L, H] (probe(l): the buffers measuring layer l may use):
// - measured costs are taken once, on the first sparse layer with no hot
//   units, and the dense layer's time on a dense layer once there is one
//   (--ffn auto);
// - every FFN_HOT_EVERY steps, a layer running a path of cold units it was not
//   yet timed on is timed (its pair prices, ffn_prices_fit), then every
//   layer's path is chosen again (ffn_path_choose); a new one reorders its
//   units, and under --ffn auto turns it dense or sparse (ffn_set_path);
//   --ffn sparse changes paths only where hot units are on.
// Everything timed is agreed on through the hooks, and the choice depends on
// the step's number and on state the checkpoint keeps, not on when a run
// started, so every process and a resumed run make the same ones. Logs what
// was measured and each change when verbose.
template <typename T, typename F>
void ffn_path_update(Ffn<T>* ffn, int step, double tokens, const uint32_t* count, F probe, int verbose) {
    const int L = ffn->L, H = ffn->H, M = ffn->M, dense = ffn->mode == FFN_AUTO;
    FfnHotPolicy* policy = &ffn->hot;
    if (ffn->mode == FFN_DENSE) { return; }
    if (policy->mode == FFN_HOT_MEASURED && !policy->measured) {
        int l = 0;
        while (l < L && !(ffn->layer[l].on && ffn->layer[l].hot_units == 0 && ffn->layer[l].p.M > 0)) { l++; }
        if (l < L) { // (measured once a layer has run sparse)
            auto b = probe(l);
            FfnCosts c = ffn_hot_costs(ffn, l, &b, verbose);
            float v[5] = {c.dense0, c.dense1, c.gate1, c.pair1, c.cold0};
            if (ffn->hooks.agree) { ffn->hooks.agree(ffn->hooks.ctx, v, 5); }
            policy->costs = (FfnCosts){v[0], v[1], v[2], v[3], 0.0f, v[4]};
            policy->measured = 1;
        }
    }
    const int measured = policy->mode == FFN_HOT_MEASURED && policy->measured;
    if (measured && dense && policy->costs.dense == 0) {
        int l = 0;
        while (l < L && ffn->layer[l].on) { l++; }
        if (l < L) {
            auto b = probe(l);
            policy->costs.dense = ffn_agreed(&ffn->hooks, ffn_layer_time(ffn, l, &b) / M);
            if (verbose) {
                printf("ffn: the dense layer measured on layer %d: %.3f ms (the dense part's model: %.3f)\n", l,
                       1e3 * M * policy->costs.dense, 1e3 * M * ffn_path_fixed(&policy->costs, H, H));
            }
        }
    }
    // (--ffn sparse without hot units, or before its costs are measured: every layer stays all cold)
    if (step % FFN_HOT_EVERY != 0 || (!dense && !ffn_hot_active(policy))) { return; }
    const FfnCosts costs = ffn_hot_model(policy);
    std::vector<int> perm(H);
    std::vector<double> prefix(H + 1);
    for (int l = 0; l < L; l++) {
        FfnLayer<T>* f = &ffn->layer[l];
        const int now = f->on ? f->hot_units : H;
        const uint32_t* c = count + (size_t)l * H;
        ffn_hot_order(perm.data(), prefix.data(), c, H, tokens);
        char was[32], path[32];
        ffn_path_name(was, sizeof(was), now, H, dense);
        if (measured && now < H && now != f->prices.at && f->p.M > 0) { // (a path it ran, not timed yet)
            auto b = probe(l);
            double t = ffn_agreed(&ffn->hooks, ffn_layer_time(ffn, l, &b) / M);
            double modelled = ffn_path_time(&costs, &f->prices, H, now, dense, prefix.data());
            f->prices = ffn_prices_fit(&costs, &f->prices, H, now, t, prefix.data());
            if (verbose) {
                printf("ffn: layer %d: %s measured %.3f ms (modelled %.3f; a move to an untimed path must now save "
                       "%.0f%%)\n", l, was, 1e3 * M * t, 1e3 * M * modelled, 100 * ffn_policy_path_margin(f->prices.miss));
            }
        }
        double times[2];
        int h = ffn_path_choose(perm.data(), prefix.data(), c, H, now, tokens, &costs, &f->prices, dense,
                                ffn_hot_active(policy), step - f->changed, times);
        if (h < 0) { continue; }
        if (verbose) {
            ffn_path_name(path, sizeof(path), h, H, dense);
            char moved[96] = "", why[128];
            if (h > 0 && h < H) {
                int joined = ffn_hot_joined(perm.data(), h, now < H ? now : 0);
                snprintf(moved, sizeof(moved), ", %d hot joined, %d left, %.0f%% of the firing hot", joined,
                         (now < H ? now : 0) - (h - joined), 100 * ffn_hot_share(c, perm.data(), H, h));
            }
            if (measured) {
                snprintf(why, sizeof(why), "%.3f -> %.3f ms by the measured costs", 1e3 * M * times[0], 1e3 * M * times[1]);
            } else if (policy->mode == FFN_HOT_RATE) {
                snprintf(why, sizeof(why), "units firing for more than %.3f%% of the tokens hot", 100 * policy->rate);
            } else {
                snprintf(why, sizeof(why), "%.2f -> %.2f of the dense layer's time by the prior costs", times[0] / H,
                         times[1] / H);
            }
            printf("ffn: layer %d -> %s (was %s; %.1f of %d units active per token%s): %s\n", l, path, was,
                   prefix[H], H, moved, why);
        }
        ffn_set_path(ffn, l, h, perm.data(), step, prefix[H] - prefix[h]);
    }
}

// count [H] += how often each of layer l's units fires over the M rows of f (g into scratch [M, H])
template <typename T>
void ffn_count_firing(const Ffn<T>* ffn, int l, uint32_t* count, const T* f, int M, T* scratch) {
    gemm(scratch, f, ffn->layer[l].wg, M, ffn->H, ffn->D, 0, 1, 0);
    unit_count_add(count, scratch, M, ffn->H);
}

// the costs of a prefill, measured on layer l's input f [M, D] whose units
// fire count [H] (host) times: the dense FFN over the first units, the sparse
// path over all of them, its gate alone, the sparse path over the last units
// alone (ffn_prefill_cold_units); y, scratch: [M, D], [M, 2H]
template <typename T>
FfnCosts ffn_prefill_costs(FfnCache<T>* cache, Ffn<T>* ffn, int l, T* y, const T* f, int M, const uint32_t* count,
                           T* scratch, int verbose) {
    const FfnLayer<T>* fl = &ffn->layer[l];
    const int D = ffn->D, H = ffn->H, part = ffn_cold_probe_units(H);
    double pairs = 0, part_pairs = 0;
    for (int n = 0; n < H; n++) {
        pairs += count[n];
        part_pairs += n >= H - part ? count[n] : 0;
    }
    auto run = [&](int hot) {
        if (hot == FFN_RUN_GATE) {
            gemm(scratch, f, fl->wg, M, H, D, 0, 1, 0);
        } else if (hot == FFN_RUN_COLD) {
            ffn_prefill_cold_units(cache, ffn, l, part, part_pairs / M, y, f, M, scratch);
        } else if (hot > 0) {
            ffn_dense_forward(y, scratch, scratch + (size_t)M * hot, f, fl->wg, fl->wu, fl->wdT, M, D, hot,
                              (unsigned long long*)NULL);
        } else {
            ffn_prefill_sparse_layer(cache, ffn, l, y, f, M, scratch);
        }
    };
    char what[96];
    snprintf(what, sizeof(what), "layer %d of a prefill of %d tokens", l, M);
    return ffn_hot_measure(ffn->device, run, pairs, part_pairs, H, M, verbose, what);
}

#endif // LLMC_FFN_HOT_H
