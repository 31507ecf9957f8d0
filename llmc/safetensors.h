/*
 safetensors files (Hugging Face's tensor format), read and written without Python.

 A file is an 8-byte little-endian header length N, then N bytes of a JSON object, then the data:
     {"__metadata__": {"format": "pt"},
      "<name>": {"dtype": "BF16", "shape": [49152, 2048], "data_offsets": [begin, end]}, ...}
 where the offsets count from the start of the data. Reading is strict: a header length past the
 file, a header that is not JSON or not an object, an unknown dtype, a shape or offsets that are
 not arrays of non-negative integers, a byte count that does not match the shape, and tensors that
 overlap, leave a gap, or do not end where the file does, are each a one-line error naming the
 file. F32, BF16 and F16 tensors are read into fp32 (exactly: both are subsets of fp32); writing
 takes fp32 and stores F32, BF16 or F16, rounded to nearest even (exact for values that came from
 that dtype). The data is little-endian, as on every machine this project builds for.
*/
#ifndef LLMC_SAFETENSORS_H
#define LLMC_SAFETENSORS_H

#include <stdint.h>
#include "llmc/json.h"
#include "llmc/utils.h"

#define SAFETENSORS_MAX_DIMS 8
#define SAFETENSORS_MAX_HEADER (100u << 20) // the reference implementation's limit

typedef enum { ST_F32, ST_BF16, ST_F16, ST_OTHER } SafeDtype;

typedef struct {
    char* name;
    char dtype_name[16];  // as in the header: "F32", "BF16", "I64", ...
    SafeDtype dtype;      // ST_OTHER: a dtype we can check but not convert
    int ndim;
    int64_t shape[SAFETENSORS_MAX_DIMS];
    uint64_t begin, end;  // byte offsets in the data
} SafeTensor;

typedef struct {
    char* path;
    FILE* fp;
    uint64_t data_start;  // 8 + header length
    int n;
    SafeTensor* tensors;  // in header order
} SafeTensors;

