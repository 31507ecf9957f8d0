/*
 The sparse FFN of training on the GPU (llmc/ffn/cuda_ell.cuh), on fresh
 synthetic-sparse inputs (docs/SPARSE.md) at k = 8, 30, 100, 300 uniform and k = 30
 realistic, with ELL width 64 (so the k = 100 and 300 rows and the realistic
 hot rows overflow into the tail), realistic units of thousands of entries
 (weight gradients summed in parts), rows of thousands of entries (tail rows
 that down and df split over streams of threads), odd shapes and M = 70000
 (token indices past 16 bits):
 - the pattern (counts, tail slots, units, g) and the transposed pattern equal
   the CPU reference's (llmc/ffn/ell.h) on the same g, bit for bit;
 - y, l1, df and the three weight gradients equal the dense GPU path's
   (cuBLASLt + llmc/ffn/cuda_dense.cuh) on the same weights and batch within bf16
   tolerance; outputs are poisoned (NaN) before each run, NaN fails;
 - forced overflow: a tail smaller than needed counts every row that asked,
   exactly the rows past it come out NaN, and after growing the tail to the
   count the run matches the dense path: nothing is dropped;
 - two runs give the same bits;
 - down and df against the CPU reference on the GPU's own pattern, row by row,
   with and without lost rows (every column of a lost row NaN);
 - dh and the weight gradients (unit-major, llmc/ffn/cuda_ell.cuh) against
   the CPU reference on the GPU's own pattern, with and without lost rows:
   du, dg at every entry and each unit's gradient rows, outputs poisoned;
 - on Hopper, the fused wgmma gate + pack against cuBLAS g + pack (check_fused_gate),
   with overflow records for every tile, and in memory lent for one: the tiles
   past it lost (NaN at valid units) and reported, then grown and exact;
 - dead-neuron re-initialisation (llmc/ffn/cuda_dense.cuh): only the master rows of
   units that did not fire move, by 0.9 W + 0.1 N(0, 0.02^2), and the bf16
   weights follow them (the noise is Philox here, so it is checked by its mean
   and sd, not against the CPU's bits).
*/
#include <vector>
#include "llmc/ffn/cuda_dense.cuh"
#include "llmc/cuda_matmul.cuh"
#include "llmc/ffn/cuda_ell.cuh"
#include "llmc/synthetic.h"
#include "test/gpu/gpu_util.cuh"
#include "test/test.h"

struct Case {
    int M, D, H, W;
    std::vector<bf16> f, wg, wu, wdT, dy;
    bf16 *d_f, *d_wg, *d_wu, *d_wdT, *d_dy, *d_g, *d_u, *d_h, *d_dh, *d_du, *d_y, *d_df;
    float *d_l1, *d_dwu, *d_dwg, *d_dwdT;
    int* d_active;
    uint8_t* d_fired;
    std::vector<float> grad0; // the value the weight gradients start from
};

static const float l1_scale = 1e-3f;

// the dense GPU FFN, as llmc/gpt.h runs it; results in y, l1, df, dWu, dWg, dWdT
static void dense_ffn(Case* c) {
    int M = c->M, D = c->D, H = c->H;
    gemm(c->d_g, c->d_f, c->d_wg, M, H, D, 0, 1, 0);
    gemm(c->d_u, c->d_f, c->d_wu, M, H, D, 0, 1, 0);
    relu_gate_forward(c->d_h, c->d_l1, c->d_active, c->d_fired, c->d_g, c->d_u, M, H);
    gemm(c->d_y, c->d_h, c->d_wdT, M, D, H, 0, 0, 0);
    gemm(c->d_dh, c->d_dy, c->d_wdT, M, H, D, 0, 1, 0);
    gemm(c->d_dwdT, c->d_h, c->d_dy, H, D, M, 1, 0, 1);
    relu_gate_backward(c->d_dh, c->d_du, c->d_dh, c->d_g, c->d_u, c->d_h, l1_scale, M, H);
    gemm(c->d_df, c->d_du, c->d_wu, M, D, H, 0, 0, 0);
    gemm(c->d_df, c->d_dh, c->d_wg, M, D, H, 0, 0, 1);
    gemm(c->d_dwu, c->d_du, c->d_f, H, D, M, 1, 0, 1);
    gemm(c->d_dwg, c->d_dh, c->d_f, H, D, M, 1, 0, 1);
}

struct Outputs { std::vector<float> y, l1, df, dwu, dwg, dwdT; };

static Outputs download_outputs(const Case* c) {
    size_t MD = (size_t)c->M * c->D, HD = (size_t)c->H * c->D;
    return {to_float(download(c->d_y, MD)), download(c->d_l1, c->M), to_float(download(c->d_df, MD)),
            download(c->d_dwu, HD), download(c->d_dwg, HD), download(c->d_dwdT, HD)};
}

