// the server's request parser (llmc/serve/protocol.h) on any body: accepted or refused with an error
// that names what is wrong, nothing left allocated either way; an accepted request's fields in range
#include "fuzz/fuzz.h"
#include "llmc/serve/protocol.h"

static void fuzz_one(const uint8_t* data, size_t size) {
    const RequestLimits lim = {"model_00000001", 64};
    CompletionRequest r;
    ServeError e;
    if (completion_request_parse((const char*)data, size, &lim, &r, &e) != 0) {
        if ((e.status != 400 && e.status != 404) || e.message[0] == '\0') { abort(); }
        completion_request_free(&r);
        return;
    }
    if (r.prompt == NULL || r.max_tokens < 1 || r.max_tokens > lim.max_tokens || !(r.temperature >= 0 && r.temperature <= 2) ||
        !(r.top_p > 0 && r.top_p <= 1) || r.top_k < 0 || r.n_stop < 0 || r.n_stop > TEXT_MAX_STOP) {
        abort();
    }
    StrBuf b = {}; // the answers' JSON writers on what the request holds
    completion_json(&b, "cmpl-1", 0, lim.model_id, r.prompt, r.prompt_len, "length", 1, r.max_tokens);
    for (int i = 0; i < r.n_stop; i++) { buf_put_json(&b, r.stop[i], r.stop_len[i]); }
    buf_free(&b);
    completion_request_free(&r);
}