static inline size_t safetensors_dtype_size(const char* dtype) {
    static const struct { const char* name; size_t size; } sizes[] = {
        {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
        {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1}, {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
    };
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        if (strcmp(sizes[k].name, dtype) == 0) { return sizes[k].size; }
    }
    return 0;
}

// "[2048, 5632]"
static inline void safetensors_shape_string(const SafeTensor* t, char* out, size_t len) {
    size_t used = (size_t)snprintf(out, len, "[");
    for (int d = 0; d < t->ndim && used < len; d++) {
        used += (size_t)snprintf(out + used, len - used, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    }
    if (used < len) { snprintf(out + used, len - used, "]"); }
}

static inline int safetensors_offset_cmp(const void* a, const void* b) {
    const SafeTensor* x = *(const SafeTensor* const*)a;
    const SafeTensor* y = *(const SafeTensor* const*)b;
    if (x->begin != y->begin) { return x->begin < y->begin ? -1 : 1; }
    return (x->end > y->end) - (x->end < y->end);
}

// reads and checks the header of path; the file stays open for safetensors_read
static inline void safetensors_open(SafeTensors* st, const char* path) {
    memset(st, 0, sizeof(*st));
    st->path = (char*)mallocCheck(strlen(path) + 1);
    strcpy(st->path, path);
    st->fp = fopen(path, "rb");
    if (st->fp == NULL) { fatal("cannot open %s: %s", path, strerror(errno)); }
    uint64_t size = (uint64_t)file_size(st->fp);
    unsigned char len8[8];
    if (size < 8 || fread(len8, 1, 8, st->fp) != 8) {
        fatal("%s: %llu bytes is too short for a safetensors file", path, (unsigned long long)size);
    }
    uint64_t header_len = 0;
    for (int k = 7; k >= 0; k--) { header_len = (header_len << 8) | len8[k]; }
    if (header_len > size - 8) {
        fatal("%s: the header length %llu runs past the end of the file (%llu bytes)", path,
              (unsigned long long)header_len, (unsigned long long)size);
    }
    if (header_len > SAFETENSORS_MAX_HEADER) {
        fatal("%s: the header length %llu is over 100 MiB", path, (unsigned long long)header_len);
    }
    char* text = (char*)mallocCheck((size_t)header_len + 1);
    freadCheck(text, 1, (size_t)header_len, st->fp);
    text[header_len] = '\0';
    if (header_len == 0 || text[0] != '{') { fatal("%s: the header does not start with '{'", path); }
    JsonValue header;
    json_parse(text, (size_t)header_len, path, &header);
    free(text);
    st->data_start = 8 + header_len;
    uint64_t data_size = size - st->data_start;

    st->tensors = (SafeTensor*)callocCheck(header.length ? header.length : 1, sizeof(SafeTensor));
    for (size_t k = 0; k < header.length; k++) {
        const JsonMember* m = &header.members[k];
        const JsonValue* v = &m->value;
        char name[128], what[64]; // as the messages show them (escaped: a NUL or a newline in a name stays visible)
        json_escaped(name, sizeof(name), m->key, m->key_length);
        // names are C strings from here on: a NUL inside one would cut it short ("w\u0000a" and
        // "w\u0000b" would both be "w"), so it is refused
        if (memchr(m->key, '\0', m->key_length) != NULL) {
            fatal("%s: tensor name \"%s\" holds a NUL byte (\\u0000)", path, name);
        }
        if (strcmp(m->key, "__metadata__") == 0) {
            if (v->type != JSON_OBJECT) { fatal("%s: __metadata__ is %s, not an object", path, json_type_name(v->type)); }
            for (size_t j = 0; j < v->length; j++) {
                if (v->members[j].value.type != JSON_STRING) {
                    json_escaped(what, sizeof(what), v->members[j].key, v->members[j].key_length);
                    fatal("%s: __metadata__ \"%s\" is %s, not a string", path, what,
                          json_type_name(v->members[j].value.type));
                }
            }
            continue;
        }
        SafeTensor* t = &st->tensors[st->n++];
        t->name = (char*)mallocCheck(m->key_length + 1);
        memcpy(t->name, m->key, m->key_length + 1);
        if (v->type != JSON_OBJECT) { fatal("%s: tensor %s is %s, not an object", path, name, json_type_name(v->type)); }
        const JsonValue* dtype = json_get(v, "dtype");
        const JsonValue* shape = json_get(v, "shape");
        const JsonValue* offsets = json_get(v, "data_offsets");
        if (dtype == NULL || shape == NULL || offsets == NULL || v->length != 3) {
            fatal("%s: tensor %s needs exactly the keys dtype, shape and data_offsets", path, name);
        }
        size_t elem = dtype->type == JSON_STRING && dtype->length < sizeof(t->dtype_name) &&
                      strlen(dtype->string) == dtype->length ? safetensors_dtype_size(dtype->string) : 0;
        if (elem == 0) {
            fatal("%s: tensor %s has an unknown dtype %s", path, name, dtype->type != JSON_STRING ? "(not a string)"
                  : json_escaped(what, sizeof(what), dtype->string, dtype->length));
        }
        strcpy(t->dtype_name, dtype->string);
        t->dtype = strcmp(t->dtype_name, "F32") == 0 ? ST_F32 : strcmp(t->dtype_name, "BF16") == 0 ? ST_BF16
                 : strcmp(t->dtype_name, "F16") == 0 ? ST_F16 : ST_OTHER;
        if (shape->type != JSON_ARRAY || shape->length > SAFETENSORS_MAX_DIMS) {
            fatal("%s: tensor %s: shape must be an array of at most %d integers", path, name, SAFETENSORS_MAX_DIMS);
        }
        t->ndim = (int)shape->length;
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            const JsonValue* s = &shape->items[d];
            if (s->type != JSON_NUMBER || !s->is_integer || s->integer < 0) {
                fatal("%s: tensor %s: shape must be an array of non-negative integers", path, name);
            }
            t->shape[d] = s->integer;
            if (s->integer > 0 && numel > UINT64_MAX / (uint64_t)s->integer) { fatal("%s: tensor %s: shape too large", path, name); }
            numel *= (uint64_t)s->integer;
        }
        if (offsets->type != JSON_ARRAY || offsets->length != 2) {
            fatal("%s: tensor %s: data_offsets must be an array of two integers", path, name);
        }
        for (int j = 0; j < 2; j++) {
            const JsonValue* o = &offsets->items[j];
            if (o->type != JSON_NUMBER || !o->is_integer || o->integer < 0) {
                fatal("%s: tensor %s: data_offsets must be non-negative integers", path, name);
            }
        }
        t->begin = (uint64_t)offsets->items[0].integer;
        t->end = (uint64_t)offsets->items[1].integer;
        if (t->begin > t->end || t->end > data_size) {
            fatal("%s: tensor %s: data_offsets [%llu, %llu] are outside the %llu bytes of data (truncated file?)", path,
                  name, (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)data_size);
        }
        if (numel > UINT64_MAX / elem || t->end - t->begin != numel * elem) {
            char s[128];
            safetensors_shape_string(t, s, sizeof(s));
            fatal("%s: tensor %s: %llu bytes of data for a %s tensor of shape %s", path, name,
                  (unsigned long long)(t->end - t->begin), t->dtype_name, s);
        }
    }
    json_free(&header);
    // the tensors must tile the data: no overlap, no gap, nothing after the last
    SafeTensor** order = (SafeTensor**)mallocCheck((st->n ? st->n : 1) * sizeof(SafeTensor*));
    for (int k = 0; k < st->n; k++) { order[k] = &st->tensors[k]; }
    qsort(order, st->n, sizeof(SafeTensor*), safetensors_offset_cmp);
    uint64_t at = 0;
    for (int k = 0; k < st->n; k++) {
        if (order[k]->begin < at) { fatal("%s: tensors %s and %s overlap", path, order[k - 1]->name, order[k]->name); }
        if (order[k]->begin > at) {
            fatal("%s: data bytes %llu to %llu belong to no tensor", path, (unsigned long long)at, (unsigned long long)order[k]->begin);
        }
        at = order[k]->end;
    }
    if (at != data_size) {
        fatal("%s: the tensors end at data byte %llu but the file has %llu bytes of data", path, (unsigned long long)at,
              (unsigned long long)data_size);
    }
    free(order);
}

// the tensor called name, NULL if there is none
static inline const SafeTensor* safetensors_find(const SafeTensors* st, const char* name) {
    for (int k = 0; k < st->n; k++) {
        if (strcmp(st->tensors[k].name, name) == 0) { return &st->tensors[k]; }
    }
    return NULL;
}

static inline float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// round to nearest even; a NaN keeps its sign and top payload bits (and stays a NaN)
static inline uint16_t float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
        uint16_t h = (uint16_t)(u >> 16);
        return (h & 0x7F) ? h : (uint16_t)(h | 0x40);
    }
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1)) >> 16);
}

