/*
 The inference engine: the forward of llmc/gpt.h over a key/value cache, for a batch of
 sequences. A prefill feeds a batch of prompts of any lengths; then each
 decode step feeds one new token of every sequence. Per layer l and row
 (sequence s, position p):
     a = RMSNorm(x);  qkv = a Wqkv^T;  RoPE(q, k at p);  cache[l, s, p] = k, v
     x += Attn(q, cache[l, s, 0..p]) Wo^T
     f = RMSNorm(x);  x += FFN(f)
 and logits = RMSNorm(x) E^T of each sequence's last row.

 A prefill's prompts are the rows of one [M, D] batch (M = the sum of their
 lengths): the products, norms and the FFN do not care where a sequence ends;
 RoPE and the cache take each row's sequence and position from arrays on the
 device, and attention runs per prompt over its own rows. A decode step has a
 row per sequence; on the GPU its linear layers are a GEMV of our own for up to
 8 rows (llmc/cuda_matmul.cuh), its attention splits a long cache over many
 SMs (llmc/cuda_attention_cached.cuh), and the step is queued as one CUDA graph
 (tokens and positions live in device memory: no allocation and no wait for
 the host inside it), so its launches cost the GPU's time, not the host's.
 The FFN of a layer: gpt_ffn_cached. The parts only the GPU has are compiled
 for bf16, its type, alone.
*/
#ifndef LLMC_INFERENCE_H
#define LLMC_INFERENCE_H

#include "llmc/gpt.h"
#ifdef __CUDACC__
#include <type_traits>
#include <vector>
#include "llmc/cuda_attention_cached.cuh"
#include "llmc/cuda_sparse_decode.cuh"
#include "llmc/cuda_twell.cuh"
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
    // the GPU's (NULL on the CPU): the prefill attention's log-sum-exp [max_rows, NH], the decode
    // attention's splits (llmc/cuda_attention_cached.cuh)
    float* lse;
    float *part_o, *part_ml;
    int* splits_done;
    // called before layer l's FFN of a prefill of M rows (the synthetic-sparse
    // benchmark model sets its gates there, llmc/synthetic.h); NULL: nothing
    void (*before_ffn)(void* ctx, int layer, int M);
    void* before_ffn_ctx;
#ifdef __CUDACC__
    SparseDecode sparse_decode; // the sparse FFN of a decode step
    ScreenedGate screen;        // its gate's int8 copy of every layer's Wg (made at the first sparse decode)
    int screen_stale;           // 1: the weights changed since the copy was made
    TwellPrefill twell;         // the TwELL FFN of a prefill
    CudaGraph graph;            // the decode step, for one batch size and FFN
    int use_graph;              // 1 (the default): a decode step is one CUDA graph
    uint16_t* logits_pinned;    // [max_seqs, Vp] bf16 bits: the logits' way to the host
#endif
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
#ifdef __CUDACC__
    if (gpu && (D % 8 != 0 || H % 8 != 0 || !attention_decode_supports(head_size(c)))) {
        fatal("the GPU path needs D %zu and H %zu multiples of 8 and a head size (%d) of 16, 32, 64 or 128", D, H,
              head_size(c));
    }
    if (gpu && main_stream == 0) { cudaCheck(cudaStreamCreateWithFlags(&main_stream, cudaStreamNonBlocking)); }
#endif
    memset(s, 0, sizeof(*s));
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
#ifdef __CUDACC__
    if (gpu) {
        sparse_decode_alloc(&s->sparse_decode, max_seqs, (int)H);
        cudaCheck(cudaMallocHost(&s->logits_pinned, (size_t)max_seqs * c->padded_vocab_size * sizeof(uint16_t)));
        twell_prefill_init(&s->twell, (int)L, (int)H);
        attention_decode_alloc(&s->part_o, &s->part_ml, &s->splits_done, max_seqs, c->num_heads, head_size(c), cache_len);
        s->use_graph = 1;
    }
#endif
}

template <typename T, typename G>
void infer_state_free(InferState<T>* s, const GPT<T, G>* model) {
    void* bufs[] = {s->k_cache, s->v_cache, s->x, s->x_mid, s->normed, s->qkv, s->att, s->proj, s->gu, s->last,
                    s->logits, s->lse, s->tokens, s->row_slot, s->row_pos, s->last_row, s->part_o, s->part_ml,
                    s->splits_done};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) { device_free(bufs[i], model->device); }
