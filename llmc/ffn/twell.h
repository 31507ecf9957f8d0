/*
 TwELL (tile-wise ELLPACK): the sparse format of the gate activations of a
 ReLU-gated FFN, and the CPU reference of what the GPU path (llmc/ffn/cuda_twell.cuh)
 computes with it. Plain C++, no CUDA: the CPU tests build it with the sanitizers.

 The FFN of one layer, M token rows f_m of width D, H hidden units:
     g = f Wg^T,   u = f Wu^T,   h = relu(g) * u,   y = h Wd^T = sum_n h[:, n] WdT[n]
 (WdT [H, D] is W_d transposed: row n holds hidden unit n's down weights). Only
 units with g > 0 contribute; with L1-trained gates that is ~0.5% of them, so
 after the one dense product g, the FFN only needs, per row m and active unit n,
     u_mn = f_m . Wu[n],   a_mn = g_mn u_mn,   y_m += a_mn WdT[n].

 The format, for the [M, H] gate output g. The H columns are cut into
 T = ceil(H / TW) tiles of TW columns (TW = the gate GEMM's output tile width,
 so that the GEMM's epilogue packs its own tile with no cross-CTA step). Per row
 m and tile t, a block of 1 + S uint32 words at words[(m * T + t) * (1 + S)]:
     word 0         c = the number of columns of the tile with g > 0 (the true count)
     c <= S         words 1..c: column within the tile | bf16(g) << 16, in increasing
                    column order (nothing else of the block is written)
     c > S          word 1: the index of an overflow record, or TWELL_RECORD_LOST when
                    the record buffer was full (nothing else written)
 ReLU is applied while packing: only g > 0 is kept. An overflow record is the
 tile's row of relu(g) as bf16, TW values (0 past H), so an overflowing tile is
 computed exactly from it. The packer counts every record it needs, including
 those it could not store: a caller whose record buffer was too small sees how
 many it needed, grows the buffer and redoes the step. Until then every row that
 lost a record comes out of the FFN as NaN: never silently wrong.

 bf16 values are kept as their 16 bits (uint16_t) here; bf16 -> float is exact.
*/
#ifndef LLMC_FFN_TWELL_H
#define LLMC_FFN_TWELL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "llmc/utils.h"

// the functions the GPU kernels share with this file are host and device functions under nvcc
#ifdef __CUDACC__
#define TWELL_HD __host__ __device__
#else
#define TWELL_HD
#endif

// word 1 of a block whose overflow record could not be stored
#define TWELL_RECORD_LOST 0xFFFFFFFFu

// TW of every GPU packer (the GEMMs' output tile width), and its slots: the
// paper's compression factor 8, a block of TW / 8 words (one per lane of a
// warp), so S = TW / 8 - 1
constexpr int TWELL_TILE = 256;
constexpr int TWELL_SLOTS = TWELL_TILE / 8 - 1;

// ----------------------------------------------------------------------------
// a block, word by word: the one decoder of the CPU reference, the inference
// kernels (llmc/ffn/cuda_twell.cuh) and the training kernels that read the
// fused gate's blocks (llmc/ffn/cuda_ell.cuh)

// an entry: the column within the tile and g's bf16 bits
TWELL_HD static inline uint32_t twell_entry_word(int col, uint32_t g_bits) { return (uint32_t)col | g_bits << 16; }
TWELL_HD static inline int twell_entry_col(uint32_t word) { return (int)(word & 0xffffu); }
TWELL_HD static inline uint32_t twell_entry_bits(uint32_t word) { return word >> 16; }

// what a block of S slots holds, from its count (word 0) and word 1
typedef enum { TWELL_BLOCK_ENTRIES, TWELL_BLOCK_RECORD, TWELL_BLOCK_LOST } TwellBlockKind;
TWELL_HD static inline TwellBlockKind twell_block_kind(uint32_t count, uint32_t word1, int slots) {
    if (count <= (uint32_t)slots) { return TWELL_BLOCK_ENTRIES; }
    return word1 == TWELL_RECORD_LOST ? TWELL_BLOCK_LOST : TWELL_BLOCK_RECORD;
}

