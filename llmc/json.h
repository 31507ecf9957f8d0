/*
 A small, strict JSON reader (RFC 8259) for the files of Hugging Face checkpoints (config.json,
 tokenizer.json, model.safetensors.index.json and safetensors headers) and the requests of the
 inference server; and a string writer.

 json_parse builds a tree of the whole text. Whatever RFC 8259 does not allow is a one-line fatal
 error naming the file, the line and column, and what is wrong (json_parse_text, for text from a
 client, returns that message instead and frees what it read): trailing commas, comments, single
 quotes, leading zeros, NaN and Infinity, numbers out of double range (of any length otherwise),
 raw control characters or invalid UTF-8 in strings, unknown escapes, unpaired UTF-16 surrogates,
 repeated keys in one object, anything after the value; and nesting deeper than JSON_MAX_DEPTH.
*/
#ifndef LLMC_JSON_H
#define LLMC_JSON_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llmc/utils.h"

#define JSON_MAX_DEPTH 512

typedef enum { JSON_NULL, JSON_FALSE, JSON_TRUE, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } JsonType;

typedef struct JsonMember JsonMember;

typedef struct JsonValue {
    JsonType type;
    double number;       // JSON_NUMBER
    int64_t integer;     // JSON_NUMBER written as an integer that fits int64 (is_integer = 1)
    int is_integer;
    char* string;        // JSON_STRING: UTF-8, NUL-terminated (a \u0000 in it is counted by length)
    size_t length;       // JSON_STRING: bytes; JSON_ARRAY and JSON_OBJECT: elements
    struct JsonValue* items; // JSON_ARRAY
    JsonMember* members;     // JSON_OBJECT, in file order
} JsonValue;

struct JsonMember {
    char* key;
    size_t key_length;
    JsonValue value;
};

typedef struct {
    const char* s;
    size_t n, i;
    int depth;
    char err[192]; // the first error: "line L, column C: what" ("" while there is none)
} JsonParser;

// byte c of a valid UTF-8 string as it stands in a JSON string literal, into out; returns its length
static inline int json_escape_byte(unsigned char c, char out[7]) {
    if (c == '"' || c == '\\') { out[0] = '\\'; out[1] = (char)c; return 2; }
    if (c == '\n') { memcpy(out, "\\n", 2); return 2; }
    if (c == '\t') { memcpy(out, "\\t", 2); return 2; }
    if (c == '\r') { memcpy(out, "\\r", 2); return 2; }
    if (c < 0x20) { return snprintf(out, 7, "\\u%04x", c); }
    out[0] = (char)c;
    return 1;
}

// s[0..n) for a one-line message, its bytes escaped as inside a JSON string (so that a NUL or a
// newline in a name read from a file shows as \u0000 or \n), cut with "..." to fit out[len]; returns out
static inline const char* json_escaped(char* out, size_t len, const char* s, size_t n) {
    size_t used = 0;
    for (size_t k = 0; k < n; k++) {
        char piece[7];
        size_t m = (size_t)json_escape_byte((unsigned char)s[k], piece);
        if (used + m + 4 > len) { // room for "..." and the NUL, cut before a whole character
            if (((unsigned char)s[k] & 0xC0) == 0x80) {
                while (used > 0 && ((unsigned char)out[used - 1] & 0xC0) == 0x80) { used--; }
                if (used > 0 && (unsigned char)out[used - 1] >= 0xC0) { used--; }
            }
            snprintf(out + used, len - used, "...");
            return out;
        }
        memcpy(out + used, piece, m);
        used += m;
    }
    out[used] = '\0';
    return out;
}

// records the error at byte `at` (its line and column) and returns -1, which every caller passes up
static inline int json_fail_at(JsonParser* p, size_t at, const char* what) {
    size_t line = 1, col = 1;
    for (size_t k = 0; k < at && k < p->n; k++) {
        if (p->s[k] == '\n') { line++; col = 1; }
        else { col++; }
    }
    snprintf(p->err, sizeof(p->err), "line %zu, column %zu: %s", line, col, what);
    return -1;
}

static inline void json_skip_ws(JsonParser* p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r')) {
        p->i++;
    }
}

