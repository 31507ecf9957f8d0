// the JSON reader (llmc/json.h) on any text
#include "fuzz/fuzz.h"
#include "llmc/json.h"

static void fuzz_one(const uint8_t* data, size_t size) {
    JsonValue v;
    json_parse((const char*)data, size, "fuzz input", &v);
    json_get(&v, "model");
    json_free(&v);
}
