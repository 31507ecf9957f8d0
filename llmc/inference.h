/*
 The inference engine: the forward of llmc/gpt.h over a key/value cache, for
 a batch of sequences. A prefill feeds a batch of prompts of any lengths; then each
 decode step feeds one new token of every sequence. Per layer l and row
 (sequence s, position p):
     a = RMSNorm(x);  qkv = a Wqkv^T;  RoPE(q, k at p);  cache[l, s, p] = k, v
     x += Attn(q, cache[l, s, 0..p]) Wo^T
     f = RMSNorm(x);  x += FFN(f)
 and logits = RMSNorm(x) E^T of each sequence's last row.

 A prefill's prompts are the rows of one [M, D] batch (M = the sum of their
 lengths): the products, norms and the FFN do not care where a sequence ends;
 RoPE and the cache take each row's sequence and position from arrays on the
 device, and attention runs per prompt over its own rows. A prompt may also
 be a chunk of a longer one (gpt_prefill_chunks: any cache slot, from any
 position): its rows then attend to what the chunks before it left in the
 cache too, so a server can prefill a long prompt a piece at a time between
 decode steps. A decode step has a row per sequence, each in its own cache
 slot (gpt_decode_slots: any slots, so sequences come and go); on the GPU its
 linear layers are a GEMV of our own for up to 3 rows, and from 4 to 16 rows
 our tensor-core product where its blocks fit one wave (llmc/cuda_matmul.cuh),
 its attention splits a long cache over many SMs
 (llmc/cuda_attention_cached.cuh), and the step is queued as one CUDA graph
 per batch size and context class (llmc/infer_device.h; tokens, positions and
 slots live in device memory: no allocation and no wait for the host inside
 it), so its launches cost the
 GPU's time, not the host's. The decode steps can count the FFN's units that
 fire (infer_state_count_fired), for the server's metrics.
 The FFN of a layer is llmc/ffn/ffn.h's (ffn_forward_cached), what only the
 GPU has is llmc/infer_device.h's: this file never asks which backend runs.
*/
#ifndef LLMC_INFERENCE_H
#define LLMC_INFERENCE_H

#include <vector>
#include "llmc/ffn/ffn.h"
#include "llmc/gpt.h"
#include "llmc/infer_device.h"
#ifdef __CUDACC__
#include "llmc/cuda_attention_cached.cuh"
#endif

template <typename T>
struct InferState {
    int max_seqs;      // sequences the cache holds (the decode batch)
    int max_rows;      // tokens of one prefill (the sum of the prompts' lengths)
    int cache_len;     // positions per sequence in the cache (<= max_seq_len)
    T *k_cache, *v_cache; // [L, max_seqs, cache_len, KVD] keys after RoPE, values
    // activations, [rows, ...] with rows = max(max_rows, max_seqs)
    T *x, *x_mid, *normed, *qkv, *att, *proj;
    T* gu;             // [rows, 2H]: g and u of the dense FFN, the sparse FFNs' scratch
    T* last;           // [max_seqs, D] each sequence's last row, final-normed
    T* logits;         // [max_seqs, Vp]
    int *tokens, *row_slot, *row_pos; // [rows]: each row's token, sequence (cache slot) and position
    int* last_row;     // [max_seqs] each prompt's last row
    unsigned long long* fired; // [L] FFN units that fired in the decode steps since gpt_fired_read, summed over
                               // the rows (NULL: not counted; infer_state_count_fired turns it on)
    unsigned long long* fired_union; // [L] the units some row of a step fired, summed over the steps (the GPU's
                                     // sparse decode only; NULL: not counted)
    float* lse;        // [max_rows, NH] the prefill attention's log-sum-exp (the GPU's; NULL on the CPU)
    // called before layer l's FFN of a prefill of M rows (the synthetic-sparse
    // benchmark model sets its gates there, llmc/synthetic.h); NULL: nothing
    void (*before_ffn)(void* ctx, int layer, int M);
    void* before_ffn_ctx;
    FfnCache<T> ffn;   // the FFN's inference state (llmc/ffn/ffn.h)
    InferDevice dev;   // what only the GPU has (llmc/infer_device.h)
};