static void reset_grads(Case* c) {
    size_t HD = (size_t)c->H * c->D;
    for (float* p : {c->d_dwu, c->d_dwg, c->d_dwdT}) {
        cudaCheck(cudaMemcpy(p, c->grad0.data(), HD * sizeof(float), cudaMemcpyHostToDevice));
    }
}

// the sparse FFN: pack from the dense g (computed here), then the sparse products
static void sparse_ffn(Case* c, SparsePattern<bf16>* p, SparseTransposed* t, SparseScratch* s, bf16* du, bf16* dg) {
    int M = c->M, D = c->D, H = c->H;
    gemm(c->d_g, c->d_f, c->d_wg, M, H, D, 0, 1, 0);
    sparse_pack(p, c->d_active, c->d_fired, c->d_g, s);
    sparse_up(p, c->d_l1, c->d_f, c->d_wu, D);
    sparse_down(c->d_y, p, c->d_wdT, D);
    sparse_transpose(t, p, s);
    sparse_dh_weight_grads(du, dg, c->d_dwu, c->d_dwg, c->d_dwdT, p, t, c->d_f, c->d_dy, c->d_wdT, l1_scale, D);
    sparse_df(c->d_df, p, du, dg, c->d_wu, c->d_wg, D);
}

// max over x of |got - ref| / (|ref| + floor), floor = 1e-3 of ref's rms (NaN: infinite)
static double worst_rel(const std::vector<float>& got, const std::vector<double>& ref) {
    double rms = 0;
    for (double r : ref) { rms += r * r; }
    double floor = 1e-3 * sqrt(rms / fmax(1.0, (double)ref.size())) + 1e-30, worst = 0;
    for (size_t i = 0; i < got.size(); i++) {
        if (isnan(got[i])) { return INFINITY; }
        worst = fmax(worst, fabs(got[i] - ref[i]) / (fabs(ref[i]) + floor));
    }
    return worst;
}

// the GPU's pattern p as a CPU one (fp32 values) in cp, allocated here: the
// counts, slots and entries, what the CPU products read
static void pattern_to_cpu(SparsePattern<float>* cp, int* cpu_tail_used, const SparsePattern<bf16>* p) {
    const int M = p->M;
    const size_t n = sparse_entries(M, p->H, p->W, p->tail_capacity);
    sparse_pattern_alloc(cp, M, p->H, p->W, p->tail_capacity, cpu_tail_used, DEVICE_CPU);
    std::vector<int> count = download(p->count, M), slot = download(p->tail_slot, M);
    std::vector<uint16_t> unit = download(p->unit, n);
    std::vector<float> g = to_float(download(p->g, n)), u = to_float(download(p->u, n));
    memcpy(cp->count, count.data(), M * sizeof(int));
    memcpy(cp->tail_slot, slot.data(), M * sizeof(int));
    memcpy(cp->unit, unit.data(), n * sizeof(uint16_t));
    memcpy(cp->g, g.data(), n * sizeof(float));
    memcpy(cp->u, u.data(), n * sizeof(float));
}

// down and df on the GPU (got.y, got.df, from sparse_ffn) against the CPU
// reference (sparse_down, sparse_df) on the GPU's pattern, g, u, du, dg and
// the same bf16 weights, row by row: ||got_m - ref_m|| within 1% of ||ref_m||
// plus 1e-3 of the rows' rms norm (the GPU rounds h and the outputs to bf16,
// and sums a tail row's entries by streams); every column of a lost row NaN,
// no NaN in any other row.
static void check_down_df(const Case* c, const SparsePattern<bf16>* p, const bf16* du, const bf16* dg,
                          const Outputs& got, const std::vector<float>& hwdT, const std::vector<float>& hwu,
                          const std::vector<float>& hwg, const char* what) {
    const int M = c->M, D = c->D;
    const size_t n = sparse_entries(M, p->H, p->W, p->tail_capacity);
    int cpu_tail_used = 0;
    SparsePattern<float> cp;
    pattern_to_cpu(&cp, &cpu_tail_used, p);
    std::vector<float> gdu = to_float(download(du, n)), gdg = to_float(download(dg, n));
    std::vector<float> ref_y((size_t)M * D), ref_df((size_t)M * D);
    sparse_down(ref_y.data(), &cp, hwdT.data(), D);
    sparse_df(ref_df.data(), &cp, gdu.data(), gdg.data(), hwu.data(), hwg.data(), D);
    int lost_nan = 1, most = 0;
    double e[2];
    const std::vector<float>* gots[2] = {&got.y, &got.df};
    const std::vector<float>* refs[2] = {&ref_y, &ref_df};
    for (int r = 0; r < 2; r++) {
        std::vector<double> diff(M, 0), norm(M, 0);
        double mean_sq = 0;
        int nan = 0;
        for (int m = 0; m < M; m++) {
            const float *gm = gots[r]->data() + (size_t)m * D, *rm = refs[r]->data() + (size_t)m * D;
            const bool lost = cp.tail_slot[m] == SPARSE_ROW_LOST;
            for (int i = 0; i < D; i++) {
                if (lost) { lost_nan &= isnan(gm[i]); continue; }
                nan |= isnan(gm[i]);
                diff[m] += ((double)gm[i] - rm[i]) * ((double)gm[i] - rm[i]), norm[m] += (double)rm[i] * rm[i];
            }
            mean_sq += norm[m] / M;
            if (!lost) { most = std::max(most, cp.count[m]); }
        }
        e[r] = nan ? INFINITY : 0.0;
        for (int m = 0; m < M; m++) { e[r] = fmax(e[r], sqrt(diff[m]) / (sqrt(norm[m]) + 1e-3 * sqrt(mean_sq) + 1e-30)); }
    }
    CHECK(e[0] < 1e-2 && e[1] < 1e-2, "%s: down, df against the CPU reference: worst row's rel err %.3g, %.3g", what,
          e[0], e[1]);
    CHECK(lost_nan, "%s: down, df: every column of a lost row is NaN", what);
    printf("  down, df against the CPU reference: worst row's rel err y %.2e df %.2e (rows of up to %d entries)\n", e[0],
           e[1], most);
    sparse_pattern_free(&cp, DEVICE_CPU);
}

