/*
 The GPU half of the FFN's face for inference (llmc/ffn/ffn.h, which includes
 this file): the bf16 overloads of the cached FFN. A decode step runs the
 fired units only (llmc/ffn/cuda_decode.cuh, its gate screened through an
 int8 copy of Wg where policy.h says); a prefill of enough rows runs a layer's
 hot units (llmc/ffn/hot.h) as the dense FFN over them plus TwELL over its
 cold ones (llmc/ffn/cuda_twell.cuh), with no wait for the host; everything
 else runs dense.
*/
#ifndef LLMC_FFN_CUDA_FFN_CUH
#define LLMC_FFN_CUDA_FFN_CUH

#include "llmc/cuda_common.cuh"
#include "llmc/ffn/cuda_decode.cuh"
#include "llmc/ffn/cuda_dense.cuh"
#include "llmc/ffn/cuda_twell.cuh"
#include "llmc/ffn/policy.h"
#include "llmc/ffn/screened_gate.h"

template <>
struct FfnCache<bf16> {
    SparseDecode decode;  // the sparse FFN of a decode step
    ScreenedGate screen;  // its gate's int8 copy of every layer's Wg (made at the first sparse decode)
    int screen_stale;     // 1: the weights changed since the copy was made
    TwellPrefill twell;   // the TwELL FFN of a prefill
};

static inline void ffn_cache_init(FfnCache<bf16>* cache, const Ffn<bf16>* ffn, int max_seqs) {
    memset(cache, 0, sizeof(*cache));
    sparse_decode_alloc(&cache->decode, max_seqs, ffn->H);
    twell_prefill_init(&cache->twell, ffn->L, ffn->H);
}

static inline void ffn_cache_free(FfnCache<bf16>* cache) {
    sparse_decode_free(&cache->decode);
    screen_gate_free(&cache->screen, DEVICE_CUDA);
    twell_prefill_free(&cache->twell);
}

static inline void ffn_cache_stale(FfnCache<bf16>* cache) { cache->screen_stale = 1; }

// the int8 copy of the gates, outside any graph (a graph keeps its pointers, not its contents)
static inline void ffn_decode_prepare(FfnCache<bf16>* cache, Ffn<bf16>* ffn, int B) {
    if (ffn->mode != FFN_SPARSE || !ffn_policy_decode_screened(B) || !screened_gate_fits(B, ffn->D)) { return; }
    if (cache->screen.q != NULL && !cache->screen_stale) { return; }
    if (cache->screen.q == NULL) { cache->screen = screen_gate_create(ffn->L * ffn->H, ffn->D, DEVICE_CUDA); }
    screen_quantize(&cache->screen, ffn->layer[0].wg); // (the layers' gates follow layer 0's)
    cache->screen_stale = 0;
}

static inline int ffn_prefill_sparse(const FfnCache<bf16>* cache, const Ffn<bf16>* ffn, int M) {
    return ffn->mode == FFN_SPARSE && twell_prefill_takes(&cache->twell, M, ffn->D);
}

static inline void ffn_forward_cached(FfnCache<bf16>* cache, Ffn<bf16>* ffn, int l, bf16* y, const bf16* f, int M,
                                      int decode, bf16* scratch, unsigned long long* fired = NULL,
                                      unsigned long long* fired_union = NULL) {
    const FfnLayer<bf16>* fl = &ffn->layer[l];
    const int D = ffn->D, H = ffn->H;
    if (ffn->mode == FFN_SPARSE && decode) {
        ScreenedGate rows = cache->screen.q ? screen_gate_rows(&cache->screen, l * H, H) : cache->screen;
        ffn_sparse_decode(y, &cache->decode, f, fl->wg, fl->wu, fl->wdT, M, D, H, cache->screen.q ? &rows : NULL,
                          scratch, fired, fired_union);
        return;
    }
    if (!decode && ffn_prefill_sparse(cache, ffn, M)) {
        // TwELL over the layer's cold units, then its hot units (its first ones) as the dense FFN over them,
        // added; exact in one pass, no wait for the host
        int hot = fl->hot_units;
        size_t off = (size_t)hot * D;
        if (hot < H) {
            twell_prefill_run(&cache->twell, l, y, f, fl->wg + off, fl->wu + off, fl->wdT + off, M, D, H - hot, scratch);
        }
        if (hot > 0) {
            ffn_dense_forward(y, scratch, scratch + (size_t)M * hot, f, fl->wg, fl->wu, fl->wdT, M, D, hot,
                              (unsigned long long*)NULL, false, hot < H);
        }
        return;
    }
    ffn_dense_forward(y, scratch, scratch + (size_t)M * H, f, fl->wg, fl->wu, fl->wdT, M, D, H, fired,
                      decode, 0, ffn->activation);
}

static inline void ffn_prefill_sparse_layer(FfnCache<bf16>* cache, Ffn<bf16>* ffn, int l, bf16* y, const bf16* f,
                                            int M, bf16* scratch) {
    const FfnLayer<bf16>* fl = &ffn->layer[l];
    twell_prefill_run(&cache->twell, l, y, f, fl->wg, fl->wu, fl->wdT, M, ffn->D, ffn->H, scratch);
}

static inline void ffn_prefill_cold_units(FfnCache<bf16>* cache, Ffn<bf16>* ffn, int l, int units, double active,
                                          bf16* y, const bf16* f, int M, bf16* scratch) {
    const FfnLayer<bf16>* fl = &ffn->layer[l];
    const size_t off = (size_t)(ffn->H - units) * ffn->D;
    twell_prefill_probe(&cache->twell, y, f, fl->wg + off, fl->wu + off, fl->wdT + off, M, ffn->D, units, active,
                        scratch);
}

#endif // LLMC_FFN_CUDA_FFN_CUH