// The cache and buffers of max_seqs sequences, prefills of up to max_rows
// tokens, and cache_len positions per sequence, on the model's device.
template <typename T, typename G>
void infer_state_alloc(InferState<T>* s, const GPT<T, G>* model, int max_seqs, int max_rows, int cache_len) {
    const GPTConfig* c = &model->config;
    size_t L = c->num_layers, D = c->channels, H = c->hidden, QKV = qkv_dim(c), KVD = kv_dim(c);
    int gpu = model->device == DEVICE_CUDA;
    if (max_seqs < 1 || max_rows < 1) { fatal("inference for %d sequences of %d rows in all", max_seqs, max_rows); }
    if (cache_len < 1 || cache_len > c->max_seq_len) { fatal("cache length %d must be 1..%d", cache_len, c->max_seq_len); }
    memset(s, 0, sizeof(*s));
    infer_device_init(&s->dev, c, max_seqs, cache_len, model->device);
    s->max_seqs = max_seqs;
    s->max_rows = max_rows;
    s->cache_len = cache_len;
    size_t rows = max_rows > max_seqs ? max_rows : max_seqs, cache = L * max_seqs * cache_len * KVD;
    struct { void** ptr; size_t bytes; } parts[] = {
        {(void**)&s->k_cache, cache * sizeof(T)}, {(void**)&s->v_cache, cache * sizeof(T)},
        {(void**)&s->x, rows * D * sizeof(T)}, {(void**)&s->x_mid, rows * D * sizeof(T)},
        {(void**)&s->normed, rows * D * sizeof(T)}, {(void**)&s->qkv, rows * QKV * sizeof(T)},
        {(void**)&s->att, rows * D * sizeof(T)}, {(void**)&s->proj, rows * D * sizeof(T)},
        {(void**)&s->gu, rows * 2 * H * sizeof(T)}, {(void**)&s->last, max_seqs * D * sizeof(T)},
        {(void**)&s->logits, (size_t)max_seqs * c->padded_vocab_size * sizeof(T)},
        {(void**)&s->lse, gpu ? (size_t)max_rows * c->num_heads * sizeof(float) : 0},
        {(void**)&s->tokens, rows * sizeof(int)}, {(void**)&s->row_slot, rows * sizeof(int)},
        {(void**)&s->row_pos, rows * sizeof(int)}, {(void**)&s->last_row, max_seqs * sizeof(int)},
    };
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
        if (parts[i].bytes > 0) { *parts[i].ptr = device_malloc(parts[i].bytes, model->device); }
    }
    ffn_cache_init(&s->ffn, &model->ffn, max_seqs);
}

template <typename T, typename G>
void infer_state_free(InferState<T>* s, const GPT<T, G>* model) {
    void* bufs[] = {s->k_cache, s->v_cache, s->x, s->x_mid, s->normed, s->qkv, s->att, s->proj, s->gu, s->last,
                    s->logits, s->lse, s->tokens, s->row_slot, s->row_pos, s->last_row, s->fired, s->fired_union};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) { device_free(bufs[i], model->device); }
    ffn_cache_free(&s->ffn);
    infer_device_free(&s->dev);
    memset(s, 0, sizeof(*s));
}

// From now on the decode steps count each layer's FFN units that fire (g > 0),
// summed over the rows (the server's metrics; an atomic add per fired unit), and
// with count_union on the GPU's sparse path the units some row of a step fires
// (the rows of W_u and W_d^T the step must read; above 3 rows a kernel more a layer)
template <typename T, typename G>
void infer_state_count_fired(InferState<T>* s, const GPT<T, G>* model, int count_union = 0) {
    size_t bytes = (size_t)model->config.num_layers * sizeof(unsigned long long);
    s->fired = (unsigned long long*)device_malloc(bytes, model->device);
    device_zero(s->fired, bytes, model->device);
    if (count_union) {
        s->fired_union = (unsigned long long*)device_malloc(bytes, model->device);
        device_zero(s->fired_union, bytes, model->device);
    }
}

// adds the counts since the last read to add[L] (the units fired, summed over the rows) and, where both are
// counted and not NULL, to add_union[L] (the units some row of a step fired), and starts them again from 0
template <typename T, typename G>
void gpt_fired_read(const GPT<T, G>* model, InferState<T>* s, uint64_t* add, uint64_t* add_union = NULL) {
    int L = model->config.num_layers;
    unsigned long long* counters[2] = {s->fired, add_union ? s->fired_union : NULL};
    uint64_t* adds[2] = {add, add_union};
    std::vector<unsigned long long> counts(L);
    for (int i = 0; i < 2; i++) {
        if (!counters[i]) { continue; }
        device_copy(counts.data(), counters[i], L * sizeof(unsigned long long), model->device);
        device_zero(counters[i], L * sizeof(unsigned long long), model->device);
        for (int l = 0; l < L; l++) { adds[i][l] += counts[l]; }
    }
}