// dh and the weight gradients on the GPU (sparse_dh_weight_grads, after its
// transpose) against the CPU reference on the same pattern, g and u (the GPU's,
// lost rows included) and the same bf16 inputs (hf, hdy, hwdT): du and dg at
// every stored entry within 1% (bf16 rounding of du, dg and h on the GPU side),
// and each unit's increment of the three gradients within 1% of its norm. du,
// dg and the passes' scratch (dots, part sums) are poisoned first.
static void check_dh_weight_grads(Case* c, const SparsePattern<bf16>* p, SparseTransposed* t, SparseScratch* s, bf16* du,
                                  bf16* dg, const std::vector<float>& hf, const std::vector<float>& hdy,
                                  const std::vector<float>& hwdT, const char* what) {
    const int M = c->M, D = c->D, H = c->H, W = p->W, tail = p->tail_capacity;
    const size_t n = sparse_entries(M, H, W, tail), HD = (size_t)H * D;
    int cpu_tail_used = 0;
    SparsePattern<float> cp;
    pattern_to_cpu(&cp, &cpu_tail_used, p);
    SparseTransposed ct;
    sparse_transposed_alloc(&ct, H, D, n, DEVICE_CPU);
    sparse_transpose(&ct, &cp, (SparseScratch*)NULL);
    std::vector<float> ref_du(n, NAN), ref_dg(n, NAN), ref_dw[3] = {c->grad0, c->grad0, c->grad0};
    sparse_dh_weight_grads(ref_du.data(), ref_dg.data(), ref_dw[0].data(), ref_dw[1].data(), ref_dw[2].data(), &cp, &ct,
                           hf.data(), hdy.data(), hwdT.data(), l1_scale, D);

    reset_grads(c);
    poison(du, n * 2), poison(dg, n * 2);
    poison(t->dots, ceil_div(D, SPARSE_WGRAD_SLICE) * t->capacity * sizeof(float));
    poison(t->part_sums, (size_t)SPARSE_PART_SLOTS * 2 * D * sizeof(float));
    sparse_transpose(t, p, s);
    sparse_dh_weight_grads(du, dg, c->d_dwu, c->d_dwg, c->d_dwdT, p, t, c->d_f, c->d_dy, c->d_wdT, l1_scale, D);
    std::vector<float> got_du = to_float(download(du, n)), got_dg = to_float(download(dg, n));
    std::vector<float> got_dw[3] = {download(c->d_dwu, HD), download(c->d_dwg, HD), download(c->d_dwdT, HD)};

    std::vector<float> du_got, dg_got; // at the stored entries
    std::vector<double> du_ref, dg_ref;
    for (int m = 0; m < M; m++) {
        if (cp.tail_slot[m] == SPARSE_ROW_LOST) { continue; }
        size_t e = sparse_row_base(M, H, W, m, cp.tail_slot[m]);
        for (int j = 0; j < cp.count[m]; j++, e++) {
            du_got.push_back(got_du[e]), dg_got.push_back(got_dg[e]);
            du_ref.push_back(ref_du[e]), dg_ref.push_back(ref_dg[e]);
        }
    }
    double e_du = worst_rel(du_got, du_ref), e_dg = worst_rel(dg_got, dg_ref);
    CHECK(e_du < 1e-2 && e_dg < 1e-2, "%s: du, dg at the %zu entries against the CPU reference: worst rel err %.3g, %.3g",
          what, du_ref.size(), e_du, e_dg);
    const char* names[3] = {"dWu", "dWg", "dWdT"};
    double e_w[3];
    for (int r = 0; r < 3; r++) { // per unit: ||got - ref|| / (||ref|| + a floor), both as increments of grad0
        std::vector<double> norm_ref(H, 0), norm_diff(H, 0);
        double mean = 0;
        int nan = 0;
        for (size_t i = 0; i < HD; i++) {
            double inc_ref = (double)ref_dw[r][i] - c->grad0[i], inc_got = (double)got_dw[r][i] - c->grad0[i];
            nan |= isnan(got_dw[r][i]);
            norm_ref[i / D] += inc_ref * inc_ref, norm_diff[i / D] += (inc_got - inc_ref) * (inc_got - inc_ref);
        }
        for (int j = 0; j < H; j++) { mean += sqrt(norm_ref[j]) / H; }
        e_w[r] = nan ? INFINITY : 0.0;
        for (int j = 0; j < H; j++) { e_w[r] = fmax(e_w[r], sqrt(norm_diff[j]) / (sqrt(norm_ref[j]) + 1e-3 * mean + 1e-30)); }
        CHECK(e_w[r] < 1e-2, "%s: %s against the CPU reference: worst unit's rel err %.3g", what, names[r], e_w[r]);
    }
    printf("  dh + weights against the CPU reference: worst rel err du %.2e dg %.2e, per unit dWu %.2e dWg %.2e dWdT %.2e\n",
           e_du, e_dg, e_w[0], e_w[1], e_w[2]);
    sparse_pattern_free(&cp, DEVICE_CPU);
    sparse_transposed_free(&ct, DEVICE_CPU);
}

