/*
 Tests the Hugging Face checkpoint converter (tools/hf_convert.cpp, included here) and what it is built on:
 - llmc/json.h: valid documents, and a one-line error naming the file, line and column for each
   kind of malformed one;
 - llmc/safetensors.h: BF16 and F16 conversions over all 65536 values and at rounding boundaries,
   write/read round trips (transposed tensors too), a one-line error for each malformed file;
 - the tokenizer.json loader of llmc/tokenizer.h: three small tokenizers built here (GPT-2's regex
   with every byte; SmolLM2's Digits pre-tokenizer with most bytes missing; Llama-3's Split with
   ignore_merges) encode strings to the ids that Hugging Face's tokenizers 0.22.2 (the Rust library,
   run through its npm build @anush008/tokenizers) gave for them; the r50k rank file written as a
   tokenizer.json encodes like the rank file; a one-line error for each malformed or unsupported file;
 - the converter: random checkpoints written by our own code (ReLU with a tied head, SiLU with an
   untied lm_head as Llama has) are exported and checked tensor by tensor against our layout,
   imported back bit for bit (from F32, BF16 and F16, one file or shards), config.json variants
   (SparseLM's, transformers 5's rope_parameters, HF's default hidden_act) and SakanaAI's other FFN
   tensor layouts are read, and each unsupported field, missing, misshapen or extra tensor, and bad
   flag is a one-line error naming it.
 Run from the repository root.
*/
#include <fcntl.h>

#define HF_CONVERT_NO_MAIN
#include "tools/hf_convert.cpp"
#include "llmc/rng.h"
#include "test/test.h"

// ----------------------------------------------------------------------------
// helpers

static void write_text(const char* path, const char* text) {
    FILE* fp = fopenCheck(path, "wb");
    fwriteCheck(text, 1, strlen(text), fp);
    fcloseCheck(fp);
}

static char* read_text(const char* path, size_t* len) {
    FILE* fp = fopenCheck(path, "rb");
    long size = file_size(fp);
    char* buf = (char*)mallocCheck((size_t)size + 1);
    freadCheck(buf, 1, (size_t)size, fp);
    fcloseCheck(fp);
    buf[size] = '\0';
    if (len) { *len = (size_t)size; }
    return buf;
}

// s with the first occurrence of from replaced by to (malloc'd); the test fails if there is none
static char* replace_once(const char* s, const char* from, const char* to) {
    const char* at = strstr(s, from);
    CHECK(at != NULL, "fixture lacks \"%s\"", from);
    if (at == NULL) { at = s + strlen(s); from = ""; }
    size_t head = (size_t)(at - s), n = strlen(s) - strlen(from) + strlen(to);
    char* out = (char*)mallocCheck(n + 1);
    memcpy(out, s, head);
    memcpy(out + head, to, strlen(to));
    strcpy(out + head + strlen(to), at + strlen(from));
    return out;
}

// runs fn(arg) in a child and checks for exit status 1 and one line "error: ..." that holds want
// (and want2, if given)
static void expect_error2(void (*fn)(const void*), const void* arg, const char* want, const char* want2, const char* what) {
    char msg[8192];
    int status = run_child(fn, arg, msg, sizeof(msg));
    size_t len = strlen(msg);
    int one_line = len > 0 && msg[len - 1] == '\n' && memchr(msg, '\n', len - 1) == NULL;
    int ok = status == 1 && one_line && strncmp(msg, "error: ", 7) == 0 && strstr(msg, want) != NULL &&
             (want2 == NULL || strstr(msg, want2) != NULL);
    CHECK(ok, "%s: expected one line with \"%s\"%s%s, got (exit %d): %s", what, want, want2 ? " and " : "", want2 ? want2 : "",
          status, msg);
}

static void expect_error(void (*fn)(const void*), const void* arg, const char* want, const char* what) {
    expect_error2(fn, arg, want, NULL, what);
}

// a child that exits through fatal() leaves what it allocated behind on purpose: with the sanitizers,
// tell LeakSanitizer that these are not leaks (the tests of success paths keep leak checking)
extern "C" void __lsan_disable(void) __attribute__((weak));

static void child_start(void) {
    if (__lsan_disable) { __lsan_disable(); }
}

static void child_json(const void* arg) {
    child_start();
    JsonValue v;
    json_parse_file((const char*)arg, &v);
    json_free(&v);
}

static void child_safetensors(const void* arg) {
    child_start();
    SafeTensors st;
    safetensors_open(&st, (const char*)arg);
    float buf[64];
    for (int k = 0; k < st.n; k++) {
        if (st.tensors[k].end - st.tensors[k].begin <= sizeof(buf)) { safetensors_read(&st, &st.tensors[k], buf); }
    }
    safetensors_close(&st);
}

static void child_tokenizer(const void* arg) {
    child_start();
    Tokenizer t;
    tokenizer_init_json(&t, (const char*)arg);
    tokenizer_free(&t);
}

// hf_convert_main with these arguments (NULL-terminated, without the program name)
static void run_convert(const char* const* args) {
    char* argv[32] = {(char*)"hf_convert"};
    int argc = 1;
    for (; args[argc - 1] != NULL; argc++) { argv[argc] = (char*)args[argc - 1]; }
    hf_convert_main(argc, argv);
}

static void child_convert(const void* arg) {
    child_start();
    run_convert((const char* const*)arg);
}

// runs hf_convert with these arguments in this process; its stdout goes to out (if given)
static void convert(const char* const* args, char* out, size_t outlen) {
    const Path log = tmp_path("convert_stdout.txt");
    fflush(stdout);
    int saved = dup(STDOUT_FILENO);
    int fd = open(log.s, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, STDOUT_FILENO);
    close(fd);
    run_convert(args);
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    char* text = read_text(log.s, NULL);
    if (out) { snprintf(out, outlen, "%s", text); }
    free(text);
}

// ----------------------------------------------------------------------------
// JSON

static void test_json_valid(void) {
    const char* text = " {\"a\": [1, -2.5e3, true, false, null, \"x\\u00e9\\ud83d\\ude00\\n\\u0000y\\/\", {\"b\": {}}, []],\n"
                       "  \"big\": 9223372036854775807, \"huge\": 18446744073709551616, \"neg\": -0, \"\xc3\xa9\": \"\xe2\x82\xac\"} ";
    JsonValue v;
    json_parse(text, strlen(text), "valid.json", &v);
    CHECK(v.type == JSON_OBJECT && v.length == 5, "top level: type %d, %zu members", v.type, v.length);
    const JsonValue* a = json_get(&v, "a");
    CHECK(a && a->type == JSON_ARRAY && a->length == 8, "array a");
    if (a && a->type == JSON_ARRAY && a->length == 8) {
        CHECK(a->items[0].is_integer && a->items[0].integer == 1, "1 is an integer");
        CHECK(!a->items[1].is_integer && a->items[1].number == -2500.0, "-2.5e3 is %g", a->items[1].number);
        CHECK(a->items[2].type == JSON_TRUE && a->items[3].type == JSON_FALSE && a->items[4].type == JSON_NULL, "literals");
        const char want[] = "x\xc3\xa9\xf0\x9f\x98\x80\n\0y/";
        CHECK(a->items[5].length == sizeof(want) - 1 && memcmp(a->items[5].string, want, sizeof(want) - 1) == 0,
              "escapes and surrogate pairs decode to UTF-8 (%zu bytes)", a->items[5].length);
        CHECK(a->items[6].type == JSON_OBJECT && json_get(&a->items[6], "b") && json_get(&a->items[6], "b")->length == 0, "nested");
        CHECK(a->items[7].type == JSON_ARRAY && a->items[7].length == 0, "empty array");
    }
    const JsonValue* big = json_get(&v, "big");
    CHECK(big && big->is_integer && big->integer == INT64_MAX, "int64 max is exact");
    const JsonValue* huge = json_get(&v, "huge");
    CHECK(huge && !huge->is_integer && huge->number == 18446744073709551616.0, "past int64: a double");
    CHECK(json_get(&v, "neg") && json_get(&v, "neg")->is_integer && json_get(&v, "neg")->integer == 0, "-0");
    CHECK(json_string_is(json_get(&v, "\xc3\xa9"), "\xe2\x82\xac"), "UTF-8 keys and values");
    CHECK(json_get(&v, "missing") == NULL && json_get(a, "a") == NULL, "json_get misses");
    json_free(&v);

    // numbers of any length (RFC 8259 sets no limit)
    char digits[400] = "[0.";
    memset(digits + 3, '3', 300);
    strcpy(digits + 303, "e-2, 1");
    memset(digits + 309, '0', 80);
    strcpy(digits + 389, "]");
    json_parse(digits, strlen(digits), "long.json", &v);
    CHECK(v.type == JSON_ARRAY && v.length == 2 && fabs(v.items[0].number - 1.0 / 300) < 1e-18 &&
          v.items[1].number == 1e80 && !v.items[1].is_integer, "numbers of 306 and 81 characters");
    json_free(&v);

    // json_write_string round trip
    const Path p = tmp_path("write.json");
    FILE* fp = fopenCheck(p.s, "wb");
    const char s[] = "q\"b\\s\n\t\r\x01\x1f\xc3\xa9";
    json_write_string(fp, s, sizeof(s) - 1);
    fcloseCheck(fp);
    json_parse_file(p.s, &v);
    CHECK(v.type == JSON_STRING && v.length == sizeof(s) - 1 && memcmp(v.string, s, v.length) == 0, "json_write_string round trip");
    json_free(&v);
}