#ifdef __CUDACC__
    if (model->device == DEVICE_CUDA) {
        sparse_decode_free(&s->sparse_decode);
        screen_gate_free(&s->screen, DEVICE_CUDA);
        twell_prefill_free(&s->twell);
        cuda_graph_free(&s->graph);
        cudaCheck(cudaFreeHost(s->logits_pinned));
    }
#endif
    memset(s, 0, sizeof(*s));
}

// y = x W^T of the cached forward: a decode step's few rows by decode_linear (the GPU's GEMV)
template <typename T>
static void linear_cached(T* y, const T* x, const T* w, int M, int K, int N, int decode) {
    if (decode) { decode_linear(y, x, w, M, N, K); } else { linear_forward(y, x, w, M, K, N); }
}

// Layer l's FFN of the cached forward, s->normed [M, D] -> s->proj: dense
// (FFN_DENSE, and always on the CPU), or on the GPU with FFN_SPARSE the
// active units' weight rows for a decode step (llmc/cuda_sparse_decode.cuh)
// and TwELL for a prefill of enough rows (llmc/cuda_twell.cuh: the packing
// gate, then the fused up + down; its status is read after every layer, and a
// layer whose record buffer was too small is grown and run again, so the
// output is always exact). The one place a layer's FFN is chosen.
template <typename T, typename G>
static void gpt_ffn_cached(GPT<T, G>* model, InferState<T>* s, int l, int M, int decode) {
    const GPTConfig* c = &model->config;
    int D = c->channels, H = c->hidden;
    size_t LH = (size_t)l * H * D;
    const T *wg = model->param[P_WG] + LH, *wu = model->param[P_WU] + LH, *wdT = model->param[P_WDT] + LH;
    if (s->before_ffn) { s->before_ffn(s->before_ffn_ctx, l, M); }
#ifdef __CUDACC__
    if constexpr (std::is_same<T, bf16>::value) {
        if (model->ffn_mode == FFN_SPARSE && decode) {
            ScreenedGate rows = s->screen.q ? screen_gate_rows(&s->screen, l * H, H) : s->screen;
            ffn_sparse_decode(s->proj, &s->sparse_decode, s->normed, wg, wu, wdT, M, D, H, s->screen.q ? &rows : NULL,
                              s->gu);
            return;
        }
        if (model->ffn_mode == FFN_SPARSE && twell_prefill_takes(&s->twell, M, D)) {
            // the layer's hot units (its first ones, llmc/ffn.h) as the dense FFN over them, added to TwELL's
            // over the cold rest; queued before the wait for TwELL's status, so the GPU runs them meanwhile
            int hot = model->ffn[l].hot.units;
            size_t off = (size_t)hot * D;
            do {
                if (hot < H) {
                    twell_prefill_start(&s->twell, l, s->proj, s->normed, wg + off, wu + off, wdT + off, M, D, H - hot,
                                        s->gu);
                }
                if (hot > 0) {
                    ffn_dense_forward(s->proj, s->gu, s->gu + (size_t)M * hot, s->normed, wg, wu, wdT, M, D, hot,
                                      (unsigned long long*)NULL, false, hot < H);
                }
            } while (hot < H && !twell_prefill_done(&s->twell, l));
            return;
        }
    }
#endif
    ffn_dense_forward(s->proj, s->gu, s->gu + (size_t)M * H, s->normed, wg, wu, wdT, M, D, H,
                      (unsigned long long*)NULL, decode, 0, c->activation);
}

