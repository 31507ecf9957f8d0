/*
 The OpenAI completions protocol of the server (docs/SERVE.md): a request body
 read and checked into a CompletionRequest, its prompt encoded and checked
 against the context, and the JSON the server answers with (a completion, a
 streamed chunk, an error).

 The body is parsed by the project's JSON reader (llmc/json.h, fuzzed;
 fuzz/fuzz_serve_request.cpp feeds it this file's parser too). Everything the
 server does not do is refused with a 400 that names the field, never ignored:
 an unknown field, a value of the wrong type or out of range, and the OpenAI
 fields the server does not implement unless they hold their neutral value
 (n 1, best_of 1, echo false, logprobs null, suffix null, penalties 0,
 logit_bias empty). Errors are OpenAI's shape:
     {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
*/
#ifndef LLMC_SERVE_PROTOCOL_H
#define LLMC_SERVE_PROTOCOL_H

#include <stdint.h>
#include "llmc/json.h"
#include "llmc/serve/text.h"
#include "llmc/tokenizer.h"

// ----------------------------------------------------------------------------
// errors

typedef struct {
    int status;         // the HTTP status
    const char* type;   // OpenAI's error type: invalid_request_error, ...
    const char* code;   // a short machine-readable name, or NULL
    char param[64];     // the request field at fault, "" for none
    char message[512];  // what was wrong and what is expected
} ServeError;

__attribute__((format(printf, 6, 7)))
static inline void serve_error(ServeError* e, int status, const char* type, const char* code, const char* param,
                               const char* fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
    va_list args;
    va_start(args, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, args);
    va_end(args);
}

// the error as a JSON body
static inline void serve_error_json(StrBuf* b, const ServeError* e) {
    buf_puts(b, "{\"error\":{\"message\":");
    buf_put_json(b, e->message, strlen(e->message));
    buf_puts(b, ",\"type\":");
    buf_put_json(b, e->type, strlen(e->type));
    buf_puts(b, ",\"param\":");
    if (e->param[0]) { buf_put_json(b, e->param, strlen(e->param)); } else { buf_puts(b, "null"); }
    buf_puts(b, ",\"code\":");
    if (e->code) { buf_put_json(b, e->code, strlen(e->code)); } else { buf_puts(b, "null"); }
    buf_puts(b, "}}");
}

// ----------------------------------------------------------------------------
// a completion request

typedef struct {
    const char* model_id;  // the one model served: a request's `model` must be it
    int max_tokens;        // the most tokens a request may ask for (--max-tokens)
} RequestLimits;

typedef struct {
    char* prompt;          // UTF-8, prompt_len bytes (NUL-terminated)
    size_t prompt_len;
    int max_tokens;        // default 16, as OpenAI's
    float temperature;     // default 1; 0 = greedy
    float top_p;           // default 1
    int top_k;             // default 0 = all (an extension, as vLLM's)
    int has_seed;
    uint64_t seed;
    char* stop[TEXT_MAX_STOP];
    size_t stop_len[TEXT_MAX_STOP];
    int n_stop;
    int stream, include_usage;
    // from completion_request_encode
    int* ids;              // the start token, then the prompt's tokens
    int n_ids;
} CompletionRequest;

static inline void completion_request_free(CompletionRequest* r) {
    free(r->prompt);
    for (int i = 0; i < r->n_stop; i++) { free(r->stop[i]); }
    free(r->ids);
    memset(r, 0, sizeof(*r));
}

// a 400 for field `name`: "<name> must be <want>, got <what v is>"; its code says whether v's type
// was wrong (wrong_type) or its value
static inline int request_bad_value(ServeError* e, const char* name, const JsonValue* v, const char* want,
                                    int wrong_type) {
    char got[96];
    if (v->type == JSON_NUMBER) { snprintf(got, sizeof(got), "%.17g", v->number); }
    else if (v->type == JSON_STRING) { snprintf(got, sizeof(got), "a string"); }
    else { snprintf(got, sizeof(got), "%s", json_type_name(v->type)); }
    serve_error(e, 400, "invalid_request_error", wrong_type ? "invalid_type" : "invalid_value", name,
                "%s must be %s, got %s", name, want, got);
    return -1;
}

