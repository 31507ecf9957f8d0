/*
 Tests for the inference server's parts that need no network (llmc/serve/):
 - the text of a completion as tokens come: UTF-8 cut inside characters and
   ill-formed bytes (U+FFFD per maximal subpart), stop strings across tokens,
   and text handed out piece by piece equal to the whole decoded at once;
 - the request parser: every field, its defaults, and one 400 (404 for another
   model) per kind of bad input, each naming the field; the context check;
   the JSON of answers and errors (read back by the JSON reader);
 - the metrics' Prometheus text;
 - the scheduler against a fake model whose next token is a function of the
   sequence's cache: tokens in the right slot and positions through chunked
   prefills and batched decodes, admission order, the chunk budget, max_tokens,
   end-of-text and stop strings, a full queue, cancellation and deadlines
   freeing slots;
 - the engine of llmc/inference.h on the CPU path (tiny random model): a prompt
   prefilled in chunks into any slot, then decoded among other sequences in
   other slots, gives the logits of a one-shot prefill and a lone decode in
   slot 0 bit for bit; and greedy requests through the scheduler give the
   same tokens together as alone (what `infer` gives).
 The HTTP side runs end to end in test/test_serve.sh.
*/
#include <string>
#include <vector>
#include "llmc/inference.h"
#include "llmc/serve/engine.h"
#include "llmc/serve/metrics.h"
#include "llmc/serve/protocol.h"
#include "llmc/serve/scheduler.h"
#include "llmc/serve/text.h"
#include "test/test.h"

// ----------------------------------------------------------------------------
// text

static std::string replaced(const char* s, size_t n) {
    StrBuf b = {};
    utf8_put_replacing(&b, s, n);
    std::string out(b.data ? b.data : "", b.len);
    buf_free(&b);
    return out;
}