static void check_close(const Outputs& got, const Outputs& ref, const char* what) {
    const double tol = 2e-2; // bf16 rounding of u, h, dh, du, dg on either side
    double e[6] = {norm_rel_err(got.y, ref.y), norm_rel_err(got.l1, ref.l1), norm_rel_err(got.df, ref.df),
                   norm_rel_err(got.dwu, ref.dwu), norm_rel_err(got.dwg, ref.dwg), norm_rel_err(got.dwdT, ref.dwdT)};
    const char* names[6] = {"y", "l1", "df", "dWu", "dWg", "dWdT"};
    for (int i = 0; i < 6; i++) { CHECK(e[i] < tol, "%s: %s rel err %.3g", what, names[i], e[i]); }
    printf("  %s: rel err y %.2e l1 %.2e df %.2e dWu %.2e dWg %.2e dWdT %.2e\n", what, e[0], e[1], e[2], e[3], e[4], e[5]);
}

// The fused gate + pack (wgmma, compute capability 9.0) against the pack of
// cuBLAS's g (ref_*): the same pattern except where |g| in fp64 is below 1e-4,
// where two fp32 summation orders may round to different signs (counted); g
// within one bf16 step; units increasing; row_active = count; tail slots in row
// order; fired = the units that have entries; two runs the same bits.
static void check_fused_gate(Case* c, const std::vector<float>& f, const std::vector<float>& wg,
                             const std::vector<int>& ref_count, const std::vector<int>& ref_slot,
                             const std::vector<uint16_t>& ref_unit, const std::vector<float>& ref_g, SparseScratch* s,
                             const char* what) {
    const int M = c->M, D = c->D, H = c->H, W = c->W;
    int* tail_used = (int*)cuda_malloc(sizeof(int));
    SparsePattern<bf16> p;
    sparse_pattern_alloc(&p, M, H, W, M, tail_used, DEVICE_CUDA); // a tail for every row: nothing lost here
    size_t n = sparse_entries(M, H, W, M);
    std::vector<int> count[2], slot[2];
    std::vector<uint16_t> unit[2];
    std::vector<bf16> g[2];
    for (int run = 0; run < 2; run++) {
        poison(p.count, M * 4), poison(p.tail_slot, M * 4), poison(p.unit, n * 2), poison(p.g, n * 2);
        poison(c->d_active, M * 4), poison(c->d_g, (size_t)M * H * 2), poison(tail_used, 4);
        cudaCheck(cudaMemset(c->d_fired, 0, H));
        bool ran = sparse_gate_pack(&p, c->d_active, c->d_fired, c->d_g, c->d_f, c->d_wg, D, s);
        CHECK(ran, "%s: the fused gate ran", what);
        count[run] = download(p.count, M), slot[run] = download(p.tail_slot, M);
        unit[run] = download(p.unit, n), g[run] = download(p.g, n);
    }
    std::vector<int> active = download(c->d_active, M);
    std::vector<uint8_t> fired = download(c->d_fired, H), has_entry(H, 0);
    int used = download(tail_used, 1)[0], next_slot = 0, order_ok = 1, slots_ok = 1, g_ok = 1, differ = 0, ties = 0;
    for (int m = 0; m < M; m++) {
        int want = count[0][m] > W ? next_slot++ : -1;
        slots_ok &= slot[0][m] == want;
        size_t e = sparse_row_base(M, H, W, m, slot[0][m]), r = sparse_row_base(M, H, W, m, ref_slot[m]);
        int i = 0, j = 0, ci = count[0][m], cj = ref_count[m];
        while (i < ci || j < cj) {
            int a = i < ci ? unit[0][e + i] : INT_MAX, b = j < cj ? ref_unit[r + j] : INT_MAX;
            if (i + 1 < ci) { order_ok &= unit[0][e + i + 1] > a; }
            if (a == b) {
                float ga = __bfloat162float(g[0][e + i]), gb = ref_g[r + j];
                g_ok &= ga > 0.0f && fabsf(ga - gb) <= ldexpf(fabsf(gb), -7);
                has_entry[a] = 1, i++, j++;
            } else { // a unit on one side only: its exact g must be a near tie
                int u = a < b ? a : b;
                double exact = 0;
                for (int d = 0; d < D; d++) { exact += (double)f[(size_t)m * D + d] * wg[(size_t)u * D + d]; }
                if (fabs(exact) < 1e-4) { ties++; } else { differ++; }
                if (a < b) { has_entry[a] = 1, i++; } else { j++; }
            }
        }
    }
    CHECK(count[0] == count[1] && slot[0] == slot[1] && unit[0] == unit[1] &&
          memcmp(g[0].data(), g[1].data(), n * 2) == 0, "%s: fused gate, two runs are bit-identical", what);
    CHECK(active == count[0], "%s: fused gate, row_active = count", what);
    CHECK(slots_ok && used == next_slot, "%s: fused gate, tail slots in row order (used %d, %d rows past W)", what, used, next_slot);
    CHECK(order_ok, "%s: fused gate, units in increasing order", what);
    CHECK(g_ok, "%s: fused gate, g within one bf16 step of cuBLAS's", what);
    CHECK(differ == 0, "%s: fused gate, %d entries differ from cuBLAS's pattern away from g = 0", what, differ);
    CHECK(fired == has_entry, "%s: fused gate, fired marks = the units with entries", what);
    printf("  fused gate (wgmma): the same pattern as cuBLAS g + pack, %d entries at near-zero g differ\n", ties);

    // records in memory lent for one (as llmc/ffn/ffn.h lends them): the gate reports the records it asked for,
    // the tiles past the first are lost (each a row's entries NaN at valid units, the other rows exact); with the
    // buffer grown as ffn_overflowed grows it, the pattern of the first run
    const int T = ceil_div(H, TWELL_TILE);
    int want = 0, rows_over = 0;
    std::vector<int> row_over(M, 0);
    for (int m = 0; m < M; m++) {
        std::vector<int> per_tile(T, 0);
        size_t e = sparse_row_base(M, H, W, m, slot[0][m]);
        for (int i = 0; i < count[0][m]; i++) { per_tile[unit[0][e + i] / TWELL_TILE]++; }
        for (int t = 0; t < T; t++) { row_over[m] += per_tile[t] > TWELL_SLOTS; }
        want += row_over[m], rows_over += row_over[m] > 0;
    }
    const size_t lent_bytes = sparse_gate_words_bytes(M, H) + TWELL_TILE * sizeof(uint16_t);
    void* spare = cuda_malloc(lent_bytes);
    int* needed = (int*)cuda_malloc(sizeof(int));
    SparseScratch lent;
    sparse_scratch_alloc_cuda(&lent, M, H, spare, lent_bytes, needed);
    CHECK(lent.record_capacity == 1 && !lent.gate_records_owned && !lent.gate_words_owned,
          "%s: lent memory holds the words and one record (capacity %d)", what, lent.record_capacity);
    for (int grown = 0; grown < 2; grown++) {
        poison(p.count, M * 4), poison(p.unit, n * 2), poison(p.g, n * 2), poison(c->d_active, M * 4);
        cudaCheck(cudaMemset(needed, 0, sizeof(int)));
        sparse_gate_pack(&p, c->d_active, c->d_fired, c->d_g, c->d_f, c->d_wg, D, &lent);
        int asked = download(needed, 1)[0];
        std::vector<int> cnt = download(p.count, M);
        std::vector<uint16_t> un = download(p.unit, n);
        std::vector<bf16> gv = download(p.g, n);
        int units_ok = 1, exact_ok = 1, nan_rows = 0;
        for (int m = 0; m < M; m++) {
            size_t e = sparse_row_base(M, H, W, m, slot[0][m]);
            int nan = 0, same = 1;
            for (int i = 0; i < cnt[m]; i++) {
                units_ok &= un[e + i] < H;
                nan |= isnan(__bfloat162float(gv[e + i]));
                same &= un[e + i] == unit[0][e + i] && memcmp(&gv[e + i], &g[0][e + i], 2) == 0;
            }
            nan_rows += nan;
            exact_ok &= cnt[m] == count[0][m] && (nan || same) && (row_over[m] > 0 || !nan);
        }
        CHECK(asked == want, "%s: lent records (%s): the gate asked for %d records, %d tiles overflow", what,
              grown ? "grown" : "one", asked, want);
        CHECK(units_ok && exact_ok, "%s: lent records (%s): counts exact, rows without a lost tile as before, units < H",
              what, grown ? "grown" : "one");
        if (!grown) {
            CHECK(nan_rows >= rows_over - 1, "%s: lent records: %d rows NaN of the %d with a tile past its slots", what,
                  nan_rows, rows_over);
            sparse_scratch_grow_records(&lent, M, H, asked);
            CHECK(lent.record_capacity >= want && lent.gate_records_owned, "%s: records grown to %d", what,
                  lent.record_capacity);
        } else {
            CHECK(nan_rows == 0, "%s: grown records: no row NaN (%d)", what, nan_rows);
        }
    }
    printf("  fused gate with records lent for one: %d asked, %d rows lost, then grown and exact\n", want, rows_over);
    sparse_scratch_free_cuda(&lent);
    cuda_free(spare);
    cuda_free(needed);
    sparse_pattern_free(&p, DEVICE_CUDA);
    cuda_free(tail_used);
}

