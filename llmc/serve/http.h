/*
 The server's HTTP side, over libmicrohttpd (docs/SERVE.md): the routes
     POST /v1/completions   OpenAI's completions (llmc/serve/protocol.h), whole or streamed
     GET  /v1/models        the one model served
     GET  /health           200 while serving, 503 while stopping
     GET  /metrics          Prometheus text (llmc/serve/metrics.h)
 and the server's life: listen, answer, and on SIGINT or SIGTERM stop taking
 connections and requests, let the requests that run finish (a second signal,
 or --timeout, cancels them), and return 0.

 libmicrohttpd runs a thread per connection (its limit: the slots, the queue
 and CONN_SPARE more), so a request's thread can wait for its text. Each
 request's state (Conn) lives from its headers to libmicrohttpd's "completed"
 call (and, for a stream, until its response is freed). Before its body is
 read, a request to an unknown route gets 404, a wrong method 405, and a
 Content-Length over --max-body 413; a body that grows past it without one is
 dropped as it comes and answered 413. A body whose last byte comes after the
 request's deadline (--timeout from its first byte) gets 408; a connection
 silent for longer is closed by libmicrohttpd. Bodies are parsed one at a time,
 so the JSON tree of a pathological body (up to ~40 bytes per input byte)
 exists once. While a request waits for its text, its thread looks at the
 socket every POLL_SECONDS: a client that went away cancels its request, which
 frees its sequence slot at the scheduler's next step.
*/
#ifndef LLMC_SERVE_HTTP_H
#define LLMC_SERVE_HTTP_H

#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <microhttpd.h>
#include "llmc/serve/metrics.h"
#include "llmc/serve/protocol.h"
#include "llmc/serve/scheduler.h"

#if MHD_VERSION < 0x00097100
#error "the server needs libmicrohttpd 0.9.71 or newer (dev/carry_microhttpd.sh fetches Debian's 0.9.75)"
#endif

#define CONN_SPARE 64        // connections beyond the slots and the queue: health checks, metrics, refusals
#define POLL_SECONDS 0.05    // how often a waiting request looks at its client and its deadline

typedef struct {
    const char* host;
    int port;                // 0: any free port (the line the server prints says which)
    int queue;               // requests that may wait for a slot
    double timeout;          // seconds a request may take, from its first byte to its last token
    size_t max_body;         // bytes of a request body
    int max_tokens;          // the most a request's max_tokens may be
    const char* model_id;
    uint64_t seed;           // of the requests that give no seed
} ServeOptions;

typedef struct {
    ServeOptions opt;
    const ServeEngine* engine;
    const Tokenizer* tok;
    RequestLimits limits;
    Metrics metrics;
    Scheduler sched;
    pthread_mutex_t parse_lock;
    long long created;       // the server's start, Unix seconds (the model's "created")
    int stopping;            // 1 after the first signal (atomic)
    int open;                // requests between their headers and their end (atomic)
    unsigned long long ids;  // completion ids (atomic)
} Server;

typedef struct {
    Server* srv;
    struct MHD_Connection* c;
    int refs;                // the connection's, and a stream response's (atomic)
    double start;            // the request's first byte
    StrBuf body;
    int too_large;
    ServeRequest* req;       // once submitted
    char id[40];
    StrBuf text, out;        // a stream's new text, and its events not yet handed to libmicrohttpd
    size_t* ends;            // [max_tokens + 1] where each token's text ends in `text`: an event each
    int ended;               // a stream's last event is in out
} Conn;

static volatile sig_atomic_t serve_signals = 0;
static void serve_on_signal(int sig) { serve_signals = serve_signals + 1; }

static inline void conn_release(Conn* conn) {
    if (__atomic_sub_fetch(&conn->refs, 1, __ATOMIC_ACQ_REL) > 0) { return; }
    if (conn->req) { scheduler_release(&conn->srv->sched, conn->req); }
    __atomic_sub_fetch(&conn->srv->open, 1, __ATOMIC_ACQ_REL);
    buf_free(&conn->body);
    buf_free(&conn->text);
    buf_free(&conn->out);
    free(conn->ends);
    free(conn);
}