// y = x W^T of the cached forward: a decode step's few rows by decode_linear (the GPU's GEMV)
template <typename T>
static void linear_cached(T* y, const T* x, const T* w, int M, int K, int N, int decode) {
    if (decode) { decode_linear(y, x, w, M, N, K); } else { linear_forward(y, x, w, M, K, N); }
}

// The layers over M rows whose tokens, cache slots and positions are in s;
// leaves the final norm of every row in s->normed. A prefill (decode 0) names
// its prompts' rows: prompt i is rows seq_rows[i] .. seq_rows[i] + seq_lens[i] - 1,
// from position seq_starts[i] (host arrays, nseq prompts); a decode step has a
// row per sequence. A counted decode step adds the FFN's fired units to s->fired.
template <typename T, typename G>
static void gpt_forward_cached(GPT<T, G>* model, InferState<T>* s, int M, const int* seq_rows, const int* seq_lens,
                               const int* seq_starts, int nseq, int decode) {
    const GPTConfig* c = &model->config;
    int L = c->num_layers, D = c->channels, QKV = qkv_dim(c), hd = head_size(c), NH = c->num_heads;
    int NKV = c->num_kv_heads;
    size_t cache_layer = (size_t)s->max_seqs * s->cache_len * kv_dim(c);
    encoder_forward(s->x, s->tokens, model->param[P_WTE], M, D);
    rmsnorm_forward(s->normed, (G*)NULL, s->x, model->param[P_ATTN_NORM], M, D, c->norm_eps, decode);
    for (int l = 0; l < L; l++) {
        T* kc = s->k_cache + l * cache_layer;
        T* vc = s->v_cache + l * cache_layer;
        linear_cached(s->qkv, s->normed, model->param[P_WQKV] + (size_t)l * QKV * D, M, D, QKV, decode);
        if (decode) {
            attention_decode(s->att, s->dev.part_o, s->dev.part_ml, s->dev.splits_done, s->qkv, kc, vc, s->row_slot,
                             s->row_pos, M, NH, NKV, hd, s->cache_len, s->dev.context, c->rope_theta);
        } else {
            attention_prefill(s->att, s->lse, s->qkv, kc, vc, s->row_slot, s->row_pos, M, seq_rows, seq_lens, seq_starts,
                              nseq, NH, NKV, hd, s->cache_len, c->rope_theta);
        }
        linear_cached(s->proj, s->att, model->param[P_WO] + (size_t)l * D * D, M, D, D, decode);
        fused_residual_rmsnorm_forward(s->x_mid, s->normed, (G*)NULL, s->x, s->proj,
                                       model->param[P_FFN_NORM] + (size_t)l * D, M, D, c->norm_eps, decode);
        if (s->before_ffn) { s->before_ffn(s->before_ffn_ctx, l, M); }
        ffn_forward_cached(&s->ffn, &model->ffn, l, s->proj, s->normed, M, decode, s->gu,
                           decode && s->fired ? s->fired + l : NULL,
                           decode && s->fired_union ? s->fired_union + l : NULL);
        int last = l == L - 1;
        fused_residual_rmsnorm_forward(s->x, s->normed, (G*)NULL, s->x_mid, s->proj,
                                       last ? model->param[P_FINAL_NORM] : model->param[P_ATTN_NORM] + (size_t)(l + 1) * D,
                                       M, D, c->norm_eps, decode);
    }
}

