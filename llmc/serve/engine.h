/*
 The server's model: llmc/inference.h's cached forward (either backend) behind the
 scheduler's ServeEngine. A prefill call is gpt_prefill_chunks (chunks into
 any slot, from any position), a decode step gpt_decode_slots (rows in any
 slots), the fired-unit counts gpt_fired_read. The InferState is sized by the
 caller: max_seqs = the slots, max_rows = the prefill chunk budget,
 cache_len = the context.
*/
#ifndef LLMC_SERVE_ENGINE_H
#define LLMC_SERVE_ENGINE_H

#include "llmc/inference.h"
#include "llmc/serve/scheduler.h"

template <typename T, typename G>
struct ServeModel {
    GPT<T, G>* model;
    InferState<T>* state;
};

template <typename T, typename G>
static void serve_model_prefill(void* ctx, const int* tokens, const int* lens, const int* slots, const int* starts,
                                int n, float* logits) {
    ServeModel<T, G>* m = (ServeModel<T, G>*)ctx;
    gpt_prefill_chunks(m->model, m->state, tokens, lens, slots, starts, n, logits);
}

template <typename T, typename G>
static void serve_model_decode(void* ctx, const int* tokens, const int* pos, const int* slots, int B, float* logits,
                               int* best) {
    ServeModel<T, G>* m = (ServeModel<T, G>*)ctx;
    gpt_decode_slots(m->model, m->state, tokens, pos, slots, B, logits, best);
}

template <typename T, typename G>
static void serve_model_fired(void* ctx, uint64_t* fired) {
    ServeModel<T, G>* m = (ServeModel<T, G>*)ctx;
    gpt_fired_read(m->model, m->state, fired);
}

// the engine of m, whose state counts the fired units from now on
template <typename T, typename G>
static ServeEngine serve_engine(ServeModel<T, G>* m) {
    const GPTConfig* c = &m->model->config;
    infer_state_count_fired(m->state, m->model);
    ServeEngine e = {m, m->state->max_seqs, m->state->cache_len, m->state->max_rows, c->vocab_size,
                     c->padded_vocab_size, c->num_layers, c->hidden, serve_model_prefill<T, G>,
                     serve_model_decode<T, G>, serve_model_fired<T, G>};
    return e;
}

#endif // LLMC_SERVE_ENGINE_H