// The layers over M rows whose tokens, cache slots and positions are in s;
// leaves the final norm of every row in s->normed. A prefill (decode 0) names
// its prompts' rows: prompt i is rows seq_rows[i] .. seq_rows[i] + seq_lens[i] - 1
// (host arrays, nseq prompts); a decode step has row b in slot b.
template <typename T, typename G>
static void gpt_forward_cached(GPT<T, G>* model, InferState<T>* s, int M, const int* seq_rows, const int* seq_lens,
                               int nseq, int decode) {
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
            attention_decode(s->att, s->part_o, s->part_ml, s->splits_done, s->qkv, kc, vc, s->row_pos, M, NH, NKV,
                             hd, s->cache_len, c->rope_theta);
        } else {
            attention_prefill(s->att, s->lse, s->qkv, kc, vc, s->row_slot, s->row_pos, M, seq_rows, seq_lens, nseq,
                              NH, NKV, hd, s->cache_len, c->rope_theta);
        }
        linear_cached(s->proj, s->att, model->param[P_WO] + (size_t)l * D * D, M, D, D, decode);
        fused_residual_rmsnorm_forward(s->x_mid, s->normed, (G*)NULL, s->x, s->proj,
                                       model->param[P_FFN_NORM] + (size_t)l * D, M, D, c->norm_eps, decode);
        gpt_ffn_cached(model, s, l, M, decode);
        int last = l == L - 1;
        fused_residual_rmsnorm_forward(s->x, s->normed, (G*)NULL, s->x_mid, s->proj,
                                       last ? model->param[P_FINAL_NORM] : model->param[P_ATTN_NORM] + (size_t)(l + 1) * D,
                                       M, D, c->norm_eps, decode);
    }
}

// the first n rows of s->logits into logits (host floats [n, Vp]; NULL: none),
// once the device's work is done
template <typename T, typename G>
static void gpt_logits_out(GPT<T, G>* model, InferState<T>* s, int n, float* logits) {
    size_t count = (size_t)n * model->config.padded_vocab_size;
#ifdef __CUDACC__
    if constexpr (std::is_same<T, bf16>::value) {
        if (logits) {
            cudaCheck(cudaMemcpyAsync(s->logits_pinned, s->logits, count * sizeof(bf16), cudaMemcpyDeviceToHost,
                                      main_stream));
        }
        cudaCheck(cudaStreamSynchronize(main_stream));
        for (size_t i = 0; logits && i < count; i++) { logits[i] = float_from_bf16(s->logits_pinned[i]); }
    } else
#endif
    for (size_t i = 0; logits && i < count; i++) { logits[i] = (float)s->logits[i]; }
}

// Prefill: prompt i (tokens[first_i .. first_i + lens[i]), the prompts
// concatenated) fills cache slot i from position 0. logits (host, [nseq, Vp],
// may be NULL) gets each prompt's last-token logits.
template <typename T, typename G>
void gpt_prefill(GPT<T, G>* model, InferState<T>* s, const int* tokens, const int* lens, int nseq, float* logits) {
    const GPTConfig* c = &model->config;
    gpt_check_ffn_activation(model);
    if (nseq < 1 || nseq > s->max_seqs) { fatal("prefill of %d prompts, the model holds 1 to %d", nseq, s->max_seqs); }
    int M = 0;
    int* seq_rows = (int*)mallocCheck(nseq * sizeof(int));
    for (int i = 0; i < nseq; i++) {
        if (lens[i] < 1 || lens[i] > s->cache_len) {
            fatal("prompt %d has %d tokens, the cache holds 1 to %d", i, lens[i], s->cache_len);
        }
        seq_rows[i] = M;
        M += lens[i];
    }
    if (M > s->max_rows) { fatal("prefill of %d tokens, the model was sized for %d", M, s->max_rows); }
    int* host = (int*)mallocCheck((size_t)2 * M * sizeof(int) + nseq * sizeof(int));
    int *slot = host, *pos = host + M, *last = host + 2 * M;
    for (int i = 0; i < nseq; i++) {
        for (int t = 0; t < lens[i]; t++) { slot[seq_rows[i] + t] = i; pos[seq_rows[i] + t] = t; }
        last[i] = seq_rows[i] + lens[i] - 1;
    }
    device_upload(s->tokens, tokens, M * sizeof(int), model->device);
    device_upload(s->row_slot, slot, M * sizeof(int), model->device);
    device_upload(s->row_pos, pos, M * sizeof(int), model->device);
    device_upload(s->last_row, last, nseq * sizeof(int), model->device);
    gpt_forward_cached(model, s, M, seq_rows, lens, nseq, 0);
    gather_rows(s->last, s->normed, s->last_row, nseq, c->channels);
    linear_forward(s->logits, s->last, model->param[output_head(c)], nseq, c->channels, c->padded_vocab_size);
    gpt_logits_out(model, s, nseq, logits);
    free(host);
    free(seq_rows);
}