// busy: a few rows fire thousands of units (their bias carrier at 0: every unit, a dead one too, fires
// with probability 1/2; at 0.25: a few times more often than the realistic busy rows' 0.5)
static void run_case(int M, int D, int H, int W, double k, int realistic, int busy = 0) {
    Case c;
    c.M = M, c.D = D, c.H = H, c.W = W;
    size_t MD = (size_t)M * D, HD = (size_t)H * D, MH = (size_t)M * H;
    std::vector<float> f(MD), wg(HD), wu(HD), wdT(HD), dy(MD);
    sparse_synthetic_ffn(f.data(), wg.data(), wu.data(), wdT.data(), M, D, H, k, realistic, 1000 + (uint64_t)k);
    if (busy) {
        for (int m : {1, M / 2, M - 1}) { f[(size_t)m * D + D - 1] = 0.0f; }
        f[(size_t)(M / 3) * D + D - 1] = 0.25f;
    }
    uint64_t rng = 99 + (uint64_t)k;
    for (float& x : dy) { x = (float)rng_normal(&rng); }
    c.grad0.resize(HD);
    for (float& x : c.grad0) { x = (float)(0.01 * rng_normal(&rng)); }
    std::vector<float> f_bf16 = to_float(to_bf16(f)), dy_bf16 = to_float(to_bf16(dy)), wdT_bf16 = to_float(to_bf16(wdT));
    std::vector<float> wu_bf16 = to_float(to_bf16(wu)), wg_bf16 = to_float(to_bf16(wg));
    c.d_f = upload(to_bf16(f)), c.d_wg = upload(to_bf16(wg)), c.d_wu = upload(to_bf16(wu));
    c.d_wdT = upload(to_bf16(wdT)), c.d_dy = upload(to_bf16(dy));
    for (bf16** p : {&c.d_g, &c.d_u, &c.d_h, &c.d_dh, &c.d_du}) { *p = (bf16*)cuda_malloc(MH * sizeof(bf16)); }
    c.d_y = (bf16*)cuda_malloc(MD * sizeof(bf16)), c.d_df = (bf16*)cuda_malloc(MD * sizeof(bf16));
    c.d_l1 = (float*)cuda_malloc(M * sizeof(float));
    for (float** p : {&c.d_dwu, &c.d_dwg, &c.d_dwdT}) { *p = (float*)cuda_malloc(HD * sizeof(float)); }
    c.d_active = (int*)cuda_malloc(M * sizeof(int));
    c.d_fired = (uint8_t*)cuda_malloc(H);
    char what[96];
    snprintf(what, sizeof(what), "M %d D %d H %d W %d k %g %s%s", M, D, H, W, k, realistic ? "realistic" : "uniform",
             busy ? ", busy rows" : "");
    printf("%s\n", what);

    // dense reference
    reset_grads(&c);
    poison(c.d_y, MD * 2), poison(c.d_df, MD * 2), poison(c.d_l1, M * 4);
    cudaCheck(cudaMemset(c.d_fired, 0, H));
    dense_ffn(&c);
    Outputs ref = download_outputs(&c);
    std::vector<int> ref_active = download(c.d_active, M);
    std::vector<uint8_t> ref_fired = download(c.d_fired, H);
    std::vector<float> g = to_float(download(c.d_g, MH));
    int needed = 0;
    for (int m = 0; m < M; m++) { needed += ref_active[m] > W; }
    printf("  mean active %.1f, rows past W %d\n", [&] { double s = 0; for (int a : ref_active) { s += a; } return s / M; }(), needed);

    // the CPU reference pattern of the same g
    SparsePattern<float> cp;
    int cap = needed;
    int cpu_tail_used = 0;
    int* tail_used = (int*)cuda_malloc(sizeof(int));
    sparse_pattern_alloc(&cp, M, H, W, cap, &cpu_tail_used, DEVICE_CPU);
    std::vector<int> cpu_active(M);
    sparse_pack(&cp, cpu_active.data(), (uint8_t*)NULL, g.data(), (SparseScratch*)NULL);
    SparseTransposed ct;
    size_t entries = sparse_entries(M, H, W, cap);
    sparse_transposed_alloc(&ct, H, D, entries, DEVICE_CPU);
    sparse_transpose(&ct, &cp, (SparseScratch*)NULL);

    SparseScratch s;
    sparse_scratch_alloc_cuda(&s, M, H);
    // first with a tail too small by half (forced overflow), then with the tail grown to the count
    for (int pass = 0; pass < 2; pass++) {
        int tail = pass == 0 ? needed / 2 : needed;
        if (pass == 0 && needed == 0) { continue; }
        SparsePattern<bf16> p;
        sparse_pattern_alloc(&p, M, H, W, tail, tail_used, DEVICE_CUDA);
        size_t n = sparse_entries(M, H, W, tail);
        SparseTransposed t;
        sparse_transposed_alloc(&t, H, D, n, DEVICE_CUDA);
        bf16* du = (bf16*)cuda_malloc(n * sizeof(bf16) + 16);
        bf16* dg = (bf16*)cuda_malloc(n * sizeof(bf16) + 16);
        reset_grads(&c);
        poison(c.d_y, MD * 2), poison(c.d_df, MD * 2), poison(c.d_l1, M * 4), poison(c.d_active, M * 4);
        cudaCheck(cudaMemset(c.d_fired, 0, H));
        sparse_ffn(&c, &p, &t, &s, du, dg);
        Outputs got = download_outputs(&c);
        int used = download(p.tail_used, 1)[0];
        std::vector<int> slot = download(p.tail_slot, M), count = download(p.count, M);
        std::vector<int> active = download(c.d_active, M);
        CHECK(used == needed, "%s: tail_used %d, rows past W %d", what, used, needed);
        if (pass == 0) {
            int ok = 1, lost = 0;
            for (int m = 0; m < M; m++) {
                int is_lost = slot[m] == SPARSE_ROW_LOST;
                lost += is_lost;
                ok &= isnan(got.y[(size_t)m * D]) == is_lost && isnan(got.l1[m]) == is_lost && isnan(got.df[(size_t)m * D]) == is_lost;
            }
            CHECK(lost == needed - tail, "%s: %d rows lost, expected %d", what, lost, needed - tail);
            CHECK(ok, "%s: exactly the lost rows are NaN", what);
            printf("  forced overflow: tail %d of %d needed, %d rows NaN and counted\n", tail, needed, lost);
            check_down_df(&c, &p, du, dg, got, wdT_bf16, wu_bf16, wg_bf16, what);
            check_dh_weight_grads(&c, &p, &t, &s, du, dg, f_bf16, dy_bf16, wdT_bf16, what);
        } else {
            // the pattern and its transpose equal the CPU reference's
            int same = active == ref_active && active == cpu_active && count == cpu_active;
            for (int m = 0; m < M; m++) { same &= slot[m] == cp.tail_slot[m]; }
            std::vector<uint16_t> unit = download(p.unit, n);
            std::vector<float> pg = to_float(download(p.g, n));
            int entries_same = 1;
            for (int m = 0; m < M; m++) {
                size_t e = sparse_row_base(M, H, W, m, slot[m]);
                for (int j = 0; j < count[m]; j++) { entries_same &= unit[e + j] == cp.unit[e + j] && pg[e + j] == cp.g[e + j]; }
            }
            std::vector<int> tail_row = download(p.tail_row, tail);
            for (int m = 0; m < M; m++) { same &= slot[m] < 0 || tail_row[slot[m]] == m; }
            CHECK(same, "%s: counts, tail slots and their rows equal the CPU reference's", what);
            CHECK(entries_same, "%s: entries equal the CPU reference's", what);
            CHECK(download(c.d_fired, H) == ref_fired, "%s: fired marks", what);
            std::vector<int> us = download(t.unit_start, H + 1);
            int tr_same = memcmp(us.data(), ct.unit_start, (H + 1) * sizeof(int)) == 0;
            if (tr_same) {
                std::vector<int> tok = download(t.token, us[H]), ent = download(t.entry, us[H]);
                tr_same = memcmp(tok.data(), ct.token, us[H] * sizeof(int)) == 0 && memcmp(ent.data(), ct.entry, us[H] * sizeof(int)) == 0;
            }
            CHECK(tr_same, "%s: transposed pattern equals the CPU reference's", what);
            check_close(got, ref, what);
            check_down_df(&c, &p, du, dg, got, wdT_bf16, wu_bf16, wg_bf16, what);
            if (s.gate_words && D % TWELL_D_MULTIPLE == 0) {
                check_fused_gate(&c, f_bf16, wg_bf16, count, slot, unit, pg, &s, what);
            } else {
                printf("  fused gate: not on this GPU or shape (compute capability 9.0 and D %% 64 == 0)\n");
            }
            // determinism
            reset_grads(&c);
            sparse_ffn(&c, &p, &t, &s, du, dg);
            Outputs again = download_outputs(&c);
            CHECK(again.y == got.y && again.df == got.df && again.dwu == got.dwu && again.dwg == got.dwg &&
                  again.dwdT == got.dwdT, "%s: two runs are bit-identical", what);
            check_dh_weight_grads(&c, &p, &t, &s, du, dg, f_bf16, dy_bf16, wdT_bf16, what);
        }
        sparse_pattern_free(&p, DEVICE_CUDA);
        sparse_transposed_free(&t, DEVICE_CUDA);
        cuda_free(du);
        cuda_free(dg);
    }
    sparse_scratch_free_cuda(&s);
    cuda_free(tail_used);
    sparse_pattern_free(&cp, DEVICE_CPU);
    sparse_transposed_free(&ct, DEVICE_CPU);
    for (void* p : {(void*)c.d_f, (void*)c.d_wg, (void*)c.d_wu, (void*)c.d_wdT, (void*)c.d_dy, (void*)c.d_g,
                    (void*)c.d_u, (void*)c.d_h, (void*)c.d_dh, (void*)c.d_du, (void*)c.d_y, (void*)c.d_df,
                    (void*)c.d_l1, (void*)c.d_dwu, (void*)c.d_dwg, (void*)c.d_dwdT, (void*)c.d_active, (void*)c.d_fired}) {
        cuda_free(p);
    }
}

