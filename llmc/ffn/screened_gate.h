/*
 The screened decode gate: the fired units of the bf16 gate g = f Wg^T, and
 their g to the bit, from an int8 copy of Wg plus the bf16 rows of the few
 units it cannot rule out. CPU reference of llmc/ffn/cuda_screened_gate.cuh, in
 the GPU's order of operations so that both give the same bits. Plain C++: the
 CPU tests build it with the sanitizers. bf16 values are kept as their 16 bits
 (uint16_t), as in llmc/ffn/twell.h; f holds bf16 values as floats.

 What the decode needs. For each of a few rows f_b (width D) and unit n, the
 bf16 gate is g_bn = bf16(G_bn), G_bn the fp32 sum of the decode GEMV: lane l
 of a warp sums columns 256 j + 8 l .. + 7 of each step j by fused
 multiply-adds, then a butterfly adds the 32 lanes (screen_gemv_dot). Unit n
 fires for row b when g_bn > 0, i.e. when G_bn > 0. Reading Wg in bf16 costs
 2 H D bytes a layer; the screen reads H D bytes of int8 (plus 3% of scales),
 bounds every G_bn from above, and sends to the exact bf16 product only the
 units whose bound is not <= 0 (candidates). In a sparse model most units sit
 far below 0 and cost only their int8 row.

 The int8 copy (screen_quantize; once, when the weights are loaded). Per row w:
 - its outlier: the column c of the largest finite |w_c| (the first on ties),
   kept exactly; w' = w with w'_c = 0. (The synthetic-sparse bias carrier is
   such a weight, ~100x the others: it would set its group's step.)
 - per group of SCREEN_GROUP columns (the last may be shorter), from w':
       s   = the smallest bf16 >= fl(max|w'| / 127) with 127 s >= max|w'|
       q_i = rint(fl(w'_i / s)), in [-127, 127], stored as q_i + 128
       E   = a bf16 >= ||e||_2, e = w' - s q (each e_i exact in double, the
             norm times 1 + 2^-40, then rounded up to float and to bf16)
   An all-zero group has s = E = 0; a group holding a non-finite weight has
   s = E = +inf, which makes the bound of every row NaN or +inf (a candidate).
 So w = w_c 1_c + sum_groups (s q + e), with ||e||_2 <= E and |e_i| <= s (1/2 +
 2^-17): |w'_i / s| <= 127, so fl(w'_i / s) lies within 127 u = 2^-17 of it
 (u = 2^-24, the unit roundoff of fp32).

 Why int8 with a scale and an error norm per group of 128, not per row, not
 fp8. On Gaussian rows (trained gates are close to it) the error bound below
 scales with the step, ~ max|w| / 127: a row's max is ~3.5 sigma at D 2048, a
 group of 128's ~2.7, so per-group steps cut the bound by ~25% for 2 bytes
 (s) per 128; E, 2 more bytes, makes the group's term ~1.4x smaller than the
 step alone gives when f has no outliers (the min below picks whichever is
 smaller). fp8 (e4m3) keeps 3 mantissa bits: |e_i| up to 2^-4 |w_i|, ~3.5x
 the int8 group error on Gaussian rows. Groups also localise outliers of f:
 an f entry 100x the rest enlarges only its group's term. The one outlier
 weight per row costs 4 bytes a row.

 The bound. With A = f_c w_c + sum_g s_g (f_g . q_g) (what the int8 copy
 gives) and S = |f_c w_c| + sum_g 127 s_g ||f_g||_1 (>= sum_i |f_i w_i|):
     f . w = A + sum_g f_g . e_g,
     |f_g . e_g| <= Q_g = min(||f_g||_1 s_g (1/2 + 2^-17), ||f_g||_2 E_g)   (Hoelder)
     |G - f . w| <= gamma_m' S                                              (the GEMV's sum)
 with gamma_k = k u / (1 - k u) (Higham's bound for a sum in which each term
 meets at most k roundings; terms here are exact products, or within it) and
 m' = 8 ceil(D / 256) + 5 (8 per step on a lane, then the 5 butterfly levels).
 The screen computes in fp32 (the order is below)
     U = A~ + (1 + 2^-10) Q~ + R S~ + ABS,     candidate = !(U <= 0)
 where A~ is A summed with error <= gamma_m S, m = ceil(D / 512) + 24 (16 per
 lane step, one per step for the scale, 1 for the outlier, 2 for the bound
 terms on the same lane, 5 for the butterfly); Q~, S~ are the fp32 sums of
 the Q_g and S terms from fp32 norms of f; R = 2 (m + m') u.
 - 1 + 2^-10 covers the 2^-16 of the half step and the fp32 rounding of Q~
   (its norms, products, and the roundings its terms meet: < 40 u in all).
 - R covers gamma_m + gamma_m' with a factor ~2 to spare for the rounding of
   S~ (< 30 u).
 - ABS = (2 D + 128) 2^-149 = (4 D + 256) 2^-150 covers the absolute errors
   of results in fp32's subnormal range: at most 2^-150 per multiply or fused
   multiply-add (a sum of two floats is exact there), and fewer than
   2 D + D / 16 + 170 of them (the GEMV's D, the screen's D + D / 16, the
   bound terms' few per lane). ||f_g||_2 is sqrt(ss + SCREEN_GROUP 2^-149), ss
   the fp32 sum of squares, for the same reason.
 So G <= r + ABS exactly, r the fp32 sum before the last addition (it holds
 A~ and the margined terms, their roundings within the margins); U = fl(r + ABS)
 is then >= G, and > 0 whenever G > 0 (a sum of two floats rounds to a value of
 the same sign). A lane's share of S~
 above 2^100 makes U +inf: below that no partial sum of the GEMV or of A~
 can overflow. Non-finite inputs make U NaN or +inf: a candidate, so the
 exact product gives the bf16 gate's value (NaN) there too.

 The order of the screen's sums (the GPU's; screen_upper_bound emulates it).
 Lane l of a warp takes the 16 columns 512 j + 16 l .. + 15 of each step j:
     t = fma chain of f_i q_i over the 16 columns (exact products),  acc = fma(s_g, t, acc)
 lane 0 then adds acc = fma(f_c, w_c, acc); lane l < groups adds group l's terms:
     acc = fma(min(n1 (s / 2), n2 E), 1 + 2^-10, acc),   acc = fma(n1 (127 s) [+ |f_c w_c| on lane 0], R, acc)
 then the butterfly over the 32 lanes, then + ABS. The norms of f_g: per lane
 and step, n1 = the sum of |f_i| over its 16 columns in order and ss the fma
 chain of f_i^2, then a butterfly over the 8 lanes of the group.
*/
#ifndef LLMC_FFN_SCREENED_GATE_H
#define LLMC_FFN_SCREENED_GATE_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include "llmc/memory.h"
#include "llmc/utils.h"