static inline float f16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, mant = h & 0x3FF, u;
    if (exp == 0x1F) {
        u = sign | 0x7F800000u | (mant << 13);          // inf, NaN
    } else if (exp != 0) {
        u = sign | ((exp + 112) << 23) | (mant << 13);  // normal: rebias 15 -> 127
    } else if (mant == 0) {
        u = sign;                                       // zero
    } else {                                            // subnormal: normalise
        exp = 113;
        while (!(mant & 0x400)) { mant <<= 1; exp--; }
        u = sign | (exp << 23) | ((mant & 0x3FF) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// round to nearest even, overflow to inf; a NaN keeps its sign and top payload bits
static inline uint16_t float_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) {
        uint16_t m = (uint16_t)((a >> 13) & 0x3FF);
        return (uint16_t)(sign | 0x7C00 | (m ? m : 0x200));
    }
    if (a >= 0x477FF000u) { return (uint16_t)(sign | 0x7C00); } // rounds to 65520 or more: inf
    if (a < 0x38800000u) {                                      // below 2^-14: a subnormal or zero
        if (a < 0x33000000u) { return sign; }                   // below half the smallest subnormal
        uint32_t mant = (a & 0x7FFFFF) | 0x800000, shift = 126 - (a >> 23); // 14..24
        uint32_t h = mant >> shift, rest = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rest > half || (rest == half && (h & 1))) { h++; }
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((a >> 13) - (112u << 10)), rest = a & 0x1FFF;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) { h++; }
    return (uint16_t)(sign | h);
}

// reads tensor t (F32, BF16 or F16) into out as fp32, in chunks
static inline void safetensors_read(const SafeTensors* st, const SafeTensor* t, float* out) {
    if (t->dtype == ST_OTHER) {
        fatal("%s: tensor %s is %s; only F32, BF16 and F16 tensors can be read", st->path, t->name, t->dtype_name);
    }
    size_t elem = t->dtype == ST_F32 ? 4 : 2;
    size_t n = (size_t)((t->end - t->begin) / elem);
    const size_t chunk = (size_t)1 << 22;
    unsigned char* buf = (unsigned char*)mallocCheck(chunk * elem);
    fseekCheck(st->fp, (long)(st->data_start + t->begin), SEEK_SET);
    for (size_t done = 0; done < n;) {
        size_t k = n - done < chunk ? n - done : chunk;
        freadCheck(buf, elem, k, st->fp);
        if (t->dtype == ST_F32) {
            memcpy(out + done, buf, k * 4);
        } else {
            for (size_t j = 0; j < k; j++) {
                uint16_t h = (uint16_t)(buf[2 * j] | (buf[2 * j + 1] << 8));
                out[done + j] = t->dtype == ST_BF16 ? bf16_to_float(h) : f16_to_float(h);
            }
        }
        done += k;
    }
    free(buf);
}

