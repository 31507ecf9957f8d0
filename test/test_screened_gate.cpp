/*
 Checks of the screened gate's CPU reference (llmc/ffn/screened_gate.h):
 - the int8 copy, group by group, on adversarial rows (Gaussian, one weight
   1000x the rest, two such in different groups, all equal, weights on the
   half steps, bf16 subnormals, zero rows and groups, the largest bf16,
   NaN and inf, and rows on the int8 grid but for their outlier, where the
   quantisation error is 0 and U - G is the rounding term alone) at D 16,
   336 (a short last group), 2048 and 4096:
   127 s >= max|w'| and the bf16 below s is not, q in [-127, 127], the outlier
   is the first largest finite |w| and its q is 0, |e_i| <= s (1/2 + 2^-17),
   E >= ||e||_2 (long double) and within a bf16 step above it;
 - the bound: U >= G (the GEMV's fp32 sum, emulated) and U >= f . w (exact:
   bf16 products in double, compensated sum) for every pair of those rows
   and of f rows that are Gaussian, with a few entries 100x the rest, with a
   bias carrier, bf16 subnormals, zero, and 1e30; f aligned with the
   quantisation error (f_i = e_i / s, where Cauchy-Schwarz is tight, and
   sign(e_i), where the step bound is tight on half-step rows): with f = e / s
   the true f . e reaches 99% of the error term, so the test is sharp (a
   bound short of it by 1% would fail U >= G); non-finite inputs always a
   candidate;
 - the screened gate's fired set and G against the GEMV's on random gates
   (half fire), the synthetic-sparse ones of docs/SPARSE.md (uniform and
   realistic k = 30), units put right at the threshold (G = a bf16 rounding
   error, either sign), and f with outliers, for 1 to 8 rows.
*/
#include <vector>
#include "llmc/rng.h"
#include "llmc/ffn/screened_gate.h"
#include "llmc/ffn/ell.h"
#include "llmc/synthetic.h"
#include "llmc/ffn/twell.h"
#include "test/screened_gate_rows.h"
#include "test/test.h"

static uint64_t rng = 24;

// the quantiser, group by group, on every row kind
static void test_quantize(int D) {
    const int rows = 4 * ROW_KINDS;
    std::vector<uint16_t> w((size_t)rows * D);
    for (int n = 0; n < rows; n++) { make_row(&w[(size_t)n * D], D, n % ROW_KINDS, &rng); }
    ScreenedGate sg = screen_gate_create(rows, D, DEVICE_CPU);
    screen_quantize(&sg, w.data());
    int bad_scale = 0, bad_q = 0, bad_outlier = 0, bad_e = 0, bad_norm = 0, loose_norm = 0, bad_special = 0;
    for (int n = 0; n < rows; n++) {
        const uint16_t* row = &w[(size_t)n * D];
        int c = 0;
        float best = -1.0f;
        for (int i = 0; i < D; i++) {
            const float v = fabsf(float_from_bf16(row[i]));
            if (isfinite(v) && v > best) { best = v; c = i; }
        }
        const int col = (int)(sg.outlier[n] & 0xffff);
        bad_outlier += col != c || (sg.outlier[n] >> 16) != row[c] || sg.q[(size_t)n * D + c] != 128;
        for (int g = 0; g < sg.groups; g++) {
            const int begin = g * SCREEN_GROUP, end = begin + SCREEN_GROUP < D ? begin + SCREEN_GROUP : D;
            const uint32_t word = sg.scales[(size_t)n * sg.groups + g];
            const float s = float_from_bf16((uint16_t)word), E = float_from_bf16((uint16_t)(word >> 16));
            float absmax = 0.0f;
            bool finite = true;
            for (int i = begin; i < end; i++) {
                const float v = i == c ? 0.0f : float_from_bf16(row[i]);
                finite = finite && isfinite(v);
                absmax = fmaxf(absmax, fabsf(v));
            }
            if (!finite) { bad_special += !(s == INFINITY && E == INFINITY); continue; }
            if (absmax == 0.0f) { bad_special += !(s == 0.0f && E == 0.0f); continue; }
            // the smallest bf16 step that holds the group (127 s is exact in float)
            bad_scale += !(127.0f * s >= absmax) || !(127.0f * float_from_bf16((uint16_t)((uint16_t)word - 1)) < absmax);
            long double ss = 0;
            for (int i = begin; i < end; i++) {
                const int q = (int)sg.q[(size_t)n * D + i] - 128;
                bad_q += q < -127 || q > 127;
                const double v = i == c ? 0.0 : float_from_bf16(row[i]), e = v - (double)q * s;
                bad_e += !(fabs(e) <= s * (0.5 + 0x1p-17));
                ss += (long double)e * e;
            }
            const long double norm = sqrtl(ss);
            bad_norm += !((long double)E >= norm);
            loose_norm += !((long double)E <= norm * (1 + 0x1p-7L) + 1e-45L);
        }
    }
    CHECK(bad_outlier == 0, "D %d: %d rows with a wrong outlier", D, bad_outlier);
    CHECK(bad_special == 0, "D %d: %d zero or non-finite groups without s = E = 0 / inf", D, bad_special);
    CHECK(bad_scale == 0, "D %d: %d groups whose s is not the smallest bf16 with 127 s >= max|w|", D, bad_scale);
    CHECK(bad_q == 0, "D %d: %d q outside [-127, 127]", D, bad_q);
    CHECK(bad_e == 0, "D %d: %d errors past s (1/2 + 2^-17)", D, bad_e);
    CHECK(bad_norm == 0, "D %d: %d groups with E below ||e||", D, bad_norm);
    CHECK(loose_norm == 0, "D %d: %d groups with E more than a bf16 step above ||e||", D, loose_norm);
    printf("  int8 copy, D %4d: %d rows of %d kinds checked group by group\n", D, rows, ROW_KINDS);
    screen_gate_free(&sg, DEVICE_CPU);
}

