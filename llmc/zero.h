/*
 Which process owns which parameters in ZeRO-1 data parallelism. Plain C: the
 layout, and the re-sharding of a checkpoint's optimizer state between process
 counts, are tested on the CPU.

 The flat parameter layout (llmc/model.h) is cut into buckets: one per layer of
 each per-layer tensor (attn_norm, wqkv, wo, ffn_norm, wg, wu, wdT of layer l)
 and one each for wte, the final norm and an untied output head (layer -1; a
 tied model has no lm_head bucket). A bucket is the unit of
 communication: its gradients are final once the backward has passed its layer,
 so it is reduce-scattered while the backward goes on below it. Of a bucket of
 c elements, P processes each own q = c / P consecutive ones, rank r those at
 r q, and the last rank also the c - P q left over:
     rank r < P-1:  [r q, r q + q)        rank P-1:  [(P-1) q, c)
 A rank keeps master weights and AdamW moments for what it owns, packed in
 increasing flat order: its segments. With one process a rank owns every
 bucket whole, so its packed order is the flat order itself.
*/
#ifndef LLMC_ZERO_H
#define LLMC_ZERO_H

#include <stddef.h>
#include <string.h>
#include "llmc/model.h"
#include "llmc/utils.h"

typedef struct {
    size_t offset;  // first element in the flat layout
    size_t count;
    int layer;      // the layer whose backward completes it; -1: after the whole backward
} ZeroBucket;

typedef struct {
    size_t offset;  // first element in the flat layout
    size_t count;
    size_t packed;  // where it starts in this rank's packed arrays
    int decay;      // weight decay applies (matrices)
} ZeroSegment;

typedef struct {
    int num_processes, rank;
    int num_layers;
    int num_buckets;
    ZeroBucket* buckets;    // in flat order
    size_t* bucket_packed;  // [num_buckets] where this rank's share of each bucket starts in its packed arrays
    int num_segments;
    ZeroSegment* segments;  // this rank's, in flat order, contiguous ones merged
    size_t owned;           // elements this rank owns
} ZeroLayout;

// rank r's share of a bucket of `count` elements: [*start, *start + *len)
static inline void zero_share(size_t count, int P, int r, size_t* start, size_t* len) {
    size_t q = count / (size_t)P;
    *start = (size_t)r * q;
    *len = r == P - 1 ? count - (size_t)(P - 1) * q : q;
}

static inline void zero_layout_init(ZeroLayout* z, const GPTConfig* c, int P, int rank) {
    if (P < 1 || rank < 0 || rank >= P) { fatal("ZeRO layout for rank %d of %d processes", rank, P); }
    memset(z, 0, sizeof(*z));
    z->num_processes = P;
    z->rank = rank;
    z->num_layers = c->num_layers;
    size_t sizes[NUM_PARAM_TENSORS], offsets[NUM_PARAM_TENSORS];
    param_sizes(sizes, c);
    param_offsets(offsets, c);
    int L = c->num_layers;
    z->buckets = (ZeroBucket*)mallocCheck((size_t)NUM_PARAM_TENSORS * L * sizeof(ZeroBucket));
    z->segments = (ZeroSegment*)mallocCheck((size_t)NUM_PARAM_TENSORS * L * sizeof(ZeroSegment));
    z->bucket_packed = (size_t*)mallocCheck((size_t)NUM_PARAM_TENSORS * L * sizeof(size_t));
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        if (sizes[i] == 0) { continue; } // (lm_head of a tied model)
        int per_layer = i != P_WTE && i != P_FINAL_NORM && i != P_LM_HEAD;
        int parts = per_layer ? L : 1;
        for (int l = 0; l < parts; l++) {
            ZeroBucket* b = &z->buckets[z->num_buckets++];
            b->count = sizes[i] / parts;
            b->offset = offsets[i] + (size_t)l * b->count;
            b->layer = per_layer ? l : -1;
            size_t start, len;
            zero_share(b->count, P, rank, &start, &len);
            z->bucket_packed[z->num_buckets - 1] = z->owned;
            if (len == 0) { continue; }
            ZeroSegment* prev = z->num_segments ? &z->segments[z->num_segments - 1] : NULL;
            int decay = param_is_matrix(i);
            if (prev && prev->offset + prev->count == b->offset + start && prev->decay == decay) {
                prev->count += len;
            } else {
                ZeroSegment* s = &z->segments[z->num_segments++];
                s->offset = b->offset + start;
                s->count = len;
                s->packed = z->owned;
                s->decay = decay;
            }
            z->owned += len;
        }
    }
}

static inline void zero_layout_free(ZeroLayout* z) {
    free(z->buckets);
    free(z->segments);
    free(z->bucket_packed);
    memset(z, 0, sizeof(*z));
}

// packed[0..owned) <- full[segments] (pack) or full[segments] <- packed (unpack)
static inline void zero_pack(float* packed, const float* full, const ZeroLayout* z) {
    for (int i = 0; i < z->num_segments; i++) {
        const ZeroSegment* s = &z->segments[i];
        memcpy(packed + s->packed, full + s->offset, s->count * sizeof(float));
    }
}

static inline void zero_unpack(float* full, const float* packed, const ZeroLayout* z) {
    for (int i = 0; i < z->num_segments; i++) {
        const ZeroSegment* s = &z->segments[i];
        memcpy(full + s->offset, packed + s->packed, s->count * sizeof(float));
    }
}

#endif // LLMC_ZERO_H