static void test_json_errors(void) {
    char deep[1200];
    memset(deep, '[', 600);
    deep[600] = '\0';
    struct { const char* text; const char* want; } cases[] = {
        {"", "line 1, column 1: unexpected end of the text"},
        {"[1,]", "line 1, column 4: trailing comma"},
        {"{\"a\":1,}", "trailing comma"},
        {"// c\n{}", "line 1, column 1: unexpected character"},
        {"{'a':1}", "expected a string key"},
        {"[01]", "leading zero in a number"},
        {"[NaN]", "unexpected character"},
        {"[-Infinity]", "a number needs digits"},
        {"[1.]", "a fraction needs digits"},
        {"[1e]", "an exponent needs digits"},
        {"[1e999]", "number out of range"},
        {"[\"abc]", "unterminated string"},
        {"[\"a\tb\"]", "control character in a string"},
        {"[\"\xff\"]", "invalid UTF-8 in a string"},
        {"[\"\xc0\xaf\"]", "invalid UTF-8 in a string"},
        {"[\"\xed\xa0\x80\"]", "invalid UTF-8 in a string"},
        {"[\"\\x\"]", "unknown escape in a string"},
        {"[\"\\u12G4\"]", "\\u needs 4 hex digits"},
        {"[\"\\udc00\"]", "unpaired UTF-16 low surrogate"},
        {"[\"\\ud800x\"]", "unpaired UTF-16 high surrogate"},
        {"[\"\\ud800\\u0041\"]", "unpaired UTF-16 high surrogate"},
        {"{\"a\":1,\"b\":2,\"a\":3}", "key \"a\" appears twice in this object"},
        {"{\"a\\u0000b\":1,\"a\\u0000b\":2}", "key \"a\\u0000b\" appears twice in this object"},
        {"{} x", "line 1, column 4: text after the value"},
        {"[tru]", "unexpected character"},
        {"{\"a\" 1}", "expected ':' after a key"},
        {"[1 2]", "expected ',' or ']'"},
        {"{\"a\":1 \"b\":2}", "expected ',' or '}'"},
        {"{\n  \"a\": [1,\n  2,]\n}", "line 3, column 5: trailing comma"},
        {deep, "nested too deeply"},
    };
    const Path p = tmp_path("bad.json");
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        write_text(p.s, cases[k].text);
        char prefix[256], what[64];
        snprintf(prefix, sizeof(prefix), "%s: invalid JSON at line ", p.s);
        snprintf(what, sizeof(what), "JSON case %zu", k);
        expect_error2(child_json, p.s, prefix, cases[k].want, what);
    }
    expect_error(child_json, "/nonexistent/x.json", "cannot open /nonexistent/x.json", "missing JSON file");
}

// ----------------------------------------------------------------------------
// safetensors

static void test_half_conversions(void) {
    int bad_bf16 = 0, bad_f16 = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        bad_bf16 += float_to_bf16(bf16_to_float((uint16_t)h)) != h;
        bad_f16 += float_to_f16(f16_to_float((uint16_t)h)) != h;
    }
    CHECK(bad_bf16 == 0, "%d bf16 values do not survive bf16 -> f32 -> bf16", bad_bf16);
    CHECK(bad_f16 == 0, "%d f16 values do not survive f16 -> f32 -> f16", bad_f16);
    // a few f16 values against their known meaning
    CHECK(f16_to_float(0x3C00) == 1.0f && f16_to_float(0xC000) == -2.0f && f16_to_float(0x7BFF) == 65504.0f, "f16 normals");
    CHECK(f16_to_float(0x0001) == ldexpf(1.0f, -24) && f16_to_float(0x0200) == ldexpf(1.0f, -15), "f16 subnormals");
    CHECK(isinf(f16_to_float(0x7C00)) && isnan(f16_to_float(0x7E00)), "f16 inf and nan");
    // rounding to nearest even
    CHECK(float_to_bf16(1.0f + ldexpf(1.0f, -8)) == 0x3F80, "bf16: halfway rounds to even (down)");
    CHECK(float_to_bf16(1.0f + 3 * ldexpf(1.0f, -8)) == 0x3F82, "bf16: halfway rounds to even (up)");
    CHECK(float_to_bf16(1.0f + ldexpf(1.0f, -8) + ldexpf(1.0f, -20)) == 0x3F81, "bf16: above halfway rounds up");
    CHECK(float_to_bf16(3.4e38f) == 0x7F80 && float_to_bf16(-INFINITY) == 0xFF80, "bf16 overflow to inf");
    CHECK((float_to_bf16(NAN) & 0x7FC0) == 0x7FC0, "bf16 NaN stays NaN");
    CHECK(float_to_f16(65519.0f) == 0x7BFF && float_to_f16(65520.0f) == 0x7C00, "f16: 65519 -> 65504, 65520 -> inf");
    CHECK(float_to_f16(1.0f + ldexpf(1.0f, -11)) == 0x3C00 && float_to_f16(1.0f + 3 * ldexpf(1.0f, -11)) == 0x3C02, "f16 ties to even");
    CHECK(float_to_f16(ldexpf(1.0f, -25)) == 0x0000 && float_to_f16(ldexpf(1.5f, -25)) == 0x0001, "f16: half the smallest subnormal");
    CHECK(float_to_f16(ldexpf(1.0f, -14) - ldexpf(1.0f, -26)) == 0x0400, "f16: subnormal rounds up to the smallest normal");
    CHECK(float_to_f16(-0.0f) == 0x8000 && float_to_f16(ldexpf(1.0f, -30)) == 0, "f16 zeros");
    CHECK((float_to_f16(NAN) & 0x7E00) == 0x7E00, "f16 NaN stays NaN");
}

static void test_safetensors_roundtrip(void) {
    float a[6] = {1.5f, -2.0f, 0.25f, 3.0f, -0.0f, 1e-3f}; // [2, 3]
    float b[3] = {7.0f, 8.0f, 9.0f};
    SafeTensorOut outs[3] = {
        {"a", 2, {2, 3}, a, 0},
        {"b.weight", 1, {3}, b, 0},
        {"a_t", 2, {3, 2}, a, 1}, // the transpose of a
    };
    SafeDtype dtypes[3] = {ST_F32, ST_BF16, ST_F16};
    for (int d = 0; d < 3; d++) {
        const Path p = tmp_path("rt.safetensors");
        safetensors_write(p.s, outs, 3, dtypes[d]);
        SafeTensors st;
        safetensors_open(&st, p.s);
        CHECK(st.n == 3 && st.data_start % 8 == 0, "dtype %d: %d tensors, data at %llu", d, st.n, (unsigned long long)st.data_start);
        const SafeTensor* ta = safetensors_find(&st, "a");
        const SafeTensor* tt = safetensors_find(&st, "a_t");
        const SafeTensor* tb = safetensors_find(&st, "b.weight");
        CHECK(ta && tt && tb && safetensors_find(&st, "c") == NULL, "names");
        if (ta && tt && tb) {
            CHECK(ta->dtype == dtypes[d] && ta->ndim == 2 && ta->shape[0] == 2 && ta->shape[1] == 3, "a's header");
            CHECK(tt->ndim == 2 && tt->shape[0] == 3 && tt->shape[1] == 2 && tb->ndim == 1 && tb->shape[0] == 3, "shapes");
            float ra[6], rt[6], rb[3];
            safetensors_read(&st, ta, ra);
            safetensors_read(&st, tt, rt);
            safetensors_read(&st, tb, rb);
            int same = memcmp(rb, b, sizeof(b)) == 0, trans = 1;
            for (int i = 0; i < 6; i++) {
                float want = dtypes[d] == ST_F32 ? a[i] : dtypes[d] == ST_BF16 ? bf16_to_float(float_to_bf16(a[i]))
                                                                              : f16_to_float(float_to_f16(a[i]));
                same &= memcmp(&ra[i], &want, 4) == 0;
            }
            for (int i = 0; i < 3; i++) {
                for (int j = 0; j < 2; j++) { trans &= memcmp(&rt[i * 2 + j], &ra[j * 3 + i], 4) == 0; }
            }
            CHECK(same, "dtype %d: values come back (rounded to the dtype)", d);
            CHECK(trans, "dtype %d: the transposed tensor is the transpose", d);
        }
        safetensors_close(&st);
        // the header is JSON with the metadata transformers wants
        size_t len = 0;
        char* raw = read_text(p.s, &len);
        uint64_t n = 0;
        for (int k = 7; k >= 0; k--) { n = (n << 8) | (unsigned char)raw[k]; }
        JsonValue h;
        json_parse(raw + 8, (size_t)n, "header", &h);
        CHECK(json_string_is(json_get(json_get(&h, "__metadata__"), "format"), "pt"), "__metadata__ format pt");
        json_free(&h);
        free(raw);
    }
}

// writes a safetensors file: the 8-byte length (header_len, or the header's own if -1), the header, data_len zero bytes
static void write_st(const char* path, const char* header, long long header_len, size_t data_len) {
    FILE* fp = fopenCheck(path, "wb");
    uint64_t n = header_len < 0 ? strlen(header) : (uint64_t)header_len;
    unsigned char len8[8];
    for (int k = 0; k < 8; k++) { len8[k] = (unsigned char)(n >> (8 * k)); }
    fwriteCheck(len8, 1, 8, fp);
    fwriteCheck(header, 1, strlen(header), fp);
    for (size_t k = 0; k < data_len; k++) { fputc(0, fp); }
    fcloseCheck(fp);
}

static void test_safetensors_errors(void) {
    const Path p = tmp_path("bad.safetensors");
    struct { const char* header; long long len; size_t data; const char* want; } cases[] = {
        {"{}", 1000, 0, "the header length 1000 runs past the end of the file"},
        {"[]", -1, 0, "the header does not start with '{'"},
        {"{\"a\":", -1, 0, "invalid JSON at line 1, column 6"},
        {"{\"__metadata__\":[1]}", -1, 0, "__metadata__ is an array, not an object"},
        {"{\"__metadata__\":{\"format\":1}}", -1, 0, "__metadata__ \"format\" is a number, not a string"},
        {"{\"t\":[1]}", -1, 0, "tensor t is an array, not an object"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[2]}}", -1, 8, "tensor t needs exactly the keys dtype, shape and data_offsets"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", -1, 8, "tensor t needs exactly the keys"},
        {"{\"t\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", -1, 8, "tensor t has an unknown dtype Q4"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,8]}}", -1, 8, "tensor t: shape must be an array of non-negative integers"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":\"2\",\"data_offsets\":[0,8]}}", -1, 8, "tensor t: shape must be an array of at most 8 integers"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", -1, 8, "tensor t: data_offsets must be an array of two integers"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,1.5]}}", -1, 8, "tensor t: data_offsets must be non-negative integers"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", -1, 8, "tensor t: data_offsets [0, 16] are outside the 8 bytes of data"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", -1, 4, "tensor t: 4 bytes of data for a F32 tensor of shape [2]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         -1, 12, "tensors a and b overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
         -1, 20, "data bytes 8 to 12 belong to no tensor"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", -1, 12,
         "the tensors end at data byte 8 but the file has 12 bytes of data"},
        {"{\"a\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}", -1, 8, "tensor a is I32; only F32, BF16 and F16"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         -1, 8, "invalid JSON at line 1, column 1: key \"a\" appears twice"},
        // a NUL would cut a name or dtype short: "w\0a" and "w\0b" would both be "w", "F32\0junk" F32; the
        // messages show it escaped, as they show a newline (an error stays one line)
        {"{\"w\\u0000a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"w\\u0000b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         -1, 8, "tensor name \"w\\u0000a\" holds a NUL byte (\\u0000)"},
        {"{\"__metadata__\\u0000\":{}}", -1, 0, "tensor name \"__metadata__\\u0000\" holds a NUL byte"},
        {"{\"t\":{\"dtype\":\"F32\\u0000junk\",\"shape\":[2],\"data_offsets\":[0,8]}}", -1, 8,
         "tensor t has an unknown dtype F32\\u0000junk"},
        {"{\"__metadata__\":{\"a\\u0000b\":1}}", -1, 0, "__metadata__ \"a\\u0000b\" is a number, not a string"},
        {"{\"a\\nb\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,8]}}", -1, 8,
         "tensor a\\nb: shape must be an array of non-negative integers"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        write_st(p.s, cases[k].header, cases[k].len, cases[k].data);
        char want[512], what[64];
        snprintf(want, sizeof(want), "%s: %s", p.s, cases[k].want);
        snprintf(what, sizeof(what), "safetensors case %zu", k);
        expect_error(child_safetensors, p.s, want, what);
    }
    write_text(p.s, "abcde");
    expect_error(child_safetensors, p.s, "5 bytes is too short for a safetensors file", "5-byte file");
    // a file with no tensors at all is valid
    write_st(p.s, "{\"__metadata__\":{}}", -1, 0);
    SafeTensors st;
    safetensors_open(&st, p.s);
    CHECK(st.n == 0, "empty file: %d tensors", st.n);
    safetensors_close(&st);
}