// Prefill of nseq chunks: chunk i (tokens[first_i .. first_i + lens[i]), the
// chunks concatenated) goes into cache slot slots[i] at positions starts[i] ..
// starts[i] + lens[i] - 1 and attends to the positions before starts[i] that
// the slot's cache holds (slots NULL: slot i; starts NULL: every chunk at 0, a
// whole prompt). logits (host, [nseq, Vp], may be NULL) gets the next-token
// logits after each chunk's last token.
template <typename T, typename G>
void gpt_prefill_chunks(GPT<T, G>* model, InferState<T>* s, const int* tokens, const int* lens, const int* slots,
                        const int* starts, int nseq, float* logits) {
    const GPTConfig* c = &model->config;
    ffn_check_activation(&model->ffn);
    if (nseq < 1 || nseq > s->max_seqs) { fatal("prefill of %d prompts, the model holds 1 to %d", nseq, s->max_seqs); }
    int M = 0;
    std::vector<int> seq_rows(nseq), seq_starts(nseq), slot_of(nseq), last(nseq);
    for (int i = 0; i < nseq; i++) {
        seq_starts[i] = starts ? starts[i] : 0;
        slot_of[i] = slots ? slots[i] : i;
        if (lens[i] < 1 || seq_starts[i] < 0 || (long long)seq_starts[i] + lens[i] > s->cache_len) {
            fatal("prompt %d has %d tokens from position %d, the cache holds positions 0 to %d", i, lens[i],
                  seq_starts[i], s->cache_len - 1);
        }
        if (slot_of[i] < 0 || slot_of[i] >= s->max_seqs) { fatal("prefill into cache slot %d of %d", slot_of[i], s->max_seqs); }
        seq_rows[i] = M;
        M += lens[i];
        last[i] = M - 1;
    }
    if (M > s->max_rows) { fatal("prefill of %d tokens, the model was sized for %d", M, s->max_rows); }
    std::vector<int> slot(M), pos(M);
    for (int i = 0; i < nseq; i++) {
        for (int t = 0; t < lens[i]; t++) { slot[seq_rows[i] + t] = slot_of[i]; pos[seq_rows[i] + t] = seq_starts[i] + t; }
    }
    device_upload(s->tokens, tokens, M * sizeof(int), model->device);
    device_upload(s->row_slot, slot.data(), M * sizeof(int), model->device);
    device_upload(s->row_pos, pos.data(), M * sizeof(int), model->device);
    device_upload(s->last_row, last.data(), nseq * sizeof(int), model->device);
    gpt_forward_cached(model, s, M, seq_rows.data(), lens, seq_starts.data(), nseq, 0);
    gather_rows(s->last, s->normed, s->last_row, nseq, c->channels);
    linear_forward(s->logits, s->last, model->param[output_head(c)], nseq, c->channels, c->padded_vocab_size);
    infer_device_logits(&s->dev, logits, (int*)NULL, s->logits, nseq, c->vocab_size, c->padded_vocab_size);
}

// Prefill: prompt i (tokens[first_i .. first_i + lens[i]), the prompts
// concatenated) fills cache slot i from position 0. logits (host, [nseq, Vp],
// may be NULL) gets each prompt's last-token logits.
template <typename T, typename G>
void gpt_prefill(GPT<T, G>* model, InferState<T>* s, const int* tokens, const int* lens, int nseq, float* logits) {
    gpt_prefill_chunks(model, s, tokens, lens, (const int*)NULL, (const int*)NULL, nseq, logits);
}

// one decode step of B sequences as queued work (what the graph holds)
template <typename T, typename G>
static void gpt_decode_step(GPT<T, G>* model, InferState<T>* s, int B) {
    const GPTConfig* c = &model->config;
    gpt_forward_cached(model, s, B, (const int*)NULL, (const int*)NULL, (const int*)NULL, B, 1);
    decode_linear(s->logits, s->normed, model->param[output_head(c)], B, c->padded_vocab_size, c->channels);
}

// The hot units of a model's sparse prefills (llmc/ffn/hot.h), from one
// calibration prefill of the given prompts with the dense FFN: before each
// layer's FFN its gate runs once more and counts how often each unit fires;
// at the middle layer the costs are measured on its real input. Then each
// layer's hot set is the number of busiest units with the least modelled
// prefill time, and its units are reordered (the same function) with the hot
// ones first. Only a prefill that runs sparse (ffn_prefill_sparse) gains: for
// any other nothing is done.
template <typename T, typename G>
struct HotCalibration {
    GPT<T, G>* model;
    InferState<T>* s;
    uint32_t* count; // [L, H] on the device
    FfnHotPolicy policy;
    int verbose;
};

template <typename T, typename G>
static void infer_hot_calibrate_layer(void* ctx, int l, int M) {
    HotCalibration<T, G>* cal = (HotCalibration<T, G>*)ctx;
    Ffn<T>* ffn = &cal->model->ffn;
    InferState<T>* s = cal->s;
    const int H = ffn->H;
    uint32_t* count = cal->count + (size_t)l * H;
    ffn_count_firing(ffn, l, count, s->normed, M, s->gu);
    if (l != ffn->L / 2) { return; }
    std::vector<uint32_t> host(H);
    device_copy(host.data(), count, H * sizeof(uint32_t), ffn->device);
    cal->policy.costs = ffn_prefill_costs(&s->ffn, ffn, l, s->proj, s->normed, M, host.data(), s->gu, cal->verbose);
    cal->policy.measured = 1;
}