// v as an integer in [lo, hi] into *out
static inline int request_int(const JsonValue* v, const char* name, int64_t lo, int64_t hi, const char* want,
                              int64_t* out, ServeError* e) {
    if (v->type != JSON_NUMBER || !v->is_integer || v->integer < lo || v->integer > hi) {
        return request_bad_value(e, name, v, want, v->type != JSON_NUMBER || !v->is_integer);
    }
    *out = v->integer;
    return 0;
}

// v as a number in [lo, hi] (lo excluded when open_lo) into *out
static inline int request_number(const JsonValue* v, const char* name, double lo, double hi, int open_lo,
                                 const char* want, float* out, ServeError* e) {
    if (v->type != JSON_NUMBER || v->number < lo || v->number > hi || (open_lo && v->number == lo)) {
        return request_bad_value(e, name, v, want, v->type != JSON_NUMBER);
    }
    *out = (float)v->number;
    return 0;
}

// one stop string into r
static inline int request_stop_string(const JsonValue* v, CompletionRequest* r, ServeError* e) {
    if (v->type != JSON_STRING || v->length == 0) {
        return request_bad_value(e, "stop", v, "a non-empty string or an array of up to 4 of them", v->type != JSON_STRING);
    }
    r->stop[r->n_stop] = (char*)mallocCheck(v->length + 1);
    memcpy(r->stop[r->n_stop], v->string, v->length + 1);
    r->stop_len[r->n_stop++] = v->length;
    return 0;
}

// stream_options: {"include_usage": bool}
static inline int request_stream_options(const JsonValue* v, CompletionRequest* r, ServeError* e) {
    if (v->type != JSON_OBJECT) { return request_bad_value(e, "stream_options", v, "an object or null", 1); }
    for (size_t k = 0; k < v->length; k++) {
        const JsonMember* m = &v->members[k];
        if (strcmp(m->key, "include_usage") != 0) {
            serve_error(e, 400, "invalid_request_error", "unknown_parameter", "stream_options",
                        "stream_options.%.100s is not supported (only include_usage is)", m->key);
            return -1;
        }
        if (m->value.type != JSON_TRUE && m->value.type != JSON_FALSE) {
            return request_bad_value(e, "stream_options.include_usage", &m->value, "true or false", 1);
        }
        r->include_usage = m->value.type == JSON_TRUE;
    }
    return 0;
}

// the OpenAI fields the server does not implement: accepted at their neutral value only
static inline int request_neutral(const JsonMember* m, ServeError* e, int* known) {
    const JsonValue* v = &m->value;
    const char* want = NULL;
    int neutral = v->type == JSON_NULL;
    *known = 1;
    if (strcmp(m->key, "n") == 0 || strcmp(m->key, "best_of") == 0) {
        want = "1 (one completion per request)";
        neutral |= v->type == JSON_NUMBER && v->number == 1;
    } else if (strcmp(m->key, "echo") == 0) {
        want = "false (the prompt is not echoed)";
        neutral |= v->type == JSON_FALSE;
    } else if (strcmp(m->key, "logprobs") == 0 || strcmp(m->key, "suffix") == 0) {
        want = "null (not supported)";
    } else if (strcmp(m->key, "frequency_penalty") == 0 || strcmp(m->key, "presence_penalty") == 0) {
        want = "0 (penalties are not supported)";
        neutral |= v->type == JSON_NUMBER && v->number == 0;
    } else if (strcmp(m->key, "logit_bias") == 0) {
        want = "empty (not supported)";
        neutral |= v->type == JSON_OBJECT && v->length == 0;
    } else if (strcmp(m->key, "user") == 0) {
        want = "a string (an end user's id, kept by no one)";
        neutral |= v->type == JSON_STRING;
    } else {
        *known = 0;
        return 0;
    }
    if (neutral) { return 0; }
    serve_error(e, 400, "invalid_request_error", "unsupported_value", m->key, "%s must be %s", m->key, want);
    return -1;
}

