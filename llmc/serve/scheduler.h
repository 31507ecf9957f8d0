/*
 Continuous batching: the server's scheduler. Requests wait in a bounded queue
 (a full one is refused at once); before every step the scheduler admits them,
 oldest first, into free sequence slots (one slot = one sequence's key/value
 cache). A step then
   1. prefills prompt chunks: each admitted sequence whose prompt is not in its
      cache yet gets its next chunk, oldest first, up to `chunk` tokens for the
      whole step, all in one prefill call; a chunk attends to the positions the
      chunks before it left in the cache, so a long prompt takes several steps
      and the others keep decoding meanwhile; the chunk that ends a prompt
      gives the sequence its first token;
   2. decodes every sequence that has a token to feed, as one batch (row b in
      its own slot): one new token each.
 A sequence that ends (end-of-text, a stop string, max_tokens), whose client
 went away, or whose request passed its deadline leaves its slot at once: the
 slot's cache is simply overwritten by the next sequence admitted there.

 The model is behind ServeEngine (llmc/serve/engine.h puts llmc/inference.h's
 cached forward there; the tests put a fake one). On the CPU reference path a
 row's numbers do not depend on the other rows of its call or on how its
 prompt was cut into chunks (test_serve checks it bit for bit), so a greedy
 request gives the same tokens alone or among others, the same as `infer`.

 One thread runs the steps (scheduler_start); the connections' threads
 submit requests, wait for their text, and cancel them, all under one lock.
 A request is owned by both sides (refs) and freed by the last to let go.
*/
#ifndef LLMC_SERVE_SCHEDULER_H
#define LLMC_SERVE_SCHEDULER_H

#include <errno.h>
#include <pthread.h>
#include <time.h>
#include "llmc/rng.h"
#include "llmc/sampler.h"
#include "llmc/serve/metrics.h"
#include "llmc/serve/protocol.h"
#include "llmc/serve/text.h"
#include "llmc/tokenizer.h"

// the model, as the scheduler drives it
typedef struct {
    void* ctx;
    int slots;          // sequences the cache holds
    int context;        // positions per sequence
    int chunk;          // the most prompt tokens of one prefill call
    int vocab, padded_vocab, layers, hidden;
    // chunk i is lens[i] tokens (tokens concatenated) into cache slot slots[i] at positions starts[i] ..;
    // logits [n, padded_vocab] gets the next-token logits after each chunk's last token
    void (*prefill)(void* ctx, const int* tokens, const int* lens, const int* slots, const int* starts, int n,
                    float* logits);
    // row b: token tokens[b] at position pos[b] of the sequence in slot slots[b]; logits [B, padded_vocab] (NULL:
    // not needed) the next-token logits; best [B] each row's greedy token (logits_greedy, llmc/sampler.h),
    // which a GPU gives without sending the logits to the host
    void (*decode)(void* ctx, const int* tokens, const int* pos, const int* slots, int B, float* logits, int* best);
    // adds to fired[layers] the FFN units that fired in the decode steps since the last call (NULL: none counted)
    void (*fired)(void* ctx, uint64_t* fired);
} ServeEngine;

enum { REQ_NEW, REQ_QUEUED, REQ_RUNNING, REQ_DONE };
enum { CANCEL_NONE, CANCEL_CLIENT, CANCEL_TIMEOUT, CANCEL_SHUTDOWN, CANCEL_ERROR }; // metrics.h names them in this order

typedef struct {
    CompletionRequest params; // read-only once submitted
    double arrival, deadline; // now_seconds() of the request's arrival, and when it must be done
    // under the scheduler's lock
    int state;                // REQ_*
    int cancel;               // CANCEL_*: set by either side; the sequence leaves at the next step
    int refs;                 // 1 for the connection, 1 more for the scheduler once submitted
    StrBuf text;              // text the connection has not taken yet
    size_t* piece_end;        // [max_tokens + 1] where each token's text ends in `text` (a stream's events)
    int pieces;
    const char* finish_reason; // "stop" or "length" once it ended by itself
    int completion_tokens;
    pthread_cond_t changed;   // text came, or the request ended
    // the scheduler thread's alone
    int slot, prefilled, next_token;
    uint64_t order, rng;
    double last_token;
    TextOut out;
} ServeRequest;

