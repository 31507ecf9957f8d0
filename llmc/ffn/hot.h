/*
 The hot set of a sparse FFN layer (llmc/ffn/split.h): which of its units run
 as dense GEMMs, and everything that decides and applies that, for training
 and for the prefill of inference alike.

 A unit that fires for a share p of the tokens costs the sparse part p
 gathered pairs per token and the dense part a fixed amount per token. With
 the costs of the running device (FfnCosts, in seconds per token),
     time(h hot units) = dense0 + (dense1 - gate1) h + pair1 * (pairs per token of the cold units)
 (h > 0; with h = 0 only the last term), and the hot set is the number h of
 busiest units, a multiple of FFN_HOT_ALIGN (llmc/ffn/policy.h), with the
 least time. The policy says where the costs come from:
     FFN_HOT_OFF       no hot units
     FFN_HOT_RATE      the units firing for more than a share `rate` of the tokens: the cost model with a
                       hot unit costing `rate` pairs per token and nothing else
     FFN_HOT_MEASURED  the costs timed on the running device (ffn_hot_measure), once per run
 Training and the prefill's calibration both measure with ffn_hot_measure,
 each passing what running its layer with h hot units means. Applying a new
 set reorders the layer's units in its weights (the rows of Wg, Wu and WdT
 together: the same function); whoever keeps other copies of those rows (the
 optimizer's master weights and moments) follows through FfnHotHooks.
*/
#ifndef LLMC_FFN_HOT_H
#define LLMC_FFN_HOT_H

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

typedef struct {
    float dense0, dense1, gate1, pair1;
} FfnCosts;

typedef enum { FFN_HOT_OFF = 0, FFN_HOT_RATE = 1, FFN_HOT_MEASURED = 2 } FfnHotMode;

typedef struct {
    int mode;       // FfnHotMode
    float rate;     // FFN_HOT_RATE
    int measured;   // FFN_HOT_MEASURED: costs holds the measured costs
    FfnCosts costs;
} FfnHotPolicy;

static inline FfnHotPolicy ffn_hot_policy(int mode, float rate) {
    FfnHotPolicy p = {mode, rate, 0, {0.0f, 0.0f, 0.0f, 0.0f}};
    return p;
}

// the costs a choice is made with (measured: 0 until they are)
static inline FfnCosts ffn_hot_model(const FfnHotPolicy* p) {
    if (p->mode == FFN_HOT_RATE) { return (FfnCosts){0.0f, p->rate, 0.0f, 1.0f}; }
    if (p->mode == FFN_HOT_MEASURED && p->measured) { return p->costs; }
    return (FfnCosts){0.0f, 0.0f, 0.0f, 0.0f};
}

// whether hot sets are chosen now (off, or measured costs not yet taken: no)
static inline int ffn_hot_active(const FfnHotPolicy* p) {
    return p->mode == FFN_HOT_RATE || (p->mode == FFN_HOT_MEASURED && p->measured);
}

// the policy as the 4 floats a checkpoint keeps (llmc/model.h): off all 0, a rate (0, rate, 0, 1), measured
// costs as they are, costs still to measure (0, -1, 0, 0); and back (a corrupt value is fatal, naming source)
static inline void ffn_hot_policy_pack(float out[4], const FfnHotPolicy* p) {
    FfnCosts c = p->mode == FFN_HOT_MEASURED && !p->measured ? (FfnCosts){0.0f, -1.0f, 0.0f, 0.0f} : ffn_hot_model(p);
    out[0] = c.dense0, out[1] = c.dense1, out[2] = c.gate1, out[3] = c.pair1;
}