// ----------------------------------------------------------------------------
// tokenizer.json

static const char* const BYTE_LEVEL =
    "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true}";

typedef struct {
    const char* specials;       // added tokens that start the vocabulary (SmolLM2's layout), comma-separated, or NULL
    const char* bytes;          // the bytes that have tokens, in id order; NULL = all 256 in byte order
    const char* const* merges;  // "left right" in the byte-level alphabet, NULL-terminated
    const char* extra;          // one more vocabulary token after the merges' (byte-level), or NULL
    const char* added;          // an added token after the vocabulary, or NULL
    const char* pre_tokenizer;  // JSON
    int arrays;                 // merges as ["left", "right"]
    int ignore_merges;
} TokenizerSpec;

// builds a tokenizer.json as Python's json.dump would from the same lists (see the header)
static char* build_tokenizer(const TokenizerSpec* s) {
    uint32_t chars[256];
    tokenizer_byte_chars(chars);
    char* text = NULL;
    size_t len = 0;
    FILE* fp = open_memstream(&text, &len);
    int id = 0;
    char vocab[1 << 15] = "";
    size_t used = 0;
    char added[1024] = "";
    size_t added_used = 0;
    const char* sp = s->specials;
    while (sp != NULL && *sp) {
        const char* end = strchr(sp, ',');
        size_t n = end ? (size_t)(end - sp) : strlen(sp);
        used += (size_t)snprintf(vocab + used, sizeof(vocab) - used, "%s\"%.*s\":%d", id ? "," : "", (int)n, sp, id);
        added_used += (size_t)snprintf(added + added_used, sizeof(added) - added_used,
                                       "%s{\"id\":%d,\"content\":\"%.*s\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
                                       "\"normalized\":false,\"special\":true}", id ? "," : "", id, (int)n, sp);
        id++;
        sp = end ? end + 1 : NULL;
    }
    int n_bytes = s->bytes ? (int)strlen(s->bytes) : 256;
    for (int k = 0; k < n_bytes; k++) {
        unsigned char b = s->bytes ? (unsigned char)s->bytes[k] : (unsigned char)k;
        char buf[8];
        size_t w = json_put_utf8(buf, 0, chars[b]);
        const char* esc = chars[b] == '"' || chars[b] == '\\' ? "\\" : "";
        used += (size_t)snprintf(vocab + used, sizeof(vocab) - used, "%s\"%s%.*s\":%d", id ? "," : "", esc, (int)w, buf, id);
        id++;
    }
    char merges[1 << 12] = "";
    size_t merges_used = 0;
    for (int k = 0; s->merges[k] != NULL; k++) {
        const char* space = strchr(s->merges[k], ' ');
        int a = (int)(space - s->merges[k]);
        merges_used += (size_t)snprintf(merges + merges_used, sizeof(merges) - merges_used,
                                        s->arrays ? "%s[\"%.*s\",\"%s\"]" : "%s\"%.*s %s\"", k ? "," : "", a, s->merges[k], space + 1);
        char merged[64];
        snprintf(merged, sizeof(merged), "\"%.*s%s\":", a, s->merges[k], space + 1);
        if (strstr(vocab, merged) == NULL) {
            used += (size_t)snprintf(vocab + used, sizeof(vocab) - used, ",%s%d", merged, id++);
        }
    }
    if (s->extra) { used += (size_t)snprintf(vocab + used, sizeof(vocab) - used, ",\"%s\":%d", s->extra, id++); }
    if (s->added) {
        added_used += (size_t)snprintf(added + added_used, sizeof(added) - added_used,
                                       "%s{\"id\":%d,\"content\":\"%s\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
                                       "\"normalized\":false,\"special\":true}", added_used ? "," : "", id, s->added);
    }
    fprintf(fp, "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[%s],\"normalizer\":null,"
                "\"pre_tokenizer\":%s,\"post_processor\":null,"
                "\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,\"use_regex\":true},"
                "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":null,"
                "\"end_of_word_suffix\":null,\"fuse_unk\":false,\"byte_fallback\":false,\"ignore_merges\":%s,"
                "\"vocab\":{%s},\"merges\":[%s]}}",
            added, s->pre_tokenizer, s->ignore_merges ? "true" : "false", vocab, merges);
    fclose(fp);
    return text;
}

// A: every byte (id = byte), GPT-2's regex, merges as strings, <|endoftext|> added after the vocabulary
static const char* const MERGES_A[] = {"\xc4\xa0 t", "h e", "\xc4\xa0t he", "i n", "in g", "b c", "a b", "ab c", "1 2",
                                       "\xc4\xa0 1", "\xc3\x83 \xc2\xa9", "e e", NULL};
// B: SmolLM2's layout: special tokens first, Digits then ByteLevel, only a few bytes, merges as arrays
static const char* const MERGES_B[] = {"a b", "\xc4\xa0 a", "1 2", "\xc4\xa0" "a b", "t h", "th e", "\xc4\xa0 th", NULL};
// C: Llama-3's Split, ignore_merges, a token that no merge makes, <|begin_of_text|>
static const char* const MERGES_C[] = {"x y", "\xc4\xa0 x", NULL};
static const char* const LLAMA3_SPLIT =
    "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|"
    "[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|"
    "\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
    "\"trim_offsets\":true,\"use_regex\":false}]}";

static char* tokenizer_a(void) {
    TokenizerSpec s = {NULL, NULL, MERGES_A, NULL, "<|endoftext|>", BYTE_LEVEL, 0, 0};
    return build_tokenizer(&s);
}

static char* tokenizer_b(void) {
    char pre[256];
    snprintf(pre, sizeof(pre), "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\",\"individual_digits\":true},%s]}", BYTE_LEVEL);
    TokenizerSpec s = {"<|endoftext|>,<|im_start|>", "abcdefghijklmnopqrstuvwxyz0123456789. \n", MERGES_B, NULL, NULL, pre, 1, 0};
    return build_tokenizer(&s);
}

static char* tokenizer_c(int ignore_merges) {
    TokenizerSpec s = {NULL, NULL, MERGES_C, "xyz", "<|begin_of_text|>", LLAMA3_SPLIT, 1, ignore_merges};
    return build_tokenizer(&s);
}

typedef struct { const char* text; int n; int ids[24]; } Expect;

static void check_encodings(const char* name, const char* json, const Expect* cases, size_t n_cases, int eot) {
    const Path p = tmp_path("tok.json");
    write_text(p.s, json);
    Tokenizer t;
    tokenizer_load(&t, p.s);
    CHECK(t.hf_bpe && t.eot_token == eot, "%s: loaded as tokenizer.json, eot %d (want %d)", name, t.eot_token, eot);
    for (size_t k = 0; k < n_cases; k++) {
        int* ids = NULL;
        size_t n = 0, cap = 0;
        tokenizer_encode(&t, cases[k].text, strlen(cases[k].text), &ids, &n, &cap);
        int same = (int)n == cases[k].n && (n == 0 || memcmp(ids, cases[k].ids, n * sizeof(int)) == 0);
        char got[512] = "";
        for (size_t i = 0, used = 0; i < n && used < sizeof(got); i++) {
            used += (size_t)snprintf(got + used, sizeof(got) - used, " %d", ids[i]);
        }
        CHECK(same, "%s: \"%s\" encodes to [%s ], Hugging Face's tokenizers gives %d ids", name, cases[k].text, got, cases[k].n);
        free(ids);
    }
    tokenizer_free(&t);
}