// one decode step of B sequences as queued work (what the graph holds)
template <typename T, typename G>
static void gpt_decode_step(GPT<T, G>* model, InferState<T>* s, int B) {
    const GPTConfig* c = &model->config;
    gpt_forward_cached(model, s, B, (const int*)NULL, (const int*)NULL, B, 1);
    decode_linear(s->logits, s->normed, model->param[output_head(c)], B, c->padded_vocab_size, c->channels);
}

#ifdef __CUDACC__
// The hot units of a model's TwELL prefills (llmc/ffn.h), from one calibration
// prefill of the given prompts with the dense FFN: before each layer's FFN its
// gate runs once more into the scratch and counts how often each unit fires;
// at the middle layer the costs are measured on its real input (the dense FFN
// over FFN_HOT_PROBE and 4 FFN_HOT_PROBE units, TwELL over all of them, the
// gate alone). Then each layer's hot set is the number of busiest units with
// the least modelled prefill time, and its units are reordered (the weights'
// rows of Wg, Wu, WdT: the same function) with the hot ones first.
struct HotCalibration {
    GPT<bf16, float>* model;
    InferState<bf16>* s;
    uint32_t* count; // [L, H] on the device
    FfnCosts costs;
    int verbose;
};

static void gpt_hot_calibrate_layer(void* ctx, int l, int M) {
    HotCalibration* cal = (HotCalibration*)ctx;
    GPT<bf16, float>* model = cal->model;
    InferState<bf16>* s = cal->s;
    const int D = model->config.channels, H = model->config.hidden, L = model->config.num_layers;
    const size_t LH = (size_t)l * H * D;
    const bf16 *wg = model->param[P_WG] + LH, *wu = model->param[P_WU] + LH, *wdT = model->param[P_WDT] + LH;
    gemm(s->gu, s->normed, wg, M, H, D, 0, 1, 0);
    unit_count_add(cal->count + (size_t)l * H, s->gu, M, H);
    if (l != L / 2 || !twell_prefill_supports(D)) { return; }
    std::vector<uint32_t> count(H);
    device_copy(count.data(), cal->count + (size_t)l * H, H * sizeof(uint32_t), DEVICE_CUDA);
    double pairs = 0;
    for (uint32_t c : count) { pairs += c; }
    int large = H < 4 * FFN_HOT_PROBE ? H : 4 * FFN_HOT_PROBE, small = large / 4 > 0 ? large / 4 : 1;
    auto dense = [&](int units) {
        return gpt_time(DEVICE_CUDA, [&] {
            ffn_dense_forward(s->proj, s->gu, s->gu + (size_t)M * units, s->normed, wg, wu, wdT, M, D, units,
                              (unsigned long long*)NULL);
        });
    };
    double dense_small = dense(small), dense_large = dense(large);
    double gate = gpt_time(DEVICE_CUDA, [&] { gemm(s->gu, s->normed, wg, M, H, D, 0, 1, 0); });
    double sparse = gpt_time(DEVICE_CUDA, [&] {
        twell_prefill_layer(&s->twell, l, s->proj, s->normed, wg, wu, wdT, M, D, H, s->gu);
    });
    cal->costs = ffn_costs(dense_small, small, dense_large, large, gate, sparse, pairs, H, M);
    if (cal->verbose) {
        printf("hot units: costs measured on layer %d of a prefill of %d tokens: the dense FFN over %d / %d units "
               "%.3f / %.3f ms, TwELL over all %.3f ms (its gate %.3f) at %.1f pairs per token\n", l, M, small,
               large, 1e3 * dense_small, 1e3 * dense_large, 1e3 * sparse, 1e3 * gate, pairs / M);
    }
}

