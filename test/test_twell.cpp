/*
 Checks of the TwELL CPU reference (llmc/ffn/twell.h):
 - bf16 rounding: nearest even, NaN kept, the way back exact;
 - pack then unpack gives relu(bf16(g)) back for every density from empty
   tiles to full ones, with a ragged last tile; slots are in increasing column
   order; word 0 is the true count; a block past S slots becomes an overflow
   record and the number of records needed is counted;
 - a record buffer too small: the blocks past it say TWELL_RECORD_LOST, unpack
   gives NaN there, and the count still says how many were needed;
 - the sparse FFN from the packed gate equals the dense FFN on the same
   bf16-rounded gate (both in double, so to ~1e-12), overflowing tiles included,
   and a row with a lost record is NaN while the others stay exact.
*/
#include <vector>
#include "llmc/rng.h"
#include "llmc/synthetic.h"
#include "llmc/ffn/twell.h"
#include "test/test.h"

static uint64_t rng = 42;

static void test_bf16(void) {
    CHECK(bf16_from_float(1.0f) == 0x3f80, "1.0 -> %#x", bf16_from_float(1.0f));
    CHECK(bf16_from_float(-2.0f) == 0xc000, "-2.0 -> %#x", bf16_from_float(-2.0f));
    // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0)
    CHECK(bf16_from_float(1.0f + 1.0f / 256) == 0x3f80, "tie down");
    CHECK(bf16_from_float(1.0f + 3.0f / 256) == 0x3f82, "tie up");
    CHECK(bf16_from_float(1.0f + 1.0f / 256 + 1.0f / 65536) == 0x3f81, "above the tie");
    CHECK(isnan(float_from_bf16(bf16_from_float(NAN))), "NaN stays NaN");
    CHECK(float_from_bf16(bf16_from_float(INFINITY)) == INFINITY, "inf");
    int exact = 1;
    for (int b = 0; b < 65536; b++) {
        float x = float_from_bf16((uint16_t)b);
        if (!isnan(x) && bf16_from_float(x) != b) { exact = 0; }
    }
    CHECK(exact, "every bf16 value survives the round trip");
}

// g [M, H] with each (row, tile) given its own density: rows cycle through
// empty, one positive, exactly S, S + 1, half and all positive, plus random
static std::vector<float> gate_with_densities(int M, int H, int TW, int S) {
    std::vector<float> g((size_t)M * H);
    for (int m = 0; m < M; m++) {
        for (int t = 0; t * TW < H; t++) {
            int width = H - t * TW < TW ? H - t * TW : TW;
            int kind = (m + 3 * t) % 7, positives = 0;
            switch (kind) {
                case 0: positives = 0; break;
                case 1: positives = 1; break;
                case 2: positives = S < width ? S : width; break;
                case 3: positives = S + 1 < width ? S + 1 : width; break;
                case 4: positives = width / 2; break;
                case 5: positives = width; break;
                default: positives = (int)rng_below(&rng, (uint64_t)width + 1); break;
            }
            // positives in random columns: a random permutation's first ones
            std::vector<int> cols(width);
            for (int c = 0; c < width; c++) { cols[c] = c; }
            for (int c = width - 1; c > 0; c--) {
                int j = (int)rng_below(&rng, (uint64_t)c + 1);
                int tmp = cols[c]; cols[c] = cols[j]; cols[j] = tmp;
            }
            for (int c = 0; c < width; c++) {
                double mag = 0.01 + fabs(rng_normal(&rng));
                g[(size_t)m * H + t * TW + cols[c]] = round_bf16((float)(c < positives ? mag : -mag));
            }
        }
    }
    return g;
}