static void test_tokenizer_json_encodings(void) {
    // the ids Hugging Face's tokenizers 0.22.2 gives for the same files (added tokens not split out)
    static const Expect a[] = {
        {"the thing", 5, {116, 257, 256, 104, 260}},
        {"abc", 2, {97, 261}},                  // b c merges first, and (a, bc) is no merge: not "abc"
        {"abcab c", 5, {97, 261, 262, 32, 99}},
        {" 12 123", 5, {32, 264, 32, 264, 51}},
        {"caf\xc3\xa9 \xc3\xa9t\xc3\xa9", 8, {99, 97, 102, 266, 32, 266, 116, 266}},
        {"eee eeee", 5, {267, 101, 32, 267, 267}},
        {"don't stop\n\n  ok", 16, {100, 111, 110, 39, 116, 32, 115, 116, 111, 112, 10, 10, 32, 32, 111, 107}},
    };
    static const Expect b[] = {
        {"ab abc", 4, {41, 39, 41, 4}},
        {"a\xe2\x82\xac" "b", 2, {2, 3}},
        {"a\xc3\xa9" "b", 1, {41}},             // the bytes of é have no tokens: dropped, and a b merge across them
        {"x a\xc3\xa9" "b\xc3\xa9 the\xc3\xa9", 5, {25, 39, 41, 39, 46}},
        {"\xc3\xa9\xc3\xa9", 0, {0}},
        {"12 x 345", 8, {29, 30, 39, 25, 39, 31, 32, 33}}, // every digit alone: 1 2 is never merged
        {"the  theme\tthe", 7, {46, 39, 39, 46, 14, 6, 46}},
        {"Ab.Ab\xc3\xa9\xf0\x9f\x98\x80" "ab", 4, {3, 38, 3, 41}},
        {"", 0, {0}},
    };
    static const Expect c[] = {
        {"xyz xy xyzxyz", 8, {258, 32, 256, 32, 256, 122, 256, 122}},
        {"12345 xyz", 8, {49, 50, 51, 52, 53, 32, 256, 122}},
        {"I'M here\r\n\r\nxyz's", 15, {73, 39, 77, 32, 104, 101, 114, 101, 13, 10, 13, 10, 258, 39, 115}},
    };
    static const Expect c_merging[] = { // the same file without ignore_merges
        {"xyz xy xyzxyz", 9, {256, 122, 32, 256, 32, 256, 122, 256, 122}},
        {"I'M here\r\n\r\nxyz's", 16, {73, 39, 77, 32, 104, 101, 114, 101, 13, 10, 13, 10, 256, 122, 39, 115}},
    };
    char* ja = tokenizer_a();
    char* jb = tokenizer_b();
    char* jc = tokenizer_c(1);
    char* jc0 = tokenizer_c(0);
    check_encodings("A", ja, a, sizeof(a) / sizeof(a[0]), 268);
    check_encodings("B", jb, b, sizeof(b) / sizeof(b[0]), 0);
    check_encodings("C", jc, c, sizeof(c) / sizeof(c[0]), 259);
    check_encodings("C without ignore_merges", jc0, c_merging, sizeof(c_merging) / sizeof(c_merging[0]), 259);

    // decode: the bytes of each token, added tokens as their text; decode(encode(s)) == s with every byte present
    const Path p = tmp_path("tok.json");
    write_text(p.s, ja);
    Tokenizer t;
    tokenizer_init_json(&t, p.s);
    size_t len = 0;
    const unsigned char* bytes = tokenizer_decode(&t, 258, &len);
    CHECK(len == 4 && memcmp(bytes, " the", 4) == 0, "token 258 is \" the\"");
    bytes = tokenizer_decode(&t, 268, &len);
    CHECK(len == 13 && memcmp(bytes, "<|endoftext|>", 13) == 0, "the added token decodes to its text");
    CHECK(t.vocab_size == 269 && t.n_merges == 12 && !t.ignore_merges && t.pattern == TOKENIZER_PATTERN_GPT2, "A's fields");
    const char* s = "The caf\xc3\xa9's 12 thing\n\tabcabc \xf0\x9f\x98\x80 eee!";
    int* ids = NULL;
    size_t n = 0, cap = 0;
    tokenizer_encode(&t, s, strlen(s), &ids, &n, &cap);
    char out[256];
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        bytes = tokenizer_decode(&t, ids[i], &len);
        memcpy(out + used, bytes, len);
        used += len;
    }
    CHECK(used == strlen(s) && memcmp(out, s, used) == 0, "decode(encode(s)) == s");
    free(ids);
    tokenizer_free(&t);
    write_text(p.s, jb);
    tokenizer_init_json(&t, p.s);
    CHECK(t.byte_token['a'] == 2 && t.byte_token['A'] == -1 && t.byte_token[0xC3] == -1 && t.pattern == TOKENIZER_PATTERN_GPT2_DIGITS,
          "B: byte tokens and the digits pattern");
    tokenizer_free(&t);
    free(ja);
    free(jb);
    free(jc);
    free(jc0);
}

