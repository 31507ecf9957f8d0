/*
 The server's metrics, kept under one lock and written in the Prometheus text
 format for GET /metrics (docs/SERVE.md lists them): requests by status, and
 those cancelled by why, prompt and generated tokens, the queue and the active sequences, histograms of
 the time to the first token and of the time between output tokens, the decode
 steps and their rows, and the FFN's firing units per decoded token in each
 layer, the number the sparse decode's cost follows.
*/
#ifndef LLMC_SERVE_METRICS_H
#define LLMC_SERVE_METRICS_H

#include <pthread.h>
#include <stdint.h>
#include "llmc/serve/text.h"

// the statuses the server answers with; anything else counts as the last, 500
static const int METRIC_STATUSES[] = {200, 400, 404, 405, 408, 413, 429, 503, 500};
#define METRIC_N_STATUSES ((int)(sizeof(METRIC_STATUSES) / sizeof(METRIC_STATUSES[0])))

// why a request ended before its completion did, in the order of llmc/serve/scheduler.h's CANCEL_* (from 1)
static const char* const METRIC_CANCEL_REASONS[] = {"client", "timeout", "shutdown", "error"};
#define METRIC_N_CANCEL_REASONS 4

// seconds, upper bounds of the histograms' buckets (and +Inf)
static const double METRIC_BUCKETS[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
#define METRIC_N_BUCKETS ((int)(sizeof(METRIC_BUCKETS) / sizeof(METRIC_BUCKETS[0])))

typedef struct {
    uint64_t count[METRIC_N_BUCKETS + 1]; // per bucket (not cumulative); the last is +Inf
    double sum;
    uint64_t total;
} Histogram;

static inline void histogram_add(Histogram* h, double x) {
    int i = 0;
    while (i < METRIC_N_BUCKETS && x > METRIC_BUCKETS[i]) { i++; }
    h->count[i]++;
    h->sum += x;
    h->total++;
}

typedef struct {
    pthread_mutex_t lock;
    uint64_t requests[METRIC_N_STATUSES];
    uint64_t cancelled[METRIC_N_CANCEL_REASONS]; // requests that ended early, by why
    uint64_t prompt_tokens, generated_tokens;
    int queued, active, slots;        // gauges
    Histogram ttft, tpot;             // time to first token; time between two output tokens of a sequence
    uint64_t decode_steps, decode_rows, prefill_chunks, prefill_tokens;
    int layers, hidden;
    uint64_t* fired;                  // [layers] FFN units that fired, summed over the decoded tokens
    uint64_t fired_tokens;            // the decoded tokens they were counted over
} Metrics;

static inline void metrics_init(Metrics* m, int slots, int layers, int hidden) {
    memset(m, 0, sizeof(*m));
    pthread_mutex_init(&m->lock, NULL);
    m->slots = slots;
    m->layers = layers;
    m->hidden = hidden;
    m->fired = (uint64_t*)callocCheck((size_t)layers, sizeof(uint64_t));
}

static inline void metrics_free(Metrics* m) {
    pthread_mutex_destroy(&m->lock);
    free(m->fired);
}

static inline void metrics_request(Metrics* m, int status) {
    int i = 0;
    while (i < METRIC_N_STATUSES - 1 && METRIC_STATUSES[i] != status) { i++; }
    pthread_mutex_lock(&m->lock);
    m->requests[i]++;
    pthread_mutex_unlock(&m->lock);
}

static inline void histogram_text(StrBuf* b, const char* name, const char* help, const Histogram* h) {
    buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cumulative = 0;
    for (int i = 0; i < METRIC_N_BUCKETS; i++) {
        cumulative += h->count[i];
        buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, METRIC_BUCKETS[i], (unsigned long long)cumulative);
    }
    buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name, (unsigned long long)h->total,
               name, h->sum, name, (unsigned long long)h->total);
}

