/*
 The llm.c token shard format: a header of 256 little-endian int32 ([0] magic,
 [1] version, [2] number of tokens N), then N little-endian tokens.
 magic 20240520 + version 1: uint16 tokens (GPT-2); magic 20240801 + version 7:
 uint32 tokens (Llama-3). The file is exactly 1024 + N * token size bytes.
 shard_write writes one atomically; shard_read_header / shard_load validate
 one and report the problem as a single line naming the file.
*/
#ifndef LLMC_SHARD_H
#define LLMC_SHARD_H

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llmc/utils.h"

#define SHARD_HEADER_INTS 256
#define SHARD_HEADER_BYTES (SHARD_HEADER_INTS * 4)
#define SHARD_MAGIC_U16 20240520
#define SHARD_VERSION_U16 1
#define SHARD_MAGIC_U32 20240801
#define SHARD_VERSION_U32 7
// room for a message that names a path of up to PATH_MAX bytes
#define SHARD_ERR_LEN 8192

// what the header of a valid shard says
typedef struct {
    size_t num_tokens;
    int token_bytes; // 2 or 4
} ShardInfo;

// one shard's tokens in memory, kept in the file's encoding so that a uint16
// shard costs 2 bytes a token; read them with shard_token()
typedef struct {
    uint8_t* data;     // num_tokens * token_bytes bytes, little-endian, no header
    size_t capacity;   // bytes allocated at data, reused by the next shard_load
    size_t num_tokens;
    int token_bytes;
} Shard;

