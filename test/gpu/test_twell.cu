/*
 The TwELL sparse FFN on the GPU (llmc/ffn/cuda_twell.cuh) against the CPU
 reference (llmc/ffn/twell.h) and the dense cuBLAS FFN, on fresh random inputs with
 docs/SPARSE.md's synthetic sparsity: f rows N(0, 1) with the last feature a carrier
 (1.0; 0.5 on the first 1% of rows in the "realistic" pattern), Wg rows
 N(0, 1/(D-1)) with last column -t_n, t_n = Phi^-1(1 - p_n), so unit n fires
 with probability p_n; uniform p_n = k/H, or log-normal (sigma 1.5) p_n with
 30% of units never firing. Wu N(0, 1/D), WdT N(0, 1/H).

 Per case:
 - the baseline packer (cuBLAS g, then pack) against the CPU packer run on
   the same g downloaded: every word equal (record indices aside: records are
   compared by content);
 - the fused wgmma gate (compute capability 9.0) against the baseline: the
   unpacked relu(g) must agree to bf16 rounding, and the active patterns must
   be identical except where |g| (fp64) is below 1e-4, where the two fp32
   summation orders may round to different signs (counted, printed);
 - the slots of every block in increasing column order, and word 0 the count;
 - the counters: records needed as the CPU packer counts them, active units
   the sum of the words 0;
 - y of the sparse FFN (each gate + up/down), of the dense path of
   twell_ffn_forward and of the dense cuBLAS FFN against y of the fp64 CPU FFN:
   max|y - ref| / max|ref| < 1e-2. bf16 y is rounded once (2^-9 relative), g
   and a = g u are rounded to bf16 on the way (2^-9 each, on terms of random
   sign that mostly cancel), products sum in fp32: the error is a few 1e-3 of
   max|ref|, and an indexing or format error is O(1);
 - rows of D 2048, 3072 and 8192: each width of the up + down kernel;
 - every output and counter poisoned (0xFF bytes) before each run; any NaN fails;
 - two runs give the same bits (y, and the unpacked gate);
 - overflow: with few slots per block most tiles overflow and must still be
   exact; with a record buffer too small, the status reports exactly what was
   needed (the same as with a buffer large enough), exactly the rows that lost
   a record are NaN, and with a buffer of the reported size the status is ok
   and y exact;
 - the path of twell_ffn_forward: sparse before anything was measured, then
   as dense_above says, and the dense path's activity equal to the sparse
   path's (the same cuBLAS g).
*/
#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <vector>
#include "llmc/ffn/cuda_twell.cuh"
#include "llmc/rng.h"
#include "llmc/synthetic.h"
#include "test/gpu/gpu_util.cuh"
#include "test/test.h"

static uint64_t rng = 20240521;

// ----------------------------------------------------------------------------
// inputs with docs/SPARSE.md's synthetic sparsity

// p_n: k/H each (uniform), or log-normal (sigma 1.5) on 70% of the units,
// 0 on the rest, scaled to mean k/H with a cap of 0.5
static std::vector<double> firing_probabilities(int H, double k, bool realistic) {
    std::vector<double> p(H, k / H);
    if (!realistic) { return p; }
    for (int n = 0; n < H; n++) { p[n] = rng_uniform(&rng) < 0.3 ? 0.0 : exp(1.5 * rng_normal(&rng)); }
    for (int pass = 0; pass < 20; pass++) { // rescale, cap, again: the cap lowers the mean a little each time
        double sum = 0;
        for (int n = 0; n < H; n++) { sum += p[n]; }
        for (int n = 0; n < H; n++) { p[n] = std::min(0.5, p[n] * k / sum); }
    }
    return p;
}

struct Inputs {
    int M, D, H;
    std::vector<bf16> f, wg, wu, wdT;
};

static std::vector<bf16> normal_bf16(size_t n, double std) {
    std::vector<bf16> x(n);
    for (size_t k = 0; k < n; k++) { x[k] = __float2bfloat16_rn((float)(std * rng_normal(&rng))); }
    return x;
}