template <typename T, typename G>
void infer_hot_calibrate(GPT<T, G>* model, InferState<T>* s, const int* tokens, const int* lens, int nseq,
                         int verbose) {
    const int L = model->config.num_layers, H = model->config.hidden;
    int M = 0;
    for (int i = 0; i < nseq; i++) { M += lens[i]; }
    if (!ffn_prefill_sparse(&s->ffn, &model->ffn, M)) { return; }
    HotCalibration<T, G> cal = {model, s, (uint32_t*)device_malloc((size_t)L * H * sizeof(uint32_t), model->device),
                                ffn_hot_policy(FFN_HOT_MEASURED, 0), verbose};
    device_zero(cal.count, (size_t)L * H * sizeof(uint32_t), model->device);
    int ffn_mode = model->ffn.mode;
    model->ffn.mode = FFN_DENSE;
    s->before_ffn = infer_hot_calibrate_layer<T, G>;
    s->before_ffn_ctx = &cal;
    gpt_prefill(model, s, tokens, lens, nseq, (float*)NULL);
    s->before_ffn = NULL;
    s->before_ffn_ctx = NULL;
    model->ffn.mode = ffn_mode;
    std::vector<uint32_t> count((size_t)L * H);
    device_copy(count.data(), cal.count, count.size() * sizeof(uint32_t), model->device);
    device_free(cal.count, model->device);
    ffn_hot_rechoose(&model->ffn, count.data(), M, &cal.policy, verbose);
    ffn_cache_stale(&s->ffn); // the gates' rows moved
}

// Decode: row b feeds tokens[b] at position pos[b] to the sequence in cache
// slot slots[b] (NULL: slot b; its cache holds positions 0..pos[b]-1); logits
// (host, [B, Vp], may be NULL) gets the next-token logits, best (host, [B], may
// be NULL) each row's greedy token (logits_greedy, llmc/sampler.h; on the GPU
// without the logits' trip to the host). Each row is its own: on the CPU path
// its logits do not depend on the other rows or on the slot it sits in.
template <typename T, typename G>
void gpt_decode_slots(GPT<T, G>* model, InferState<T>* s, const int* tokens, const int* pos, const int* slots, int B,
                      float* logits, int* best) {
    if (B < 1 || B > s->max_seqs) { fatal("decode of %d sequences, the model holds 1 to %d", B, s->max_seqs); }
    std::vector<int> slot(B);
    int longest = 0; // the step's positions are below it
    for (int b = 0; b < B; b++) {
        if (pos[b] < 0 || pos[b] >= s->cache_len) {
            fatal("decode at position %d, the cache holds 0 to %d", pos[b], s->cache_len - 1);
        }
        longest = pos[b] + 1 > longest ? pos[b] + 1 : longest;
        slot[b] = slots ? slots[b] : b;
        if (slot[b] < 0 || slot[b] >= s->max_seqs) { fatal("decode in cache slot %d of %d", slot[b], s->max_seqs); }
    }
    device_upload(s->tokens, tokens, B * sizeof(int), model->device);
    device_upload(s->row_pos, pos, B * sizeof(int), model->device);
    device_upload(s->row_slot, slot.data(), B * sizeof(int), model->device);
    ffn_decode_prepare(&s->ffn, &model->ffn, B);
    // one graph per batch size and context class, captured again when the FFN mode changes
    infer_device_step(&s->dev, B, longest, model->ffn.mode, [&] { gpt_decode_step(model, s, B); });
    infer_device_logits(&s->dev, logits, best, s->logits, B, model->config.vocab_size, model->config.padded_vocab_size);
}

// Decode: sequence b (cache slot b) gets tokens[b] at position pos[b] (its
// cache holds 0..pos[b]-1); logits (host, [B, Vp], may be NULL) gets the
// next-token logits.
template <typename T, typename G>
void gpt_decode(GPT<T, G>* model, InferState<T>* s, const int* tokens, const int* pos, int B, float* logits) {
    gpt_decode_slots(model, s, tokens, pos, (const int*)NULL, B, logits, (int*)NULL);
}

#endif // LLMC_INFERENCE_H