// Reads a /v1/completions body into r (free it with completion_request_free
// in either case): 0, or -1 with the 400 (404 for another model) in e.
static inline int completion_request_parse(const char* body, size_t n, const RequestLimits* lim, CompletionRequest* r,
                                           ServeError* e) {
    memset(r, 0, sizeof(*r));
    r->max_tokens = 16 < lim->max_tokens ? 16 : lim->max_tokens;
    r->temperature = 1.0f;
    r->top_p = 1.0f;
    JsonValue root;
    char err[256];
    if (json_parse_text(body, n, &root, err, sizeof(err)) != 0) {
        serve_error(e, 400, "invalid_request_error", "invalid_json", NULL, "the body is not valid JSON: %s", err);
        return -1;
    }
    int rc = 0, has_prompt = 0;
    if (root.type != JSON_OBJECT) {
        serve_error(e, 400, "invalid_request_error", "invalid_json", NULL, "the body must be a JSON object, got %s",
                    json_type_name(root.type));
        rc = -1;
    }
    for (size_t k = 0; rc == 0 && root.type == JSON_OBJECT && k < root.length; k++) {
        const JsonMember* m = &root.members[k];
        const JsonValue* v = &m->value;
        const char* key = m->key;
        int64_t i64 = 0;
        int known;
        if (strlen(key) != m->key_length) { // a \u0000 in the name: no field of ours
            serve_error(e, 400, "invalid_request_error", "unknown_parameter", NULL, "a field's name holds a NUL byte");
            rc = -1;
        } else if (strcmp(key, "model") == 0) {
            if (v->type != JSON_STRING) { rc = request_bad_value(e, "model", v, "a string", 1); }
            else if (!json_string_is(v, lim->model_id)) {
                serve_error(e, 404, "invalid_request_error", "model_not_found", "model",
                            "the model '%.200s' does not exist: this server serves '%.200s' (GET /v1/models)",
                            v->string, lim->model_id);
                rc = -1;
            }
        } else if (strcmp(key, "prompt") == 0) {
            if (v->type != JSON_STRING) {
                rc = request_bad_value(e, "prompt", v, "a string (batches and token arrays are not supported)", 1);
            } else {
                r->prompt = (char*)mallocCheck(v->length + 1);
                memcpy(r->prompt, v->string, v->length + 1);
                r->prompt_len = v->length;
                has_prompt = 1;
            }
        } else if (strcmp(key, "max_tokens") == 0) {
            if (v->type != JSON_NULL) {
                char want[96];
                snprintf(want, sizeof(want), "an integer from 1 to %d (this server's limit) or null", lim->max_tokens);
                rc = request_int(v, "max_tokens", 1, lim->max_tokens, want, &i64, e);
                r->max_tokens = (int)i64;
            }
        } else if (strcmp(key, "temperature") == 0) {
            if (v->type != JSON_NULL) { rc = request_number(v, key, 0, 2, 0, "a number from 0 to 2 or null", &r->temperature, e); }
        } else if (strcmp(key, "top_p") == 0) {
            if (v->type != JSON_NULL) { rc = request_number(v, key, 0, 1, 1, "a number in (0, 1] or null", &r->top_p, e); }
        } else if (strcmp(key, "top_k") == 0) {
            if (v->type != JSON_NULL) {
                rc = request_int(v, key, 0, INT32_MAX, "an integer >= 0 (0 = all tokens) or null", &i64, e);
                r->top_k = (int)i64;
            }
        } else if (strcmp(key, "seed") == 0) {
            if (v->type != JSON_NULL) {
                rc = request_int(v, key, INT64_MIN, INT64_MAX, "an integer or null", &i64, e);
                r->seed = (uint64_t)i64;
                r->has_seed = 1;
            }
        } else if (strcmp(key, "stop") == 0) {
            if (v->type == JSON_ARRAY && v->length <= TEXT_MAX_STOP) {
                for (size_t s = 0; s < v->length && rc == 0; s++) { rc = request_stop_string(&v->items[s], r, e); }
            } else if (v->type != JSON_NULL) {
                rc = request_stop_string(v, r, e);
            }
        } else if (strcmp(key, "stream") == 0) {
            if (v->type != JSON_TRUE && v->type != JSON_FALSE && v->type != JSON_NULL) {
                rc = request_bad_value(e, key, v, "true, false or null", 1);
            }
            r->stream = v->type == JSON_TRUE;
        } else if (strcmp(key, "stream_options") == 0) {
            if (v->type != JSON_NULL) { rc = request_stream_options(v, r, e); }
        } else if ((rc = request_neutral(m, e, &known)) == 0 && !known) {
            serve_error(e, 400, "invalid_request_error", "unknown_parameter", key,
                        "unknown field '%.100s' (docs/SERVE.md lists the fields this server reads)", key);
            rc = -1;
        }
    }
    if (rc == 0 && !has_prompt) {
        serve_error(e, 400, "invalid_request_error", "missing_required_parameter", "prompt", "prompt is required (a string)");
        rc = -1;
    }
    if (rc == 0 && r->include_usage && !r->stream) {
        serve_error(e, 400, "invalid_request_error", "invalid_value", "stream_options",
                    "stream_options needs stream true");
        rc = -1;
    }
    json_free(&root);
    return rc;
}