static void test_dead_reinit(void) {
    const int rows = 512, D = 512;
    uint64_t rng = 77;
    std::vector<float> w((size_t)rows * D);
    for (float& x : w) { x = (float)(0.02 * rng_normal(&rng)); }
    std::vector<uint8_t> fired(rows);
    for (int j = 0; j < rows; j++) { fired[j] = j % 3 != 0; }
    float* master = upload(w);
    bf16* wb = upload(to_bf16(w));
    uint8_t* d_fired = upload(fired);
    gate_dead_reinit(wb, master, d_fired, rows, D, 123);
    std::vector<float> after = download(master, w.size()), after_bf16 = to_float(download(wb, w.size()));
    int kept = 1, follows = 1;
    double sum = 0, sq = 0;
    long n = 0;
    for (int j = 0; j < rows; j++) {
        for (int i = 0; i < D; i++) {
            size_t idx = (size_t)j * D + i;
            follows &= after_bf16[idx] == __bfloat162float(__float2bfloat16(after[idx]));
            if (fired[j]) { kept &= after[idx] == w[idx]; continue; }
            double noise = after[idx] - 0.9 * w[idx];
            sum += noise, sq += noise * noise, n++;
        }
    }
    double mean = sum / n, sd = sqrt(sq / n - mean * mean);
    CHECK(kept, "dead reinit: rows that fired are unchanged");
    CHECK(follows, "dead reinit: the bf16 weights are the rounded master weights");
    CHECK(fabs(mean) < 1e-4 && fabs(sd - 0.002) < 1e-4, "dead reinit: noise mean %g sd %g (expected 0, 0.002)", mean, sd);
    printf("dead reinit: noise mean %.2e sd %.5f on %ld elements\n", mean, sd, n);
    cuda_free(master);
    cuda_free(wb);
    cuda_free(d_fired);
}

int main(void) {
    const int M = 2048, D = 512, H = 1408, W = 64;
    for (double k : {8.0, 30.0, 100.0, 300.0}) { run_case(M, D, H, W, k, 0); }
    run_case(M, D, H, W, 30, 1);
    run_case(1024, 256, 1024, 32, 300, 0); // the fused gate's records, every tile one
    run_case(8192, 256, 512, 64, 30, 1); // units of thousands of entries: weight gradients by parts, in slots or whole
    run_case(2048, 1024, 4096, 64, 30, 1, 1); // rows of ~700 to ~2000 entries: down and df by up to 16 streams
    run_case(1000, 200, 96, 16, 6, 1); // shapes not multiples of the tiles (D/8 = 25 threads)
    run_case(1001, 128, 512, 32, 300, 0); // the fused gate's words of an odd row count: records lent after them aligned
    run_case(70000, 64, 64, 8, 4, 1);  // token indices past 16 bits
    test_dead_reinit();
    cublaslt_free();
    return test_summary("test_sparse_ffn (GPU)");
}