static inline FfnHotPolicy ffn_hot_policy_unpack(const float in[4], const char* source) {
    for (int i = 0; i < 4; i++) {
        if (!isfinite(in[i]) || in[i] < -1 || in[i] > 1) { fatal("%s: hot/cold cost %g is corrupt", source, in[i]); }
    }
    if (in[0] == 0 && in[1] == 0 && in[2] == 0 && in[3] == 0) { return ffn_hot_policy(FFN_HOT_OFF, 0); }
    if (in[0] == 0 && in[2] == 0 && in[3] == 1 && in[1] > 0) { return ffn_hot_policy(FFN_HOT_RATE, in[1]); }
    FfnHotPolicy p = ffn_hot_policy(FFN_HOT_MEASURED, 0);
    if (in[1] >= 0) { p.measured = 1, p.costs = (FfnCosts){in[0], in[1], in[2], in[3]}; }
    return p;
}

// the policy in words, for the log
static inline void ffn_hot_policy_describe(char* out, size_t n, const FfnHotPolicy* p) {
    if (p->mode == FFN_HOT_OFF) { snprintf(out, n, "none"); }
    else if (p->mode == FFN_HOT_RATE) {
        snprintf(out, n, "a sparse layer's units firing for more than %.3f%% of the tokens run dense", 100 * p->rate);
    } else if (!p->measured) { snprintf(out, n, "their costs are measured after the first sparse step"); }
    else {
        snprintf(out, n, "as the measured costs say (per token: the dense part %.3g s + %.3g s per unit, a cold "
                 "unit's gate %.3g s, a cold pair %.3g s)", p->costs.dense0, p->costs.dense1, p->costs.gate1,
                 p->costs.pair1);
    }
}

// the modelled time per token of a layer with h hot units whose cold units fire for cold_rate pairs per token
static inline double ffn_split_time(const FfnCosts* c, int h, double cold_rate) {
    return (h > 0 ? c->dense0 + ((double)c->dense1 - c->gate1) * h : 0.0) + c->pair1 * cold_rate;
}