typedef struct {
    const ServeEngine* engine;
    const Tokenizer* tok;
    Metrics* metrics;
    pthread_mutex_t lock;
    pthread_cond_t wake;      // a request came, or the thread must end
    ServeRequest** queue;     // a ring of queue_cap
    int queue_cap, queue_head, queued;
    ServeRequest** running;   // [slots], NULL where free
    int active;
    int accepting;            // 0 once the server stops taking requests
    int quit;
    uint64_t seeds;           // the seed state of requests that give none
    uint64_t admitted;
    pthread_t thread;
    int started;
    // the step's buffers (the scheduler thread's)
    ServeRequest** rows;      // the step's running sequences, oldest first
    ServeRequest** batch;     // the decode batch's
    int *tokens, *lens, *slots, *starts, *pos, *best;
    float* logits;
    ProbIndex* scratch;
    int fired_rows;           // decoded rows since the engine's counts were last read
} Scheduler;

static inline void scheduler_init(Scheduler* s, const ServeEngine* engine, const Tokenizer* tok, Metrics* metrics,
                                  int queue_cap, uint64_t seed) {
    memset(s, 0, sizeof(*s));
    s->engine = engine;
    s->tok = tok;
    s->metrics = metrics;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->wake, NULL);
    s->queue_cap = queue_cap;
    s->queue = (ServeRequest**)callocCheck((size_t)queue_cap, sizeof(ServeRequest*));
    int S = engine->slots, rows = S > engine->chunk ? S : engine->chunk;
    s->running = (ServeRequest**)callocCheck((size_t)S, sizeof(ServeRequest*));
    s->accepting = 1;
    s->seeds = seed;
    s->rows = (ServeRequest**)mallocCheck((size_t)S * sizeof(ServeRequest*));
    s->batch = (ServeRequest**)mallocCheck((size_t)S * sizeof(ServeRequest*));
    s->tokens = (int*)mallocCheck((size_t)rows * sizeof(int));
    s->lens = (int*)mallocCheck((size_t)S * sizeof(int));
    s->slots = (int*)mallocCheck((size_t)S * sizeof(int));
    s->starts = (int*)mallocCheck((size_t)S * sizeof(int));
    s->pos = (int*)mallocCheck((size_t)S * sizeof(int));
    s->best = (int*)mallocCheck((size_t)S * sizeof(int));
    s->logits = (float*)mallocCheck((size_t)S * engine->padded_vocab * sizeof(float));
    s->scratch = (ProbIndex*)mallocCheck((size_t)engine->vocab * sizeof(ProbIndex));
}

// a request of these parameters (moved in: params is left empty) that came whole at `arrival` and must be
// done by `deadline` (now_seconds() times)
static inline ServeRequest* serve_request_new(CompletionRequest* params, double arrival, double deadline) {
    ServeRequest* r = (ServeRequest*)callocCheck(1, sizeof(ServeRequest));
    r->params = *params;
    memset(params, 0, sizeof(*params));
    r->arrival = arrival;
    r->deadline = deadline;
    r->piece_end = (size_t*)mallocCheck(((size_t)r->params.max_tokens + 1) * sizeof(size_t));
    r->refs = 1;
    pthread_cond_init(&r->changed, NULL);
    r->out.n_stop = r->params.n_stop;
    for (int i = 0; i < r->params.n_stop; i++) {
        r->out.stop[i] = r->params.stop[i];
        r->out.stop_len[i] = r->params.stop_len[i];
    }
    return r;
}

// one side lets go of r (the lock held)
static inline void request_release_locked(ServeRequest* r) {
    if (--r->refs > 0) { return; }
    completion_request_free(&r->params);
    buf_free(&r->text);
    free(r->piece_end);
    buf_free(&r->out.raw);
    pthread_cond_destroy(&r->changed);
    free(r);
}

// the connection lets go of r
static inline void scheduler_release(Scheduler* s, ServeRequest* r) {
    pthread_mutex_lock(&s->lock);
    request_release_locked(r);
    pthread_mutex_unlock(&s->lock);
}

