/*
 Small helpers shared by every binary and test: checked versions of the libc
 calls that can fail (they print the file, what was expected and what failed,
 then exit), and a one-line fatal error for bad input. Files written through
 atomic_open are registered until atomic_commit, so that a fatal error (a full
 disk, say) removes their partial "<path>.tmp" instead of leaving it behind.
*/
#ifndef LLMC_UTILS_H
#define LLMC_UTILS_H

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

// the files between atomic_open and atomic_commit (a few at a time: each writer has one open)
#define ATOMIC_MAX_OPEN 16
typedef struct { FILE* fp; char tmp_path[4096]; } AtomicFile;
static AtomicFile atomic_files[ATOMIC_MAX_OPEN];
static pthread_mutex_t atomic_files_lock = PTHREAD_MUTEX_INITIALIZER;

// removes every partial "<path>.tmp" still open for writing (async-signal-safe but for the lock)
static inline void atomic_remove_partial(void) {
    pthread_mutex_lock(&atomic_files_lock);
    for (int i = 0; i < ATOMIC_MAX_OPEN; i++) {
        if (atomic_files[i].fp != NULL) { unlink(atomic_files[i].tmp_path); atomic_files[i].fp = NULL; }
    }
    pthread_mutex_unlock(&atomic_files_lock);
}

// print "error: <message>" on one line and exit(1); for bad input and bad flags
__attribute__((noreturn, format(printf, 1, 2)))
static inline void fatal(const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, args);
    fprintf(stderr, "\n");
    va_end(args);
    atomic_remove_partial();
    exit(EXIT_FAILURE);
}

// the path of an open file, for messages: the temporary file of an atomic write, else what the
// kernel says the descriptor is
static inline const char* file_name(FILE* fp, char* buf, size_t len) {
    pthread_mutex_lock(&atomic_files_lock);
    for (int i = 0; i < ATOMIC_MAX_OPEN; i++) {
        if (atomic_files[i].fp == fp) { snprintf(buf, len, "%s", atomic_files[i].tmp_path); fp = NULL; break; }
    }
    pthread_mutex_unlock(&atomic_files_lock);
    if (fp == NULL) { return buf; }
    char link[64];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fileno(fp));
    ssize_t n = readlink(link, buf, len - 1);
    if (n < 0) { snprintf(buf, len, "(file descriptor %d)", fileno(fp)); }
    else { buf[n] = '\0'; }
    return buf;
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
        char name[4096];
        if (ferror(stream)) {
            fatal("cannot read %s: %s [%s:%d]", file_name(stream, name, sizeof(name)), strerror(errno), file, line);
        }
        fatal("%s ends early: read %zu of %zu items of %zu bytes [%s:%d]", file_name(stream, name, sizeof(name)), got,
              nmemb, size, file, line);
    }
}
#define freadCheck(ptr, size, nmemb, stream) fread_check(ptr, size, nmemb, stream, __FILE__, __LINE__)

static inline void fwrite_check(const void* ptr, size_t size, size_t nmemb, FILE* stream, const char* file, int line) {
    if (fwrite(ptr, size, nmemb, stream) != nmemb) {
        char name[4096];
        fatal("cannot write %s: %s [%s:%d]", file_name(stream, name, sizeof(name)), strerror(errno), file, line);
    }
}
#define fwriteCheck(ptr, size, nmemb, stream) fwrite_check(ptr, size, nmemb, stream, __FILE__, __LINE__)

static inline void fclose_check(FILE* fp, const char* file, int line) {
    char name[4096];
    file_name(fp, name, sizeof(name));
    if (fclose(fp) != 0) {
        fatal("cannot close %s: %s [%s:%d]", name, strerror(errno), file, line);
    }
}
#define fcloseCheck(fp) fclose_check(fp, __FILE__, __LINE__)

static inline void fseek_check(FILE* fp, long off, int whence, const char* file, int line) {
    if (fseek(fp, off, whence) != 0) {
        char name[4096];
        fatal("cannot seek in %s: %s [%s:%d]", file_name(fp, name, sizeof(name)), strerror(errno), file, line);
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

// size of an open file in bytes; fatal() unless it is a regular file
static inline long file_size(FILE* fp) {
    struct stat st;
    char name[4096];
    if (fstat(fileno(fp), &st) != 0) { fatal("cannot stat %s: %s", file_name(fp, name, sizeof(name)), strerror(errno)); }
    if (!S_ISREG(st.st_mode)) {
        fatal("%s is %snot a regular file", file_name(fp, name, sizeof(name)), S_ISDIR(st.st_mode) ? "a directory, " : "");
    }
    return (long)st.st_size;
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
// and renames over path, so a crash never leaves a half-written file behind
// under path, and a fatal error in between removes the .tmp.
static inline FILE* atomic_open(const char* path, char* tmp_path, size_t tmp_len) {
    if ((size_t)snprintf(tmp_path, tmp_len, "%s.tmp", path) >= tmp_len) { fatal("path too long: %s", path); }
    FILE* fp = fopenCheck(tmp_path, "wb");
    pthread_mutex_lock(&atomic_files_lock);
    int slot = 0;
    while (slot < ATOMIC_MAX_OPEN && atomic_files[slot].fp != NULL) { slot++; }
    if (slot < ATOMIC_MAX_OPEN) {
        atomic_files[slot].fp = fp;
        snprintf(atomic_files[slot].tmp_path, sizeof(atomic_files[slot].tmp_path), "%s", tmp_path);
    }
    pthread_mutex_unlock(&atomic_files_lock);
    if (slot == ATOMIC_MAX_OPEN) { fclose(fp); unlink(tmp_path); fatal("more than %d files open for writing at once", ATOMIC_MAX_OPEN); }
    return fp;
}

static inline void atomic_commit(FILE* fp, const char* tmp_path, const char* path) {
    if (fflush(fp) != 0 || fsync(fileno(fp)) != 0) { fatal("cannot write %s: %s", tmp_path, strerror(errno)); }
    fcloseCheck(fp);
    if (rename(tmp_path, path) != 0) { fatal("cannot rename %s to %s: %s", tmp_path, path, strerror(errno)); }
    pthread_mutex_lock(&atomic_files_lock);
    for (int i = 0; i < ATOMIC_MAX_OPEN; i++) {
        if (atomic_files[i].fp == fp) { atomic_files[i].fp = NULL; }
    }
    pthread_mutex_unlock(&atomic_files_lock);
}

// seconds on a monotonic clock (differences only)
static inline double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// ----------------------------------------------------------------------------
// bf16 on the CPU: round to nearest even (NaN stays NaN), and the exact way back

static inline uint16_t bf16_from_float(float x) {
    uint32_t bits;
    memcpy(&bits, &x, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) { return (uint16_t)((bits >> 16) | 0x40); } // quiet NaN
    bits += 0x7fffu + ((bits >> 16) & 1);
    return (uint16_t)(bits >> 16);
}

static inline float float_from_bf16(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float x;
    memcpy(&x, &bits, 4);
    return x;
}

static inline float round_bf16(float x) { return float_from_bf16(bf16_from_float(x)); }

#endif // LLMC_UTILS_H