static Inputs make_inputs(int M, int D, int H, double k, bool realistic) {
    Inputs in = {M, D, H, normal_bf16((size_t)M * D, 1.0), normal_bf16((size_t)H * D, 1.0 / sqrt(D - 1.0)),
                 normal_bf16((size_t)H * D, 1.0 / sqrt((double)D)), normal_bf16((size_t)H * D, 1.0 / sqrt((double)H))};
    std::vector<double> p = firing_probabilities(H, k, realistic);
    for (int m = 0; m < M; m++) {
        in.f[(size_t)m * D + D - 1] = __float2bfloat16_rn(realistic && m < (M + 99) / 100 ? 0.5f : 1.0f);
    }
    for (int n = 0; n < H; n++) {
        double t = p[n] > 0 ? normal_quantile(1.0 - p[n]) : 40.0;
        in.wg[(size_t)n * D + D - 1] = __float2bfloat16_rn((float)-t);
    }
    return in;
}

// ----------------------------------------------------------------------------
// comparisons

// max|a - ref| / max|ref| over the rows not skipped; NaN if any compared value is NaN
static double rel_err(const std::vector<float>& a, const std::vector<double>& ref, int D,
                      const std::vector<int>* skip_rows = NULL) {
    double max_diff = 0, max_ref = 0;
    for (size_t k = 0; k < ref.size(); k++) {
        if (skip_rows && (*skip_rows)[k / D]) { continue; }
        if (isnan(a[k])) { return NAN; }
        max_diff = fmax(max_diff, fabs(a[k] - ref[k]));
        max_ref = fmax(max_ref, fabs(ref[k]));
    }
    return max_diff / fmax(max_ref, 1e-30);
}

struct Packed {
    std::vector<uint32_t> words;
    std::vector<uint16_t> records;
};

static Packed download_packed(const TwellFFN* ffn) {
    return {download(ffn->words, twell_num_words(&ffn->tw)), download(ffn->records, twell_record_values(&ffn->tw))};
}

static std::vector<float> unpack(const Packed& p, const Twell* tw) {
    std::vector<float> gate((size_t)tw->rows * tw->cols);
    twell_unpack_cpu(gate.data(), p.words.data(), p.records.data(), tw);
    return gate;
}

// word 0 is the count of the block's positives in `gate` (unpacked relu(g)), and
// the slots of a block that fits are in increasing column order
static int format_errors(const Packed& p, const std::vector<float>& gate, const Twell* tw) {
    int errors = 0;
    for (int m = 0; m < tw->rows; m++) {
        for (int t = 0; t < tw->tiles; t++) {
            const uint32_t* block = &p.words[((size_t)m * tw->tiles + t) * twell_words_per_block(tw)];
            int width = std::min(tw->tile_width, tw->cols - t * tw->tile_width), count = 0;
            for (int c = 0; c < width; c++) { count += gate[(size_t)m * tw->cols + t * tw->tile_width + c] != 0.0f; }
            if (block[0] > (uint32_t)tw->slots) {
                errors += block[1] != TWELL_RECORD_LOST && block[0] != (uint32_t)count; // bf16 underflow aside
                continue;
            }
            errors += block[0] != (uint32_t)count;
            for (uint32_t e = 2; e <= block[0]; e++) {
                errors += twell_entry_col(block[e]) <= twell_entry_col(block[e - 1]);
            }
        }
    }
    return errors;
}

// the words of two packings, equal except record indices; records equal by content
static int word_differences(const Packed& a, const Packed& b, const Twell* tw) {
    int diffs = 0;
    const size_t W = twell_words_per_block(tw);
    for (size_t blk = 0; blk < (size_t)tw->rows * tw->tiles; blk++) {
        const uint32_t *x = &a.words[blk * W], *y = &b.words[blk * W];
        if (x[0] != y[0]) { diffs++; continue; }
        if (x[0] <= (uint32_t)tw->slots) {
            for (uint32_t e = 1; e <= x[0]; e++) { diffs += x[e] != y[e]; }
        } else if (x[1] == TWELL_RECORD_LOST || y[1] == TWELL_RECORD_LOST) {
            diffs += x[1] != y[1];
        } else {
            diffs += memcmp(&a.records[(size_t)x[1] * tw->tile_width], &b.records[(size_t)y[1] * tw->tile_width],
                            tw->tile_width * sizeof(uint16_t)) != 0;
        }
    }
    return diffs;
}

