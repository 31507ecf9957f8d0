/*
 What inference (llmc/inference.h) keeps and does that only the GPU has,
 behind calls both backends answer, so that the engine never asks which one
 runs: a decode step's CUDA graph (one per batch size and class of its longest
 row's context, so that a server whose batch changes as requests come and go
 captures each once), the decode attention's split scratch, and the pinned
 buffers the logits and the greedy tokens take to the host.
 On the CPU path a step runs as plain calls and the logits are read in place.
 The CUDA half exists only when the file is compiled by nvcc, as in
 llmc/memory.h.
*/
#ifndef LLMC_INFER_DEVICE_H
#define LLMC_INFER_DEVICE_H

#include <stdint.h>
#include "llmc/memory.h"
#include "llmc/model.h"
#include "llmc/sampler.h"
#include "llmc/utils.h"
#ifdef __CUDACC__
#include <type_traits>
#include "llmc/cuda_attention_cached.cuh"
#include "llmc/cuda_classifier.cuh"
#endif

typedef struct {
    Device device;
#ifdef __CUDACC__
    CudaGraph* graphs;        // [max_seqs, classes] the decode step of each batch size and context class
                              // (attention_decode_class), for the key it was captured with
#endif
    int max_seqs;             // the batch sizes there are graphs for
    int classes;              // the context classes there are graphs for
    int cache_len;            // positions per sequence in the cache
    int context;              // the step being queued: its rows' positions are below this (the attention's bound)
    int use_graph;            // 1 (the GPU's default): a decode step is one CUDA graph
    uint16_t* logits_pinned;  // [max_seqs, Vp] bf16 bits: the logits' way to the host
    int *greedy, *greedy_pinned; // [max_seqs] each row's greedy token, on the device and its way to the host
    // the decode attention's splits (llmc/cuda_attention_cached.cuh); NULL on the CPU
    float *part_o, *part_ml;
    int* splits_done;
} InferDevice;

// for max_seqs sequences of cache_len positions of a model of config c (fatal where the GPU path cannot run it)
static inline void infer_device_init(InferDevice* d, const GPTConfig* c, int max_seqs, int cache_len, Device device) {
    memset(d, 0, sizeof(*d));
    d->device = device;
    d->cache_len = d->context = cache_len;
    if (device == DEVICE_CPU) { return; }
#ifdef __CUDACC__
    int hd = c->channels / c->num_heads;
    if (c->channels % 8 != 0 || c->hidden % 8 != 0 || !attention_decode_supports(hd)) {
        fatal("the GPU path needs D %d and H %d multiples of 8 and a head size (%d) of 16, 32, 64 or 128",
              c->channels, c->hidden, hd);
    }
    if (main_stream == 0) { cudaCheck(cudaStreamCreateWithFlags(&main_stream, cudaStreamNonBlocking)); }
    cudaCheck(cudaMallocHost(&d->logits_pinned, (size_t)max_seqs * c->padded_vocab_size * sizeof(uint16_t)));
    cudaCheck(cudaMallocHost(&d->greedy_pinned, max_seqs * sizeof(int)));
    d->greedy = (int*)cuda_malloc(max_seqs * sizeof(int));
    attention_decode_alloc(&d->part_o, &d->part_ml, &d->splits_done, max_seqs, c->num_heads, hd, cache_len);
    d->classes = attention_decode_class(cache_len) + 1;
    d->graphs = (CudaGraph*)callocCheck((size_t)max_seqs * d->classes, sizeof(CudaGraph));
    d->max_seqs = max_seqs;
    d->use_graph = 1;
#endif
}

static inline void infer_device_free(InferDevice* d) {
#ifdef __CUDACC__
    if (d->device == DEVICE_CUDA) {
        for (int g = 0; g < d->max_seqs * d->classes; g++) { cuda_graph_free(&d->graphs[g]); }
        free(d->graphs);
        cudaCheck(cudaFreeHost(d->logits_pinned));
        cudaCheck(cudaFreeHost(d->greedy_pinned));
        cuda_free(d->greedy);
        for (void* p : {(void*)d->part_o, (void*)d->part_ml, (void*)d->splits_done}) { cuda_free(p); }
    }
#endif
    memset(d, 0, sizeof(*d));
}

// runs a decode step of B rows whose positions are below longest: the work step() queues (with d->context
// set), on the GPU as the CUDA graph of batch size B and longest's class, captured again when key changes
template <typename F>
void infer_device_step(InferDevice* d, int B, int longest, long long key, F step) {
#ifdef __CUDACC__
    if (d->device == DEVICE_CUDA) {
        const int c = attention_decode_class(longest);
        d->context = attention_decode_context(c, d->cache_len);
        if (d->use_graph) {
            cuda_graph_launch(&d->graphs[(size_t)(B - 1) * d->classes + c], key, step);
            return;
        }
    }
#endif
    step();
}

// The host's view of the logits [rows, Vp] of a step (V real tokens), once the device's work is done:
// out (floats, may be NULL) all of them; best (may be NULL) each row's greedy token (logits_greedy), which on
// the GPU comes back as rows ints instead of the logits
template <typename T>
void infer_device_logits(InferDevice* d, float* out, int* best, const T* logits, int rows, int V, int Vp) {
    size_t count = (size_t)rows * Vp;
#ifdef __CUDACC__
    if constexpr (std::is_same<T, bf16>::value) {
        if (best) {
            greedy_kernel<<<rows, 1024, 0, main_stream>>>(d->greedy, logits, V, Vp);
            cudaCheck(cudaGetLastError());
            cudaCheck(cudaMemcpyAsync(d->greedy_pinned, d->greedy, rows * sizeof(int), cudaMemcpyDeviceToHost,
                                      main_stream));
        }
        if (out) {
            cudaCheck(cudaMemcpyAsync(d->logits_pinned, logits, count * sizeof(bf16), cudaMemcpyDeviceToHost,
                                      main_stream));
        }
        cudaCheck(cudaStreamSynchronize(main_stream));
        for (size_t i = 0; out && i < count; i++) { out[i] = float_from_bf16(d->logits_pinned[i]); }
        if (best) { memcpy(best, d->greedy_pinned, rows * sizeof(int)); }
    } else
#endif
    {
        for (size_t i = 0; out && i < count; i++) { out[i] = (float)logits[i]; }
        for (int r = 0; best && r < rows; r++) { best[r] = logits_greedy(logits + (size_t)r * Vp, V); }
    }
}

#endif // LLMC_INFER_DEVICE_H