static inline int json_hex(char c) {
    if (c >= '0' && c <= '9') { return c - '0'; }
    if (c >= 'a' && c <= 'f') { return c - 'a' + 10; }
    if (c >= 'A' && c <= 'F') { return c - 'A' + 10; }
    return -1;
}

// the 4 hex digits after "\u" at p->i into *v; advances past them
static inline int json_hex4(JsonParser* p, uint32_t* v) {
    *v = 0;
    for (int k = 0; k < 4; k++) {
        int h = p->i < p->n ? json_hex(p->s[p->i]) : -1;
        if (h < 0) { return json_fail_at(p, p->i, "\\u needs 4 hex digits"); }
        *v = *v * 16 + (uint32_t)h;
        p->i++;
    }
    return 0;
}

// length of the well-formed UTF-8 sequence at s[i] (no overlongs, surrogates, or code points past
// U+10FFFF), 0 if there is none
static inline size_t json_utf8_length(const unsigned char* s, size_t n, size_t i) {
    unsigned char c = s[i];
    if (c < 0x80) { return 1; }
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; lo = c == 0xE0 ? 0xA0 : 0x80; hi = c == 0xED ? 0x9F : 0xBF; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; lo = c == 0xF0 ? 0x90 : 0x80; hi = c == 0xF4 ? 0x8F : 0xBF; }
    else { return 0; }
    if (n - i < len || s[i + 1] < lo || s[i + 1] > hi) { return 0; }
    for (size_t k = 2; k < len; k++) {
        if ((s[i + k] & 0xC0) != 0x80) { return 0; }
    }
    return len;
}