// f . w exactly (the bf16 products are exact in double; a compensated sum), and sum |f_i w_i|
static double exact_dot(const float* f, const uint16_t* w, int D, double* abs_sum) {
    double sum = 0, comp = 0;
    *abs_sum = 0;
    for (int i = 0; i < D; i++) {
        const double p = (double)f[i] * float_from_bf16(w[i]), t = sum + p;
        comp += fabs(sum) >= fabs(p) ? (sum - t) + p : (p - t) + sum;
        sum = t;
        *abs_sum += fabs(p);
    }
    return sum + comp;
}

enum FKind { F_GAUSS, F_OUTLIERS, F_CARRIER, F_SUBNORMAL, F_ZERO, F_HUGE, F_ALIGNED, F_KINDS };
static const char* f_names[F_KINDS] = {"gaussian", "outliers", "carrier", "subnormal", "zero", "1e30", "aligned"};

// a row f of the kind (bf16 values); F_ALIGNED follows the quantisation error e of row n of sg: f_i = e_i / s
// (Cauchy-Schwarz tight; returns true) or sign(e_i) (the step bound tight on half-step rows)
static bool make_f(float* f, int D, int kind, const ScreenedGate* sg, int n, const uint16_t* w) {
    for (int i = 0; i < D; i++) { f[i] = round_bf16((float)rng_normal(&rng)); }
    if (kind == F_OUTLIERS) {
        for (int j = 0; j < 3; j++) { f[rng_below(&rng, D)] = round_bf16(100.0f * (float)rng_normal(&rng)); }
    } else if (kind == F_CARRIER) {
        f[D - 1] = 1.0f;
    } else if (kind == F_SUBNORMAL) {
        for (int i = 0; i < D; i++) { f[i] = round_bf16(1e-39f * (float)rng_normal(&rng)); }
    } else if (kind == F_ZERO) {
        for (int i = 0; i < D; i++) { f[i] = 0.0f; }
    } else if (kind == F_HUGE) {
        for (int i = 0; i < D; i++) { f[i] = round_bf16(1e30f * (float)rng_normal(&rng)); }
    } else if (kind == F_ALIGNED) {
        const int c = (int)(sg->outlier[n] & 0xffff);
        const bool signs = rng_below(&rng, 2);
        for (int i = 0; i < D; i++) {
            const float s = float_from_bf16((uint16_t)sg->scales[(size_t)n * sg->groups + i / SCREEN_GROUP]);
            const double v = i == c ? 0.0 : float_from_bf16(w[i]);
            const double e = s > 0 && isfinite(s) ? v / s - ((int)sg->q[(size_t)n * D + i] - 128) : 0.0;
            f[i] = round_bf16((float)(signs ? (e > 0) - (e < 0) : e));
        }
        return !signs;
    }
    return false;
}