// Queues r: 0, or -1 with the error (429 when the queue is full, 503 when the server is stopping)
static inline int scheduler_submit(Scheduler* s, ServeRequest* r, ServeError* e) {
    pthread_mutex_lock(&s->lock);
    int rc = 0;
    if (!s->accepting) {
        serve_error(e, 503, "server_error", "shutting_down", NULL, "the server is shutting down");
        rc = -1;
    } else if (s->queued == s->queue_cap) {
        serve_error(e, 429, "rate_limit_error", "queue_full", NULL,
                    "the queue is full: %d requests wait for %d sequence slots (--queue, --slots); retry later",
                    s->queued, s->engine->slots);
        rc = -1;
    } else {
        r->state = REQ_QUEUED;
        r->refs++;
        s->queue[(s->queue_head + s->queued++) % s->queue_cap] = r;
        s->metrics->queued = s->queued;
        pthread_cond_signal(&s->wake);
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

// ends r's generation early (why: CANCEL_*); its slot is freed at the next step
static inline void scheduler_cancel(Scheduler* s, ServeRequest* r, int why) {
    pthread_mutex_lock(&s->lock);
    if (r->state != REQ_DONE && r->cancel == CANCEL_NONE) { r->cancel = why; }
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
}

// Waits up to `seconds` for r to have new text or to end; moves the new text
// to out, and where each token's text ends in out to ends (room for max_tokens
// + 1; NULL: not wanted), *n_ends of them; returns 1 once r has ended (then all
// its text is in out)
static inline int scheduler_poll(Scheduler* s, ServeRequest* r, double seconds, StrBuf* out, size_t* ends = NULL,
                                 int* n_ends = NULL) {
    pthread_mutex_lock(&s->lock);
    if (r->text.len == 0 && r->state != REQ_DONE) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        long long ns = until.tv_nsec + (long long)(seconds * 1e9);
        until.tv_sec += (time_t)(ns / 1000000000LL);
        until.tv_nsec = (long)(ns % 1000000000LL);
        while (r->text.len == 0 && r->state != REQ_DONE) {
            if (pthread_cond_timedwait(&r->changed, &s->lock, &until) == ETIMEDOUT) { break; }
        }
    }
    for (int i = 0; ends && i < r->pieces; i++) { ends[i] = out->len + r->piece_end[i]; }
    if (n_ends) { *n_ends = r->pieces; }
    buf_put(out, r->text.data, r->text.len);
    r->text.len = 0;
    r->pieces = 0;
    int done = r->state == REQ_DONE;
    pthread_mutex_unlock(&s->lock);
    return done;
}

// r->text grew from `before` (the lock held): one more piece for a stream
static inline void request_text(ServeRequest* r, size_t before) {
    if (r->text.len > before) { r->piece_end[r->pieces++] = r->text.len; }
}

// r has ended (the lock held): the rest of its text if it ended by itself, its slot free, the waiter woken.
// The scheduler's reference goes at the end of the step (a step's rows stay valid until then).
static inline void request_end_locked(Scheduler* s, ServeRequest* r, const char* finish_reason) {
    r->finish_reason = finish_reason;
    if (finish_reason) { request_text(r, text_finish(&r->out, &r->text)); }
    else {
        pthread_mutex_lock(&s->metrics->lock);
        s->metrics->cancelled[r->cancel - 1]++;
        pthread_mutex_unlock(&s->metrics->lock);
    }
    if (r->state == REQ_RUNNING) {
        s->running[r->slot] = NULL;
        s->active--;
    }
    r->state = REQ_DONE;
    pthread_cond_signal(&r->changed);
}

// the sequences that leave (cancelled or past their deadline) and the requests
// that come into the free slots, oldest first; the lock held
static inline void scheduler_admit_locked(Scheduler* s, double now) {
    const ServeEngine* e = s->engine;
    for (int i = 0; i < e->slots; i++) {
        ServeRequest* r = s->running[i];
        if (r && r->cancel == CANCEL_NONE && now > r->deadline) { r->cancel = CANCEL_TIMEOUT; }
        if (r && r->cancel != CANCEL_NONE) { request_end_locked(s, r, NULL); request_release_locked(r); }
    }
    int kept = 0;
    for (int k = 0; k < s->queued; k++) {
        ServeRequest* r = s->queue[(s->queue_head + k) % s->queue_cap];
        if (r->cancel == CANCEL_NONE && now > r->deadline) { r->cancel = CANCEL_TIMEOUT; }
        if (r->cancel != CANCEL_NONE) { request_end_locked(s, r, NULL); request_release_locked(r); continue; }
        int slot = 0;
        while (slot < e->slots && s->running[slot]) { slot++; }
        if (slot == e->slots) { s->queue[(s->queue_head + kept++) % s->queue_cap] = r; continue; }
        r->state = REQ_RUNNING;
        r->slot = slot;
        r->order = s->admitted++;
        r->rng = r->params.has_seed ? r->params.seed : rng_mix64(s->seeds++);
        s->running[slot] = r;
        s->active++;
        pthread_mutex_lock(&s->metrics->lock);
        s->metrics->prompt_tokens += (uint64_t)r->params.n_ids;
        pthread_mutex_unlock(&s->metrics->lock);
    }
    s->queued = kept;
    pthread_mutex_lock(&s->metrics->lock);
    s->metrics->queued = s->queued;
    s->metrics->active = s->active;
    pthread_mutex_unlock(&s->metrics->lock);
}

// whether r samples (else it decodes greedily, from the logits' greedy token alone)
static inline int request_samples(const ServeRequest* r) { return r->params.temperature > 0; }

// the next token of r from its logits, or for a greedy request from its
// greedy token (logits_greedy; the logits may then be NULL), the lock held:
// its text to the client, and the end of r when it is end-of-text, completes
// a stop string or reaches max_tokens. A non-finite logit (greedy < 0, which
// logits_greedy gives for any row with one) ends r with an error.
static inline void scheduler_take_token(Scheduler* s, ServeRequest* r, const float* logits, int greedy, double now) {
    const int V = s->engine->vocab;
    if (greedy < 0) {
        fprintf(stderr, "serve: the logits of a sequence are not finite; its request ends with an error\n");
        r->cancel = CANCEL_ERROR;
        request_end_locked(s, r, NULL);
        return;
    }
    SamplerConfig cfg = {r->params.temperature, r->params.top_k, r->params.top_p};
    int token = request_samples(r) ? sample_token(logits, V, &cfg, &r->rng, s->scratch) : greedy;
    r->completion_tokens++;
    Metrics* m = s->metrics;
    pthread_mutex_lock(&m->lock);
    m->generated_tokens++;
    if (r->completion_tokens == 1) { histogram_add(&m->ttft, now - r->arrival); }
    else { histogram_add(&m->tpot, now - r->last_token); }
    pthread_mutex_unlock(&m->lock);
    r->last_token = now;
    size_t before = r->text.len, len = 0;
    if (token == s->tok->eot_token) { request_end_locked(s, r, "stop"); return; }
    const unsigned char* bytes = tokenizer_decode(s->tok, token, &len);
    int stopped = text_push(&r->out, bytes, len, &r->text);
    request_text(r, before);
    if (stopped) { request_end_locked(s, r, "stop"); return; }
    if (r->completion_tokens == r->params.max_tokens) { request_end_locked(s, r, "length"); return; }
    r->next_token = token;
    if (r->text.len > before) { pthread_cond_signal(&r->changed); }
}

// the running sequences, oldest first, into s->rows; returns their number
static inline int scheduler_rows(Scheduler* s) {
    int n = 0;
    for (int i = 0; i < s->engine->slots; i++) {
        ServeRequest* r = s->running[i];
        if (r == NULL) { continue; }
        int j = n++;
        while (j > 0 && s->rows[j - 1]->order > r->order) { s->rows[j] = s->rows[j - 1]; j--; }
        s->rows[j] = r;
    }
    return n;
}

// One step (see the top of the file); 0 when there was nothing to run.
static inline int scheduler_step(Scheduler* s) {
    const ServeEngine* e = s->engine;
    const int Vp = e->padded_vocab;
    pthread_mutex_lock(&s->lock);
    scheduler_admit_locked(s, now_seconds());
    int n = scheduler_rows(s);
    pthread_mutex_unlock(&s->lock);
    if (n == 0) { return 0; }
    // 1. prompt chunks, oldest first, up to e->chunk tokens in all
    int chunks = 0, budget = e->chunk, rows = 0;
    for (int i = 0; i < n && budget > 0; i++) {
        ServeRequest* r = s->rows[i];
        int left = r->params.n_ids - r->prefilled;
        if (left == 0) { continue; }
        int len = left < budget ? left : budget;
        memcpy(s->tokens + rows, r->params.ids + r->prefilled, (size_t)len * sizeof(int));
        s->lens[chunks] = len;
        s->slots[chunks] = r->slot;
        s->starts[chunks] = r->prefilled;
        s->pos[chunks++] = i; // the row of the chunk's sequence
        rows += len;
        budget -= len;
    }
    if (chunks > 0) {
        e->prefill(e->ctx, s->tokens, s->lens, s->slots, s->starts, chunks, s->logits);
        double now = now_seconds();
        pthread_mutex_lock(&s->lock);
        for (int c = 0; c < chunks; c++) {
            ServeRequest* r = s->rows[s->pos[c]];
            r->prefilled += s->lens[c];
            if (r->prefilled == r->params.n_ids && r->state == REQ_RUNNING) {
                const float* logits = s->logits + (size_t)c * Vp;
                scheduler_take_token(s, r, logits, logits_greedy(logits, e->vocab), now);
            }
        }
        pthread_mutex_unlock(&s->lock);
        pthread_mutex_lock(&s->metrics->lock);
        s->metrics->prefill_chunks += (uint64_t)chunks;
        s->metrics->prefill_tokens += (uint64_t)rows;
        pthread_mutex_unlock(&s->metrics->lock);
    }
    // 2. one token for every sequence that has one to feed (those that ended just now are gone)
    int B = 0, samples = 0;
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < n; i++) {
        ServeRequest* r = s->rows[i];
        if (r->state != REQ_RUNNING || r->prefilled < r->params.n_ids) { continue; }
        samples |= request_samples(r);
        s->batch[B] = r;
        s->tokens[B] = r->next_token;
        s->pos[B] = r->params.n_ids + r->completion_tokens - 1;
        s->slots[B++] = r->slot;
    }
    pthread_mutex_unlock(&s->lock);
    if (B > 0) {
        e->decode(e->ctx, s->tokens, s->pos, s->slots, B, samples ? s->logits : NULL, s->best);
        double now = now_seconds();
        pthread_mutex_lock(&s->lock);
        for (int b = 0; b < B; b++) {
            if (s->batch[b]->state == REQ_RUNNING) {
                scheduler_take_token(s, s->batch[b], samples ? s->logits + (size_t)b * Vp : NULL, s->best[b], now);
            }
        }
        pthread_mutex_unlock(&s->lock);
        s->fired_rows += B;
        pthread_mutex_lock(&s->metrics->lock);
        s->metrics->decode_steps++;
        s->metrics->decode_rows += (uint64_t)B;
        pthread_mutex_unlock(&s->metrics->lock);
    }
    // the FFN's firing counts, read now and then (on the GPU a read waits for the device)
    if (e->fired && s->fired_rows > 0 && (s->fired_rows >= 16 * e->slots || s->active == 0)) {
        pthread_mutex_lock(&s->metrics->lock);
        e->fired(e->ctx, s->metrics->fired);
        s->metrics->fired_tokens += (uint64_t)s->fired_rows;
        pthread_mutex_unlock(&s->metrics->lock);
        s->fired_rows = 0;
    }
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < n; i++) {
        if (s->rows[i]->state == REQ_DONE) { request_release_locked(s->rows[i]); }
    }
    pthread_mutex_unlock(&s->lock);
    return 1;
}