// appends code point cp as UTF-8 to out (room for 4 bytes); returns the new length
static inline size_t json_put_utf8(char* out, size_t len, uint32_t cp) {
    if (cp < 0x80) { out[len++] = (char)cp; }
    else if (cp < 0x800) { out[len++] = (char)(0xC0 | (cp >> 6)); out[len++] = (char)(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
        out[len++] = (char)(0xE0 | (cp >> 12));
        out[len++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[len++] = (char)(0x80 | (cp & 0x3F));
    } else {
        out[len++] = (char)(0xF0 | (cp >> 18));
        out[len++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[len++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[len++] = (char)(0x80 | (cp & 0x3F));
    }
    return len;
}

// the code point of the escape "\u...." at p->i - 1 (esc: where its backslash is), a surrogate pair
// read whole
static inline int json_parse_escape_u(JsonParser* p, size_t esc, uint32_t* cp) {
    if (json_hex4(p, cp) != 0) { return -1; }
    if (*cp >= 0xDC00 && *cp <= 0xDFFF) { return json_fail_at(p, esc, "unpaired UTF-16 low surrogate"); }
    if (*cp >= 0xD800 && *cp <= 0xDBFF) {
        if (p->i + 1 >= p->n || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u') {
            return json_fail_at(p, esc, "unpaired UTF-16 high surrogate");
        }
        p->i += 2;
        uint32_t lo;
        if (json_hex4(p, &lo) != 0) { return -1; }
        if (lo < 0xDC00 || lo > 0xDFFF) { return json_fail_at(p, esc, "unpaired UTF-16 high surrogate"); }
        *cp = 0x10000 + ((*cp - 0xD800) << 10) + (lo - 0xDC00);
    }
    return 0;
}

// the string that starts at the '"' at p->i, decoded into a malloc'd NUL-terminated buffer (*out;
// NULL after an error)
static inline int json_parse_string(JsonParser* p, char** out, size_t* length) {
    size_t start = p->i++;
    *out = NULL;
    // the decoded string is never longer than its source
    size_t end = p->i;
    while (end < p->n && p->s[end] != '"') { end += p->s[end] == '\\' ? 2 : 1; }
    if (end >= p->n) { return json_fail_at(p, start, "unterminated string"); }
    char* buf = (char*)mallocCheck(end - p->i + 1);
    size_t len = 0;
    const unsigned char* u = (const unsigned char*)p->s;
    int rc = 0;
    while (rc == 0 && p->s[p->i] != '"') {
        unsigned char c = u[p->i];
        if (c < 0x20) { rc = json_fail_at(p, p->i, "control character in a string (it must be escaped)"); break; }
        if (c != '\\') {
            size_t k = json_utf8_length(u, p->n, p->i);
            if (k == 0) { rc = json_fail_at(p, p->i, "invalid UTF-8 in a string"); break; }
            memcpy(buf + len, p->s + p->i, k);
            len += k;
            p->i += k;
            continue;
        }
        size_t esc = p->i++;
        char e = p->s[p->i++];
        switch (e) {
            case '"': buf[len++] = '"'; break;
            case '\\': buf[len++] = '\\'; break;
            case '/': buf[len++] = '/'; break;
            case 'b': buf[len++] = '\b'; break;
            case 'f': buf[len++] = '\f'; break;
            case 'n': buf[len++] = '\n'; break;
            case 'r': buf[len++] = '\r'; break;
            case 't': buf[len++] = '\t'; break;
            case 'u': {
                uint32_t cp;
                rc = json_parse_escape_u(p, esc, &cp);
                // the escape is at least 6 bytes, its UTF-8 at most 4: still within the buffer
                if (rc == 0) { len = json_put_utf8(buf, len, cp); }
                break;
            }
            default: rc = json_fail_at(p, esc, "unknown escape in a string");
        }
    }
    if (rc != 0) { free(buf); return rc; }
    p->i++; // the closing quote
    buf[len] = '\0';
    *out = buf;
    *length = len;
    return 0;
}

static inline int json_parse_number(JsonParser* p, JsonValue* v) {
    size_t start = p->i;
    const char* s = p->s;
    if (p->i < p->n && s[p->i] == '-') { p->i++; }
    if (p->i >= p->n || s[p->i] < '0' || s[p->i] > '9') { return json_fail_at(p, start, "a number needs digits"); }
    if (s[p->i] == '0' && p->i + 1 < p->n && s[p->i + 1] >= '0' && s[p->i + 1] <= '9') {
        return json_fail_at(p, start, "leading zero in a number");
    }
    while (p->i < p->n && s[p->i] >= '0' && s[p->i] <= '9') { p->i++; }
    int integer = 1;
    if (p->i < p->n && s[p->i] == '.') {
        integer = 0;
        p->i++;
        if (p->i >= p->n || s[p->i] < '0' || s[p->i] > '9') { return json_fail_at(p, start, "a fraction needs digits"); }
        while (p->i < p->n && s[p->i] >= '0' && s[p->i] <= '9') { p->i++; }
    }
    if (p->i < p->n && (s[p->i] == 'e' || s[p->i] == 'E')) {
        integer = 0;
        p->i++;
        if (p->i < p->n && (s[p->i] == '+' || s[p->i] == '-')) { p->i++; }
        if (p->i >= p->n || s[p->i] < '0' || s[p->i] > '9') { return json_fail_at(p, start, "an exponent needs digits"); }
        while (p->i < p->n && s[p->i] >= '0' && s[p->i] <= '9') { p->i++; }
    }
    // strtod wants a NUL-terminated copy; a number has any number of digits
    char small[64];
    size_t len = p->i - start;
    char* buf = len < sizeof(small) ? small : (char*)mallocCheck(len + 1);
    memcpy(buf, s + start, len);
    buf[len] = '\0';
    v->type = JSON_NUMBER;
    v->number = strtod(buf, NULL);
    if (integer) {
        errno = 0;
        long long x = strtoll(buf, NULL, 10);
        if (errno == 0) { v->integer = x; v->is_integer = 1; }
    }
    if (buf != small) { free(buf); }
    if (!isfinite(v->number)) { return json_fail_at(p, start, "number out of range"); }
    return 0;
}

static inline int json_parse_value(JsonParser* p, JsonValue* v);
static inline void json_free(JsonValue* v);

static inline int json_member_cmp(const void* a, const void* b) {
    const JsonMember* x = *(const JsonMember* const*)a;
    const JsonMember* y = *(const JsonMember* const*)b;
    size_t n = x->key_length < y->key_length ? x->key_length : y->key_length;
    int c = memcmp(x->key, y->key, n);
    if (c != 0) { return c; }
    return (x->key_length > y->key_length) - (x->key_length < y->key_length);
}

// an object's members with one key twice: an error naming the key
static inline int json_check_keys(JsonParser* p, const JsonValue* v, size_t start) {
    if (v->length < 2) { return 0; }
    JsonMember** sorted = (JsonMember**)mallocCheck(v->length * sizeof(JsonMember*));
    for (size_t k = 0; k < v->length; k++) { sorted[k] = &v->members[k]; }
    qsort(sorted, v->length, sizeof(JsonMember*), json_member_cmp);
    int rc = 0;
    for (size_t k = 1; k < v->length && rc == 0; k++) {
        if (json_member_cmp(&sorted[k - 1], &sorted[k]) == 0) {
            char key[104], what[160];
            json_escaped(key, sizeof(key), sorted[k]->key, sorted[k]->key_length);
            snprintf(what, sizeof(what), "key \"%s\" appears twice in this object", key);
            rc = json_fail_at(p, start, what);
        }
    }
    free(sorted);
    return rc;
}

// an object or an array; after an error *v holds nothing (what was read so far is freed)
static inline int json_parse_container(JsonParser* p, JsonValue* v, int object) {
    size_t start = p->i++;
    if (++p->depth > JSON_MAX_DEPTH) { return json_fail_at(p, start, "nested too deeply"); }
    size_t cap = 0, size = object ? sizeof(JsonMember) : sizeof(JsonValue);
    void* elems = NULL;
    v->type = object ? JSON_OBJECT : JSON_ARRAY;
    v->length = 0;
    char close = object ? '}' : ']';
    int rc = 0;
    json_skip_ws(p);
    if (p->i < p->n && p->s[p->i] == close) {
        p->i++;
    } else {
        for (;;) {
            if (v->length == cap) {
                cap = cap ? 2 * cap : 4;
                elems = reallocCheck(elems, cap * size);
                if (object) { v->members = (JsonMember*)elems; } else { v->items = (JsonValue*)elems; }
            }
            JsonValue* item;
            json_skip_ws(p);
            if (object) {
                JsonMember* m = (JsonMember*)elems + v->length;
                if (p->i >= p->n || p->s[p->i] != '"') { rc = json_fail_at(p, p->i, "expected a string key"); break; }
                if ((rc = json_parse_string(p, &m->key, &m->key_length)) != 0) { break; }
                json_skip_ws(p);
                if (p->i >= p->n || p->s[p->i] != ':') {
                    free(m->key);
                    rc = json_fail_at(p, p->i, "expected ':' after a key");
                    break;
                }
                p->i++;
                item = &m->value;
                if ((rc = json_parse_value(p, item)) != 0) { free(m->key); break; }
            } else {
                item = (JsonValue*)elems + v->length;
                if ((rc = json_parse_value(p, item)) != 0) { break; }
            }
            v->length++;
            json_skip_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                json_skip_ws(p);
                if (p->i < p->n && p->s[p->i] == close) { rc = json_fail_at(p, p->i, "trailing comma"); break; }
                continue;
            }
            if (p->i < p->n && p->s[p->i] == close) { p->i++; break; }
            rc = json_fail_at(p, p->i, object ? "expected ',' or '}'" : "expected ',' or ']'");
            break;
        }
    }
    if (rc == 0 && object) { rc = json_check_keys(p, v, start); }
    if (rc != 0) { json_free(v); return rc; }
    p->depth--;
    return 0;
}

static inline int json_parse_literal(JsonParser* p, const char* word, JsonType type, JsonValue* v) {
    size_t len = strlen(word);
    if (p->n - p->i < len || memcmp(p->s + p->i, word, len) != 0) { return json_fail_at(p, p->i, "unexpected character"); }
    p->i += len;
    v->type = type;
    return 0;
}

static inline int json_parse_value(JsonParser* p, JsonValue* v) {
    memset(v, 0, sizeof(*v));
    json_skip_ws(p);
    if (p->i >= p->n) { return json_fail_at(p, p->i, "unexpected end of the text"); }
    char c = p->s[p->i];
    int rc;
    if (c == '{' || c == '[') { rc = json_parse_container(p, v, c == '{'); }
    else if (c == '"') { v->type = JSON_STRING; rc = json_parse_string(p, &v->string, &v->length); }
    else if (c == 't') { rc = json_parse_literal(p, "true", JSON_TRUE, v); }
    else if (c == 'f') { rc = json_parse_literal(p, "false", JSON_FALSE, v); }
    else if (c == 'n') { rc = json_parse_literal(p, "null", JSON_NULL, v); }
    else if (c == '-' || (c >= '0' && c <= '9')) { rc = json_parse_number(p, v); }
    else { rc = json_fail_at(p, p->i, "unexpected character"); }
    if (rc != 0) { memset(v, 0, sizeof(*v)); } // a failed string or container freed its own
    return rc;
}

// Parses text[0..n) into *out (release it with json_free): 0, or -1 with nothing allocated and
// "line L, column C: what is wrong" in err (err_len bytes). For text from a client, which must
// not stop the process.
static inline int json_parse_text(const char* text, size_t n, JsonValue* out, char* err, size_t err_len) {
    JsonParser p = {text, n, 0, 0, ""};
    int rc = json_parse_value(&p, out);
    if (rc == 0) {
        json_skip_ws(&p);
        if (p.i != n) { rc = json_fail_at(&p, p.i, "text after the value"); json_free(out); }
    }
    if (rc != 0) { snprintf(err, err_len, "%s", p.err); }
    return rc;
}

// parses text[0..n) (name is the file, for errors) into *out; release with json_free. Whatever is
// not JSON is a one-line fatal error.
static inline void json_parse(const char* text, size_t n, const char* name, JsonValue* out) {
    char err[sizeof(((JsonParser*)NULL)->err)];
    if (json_parse_text(text, n, out, err, sizeof(err)) != 0) { fatal("%s: invalid JSON at %s", name, err); }
}

static inline void json_free(JsonValue* v) {
    if (v->type == JSON_STRING) { free(v->string); }
    if (v->type == JSON_ARRAY) {
        for (size_t k = 0; k < v->length; k++) { json_free(&v->items[k]); }
        free(v->items);
    }
    if (v->type == JSON_OBJECT) {
        for (size_t k = 0; k < v->length; k++) {
            free(v->members[k].key);
            json_free(&v->members[k].value);
        }
        free(v->members);
    }
    memset(v, 0, sizeof(*v));
}

// reads and parses a whole file; fatal() if it cannot be read or is not JSON
static inline void json_parse_file(const char* path, JsonValue* out) {
    FILE* fp = fopen(path, "rb");
    if (fp == NULL) { fatal("cannot open %s: %s", path, strerror(errno)); }
    long size = file_size(fp);
    char* text = (char*)mallocCheck((size_t)size + 1);
    if (fread(text, 1, (size_t)size, fp) != (size_t)size) { fatal("cannot read %s", path); }
    fclose(fp);
    json_parse(text, (size_t)size, path, out);
    free(text);
}

// the value of key in object o, NULL if o is not an object or has no such key
static inline const JsonValue* json_get(const JsonValue* o, const char* key) {
    if (o == NULL || o->type != JSON_OBJECT) { return NULL; }
    size_t len = strlen(key);
    for (size_t k = 0; k < o->length; k++) {
        if (o->members[k].key_length == len && memcmp(o->members[k].key, key, len) == 0) { return &o->members[k].value; }
    }
    return NULL;
}

// 1 if v is the string s
static inline int json_string_is(const JsonValue* v, const char* s) {
    return v != NULL && v->type == JSON_STRING && v->length == strlen(s) && memcmp(v->string, s, v->length) == 0;
}

static inline const char* json_type_name(JsonType t) {
    static const char* const names[] = {"null", "false", "true", "a number", "a string", "an array", "an object"};
    return names[t];
}

// writes s[0..n) (valid UTF-8) as a JSON string literal
static inline void json_write_string(FILE* fp, const char* s, size_t n) {
    fputc('"', fp);
    for (size_t k = 0; k < n; k++) {
        char e[7];
        fwrite(e, 1, (size_t)json_escape_byte((unsigned char)s[k], e), fp);
    }
    fputc('"', fp);
}

#endif // LLMC_JSON_H