// two unpacked gates: pattern differences where |g| >= 1e-4 (errors), those
// below (allowed: rounding of fp32 sums), and the largest value difference
// relative to max(|g|, 1e-2) where both are active (g is N(0, 1) before its
// threshold; two fp32 orders of D products, each rounded to bf16, can differ by
// a bf16 step, which near zero is most of the value: 1.1% at D 8192 with a
// floor of 1e-3)
struct GateDiff { int errors, near_zero; double value_rel; };
static GateDiff gate_diff(const std::vector<float>& a, const std::vector<float>& b, const std::vector<double>& g_exact) {
    GateDiff d = {0, 0, 0.0};
    for (size_t k = 0; k < a.size(); k++) {
        if (isnan(a[k]) || isnan(b[k])) { d.errors++; continue; }
        if ((a[k] != 0.0f) != (b[k] != 0.0f)) {
            if (fabs(g_exact[k]) < 1e-4) { d.near_zero++; } else { d.errors++; }
        } else if (a[k] != 0.0f) {
            d.value_rel = fmax(d.value_rel, fabs(a[k] - b[k]) / fmax(fabs(g_exact[k]), 1e-2));
        }
    }
    return d;
}

// ----------------------------------------------------------------------------

struct Case {
    const char* name;
    int M, D, H, slots;
    double k;
    bool realistic;
};

// one sparse run with every output poisoned; gate: 0 cuBLAS + pack, 1 wgmma
static void sparse_run(TwellFFN* ffn, bf16* y, bf16* g_scratch, const bf16* f, const bf16* wg, const bf16* wu,
                       const bf16* wdT, int gate) {
    poison(ffn->words, twell_num_words(&ffn->tw) * sizeof(uint32_t));
    poison(ffn->counters, twell_counter_bytes());
    poison(y, (size_t)ffn->tw.rows * ffn->D * sizeof(bf16));
    if (gate == 0) {
        poison(g_scratch, (size_t)ffn->tw.rows * ffn->tw.cols * sizeof(bf16));
        twell_gate_cublas(ffn, g_scratch, f, wg);
    } else {
        twell_gate_wgmma(ffn, f, wg);
    }
    twell_up_down(ffn, y, f, wu, wdT);
}

static int nan_values(const std::vector<float>& x) {
    int n = 0;
    for (float v : x) { n += isnan(v); }
    return n;
}