static inline void* scheduler_thread(void* arg) {
    Scheduler* s = (Scheduler*)arg;
    for (;;) {
        if (scheduler_step(s)) { continue; }
        pthread_mutex_lock(&s->lock);
        while (!s->quit && s->queued == 0 && s->active == 0) { pthread_cond_wait(&s->wake, &s->lock); }
        int quit = s->quit && s->queued == 0 && s->active == 0;
        pthread_mutex_unlock(&s->lock);
        if (quit) { return NULL; }
    }
}

static inline void scheduler_start(Scheduler* s) {
    if (pthread_create(&s->thread, NULL, scheduler_thread, s) != 0) { fatal("cannot start the scheduler's thread"); }
    s->started = 1;
}

// no new requests from now on (they get 503); the queued and running ones go on
static inline void scheduler_close(Scheduler* s) {
    pthread_mutex_lock(&s->lock);
    s->accepting = 0;
    pthread_mutex_unlock(&s->lock);
}

// the number of requests queued or running
static inline int scheduler_pending(Scheduler* s) {
    pthread_mutex_lock(&s->lock);
    int n = s->queued + s->active;
    pthread_mutex_unlock(&s->lock);
    return n;
}

// every queued and running request ends at the next step
static inline void scheduler_cancel_all(Scheduler* s) {
    pthread_mutex_lock(&s->lock);
    for (int k = 0; k < s->queued; k++) {
        ServeRequest* r = s->queue[(s->queue_head + k) % s->queue_cap];
        if (r->cancel == CANCEL_NONE) { r->cancel = CANCEL_SHUTDOWN; }
    }
    for (int i = 0; i < s->engine->slots; i++) {
        if (s->running[i] && s->running[i]->cancel == CANCEL_NONE) { s->running[i]->cancel = CANCEL_SHUTDOWN; }
    }
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
}

// the thread ends once nothing is queued or running (scheduler_cancel_all first to end them now)
static inline void scheduler_free(Scheduler* s) {
    if (s->started) {
        pthread_mutex_lock(&s->lock);
        s->quit = 1;
        pthread_cond_signal(&s->wake);
        pthread_mutex_unlock(&s->lock);
        pthread_join(s->thread, NULL);
    }
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->wake);
    free(s->queue);
    free(s->running);
    free(s->rows);
    free(s->batch);
    free(s->tokens);
    free(s->lens);
    free(s->slots);
    free(s->starts);
    free(s->pos);
    free(s->best);
    free(s->logits);
    free(s->scratch);
    memset(s, 0, sizeof(*s));
}

#endif // LLMC_SERVE_SCHEDULER_H
