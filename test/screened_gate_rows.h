/*
 Adversarial gate rows for the screened gate's tests (CPU and GPU): bf16 bits
 of D weights, N(0, 1/D) unless the kind says otherwise.
*/
#ifndef TEST_SCREENED_GATE_ROWS_H
#define TEST_SCREENED_GATE_ROWS_H

#include <math.h>
#include "llmc/rng.h"
#include "llmc/ffn/screened_gate.h"
#include "llmc/ffn/twell.h"

enum RowKind { ROW_GAUSS, ROW_ONE_HUGE, ROW_TWO_HUGE, ROW_EQUAL, ROW_HALF_STEPS, ROW_SUBNORMAL, ROW_ZERO, ROW_ZERO_GROUP,
               ROW_LARGEST, ROW_NONFINITE, ROW_GRID, ROW_KINDS };
static const char* row_names[ROW_KINDS] = {"gaussian", "one huge", "two huge", "all equal", "half steps", "subnormal",
                                           "zero", "zero group", "largest bf16", "non-finite", "on the grid"};

static inline uint16_t bf16_bits(double x) { return bf16_from_float((float)x); }

static inline void make_row(uint16_t* w, int D, int kind, uint64_t* rng) {
    const double sd = 1.0 / sqrt((double)D);
    for (int i = 0; i < D; i++) { w[i] = bf16_bits(sd * rng_normal(rng)); }
    const int c = (int)rng_below(rng, D);
    switch (kind) {
    case ROW_ONE_HUGE: w[c] = bf16_bits(1000 * sd); break;
    case ROW_TWO_HUGE: w[c] = bf16_bits(-1000 * sd); w[(c + SCREEN_GROUP) % D] = bf16_bits(700 * sd); break;
    case ROW_EQUAL: for (int i = 0; i < D; i++) { w[i] = bf16_bits(0.37); } break;
    case ROW_HALF_STEPS: // each group holds 127 s0 (so s = s0), the rest on the half steps (k + 1/2) s0
        for (int i = 0; i < D; i++) {
            const int k = (int)rng_below(rng, 253) - 126;
            w[i] = bf16_bits(i % SCREEN_GROUP == 0 ? 127.0 / 128 : (k + (k < 0 ? -0.5 : 0.5)) / 128);
        }
        break;
    case ROW_SUBNORMAL: for (int i = 0; i < D; i++) { w[i] = bf16_bits(1e-39 * rng_normal(rng)); } break;
    case ROW_ZERO: for (int i = 0; i < D; i++) { w[i] = 0; } break;
    case ROW_ZERO_GROUP: for (int i = 0; i < SCREEN_GROUP && i < D; i++) { w[i] = 0x8000; } break; // -0
    case ROW_LARGEST: w[c] = 0x7f7f; w[(c + 1) % D] = 0xff7f; break; // +-3.39e38, two groups or one
    case ROW_NONFINITE: w[c] = rng_below(rng, 2) ? 0x7fc0 : 0xff80; break; // NaN or -inf
    case ROW_GRID: // every w' a multiple of s = 2^-10 (e = 0, E = 0: only the rounding term covers U >= G)
        for (int i = 0; i < D; i++) {
            w[i] = bf16_bits((i % SCREEN_GROUP == 0 ? 127 : (int)rng_below(rng, 253) - 126) / 1024.0);
        }
        w[c % SCREEN_GROUP ? c : c + 1] = bf16_bits(3000 / 1024.0); // the outlier, off the grid
        break;
    default: break;
    }
}

#endif // TEST_SCREENED_GATE_ROWS_H