static void test_case(const Case& c, bool has_wgmma) {
    const int M = c.M, D = c.D, H = c.H;
    Inputs in = make_inputs(M, D, H, c.k, c.realistic);
    bf16 *f = upload(in.f), *wg = upload(in.wg), *wu = upload(in.wu), *wdT = upload(in.wdT);
    bf16* y = (bf16*)cuda_malloc((size_t)M * D * sizeof(bf16));
    bf16* scratch = (bf16*)cuda_malloc((size_t)2 * M * H * sizeof(bf16)); // g, u
    bf16 *g = scratch, *u = scratch + (size_t)M * H;

    // fp64 references: g, and y of the dense FFN
    std::vector<float> ff = to_float(in.f), wgf = to_float(in.wg), wuf = to_float(in.wu), wdf = to_float(in.wdT);
    std::vector<double> g_exact((size_t)M * H), y_ref((size_t)M * D);
    #pragma omp parallel for
    for (int m = 0; m < M; m++) {
        std::vector<double> acc(D, 0.0);
        for (int n = 0; n < H; n++) {
            double gs = 0, us = 0;
            for (int d = 0; d < D; d++) {
                gs += (double)ff[(size_t)m * D + d] * wgf[(size_t)n * D + d];
                us += (double)ff[(size_t)m * D + d] * wuf[(size_t)n * D + d];
            }
            g_exact[(size_t)m * H + n] = gs;
            if (gs > 0) {
                for (int d = 0; d < D; d++) { acc[d] += gs * us * wdf[(size_t)n * D + d]; }
            }
        }
        for (int d = 0; d < D; d++) { y_ref[(size_t)m * D + d] = acc[d]; }
    }
    double active = 0;
    for (double x : g_exact) { active += x > 0; }
    printf("%-28s M %5d D %4d H %5d S %2d: %.1f active per row\n", c.name, M, D, H, c.slots, active / M);

    // dense cuBLAS FFN
    poison(y, (size_t)M * D * sizeof(bf16));
    ffn_dense_forward(y, g, u, f, wg, wu, wdT, M, D, H, NULL);
    double e_dense = rel_err(to_float(download(y, (size_t)M * D)), y_ref, D);
    CHECK(e_dense < 1e-2, "%s dense cuBLAS FFN rel err %g", c.name, e_dense);

    TwellFFN ffn = twell_ffn_create(M, D, H, c.slots, M * ((H + TWELL_TILE - 1) / TWELL_TILE));
    std::vector<float> base_gate;
    TwellStatus needed[2] = {};
    for (int gate = 0; gate < (has_wgmma ? 2 : 1); gate++) {
        const char* gate_name = gate == 0 ? "cublas+pack" : "fused wgmma";
        sparse_run(&ffn, y, g, f, wg, wu, wdT, gate);
        TwellStatus st = twell_ffn_status(&ffn);
        CHECK(st.ok && st.path == TWELL_SPARSE, "%s %s: record buffer too small (%lld needed)", c.name, gate_name,
              st.records_needed);
        Packed packed = download_packed(&ffn);
        std::vector<float> gate_values = unpack(packed, &ffn.tw);
        std::vector<float> y1 = to_float(download(y, (size_t)M * D));
        CHECK(format_errors(packed, gate_values, &ffn.tw) == 0, "%s %s: %d format errors", c.name, gate_name,
              format_errors(packed, gate_values, &ffn.tw));
        long long word0 = 0;
        for (size_t b = 0; b < packed.words.size(); b += twell_words_per_block(&ffn.tw)) { word0 += packed.words[b]; }
        CHECK(llround(st.active_per_row * M) == word0, "%s %s: active per row %g, words 0 say %g", c.name, gate_name,
              st.active_per_row, (double)word0 / M);
        if (gate == 0) {
            // the CPU packer on the same g gives the same words
            std::vector<float> gf = to_float(download(g, (size_t)M * H));
            Packed cpu = {std::vector<uint32_t>(twell_num_words(&ffn.tw)), std::vector<uint16_t>(twell_record_values(&ffn.tw))};
            int cpu_needed = twell_pack_cpu(cpu.words.data(), cpu.records.data(), gf.data(), &ffn.tw);
            CHECK(cpu_needed == st.records_needed, "%s: records needed GPU %lld CPU %d", c.name, st.records_needed,
                  cpu_needed);
            int diffs = word_differences(packed, cpu, &ffn.tw);
            CHECK(diffs == 0, "%s cublas+pack: %d blocks differ from the CPU packer's", c.name, diffs);
            base_gate = gate_values;
        } else {
            GateDiff d = gate_diff(gate_values, base_gate, g_exact);
            CHECK(d.errors == 0, "%s %s: %d active-pattern differences from the baseline where |g| >= 1e-4", c.name,
                  gate_name, d.errors);
            CHECK(d.value_rel < 1e-2, "%s %s: gate values differ from the baseline by %g relative", c.name, gate_name,
                  d.value_rel);
            if (d.near_zero > 0) { printf("  %s: %d pattern differences at |g| < 1e-4\n", gate_name, d.near_zero); }
        }
        needed[gate] = st;
        double e = rel_err(y1, y_ref, D);
        CHECK(e < 1e-2, "%s %s sparse FFN rel err %g", c.name, gate_name, e);
        printf("  %-15s y rel err %.2e (dense %.2e), records %lld\n", gate_name, e, e_dense, st.records_needed);

        // a second run gives the same bits
        sparse_run(&ffn, y, g, f, wg, wu, wdT, gate);
        std::vector<float> y2 = to_float(download(y, (size_t)M * D));
        std::vector<float> gate2 = unpack(download_packed(&ffn), &ffn.tw);
        CHECK(memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)) == 0, "%s %s: y differs between runs", c.name,
              gate_name);
        CHECK(memcmp(gate_values.data(), gate2.data(), gate_values.size() * sizeof(float)) == 0,
              "%s %s: gate differs between runs", c.name, gate_name);
    }

    twell_ffn_free(&ffn);

    // twell_ffn_forward: sparse while nothing is measured, then the path dense_above or choice says
    {
        TwellFFN fw = twell_ffn_create(M, D, H, c.slots, M * ((H + TWELL_TILE - 1) / TWELL_TILE));
        poison(y, (size_t)M * D * sizeof(bf16));
        TwellPath path = twell_ffn_forward(&fw, y, f, wg, wu, wdT, scratch);
        TwellStatus st = twell_ffn_status(&fw);
        double e = rel_err(to_float(download(y, (size_t)M * D)), y_ref, D);
        CHECK(path == TWELL_SPARSE && st.path == TWELL_SPARSE && st.ok && e < 1e-2,
              "%s forward, first run: path %d, status ok %d, rel err %g", c.name, (int)path, st.ok, e);
        CHECK(!(st.active_per_row > 0) || (fw.dense_above > 0 && isfinite(fw.dense_above)),
              "%s forward: dense_above %g after a timed sparse run", c.name, fw.dense_above);
        fw.dense_above = st.active_per_row - 0.5; // the activity measured is above it: dense
        poison(y, (size_t)M * D * sizeof(bf16));
        poison(scratch, (size_t)2 * M * H * sizeof(bf16));
        poison(fw.counters, twell_counter_bytes());
        path = twell_ffn_forward(&fw, y, f, wg, wu, wdT, scratch);
        TwellStatus dense_st = twell_ffn_status(&fw);
        e = rel_err(to_float(download(y, (size_t)M * D)), y_ref, D);
        CHECK(path == TWELL_DENSE && dense_st.path == TWELL_DENSE && dense_st.ok && e < 1e-2,
              "%s forward above dense_above: path %d, status ok %d, rel err %g", c.name, (int)path, dense_st.ok, e);
        CHECK(dense_st.active_per_row == needed[0].active_per_row,
              "%s dense path: %g active per row, the cuBLAS gate's packing %g", c.name, dense_st.active_per_row,
              needed[0].active_per_row);
        fw.choice = TWELL_FORCE_SPARSE;
        CHECK(twell_ffn_forward(&fw, y, f, wg, wu, wdT, scratch) == TWELL_SPARSE && twell_ffn_status(&fw).ok,
              "%s forced sparse", c.name);
        fw.choice = TWELL_FORCE_DENSE;
        CHECK(twell_ffn_forward(&fw, y, f, wg, wu, wdT, scratch) == TWELL_DENSE && twell_ffn_status(&fw).ok,
              "%s forced dense", c.name);
        printf("  forward         sparse first, then dense: rel err %.2e, %.1f active per row, dense above %.1f\n", e,
               dense_st.active_per_row, fw.dense_above);
        twell_ffn_free(&fw);
    }

    // a record buffer too small: exactly the rows that lost a record are NaN, the
    // status says exactly how many records were needed, and a buffer of that size
    // is ok and exact
    const int gate = has_wgmma ? 1 : 0;
    long long small_records = needed[gate].records_needed / 2;
    if (small_records < needed[gate].records_needed) {
        TwellFFN small = twell_ffn_create(M, D, H, c.slots, (int)small_records);
        sparse_run(&small, y, g, f, wg, wu, wdT, gate);
        TwellStatus st = twell_ffn_status(&small);
        std::vector<float> ys = to_float(download(y, (size_t)M * D));
        std::vector<int> lost_row(M, 0);
        Packed packed = download_packed(&small);
        for (int m = 0; m < M; m++) {
            for (int t = 0; t < small.tw.tiles; t++) {
                const uint32_t* block = &packed.words[((size_t)m * small.tw.tiles + t) * twell_words_per_block(&small.tw)];
                lost_row[m] |= block[0] > (uint32_t)c.slots && block[1] == TWELL_RECORD_LOST;
            }
        }
        int wrong_nan_rows = 0, lost_rows = 0;
        for (int m = 0; m < M; m++) {
            int nans = 0;
            for (int d = 0; d < D; d++) { nans += isnan(ys[(size_t)m * D + d]); }
            wrong_nan_rows += lost_row[m] ? nans != D : nans != 0;
            lost_rows += lost_row[m];
        }
        CHECK(!st.ok && st.records_needed == needed[gate].records_needed,
              "%s small record buffer: status ok %d, records needed %lld (%lld)", c.name, st.ok, st.records_needed,
              needed[gate].records_needed);
        CHECK(lost_rows > 0 && wrong_nan_rows == 0,
              "%s small record buffer: %d rows lost a record, %d rows NaN where none was lost or not NaN where one was",
              c.name, lost_rows, wrong_nan_rows);
        double e = rel_err(ys, y_ref, D, &lost_row);
        CHECK(e < 1e-2, "%s small record buffer: rows without a lost record have rel err %g", c.name, e);
        twell_ffn_free(&small);
        TwellFFN grown = twell_ffn_create(M, D, H, c.slots, (int)st.records_needed);
        sparse_run(&grown, y, g, f, wg, wu, wdT, gate);
        TwellStatus grown_st = twell_ffn_status(&grown);
        std::vector<float> yg = to_float(download(y, (size_t)M * D));
        e = rel_err(yg, y_ref, D);
        CHECK(grown_st.ok, "%s grown record buffer: status not ok (%lld records needed)", c.name, grown_st.records_needed);
        CHECK(e < 1e-2, "%s grown record buffer: rel err %g, %d NaN values", c.name, e, nan_values(yg));
        printf("  records halved: %d of %d rows lost a record and are NaN; grown to the status' count: rel err %.2e\n",
               lost_rows, M, e);
        twell_ffn_free(&grown);
    }

    cuda_free(f);
    cuda_free(wg);
    cuda_free(wu);
    cuda_free(wdT);
    cuda_free(y);
    cuda_free(scratch);
}