// the helpers the GPU shares with this file are host and device functions under nvcc
#ifdef __CUDACC__
#define SCREEN_HD __host__ __device__
#else
#define SCREEN_HD
#endif

constexpr int SCREEN_GROUP = 128;      // columns per scale (a power of 2, 16 to 512)
constexpr int SCREEN_LANE_COLS = 16;   // int8 columns a lane takes per step (one 16-byte load)
constexpr int SCREEN_STEP = 32 * SCREEN_LANE_COLS;
constexpr int SCREEN_MAX_GROUPS = 32;  // lane g holds group g's scales: D <= 4096
constexpr float SCREEN_Q_MARGIN = 1.0f + 0x1p-10f;
static_assert(SCREEN_GROUP % SCREEN_LANE_COLS == 0 && SCREEN_STEP % SCREEN_GROUP == 0, "a group is whole lanes of one step");

typedef struct {
    int H, D, groups;   // rows (units), columns, ceil(D / SCREEN_GROUP)
    uint8_t* q;         // [H, D] q + 128
    uint32_t* scales;   // [H, groups] bf16 s | bf16 E << 16
    uint32_t* outlier;  // [H] column | bf16 w_c << 16
} ScreenedGate;

static inline ScreenedGate screen_gate_create(int H, int D, Device device) {
    if (H < 1 || D < SCREEN_LANE_COLS || D % SCREEN_LANE_COLS != 0 || D > SCREEN_MAX_GROUPS * SCREEN_GROUP) {
        fatal("screened gate: H %d >= 1 and D %d a multiple of %d up to %d", H, D, SCREEN_LANE_COLS,
              SCREEN_MAX_GROUPS * SCREEN_GROUP);
    }
    ScreenedGate sg;
    sg.H = H, sg.D = D, sg.groups = (D + SCREEN_GROUP - 1) / SCREEN_GROUP;
    sg.q = (uint8_t*)device_malloc((size_t)H * D, device);
    sg.scales = (uint32_t*)device_malloc((size_t)H * sg.groups * sizeof(uint32_t), device);
    sg.outlier = (uint32_t*)device_malloc((size_t)H * sizeof(uint32_t), device);
    return sg;
}

static inline void screen_gate_free(ScreenedGate* sg, Device device) {
    device_free(sg->q, device);
    device_free(sg->scales, device);
    device_free(sg->outlier, device);
    memset(sg, 0, sizeof(*sg));
}

// rows first .. first + count - 1 of sg (one layer's units of a copy made for all layers), sharing its buffers
static inline ScreenedGate screen_gate_rows(const ScreenedGate* sg, int first, int count) {
    ScreenedGate v = *sg;
    v.H = count;
    v.q += (size_t)first * sg->D;
    v.scales += (size_t)first * sg->groups;
    v.outlier += first;
    return v;
}