// 1 if the client closed its side or the connection broke
static inline int client_gone(struct MHD_Connection* c) {
    const union MHD_ConnectionInfo* info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (info == NULL) { return 1; }
    struct pollfd p = {info->connect_fd, POLLRDHUP, 0};
    return poll(&p, 1, 0) < 0 || (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

// ----------------------------------------------------------------------------
// answers

// queues a response of status with body; MHD_NO (libmicrohttpd then closes the connection) if that fails
static inline enum MHD_Result respond(Conn* conn, int status, const char* content_type, const StrBuf* body,
                                      const char* header, const char* value) {
    struct MHD_Response* resp = MHD_create_response_from_buffer(body->len, body->data, MHD_RESPMEM_MUST_COPY);
    if (resp == NULL) { fprintf(stderr, "serve: cannot create a response\n"); return MHD_NO; }
    enum MHD_Result ok = MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    if (ok == MHD_YES && header) { ok = MHD_add_response_header(resp, header, value); }
    if (ok == MHD_YES) { ok = MHD_queue_response(conn->c, (unsigned int)status, resp); }
    MHD_destroy_response(resp);
    if (ok != MHD_YES) { fprintf(stderr, "serve: cannot send a %d response\n", status); return MHD_NO; }
    metrics_request(&conn->srv->metrics, status);
    return MHD_YES;
}

// an error as OpenAI answers it; allow: the method a 405's route takes
static inline enum MHD_Result respond_error(Conn* conn, const ServeError* e, const char* allow = NULL) {
    StrBuf b = {};
    serve_error_json(&b, e);
    const char *header = allow ? MHD_HTTP_HEADER_ALLOW : NULL, *value = allow;
    if (e->status == 429 || e->status == 503) { header = MHD_HTTP_HEADER_RETRY_AFTER; value = "1"; }
    enum MHD_Result rc = respond(conn, e->status, "application/json", &b, header, value);
    buf_free(&b);
    return rc;
}

// the error of a request that ended without finishing (cancel: CANCEL_*)
static inline void ended_error(const Conn* conn, int cancel, ServeError* e) {
    if (cancel == CANCEL_TIMEOUT) {
        serve_error(e, 408, "timeout_error", "request_timeout", NULL,
                    "the request took longer than --timeout (%g s) and was cancelled; ask for fewer max_tokens",
                    conn->srv->opt.timeout);
    } else if (cancel == CANCEL_SHUTDOWN) {
        serve_error(e, 503, "server_error", "shutting_down", NULL, "the server is shutting down");
    } else {
        serve_error(e, 500, "server_error", "model_error", NULL,
                    "the model's logits were not finite: its weights or activations hold NaN or overflow");
    }
}

// ----------------------------------------------------------------------------
// a stream: server-sent events, libmicrohttpd asking for bytes as it sends them

// the next events of the stream into conn->out, waiting for them; 0, or -1 when the client is gone
static inline int stream_events(Conn* conn) {
    Server* srv = conn->srv;
    ServeRequest* r = conn->req;
    const char* model = srv->opt.model_id;
    while (conn->out.len == 0 && !conn->ended) {
        int pieces = 0;
        int done = scheduler_poll(&srv->sched, r, POLL_SECONDS, &conn->text, conn->ends, &pieces);
        if (!done && pieces == 0 && client_gone(conn->c)) { return -1; }
        if (!done && pieces == 0) { continue; }
        pthread_mutex_lock(&srv->sched.lock);
        const char* finish = r->finish_reason;
        int cancel = r->cancel, completion_tokens = r->completion_tokens;
        pthread_mutex_unlock(&srv->sched.lock);
        if (done && finish == NULL && cancel == CANCEL_CLIENT) { return -1; }
        // an event per token's text, the last one with the finish reason (alone if the last token had no text)
        for (int i = 0; i < pieces; i++) {
            size_t from = i > 0 ? conn->ends[i - 1] : 0;
            completion_chunk_sse(&conn->out, conn->id, srv->created, model, conn->text.data + from, conn->ends[i] - from,
                                 done && i == pieces - 1 ? finish : NULL);
        }
        if (done && finish && pieces == 0) { completion_chunk_sse(&conn->out, conn->id, srv->created, model, "", 0, finish); }
        conn->text.len = 0;
        if (!done) { continue; }
        if (finish && r->params.include_usage) {
            completion_usage_sse(&conn->out, conn->id, srv->created, model, r->params.n_ids, completion_tokens);
        }
        if (finish == NULL) { // the status went out with the first byte: the error is an event
            ServeError e;
            ended_error(conn, cancel, &e);
            buf_puts(&conn->out, "data: ");
            serve_error_json(&conn->out, &e);
            buf_puts(&conn->out, "\n\n");
        }
        buf_puts(&conn->out, "data: [DONE]\n\n");
        conn->ended = 1;
    }
    return 0;
}

static inline ssize_t stream_read(void* cls, uint64_t pos, char* buf, size_t max) {
    Conn* conn = (Conn*)cls;
    if (stream_events(conn) != 0) {
        scheduler_cancel(&conn->srv->sched, conn->req, CANCEL_CLIENT);
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (conn->out.len == 0) { return MHD_CONTENT_READER_END_OF_STREAM; }
    size_t n = conn->out.len < max ? conn->out.len : max;
    memcpy(buf, conn->out.data, n);
    buf_consume(&conn->out, n);
    return (ssize_t)n;
}

static inline void stream_free(void* cls) { conn_release((Conn*)cls); }

// ----------------------------------------------------------------------------
// the routes

static inline enum MHD_Result completions(Conn* conn) {
    Server* srv = conn->srv;
    ServeError e;
    if (conn->too_large) {
        serve_error(&e, 413, "invalid_request_error", "request_too_large", NULL,
                    "the body is over this server's limit of %zu bytes (--max-body)", srv->opt.max_body);
        return respond_error(conn, &e);
    }
    double now = now_seconds();
    if (now - conn->start > srv->opt.timeout) {
        serve_error(&e, 408, "timeout_error", "request_timeout", NULL,
                    "the request took %.1f s to arrive, over --timeout (%g s)", now - conn->start, srv->opt.timeout);
        return respond_error(conn, &e);
    }
    CompletionRequest params;
    pthread_mutex_lock(&srv->parse_lock);
    int rc = completion_request_parse(conn->body.data ? conn->body.data : "", conn->body.len, &srv->limits, &params, &e);
    pthread_mutex_unlock(&srv->parse_lock);
    buf_free(&conn->body);
    if (rc == 0) { rc = completion_request_encode(&params, srv->tok, srv->engine->context, &e); }
    if (rc != 0) { completion_request_free(&params); return respond_error(conn, &e); }
    int stream = params.stream;
    conn->req = serve_request_new(&params, now, conn->start + srv->opt.timeout);
    if (scheduler_submit(&srv->sched, conn->req, &e) != 0) { return respond_error(conn, &e); }
    snprintf(conn->id, sizeof(conn->id), "cmpl-%llu", __atomic_add_fetch(&srv->ids, 1, __ATOMIC_RELAXED));
    if (stream) {
        conn->ends = (size_t*)mallocCheck(((size_t)conn->req->params.max_tokens + 1) * sizeof(size_t));
        struct MHD_Response* resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, conn,
                                                                      stream_free);
        if (resp == NULL) { fprintf(stderr, "serve: cannot create a stream response\n"); return MHD_NO; }
        __atomic_add_fetch(&conn->refs, 1, __ATOMIC_ACQ_REL); // the response's, released by stream_free
        enum MHD_Result ok = MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        if (ok == MHD_YES) { ok = MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache"); }
        if (ok == MHD_YES) { ok = MHD_queue_response(conn->c, MHD_HTTP_OK, resp); }
        MHD_destroy_response(resp);
        if (ok != MHD_YES) { fprintf(stderr, "serve: cannot send a stream\n"); return MHD_NO; }
        metrics_request(&srv->metrics, 200);
        return MHD_YES;
    }
    StrBuf text = {};
    int done = 0;
    while (!done) {
        done = scheduler_poll(&srv->sched, conn->req, POLL_SECONDS, &text);
        if (!done && client_gone(conn->c)) {
            scheduler_cancel(&srv->sched, conn->req, CANCEL_CLIENT);
            buf_free(&text);
            return MHD_NO; // nobody to answer
        }
    }
    pthread_mutex_lock(&srv->sched.lock);
    const char* finish = conn->req->finish_reason;
    int cancel = conn->req->cancel, completion_tokens = conn->req->completion_tokens;
    pthread_mutex_unlock(&srv->sched.lock);
    enum MHD_Result result;
    if (finish) {
        StrBuf b = {};
        completion_json(&b, conn->id, srv->created, srv->opt.model_id, text.data ? text.data : "", text.len, finish,
                        conn->req->params.n_ids, completion_tokens);
        result = respond(conn, 200, "application/json", &b, NULL, NULL);
        buf_free(&b);
    } else if (cancel == CANCEL_CLIENT) {
        result = MHD_NO;
    } else {
        ended_error(conn, cancel, &e);
        result = respond_error(conn, &e);
    }
    buf_free(&text);
    return result;
}

static inline enum MHD_Result models(Conn* conn) {
    Server* srv = conn->srv;
    StrBuf b = {};
    buf_puts(&b, "{\"object\":\"list\",\"data\":[{\"id\":");
    buf_put_json(&b, srv->opt.model_id, strlen(srv->opt.model_id));
    buf_printf(&b, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"train_gpt_sparse\",\"max_model_len\":%d}]}",
               srv->created, srv->engine->context);
    enum MHD_Result rc = respond(conn, 200, "application/json", &b, NULL, NULL);
    buf_free(&b);
    return rc;
}

static inline enum MHD_Result health(Conn* conn) {
    if (__atomic_load_n(&conn->srv->stopping, __ATOMIC_ACQUIRE)) {
        ServeError e;
        serve_error(&e, 503, "server_error", "shutting_down", NULL, "the server is shutting down");
        return respond_error(conn, &e);
    }
    StrBuf b = {};
    buf_puts(&b, "{\"status\":\"ok\"}");
    enum MHD_Result rc = respond(conn, 200, "application/json", &b, NULL, NULL);
    buf_free(&b);
    return rc;
}

static inline enum MHD_Result metrics_route(Conn* conn) {
    StrBuf b = {};
    metrics_text(&conn->srv->metrics, &b);
    enum MHD_Result rc = respond(conn, 200, "text/plain; version=0.0.4; charset=utf-8", &b, NULL, NULL);
    buf_free(&b);
    return rc;
}

typedef enum MHD_Result (*RouteFn)(Conn*);
static const struct { const char* path; const char* method; RouteFn fn; } SERVE_ROUTES[] = {
    {"/v1/completions", MHD_HTTP_METHOD_POST, completions},
    {"/v1/models", MHD_HTTP_METHOD_GET, models},
    {"/health", MHD_HTTP_METHOD_GET, health},
    {"/metrics", MHD_HTTP_METHOD_GET, metrics_route},
};

// libmicrohttpd's handler: called once with the headers, once per piece of the body, once at its end
static inline enum MHD_Result serve_handle(void* cls, struct MHD_Connection* c, const char* url, const char* method,
                                          const char* version, const char* upload_data, size_t* upload_size,
                                          void** con_cls) {
    Server* srv = (Server*)cls;
    Conn* conn = (Conn*)*con_cls;
    int route = -1;
    for (int i = 0; i < (int)(sizeof(SERVE_ROUTES) / sizeof(SERVE_ROUTES[0])); i++) {
        if (strcmp(url, SERVE_ROUTES[i].path) == 0) { route = i; }
    }
    if (conn == NULL) { // the headers
        conn = (Conn*)callocCheck(1, sizeof(Conn));
        conn->srv = srv;
        conn->c = c;
        conn->refs = 1;
        conn->start = now_seconds();
        __atomic_add_fetch(&srv->open, 1, __ATOMIC_ACQ_REL);
        *con_cls = conn;
        ServeError e;
        if (route < 0) {
            serve_error(&e, 404, "invalid_request_error", "not_found", NULL,
                        "no route %.200s %.200s: this server answers POST /v1/completions, GET /v1/models, GET /health "
                        "and GET /metrics", method, url);
            return respond_error(conn, &e);
        }
        if (strcmp(method, SERVE_ROUTES[route].method) != 0) {
            serve_error(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "%.200s takes %s, not %.100s",
                        url, SERVE_ROUTES[route].method, method);
            return respond_error(conn, &e, SERVE_ROUTES[route].method);
        }
        const char* length = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (length && strtoull(length, NULL, 10) > srv->opt.max_body) {
            serve_error(&e, 413, "invalid_request_error", "request_too_large", NULL,
                        "the body is %.30s bytes, over this server's limit of %zu (--max-body)", length,
                        srv->opt.max_body);
            return respond_error(conn, &e);
        }
        return MHD_YES;
    }
    if (*upload_size > 0) { // a piece of the body: kept while it fits, dropped after
        if (conn->body.len + *upload_size > srv->opt.max_body) {
            conn->too_large = 1;
            buf_free(&conn->body);
        }
        if (!conn->too_large) { buf_put(&conn->body, upload_data, *upload_size); }
        *upload_size = 0;
        return MHD_YES;
    }
    return SERVE_ROUTES[route].fn(conn);
}

// libmicrohttpd's "request completed": a request still running lost its client
static inline void serve_completed(void* cls, struct MHD_Connection* c, void** con_cls,
                                   enum MHD_RequestTerminationCode toe) {
    Conn* conn = (Conn*)*con_cls;
    if (conn == NULL) { return; }
    if (conn->req) { scheduler_cancel(&conn->srv->sched, conn->req, CANCEL_CLIENT); }
    conn_release(conn);
    *con_cls = NULL;
}

// ----------------------------------------------------------------------------
// the server's life

static inline void serve_sleep(double seconds) {
    struct timespec ts = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    nanosleep(&ts, NULL);
}

// Serves engine's model until SIGINT or SIGTERM; returns the exit status (0).
static inline int serve_run(const ServeOptions* opt, const ServeEngine* engine, const Tokenizer* tok) {
    Server* srv = (Server*)callocCheck(1, sizeof(Server));
    srv->opt = *opt;
    srv->engine = engine;
    srv->tok = tok;
    srv->limits = (RequestLimits){opt->model_id, opt->max_tokens};
    srv->created = (long long)time(NULL);
    pthread_mutex_init(&srv->parse_lock, NULL);
    metrics_init(&srv->metrics, engine->slots, engine->layers, engine->hidden);
    scheduler_init(&srv->sched, engine, tok, &srv->metrics, opt->queue, opt->seed);

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = serve_on_signal;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0) { fatal("cannot install the signal handlers"); }
    signal(SIGPIPE, SIG_IGN); // a client gone while we write is an error return, not a signal

    char port[16];
    snprintf(port, sizeof(port), "%d", opt->port);
    struct addrinfo hints, *addr = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int gai = getaddrinfo(opt->host, port, &hints, &addr);
    if (gai != 0) { fatal("--host %s: %s", opt->host, gai_strerror(gai)); }
    unsigned int flags = MHD_USE_AUTO | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ITC |
                         MHD_USE_ERROR_LOG | (addr->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    scheduler_start(&srv->sched);
    struct MHD_Daemon* d = MHD_start_daemon(
        flags, (uint16_t)opt->port, NULL, NULL, serve_handle, srv,
        MHD_OPTION_SOCK_ADDR, addr->ai_addr,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned int)(engine->slots + opt->queue + CONN_SPARE),
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)ceil(opt->timeout) + 5, // idle connections (a request's own deadline is checked above)
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024,
        MHD_OPTION_NOTIFY_COMPLETED, serve_completed, srv,
        MHD_OPTION_END);
    freeaddrinfo(addr);
    if (d == NULL) { fatal("cannot listen on %s port %d (libmicrohttpd says why above)", opt->host, opt->port); }
    const union MHD_DaemonInfo* info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    if (info == NULL) { fatal("libmicrohttpd does not say which port it listens on"); }
    printf("serving %s on http://%s:%u: %d slots of %d positions, prefill chunks of %d tokens, a queue of %d, "
           "--timeout %g s\n", opt->model_id, opt->host, (unsigned)info->port, engine->slots, engine->context,
           engine->chunk, opt->queue, opt->timeout);
    fflush(stdout);

    while (serve_signals == 0) { serve_sleep(POLL_SECONDS); }
    printf("stopping: no new connections; waiting for %d requests (a second signal cancels them)\n",
           scheduler_pending(&srv->sched));
    fflush(stdout);
    __atomic_store_n(&srv->stopping, 1, __ATOMIC_RELEASE);
    scheduler_close(&srv->sched);
    MHD_socket listener = MHD_quiesce_daemon(d);
    double until = now_seconds() + opt->timeout;
    int cancelled = 0;
    while (scheduler_pending(&srv->sched) > 0 || __atomic_load_n(&srv->open, __ATOMIC_ACQUIRE) > 0) {
        if (!cancelled && (serve_signals > 1 || now_seconds() > until)) {
            scheduler_cancel_all(&srv->sched);
            cancelled = 1;
            until = now_seconds() + 5; // the cancelled ones' answers, then the rest is cut
        } else if (cancelled && now_seconds() > until) {
            break;
        }
        serve_sleep(POLL_SECONDS);
    }
    MHD_stop_daemon(d);
    if (listener != MHD_INVALID_SOCKET) { close(listener); }
    scheduler_cancel_all(&srv->sched);
    scheduler_free(&srv->sched);
    printf("stopped\n");
    fflush(stdout);
    metrics_free(&srv->metrics);
    pthread_mutex_destroy(&srv->parse_lock);
    free(srv);
    return 0;
}

#endif // LLMC_SERVE_HTTP_H