// U against G and the exact f . w for every row kind, f kind and width
static void test_bound(int D, int seeds) {
    const int H = ROW_KINDS;
    std::vector<uint16_t> w((size_t)H * D);
    std::vector<float> f(D), n1(SCREEN_MAX_GROUPS), n2(SCREEN_MAX_GROUPS);
    ScreenedGate sg = screen_gate_create(H, D, DEVICE_CPU);
    long pairs = 0, below_g = 0, nonfinite_missed = 0, tight_pairs = 0;
    char first[64] = "";
    double least_tight = INFINITY;
    for (int seed = 0; seed < seeds; seed++) {
        for (int n = 0; n < H; n++) { make_row(&w[(size_t)n * D], D, n, &rng); }
        screen_quantize(&sg, w.data());
        for (int fk = 0; fk < F_KINDS; fk++) {
            for (int n = 0; n < H; n++) {
                const uint16_t* row = &w[(size_t)n * D];
                const bool cauchy_schwarz = make_f(f.data(), D, fk, &sg, n, row);
                screen_group_norms(n1.data(), n2.data(), f.data(), D);
                const float U = screen_upper_bound(&sg, n, f.data(), n1.data(), n2.data());
                const float G = screen_gemv_dot(f.data(), row, D);
                double abs_sum;
                const double exact = exact_dot(f.data(), row, D, &abs_sum);
                pairs++;
                if (!isfinite(exact) || !isfinite(abs_sum) || !isfinite(G)) { // non-finite inputs or overflow
                    nonfinite_missed += U <= 0.0f;
                    continue;
                }
                // (a NaN U, from lanes at +inf and -inf past the overflow guard, is a candidate too)
                const bool below = U < G || (double)U < exact - 1e-12 * abs_sum;
                if (below && !below_g) { snprintf(first, sizeof(first), "row %s, f %s", row_names[n], f_names[fk]); }
                below_g += below;
                // f = e / s, on rows whose steps are not bf16 subnormals: f . e should reach the error term
                if (cauchy_schwarz && (n <= ROW_HALF_STEPS)) {
                    double q = 0, fe = 0, comp = 0;
                    const int c = (int)(sg.outlier[n] & 0xffff);
                    for (int g = 0; g < sg.groups; g++) {
                        const uint32_t word = sg.scales[(size_t)n * sg.groups + g];
                        const double s = float_from_bf16((uint16_t)word), E = float_from_bf16((uint16_t)(word >> 16));
                        q += fmin(n1[g] * 0.5 * s, n2[g] * E);
                    }
                    for (int i = 0; i < D; i++) { // f_i e_i, exact in double
                        const double s = float_from_bf16((uint16_t)sg.scales[(size_t)n * sg.groups + i / SCREEN_GROUP]);
                        const double v = i == c ? 0.0 : float_from_bf16(row[i]);
                        const double p = f[i] * (v - s * ((int)sg.q[(size_t)n * D + i] - 128)), t = fe + p;
                        comp += fabs(fe) >= fabs(p) ? (fe - t) + p : (p - t) + fe;
                        fe = t;
                    }
                    least_tight = fmin(least_tight, (fe + comp) / q);
                    tight_pairs++;
                }
            }
        }
    }
    CHECK(below_g == 0, "D %d: U < G or U < f . w in %ld of %ld pairs (first: %s)", D, below_g, pairs, first);
    CHECK(nonfinite_missed == 0, "D %d: %ld non-finite pairs not candidates", D, nonfinite_missed);
    CHECK(tight_pairs > 0 && least_tight > 0.99, "D %d: f . e reached only %.4f of the error term", D, least_tight);
    printf("  bound, D %4d: %ld (row, f) pairs: U >= G and U >= f.w; f = e / s: f . e >= %.4f of the error term\n",
           D, pairs, least_tight);
    screen_gate_free(&sg, DEVICE_CPU);
}