static inline void safetensors_close(SafeTensors* st) {
    for (int k = 0; k < st->n; k++) { free(st->tensors[k].name); }
    free(st->tensors);
    if (st->fp) { fclose(st->fp); }
    free(st->path);
    memset(st, 0, sizeof(*st));
}

// one tensor to write: fp32 data of the given shape, or with transposed (2-D only) the row-major
// data of its transpose ([shape[1], shape[0]]), transposed on the way out
typedef struct {
    const char* name;
    int ndim;
    int64_t shape[SAFETENSORS_MAX_DIMS];
    const float* data;
    int transposed;
} SafeTensorOut;

// writes the tensors, in the order given, as dtype (ST_F32, ST_BF16 or ST_F16) with the metadata
// {"format": "pt"} that transformers expects; the header is padded with spaces to a multiple of 8
// bytes so that the data is aligned. Atomic: a temporary file renamed into place.
static inline void safetensors_write(const char* path, const SafeTensorOut* ts, int n, SafeDtype dtype) {
    const char* dname = dtype == ST_F32 ? "F32" : dtype == ST_BF16 ? "BF16" : "F16";
    size_t elem = dtype == ST_F32 ? 4 : 2;
    // the header, written to memory first for its length
    char* header = NULL;
    size_t header_len = 0;
    FILE* mem = open_memstream(&header, &header_len);
    if (mem == NULL) { fatal("open_memstream: %s", strerror(errno)); }
    fprintf(mem, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t offset = 0;
    for (int k = 0; k < n; k++) {
        uint64_t numel = 1;
        fputc(',', mem);
        json_write_string(mem, ts[k].name, strlen(ts[k].name));
        fprintf(mem, ":{\"dtype\":\"%s\",\"shape\":[", dname);
        for (int d = 0; d < ts[k].ndim; d++) {
            fprintf(mem, "%s%lld", d ? "," : "", (long long)ts[k].shape[d]);
            numel *= (uint64_t)ts[k].shape[d];
        }
        fprintf(mem, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)offset, (unsigned long long)(offset + numel * elem));
        offset += numel * elem;
    }
    fputc('}', mem);
    fclose(mem);
    while ((8 + header_len) % 8 != 0) {
        header = (char*)reallocCheck(header, header_len + 1);
        header[header_len++] = ' ';
    }
    char tmp[4096];
    FILE* fp = atomic_open(path, tmp, sizeof(tmp));
    unsigned char len8[8];
    for (int k = 0; k < 8; k++) { len8[k] = (unsigned char)((uint64_t)header_len >> (8 * k)); }
    fwriteCheck(len8, 1, 8, fp);
    fwriteCheck(header, 1, header_len, fp);
    free(header);
    const size_t chunk = (size_t)1 << 22;
    float* fbuf = (float*)mallocCheck(chunk * sizeof(float));
    uint16_t* hbuf = (uint16_t*)mallocCheck(chunk * sizeof(uint16_t));
    for (int k = 0; k < n; k++) {
        size_t numel = 1;
        for (int d = 0; d < ts[k].ndim; d++) { numel *= (size_t)ts[k].shape[d]; }
        if (dtype == ST_F32 && !ts[k].transposed) {
            fwriteCheck(ts[k].data, 4, numel, fp);
            continue;
        }
        size_t R = (size_t)ts[k].shape[0], C = ts[k].ndim == 2 ? (size_t)ts[k].shape[1] : 1;
        for (size_t done = 0; done < numel;) {
            size_t c = numel - done < chunk ? numel - done : chunk;
            for (size_t j = 0; j < c; j++) {
                size_t at = done + j; // element (at / C, at % C) of the written tensor
                float f = ts[k].transposed ? ts[k].data[(at % C) * R + at / C] : ts[k].data[at];
                if (dtype == ST_F32) { fbuf[j] = f; }
                else { hbuf[j] = dtype == ST_BF16 ? float_to_bf16(f) : float_to_f16(f); }
            }
            if (dtype == ST_F32) { fwriteCheck(fbuf, 4, c, fp); }
            else { fwriteCheck(hbuf, 2, c, fp); }
            done += c;
        }
    }
    free(fbuf);
    free(hbuf);
    atomic_commit(fp, tmp, path);
}

#endif // LLMC_SAFETENSORS_H
