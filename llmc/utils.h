/*
 Small helpers shared by every binary and test: checked versions of the libc
 calls that can fail (they print the file, line and what failed, then exit),
 and a one-line fatal error for bad input.
*/
#ifndef LLMC_UTILS_H
#define LLMC_UTILS_H

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

// print "error: <message>" on one line and exit(1); for bad input and bad flags
__attribute__((noreturn, format(printf, 1, 2)))
static inline void fatal(const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, args);
    fprintf(stderr, "\n");
    va_end(args);
    exit(EXIT_FAILURE);
}

static inline FILE* fopen_check(const char* path, const char* mode, const char* file, int line) {
    FILE* fp = fopen(path, mode);
    if (fp == NULL) {
        fatal("cannot open %s (mode %s): %s [%s:%d]", path, mode, strerror(errno), file, line);
    }
    return fp;
}
#define fopenCheck(path, mode) fopen_check(path, mode, __FILE__, __LINE__)

static inline void fread_check(void* ptr, size_t size, size_t nmemb, FILE* stream, const char* file, int line) {
    size_t got = fread(ptr, size, nmemb, stream);
    if (got != nmemb) {
        fatal("short read (%zu of %zu items%s) [%s:%d]", got, nmemb,
              feof(stream) ? ", file ends early" : "", file, line);
    }
}
#define freadCheck(ptr, size, nmemb, stream) fread_check(ptr, size, nmemb, stream, __FILE__, __LINE__)

static inline void fwrite_check(const void* ptr, size_t size, size_t nmemb, FILE* stream, const char* file, int line) {
    if (fwrite(ptr, size, nmemb, stream) != nmemb) {
        fatal("write failed: %s [%s:%d]", strerror(errno), file, line);
    }
}
#define fwriteCheck(ptr, size, nmemb, stream) fwrite_check(ptr, size, nmemb, stream, __FILE__, __LINE__)

static inline void fclose_check(FILE* fp, const char* file, int line) {
    if (fclose(fp) != 0) {
        fatal("close failed: %s [%s:%d]", strerror(errno), file, line);
    }
}
#define fcloseCheck(fp) fclose_check(fp, __FILE__, __LINE__)

static inline void fseek_check(FILE* fp, long off, int whence, const char* file, int line) {
    if (fseek(fp, off, whence) != 0) {
        fatal("seek failed: %s [%s:%d]", strerror(errno), file, line);
    }
}
#define fseekCheck(fp, off, whence) fseek_check(fp, off, whence, __FILE__, __LINE__)

static inline void* malloc_check(size_t size, const char* file, int line) {
    void* ptr = malloc(size);
    if (ptr == NULL && size > 0) {
        fatal("out of host memory allocating %zu bytes [%s:%d]", size, file, line);
    }
    return ptr;
}
#define mallocCheck(size) malloc_check(size, __FILE__, __LINE__)

static inline void* calloc_check(size_t nmemb, size_t size, const char* file, int line) {
    void* ptr = calloc(nmemb, size);
    if (ptr == NULL && nmemb > 0 && size > 0) {
        fatal("out of host memory allocating %zu x %zu bytes [%s:%d]", nmemb, size, file, line);
    }
    return ptr;
}
#define callocCheck(nmemb, size) calloc_check(nmemb, size, __FILE__, __LINE__)

static inline void* realloc_check(void* old, size_t size, const char* file, int line) {
    void* ptr = realloc(old, size);
    if (ptr == NULL && size > 0) {
        fatal("out of host memory growing a buffer to %zu bytes [%s:%d]", size, file, line);
    }
    return ptr;
}
#define reallocCheck(old, size) realloc_check(old, size, __FILE__, __LINE__)

// size of an open file in bytes
static inline long file_size(FILE* fp) {
    long here = ftell(fp);
    fseekCheck(fp, 0, SEEK_END);
    long size = ftell(fp);
    fseekCheck(fp, here, SEEK_SET);
    return size;
}

// mkdir -p: creates path and its missing parents
static inline void make_dir(const char* path) {
    char buf[4096];
    if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf)) { fatal("path too long: %s", path); }
    for (char* p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) { fatal("cannot create directory %s: %s", buf, strerror(errno)); }
            *p = c;
            if (c == '\0') { break; }
        }
    }
}

// Atomic file writes: the data goes to "<path>.tmp", which atomic_commit syncs
// and renames over path, so a crash never leaves a half-written file behind.
static inline FILE* atomic_open(const char* path, char* tmp_path, size_t tmp_len) {
    if ((size_t)snprintf(tmp_path, tmp_len, "%s.tmp", path) >= tmp_len) { fatal("path too long: %s", path); }
    return fopenCheck(tmp_path, "wb");
}

static inline void atomic_commit(FILE* fp, const char* tmp_path, const char* path) {
    if (fflush(fp) != 0 || fsync(fileno(fp)) != 0) { fatal("cannot flush %s: %s", tmp_path, strerror(errno)); }
    fcloseCheck(fp);
    if (rename(tmp_path, path) != 0) { fatal("cannot rename %s to %s: %s", tmp_path, path, strerror(errno)); }
}

// seconds on a monotonic clock (differences only)
static inline double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#endif // LLMC_UTILS_H