static void gpt_hot_calibrate(GPT<bf16, float>* model, InferState<bf16>* s, const int* tokens, const int* lens,
                              int nseq, int verbose) {
    const int L = model->config.num_layers, H = model->config.hidden, D = model->config.channels;
    int M = 0;
    for (int i = 0; i < nseq; i++) { M += lens[i]; }
    HotCalibration cal = {model, s, (uint32_t*)cuda_malloc((size_t)L * H * sizeof(uint32_t)), {}, verbose};
    cudaCheck(cudaMemset(cal.count, 0, (size_t)L * H * sizeof(uint32_t)));
    int ffn_mode = model->ffn_mode;
    model->ffn_mode = FFN_DENSE;
    s->before_ffn = gpt_hot_calibrate_layer;
    s->before_ffn_ctx = &cal;
    gpt_prefill(model, s, tokens, lens, nseq, (float*)NULL);
    s->before_ffn = NULL;
    s->before_ffn_ctx = NULL;
    model->ffn_mode = ffn_mode;
    std::vector<uint32_t> count((size_t)L * H);
    device_copy(count.data(), cal.count, count.size() * sizeof(uint32_t), DEVICE_CUDA);
    cuda_free(cal.count);
    std::vector<int> perm(H);
    int* dev_perm = (int*)cuda_malloc(H * sizeof(int));
    bf16* tmp = (bf16*)cuda_malloc((size_t)H * D * sizeof(bf16));
    for (int l = 0; l < L && cal.costs.dense1 > 0; l++) {
        int units = ffn_hot_choose(perm.data(), count.data() + (size_t)l * H, H, model->ffn[l].hot.units, M, &cal.costs);
        if (units < 0) { continue; }
        device_copy(dev_perm, perm.data(), H * sizeof(int), DEVICE_CUDA);
        gpt_permute_units(model, l, dev_perm, tmp);
        if (verbose) {
            printf("hot units: layer %d: %d hot units, %.0f%% of the firing\n", l, units,
                   100 * ffn_hot_share(count.data() + (size_t)l * H, perm.data(), H, units));
        }
        model->ffn[l].hot.units = units;
    }
    cudaCheck(cudaStreamSynchronize(main_stream));
    cuda_free(tmp);
    cuda_free(dev_perm);
    s->screen_stale = 1; // the gates' rows moved
}
#endif

// Decode: sequence b (cache slot b) gets tokens[b] at position pos[b] (its
// cache holds 0..pos[b]-1); logits (host, [B, Vp], may be NULL) gets the
// next-token logits.
template <typename T, typename G>
void gpt_decode(GPT<T, G>* model, InferState<T>* s, const int* tokens, const int* pos, int B, float* logits) {
    if (B < 1 || B > s->max_seqs) { fatal("decode of %d sequences, the model holds 1 to %d", B, s->max_seqs); }
    for (int b = 0; b < B; b++) {
        if (pos[b] < 0 || pos[b] >= s->cache_len) {
            fatal("decode at position %d, the cache holds 0 to %d", pos[b], s->cache_len - 1);
        }
    }
    device_upload(s->tokens, tokens, B * sizeof(int), model->device);
    device_upload(s->row_pos, pos, B * sizeof(int), model->device);
#ifdef __CUDACC__
    if constexpr (std::is_same<T, bf16>::value) {
        const GPTConfig* c = &model->config;
        if (model->device == DEVICE_CUDA && model->ffn_mode == FFN_SPARSE && B <= SCREEN_MAX_ROWS &&
            screened_gate_fits(B, c->channels) && (s->screen.q == NULL || s->screen_stale)) {
            // the int8 copy of the gates, outside any graph (a graph keeps its pointers, not its contents)
            if (s->screen.q == NULL) { s->screen = screen_gate_create(c->num_layers * c->hidden, c->channels, DEVICE_CUDA); }
            screen_quantize(&s->screen, model->param[P_WG]);
            s->screen_stale = 0;
        }
    }
    if (model->device == DEVICE_CUDA && s->use_graph) { // captured again when the batch or the FFN changes
        cuda_graph_launch(&s->graph, 4LL * B + model->ffn_mode, [&] { gpt_decode_step(model, s, B); });
        gpt_logits_out(model, s, B, logits);
        return;
    }
#endif
    gpt_decode_step(model, s, B);
    gpt_logits_out(model, s, B, logits);
}

#endif // LLMC_INFERENCE_H