static inline uint32_t shard_token(const Shard* s, size_t i) {
    // decoded byte by byte: the format is little-endian whatever the host is
    const uint8_t* p = s->data + i * (size_t)s->token_bytes;
    if (s->token_bytes == 2) {
        return (uint32_t)p[0] | ((uint32_t)p[1] << 8);
    }
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline void shard_put_le32(uint8_t* p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static inline int32_t shard_get_le32(const uint8_t* p) {
    uint32_t v = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
    int32_t s;
    memcpy(&s, &v, sizeof(s)); // two's complement reinterpretation without UB
    return s;
}

// write tokens[0..n) as a shard of token_bytes (2 or 4) per token; the file
// appears under path only once complete (<path>.tmp, fsync, rename)
static inline void shard_write(const char* path, const uint32_t* tokens, size_t n, int token_bytes) {
    if (token_bytes != 2 && token_bytes != 4) {
        fatal("%s: token size must be 2 or 4 bytes, got %d", path, token_bytes);
    }
    if (n == 0) {
        fatal("%s: refusing to write a shard with 0 tokens (readers reject it)", path);
    }
    if (n > (size_t)INT32_MAX) {
        fatal("%s: %zu tokens do not fit in one shard (at most %d)", path, n, INT32_MAX);
    }
    // check before creating anything, so a bad token leaves no file behind
    if (token_bytes == 2) {
        for (size_t i = 0; i < n; i++) {
            if (tokens[i] > UINT16_MAX) {
                fatal("%s: token %u at position %zu does not fit in a uint16 shard (use uint32 tokens)",
                      path, tokens[i], i);
            }
        }
    }
    uint8_t header[SHARD_HEADER_BYTES];
    memset(header, 0, sizeof(header));
    shard_put_le32(header + 0, token_bytes == 2 ? SHARD_MAGIC_U16 : SHARD_MAGIC_U32);
    shard_put_le32(header + 4, token_bytes == 2 ? SHARD_VERSION_U16 : SHARD_VERSION_U32);
    shard_put_le32(header + 8, (uint32_t)n);

    char tmp[4096];
    FILE* fp = atomic_open(path, tmp, sizeof(tmp));
    fwriteCheck(header, 1, sizeof(header), fp);
    // encode in chunks so memory stays small for large shards
    enum { CHUNK = 1 << 16 };
    uint8_t* buf = (uint8_t*)mallocCheck((size_t)CHUNK * 4);
    for (size_t start = 0; start < n; start += CHUNK) {
        size_t count = n - start < (size_t)CHUNK ? n - start : (size_t)CHUNK;
        for (size_t i = 0; i < count; i++) {
            uint32_t t = tokens[start + i];
            uint8_t* p = buf + i * (size_t)token_bytes;
            if (token_bytes == 2) {
                p[0] = (uint8_t)t;
                p[1] = (uint8_t)(t >> 8);
            } else {
                shard_put_le32(p, t);
            }
        }
        fwriteCheck(buf, (size_t)token_bytes, count, fp);
    }
    free(buf);
    atomic_commit(fp, tmp, path);
}

static inline int shard_error(char* err, size_t errlen, const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(err, errlen, fmt, args);
    va_end(args);
    return -1;
}

// open path and validate its header against the file size; on success returns
// 0 with *fp_out positioned at the first token (the caller closes it), else -1
// with a one-line message in err
static inline int shard_open(const char* path, ShardInfo* info, FILE** fp_out, char* err, size_t errlen) {
    FILE* fp = fopen(path, "rb");
    if (fp == NULL) {
        return shard_error(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    }
    long size = -1;
    if (fseek(fp, 0, SEEK_END) == 0) { size = ftell(fp); }
    if (size < 0 || fseek(fp, 0, SEEK_SET) != 0) {
        fclose(fp);
        return shard_error(err, errlen, "%s: cannot get file size: %s", path, strerror(errno));
    }
    if (size < SHARD_HEADER_BYTES) {
        fclose(fp);
        return shard_error(err, errlen, "%s: file is %ld bytes, smaller than the %d-byte shard header",
                           path, size, SHARD_HEADER_BYTES);
    }
    uint8_t header[SHARD_HEADER_BYTES];
    if (fread(header, 1, sizeof(header), fp) != sizeof(header)) {
        const char* why = ferror(fp) ? strerror(errno) : "file ends early";
        fclose(fp);
        return shard_error(err, errlen, "%s: cannot read the header: %s", path, why);
    }
    int32_t magic = shard_get_le32(header + 0);
    int32_t version = shard_get_le32(header + 4);
    int32_t n = shard_get_le32(header + 8);
    int token_bytes;
    if (magic == SHARD_MAGIC_U16) {
        token_bytes = 2;
    } else if (magic == SHARD_MAGIC_U32) {
        token_bytes = 4;
    } else {
        fclose(fp);
        return shard_error(err, errlen, "%s: bad magic %d (expected %d for uint16 or %d for uint32 shards)",
                           path, magic, SHARD_MAGIC_U16, SHARD_MAGIC_U32);
    }
    int expected_version = token_bytes == 2 ? SHARD_VERSION_U16 : SHARD_VERSION_U32;
    if (version != expected_version) {
        int other_version = token_bytes == 2 ? SHARD_VERSION_U32 : SHARD_VERSION_U16;
        fclose(fp);
        if (version == other_version) {
            return shard_error(err, errlen,
                               "%s: magic %d (uint%d shard) does not match version %d (a uint%d shard version); "
                               "expected version %d",
                               path, magic, token_bytes * 8, version, token_bytes == 2 ? 32 : 16, expected_version);
        }
        return shard_error(err, errlen, "%s: bad version %d (expected %d for magic %d, uint%d shards)",
                           path, version, expected_version, magic, token_bytes * 8);
    }
    if (n <= 0) {
        fclose(fp);
        return shard_error(err, errlen, "%s: header says %d tokens (a shard needs at least 1)", path, n);
    }
    long expected = SHARD_HEADER_BYTES + (long)n * token_bytes;
    if (size != expected) {
        fclose(fp);
        return shard_error(err, errlen, "%s: file is %ld bytes, header says %d tokens of %d bytes = %ld bytes (%s)",
                           path, size, n, token_bytes, expected, size < expected ? "truncated?" : "trailing bytes?");
    }
    info->num_tokens = (size_t)n;
    info->token_bytes = token_bytes;
    *fp_out = fp;
    return 0;
}

// validate only the header and file size of the shard at path (cheap: no tokens read)
static inline int shard_read_header(const char* path, ShardInfo* info, char* err, size_t errlen) {
    FILE* fp = NULL;
    if (shard_open(path, info, &fp, err, errlen) != 0) { return -1; }
    fclose(fp);
    return 0;
}

// load the whole shard at path into out and check every token is < vocab_size.
// out must be zeroed or a Shard from an earlier load, whose buffer is reused.
// Returns 0, or -1 with a one-line message in err (out then holds no tokens).
static inline int shard_load(const char* path, int vocab_size, Shard* out, char* err, size_t errlen) {
    out->num_tokens = 0;
    if (vocab_size <= 0) {
        return shard_error(err, errlen, "%s: vocab size must be positive, got %d", path, vocab_size);
    }
    ShardInfo info = {0, 0};
    FILE* fp = NULL;
    if (shard_open(path, &info, &fp, err, errlen) != 0) { return -1; }
    size_t bytes = info.num_tokens * (size_t)info.token_bytes;
    if (bytes > out->capacity) {
        free(out->data); // no realloc: the old contents need not be copied
        out->data = (uint8_t*)mallocCheck(bytes);
        out->capacity = bytes;
    }
    size_t got = fread(out->data, 1, bytes, fp);
    const char* why = ferror(fp) ? strerror(errno) : "file ends early";
    fclose(fp);
    if (got != bytes) {
        return shard_error(err, errlen, "%s: read %zu of %zu token bytes: %s", path, got, bytes, why);
    }
    out->token_bytes = info.token_bytes;
    out->num_tokens = info.num_tokens;
    for (size_t i = 0; i < info.num_tokens; i++) {
        uint32_t t = shard_token(out, i);
        if (t >= (uint32_t)vocab_size) {
            out->num_tokens = 0;
            return shard_error(err, errlen, "%s: token %u at position %zu is >= vocab size %d",
                               path, t, i, vocab_size);
        }
    }
    return 0;
}

// shard_load for the trainer: any problem is a fatal one-line error
static inline void shard_load_or_die(const char* path, int vocab_size, Shard* out) {
    char err[SHARD_ERR_LEN];
    if (shard_load(path, vocab_size, out, err, sizeof(err)) != 0) {
        fatal("%s", err);
    }
}

static inline void shard_free(Shard* s) {
    free(s->data);
    s->data = NULL;
    s->capacity = 0;
    s->num_tokens = 0;
}

#endif // LLMC_SHARD_H