// The prompt's tokens after the start token (as infer starts every prompt),
// checked against the context: the prompt and max_tokens must fit in it.
static inline int completion_request_encode(CompletionRequest* r, const Tokenizer* tok, int context, ServeError* e) {
    size_t n = 0, cap = 0;
    tokenizer_push(tok->eot_token, &r->ids, &n, &cap);
    if (tokenizer_encode(tok, r->prompt, r->prompt_len, &r->ids, &n, &cap) != 0) {
        // the JSON reader lets no invalid UTF-8 through; this stays as the encoder's contract
        serve_error(e, 400, "invalid_request_error", "invalid_value", "prompt", "prompt is not valid UTF-8");
        return -1;
    }
    r->n_ids = (int)n;
    if ((long long)n + r->max_tokens > context) {
        serve_error(e, 400, "invalid_request_error", "context_length_exceeded", n >= (size_t)context ? "prompt" : "max_tokens",
                    "this model's context is %d tokens, and the request needs %lld: %zu in the prompt (with the start "
                    "token) and %d for the completion (max_tokens); shorten the prompt or lower max_tokens", context,
                    (long long)n + r->max_tokens, n, r->max_tokens);
        return -1;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// responses

// a completion, whole (stream false)
static inline void completion_json(StrBuf* b, const char* id, long long created, const char* model, const char* text,
                                   size_t text_len, const char* finish_reason, int prompt_tokens, int completion_tokens) {
    buf_printf(b, "{\"id\":\"%s\",\"object\":\"text_completion\",\"created\":%lld,\"model\":", id, created);
    buf_put_json(b, model, strlen(model));
    buf_puts(b, ",\"choices\":[{\"text\":");
    buf_put_json(b, text, text_len);
    buf_printf(b, ",\"index\":0,\"logprobs\":null,\"finish_reason\":\"%s\"}],\"usage\":{\"prompt_tokens\":%d,"
               "\"completion_tokens\":%d,\"total_tokens\":%d}}", finish_reason, prompt_tokens, completion_tokens,
               prompt_tokens + completion_tokens);
}

// one server-sent event of a stream: a chunk of text (finish_reason NULL until the last)
static inline void completion_chunk_sse(StrBuf* b, const char* id, long long created, const char* model, const char* text,
                                        size_t text_len, const char* finish_reason) {
    buf_printf(b, "data: {\"id\":\"%s\",\"object\":\"text_completion\",\"created\":%lld,\"model\":", id, created);
    buf_put_json(b, model, strlen(model));
    buf_puts(b, ",\"choices\":[{\"text\":");
    buf_put_json(b, text, text_len);
    buf_puts(b, ",\"index\":0,\"logprobs\":null,\"finish_reason\":");
    if (finish_reason) { buf_printf(b, "\"%s\"", finish_reason); } else { buf_puts(b, "null"); }
    buf_puts(b, "}]}\n\n");
}

// the usage event of a stream with stream_options.include_usage (no choices)
static inline void completion_usage_sse(StrBuf* b, const char* id, long long created, const char* model,
                                        int prompt_tokens, int completion_tokens) {
    buf_printf(b, "data: {\"id\":\"%s\",\"object\":\"text_completion\",\"created\":%lld,\"model\":", id, created);
    buf_put_json(b, model, strlen(model));
    buf_printf(b, ",\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n",
               prompt_tokens, completion_tokens, prompt_tokens + completion_tokens);
}

#endif // LLMC_SERVE_PROTOCOL_H