// the screened gate against the GEMV's gate: the same fired set, the same G where recomputed
static void check_gate(const char* what, const std::vector<uint16_t>& wg, const std::vector<float>& f, int B, int H,
                       int D) {
    ScreenedGate sg = screen_gate_create(H, D, DEVICE_CPU);
    screen_quantize(&sg, wg.data());
    std::vector<float> G((size_t)B * H);
    std::vector<int> candidates(B + 1);
    screen_gate_reference(G.data(), candidates.data(), &sg, wg.data(), f.data(), B);
    long fired = 0, missed = 0, wrong = 0;
    for (int b = 0; b < B; b++) {
        for (int n = 0; n < H; n++) {
            const float exact = screen_gemv_dot(&f[(size_t)b * D], &wg[(size_t)n * D], D), g = G[(size_t)b * H + n];
            const bool fires = float_from_bf16(bf16_from_float(exact)) > 0;
            fired += fires;
            missed += fires != (float_from_bf16(bf16_from_float(g)) > 0);
            wrong += g != 0.0f && memcmp(&g, &exact, sizeof(g)) != 0;
        }
    }
    double cand = 0;
    for (int b = 0; b < B; b++) { cand += (double)candidates[b] / B; }
    CHECK(missed == 0 && wrong == 0, "%s B %d: %ld fired-set differences, %ld wrong G", what, B, missed, wrong);
    printf("  screened gate %-22s B %d: %6.1f fire, %7.1f candidates a row, %5d units recomputed of %d\n", what, B,
           (double)fired / B, cand, candidates[B], H);
    screen_gate_free(&sg, DEVICE_CPU);
}

static void test_gate(int B, int H, int D, uint64_t seed) {
    rng = seed;
    std::vector<float> f((size_t)B * D), wgf((size_t)H * D), wu((size_t)H * D), wd((size_t)H * D);
    std::vector<uint16_t> wg((size_t)H * D);
    auto to_bf16 = [&]() {
        for (size_t i = 0; i < wg.size(); i++) { wg[i] = bf16_from_float(wgf[i]); }
        for (float& x : f) { x = round_bf16(x); }
    };
    // random: about half the units fire
    for (float& x : f) { x = (float)rng_normal(&rng); }
    for (float& x : wgf) { x = (float)(rng_normal(&rng) / sqrt((double)D)); }
    to_bf16();
    check_gate("random", wg, f, B, H, D);
    // synthetic sparse, uniform and realistic (docs/SPARSE.md)
    for (int realistic = 0; realistic < 2; realistic++) {
        sparse_synthetic_ffn(f.data(), wgf.data(), wu.data(), wd.data(), B, D, H, 30.0 * H / 5632, realistic, seed + realistic);
        to_bf16();
        check_gate(realistic ? "synthetic realistic" : "synthetic uniform", wg, f, B, H, D);
    }
    // at the threshold: a carrier f[D-1] = 1 and w[D-1] = bf16(-G of the rest), so G is a rounding error of
    // either sign; rows share f, so row 0 sets the carriers and the other rows see f with outliers
    for (float& x : f) { x = (float)rng_normal(&rng); }
    for (int b = 1; b < B; b++) {
        for (int j = 0; j < 3; j++) { f[(size_t)b * D + rng_below(&rng, D - 1)] = 100.0f * (float)rng_normal(&rng); }
    }
    for (int b = 0; b < B; b++) { f[(size_t)b * D + D - 1] = 1.0f; }
    for (float& x : wgf) { x = (float)(rng_normal(&rng) / sqrt((double)D)); }
    to_bf16();
    for (int n = 0; n < H; n++) {
        wg[(size_t)n * D + D - 1] = 0;
        wg[(size_t)n * D + D - 1] = bf16_from_float(-screen_gemv_dot(f.data(), &wg[(size_t)n * D], D));
    }
    check_gate("threshold + outliers", wg, f, B, H, D);
}

int main(void) {
    for (int D : {16, 336, 2048, 4096}) { test_quantize(D); }
    test_bound(16, 40);
    test_bound(336, 20);
    test_bound(2048, 6);
    test_bound(4096, 2);
    test_gate(1, 700, 2048, 1);
    test_gate(3, 300, 336, 2);
    test_gate(8, 200, 2048, 3);
    test_gate(5, 100, 4096, 4);
    return test_summary("test_screened_gate");
}