static void test_pack_round_trip(int M, int H, int TW, int S) {
    Twell tw = twell_layout(M, H, TW, S, M * ((H + TW - 1) / TW));
    std::vector<float> g = gate_with_densities(M, H, TW, S);
    std::vector<uint32_t> words(twell_num_words(&tw));
    std::vector<uint16_t> records(twell_record_values(&tw));
    int needed = twell_pack_cpu(words.data(), records.data(), g.data(), &tw);
    std::vector<float> back((size_t)M * H);
    twell_unpack_cpu(back.data(), words.data(), records.data(), &tw);
    int mismatches = 0, unsorted = 0, overflows = 0, bad_counts = 0;
    for (size_t k = 0; k < g.size(); k++) {
        float want = g[k] > 0.0f ? g[k] : 0.0f;
        if (back[k] != want) { mismatches++; }
    }
    for (int m = 0; m < M; m++) {
        for (int t = 0; t < tw.tiles; t++) {
            const uint32_t* block = &words[((size_t)m * tw.tiles + t) * twell_words_per_block(&tw)];
            int width = H - t * TW < TW ? H - t * TW : TW, count = 0;
            for (int c = 0; c < width; c++) { count += g[(size_t)m * H + t * TW + c] > 0.0f; }
            if (block[0] != (uint32_t)count) { bad_counts++; }
            if (count > S) { overflows++; continue; }
            for (int e = 2; e <= count; e++) {
                if (twell_entry_col(block[e]) <= twell_entry_col(block[e - 1])) { unsorted++; }
            }
        }
    }
    CHECK(mismatches == 0, "M %d H %d TW %d S %d: %d values differ after unpack", M, H, TW, S, mismatches);
    CHECK(bad_counts == 0, "M %d H %d TW %d S %d: %d blocks with a wrong count", M, H, TW, S, bad_counts);
    CHECK(unsorted == 0, "M %d H %d TW %d S %d: %d slots out of column order", M, H, TW, S, unsorted);
    CHECK(needed == overflows && overflows > 0, "records needed %d, overflowing blocks %d", needed, overflows);
}

static void test_lost_records(void) {
    const int M = 40, H = 100, TW = 32, S = 3;
    Twell full = twell_layout(M, H, TW, S, 1000);
    std::vector<float> g = gate_with_densities(M, H, TW, S);
    std::vector<uint32_t> words(twell_num_words(&full));
    std::vector<uint16_t> records(twell_record_values(&full));
    int needed = twell_pack_cpu(words.data(), records.data(), g.data(), &full);
    Twell small = twell_layout(M, H, TW, S, needed / 2);
    std::vector<uint32_t> words_small(twell_num_words(&small));
    std::vector<uint16_t> records_small(twell_record_values(&small) + 1);
    int needed_small = twell_pack_cpu(words_small.data(), records_small.data(), g.data(), &small);
    CHECK(needed_small == needed, "records needed %d with a small buffer, %d with a large one", needed_small, needed);
    std::vector<float> back((size_t)M * H);
    twell_unpack_cpu(back.data(), words_small.data(), records_small.data(), &small);
    int lost = 0, wrong = 0;
    for (int m = 0; m < M; m++) {
        for (int t = 0; t < small.tiles; t++) {
            const uint32_t* block = &words_small[((size_t)m * small.tiles + t) * twell_words_per_block(&small)];
            int width = H - t * TW < TW ? H - t * TW : TW;
            bool is_lost = block[0] > (uint32_t)S && block[1] == TWELL_RECORD_LOST;
            lost += is_lost;
            for (int c = 0; c < width; c++) {
                float v = back[(size_t)m * H + t * TW + c], x = g[(size_t)m * H + t * TW + c];
                if (is_lost ? !isnan(v) : v != (x > 0.0f ? x : 0.0f)) { wrong++; }
            }
        }
    }
    CHECK(lost == needed - needed / 2, "%d lost blocks, expected %d", lost, needed - needed / 2);
    CHECK(wrong == 0, "%d values wrong around lost records", wrong);

}

static std::vector<float> normals(size_t n, double std) {
    std::vector<float> x(n);
    for (size_t k = 0; k < n; k++) { x[k] = round_bf16((float)(std * rng_normal(&rng))); }
    return x;
}