static void test_utf8(void) {
    // Unicode's example of maximal subparts (Table 3-8): 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64
    const char in[] = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
    CHECK(replaced(in, sizeof(in) - 1) ==
              "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" "b\xEF\xBF\xBD" "c\xEF\xBF\xBD\xEF\xBF\xBD" "d",
          "maximal subparts: '%s'", replaced(in, sizeof(in) - 1).c_str());
    CHECK(replaced("\xED\xA0\x80", 3) == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", "a surrogate is three subparts");
    CHECK(utf8_complete_end("ab\xE2\x82", 4) == 2, "a cut euro sign is held back");
    CHECK(utf8_complete_end("ab\xE2\x82\xAC", 5) == 5, "a whole euro sign is final");
    CHECK(utf8_complete_end("ab\xE2\x41", 4) == 4, "an ill-formed byte is final");
    CHECK(utf8_complete_end("\xF0\x9F\x98", 3) == 0, "three bytes of four are held back");
    CHECK(utf8_complete_end("\x80\x80\x80", 3) == 3, "stray continuation bytes are final");
    CHECK(utf8_complete_end("", 0) == 0, "nothing");
}

// pushes the tokens (pieces) through a TextOut with these stop strings; returns what was handed out, and the stop flag
static std::string run_text(const std::vector<std::string>& pieces, const std::vector<std::string>& stops, int* stopped,
                            std::vector<std::string>* handed = NULL) {
    TextOut t = {};
    for (const std::string& s : stops) {
        t.stop[t.n_stop] = s.c_str();
        t.stop_len[t.n_stop++] = s.size();
    }
    StrBuf out = {};
    *stopped = 0;
    for (const std::string& p : pieces) {
        size_t before = out.len;
        *stopped = text_push(&t, (const unsigned char*)p.data(), p.size(), &out);
        if (handed) { handed->push_back(std::string(out.data ? out.data + before : "", out.len - before)); }
        if (*stopped) { break; }
    }
    if (!*stopped) { text_finish(&t, &out); }
    std::string s(out.data ? out.data : "", out.len);
    buf_free(&out);
    buf_free(&t.raw);
    return s;
}

static void test_text_out(void) {
    int stopped;
    std::vector<std::string> handed;
    CHECK(run_text({"Hello", " wor", "ld"}, {}, &stopped) == "Hello world" && !stopped, "plain text");
    std::string euro = run_text({"a\xE2", "\x82", "\xAC" "b"}, {}, &stopped, &handed);
    CHECK(euro == "a\xE2\x82\xAC" "b", "a euro sign over three tokens: '%s'", euro.c_str());
    CHECK(handed.size() == 3 && handed[0] == "a" && handed[1] == "" && handed[2] == "\xE2\x82\xAC" "b",
          "the cut character is handed out whole, once complete");
    CHECK(run_text({"x\xE2\x82"}, {}, &stopped) == "x\xEF\xBF\xBD", "a cut character at the end is one U+FFFD");
    CHECK(run_text({"x\xE2\x82", "y"}, {}, &stopped) == "x\xEF\xBF\xBDy", "a character broken by the next token");
    handed.clear();
    std::string s = run_text({"The end", ".\n", "\nmore"}, {"\n\n"}, &stopped, &handed);
    CHECK(s == "The end." && stopped, "a stop string over two tokens cuts before it: '%s'", s.c_str());
    CHECK(handed[0] == "The end" && handed[1] == "." && handed[2] == "", "the start of a stop string is held back");
    CHECK(run_text({"abc", "d"}, {"cd", "b"}, &stopped) == "a" && stopped, "the earliest stop string wins");
    CHECK(run_text({"stop here"}, {"stop"}, &stopped) == "" && stopped, "a stop string at the start: nothing");
    CHECK(run_text({"ab", "c"}, {"cx"}, &stopped) == "abc" && !stopped, "a partial stop string at the end is text");
    CHECK(run_text({"aXX"}, {"XXX"}, &stopped) == "aXX" && !stopped, "held back, then flushed at the end");
    // random bytes and stop strings: the pieces handed out are the whole decoded at once, cut at the first stop
    uint64_t rng = 7;
    int same = 1;
    for (int trial = 0; trial < 2000; trial++) {
        std::vector<std::string> pieces, stops;
        std::string raw;
        const char alphabet[] = {'a', 'b', '\n', '\xC3', '\xA9', '\xE2', '\x82', '\xAC', '\xF0', '\x9F', '\x80', '\xFF'};
        for (int k = 0, n = 1 + (int)rng_below(&rng, 8); k < n; k++) {
            std::string p;
            for (int j = 0, m = (int)rng_below(&rng, 4); j < m; j++) { p += alphabet[rng_below(&rng, sizeof(alphabet))]; }
            pieces.push_back(p);
            raw += p;
        }
        for (int k = 0, n = (int)rng_below(&rng, 3); k < n; k++) {
            const char* choices[] = {"ab", "b\n", "\xC3\xA9", "a", "\n\n", "\xE2\x82\xAC" "a"};
            stops.push_back(choices[rng_below(&rng, 6)]);
        }
        size_t cut = raw.size();
        for (const std::string& st : stops) {
            size_t at = raw.find(st);
            if (at != std::string::npos && at < cut) { cut = at; }
        }
        // (no stop string of these starts before another yet ends after it, so the first found is the earliest)
        std::string want = replaced(raw.data(), cut), got = run_text(pieces, stops, &stopped);
        same &= got == want && stopped == (cut < raw.size());
    }
    CHECK(same, "text handed out piece by piece differs from the whole decoded at once");
}

// ----------------------------------------------------------------------------
// requests

static const RequestLimits limits = {"tiny", 100};

// parses body; returns the status (200 when it is accepted), the error in *e
static int parse(const char* body, CompletionRequest* r, ServeError* e) {
    int rc = completion_request_parse(body, strlen(body), &limits, r, e);
    return rc == 0 ? 200 : e->status;
}

static void expect_bad(const char* body, int status, const char* param, const char* want) {
    CompletionRequest r;
    ServeError e;
    int got = parse(body, &r, &e);
    CHECK(got == status && strcmp(e.param, param) == 0 && strstr(e.message, want) != NULL,
          "%s: got %d param '%s' message '%s', expected %d '%s' '%s'", body, got, e.param, got == 200 ? "" : e.message,
          status, param, want);
    completion_request_free(&r);
}

static void test_requests(void) {
    CompletionRequest r;
    ServeError e;
    CHECK(parse("{\"prompt\": \"hi\"}", &r, &e) == 200, "a bare prompt");
    CHECK(r.max_tokens == 16 && r.temperature == 1.0f && r.top_p == 1.0f && r.top_k == 0 && !r.has_seed && !r.stream &&
              r.n_stop == 0 && r.prompt_len == 2, "OpenAI's defaults");
    completion_request_free(&r);
    const char* full = "{\"model\":\"tiny\",\"prompt\":\"a\\u0000b\",\"max_tokens\":100,\"temperature\":0,\"top_p\":0.5,"
                       "\"top_k\":3,\"seed\":-5,\"stop\":[\"x\",\"yz\"],\"stream\":true,\"stream_options\":"
                       "{\"include_usage\":true},\"n\":1,\"best_of\":null,\"echo\":false,\"logprobs\":null,"
                       "\"suffix\":null,\"frequency_penalty\":0,\"presence_penalty\":0.0,\"logit_bias\":{},\"user\":\"u\"}";
    CHECK(parse(full, &r, &e) == 200, "every field: %s", e.message);
    CHECK(r.max_tokens == 100 && r.temperature == 0 && r.top_p == 0.5f && r.top_k == 3 && r.has_seed &&
              r.seed == (uint64_t)-5 && r.n_stop == 2 && strcmp(r.stop[1], "yz") == 0 && r.stream && r.include_usage &&
              r.prompt_len == 3 && r.prompt[1] == '\0', "every field read");
    completion_request_free(&r);
    CHECK(parse("{\"prompt\":\"x\",\"stop\":\"end\",\"max_tokens\":null,\"seed\":null,\"stream\":false}", &r, &e) == 200 &&
              r.n_stop == 1 && r.max_tokens == 16, "a stop string alone, nulls as defaults");
    completion_request_free(&r);

    expect_bad("{\"prompt\": \"hi\",}", 400, "", "not valid JSON: line 1, column 17: trailing comma");
    expect_bad("", 400, "", "not valid JSON");
    expect_bad("[1]", 400, "", "must be a JSON object, got an array");
    expect_bad("{}", 400, "prompt", "prompt is required");
    expect_bad("{\"prompt\": [\"a\", \"b\"]}", 400, "prompt", "batches and token arrays are not supported");
    expect_bad("{\"prompt\": 5}", 400, "prompt", "got 5");
    expect_bad("{\"prompt\":\"x\",\"max_tokens\":0}", 400, "max_tokens", "an integer from 1 to 100 (this server's limit)");
    expect_bad("{\"prompt\":\"x\",\"max_tokens\":101}", 400, "max_tokens", "got 101");
    expect_bad("{\"prompt\":\"x\",\"max_tokens\":2.5}", 400, "max_tokens", "got 2.5");
    expect_bad("{\"prompt\":\"x\",\"max_tokens\":\"5\"}", 400, "max_tokens", "got a string");
    expect_bad("{\"prompt\":\"x\",\"temperature\":2.5}", 400, "temperature", "a number from 0 to 2");
    expect_bad("{\"prompt\":\"x\",\"temperature\":true}", 400, "temperature", "got true");
    expect_bad("{\"prompt\":\"x\",\"top_p\":0}", 400, "top_p", "in (0, 1]");
    expect_bad("{\"prompt\":\"x\",\"top_k\":-1}", 400, "top_k", "an integer >= 0");
    expect_bad("{\"prompt\":\"x\",\"seed\":1.5}", 400, "seed", "an integer");
    expect_bad("{\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400, "stop", "up to 4");
    expect_bad("{\"prompt\":\"x\",\"stop\":\"\"}", 400, "stop", "a non-empty string");
    expect_bad("{\"prompt\":\"x\",\"stop\":[\"a\", 3]}", 400, "stop", "got 3");
    expect_bad("{\"prompt\":\"x\",\"stream\":\"yes\"}", 400, "stream", "true, false or null");
    expect_bad("{\"prompt\":\"x\",\"stream_options\":{\"include_usage\":true}}", 400, "stream_options", "needs stream true");
    expect_bad("{\"prompt\":\"x\",\"stream\":true,\"stream_options\":{\"x\":1}}", 400, "stream_options", "stream_options.x");
    expect_bad("{\"prompt\":\"x\",\"n\":2}", 400, "n", "n must be 1");
    expect_bad("{\"prompt\":\"x\",\"echo\":true}", 400, "echo", "echo must be false");
    expect_bad("{\"prompt\":\"x\",\"logprobs\":2}", 400, "logprobs", "null (not supported)");
    expect_bad("{\"prompt\":\"x\",\"frequency_penalty\":0.5}", 400, "frequency_penalty", "penalties are not supported");
    expect_bad("{\"prompt\":\"x\",\"logit_bias\":{\"5\":1}}", 400, "logit_bias", "empty");
    expect_bad("{\"prompt\":\"x\",\"temprature\":1}", 400, "temprature", "unknown field 'temprature'");
    expect_bad("{\"prompt\":\"x\",\"prompt\":\"y\"}", 400, "", "appears twice");
    expect_bad("{\"prompt\":\"x\",\"model\\u0000\":\"tiny\"}", 400, "", "NUL");
    expect_bad("{\"prompt\":\"x\",\"model\":\"gpt-4\"}", 404, "model", "'gpt-4' does not exist: this server serves 'tiny'");
    expect_bad("{\"prompt\":\"x\",\"model\":\"tiny\\u0000\"}", 404, "model", "does not exist");

    // the context: the start token and the prompt, then max_tokens
    Tokenizer tok;
    tokenizer_init(&tok, TOKENIZER_DEFAULT_PATH);
    CHECK(parse("{\"prompt\":\" the the the\",\"max_tokens\":4}", &r, &e) == 200, "parsed");
    CHECK(completion_request_encode(&r, &tok, 8, &e) == 0 && r.n_ids == 4 && r.ids[0] == tok.eot_token,
          "3 tokens and the start token, and 4 to come, fit 8");
    completion_request_free(&r);
    CHECK(parse("{\"prompt\":\" the the the\",\"max_tokens\":5}", &r, &e) == 200, "parsed");
    CHECK(completion_request_encode(&r, &tok, 8, &e) != 0 && e.status == 400 && strcmp(e.param, "max_tokens") == 0 &&
              strstr(e.message, "context is 8 tokens, and the request needs 9: 4 in the prompt"), "%s", e.message);
    completion_request_free(&r);
    CHECK(parse("{\"prompt\":\" the the the the the the the the\",\"max_tokens\":1}", &r, &e) == 200, "parsed");
    CHECK(completion_request_encode(&r, &tok, 8, &e) != 0 && strcmp(e.param, "prompt") == 0 &&
              strcmp(e.code, "context_length_exceeded") == 0, "a prompt longer than the context");
    completion_request_free(&r);
    tokenizer_free(&tok);

    // the answers are JSON the reader takes back
    StrBuf b = {};
    serve_error(&e, 400, "invalid_request_error", "invalid_value", "top_p", "top_p must be \"x\"\n");
    serve_error_json(&b, &e);
    JsonValue v;
    char err[256];
    CHECK(json_parse_text(b.data, b.len, &v, err, sizeof(err)) == 0, "error JSON: %s", b.data);
    const JsonValue* inner = json_get(&v, "error");
    CHECK(json_string_is(json_get(inner, "message"), "top_p must be \"x\"\n") &&
              json_string_is(json_get(inner, "param"), "top_p") && json_string_is(json_get(inner, "code"), "invalid_value") &&
              json_string_is(json_get(inner, "type"), "invalid_request_error"), "error fields");
    json_free(&v);
    b.len = 0;
    completion_json(&b, "cmpl-1", 5, "tiny", "a\"\x01", 3, "length", 4, 2);
    CHECK(json_parse_text(b.data, b.len, &v, err, sizeof(err)) == 0, "completion JSON: %s", b.data);
    const JsonValue* choice = &json_get(&v, "choices")->items[0];
    CHECK(json_string_is(json_get(choice, "text"), "a\"\x01") && json_string_is(json_get(choice, "finish_reason"), "length") &&
              json_get(json_get(&v, "usage"), "total_tokens")->integer == 6, "completion fields");
    json_free(&v);
    b.len = 0;
    completion_chunk_sse(&b, "cmpl-1", 5, "tiny", "z", 1, NULL);
    CHECK(strncmp(b.data, "data: {", 7) == 0 && strcmp(b.data + b.len - 2, "\n\n") == 0, "an event");
    CHECK(json_parse_text(b.data + 6, b.len - 8, &v, err, sizeof(err)) == 0 &&
              json_get(&json_get(&v, "choices")->items[0], "finish_reason")->type == JSON_NULL, "chunk JSON: %s", b.data);
    json_free(&v);
    buf_free(&b);
}

static void test_metrics(void) {
    Metrics m;
    metrics_init(&m, 4, 2, 64);
    metrics_request(&m, 200);
    metrics_request(&m, 200);
    metrics_request(&m, 418); // counted as 500
    histogram_add(&m.ttft, 0.003);
    histogram_add(&m.ttft, 100);
    m.fired[1] = 30;
    m.fired_tokens = 10;
    StrBuf b = {};
    metrics_text(&m, &b);
    const char* want[] = {"serve_requests_total{code=\"200\"} 2\n", "serve_requests_total{code=\"500\"} 1\n",
                          "serve_time_to_first_token_seconds_bucket{le=\"0.0025\"} 0\n",
                          "serve_time_to_first_token_seconds_bucket{le=\"0.005\"} 1\n",
                          "serve_time_to_first_token_seconds_bucket{le=\"60\"} 1\n",
                          "serve_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n",
                          "serve_time_to_first_token_seconds_count 2\n", "serve_slots 4\n", "serve_ffn_units 64\n",
                          "serve_ffn_active_units_per_token{layer=\"1\"} 3\n", "# TYPE serve_queue_length gauge\n"};
    for (const char* w : want) { CHECK(strstr(b.data, w) != NULL, "metrics lack '%s'", w); }
    buf_free(&b);
    metrics_free(&m);
}

// ----------------------------------------------------------------------------
// the scheduler against a fake model

// The next token of a sequence is a hash of the tokens in its cache slot up
// to the position just fed, among NEXT_RANGE ids from NEXT_BASE (GPT-2 tokens
// of plain text), or end-of-text once the hash says so and eot_every is set.
struct Fake {
    int slots, context, Vp, eot, eot_every;
    std::vector<int> cache;
    int prefills, decodes, max_batch;
};
static const int NEXT_BASE = 300, NEXT_RANGE = 700;

static int fake_next(const int* seq, int n, int eot, int eot_every) {
    uint64_t h = 1469598103934665603ULL;
    for (int i = 0; i < n; i++) { h = (h ^ (uint64_t)seq[i]) * 1099511628211ULL; }
    if (eot_every && h % (uint64_t)eot_every == 0) { return eot; }
    return NEXT_BASE + (int)(h % NEXT_RANGE);
}

static void fake_logits(Fake* f, int slot, int last, float* logits) {
    memset(logits, 0, (size_t)f->Vp * sizeof(float));
    logits[fake_next(&f->cache[(size_t)slot * f->context], last + 1, f->eot, f->eot_every)] = 10.0f;
}

static void fake_prefill(void* ctx, const int* tokens, const int* lens, const int* slots, const int* starts, int n,
                         float* logits) {
    Fake* f = (Fake*)ctx;
    for (int i = 0, off = 0; i < n; off += lens[i], i++) {
        for (int t = 0; t < lens[i]; t++) { f->cache[(size_t)slots[i] * f->context + starts[i] + t] = tokens[off + t]; }
        fake_logits(f, slots[i], starts[i] + lens[i] - 1, logits + (size_t)i * f->Vp);
    }
    f->prefills++;
}

static void fake_decode(void* ctx, const int* tokens, const int* pos, const int* slots, int B, float* logits,
                        int* best) {
    Fake* f = (Fake*)ctx;
    std::vector<float> row(f->Vp);
    for (int b = 0; b < B; b++) {
        f->cache[(size_t)slots[b] * f->context + pos[b]] = tokens[b];
        fake_logits(f, slots[b], pos[b], row.data());
        best[b] = logits_greedy(row.data(), f->Vp); // (the padding's logits are 0, below the chosen token's)
        if (logits) { memcpy(logits + (size_t)b * f->Vp, row.data(), f->Vp * sizeof(float)); }
    }
    f->decodes++;
    f->max_batch = B > f->max_batch ? B : f->max_batch;
}

// what the fake model says a prompt continues with, alone: the greedy tokens until eot or max_tokens
static std::vector<int> fake_alone(const std::vector<int>& prompt, int max_tokens, int eot, int eot_every) {
    std::vector<int> seq = prompt, out;
    while ((int)out.size() < max_tokens) {
        int t = fake_next(seq.data(), (int)seq.size(), eot, eot_every);
        out.push_back(t);
        if (t == eot) { break; }
        seq.push_back(t);
    }
    return out;
}

// a request for a prompt of token ids (the text is not needed past encoding)
static ServeRequest* fake_request(const std::vector<int>& ids, int max_tokens, double timeout = 100) {
    CompletionRequest p = {};
    p.max_tokens = max_tokens;
    p.temperature = 0;
    p.top_p = 1;
    p.ids = (int*)mallocCheck(ids.size() * sizeof(int));
    memcpy(p.ids, ids.data(), ids.size() * sizeof(int));
    p.n_ids = (int)ids.size();
    return serve_request_new(&p, now_seconds(), now_seconds() + timeout);
}

// the text of tokens as the scheduler hands it out
static std::string text_of(const Tokenizer* tok, const std::vector<int>& tokens) {
    std::string raw;
    for (int t : tokens) {
        if (t == tok->eot_token) { break; }
        size_t len = 0;
        const unsigned char* b = tokenizer_decode(tok, t, &len);
        raw.append((const char*)b, len);
    }
    return replaced(raw.data(), raw.size());
}

static std::string taken(Scheduler* s, ServeRequest* r) {
    StrBuf b = {};
    scheduler_poll(s, r, 0, &b);
    std::string out(b.data ? b.data : "", b.len);
    buf_free(&b);
    return out;
}

static void test_scheduler(void) {
    Tokenizer tok;
    tokenizer_init(&tok, TOKENIZER_DEFAULT_PATH);
    Fake f = {3, 64, 50304, tok.eot_token, 0, std::vector<int>(3 * 64), 0, 0, 0};
    ServeEngine e = {&f, 3, 64, 5, tok.vocab_size, 50304, 1, 8, fake_prefill, fake_decode, NULL};
    Metrics m;
    metrics_init(&m, 3, 1, 8);
    Scheduler s;
    scheduler_init(&s, &e, &tok, &m, 2, 1);

    // 5 requests for 3 slots (2 wait): prompts of 12, 2, 7, 1, 9 tokens, chunks of 5 tokens a step
    uint64_t rng = 3;
    std::vector<std::vector<int>> prompts;
    int lens[5] = {12, 2, 7, 1, 9}, max_tokens[5] = {6, 9, 3, 1, 20};
    ServeRequest* reqs[5];
    ServeError err;
    for (int i = 0; i < 5; i++) {
        std::vector<int> p(lens[i]);
        for (int& t : p) { t = (int)rng_below(&rng, 50000); }
        prompts.push_back(p);
        reqs[i] = fake_request(p, max_tokens[i]);
    }
    CHECK(scheduler_submit(&s, reqs[0], &err) == 0 && scheduler_submit(&s, reqs[1], &err) == 0, "two fill the queue");
    CHECK(scheduler_submit(&s, reqs[2], &err) != 0 && err.status == 429 && strstr(err.message, "the queue is full"),
          "a third finds the queue of 2 full: 429");
    scheduler_step(&s); // admits 0 and 1; chunk: 5 tokens of prompt 0
    CHECK(f.prefills == 1 && reqs[0]->prefilled == 5 && reqs[1]->prefilled == 0 && s.queued == 0,
          "the oldest prompt's chunk first, the whole chunk budget");
    CHECK(scheduler_submit(&s, reqs[2], &err) == 0 && scheduler_submit(&s, reqs[3], &err) == 0, "2 and 3 queued");
    scheduler_step(&s); // admits 2 (the third slot); 3 waits
    CHECK(s.active == 3 && s.queued == 1 && reqs[0]->prefilled == 10 && reqs[1]->completion_tokens == 0,
          "still prompt 0's chunks (%d), 3 waits", reqs[0]->prefilled);
    CHECK(scheduler_submit(&s, reqs[4], &err) == 0, "4 queued");
    while (scheduler_step(&s)) {}
    CHECK(f.max_batch == 3 && s.active == 0 && s.queued == 0, "all ran, 3 at a time (max batch %d)", f.max_batch);
    size_t ends[10];
    int pieces = 0;
    StrBuf first = {};
    scheduler_poll(&s, reqs[1], 0, &first, ends, &pieces);
    int pieces_ok = pieces == 9 && ends[8] == first.len;
    for (int k = 0; k < pieces; k++) {
        size_t len = 0;
        tokenizer_decode(&tok, fake_alone(prompts[1], 9, tok.eot_token, 0)[k], &len);
        pieces_ok &= ends[k] - (k ? ends[k - 1] : 0) == len;
    }
    CHECK(pieces_ok, "a stream's pieces: one a token (%d)", pieces);
    buf_free(&first);
    for (int i = 0; i < 5; i++) {
        std::vector<int> want = fake_alone(prompts[i], max_tokens[i], tok.eot_token, 0);
        std::string got = i == 1 ? text_of(&tok, want) : taken(&s, reqs[i]);
        CHECK(reqs[i]->state == REQ_DONE && got == text_of(&tok, want) && reqs[i]->completion_tokens == max_tokens[i] &&
                  strcmp(reqs[i]->finish_reason, "length") == 0, "request %d: '%s' vs '%s'", i, got.c_str(),
              text_of(&tok, want).c_str());
        scheduler_release(&s, reqs[i]);
    }
    CHECK(m.generated_tokens == 39 && m.ttft.total == 5 && m.tpot.total == 34 && m.prefill_tokens == 31,
          "metrics: %llu tokens, %llu first, %llu between, %llu prefilled", (unsigned long long)m.generated_tokens,
          (unsigned long long)m.ttft.total, (unsigned long long)m.tpot.total, (unsigned long long)m.prefill_tokens);

    // end-of-text ends a request with "stop", and so does a stop string (cut before it)
    f.eot_every = 5;
    std::vector<int> p = {464, 5417}; // "The sea"
    std::vector<int> want = fake_alone(p, 30, tok.eot_token, 5);
    ServeRequest* r = fake_request(p, 30);
    scheduler_submit(&s, r, &err);
    while (scheduler_step(&s)) {}
    CHECK(want.back() == tok.eot_token && strcmp(r->finish_reason, "stop") == 0 &&
              r->completion_tokens == (int)want.size() && taken(&s, r) == text_of(&tok, want), "end-of-text");
    scheduler_release(&s, r);
    f.eot_every = 0;
    want = fake_alone(p, 10, tok.eot_token, 0);
    std::string full = text_of(&tok, want);
    size_t len = 0;
    const unsigned char* third = tokenizer_decode(&tok, want[2], &len);
    std::string stop((const char*)third, len);
    r = fake_request(p, 10);
    r->params.stop[0] = strdup(stop.c_str());
    r->params.stop_len[0] = stop.size();
    r->params.n_stop = 1;
    r->out.stop[0] = r->params.stop[0];
    r->out.stop_len[0] = stop.size();
    r->out.n_stop = 1;
    scheduler_submit(&s, r, &err);
    while (scheduler_step(&s)) {}
    std::string got = taken(&s, r);
    CHECK(strcmp(r->finish_reason, "stop") == 0 && got == full.substr(0, full.find(stop)),
          "a stop string: '%s' (stop '%s' in '%s')", got.c_str(), stop.c_str(), full.c_str());
    scheduler_release(&s, r);

    // a cancelled request leaves its slot at the next step; so does one past its deadline, and a queued one
    ServeRequest* a = fake_request(p, 50);
    ServeRequest* b = fake_request(p, 50, 0.05);
    ServeRequest* c = fake_request(p, 50);
    scheduler_submit(&s, a, &err);
    scheduler_submit(&s, b, &err);
    scheduler_step(&s);
    CHECK(s.active == 2 && a->completion_tokens == 2, "both running");
    scheduler_cancel(&s, a, CANCEL_CLIENT);
    scheduler_submit(&s, c, &err);
    scheduler_cancel(&s, c, CANCEL_CLIENT);
    struct timespec pause = {0, 60 * 1000 * 1000};
    nanosleep(&pause, NULL);
    scheduler_step(&s);
    CHECK(m.cancelled[0] == 2 && m.cancelled[1] == 1, "cancelled: %llu by the client, %llu by the deadline",
          (unsigned long long)m.cancelled[0], (unsigned long long)m.cancelled[1]);
    CHECK(a->state == REQ_DONE && a->finish_reason == NULL && b->state == REQ_DONE && b->cancel == CANCEL_TIMEOUT &&
              c->state == REQ_DONE && s.active == 0 && s.queued == 0 && s.running[0] == NULL && s.running[1] == NULL,
          "cancelled, past the deadline and cancelled while queued: all gone, the slots free (states %d %d %d, b's "
          "cancel %d, %d active, %d queued)", a->state, b->state, c->state, b->cancel, s.active, s.queued);
    scheduler_release(&s, a);
    scheduler_release(&s, b);
    scheduler_release(&s, c);

    // closed: 503
    scheduler_close(&s);
    r = fake_request(p, 1);
    CHECK(scheduler_submit(&s, r, &err) != 0 && err.status == 503, "a closed scheduler answers 503");
    scheduler_release(&s, r);
    scheduler_free(&s);
    metrics_free(&m);
    tokenizer_free(&tok);
}

// ----------------------------------------------------------------------------
// the engine on the CPU path

static GPTConfig serve_test_config(int vocab) {
    GPTConfig c = {vocab, (vocab + 127) / 128 * 128, 2, 64, 4, 2, 128, 64, 10000.0f, 1e-5f, ACT_RELU, 0};
    return c;
}

// Three sequences alone (one slot, the prompt in one prefill, decode steps of
// one row) and together (slots 2, 0, 3 of 4; prefill calls of at most 6
// tokens, chunks of two prompts in one call; after each, a decode step of
// every sequence whose prompt is in, rows in changing order): the same logits
// bit for bit at every step
static void test_engine_slots(void) {
    GPTConfig c = serve_test_config(300);
    GPT<float, float> model;
    gpt_build(&model, &c, DEVICE_CPU);
    init_params_random(model.params, &c, 11);
    const int Vp = c.padded_vocab_size, lens[3] = {19, 3, 11}, slots[3] = {2, 0, 3}, steps = 6;
    uint64_t rng = 12;
    std::vector<int> prompt[3], next[3];
    for (int i = 0; i < 3; i++) {
        for (int t = 0; t < lens[i]; t++) { prompt[i].push_back((int)rng_below(&rng, c.vocab_size)); }
        for (int t = 0; t < steps; t++) { next[i].push_back((int)rng_below(&rng, c.vocab_size)); }
    }
    std::vector<float> alone[3]; // [1 + steps][Vp]: after the prompt, after each step
    InferState<float> one;
    infer_state_alloc(&one, &model, 1, 19, c.max_seq_len);
    std::vector<float> logits(4 * (size_t)Vp);
    for (int i = 0; i < 3; i++) {
        gpt_prefill(&model, &one, prompt[i].data(), &lens[i], 1, logits.data());
        alone[i].insert(alone[i].end(), logits.begin(), logits.begin() + Vp);
        for (int t = 0; t < steps; t++) {
            int pos = lens[i] + t;
            gpt_decode(&model, &one, &next[i][t], &pos, 1, logits.data());
            alone[i].insert(alone[i].end(), logits.begin(), logits.begin() + Vp);
        }
    }
    InferState<float> four;
    infer_state_alloc(&four, &model, 4, 6, c.max_seq_len);
    int prefilled[3] = {0, 0, 0}, taken[3] = {0, 0, 0}, compared = 0, same = 1, round = 0;
    while (taken[0] < steps || taken[1] < steps || taken[2] < steps) {
        std::vector<int> toks, clens, cslots, cstarts, cseq;
        int budget = 6;
        for (int i = 0; i < 3 && budget > 0; i++) {
            int n = std::min(lens[i] - prefilled[i], budget);
            if (n == 0) { continue; }
            toks.insert(toks.end(), prompt[i].begin() + prefilled[i], prompt[i].begin() + prefilled[i] + n);
            clens.push_back(n);
            cslots.push_back(slots[i]);
            cstarts.push_back(prefilled[i]);
            cseq.push_back(i);
            budget -= n;
        }
        if (!clens.empty()) {
            gpt_prefill_chunks(&model, &four, toks.data(), clens.data(), cslots.data(), cstarts.data(), (int)clens.size(),
                               logits.data());
            for (size_t k = 0; k < clens.size(); k++) {
                int i = cseq[k];
                prefilled[i] += clens[k];
                if (prefilled[i] == lens[i]) {
                    same &= memcmp(logits.data() + k * Vp, alone[i].data(), Vp * sizeof(float)) == 0;
                    compared++;
                }
            }
        }
        std::vector<int> rows, dtok, dpos, dslot;
        for (int k = 0; k < 3; k++) {
            int i = (k + round) % 3; // the rows' order changes from step to step
            if (prefilled[i] < lens[i] || taken[i] == steps) { continue; }
            rows.push_back(i);
            dtok.push_back(next[i][taken[i]]);
            dpos.push_back(lens[i] + taken[i]);
            dslot.push_back(slots[i]);
        }
        if (!rows.empty()) {
            gpt_decode_slots(&model, &four, dtok.data(), dpos.data(), dslot.data(), (int)rows.size(), logits.data(),
                             (int*)NULL);
            for (size_t b = 0; b < rows.size(); b++) {
                int i = rows[b];
                same &= memcmp(logits.data() + b * Vp, alone[i].data() + (size_t)(1 + taken[i]) * Vp, Vp * sizeof(float)) == 0;
                taken[i]++;
                compared++;
            }
        }
        round++;
    }
    CHECK(same && compared == 3 * (1 + steps), "chunked prefills and decodes in slots 2, 0, 3 differ from one-shot "
          "prefills and lone decodes in slot 0 (%d logits rows compared)", compared);
    infer_state_free(&one, &model);
    infer_state_free(&four, &model);
    gpt_free(&model);
}

// greedy tokens of ids alone, as infer makes them: one prefill, then decode steps of one row
static std::vector<int> greedy_alone(GPT<float, float>* model, const int* ids, int n, int max_tokens, int eot) {
    const int Vp = model->config.padded_vocab_size, V = model->config.vocab_size;
    InferState<float> s;
    infer_state_alloc(&s, model, 1, n, model->config.max_seq_len);
    std::vector<float> logits(Vp);
    std::vector<int> out;
    SamplerConfig greedy = {0.0f, 0, 1.0f};
    uint64_t rng = 0;
    gpt_prefill(model, &s, ids, &n, 1, logits.data());
    for (int pos = n;; pos++) {
        int t = sample_token(logits.data(), V, &greedy, &rng, (ProbIndex*)NULL);
        out.push_back(t);
        if (t == eot || (int)out.size() == max_tokens) { break; }
        gpt_decode(model, &s, &t, &pos, 1, logits.data());
    }
    infer_state_free(&s, model);
    return out;
}

// Greedy requests through the scheduler and the engine, 3 slots, prefill chunks
// of 8 tokens (the long prompts take several steps): each one's text and token
// count as alone; the fired units counted over the decoded tokens
static void test_scheduler_model(void) {
    Tokenizer tok;
    tokenizer_init(&tok, TOKENIZER_DEFAULT_PATH);
    GPTConfig c = serve_test_config(tok.vocab_size);
    GPT<float, float> model;
    gpt_build(&model, &c, DEVICE_CPU);
    init_params_random(model.params, &c, 21);
    InferState<float> state;
    infer_state_alloc(&state, &model, 3, 8, c.max_seq_len);
    ServeModel<float, float> sm = {&model, &state};
    ServeEngine e = serve_engine(&sm);
    Metrics m;
    metrics_init(&m, e.slots, c.num_layers, c.hidden);
    Scheduler s;
    scheduler_init(&s, &e, &tok, &m, 8, 1);
    const char* prompts[] = {"The sea", "It is a truth universally acknowledged, that a single man in possession",
                             "x", "Once upon a time there was", "1 2 3 4 5 6 7 8 9 10 11 12", "Hello"};
    const int n = 6;
    ServeRequest* reqs[n];
    const RequestLimits lim = {"tiny", 40};
    for (int i = 0; i < n; i++) {
        char body[256];
        snprintf(body, sizeof(body), "{\"prompt\": \"%s\", \"max_tokens\": %d, \"temperature\": 0}", prompts[i], 10 + 3 * i);
        CompletionRequest p;
        ServeError err;
        CHECK(completion_request_parse(body, strlen(body), &lim, &p, &err) == 0 &&
              completion_request_encode(&p, &tok, e.context, &err) == 0, "request %d: %s", i, err.message);
        reqs[i] = serve_request_new(&p, now_seconds(), now_seconds() + 100);
        CHECK(scheduler_submit(&s, reqs[i], &err) == 0, "submit %d", i);
    }
    while (scheduler_step(&s)) {}
    for (int i = 0; i < n; i++) {
        ServeRequest* r = reqs[i];
        std::vector<int> want = greedy_alone(&model, r->params.ids, r->params.n_ids, r->params.max_tokens, tok.eot_token);
        std::string got = taken(&s, r);
        const char* finish = want.back() == tok.eot_token ? "stop" : "length";
        CHECK(got == text_of(&tok, want) && r->completion_tokens == (int)want.size() && strcmp(r->finish_reason, finish) == 0,
              "request %d (%d prompt tokens): '%s' (%d tokens, %s) vs alone '%s' (%zu tokens, %s)", i, r->params.n_ids,
              got.c_str(), r->completion_tokens, r->finish_reason, text_of(&tok, want).c_str(), want.size(), finish);
        scheduler_release(&s, r);
    }
    CHECK(m.fired_tokens == m.decode_rows && m.fired[0] > 0 && m.fired[1] > 0,
          "fired units counted over %llu of %llu decoded rows", (unsigned long long)m.fired_tokens,
          (unsigned long long)m.decode_rows);
    scheduler_free(&s);
    metrics_free(&m);
    infer_state_free(&state, &model);
    gpt_free(&model);
    tokenizer_free(&tok);
}

int main(void) {
    test_utf8();
    test_text_out();
    test_requests();
    test_metrics();
    test_scheduler();
    test_engine_slots();
    test_scheduler_model();
    return test_summary("test_serve");
}