// the entries a block lists for the FFN: its count, or one (NaN) for a lost record
TWELL_HD static inline int twell_block_listed(uint32_t count, uint32_t word1, int slots) {
    return twell_block_kind(count, word1, slots) == TWELL_BLOCK_LOST ? 1 : (int)count;
}

typedef struct {
    int rows;            // M
    int cols;            // H
    int tile_width;      // TW
    int slots;           // S: (column, value) slots per block
    int tiles;           // T = ceil(H / TW)
    int record_capacity; // overflow records the record buffer holds
} Twell;

// the paper's compression factor 8: a block is TW / 8 words, so S = TW / 8 - 1
static inline Twell twell_layout(int rows, int cols, int tile_width, int slots, int record_capacity) {
    if (rows < 1 || cols < 1) { fatal("twell: M %d and H %d must be >= 1", rows, cols); }
    if (tile_width < 4 || tile_width > 65536 || tile_width % 4 != 0) {
        fatal("twell: tile width %d must be a multiple of 4 in [4, 65536]", tile_width);
    }
    if (slots < 1) { fatal("twell: slots %d must be >= 1 (word 1 holds the record index)", slots); }
    if (record_capacity < 0) { fatal("twell: record capacity %d must be >= 0", record_capacity); }
    Twell tw = {rows, cols, tile_width, slots, (cols + tile_width - 1) / tile_width, record_capacity};
    return tw;
}

static inline size_t twell_words_per_block(const Twell* tw) { return (size_t)tw->slots + 1; }
static inline size_t twell_num_words(const Twell* tw) {
    return (size_t)tw->rows * tw->tiles * twell_words_per_block(tw);
}
static inline size_t twell_record_values(const Twell* tw) { return (size_t)tw->record_capacity * tw->tile_width; }

static inline uint32_t twell_entry(int col, float value) { return twell_entry_word(col, bf16_from_float(value)); }
static inline float twell_entry_value(uint32_t word) { return float_from_bf16((uint16_t)twell_entry_bits(word)); }

// ----------------------------------------------------------------------------
// pack and unpack

// Packs g [M, H] (floats, e.g. bf16-rounded gate outputs). Records are numbered
// in row-major block order. Returns the number of records needed (may exceed the
// capacity; the blocks past it say TWELL_RECORD_LOST).
static inline int twell_pack_cpu(uint32_t* words, uint16_t* records, const float* g, const Twell* tw) {
    const int TW = tw->tile_width, S = tw->slots;
    int needed = 0;
    for (int m = 0; m < tw->rows; m++) {
        for (int t = 0; t < tw->tiles; t++) {
            uint32_t* block = words + ((size_t)m * tw->tiles + t) * twell_words_per_block(tw);
            const float* row = g + (size_t)m * tw->cols + (size_t)t * TW;
            int width = tw->cols - t * TW < TW ? tw->cols - t * TW : TW;
            int count = 0;
            for (int c = 0; c < width; c++) { count += row[c] > 0.0f; }
            block[0] = (uint32_t)count;
            if (count <= S) {
                int slot = 1;
                for (int c = 0; c < width; c++) {
                    if (row[c] > 0.0f) { block[slot++] = twell_entry(c, row[c]); }
                }
                continue;
            }
            int r = needed++;
            if (r >= tw->record_capacity) { block[1] = TWELL_RECORD_LOST; continue; }
            block[1] = (uint32_t)r;
            uint16_t* rec = records + (size_t)r * TW;
            for (int c = 0; c < TW; c++) { rec[c] = c < width && row[c] > 0.0f ? bf16_from_float(row[c]) : 0; }
        }
    }
    return needed;
}

