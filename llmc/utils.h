/*
 Small helpers shared by every binary and test: checked versions of the libc
 calls that can fail (they print the file, what was expected and what failed,
 then exit), a one-line fatal error for bad input, where the default data is
 found, and OpenMP's wait policy. Files written through atomic_open are
 registered until atomic_commit, so that a fatal error (a full disk, say)
 removes their partial "<path>.tmp" instead of leaving it behind.
*/
#ifndef LLMC_UTILS_H
#define LLMC_UTILS_H

#include <errno.h>
#include <glob.h>
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

// what to do instead, known to the caller of a step that may fail: while set, a fatal error adds it to its line
static const char* fatal_hint = NULL;

// print "error: <message>" on one line and exit(1); for bad input and bad flags
__attribute__((noreturn, format(printf, 1, 2)))
static inline void fatal(const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, args);
    if (fatal_hint != NULL) { fprintf(stderr, "; %s", fatal_hint); }
    fprintf(stderr, "\n");
    va_end(args);
    atomic_remove_partial();
    exit(EXIT_FAILURE);
}

// the path of an open file, for messages: the file an atomic write makes (not its temporary file),
// else what the kernel says the descriptor is
static inline const char* file_name(FILE* fp, char* buf, size_t len) {
    pthread_mutex_lock(&atomic_files_lock);
    for (int i = 0; i < ATOMIC_MAX_OPEN; i++) {
        if (atomic_files[i].fp == fp) {
            snprintf(buf, len, "%.*s", (int)strlen(atomic_files[i].tmp_path) - 4, atomic_files[i].tmp_path);
            fp = NULL;
            break;
        }
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

// (the errors below name the file and what failed, not the source line: they are for the user)
static inline FILE* fopenCheck(const char* path, const char* mode) {
    FILE* fp = fopen(path, mode);
    if (fp == NULL) {
        fatal("cannot %s %s: %s", strchr(mode, 'r') && !strchr(mode, '+') ? "open" : "write", path, strerror(errno));
    }
    return fp;
}

static inline void freadCheck(void* ptr, size_t size, size_t nmemb, FILE* stream) {
    size_t got = fread(ptr, size, nmemb, stream);
    if (got != nmemb) {
        char name[4096];
        if (ferror(stream)) { fatal("cannot read %s: %s", file_name(stream, name, sizeof(name)), strerror(errno)); }
        fatal("%s ends early: read %zu of %zu items of %zu bytes", file_name(stream, name, sizeof(name)), got, nmemb,
              size);
    }
}

static inline void fwriteCheck(const void* ptr, size_t size, size_t nmemb, FILE* stream) {
    if (fwrite(ptr, size, nmemb, stream) != nmemb) {
        char name[4096];
        fatal("cannot write %s: %s", file_name(stream, name, sizeof(name)), strerror(errno));
    }
}

static inline void fcloseCheck(FILE* fp) {
    char name[4096];
    file_name(fp, name, sizeof(name));
    if (fclose(fp) != 0) { fatal("cannot close %s: %s", name, strerror(errno)); }
}

static inline void fseekCheck(FILE* fp, long off, int whence) {
    if (fseek(fp, off, whence) != 0) {
        char name[4096];
        fatal("cannot seek in %s: %s", file_name(fp, name, sizeof(name)), strerror(errno));
    }
}

static inline void* mallocCheck(size_t size) {
    void* ptr = malloc(size);
    if (ptr == NULL && size > 0) { fatal("out of host memory allocating %zu bytes", size); }
    return ptr;
}

static inline void* callocCheck(size_t nmemb, size_t size) {
    void* ptr = calloc(nmemb, size);
    if (ptr == NULL && nmemb > 0 && size > 0) { fatal("out of host memory allocating %zu x %zu bytes", nmemb, size); }
    return ptr;
}

static inline void* reallocCheck(void* old, size_t size) {
    void* ptr = realloc(old, size);
    if (ptr == NULL && size > 0) { fatal("out of host memory growing a buffer to %zu bytes", size); }
    return ptr;
}

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
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) { fatal("%s exists and is not a directory", path); }
}

// Atomic file writes: the data goes to "<path>.tmp", which atomic_commit syncs
// and renames over path, so a crash never leaves a half-written file behind
// under path, and a fatal error in between removes the .tmp.
static inline FILE* atomic_open(const char* path, char* tmp_path, size_t tmp_len) {
    if ((size_t)snprintf(tmp_path, tmp_len, "%s.tmp", path) >= tmp_len) { fatal("path too long: %s", path); }
    FILE* fp = fopen(tmp_path, "wb");
    if (fp == NULL) { fatal("cannot write %s: %s", path, strerror(errno)); }
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
    if (fflush(fp) != 0 || fsync(fileno(fp)) != 0) { fatal("cannot write %s: %s", path, strerror(errno)); }
    fcloseCheck(fp);
    if (rename(tmp_path, path) != 0) { fatal("cannot rename %s to %s: %s", tmp_path, path, strerror(errno)); }
    pthread_mutex_lock(&atomic_files_lock);
    for (int i = 0; i < ATOMIC_MAX_OPEN; i++) {
        if (atomic_files[i].fp == fp) { atomic_files[i].fp = NULL; }
    }
    pthread_mutex_unlock(&atomic_files_lock);
}

// A default input (data/r50k_base.tiktoken, the data/corpus_*.bin shards; a path or a glob): as given
// when it is found from the working directory, else under the binary's directory (the repository's
// root, where make puts the binaries), so that they run from anywhere. Found in neither: an error that
// says where it looked and which flag names another. The path returned lives as long as the process.
static inline const char* default_input(const char* path, const char* flag) {
    glob_t g;
    int found = glob(path, 0, NULL, &g) == 0;
    globfree(&g);
    if (found) { return path; }
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) { fatal("%s (the default of %s) is not under the working directory: give %s", path, flag, flag); }
    exe[n] = '\0';
    *strrchr(exe, '/') = '\0'; // (an absolute path has one)
    size_t len = strlen(exe) + 1 + strlen(path) + 1;
    char* beside = (char*)mallocCheck(len);
    snprintf(beside, len, "%s/%s", exe, path);
    found = glob(beside, 0, NULL, &g) == 0;
    globfree(&g);
    if (!found) {
        char cwd[4096];
        if (getcwd(cwd, sizeof(cwd)) == NULL) { snprintf(cwd, sizeof(cwd), "."); }
        fatal("%s (the default of %s) is neither under the working directory %s nor under the binary's %s: give %s",
              path, flag, cwd, exe, flag);
    }
    return beside;
}

// OpenMP threads that reach a barrier first spin while they wait (libgomp: up to 300000 polls), which on
// a CPU shared with busy processes takes the time of the very threads they wait for: generation on 2
// cores beside two busy processes ran at 2-6 tok/s, and at 190-250 with passive waits, which sleep
// (dev/RESULTS.md). libgomp reads OMP_WAIT_POLICY once, before main, so a binary started without it (or
// GOMP_SPINCOUNT) sets it and runs itself again; a policy that the user set is kept.
static inline void omp_wait_passively(char** argv) {
    if (getenv("OMP_WAIT_POLICY") != NULL || getenv("GOMP_SPINCOUNT") != NULL) { return; }
    if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) { return; }
    execv("/proc/self/exe", argv); // returns only if it failed: the run goes on, spinning
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