int main(void) {
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    bool has_wgmma = prop.major == 9;
    printf("%s (compute capability %d.%d): gates cublas+pack%s\n", prop.name, prop.major, prop.minor,
           has_wgmma ? ", wgmma" : "");
    // k is the mean active units per row out of H (the standard point's H is 5632,
    // so k = 30 of H = 1000 is ~5x denser than k = 30 there)
    const Case cases[] = {
        {"uniform k=8", 1000, 256, 1024, 31, 8 * 1024 / 5632.0 * 4, false},
        {"uniform k=30 (ragged)", 2051, 320, 1000, 31, 30 * 1000 / 5632.0 * 4, false},
        {"uniform k=100", 1500, 256, 1536, 31, 100 * 1536 / 5632.0, false},
        {"uniform k=300", 1200, 192, 2048, 31, 300 * 2048 / 5632.0, false},
        {"realistic k=30", 3000, 256, 2048, 31, 30 * 2048 / 5632.0 * 2, true},
        {"realistic k=100", 1000, 128, 1024, 31, 100 * 1024 / 5632.0, true},
        {"overflow: S=3", 700, 128, 1000, 3, 20, false},
        {"overflow: S=1, k=60", 333, 64, 520, 1, 60, false},
        {"tiny: M=5, D=64, H=8", 5, 64, 8, 2, 2, false},
        {"wide rows: D=2048", 300, 2048, 512, 31, 8, false}, // each width of the up + down kernel
        {"wide rows: D=3072", 200, 3072, 512, 31, 8, false},
        {"wide rows: D=8192", 100, 8192, 256, 31, 8, false},
        {"empty: k=0", 300, 128, 512, 31, 0, false},
    };
    for (const Case& c : cases) { test_case(c, has_wgmma); }
    return test_summary("test_twell");
}