// The dense relu(g) [M, H] that a packed buffer stands for (values rounded to
// bf16); the tiles whose record was lost are NaN.
static inline void twell_unpack_cpu(float* gate, const uint32_t* words, const uint16_t* records, const Twell* tw) {
    const int TW = tw->tile_width;
    for (int m = 0; m < tw->rows; m++) {
        for (int t = 0; t < tw->tiles; t++) {
            const uint32_t* block = words + ((size_t)m * tw->tiles + t) * twell_words_per_block(tw);
            float* row = gate + (size_t)m * tw->cols + (size_t)t * TW;
            int width = tw->cols - t * TW < TW ? tw->cols - t * TW : TW;
            uint32_t count = block[0];
            TwellBlockKind kind = twell_block_kind(count, block[1], tw->slots);
            if (kind == TWELL_BLOCK_ENTRIES) {
                for (int c = 0; c < width; c++) { row[c] = 0.0f; }
                for (uint32_t e = 1; e <= count; e++) { row[twell_entry_col(block[e])] = twell_entry_value(block[e]); }
            } else if (kind == TWELL_BLOCK_LOST) {
                for (int c = 0; c < width; c++) { row[c] = NAN; }
            } else {
                const uint16_t* rec = records + (size_t)block[1] * TW;
                for (int c = 0; c < width; c++) { row[c] = float_from_bf16(rec[c]); }
            }
        }
    }
}

// ----------------------------------------------------------------------------
// the FFN on the CPU (fp32 in and out, sums in double)

// g[M, H] = f[M, D] Wg[H, D]^T
static inline void gate_cpu(float* g, const float* f, const float* wg, int M, int D, int H) {
    #pragma omp parallel for
    for (int m = 0; m < M; m++) {
        for (int n = 0; n < H; n++) {
            double s = 0.0;
            for (int d = 0; d < D; d++) { s += (double)f[(size_t)m * D + d] * wg[(size_t)n * D + d]; }
            g[(size_t)m * H + n] = (float)s;
        }
    }
}

// y = (relu(g) * (f Wu^T)) Wd^T, every unit visited (the dense reference)
static inline void ffn_dense_from_gate_cpu(float* y, const float* f, const float* g, const float* wu, const float* wdT,
                                           int M, int D, int H) {
    #pragma omp parallel for
    for (int m = 0; m < M; m++) {
        const float* fm = f + (size_t)m * D;
        double* acc = (double*)callocCheck((size_t)D, sizeof(double));
        for (int n = 0; n < H; n++) {
            double gate = g[(size_t)m * H + n];
            gate = gate > 0.0 ? gate : 0.0;
            double u = 0.0;
            for (int d = 0; d < D; d++) { u += (double)fm[d] * wu[(size_t)n * D + d]; }
            double h = gate * u;
            for (int d = 0; d < D; d++) { acc[d] += h * wdT[(size_t)n * D + d]; }
        }
        for (int d = 0; d < D; d++) { y[(size_t)m * D + d] = (float)acc[d]; }
        free(acc);
    }
}

// the same FFN from a packed gate: only the active units are visited; a row
// with a lost record is NaN
static inline void twell_ffn_cpu(float* y, const float* f, const float* wu, const float* wdT, const uint32_t* words,
                                 const uint16_t* records, const Twell* tw, int D) {
    const int TW = tw->tile_width;
    #pragma omp parallel for
    for (int m = 0; m < tw->rows; m++) {
        const float* fm = f + (size_t)m * D;
        double* acc = (double*)callocCheck((size_t)D, sizeof(double));
        int lost = 0;
        for (int t = 0; t < tw->tiles; t++) {
            const uint32_t* block = words + ((size_t)m * tw->tiles + t) * twell_words_per_block(tw);
            uint32_t count = block[0];
            TwellBlockKind kind = twell_block_kind(count, block[1], tw->slots);
            if (kind == TWELL_BLOCK_LOST) { lost = 1; continue; }
            const uint16_t* rec = kind == TWELL_BLOCK_RECORD ? records + (size_t)block[1] * TW : NULL;
            int entries = rec ? TW : (int)count;
            for (int e = 0; e < entries; e++) {
                int col = rec ? e : twell_entry_col(block[1 + e]);
                double gate = rec ? float_from_bf16(rec[e]) : twell_entry_value(block[1 + e]);
                if (gate == 0.0) { continue; } // only records hold zeros
                int n = t * TW + col;
                double u = 0.0;
                for (int d = 0; d < D; d++) { u += (double)fm[d] * wu[(size_t)n * D + d]; }
                double a = gate * u;
                for (int d = 0; d < D; d++) { acc[d] += a * wdT[(size_t)n * D + d]; }
            }
        }
        for (int d = 0; d < D; d++) { y[(size_t)m * D + d] = lost ? NAN : (float)acc[d]; }
        free(acc);
    }
}

#endif // LLMC_FFN_TWELL_H
