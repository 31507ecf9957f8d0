/*
 XXH64 (xxHash's 64-bit hash, seed 0), the checksum of checkpoint files: four independent 64-bit
 multiply-rotate lanes over 32-byte stripes, several times faster than a table-driven CRC in
 portable C, so that it costs little beside the file I/O; any flipped bit changes it. Streaming:
 init, update with the bytes in any pieces, digest. The same values as the reference
 implementation (libxxhash's XXH64), which test_checkpoint checks.
*/
#ifndef LLMC_XXHASH_H
#define LLMC_XXHASH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define XXH_P1 11400714785074694791ull
#define XXH_P2 14029467366897019727ull
#define XXH_P3 1609587929392839161ull
#define XXH_P4 9650029242287828579ull
#define XXH_P5 2870177450012600261ull

typedef struct {
    uint64_t v[4];       // the four lanes over whole 32-byte stripes
    uint64_t total;      // bytes so far
    unsigned char buf[32];
    size_t buffered;     // bytes of an unfinished stripe in buf
} Xxh64;

static inline uint64_t xxh_rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// little-endian loads, as the format defines them (and every machine this project builds for is)
static inline uint64_t xxh_read64(const unsigned char* p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline uint32_t xxh_read32(const unsigned char* p) { uint32_t v; memcpy(&v, p, 4); return v; }

static inline uint64_t xxh_round(uint64_t acc, uint64_t input) {
    return xxh_rotl(acc + input * XXH_P2, 31) * XXH_P1;
}

static inline uint64_t xxh_merge(uint64_t h, uint64_t v) {
    return (h ^ xxh_round(0, v)) * XXH_P1 + XXH_P4;
}

static inline void xxh64_init(Xxh64* s) {
    memset(s, 0, sizeof(*s));
    s->v[0] = XXH_P1 + XXH_P2;
    s->v[1] = XXH_P2;
    s->v[2] = 0;
    s->v[3] = 0 - XXH_P1;
}

static inline void xxh64_stripe(Xxh64* s, const unsigned char* p) {
    for (int k = 0; k < 4; k++) { s->v[k] = xxh_round(s->v[k], xxh_read64(p + 8 * k)); }
}

static inline void xxh64_update(Xxh64* s, const void* data, size_t n) {
    const unsigned char* p = (const unsigned char*)data;
    s->total += n;
    if (s->buffered > 0) { // complete the stripe begun by an earlier update
        size_t take = 32 - s->buffered < n ? 32 - s->buffered : n;
        memcpy(s->buf + s->buffered, p, take);
        s->buffered += take;
        p += take;
        n -= take;
        if (s->buffered < 32) { return; }
        xxh64_stripe(s, s->buf);
        s->buffered = 0;
    }
    for (; n >= 32; p += 32, n -= 32) { xxh64_stripe(s, p); }
    memcpy(s->buf, p, n);
    s->buffered = n;
}

static inline uint64_t xxh64_digest(const Xxh64* s) {
    uint64_t h;
    if (s->total >= 32) {
        h = xxh_rotl(s->v[0], 1) + xxh_rotl(s->v[1], 7) + xxh_rotl(s->v[2], 12) + xxh_rotl(s->v[3], 18);
        for (int k = 0; k < 4; k++) { h = xxh_merge(h, s->v[k]); }
    } else {
        h = XXH_P5; // the seed (0) + P5
    }
    h += s->total;
    const unsigned char* p = s->buf;
    size_t n = s->buffered;
    for (; n >= 8; p += 8, n -= 8) { h = xxh_rotl(h ^ xxh_round(0, xxh_read64(p)), 27) * XXH_P1 + XXH_P4; }
    if (n >= 4) {
        h = xxh_rotl(h ^ (uint64_t)xxh_read32(p) * XXH_P1, 23) * XXH_P2 + XXH_P3;
        p += 4;
        n -= 4;
    }
    for (; n > 0; p++, n--) { h = xxh_rotl(h ^ *p * XXH_P5, 11) * XXH_P1; }
    h ^= h >> 33;
    h *= XXH_P2;
    h ^= h >> 29;
    h *= XXH_P3;
    h ^= h >> 32;
    return h;
}

#endif // LLMC_XXHASH_H
