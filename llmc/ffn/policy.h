/*
 Every choice between the FFN's paths, in one table: which path a layer runs,
 training and inference, and why. The kernels carry out a choice; they never
 make one. Figures behind each row: dev/RESULTS.md and dev/NOTES.md (the
 sections named).

 | where            | rule                                                   | why                                        |
 |------------------|--------------------------------------------------------|--------------------------------------------|
 | training, a layer| its path, every FFN_HOT_EVERY steps (a prefill: once,  | a unit that fires for a share p of the     |
 | (--ffn auto and  | no wait, no dense): the busiest h units hot, h = 0     | tokens costs the sparse part p gathered    |
 | sparse), and a   | (all cold), a multiple of FFN_HOT_ALIGN or H (auto:    | pairs per token, a dense column a fixed    |
 | prefill's hot set| the dense layer), with the least modelled time (the    | amount; the dense layer is the path with   |
 |                  | costs measured on the device, a cold part's constant   | every unit hot; a cold part of any size    |
 |                  | from its last FFN_HOT_ALIGN units timed alone, each    | runs its whole pipeline of kernels (64     |
 |                  | layer's own pair prices measured where it ran:         | cold units lost 0.92x to dense: "One path  |
 |                  | llmc/ffn/hot.h); changed when that saves               | per layer from measured costs"); a busy    |
 |                  | FFN_PATH_MARGIN, FFN_PATH_MIN_STEPS after the last     | unit's pair costs less than an average one |
 |                  | change, and a path but the last two the layer was      | ("Hot units as dense GEMMs"); the margin   |
 |                  | timed on (or the dense layer, timed) also its model's  | and the wait keep a layer near a boundary  |
 |                  | last miss there, up to FFN_PATH_MISS_MAX               | from flapping; a path not timed is priced  |
 |                  | (ffn_policy_path_change)                               | by extrapolation, which missed the pattern |
 |                  |                                                        | model's splits by 2-15%: with the margin   |
 |                  |                                                        | alone its layers changed 37-58 times in    |
 |                  |                                                        | 1500 steps (the cap, the largest of those: |
 |                  |                                                        | no model far off holds a layer for good)   |
 | training, before | dense or all cold by the prior costs FFN_PRIOR_GATE,   | the first sparse step measures the costs;  |
 | costs are        | FFN_PRIOR_PAIR (in units of the dense layer's cost per | the prior is optimistic (a pair measured   |
 | measured (and on | unit and token); no hot units                          | about 75 on an H100) so that a layer that  |
 | the CPU)         |                                                        | may gain is tried, then measured           |
 | training, a cold | grown to what an overflowing forward needed (and the   | a redone forward and a reallocation (a     |
 | part's tail      | later layers with it: their counts missed the lost     | device sync) cost more than the memory;    |
 | (rows past the   | rows), the forward redone; given back when FFN_TAIL_   | shrunk at once, the later layers' tails    |
 | ELL width)       | SHRINK_AFTER forwards in a row needed under a quarter  | grew and shrank every step of the 124M     |
 |                  | of it (ffn_overflowed, llmc/ffn/ffn.h); after a new    | run's first 300 ("Training: the tails");   |
 |                  | ELL width, FFN_TAIL_SHRINK_AFTER_RESHAPE forward       | the first tail, sized for every unit cold  |
 |                  |                                                        | at width 256, held 0.3 GiB at 1.5B         |
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
 |                  | up to GEMV_MAX_ROWS (3; llmc/cuda_matmul.cuh): the     | more than its bytes save beyond 1 row (at  |
 |                  | GEMV gate with the fused up; beyond: cuBLASLt's gate,  | 2 rows the GEMV's gate: +9%; RESULTS       |
 |                  | then up + down (ffn_policy_decode_screened)            | "Decode at 2 rows: the GEMV's gate"); from |
 |                  |                                                        | 4 rows cuBLASLt's gate + up beats the      |
 |                  |                                                        | GEMV's (RESULTS "Decode at 4 to 8 rows")   |
*/
#ifndef LLMC_FFN_POLICY_H
#define LLMC_FFN_POLICY_H

#include <math.h>

#define FFN_HOT_ALIGN 64         // hot sets are multiples of this many units (GEMM tiles)
#define FFN_HOT_EVERY 10         // training steps between re-choices of the layers' paths
#define FFN_PATH_MARGIN 0.03     // a new path must save this share of the layer's modelled time
#define FFN_PATH_MISS_MAX 0.15   // one the layer's prices hold no time for must also save their last miss, up to this
#define FFN_PATH_MIN_STEPS 20    // steps between two changes of a layer's path (its new one is measured in between)
#define FFN_HOT_PROBE 128        // the dense part is timed over this many units and four times as many
#define FFN_PRIOR_GATE 0.13      // until measured: the gate per unit and token, in dense (unit, token)s (H100: 0.63 of 4.87 ms)
#define FFN_PRIOR_PAIR 50.0      // until measured: a gathered pair, in dense (unit, token)s (H100, uniform k = 30: ~75)
#define FFN_TAIL_SHRINK_AFTER 50 // forwards in a row a cold part's tail must be over 4x its need before it shrinks
#define FFN_TAIL_SHRINK_AFTER_RESHAPE 1 // the same after its ELL width changed: the first forward at the new width tells

#define TWELL_PREFILL_MIN_ROWS 4096
#define TWELL_H_PER_DENSE_ACTIVE 44.0
#define TWELL_DENSE_PER_GATE 2.75f

#define SCREEN_MAX_ROWS 1

// training: the share of its modelled time a layer's new path must save when that path's time may be off by a
// share `miss` (0: a time measured)
static inline double ffn_policy_path_margin(double miss) { return fmax(FFN_PATH_MARGIN, fmin(miss, FFN_PATH_MISS_MAX)); }

// training: whether a layer whose path takes t_now (modelled) changes to one of t_new, `since` steps after its last
// change, where t_new may be off by a share `miss` of it
static inline int ffn_policy_path_change(double t_now, double t_new, int since, double miss) {
    return since >= FFN_PATH_MIN_STEPS && t_now - t_new > ffn_policy_path_margin(miss) * t_now;
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