// the bound's margins (see the top of the file), exact in fp32
SCREEN_HD static inline float screen_r_margin(int D) {
    const int m = (D + SCREEN_STEP - 1) / SCREEN_STEP + 24, m_gemv = 8 * ((D + 255) / 256) + 5;
    return (float)(2 * (m + m_gemv)) * 0x1p-24f;
}
SCREEN_HD static inline float screen_abs_slack(int D) { return (float)(2 * D + 128) * 0x1p-149f; }

SCREEN_HD static inline float screen_bf16_value(uint16_t bits) {
    uint32_t u = (uint32_t)bits << 16;
    float x;
    memcpy(&x, &u, sizeof(x));
    return x;
}

// the smallest bf16 >= x, for x >= 0 (+inf past the largest finite bf16)
SCREEN_HD static inline uint16_t screen_bf16_up(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof(u));
    return (uint16_t)((u >> 16) + ((u & 0xffffu) != 0));
}

// the smallest float >= x
SCREEN_HD static inline float screen_float_up(double x) {
    float f = (float)x;
    return (double)f < x ? nextafterf(f, INFINITY) : f;
}

// Quantises columns begin .. end - 1 of row w as one group, column `skip` (the
// row's outlier) taken as 0; writes q + 128 there and returns the group's
// scale word (s | E << 16).
SCREEN_HD static inline uint32_t screen_quantize_group(uint8_t* q, const uint16_t* w, int begin, int end, int skip) {
    float absmax = 0.0f;
    bool finite = true;
    for (int i = begin; i < end; i++) {
        const float v = i == skip ? 0.0f : screen_bf16_value(w[i]);
        finite = finite && isfinite(v);
        absmax = fmaxf(absmax, fabsf(v));
    }
    if (!finite || absmax == 0.0f) {
        for (int i = begin; i < end; i++) { q[i] = 128; }
        return finite ? 0u : 0x7f807f80u; // s = E = 0, or s = E = +inf
    }
    uint16_t s_bits = screen_bf16_up(absmax / 127.0f);
    // fl(absmax / 127) may sit just below the quotient, and be a bf16 itself: one step up then
    if (screen_bf16_value(s_bits) * 127.0f < absmax) { s_bits++; }
    const float s = screen_bf16_value(s_bits);
    double ss = 0.0;
    for (int i = begin; i < end; i++) {
        const float v = i == skip ? 0.0f : screen_bf16_value(w[i]);
        const float qi = rintf(v / s);
        q[i] = (uint8_t)((int)qi + 128);
        // exact: v and qi s carry 8 and 15 significant bits within 2^9 of each other's scale
        const double e = (double)v - (double)qi * (double)s;
        ss = fma(e, e, ss);
    }
    const uint16_t e_bits = screen_bf16_up(screen_float_up(sqrt(ss) * (1.0 + 0x1p-40)));
    return (uint32_t)s_bits | (uint32_t)e_bits << 16;
}

// the butterfly of the GPU's warp reductions over n values (a power of 2):
// round by round, v_i + v_(i xor offset) for offsets n/2 .. 1; every v_i ends
// with the same sum, returned
static inline float screen_butterfly(float* v, int n) {
    float next[32];
    for (int offset = n / 2; offset > 0; offset /= 2) {
        for (int i = 0; i < n; i++) { next[i] = v[i] + v[i ^ offset]; }
        memcpy(v, next, n * sizeof(float));
    }
    return v[0];
}

// ----------------------------------------------------------------------------
// the CPU reference

// the int8 copy of wg [H, D] (bf16 bits)
static inline void screen_quantize(ScreenedGate* sg, const uint16_t* wg) {
    const int D = sg->D;
    for (int n = 0; n < sg->H; n++) {
        const uint16_t* w = wg + (size_t)n * D;
        int c = 0;
        float best = -1.0f;
        for (int i = 0; i < D; i++) {
            const float v = fabsf(screen_bf16_value(w[i]));
            if (isfinite(v) && v > best) { best = v; c = i; }
        }
        for (int g = 0; g < sg->groups; g++) {
            const int end = (g + 1) * SCREEN_GROUP < D ? (g + 1) * SCREEN_GROUP : D;
            sg->scales[(size_t)n * sg->groups + g] = screen_quantize_group(sg->q + (size_t)n * D, w, g * SCREEN_GROUP, end, c);
        }
        sg->outlier[n] = (uint32_t)c | (uint32_t)w[c] << 16;
    }
}