// the r50k rank file written as a tokenizer.json reads back as the same tokens and encodes the same
static void test_tokenizer_json_r50k(void) {
    Tokenizer rank, json;
    tokenizer_init(&rank, TOKENIZER_DEFAULT_PATH);
    const Path p = tmp_path("r50k.json");
    tokenizer_write_json(&rank, p.s);
    tokenizer_load(&json, p.s);
    int same_vocab = rank.vocab_size == json.vocab_size && rank.eot_token == json.eot_token;
    for (int id = 0; same_vocab && id < rank.vocab_size; id++) {
        size_t la = 0, lb = 0;
        const unsigned char* a = tokenizer_decode(&rank, id, &la);
        const unsigned char* b = tokenizer_decode(&json, id, &lb);
        same_vocab = la == lb && memcmp(a, b, la) == 0;
    }
    CHECK(same_vocab, "the written tokenizer.json has the rank file's %d tokens", rank.vocab_size);
    CHECK(json.ignore_merges && json.n_merges > 50000, "ignore_merges and %d merges", json.n_merges);
    // every text of the GPT-2 reference vectors, and the corpus's first text file
    size_t size = 0;
    char* vectors = read_text("test/data/tokenizer_vectors.txt", &size);
    int texts = 0, differ = 0;
    for (char* line = strtok(vectors, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        if (strncmp(line, "text ", 5) != 0) { continue; }
        size_t n = strlen(line + 5) / 2;
        char* text = (char*)mallocCheck(n + 1);
        for (size_t k = 0; k < n; k++) {
            unsigned v = 0;
            sscanf(line + 5 + 2 * k, "%2x", &v);
            text[k] = (char)v;
        }
        int *ia = NULL, *ib = NULL;
        size_t na = 0, nb = 0, ca = 0, cb = 0;
        int ra = tokenizer_encode(&rank, text, n, &ia, &na, &ca);
        int rb = tokenizer_encode(&json, text, n, &ib, &nb, &cb);
        differ += ra != rb || na != nb || (na && memcmp(ia, ib, na * sizeof(int)) != 0);
        texts++;
        free(ia);
        free(ib);
        free(text);
    }
    free(vectors);
    CHECK(texts > 10 && differ == 0, "%d of %d reference texts encode differently", differ, texts);
    tokenizer_free(&rank);
    tokenizer_free(&json);
}

static void test_tokenizer_json_errors(void) {
    char* a = tokenizer_a();
    char* b = tokenizer_b();
    const Path p = tmp_path("bad_tok.json");
    struct { const char* base; const char* from; const char* to; const char* want; } cases[] = {
        {"{", NULL, NULL, "invalid JSON at line 1, column 2"},
        {"[]", NULL, NULL, "the top level is an array, not a tokenizer.json object"},
        {"{\"model\":1}", NULL, NULL, "no \"model\" object"},
        {NULL, "\"type\":\"BPE\"", "\"type\":\"WordPiece\"", "model.type is WordPiece: only byte-level BPE is supported"},
        {NULL, "\"type\":\"BPE\"", "\"type\":\"BPE\\u0000x\"", "model.type is BPE\\u0000x: only byte-level BPE is supported"},
        {NULL, "\"dropout\":null", "\"dropout\":0.1", "model.dropout is set: not supported"},
        {NULL, "\"byte_fallback\":false", "\"byte_fallback\":true", "model.byte_fallback is set: not supported"},
        {NULL, "\"continuing_subword_prefix\":null", "\"continuing_subword_prefix\":\"##\"", "model.continuing_subword_prefix is set"},
        {NULL, "\"end_of_word_suffix\":null", "\"end_of_word_suffix\":\"</w>\"", "model.end_of_word_suffix is set"},
        {NULL, "\"ignore_merges\":false", "\"ignore_merges\":\"yes\"", "model.ignore_merges is a string, not true or false"},
        {NULL, "\"normalizer\":null", "\"normalizer\":{\"type\":\"NFC\"}", "normalizer NFC is not supported"},
        {NULL, "\"pre_tokenizer\":{\"type\":\"ByteLevel\"", "\"pre_tokenizer\":{\"type\":\"Whitespace\"", "pre_tokenizer Whitespace is not supported"},
        {NULL, "\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true}", "\"add_prefix_space\":true,\"trim_offsets\":true,\"use_regex\":true}",
         "pre_tokenizer ByteLevel.add_prefix_space is not false"},
        {NULL, "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true}",
         "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\s+\"},"
         "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]}",
         "pre_tokenizer Sequence[Split, ByteLevel] is not supported"},
        {NULL, "\"pre_tokenizer\":{", "\"pre_tokenizer\":null,\"x\":{", "pre_tokenizer null is not supported"},
        {NULL, "\"decoder\":{\"type\":\"ByteLevel\"", "\"decoder\":{\"type\":\"Metaspace\"", "decoder is not ByteLevel"},
        {NULL, "\"vocab\":{", "\"vocab\":[],\"x\":{", "model.vocab is not an object"},
        {NULL, "\"merges\":[", "\"merges\":{},\"x\":[", "model.merges is not an array"},
        {NULL, "\"ee\":267", "\"ee\":300", "no token has id 267 (the ids must run from 0 to 300)"},
        {NULL, "\"ee\":267", "\"ee\":266", "both have id 266"},
        {NULL, "\"ee\":267", "\"ee\":-1", "model.vocab[\"ee\"] is not a token id"},
        {NULL, "\"ee\":267", "\"e\\u0000e\":-1", "model.vocab[\"e\\u0000e\"] is not a token id"},
        {NULL, "\"ee\":267", "\"e e\":267", "token \"e e\" (id 267) has a character outside GPT-2's byte-level alphabet"},
        {NULL, "\"e e\"]", "\"ee\"]", "model.merges[11] is not \"left right\" or [\"left\", \"right\"]"},
        {NULL, "\"e e\"]", "\"e q\"]", "model.merges[11]: \"e\" + \"q\" is not in the vocabulary"},
        {NULL, "\"e e\"]", "\"h e\"]", "model.merges[11] repeats model.merges[1]"},
        {NULL, "\"content\":\"<|endoftext|>\"", "\"content\":\"<|other|>\"", "no <|endoftext|> or <|begin_of_text|> token to start documents with"},
        {NULL, "\"content\":\"<|endoftext|>\"", "\"content\":\"\"", "added_tokens[0].content is not a non-empty string"},
        {NULL, "\"id\":268", "\"id\":\"x\"", "added_tokens[0].id is not a token id"},
        {"B", "[\"a\",\"b\"]", "[\"A\",\"b\"]", "model.merges[0]: \"A\" is not in the vocabulary"},
        {"B", "\"content\":\"<|im_start|>\"", "\"content\":\"<|im_end|>\"", "id 1 is \"<|im_start|>\" in model.vocab but \"<|im_end|>\" in added_tokens"},
        {"B", "\"unk_token\":null", "\"unk_token\":\"a\"", "byte 0x00 has no token and model.unk_token is set: not supported"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        char* text;
        if (cases[k].from == NULL) { text = strdup(cases[k].base); }
        else { text = replace_once(cases[k].base && cases[k].base[0] == 'B' ? b : a, cases[k].from, cases[k].to); }
        write_text(p.s, text);
        free(text);
        char prefix[256], what[64];
        snprintf(prefix, sizeof(prefix), "error: %s: ", p.s);
        snprintf(what, sizeof(what), "tokenizer.json case %zu", k);
        expect_error2(child_tokenizer, p.s, prefix, cases[k].want, what);
    }
    free(a);
    free(b);
}

// ----------------------------------------------------------------------------
// the converter

static GPTConfig tiny_config(int V) {
    GPTConfig c = {V, round_up(V, 128), 2, 32, 4, 2, 48, 64, 10000.0f, 1e-5f, ACT_RELU, 0};
    return c;
}

// random parameters (varied magnitudes, a -0) with zero padded vocab rows; exactly representable in dtype
static float* random_params(const GPTConfig* c, uint64_t seed, SafeDtype dtype) {
    size_t n = num_parameters(c);
    float* p = (float*)mallocCheck(n * sizeof(float));
    uint64_t rng = seed;
    for (size_t k = 0; k < n; k++) {
        float v = ldexpf((float)rng_normal(&rng), (int)(rng_uniform(&rng) * 20) - 14);
        if (dtype == ST_BF16) { v = bf16_to_float(float_to_bf16(v)); }
        if (dtype == ST_F16) { v = f16_to_float(float_to_f16(v)); }
        p[k] = v;
    }
    p[7] = -0.0f;
    size_t off[NUM_PARAM_TENSORS];
    param_offsets(off, c);
    for (size_t k = (size_t)c->vocab_size * c->channels; k < (size_t)c->padded_vocab_size * c->channels; k++) {
        p[off[P_WTE] + k] = 0;
        if (c->untied_head) { p[off[P_LM_HEAD] + k] = 0; }
    }
    return p;
}

// 1 if the model file at path holds exactly these parameters and this config
static int same_checkpoint(const char* path, const GPTConfig* c, const float* params) {
    GPTConfig got;
    float* p = checkpoint_load_model(path, &got, NULL);
    char msg[256];
    int same = !config_mismatch(&got, c, msg, sizeof(msg)) && memcmp(p, params, num_parameters(c) * sizeof(float)) == 0;
    if (config_mismatch(&got, c, msg, sizeof(msg))) { fprintf(stderr, "%s: %s\n", path, msg); }
    free(p);
    return same;
}

// the exported tensors against our layout, worked out here independently of hf_tensors
static void check_exported_tensors(const char* dir, const GPTConfig* c, const float* params) {
    HFPath path = hf_join(dir, "model.safetensors");
    SafeTensors st;
    safetensors_open(&st, path.s);
    int L = c->num_layers, D = c->channels, H = c->hidden, KVD = kv_dim(c), QKV = qkv_dim(c);
    CHECK(st.n == 2 + 9 * L + c->untied_head && (safetensors_find(&st, "lm_head.weight") != NULL) == c->untied_head,
          "%d tensors, lm_head %s", st.n, c->untied_head ? "present" : "absent");
    size_t off[NUM_PARAM_TENSORS];
    param_offsets(off, c);
    float* buf = (float*)mallocCheck((size_t)c->vocab_size * D * sizeof(float));
    int bad = 0;
    // name, rows, cols, the element (i, j) of ours it must equal (l = L + 1: an untied head)
    for (int l = -1; l <= L + c->untied_head; l++) {
        const char* names[9] = {"input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
        int count = (l < 0 || l >= L) ? 1 : 9;
        for (int k = 0; k < count; k++) {
            char name[128];
            int rows, cols;
            if (l < 0) { snprintf(name, sizeof(name), "model.embed_tokens.weight"); rows = c->vocab_size; cols = D; }
            else if (l == L) { snprintf(name, sizeof(name), "model.norm.weight"); rows = D; cols = 0; }
            else if (l == L + 1) { snprintf(name, sizeof(name), "lm_head.weight"); rows = c->vocab_size; cols = D; }
            else {
                snprintf(name, sizeof(name), "model.layers.%d.%s.weight", l, names[k]);
                int shapes[9][2] = {{D, 0}, {D, D}, {KVD, D}, {KVD, D}, {D, D}, {D, 0}, {H, D}, {H, D}, {D, H}};
                rows = shapes[k][0];
                cols = shapes[k][1];
            }
            const SafeTensor* t = safetensors_find(&st, name);
            int shape_ok = t && t->dtype == ST_F32 && t->ndim == (cols ? 2 : 1) && t->shape[0] == rows && (!cols || t->shape[1] == cols);
            CHECK(shape_ok, "exported %s: missing or misshapen", name);
            if (!shape_ok) { continue; }
            safetensors_read(&st, t, buf);
            for (int i = 0; i < rows; i++) {
                for (int j = 0; j < (cols ? cols : 1); j++) {
                    float got = buf[(size_t)i * (cols ? cols : 1) + j], want;
                    if (l < 0) { want = params[off[P_WTE] + (size_t)i * D + j]; }
                    else if (l == L) { want = params[off[P_FINAL_NORM] + i]; }
                    else if (l == L + 1) { want = params[off[P_LM_HEAD] + (size_t)i * D + j]; }
                    else if (k == 0) { want = params[off[P_ATTN_NORM] + (size_t)l * D + i]; }
                    else if (k <= 3) { // q, k, v: consecutive row blocks of wqkv
                        int row = k == 1 ? i : k == 2 ? D + i : D + KVD + i;
                        want = params[off[P_WQKV] + (size_t)l * QKV * D + (size_t)row * D + j];
                    }
                    else if (k == 4) { want = params[off[P_WO] + (size_t)l * D * D + (size_t)i * D + j]; }
                    else if (k == 5) { want = params[off[P_FFN_NORM] + (size_t)l * D + i]; }
                    else if (k == 6) { want = params[off[P_WG] + (size_t)l * H * D + (size_t)i * D + j]; }
                    else if (k == 7) { want = params[off[P_WU] + (size_t)l * H * D + (size_t)i * D + j]; }
                    else { want = params[off[P_WDT] + (size_t)l * H * D + (size_t)j * D + i]; } // down_proj[i][j] = wdT[j][i]
                    bad += memcmp(&got, &want, 4) != 0;
                }
            }
        }
    }
    CHECK(bad == 0, "%d exported values differ from our layout", bad);
    free(buf);
    safetensors_close(&st);

    // config.json
    HFPath cfg_path = hf_join(dir, "config.json");
    JsonValue cfg;
    json_parse_file(cfg_path.s, &cfg);
    CHECK(json_string_is(json_get(&cfg, "model_type"), "llama") &&
          json_string_is(json_get(&cfg, "hidden_act"), activation_names[c->activation]),
          "config: llama with %s", activation_names[c->activation]);
    const JsonValue* tie = json_get(&cfg, "tie_word_embeddings");
    CHECK(tie && tie->type == (c->untied_head ? JSON_FALSE : JSON_TRUE), "config: %s", c->untied_head ? "untied" : "tied");
    const char* ints[] = {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                          "head_dim", "max_position_embeddings", "vocab_size"};
    int want[] = {D, H, L, c->num_heads, c->num_kv_heads, head_size(c), c->max_seq_len, c->vocab_size};
    for (int k = 0; k < 8; k++) {
        const JsonValue* v = json_get(&cfg, ints[k]);
        CHECK(v && v->is_integer && v->integer == want[k], "config: %s", ints[k]);
    }
    const JsonValue* eps = json_get(&cfg, "rms_norm_eps");
    const JsonValue* theta = json_get(&cfg, "rope_theta");
    CHECK(eps && (float)eps->number == c->norm_eps && theta && (float)theta->number == c->rope_theta, "config: eps and theta");
    json_free(&cfg);
}

typedef struct { const char* key; const char* value; } KV; // value NULL: leave the key out

// writes DIR/config.json for c, with these keys replaced, removed or added
static void write_config(const char* dir, const GPTConfig* c, const KV* over, int n_over) {
    const char* keys[12] = {"model_type", "hidden_act", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                            "num_key_value_heads", "max_position_embeddings", "vocab_size", "rms_norm_eps", "rope_theta",
                            "tie_word_embeddings"};
    char vals[12][64];
    snprintf(vals[0], 64, "\"llama\"");
    snprintf(vals[1], 64, "\"%s\"", activation_names[c->activation]);
    snprintf(vals[2], 64, "%d", c->channels);
    snprintf(vals[3], 64, "%d", c->hidden);
    snprintf(vals[4], 64, "%d", c->num_layers);
    snprintf(vals[5], 64, "%d", c->num_heads);
    snprintf(vals[6], 64, "%d", c->num_kv_heads);
    snprintf(vals[7], 64, "%d", c->max_seq_len);
    snprintf(vals[8], 64, "%d", c->vocab_size);
    snprintf(vals[9], 64, "1e-05");
    snprintf(vals[10], 64, "10000.0");
    snprintf(vals[11], 64, "%s", c->untied_head ? "false" : "true");
    char text[4096];
    size_t used = (size_t)snprintf(text, sizeof(text), "{");
    int first = 1;
    for (int k = 0; k < 12; k++) {
        const char* v = vals[k];
        for (int j = 0; j < n_over; j++) {
            if (strcmp(over[j].key, keys[k]) == 0) { v = over[j].value; }
        }
        if (v == NULL) { continue; }
        used += (size_t)snprintf(text + used, sizeof(text) - used, "%s\n  \"%s\": %s", first ? "" : ",", keys[k], v);
        first = 0;
    }
    for (int j = 0; j < n_over; j++) {
        int known = 0;
        for (int k = 0; k < 12; k++) { known |= strcmp(over[j].key, keys[k]) == 0; }
        if (!known && over[j].value) {
            used += (size_t)snprintf(text + used, sizeof(text) - used, ",\n  \"%s\": %s", over[j].key, over[j].value);
        }
    }
    snprintf(text + used, sizeof(text) - used, "\n}\n");
    HFPath path = hf_join(dir, "config.json");
    write_text(path.s, text);
}

// the tensors of a safetensors file, in memory, to rewrite with changes
typedef struct {
    int n;
    char name[64][96];
    SafeTensorOut t[64];
    float* data[64];
} TensorSet;

static void load_set(const char* path, TensorSet* s) {
    SafeTensors st;
    safetensors_open(&st, path);
    s->n = st.n;
    for (int k = 0; k < st.n; k++) {
        size_t numel = 1;
        for (int d = 0; d < st.tensors[k].ndim; d++) { numel *= (size_t)st.tensors[k].shape[d]; }
        s->data[k] = (float*)mallocCheck(numel * sizeof(float));
        safetensors_read(&st, &st.tensors[k], s->data[k]);
        snprintf(s->name[k], sizeof(s->name[k]), "%s", st.tensors[k].name);
        s->t[k].name = s->name[k];
        s->t[k].ndim = st.tensors[k].ndim;
        for (int d = 0; d < st.tensors[k].ndim; d++) { s->t[k].shape[d] = st.tensors[k].shape[d]; }
        s->t[k].data = s->data[k];
        s->t[k].transposed = 0;
    }
    safetensors_close(&st);
}

static int set_find(const TensorSet* s, const char* name) {
    for (int k = 0; k < s->n; k++) {
        if (strcmp(s->name[k], name) == 0) { return k; }
    }
    CHECK(0, "no tensor %s in the set", name);
    return 0;
}

// adds a tensor (data copied from src)
static void set_add(TensorSet* s, const char* name, int ndim, int64_t d0, int64_t d1, const float* src) {
    int k = s->n++;
    size_t numel = (size_t)d0 * (ndim == 2 ? (size_t)d1 : 1);
    s->data[k] = (float*)mallocCheck(numel * sizeof(float));
    memcpy(s->data[k], src, numel * sizeof(float));
    snprintf(s->name[k], sizeof(s->name[k]), "%s", name);
    s->t[k].name = s->name[k];
    s->t[k].ndim = ndim;
    s->t[k].shape[0] = d0;
    s->t[k].shape[1] = d1;
    s->t[k].data = s->data[k];
    s->t[k].transposed = 0;
}

static void set_remove(TensorSet* s, const char* name) {
    int k = set_find(s, name);
    free(s->data[k]);
    for (int j = k; j + 1 < s->n; j++) {
        memcpy(s->name[j], s->name[j + 1], sizeof(s->name[j]));
        s->t[j] = s->t[j + 1];
        s->t[j].name = s->name[j];
        s->data[j] = s->data[j + 1];
    }
    s->n--;
}

static void set_free(TensorSet* s) {
    for (int k = 0; k < s->n; k++) { free(s->data[k]); }
    s->n = 0;
}

// a fresh directory under tmp_dir
static Path fresh_dir(const char* name) {
    Path p = tmp_path(name);
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", p.s);
    if (system(cmd) != 0) { fatal("cannot remove %s", p.s); }
    make_dir(p.s);
    return p;
}

static void test_export_import_roundtrip(void) {
    const char* dtypes[3] = {"f32", "bf16", "f16"};
    SafeDtype st_dtypes[3] = {ST_F32, ST_BF16, ST_F16};
    char* tok_text = tokenizer_a();
    const Path tok = tmp_path("tokenizer.json");
    write_text(tok.s, tok_text);
    free(tok_text);
    // each dtype with a ReLU model and a tied head, then with a SiLU model and an untied head (Llama's)
    for (int k = 0; k < 6; k++) {
        int d = k % 3;
        GPTConfig c = tiny_config(269); // tokenizer A's size, padded to 384
        c.activation = k < 3 ? ACT_RELU : ACT_SILU;
        c.untied_head = k >= 3;
        float* params = random_params(&c, 100 + k, st_dtypes[d]);
        const Path model = tmp_path("model.bin");
        checkpoint_save_model(model.s, &c, params, 12);
        Path hf = fresh_dir("hf"), back = fresh_dir("back"), hf2 = fresh_dir("hf2");
        const char* exp[] = {"--export", model.s, "--tokenizer", tok.s, "--dtype", dtypes[d], "-o", hf.s, NULL};
        convert(exp, NULL, 0);
        if (d == 0) { check_exported_tensors(hf.s, &c, params); }
        const char* model_kind = k < 3 ? "relu, tied" : "silu, untied";
        HFPath tok_out = hf_join(hf.s, "tokenizer.json"), tok_cfg = hf_join(hf.s, "tokenizer_config.json");
        char* a = read_text(tok.s, NULL);
        char* b = read_text(tok_out.s, NULL);
        CHECK(strcmp(a, b) == 0 && hf_exists(tok_cfg.s), "%s, %s: tokenizer.json copied, tokenizer_config.json written",
              dtypes[d], model_kind);
        free(a);
        free(b);
        const char* imp[] = {"--import", hf.s, "-o", back.s, NULL};
        char out[4096];
        convert(imp, out, sizeof(out));
        HFPath back_model = hf_join(back.s, "model.bin"), back_tok = hf_join(back.s, "tokenizer.json");
        CHECK(same_checkpoint(back_model.s, &c, params), "%s, %s: ours -> HF -> ours is bit for bit", dtypes[d], model_kind);
        CHECK(hf_exists(back_tok.s) && strstr(out, "documents start with id 268 <|endoftext|>") != NULL, "%s: import output: %s", dtypes[d], out);
        CHECK(strstr(out, k < 3 ? "hidden_act relu" : "hidden_act silu") != NULL &&
              strstr(out, k < 3 ? ", tied head" : ", untied head") != NULL, "%s: import says the activation and head: %s",
              model_kind, out);
        // and HF -> ours -> HF gives the same file
        const char* exp2[] = {"--export", back_model.s, "--tokenizer", back_tok.s, "--dtype", dtypes[d], "-o", hf2.s, NULL};
        convert(exp2, NULL, 0);
        HFPath w1 = hf_join(hf.s, "model.safetensors"), w2 = hf_join(hf2.s, "model.safetensors");
        size_t l1 = 0, l2 = 0;
        char* f1 = read_text(w1.s, &l1);
        char* f2 = read_text(w2.s, &l2);
        CHECK(l1 == l2 && memcmp(f1, f2, l1) == 0, "%s, %s: HF -> ours -> HF gives the same safetensors bytes", dtypes[d],
              model_kind);
        HFPath c1 = hf_join(hf.s, "config.json"), c2 = hf_join(hf2.s, "config.json");
        char* j1 = read_text(c1.s, NULL);
        char* j2 = read_text(c2.s, NULL);
        CHECK(strcmp(j1, j2) == 0, "%s, %s: HF -> ours -> HF gives the same config.json", dtypes[d], model_kind);
        free(j1);
        free(j2);
        free(f1);
        free(f2);
        free(params);
    }

    // the rank file: its tokenizer.json is written, and a V = 50257 model round trips
    GPTConfig c = tiny_config(50257);
    c.channels = 8;
    c.num_heads = 2;
    c.num_kv_heads = 1;
    c.hidden = 12;
    float* params = random_params(&c, 7, ST_F32);
    const Path model = tmp_path("model.bin");
    checkpoint_save_model(model.s, &c, params, 3);
    Path hf = fresh_dir("hf"), back = fresh_dir("back");
    const char* exp[] = {"--export", model.s, "-o", hf.s, NULL};
    convert(exp, NULL, 0);
    check_exported_tensors(hf.s, &c, params);
    const char* imp[] = {"--import", hf.s, "-o", back.s, NULL};
    char out[4096];
    convert(imp, out, sizeof(out));
    HFPath back_model = hf_join(back.s, "model.bin");
    CHECK(same_checkpoint(back_model.s, &c, params), "r50k-sized model round trips");
    CHECK(strstr(out, "tokenizer: 50257 tokens") != NULL && strstr(out, "id 50256 <|endoftext|>") != NULL, "import output: %s", out);
    HFPath tok_cfg = hf_join(hf.s, "tokenizer_config.json");
    JsonValue v;
    json_parse_file(tok_cfg.s, &v);
    CHECK(json_string_is(json_get(&v, "eos_token"), "<|endoftext|>") && json_string_is(json_get(&v, "tokenizer_class"), "PreTrainedTokenizerFast"),
          "tokenizer_config.json");
    json_free(&v);
    // --encode with the rank file and with the tokenizer.json written from it
    HFPath tok_json = hf_join(hf.s, "tokenizer.json");
    const char* enc1[] = {"--encode", "Hello world, it's 2024!", NULL};
    const char* enc2[] = {"--tokenizer", tok_json.s, "--encode", "Hello world, it's 2024!", NULL};
    char o1[256], o2[256];
    convert(enc1, o1, sizeof(o1));
    convert(enc2, o2, sizeof(o2));
    CHECK(strcmp(o1, "15496 995 11 340 338 48609 0\n") == 0 && strcmp(o1, o2) == 0, "--encode: '%s' and '%s'", o1, o2);
    free(params);
}

// a random checkpoint of c (bf16-exact, seeded) exported in bf16 with tokenizer A to the fresh directory
// *hf (tmp_dir/name; the checkpoint is tmp_dir/name.bin); returns its parameters, its tensors in set
static float* export_fixture(const GPTConfig* c, uint64_t seed, const char* name, Path* hf, TensorSet* set) {
    float* params = random_params(c, seed, ST_BF16);
    char file[64];
    snprintf(file, sizeof(file), "%s.bin", name);
    const Path model = tmp_path(file);
    checkpoint_save_model(model.s, c, params, 0);
    char* tok_text = tokenizer_a();
    const Path tok = tmp_path("tokenizer.json");
    write_text(tok.s, tok_text);
    free(tok_text);
    *hf = fresh_dir(name);
    const char* exp[] = {"--export", model.s, "--tokenizer", tok.s, "--dtype", "bf16", "-o", hf->s, NULL};
    convert(exp, NULL, 0);
    HFPath weights = hf_join(hf->s, "model.safetensors");
    load_set(weights.s, set);
    return params;
}

static void test_import_variants(void) {
    GPTConfig c = tiny_config(269);
    Path hf;
    TensorSet set;
    float* params = export_fixture(&c, 55, "hf", &hf, &set);
    const Path tok = tmp_path("tokenizer.json");
    HFPath weights = hf_join(hf.s, "model.safetensors");
    const Path out = tmp_path("out");
    HFPath out_model = hf_join(out.s, "model.bin");
    const char* imp[] = {"--import", hf.s, "-o", out.s, NULL};

    // shards with an index, a tied lm_head equal to the embedding, an old inv_freq buffer
    Path sharded = fresh_dir("sharded");
    {
        int half = set.n / 2;
        HFPath s1 = hf_join(sharded.s, "model-00001-of-00002.safetensors"), s2 = hf_join(sharded.s, "model-00002-of-00002.safetensors");
        safetensors_write(s1.s, set.t, half, ST_BF16);
        SafeTensorOut rest[64];
        for (int k = half; k < set.n; k++) { rest[k - half] = set.t[k]; }
        int n_rest = set.n - half;
        float inv_freq[4] = {1, 2, 3, 4};
        SafeTensorOut head = {"lm_head.weight", 2, {c.vocab_size, c.channels}, set.data[set_find(&set, "model.embed_tokens.weight")], 0};
        SafeTensorOut freq = {"model.layers.0.self_attn.rotary_emb.inv_freq", 1, {4}, inv_freq, 0};
        rest[n_rest++] = head;
        rest[n_rest++] = freq;
        safetensors_write(s2.s, rest, n_rest, ST_BF16);
        char index[16384];
        size_t used = (size_t)snprintf(index, sizeof(index), "{\"metadata\": {\"total_size\": 1}, \"weight_map\": {");
        for (int k = 0; k < set.n; k++) {
            used += (size_t)snprintf(index + used, sizeof(index) - used, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"", k ? ", " : "",
                                     set.name[k], k < half ? 1 : 2);
        }
        snprintf(index + used, sizeof(index) - used, ", \"lm_head.weight\": \"model-00002-of-00002.safetensors\", "
                 "\"model.layers.0.self_attn.rotary_emb.inv_freq\": \"model-00002-of-00002.safetensors\"}}");
        HFPath idx = hf_join(sharded.s, "model.safetensors.index.json");
        write_text(idx.s, index);
        const char* files[] = {"config.json", "tokenizer.json"};
        for (int k = 0; k < 2; k++) {
            HFPath src = hf_join(hf.s, files[k]), dst = hf_join(sharded.s, files[k]);
            hf_copy(src.s, dst.s);
        }
        const char* imp_sharded[] = {"--import", sharded.s, "-o", out.s, NULL};
        convert(imp_sharded, NULL, 0);
        CHECK(same_checkpoint(out_model.s, &c, params), "sharded checkpoint with lm_head and inv_freq imports bit for bit");

        // index errors
        write_text(idx.s, "{\"weight_map\": {\"model.norm.weight\": \"../x.safetensors\"}}");
        expect_error(child_convert, imp_sharded, "weight_map[\"model.norm.weight\"] is not a file name in the same directory", "index: path");
        write_text(idx.s, "{\"weight_map\": {\"model.norm\\u0000.weight\": \"model-00001-of-00002.safetensors\"}}");
        expect_error(child_convert, imp_sharded, "weight_map key \"model.norm\\u0000.weight\" holds a NUL byte (\\u0000)",
                     "index: NUL in a name");
        write_text(idx.s, "{\"weight_map\": {\"model.norm.weight\": \"model-00003-of-00002.safetensors\"}}");
        expect_error(child_convert, imp_sharded, "model-00003-of-00002.safetensors is missing", "index: missing shard");
        write_text(idx.s, "{\"weight_map\": {\"model.norm.weight\": \"model-00001-of-00002.safetensors\"}}");
        expect_error(child_convert, imp_sharded, "weight_map puts model.norm.weight in", "index: wrong shard");
        snprintf(index, sizeof(index), "{\"weight_map\": {\"%s\": \"model-00001-of-00002.safetensors\"}}", set.name[0]);
        write_text(idx.s, index);
        expect_error(child_convert, imp_sharded, "is not in the weight_map of", "index: shard tensor not listed");
        write_text(idx.s, "{\"weight_map\": []}");
        expect_error(child_convert, imp_sharded, "model.safetensors.index.json: no weight_map object", "index: no weight_map");
    }

    // tensor errors: each rewrites model.safetensors from the set, then restores it
    struct { const char* what; int kind; const char* name; const char* want; } tensor_cases[] = {
        {"missing tensor", 0, "model.layers.1.mlp.up_proj.weight", "model.safetensors: no tensor model.layers.1.mlp.up_proj.weight"},
        {"misshapen tensor", 1, "model.layers.0.self_attn.k_proj.weight",
         "tensor model.layers.0.self_attn.k_proj.weight has shape [32, 32], config.json needs [16, 32]"},
        {"extra tensor", 2, "model.layers.0.self_attn.q_proj.bias",
         "tensor model.layers.0.self_attn.q_proj.bias is not part of a 2-layer Llama model with tied embeddings"},
        {"lm_head differs", 3, "lm_head.weight", "lm_head.weight differs from model.embed_tokens.weight but tie_word_embeddings is true"},
    };
    for (size_t k = 0; k < sizeof(tensor_cases) / sizeof(tensor_cases[0]); k++) {
        TensorSet s;
        load_set(weights.s, &s);
        if (tensor_cases[k].kind == 0) { set_remove(&s, tensor_cases[k].name); }
        if (tensor_cases[k].kind == 1) {
            int j = set_find(&s, tensor_cases[k].name);
            int q = set_find(&s, "model.layers.0.self_attn.q_proj.weight");
            set_remove(&s, tensor_cases[k].name);
            set_add(&s, tensor_cases[k].name, 2, c.channels, c.channels, s.data[q > j ? q - 1 : q]);
        }
        if (tensor_cases[k].kind == 2) { set_add(&s, tensor_cases[k].name, 1, c.channels, 0, s.data[0]); }
        if (tensor_cases[k].kind == 3) {
            int e = set_find(&s, "model.embed_tokens.weight");
            set_add(&s, tensor_cases[k].name, 2, c.vocab_size, c.channels, s.data[e]);
            s.data[s.n - 1][5] += 1.0f;
        }
        safetensors_write(weights.s, s.t, s.n, ST_BF16);
        expect_error(child_convert, imp, tensor_cases[k].want, tensor_cases[k].what);
        set_free(&s);
        safetensors_write(weights.s, set.t, set.n, ST_BF16);
    }
    // an I32 tensor where a float one belongs (written by hand)
    {
        safetensors_write(weights.s, set.t, set.n, ST_BF16);
        size_t len = 0;
        char* raw = read_text(weights.s, &len);
        const char* from = "\"model.norm.weight\":{\"dtype\":\"BF16\"";
        const char* to = "\"model.norm.weight\":{\"dtype\":\"I16\" "; // as long: the header keeps its length
        char* at = (char*)memmem(raw, len, from, strlen(from));
        CHECK(at != NULL, "norm's header entry");
        if (at) { memcpy(at, to, strlen(to)); }
        FILE* fp = fopenCheck(weights.s, "wb");
        fwriteCheck(raw, 1, len, fp);
        fcloseCheck(fp);
        expect_error(child_convert, imp, "tensor model.norm.weight is I16; only F32, BF16 and F16 tensors can be read", "I16 tensor");
        free(raw);
        safetensors_write(weights.s, set.t, set.n, ST_BF16);
    }

    // config.json variants that are read
    struct { const char* what; KV over[4]; int n; float theta; int hidden; int activation; } ok_cases[] = {
        {"transformers 5's rope_parameters", {{"rope_theta", NULL}, {"rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": 500000.0}"}}, 2,
         500000.0f, 48, ACT_RELU},
        {"rope_scaling default, eos list", {{"rope_scaling", "{\"type\": \"default\"}"}, {"eos_token_id", "[268, 1]"}}, 2, 10000.0f, 48,
         ACT_RELU},
        {"SparseLM: llama_sparse_relu with hidden_act silu", {{"model_type", "\"llama_sparse_relu\""}, {"hidden_act", "\"silu\""},
         {"intermediate_size", "999"}, {"sparsity_new_intermediate_size", "48"}}, 4, 10000.0f, 48, ACT_RELU},
        {"mistral without a sliding window", {{"model_type", "\"mistral\""}, {"sliding_window", "null"}}, 2, 10000.0f, 48, ACT_RELU},
        {"llama with hidden_act silu", {{"hidden_act", "\"silu\""}}, 1, 10000.0f, 48, ACT_SILU},
        {"no hidden_act: HF's default, silu", {{"hidden_act", NULL}}, 1, 10000.0f, 48, ACT_SILU},
        {"defaults: no num_key_value_heads", {{"num_key_value_heads", NULL}}, 1, 10000.0f, -1, ACT_RELU},
    };
    for (size_t k = 0; k < sizeof(ok_cases) / sizeof(ok_cases[0]); k++) {
        GPTConfig want = c;
        want.rope_theta = ok_cases[k].theta;
        want.activation = ok_cases[k].activation;
        if (ok_cases[k].hidden < 0) { // no num_key_value_heads: as many as heads, so k/v are wider
            want.num_kv_heads = want.num_heads;
            float* p = random_params(&want, 9, ST_BF16);
            const Path m2 = tmp_path("model_mha.bin");
            checkpoint_save_model(m2.s, &want, p, 0);
            Path hf_mha = fresh_dir("hf_mha");
            const char* e2[] = {"--export", m2.s, "--tokenizer", tok.s, "-o", hf_mha.s, NULL};
            convert(e2, NULL, 0);
            write_config(hf_mha.s, &want, ok_cases[k].over, ok_cases[k].n);
            const char* i2[] = {"--import", hf_mha.s, "-o", out.s, NULL};
            convert(i2, NULL, 0);
            CHECK(same_checkpoint(out_model.s, &want, p), "%s", ok_cases[k].what);
            free(p);
            continue;
        }
        write_config(hf.s, &c, ok_cases[k].over, ok_cases[k].n);
        convert(imp, NULL, 0);
        CHECK(same_checkpoint(out_model.s, &want, params), "%s", ok_cases[k].what);
    }
    // SparseLM with sparsity_use_hybrid_kernel: down_proj saved as [H, D], our wdT as it is
    {
        TensorSet s;
        load_set(weights.s, &s);
        for (int l = 0; l < c.num_layers; l++) {
            char name[96];
            snprintf(name, sizeof(name), "model.layers.%d.mlp.down_proj.weight", l);
            int j = set_find(&s, name);
            float* t = (float*)mallocCheck((size_t)c.hidden * c.channels * sizeof(float));
            for (int i = 0; i < c.channels; i++) {
                for (int h = 0; h < c.hidden; h++) { t[(size_t)h * c.channels + i] = s.data[j][(size_t)i * c.hidden + h]; }
            }
            set_remove(&s, name);
            set_add(&s, name, 2, c.hidden, c.channels, t);
            free(t);
        }
        safetensors_write(weights.s, s.t, s.n, ST_BF16);
        set_free(&s);
        KV over[3] = {{"model_type", "\"llama_sparse_relu\""}, {"hidden_act", "\"silu\""}, {"sparsity_use_hybrid_kernel", "true"}};
        write_config(hf.s, &c, over, 3);
        convert(imp, NULL, 0);
        CHECK(same_checkpoint(out_model.s, &c, params), "sparsity_use_hybrid_kernel: down_proj as [H, D]");
        safetensors_write(weights.s, set.t, set.n, ST_BF16);
    }

    // SakanaAI's other FFN layouts: layer 0 as gate_weight [D, H], up_weight, down_weight [H, D];
    // layer 1 as TwELL's GATE, UP, DOWN [H, D]; and a sparsity tracker's tensor to skip
    {
        TensorSet s;
        load_set(weights.s, &s);
        int D = c.channels, H = c.hidden;
        float* t = (float*)mallocCheck((size_t)H * D * sizeof(float));
        for (int l = 0; l < 2; l++) {
            const char* kinds[3] = {"gate_proj", "up_proj", "down_proj"};
            const char* alts[2][3] = {{"gate_weight", "up_weight", "down_weight"}, {"GATE", "UP", "DOWN"}};
            for (int k = 0; k < 3; k++) {
                char name[96], alt[96];
                snprintf(name, sizeof(name), "model.layers.%d.mlp.%s.weight", l, kinds[k]);
                snprintf(alt, sizeof(alt), "model.layers.%d.mlp.%s", l, alts[l][k]);
                int j = set_find(&s, name);
                int r = (int)s.t[j].shape[0], cc = (int)s.t[j].shape[1];
                int transpose = k == 2 || (l == 0 && k == 0); // down_proj [D, H] -> [H, D]; gate_proj -> gate_weight [D, H]
                for (int i = 0; i < r; i++) {
                    for (int jj = 0; jj < cc; jj++) {
                        if (transpose) { t[(size_t)jj * r + i] = s.data[j][(size_t)i * cc + jj]; }
                        else { t[(size_t)i * cc + jj] = s.data[j][(size_t)i * cc + jj]; }
                    }
                }
                set_remove(&s, name);
                set_add(&s, alt, 2, transpose ? cc : r, transpose ? r : cc, t);
            }
        }
        float tracker[3] = {1, 2, 3};
        set_add(&s, "model.layers.0.mlp.tracker.last_activated", 1, 3, 0, tracker);
        free(t);
        safetensors_write(weights.s, s.t, s.n, ST_BF16);
        set_free(&s);
        write_config(hf.s, &c, NULL, 0);
        convert(imp, NULL, 0);
        CHECK(same_checkpoint(out_model.s, &c, params), "FFN as gate_weight/up_weight/down_weight and GATE/UP/DOWN, tracker skipped");
        safetensors_write(weights.s, set.t, set.n, ST_BF16);
    }

    // config.json variants that are errors, each naming the field
    struct { KV over[2]; int n; const char* want; } bad[] = {
        {{{"hidden_act", "\"gelu\""}}, 1, "hidden_act gelu is not supported: the FFN's gate is relu or silu"},
        {{{"hidden_act", "\"gelu_pytorch_tanh\""}}, 1, "hidden_act gelu_pytorch_tanh is not supported"},
        {{{"tie_word_embeddings", "false"}}, 1, "tie_word_embeddings is false (or absent: false by default), but there is no lm_head.weight"},
        {{{"tie_word_embeddings", NULL}}, 1, "tie_word_embeddings is false (or absent: false by default), but there is no lm_head.weight"},
        {{{"head_dim", "16"}}, 1, "head_dim 16 is not supported: it must be hidden_size / num_attention_heads = 8"},
        {{{"rope_scaling", "{\"rope_type\": \"linear\", \"factor\": 2.0}"}}, 1, "rope_scaling (rope_type linear) is not supported"},
        {{{"rope_parameters", "{\"rope_type\": \"yarn\", \"rope_theta\": 10000.0}"}}, 1, "rope_parameters (rope_type yarn) is not supported"},
        {{{"rope_scaling", "3"}}, 1, "rope_scaling is a number, not an object or null"},
        {{{"attention_bias", "true"}}, 1, "attention_bias true is not supported"},
        {{{"mlp_bias", "true"}}, 1, "mlp_bias true is not supported"},
        {{{"rope_interleaved", "true"}}, 1, "rope_interleaved true is not supported"},
        {{{"model_type", "\"qwen2\""}}, 1, "model_type qwen2 is not supported"},
        {{{"model_type", NULL}}, 1, "model_type is missing"},
        {{{"vocab_size", NULL}}, 1, "vocab_size is missing"},
        {{{"vocab_size", "\"269\""}}, 1, "vocab_size is a string, not an integer"},
        {{{"vocab_size", "1"}}, 1, "vocab_size 1 is out of range"},
        {{{"num_key_value_heads", "3"}}, 1, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"},
        {{{"hidden_size", "30"}}, 1, "hidden_size 30 is not a multiple of num_attention_heads 4"},
        {{{"rms_norm_eps", "-1"}}, 1, "rms_norm_eps -1 must be a positive float32"},
        {{{"model_type", "\"mistral\""}, {"sliding_window", "16"}}, 2, "sliding_window 16 is not supported: attention is full causal"},
        {{{"model_type", "\"llama_sparse_relu\""}, {"sparsity_gated_mlp", "false"}}, 2, "sparsity_gated_mlp false (an FFN without a gate) is not supported"},
        {{{"intermediate_size", "64"}}, 1, "tensor model.layers.0.mlp.gate_proj.weight has shape [48, 32], config.json needs [64, 32]"},
        {{{"vocab_size", "300"}}, 1, "tensor model.embed_tokens.weight has shape [269, 32], config.json needs [300, 32]"},
    };
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        write_config(hf.s, &c, bad[k].over, bad[k].n);
        char what[64];
        snprintf(what, sizeof(what), "config case %zu", k);
        expect_error(child_convert, imp, bad[k].want, what);
    }
    HFPath cfg = hf_join(hf.s, "config.json");
    write_text(cfg.s, "{\"model_type\": \"llama\",}");
    expect_error(child_convert, imp, "config.json: invalid JSON at line 1, column 24: trailing comma", "config.json not JSON");
    remove(cfg.s);
    expect_error(child_convert, imp, "no config.json (not a Hugging Face checkpoint directory?)", "no config.json");
    write_config(hf.s, &c, NULL, 0);
    remove(weights.s);
    expect_error(child_convert, imp, "no model.safetensors or model.safetensors.index.json", "no weights");
    set_free(&set);
    free(params);
}

// a SiLU Llama with an untied lm_head, as HF saves one: sharded with the head in the second shard it
// imports bit for bit; a misshapen or missing head, a stray tensor, and a config that calls the head tied
// while it differs from the embedding are one-line errors
static void test_import_untied(void) {
    GPTConfig c = tiny_config(269);
    c.activation = ACT_SILU;
    c.untied_head = 1;
    Path hf;
    TensorSet set;
    float* params = export_fixture(&c, 77, "hf_untied", &hf, &set);
    HFPath weights = hf_join(hf.s, "model.safetensors");
    const Path out = tmp_path("out_untied");
    HFPath out_model = hf_join(out.s, "model.bin");
    const char* imp[] = {"--import", hf.s, "-o", out.s, NULL};

    // two shards, lm_head.weight in the second
    Path sharded = fresh_dir("sharded_untied");
    {
        HFPath s1 = hf_join(sharded.s, "model-00001-of-00002.safetensors"), s2 = hf_join(sharded.s, "model-00002-of-00002.safetensors");
        int head = set_find(&set, "lm_head.weight");
        SafeTensorOut first[64];
        int n_first = 0;
        for (int k = 0; k < set.n; k++) {
            if (k != head) { first[n_first++] = set.t[k]; }
        }
        safetensors_write(s1.s, first, n_first, ST_BF16);
        safetensors_write(s2.s, &set.t[head], 1, ST_BF16);
        char index[16384];
        size_t used = (size_t)snprintf(index, sizeof(index), "{\"weight_map\": {");
        for (int k = 0; k < set.n; k++) {
            used += (size_t)snprintf(index + used, sizeof(index) - used, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"",
                                     k ? ", " : "", set.name[k], k == head ? 2 : 1);
        }
        snprintf(index + used, sizeof(index) - used, "}}");
        HFPath idx = hf_join(sharded.s, "model.safetensors.index.json"), cfg_in = hf_join(hf.s, "config.json"),
               cfg_out = hf_join(sharded.s, "config.json");
        HFPath tok_in = hf_join(hf.s, "tokenizer.json"), tok_out = hf_join(sharded.s, "tokenizer.json");
        write_text(idx.s, index);
        hf_copy(cfg_in.s, cfg_out.s);
        hf_copy(tok_in.s, tok_out.s);
        const char* imp_sharded[] = {"--import", sharded.s, "-o", out.s, NULL};
        char text[4096];
        convert(imp_sharded, text, sizeof(text));
        CHECK(same_checkpoint(out_model.s, &c, params), "SiLU, untied, sharded: imports bit for bit");
        CHECK(strstr(text, "hidden_act silu") != NULL && strstr(text, ", untied head") != NULL, "import output: %s", text);
    }

    struct { const char* what; int kind; const char* want; } cases[] = {
        {"untied: no lm_head", 0, "tie_word_embeddings is false (or absent: false by default), but there is no lm_head.weight"},
        {"untied: misshapen lm_head", 1, "tensor lm_head.weight has shape [268, 32], config.json needs [269, 32]"},
        {"untied: stray tensor", 2, "tensor model.layers.0.mlp.gate_proj.bias is not part of a 2-layer Llama model with untied embeddings"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        TensorSet s;
        load_set(weights.s, &s);
        if (cases[k].kind == 0) { set_remove(&s, "lm_head.weight"); }
        if (cases[k].kind == 1) {
            int h = set_find(&s, "lm_head.weight");
            float* rows = (float*)mallocCheck((size_t)(c.vocab_size - 1) * c.channels * sizeof(float));
            memcpy(rows, s.data[h], (size_t)(c.vocab_size - 1) * c.channels * sizeof(float));
            set_remove(&s, "lm_head.weight");
            set_add(&s, "lm_head.weight", 2, c.vocab_size - 1, c.channels, rows);
            free(rows);
        }
        if (cases[k].kind == 2) { set_add(&s, "model.layers.0.mlp.gate_proj.bias", 1, c.hidden, 0, s.data[0]); }
        safetensors_write(weights.s, s.t, s.n, ST_BF16);
        expect_error(child_convert, imp, cases[k].want, cases[k].what);
        set_free(&s);
        safetensors_write(weights.s, set.t, set.n, ST_BF16);
    }
    // the same weights with a config that says tied: lm_head must then be the embedding
    GPTConfig tied = c;
    tied.untied_head = 0;
    write_config(hf.s, &tied, NULL, 0);
    expect_error(child_convert, imp, "lm_head.weight differs from model.embed_tokens.weight but tie_word_embeddings is true",
                 "untied weights, tied config");
    set_free(&set);
    free(params);
}

static void test_cli_errors(void) {
    struct { const char* args[10]; const char* want; } cases[] = {
        {{NULL}, "give exactly one of --import, --export and --encode"},
        {{"--import", "a", "--export", "b", "-o", "c", NULL}, "give exactly one of --import, --export and --encode"},
        {{"--import", "a", NULL}, "--import needs --output"},
        {{"--export", "a", NULL}, "--export needs --output"},
        {{"--encode", "x", "-o", "c", NULL}, "--encode prints the ids: drop --output"},
        {{"--import", "a", "--dtype", "bf16", "-o", "c", NULL}, "--dtype needs --export"},
        {{"--import", "a", "--tokenizer", "t", "-o", "c", NULL}, "drop --tokenizer"},
        {{"--export", "a", "--dtype", "f64", "-o", "c", NULL}, "--dtype f64: use f32, bf16 or f16"},
        {{"--import", "a", "--bogus", "1", NULL}, "unknown flag '--bogus'"},
        {{"--encode", "\xff", NULL}, "--encode: the text is not valid UTF-8 at byte 0"},
        {{"--export", "/nonexistent/model.bin", "-o", "c", NULL}, "cannot open /nonexistent/model.bin"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        char what[64];
        snprintf(what, sizeof(what), "CLI case %zu", k);
        expect_error(child_convert, cases[k].args, cases[k].want, what);
    }
}

int main(void) {
    make_tmp_dir("test_hf_convert");
    test_json_valid();
    test_json_errors();
    test_half_conversions();
    test_safetensors_roundtrip();
    test_safetensors_errors();
    test_tokenizer_json_encodings();
    test_tokenizer_json_r50k();
    test_tokenizer_json_errors();
    test_export_import_roundtrip();
    test_import_variants();
    test_import_untied();
    test_cli_errors();
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp_dir);
    if (system(cmd) != 0) { fprintf(stderr, "cannot remove %s\n", tmp_dir); }
    return test_summary("test_hf_convert");
}