// sparse == dense on the same bf16 gate, with a threshold that makes ~`active`
// of H units fire per row, and S small enough that some tiles overflow
static void test_ffn(int M, int D, int H, int TW, int S, double active, int record_capacity) {
    std::vector<float> f = normals((size_t)M * D, 1.0), wg = normals((size_t)H * D, 1.0 / sqrt(D));
    std::vector<float> wu = normals((size_t)H * D, 1.0 / sqrt(D)), wdT = normals((size_t)H * D, 1.0 / sqrt(H));
    std::vector<float> g((size_t)M * H);
    gate_cpu(g.data(), f.data(), wg.data(), M, D, H);
    double shift = normal_quantile(1.0 - active / H); // P(N(0,1) > shift) = active / H
    for (size_t k = 0; k < g.size(); k++) { g[k] = round_bf16(g[k] - (float)shift); }
    Twell tw = twell_layout(M, H, TW, S, record_capacity);
    std::vector<uint32_t> words(twell_num_words(&tw));
    std::vector<uint16_t> records(twell_record_values(&tw) + 1);
    int needed = twell_pack_cpu(words.data(), records.data(), g.data(), &tw);
    std::vector<float> y_dense((size_t)M * D), y_sparse((size_t)M * D);
    ffn_dense_from_gate_cpu(y_dense.data(), f.data(), g.data(), wu.data(), wdT.data(), M, D, H);
    twell_ffn_cpu(y_sparse.data(), f.data(), wu.data(), wdT.data(), words.data(), records.data(), &tw, D);
    // rows that lost a record must be NaN, all others equal the dense FFN
    std::vector<int> lost_row(M, 0);
    for (int m = 0; m < M; m++) {
        for (int t = 0; t < tw.tiles; t++) {
            const uint32_t* block = &words[((size_t)m * tw.tiles + t) * twell_words_per_block(&tw)];
            if (block[0] > (uint32_t)S && block[1] == TWELL_RECORD_LOST) { lost_row[m] = 1; }
        }
    }
    double max_diff = 0.0, max_ref = 0.0;
    int nan_wrong = 0, lost_rows = 0;
    for (int m = 0; m < M; m++) {
        lost_rows += lost_row[m];
        for (int d = 0; d < D; d++) {
            float s = y_sparse[(size_t)m * D + d], r = y_dense[(size_t)m * D + d];
            if (lost_row[m] != (int)isnan(s)) { nan_wrong++; continue; }
            if (!lost_row[m]) {
                max_diff = fmax(max_diff, fabs((double)s - r));
                max_ref = fmax(max_ref, fabs((double)r));
            }
        }
    }
    double rel = max_diff / fmax(max_ref, 1e-30);
    CHECK(nan_wrong == 0, "M %d D %d H %d S %d: %d values NaN where they should not be or not where they should",
          M, D, H, S, nan_wrong);
    CHECK(rel < 1e-6, "M %d D %d H %d S %d active %.0f: sparse vs dense rel err %g", M, D, H, S, active, rel);
    CHECK(max_ref > 0.0, "the FFN output is not all zero");
    if (record_capacity >= needed) {
        CHECK(lost_rows == 0, "no row lost with a record buffer of %d for %d needed", record_capacity, needed);
    } else {
        CHECK(lost_rows > 0, "rows lost with a record buffer of %d for %d needed", record_capacity, needed);
    }
}

int main(void) {
    test_bf16();
    test_pack_round_trip(50, 256, 256, 31);
    test_pack_round_trip(37, 1000, 256, 31);
    test_pack_round_trip(21, 100, 32, 3);
    test_pack_round_trip(9, 20, 4, 1);
    test_lost_records();
    test_ffn(40, 64, 512, 256, 31, 20.0, 1000);
    test_ffn(33, 48, 300, 64, 3, 30.0, 1000);   // many overflowing tiles, ragged last tile
    test_ffn(33, 48, 300, 64, 3, 30.0, 5);      // most records lost
    test_ffn(17, 32, 128, 32, 7, 100.0, 1000);  // dense-ish
    return test_summary("test_twell");
}
