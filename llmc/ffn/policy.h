/*
 Every choice between the FFN's paths, in one table: which path a layer runs,
 training and inference, and why. The kernels carry out a choice; they never
 make one. Figures behind each row: dev/RESULTS.md and dev/NOTES.md (the
 sections named).

 | where            | rule                                                   | why                                        |
 |------------------|--------------------------------------------------------|--------------------------------------------|
 | training, auto   | a layer runs sparse while its mean firing units per    | sparse fwd + bwd beats dense up to about   |
 |                  | token k <= FFN_AUTO_MAX_ACTIVE H; 25% hysteresis       | k = 1% of H (bench_ffn, "Sparse FFN        |
 |                  | (ffn_policy_auto_sparse)                               | training")                                 |
 | training, sparse | the busiest units run as dense GEMMs: the multiple of  | a unit firing for a share p of the tokens  |
 | and prefill      | FFN_HOT_ALIGN with the least modelled time, re-chosen  | costs the sparse part p gathered pairs     |
 |                  | every FFN_HOT_EVERY steps, kept unless a new set saves | per token, the dense part a fixed amount   |
 |                  | FFN_HOT_MARGIN (llmc/ffn/hot.h)                        | ("Hot units as dense GEMMs")               |
 | prefill          | fewer than TWELL_PREFILL_MIN_ROWS rows run the dense   | a few hundred tokens fire most of H; the   |
 |                  | FFN (ffn_policy_prefill_sparse)                        | status read costs more than the gate saves |
 | prefill, a layer | TwELL's slots per block: the fewest of 3, 7, 15, 31    | fewer words to write and read; a tile past |
 |                  | that a Poisson count of the layer's measured mean per  | its slots takes its record, exact either   |
 |                  | tile exceeds rarely (ffn_policy_twell_slots)           | way ("TwELL: slots from the activity")     |
 | prefill, a layer | dense while its last activity is above dense_above:    | the dense FFN is a little under three of   |
 |                  | H / TWELL_H_PER_DENSE_ACTIVE until timed, then (dense  | the gate's GEMMs ("Choosing the path")     |
 |                  | - gate) / (up + down per active unit); the dense time  |                                            |
 |                  | taken as TWELL_DENSE_PER_GATE gates until timed        |                                            |
 | decode           | up to SCREEN_MAX_ROWS rows: the int8 screened gate;    | the screen's per-row conversion of f costs |
 |                  | up to GEMV_MAX_ROWS (llmc/cuda_matmul.cuh): the GEMV   | more than its bytes save beyond 2 rows     |
 |                  | gate with the fused up; beyond: cuBLASLt's gate        | ("Decode: the exact screened gate")        |
 |                  | (ffn_policy_decode_screened)                           |                                            |
*/
#ifndef LLMC_FFN_POLICY_H
#define LLMC_FFN_POLICY_H

#define FFN_AUTO_MAX_ACTIVE 0.01
#define FFN_AUTO_HYSTERESIS 1.25

#define FFN_HOT_ALIGN 64   // hot sets are multiples of this many units (GEMM tiles)
#define FFN_HOT_EVERY 10   // training steps between re-choices of the hot sets
#define FFN_HOT_MARGIN 0.02 // a new hot set must save this share of the layer's modelled time
#define FFN_HOT_PROBE 128  // the dense part is timed over this many units and four times as many

#define TWELL_PREFILL_MIN_ROWS 4096
#define TWELL_H_PER_DENSE_ACTIVE 44.0
#define TWELL_DENSE_PER_GATE 2.75f

#define SCREEN_MAX_ROWS 2

// --ffn auto: whether a layer of H units that fires k units per token runs sparse (on: it does now)
static inline int ffn_policy_auto_sparse(int on, double k, int H) {
    double limit = FFN_AUTO_MAX_ACTIVE * H;
    return on ? k <= FFN_AUTO_HYSTERESIS * limit : k < limit / FFN_AUTO_HYSTERESIS;
}

// whether a prefill of M rows runs the sparse FFN (min_rows: TWELL_PREFILL_MIN_ROWS unless the caller set another)
static inline int ffn_policy_prefill_sparse(int M, int min_rows) { return M >= min_rows; }

// a TwELL layer's activity above which it runs dense, until its times are measured
static inline double ffn_policy_twell_dense_above(int H) { return H / TWELL_H_PER_DENSE_ACTIVE; }

// TwELL's slots per block for a layer whose units fire `per_tile` times per row and tile of 256 (< 0: not
// measured yet): the fewest of 3, 7, 15, 31 that a Poisson count of that mean exceeds for about 0.2% of the
// tiles at most
static inline int ffn_policy_twell_slots(double per_tile) {
    if (per_tile < 0) { return 31; }
    return per_tile <= 0.5 ? 3 : per_tile <= 2 ? 7 : per_tile <= 6 ? 15 : 31;
}

// whether a decode step of B rows gates through the int8 screen (when the screen's kernel takes the shape)
static inline int ffn_policy_decode_screened(int B) { return B <= SCREEN_MAX_ROWS; }

#endif // LLMC_FFN_POLICY_H