static inline void metric_text(StrBuf* b, const char* name, const char* type, const char* help, double value) {
    buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, value);
}

// all of it in the Prometheus text format (version 0.0.4)
static inline void metrics_text(Metrics* m, StrBuf* b) {
    pthread_mutex_lock(&m->lock);
    buf_puts(b, "# HELP serve_requests_total Requests answered, by HTTP status.\n# TYPE serve_requests_total counter\n");
    for (int i = 0; i < METRIC_N_STATUSES; i++) {
        buf_printf(b, "serve_requests_total{code=\"%d\"} %llu\n", METRIC_STATUSES[i], (unsigned long long)m->requests[i]);
    }
    buf_puts(b, "# HELP serve_requests_cancelled_total Requests that ended before their completion did, by why (the "
                "client went away, --timeout, shutdown, non-finite logits).\n# TYPE serve_requests_cancelled_total counter\n");
    for (int i = 0; i < METRIC_N_CANCEL_REASONS; i++) {
        buf_printf(b, "serve_requests_cancelled_total{reason=\"%s\"} %llu\n", METRIC_CANCEL_REASONS[i],
                   (unsigned long long)m->cancelled[i]);
    }
    metric_text(b, "serve_prompt_tokens_total", "counter", "Prompt tokens of admitted requests (with the start token).",
                (double)m->prompt_tokens);
    metric_text(b, "serve_generated_tokens_total", "counter", "Tokens generated.", (double)m->generated_tokens);
    metric_text(b, "serve_queue_length", "gauge", "Requests waiting for a sequence slot.", m->queued);
    metric_text(b, "serve_active_sequences", "gauge", "Sequences in the slots (prefilling or decoding).", m->active);
    metric_text(b, "serve_slots", "gauge", "Sequence slots (--slots).", m->slots);
    histogram_text(b, "serve_time_to_first_token_seconds", "From a request's arrival to its first token.", &m->ttft);
    histogram_text(b, "serve_time_per_output_token_seconds", "Between two consecutive tokens of a sequence.", &m->tpot);
    metric_text(b, "serve_decode_steps_total", "counter", "Decode steps (each one batch of all decoding sequences).",
                (double)m->decode_steps);
    metric_text(b, "serve_decode_rows_total", "counter", "Rows of the decode steps (their mean batch: rows / steps).",
                (double)m->decode_rows);
    metric_text(b, "serve_prefill_chunks_total", "counter", "Prompt chunks prefilled.", (double)m->prefill_chunks);
    metric_text(b, "serve_prefill_tokens_total", "counter", "Prompt tokens prefilled.", (double)m->prefill_tokens);
    metric_text(b, "serve_ffn_units", "gauge", "FFN units per layer (H).", m->hidden);
    metric_text(b, "serve_ffn_decoded_tokens_total", "counter", "Decoded tokens the FFN's firing units were counted over.",
                (double)m->fired_tokens);
    buf_puts(b, "# HELP serve_ffn_fired_units_total FFN units that fired (gate > 0), summed over the decoded tokens, "
                "per layer.\n# TYPE serve_ffn_fired_units_total counter\n");
    for (int l = 0; l < m->layers; l++) {
        buf_printf(b, "serve_ffn_fired_units_total{layer=\"%d\"} %llu\n", l, (unsigned long long)m->fired[l]);
    }
    buf_puts(b, "# HELP serve_ffn_active_units_per_token FFN units that fire per decoded token, per layer (mean since "
                "the start; of serve_ffn_units).\n# TYPE serve_ffn_active_units_per_token gauge\n");
    for (int l = 0; l < m->layers; l++) {
        buf_printf(b, "serve_ffn_active_units_per_token{layer=\"%d\"} %.6g\n", l,
                   m->fired_tokens ? (double)m->fired[l] / (double)m->fired_tokens : 0.0);
    }
    pthread_mutex_unlock(&m->lock);
}

#endif // LLMC_SERVE_METRICS_H