// The GEMV's fp32 sum G = f . w (see the top of the file)
static inline float screen_gemv_dot(const float* f, const uint16_t* w, int D) {
    float lane[32];
    for (int l = 0; l < 32; l++) {
        float acc = 0.0f;
        for (int k = 8 * l; k < D; k += 256) {
            for (int e = 0; e < 8; e++) { acc = fmaf(f[k + e], screen_bf16_value(w[k + e]), acc); }
        }
        lane[l] = acc;
    }
    return screen_butterfly(lane, 32);
}

// n1[g] = ||f_g||_1 and n2[g] >= ||f_g||_2 of one row f, in the GPU's order
static inline void screen_group_norms(float* n1, float* n2, const float* f, int D) {
    constexpr int LANES = SCREEN_GROUP / SCREEN_LANE_COLS;
    for (int g = 0; g * SCREEN_GROUP < D; g++) {
        float a1[LANES], a2[LANES];
        for (int k = 0; k < LANES; k++) {
            a1[k] = a2[k] = 0.0f;
            const int col = g * SCREEN_GROUP + k * SCREEN_LANE_COLS;
            for (int e = 0; e < SCREEN_LANE_COLS && col < D; e++) {
                a1[k] += fabsf(f[col + e]);
                a2[k] = fmaf(f[col + e], f[col + e], a2[k]);
            }
        }
        n1[g] = screen_butterfly(a1, LANES);
        n2[g] = sqrtf(screen_butterfly(a2, LANES) + (float)SCREEN_GROUP * 0x1p-149f);
    }
}

// U >= G of unit n and row f (n1, n2: screen_group_norms of f), in the GPU's order
static inline float screen_upper_bound(const ScreenedGate* sg, int n, const float* f, const float* n1, const float* n2) {
    const int D = sg->D;
    const uint8_t* q = sg->q + (size_t)n * D;
    const uint32_t* scales = sg->scales + (size_t)n * sg->groups;
    const int c = (int)(sg->outlier[n] & 0xffffu);
    const float w_c = screen_bf16_value((uint16_t)(sg->outlier[n] >> 16)), r_margin = screen_r_margin(D);
    float lane[32];
    for (int l = 0; l < 32; l++) {
        float acc = 0.0f;
        for (int col = SCREEN_LANE_COLS * l; col < D; col += SCREEN_STEP) {
            float t = 0.0f;
            for (int e = 0; e < SCREEN_LANE_COLS; e++) { t = fmaf(f[col + e], (float)((int)q[col + e] - 128), t); }
            acc = fmaf(screen_bf16_value((uint16_t)scales[col / SCREEN_GROUP]), t, acc);
        }
        if (l == 0) { acc = fmaf(f[c], w_c, acc); }
        if (l < sg->groups) {
            const float s = screen_bf16_value((uint16_t)scales[l]), E = screen_bf16_value((uint16_t)(scales[l] >> 16));
            acc = fmaf(fminf(n1[l] * (0.5f * s), n2[l] * E), SCREEN_Q_MARGIN, acc);
            float S = n1[l] * (127.0f * s);
            if (l == 0) { S += fabsf(f[c] * w_c); }
            acc = fmaf(S, r_margin, acc);
            if (!(S <= 0x1p100f)) { acc = INFINITY; }
        }
        lane[l] = acc;
    }
    return screen_butterfly(lane, 32) + screen_abs_slack(D);
}

// The screened gate of B rows f [B, D]: G [B, H] holds the GEMV's sum of each
// unit that is a candidate for some row (all B rows of it: the GPU reads its
// bf16 row once) and 0 elsewhere; so relu(bf16(G)) is the bf16 gate's.
// candidates[b] counts the candidates of row b, candidates[B] the units recomputed.
static inline void screen_gate_reference(float* G, int* candidates, const ScreenedGate* sg, const uint16_t* wg,
                                         const float* f, int B) {
    const int H = sg->H, D = sg->D;
    float* norms = (float*)mallocCheck((size_t)2 * B * sg->groups * sizeof(float));
    for (int b = 0; b < B; b++) {
        screen_group_norms(norms + (size_t)2 * b * sg->groups, norms + (size_t)(2 * b + 1) * sg->groups, f + (size_t)b * D, D);
    }
    for (int b = 0; b <= B; b++) { candidates[b] = 0; }
    for (int n = 0; n < H; n++) {
        bool any = false;
        for (int b = 0; b < B; b++) {
            const float* nb = norms + (size_t)2 * b * sg->groups;
            const bool candidate = !(screen_upper_bound(sg, n, f + (size_t)b * D, nb, nb + sg->groups) <= 0.0f);
            candidates[b] += candidate;
            any = any || candidate;
        }
        candidates[B] += any;
        for (int b = 0; b < B; b++) {
            G[(size_t)b * H + n] = any ? screen_gemv_dot(f + (size_t)b * D, wg + (size_t)n * D, D) : 0.0f;
        }
    }
    free(norms);
}

#endif // LLMC_FFN_SCREENED_GATE_H
