// the JSON reader (llmc/json.h) on any text, through json_parse_text: an input it rejects returns
// normally too, so the harness also checks that a rejected text leaves nothing allocated
#include "fuzz/fuzz.h"
#include "llmc/json.h"

static void fuzz_one(const uint8_t* data, size_t size) {
    JsonValue v;
    char err[256];
    if (json_parse_text((const char*)data, size, &v, err, sizeof(err)) != 0) {
        if (strncmp(err, "line ", 5) != 0) { abort(); } // every rejection says where
        return;
    }
    json_get(&v, "model");
    json_free(&v);
}