// The hot set of a layer of H units whose first `hot` are hot now, from each
// unit's count over `tokens` tokens: the busiest h units, h the multiple of
// FFN_HOT_ALIGN (or H) with the least modelled time. Returns -1 when the hot
// set stays (no better one saves FFN_HOT_MARGIN of the layer's time with its
// gate), else the new number of hot units with perm[i] = the unit (in today's
// order) that goes to position i: the hot units by decreasing count, then the
// cold ones in today's order.
static inline int ffn_hot_choose(int* perm, const uint32_t* count, int H, int hot, double tokens,
                                 const FfnHotPolicy* policy) {
    const FfnCosts model = ffn_hot_model(policy), *c = &model;
    for (int n = 0; n < H; n++) { perm[n] = n; }
    std::stable_sort(perm, perm + H, [&](int x, int y) { return count[x] > count[y]; });
    double total = 0, cold_now = 0;
    for (int n = 0; n < H; n++) {
        total += count[n];
        cold_now += n >= hot ? count[n] : 0;
    }
    int best = 0;
    double best_time = ffn_split_time(c, 0, total / tokens), hot_count = 0;
    for (int h = 0, i = 0; h < H;) {
        h = std::min(h + FFN_HOT_ALIGN, H);
        for (; i < h; i++) { hot_count += count[perm[i]]; }
        double t = ffn_split_time(c, h, (total - hot_count) / tokens);
        if (t < best_time) { best_time = t, best = h; }
    }
    double now = ffn_split_time(c, hot, cold_now / tokens);
    if (now - best_time <= FFN_HOT_MARGIN * (now + (double)c->gate1 * H)) { return -1; }
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
// the layer all sparse over `pairs` (token, unit) pairs. The dense part's time
// is a constant and a slope in its units (small sets use the tensor cores less
// well); the sparse part's beyond its gate is per pair.
static inline FfnCosts ffn_costs(double dense_small, int small, double dense_large, int large, double gate,
                                 double sparse, double pairs, int H, int M) {
    FfnCosts c;
    double slope = (dense_large - dense_small) / (large - small), base = dense_small - slope * small;
    if (slope <= 0 || base < 0) { slope = dense_large / large, base = 0; } // (noise: the larger set's mean)
    c.dense0 = (float)(base / M);
    c.dense1 = (float)(slope / M);
    c.gate1 = (float)(gate / ((double)H * M));
    c.pair1 = (float)(fmax(sparse - gate, 0.0) / fmax(pairs, 1.0));
    return c;
}

// run(FFN_RUN_GATE): the gate of the layer's sparse part alone
#define FFN_RUN_GATE (-1)

// The costs of a layer of H units over M tokens that fire `pairs` (token,
// unit) pairs, from timed runs of run(h) on `device`: h > 0 the layer's dense
// part alone over its first h units (FFN_HOT_PROBE and four times as many),
// h = 0 the layer all sparse, h = FFN_RUN_GATE the sparse part's gate alone
// (ffn_costs). `what` (verbose) names the run in the log line.
template <typename F>
FfnCosts ffn_hot_measure(Device device, F run, double pairs, int H, int M, int verbose, const char* what) {
    int large = H < 4 * FFN_HOT_PROBE ? H : 4 * FFN_HOT_PROBE, small = large / 4 > 0 ? large / 4 : 1;
    double dense_small = ffn_time(device, [&] { run(small); });
    double dense_large = ffn_time(device, [&] { run(large); });
    double gate = ffn_time(device, [&] { run(FFN_RUN_GATE); });
    double sparse = ffn_time(device, [&] { run(0); });
    if (verbose) {
        printf("ffn: hot units: costs measured on %s: the dense part over %d / %d units %.3f / %.3f ms, the layer "
               "all sparse %.3f ms (its gate %.3f) at %.1f pairs per token\n", what, small, large, 1e3 * dense_small,
               1e3 * dense_large, 1e3 * sparse, 1e3 * gate, pairs / M);
    }
    return ffn_costs(dense_small, small, dense_large, large, gate, sparse, pairs, H, M);
}

// ----------------------------------------------------------------------------
// applying a hot set

// Whoever keeps copies of an FFN's weights or needs to know of its hot sets
// (NULL members: nothing to do). weights_needed(ctx, l): before layer l's
// weights are read or moved (data parallelism may still be gathering them);
// units_permuted(ctx, l, perm): layer l's units were reordered, perm on the
// device (perm[i] = the unit that went to i), so reorder your copies the same
// way; costs_measured(ctx, costs): the costs this process measured, to agree
// on (every process must choose the same sets).
typedef struct {
    void (*weights_needed)(void* ctx, int layer);
    void (*units_permuted)(void* ctx, int layer, const int* perm);
    void (*costs_measured)(void* ctx, FfnCosts* costs);
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

// Every layer's hot set from each unit's firing count [L, H] over `tokens`
// tokens under `policy` (only_on: the layers running sparse only): a layer
// whose set changes has its units permuted (llmc/ffn/hot.h). Logs each change
// when verbose.
template <typename T>
void ffn_hot_rechoose(Ffn<T>* ffn, const uint32_t* count, double tokens, const FfnHotPolicy* policy, int only_on,
                      int verbose) {
    const int H = ffn->H;
    std::vector<int> perm(H);
    for (int l = 0; l < ffn->L; l++) {
        FfnLayer<T>* f = &ffn->layer[l];
        if (only_on && !f->on) { continue; }
        const uint32_t* c = count + (size_t)l * H;
        int units = ffn_hot_choose(perm.data(), c, H, f->hot_units, tokens, policy);
        if (units < 0) { continue; }
        ffn_hot_permute(f->wg, f->wu, f->wdT, l, perm.data(), H, ffn->D, &ffn->hooks, ffn->device);
        if (verbose) {
            int joined = 0;
            for (int n = 0; n < units; n++) { joined += perm[n] >= f->hot_units; }
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
// sparse layer l (no hot units yet) with the last step's inputs
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
    int large = H < 4 * FFN_HOT_PROBE ? H : 4 * FFN_HOT_PROBE;
    T* probe = (T*)device_malloc(ffn_hot_scratch_elems(M, large) * sizeof(T), ffn->device);
    auto run = [&](int hot) {
        if (hot == FFN_RUN_GATE) {
            ffn_cold_gate(&f->p, b->row_active, fired, ffn->g, b->f, f->wg, D, &ffn->sparse_scratch);
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
    std::vector<int> active(M);
    device_copy(active.data(), b->row_active, M * sizeof(int), ffn->device); // (the last forward's)
    double pairs = 0;
    for (int m = 0; m < M; m++) { pairs += active[m]; }
    char what[64];
    snprintf(what, sizeof(what), "layer %d", l);
    FfnCosts costs = ffn_hot_measure(ffn->device, run, pairs, H, M, verbose, what);
    device_free(probe, ffn->device);
    device_free(fired, ffn->device);
    device_free(count, ffn->device);
    return costs;
}

// The hot sets after training step `step` of `tokens` tokens, from each
// unit's firing count [L, H]: measured costs are taken once, on the first
// sparse layer with no hot units (probe(l) gives its buffers) and agreed on
// through the hooks; then every FFN_HOT_EVERY steps every sparse layer's hot
// set is re-chosen, and a layer whose set changes has its units permuted (the
// choice depends on the step's number, not on when a run started, so a
// resumed run makes the same ones). Logs the costs and each change when
// verbose.
template <typename T, typename F>
void ffn_hot_update(Ffn<T>* ffn, int step, double tokens, const uint32_t* count, F probe, int verbose) {
    const int L = ffn->L;
    FfnHotPolicy* policy = &ffn->hot;
    if (policy->mode == FFN_HOT_MEASURED && !policy->measured) {
        int l = 0;
        while (l < L && !(ffn->layer[l].on && ffn->layer[l].hot_units == 0 && ffn->layer[l].p.M > 0)) { l++; }
        if (l == L) { return; } // measured once a layer has run sparse
        auto b = probe(l);
        policy->costs = ffn_hot_costs(ffn, l, &b, verbose);
        if (ffn->hooks.costs_measured) { ffn->hooks.costs_measured(ffn->hooks.ctx, &policy->costs); }
        policy->measured = 1;
    }
    if (!ffn_hot_active(policy) || step % FFN_HOT_EVERY != 0) { return; }
    ffn_hot_rechoose(ffn, count, tokens, policy, 1, verbose);
}

// count [H] += how often each of layer l's units fires over the M rows of f (g into scratch [M, H])
template <typename T>
void ffn_count_firing(const Ffn<T>* ffn, int l, uint32_t* count, const T* f, int M, T* scratch) {
    gemm(scratch, f, ffn->layer[l].wg, M, ffn->H, ffn->D, 0, 1, 0);
    unit_count_add(count, scratch, M, ffn->H);
}

// the costs of a prefill, measured on layer l's
// input f [M, D] with `pairs` firing pairs: the dense FFN over the first
// units, the sparse path over all of them, its gate alone; y, scratch: [M, D],
// [M, 2H]
template <typename T>
FfnCosts ffn_prefill_costs(FfnCache<T>* cache, Ffn<T>* ffn, int l, T* y, const T* f, int M, double pairs, T* scratch,
                           int verbose) {
    const FfnLayer<T>* fl = &ffn->layer[l];
    const int D = ffn->D, H = ffn->H;
    auto run = [&](int hot) {
        if (hot == FFN_RUN_GATE) {
            gemm(scratch, f, fl->wg, M, H, D, 0, 1, 0);
        } else if (hot > 0) {
            ffn_dense_forward(y, scratch, scratch + (size_t)M * hot, f, fl->wg, fl->wu, fl->wdT, M, D, hot,
                              (unsigned long long*)NULL);
        } else {
            ffn_prefill_sparse_layer(cache, ffn, l, y, f, M, scratch);
        }
    };
    char what[96];
    snprintf(what, sizeof(what), "layer %d of a prefill of %d tokens", l, M);
    return ffn_hot_measure(ffn->device, run, pairs, H, M, verbose, what);
}

#endif // LLMC_FFN_HOT_H
