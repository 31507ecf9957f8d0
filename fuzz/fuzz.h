/*
 Support for the libFuzzer harnesses in fuzz/ (`make fuzz`) and for their replay as regression
 tests (`make test`: each harness built with g++ and the sanitizers, run on its seed corpus and on
 the inputs kept in fuzz/regressions/).

 The code under test reports bad input with fatal() (llmc/utils.h), which prints one line and
 calls exit(1): a designed error exit, not a crash. So that the fuzzer can go on in the same
 process, this header redirects, for the llmc headers included after it, exit() to a longjmp back
 to fuzz_run, and malloc/calloc/realloc/free and fopen/fclose to versions that record what is live,
 so that fuzz_run frees and closes what an input abandoned when it exited. An input that returns
 normally must leave nothing behind: a leak on a path without an error is reported as a crash.
 Whatever a harness calls runs on the calling thread (a fatal() on another thread could not return
 here), so the data loader harness uses one shard, whose loader never starts its prefetch thread.

 A harness defines fuzz_one(data, size) and includes this header before any llmc header.
*/
#ifndef FUZZ_FUZZ_H
#define FUZZ_FUZZ_H

// every system header the llmc headers use, before the macros below exist
#include <errno.h>
#include <glob.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>
#include <ftw.h>

static void fuzz_one(const uint8_t* data, size_t size);

// ----------------------------------------------------------------------------
// what an input holds: allocations (an open-addressing set of pointers) and open files. Its probes
// depend on the addresses, which differ from run to run (ASLR): the fuzzer must not see them as
// coverage, or a run of a fixed seed and count would not repeat itself. So these functions are not
// instrumented, nor inlined into code that is (which would instrument them after all).
#ifdef __clang__
#define FUZZ_UNCOVERED __attribute__((no_sanitize("coverage"), noinline))
#else
#define FUZZ_UNCOVERED
#endif

static void** fuzz_live = NULL;      // slots: NULL empty, FUZZ_GONE a removed entry, else a live pointer
static size_t fuzz_live_cap = 0, fuzz_live_used = 0, fuzz_live_count = 0;
static FILE* fuzz_files[64];
static int fuzz_armed = 0;           // inside fuzz_run: exit() jumps back, allocations are recorded
static jmp_buf fuzz_jump;
static void* const FUZZ_GONE = (void*)&fuzz_live;

static inline size_t fuzz_slot(const void* p) { return (size_t)(((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull); }

FUZZ_UNCOVERED static inline void fuzz_track(void* p);

FUZZ_UNCOVERED static inline void fuzz_grow(void) {
    void** old = fuzz_live;
    size_t old_cap = fuzz_live_cap;
    fuzz_live_cap = old_cap ? 2 * old_cap : 1024;
    fuzz_live = (void**)calloc(fuzz_live_cap, sizeof(void*));
    if (fuzz_live == NULL) { abort(); }
    fuzz_live_used = fuzz_live_count = 0;
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i] != NULL && old[i] != FUZZ_GONE) { fuzz_track(old[i]); }
    }
    free(old);
}

FUZZ_UNCOVERED static inline void fuzz_track(void* p) {
    if (p == NULL || !fuzz_armed) { return; }
    if (2 * (fuzz_live_used + 1) > fuzz_live_cap) { fuzz_grow(); }
    size_t mask = fuzz_live_cap - 1, i = fuzz_slot(p) & mask;
    while (fuzz_live[i] != NULL && fuzz_live[i] != FUZZ_GONE) { i = (i + 1) & mask; }
    if (fuzz_live[i] == NULL) { fuzz_live_used++; }
    fuzz_live[i] = p;
    fuzz_live_count++;
}

// removes p from the set; 0 if it was not there (allocated before fuzz_run, or by libc)
FUZZ_UNCOVERED static inline int fuzz_untrack(void* p) {
    if (p == NULL || fuzz_live_cap == 0) { return 0; }
    size_t mask = fuzz_live_cap - 1;
    for (size_t i = fuzz_slot(p) & mask; fuzz_live[i] != NULL; i = (i + 1) & mask) {
        if (fuzz_live[i] == p) { fuzz_live[i] = FUZZ_GONE; fuzz_live_count--; return 1; }
    }
    return 0;
}

FUZZ_UNCOVERED static inline void* fuzz_malloc(size_t n) { void* p = malloc(n); fuzz_track(p); return p; }
FUZZ_UNCOVERED static inline void* fuzz_calloc(size_t k, size_t n) { void* p = calloc(k, n); fuzz_track(p); return p; }
FUZZ_UNCOVERED static inline void fuzz_free(void* p) { fuzz_untrack(p); free(p); }
FUZZ_UNCOVERED static inline void* fuzz_realloc(void* old, size_t n) {
    int tracked = fuzz_untrack(old);
    void* p = realloc(old, n);
    if (p == NULL && n > 0) { if (tracked) { fuzz_track(old); } return NULL; }
    if (tracked || old == NULL) { fuzz_track(p); }
    return p;
}

FUZZ_UNCOVERED static inline FILE* fuzz_fopen(const char* path, const char* mode) {
    FILE* fp = fopen(path, mode);
    for (int i = 0; fp != NULL && fuzz_armed && i < 64; i++) {
        if (fuzz_files[i] == NULL) { fuzz_files[i] = fp; break; }
    }
    return fp;
}

FUZZ_UNCOVERED static inline int fuzz_fclose(FILE* fp) {
    for (int i = 0; i < 64; i++) {
        if (fuzz_files[i] == fp) { fuzz_files[i] = NULL; }
    }
    return fclose(fp);
}

__attribute__((noreturn)) static inline void fuzz_exit(int code) {
    if (fuzz_armed) { longjmp(fuzz_jump, 1); }
    exit(code);
}

// runs fuzz_one on one input; an exit() inside returns here, and what the input left is released
FUZZ_UNCOVERED static inline void fuzz_run(const uint8_t* data, size_t size) {
    fuzz_armed = 1;
    int exited = setjmp(fuzz_jump);
    if (!exited) { fuzz_one(data, size); }
    fuzz_armed = 0;
    int files = 0;
    for (int i = 0; i < 64; i++) {
        if (fuzz_files[i] != NULL) { fclose(fuzz_files[i]); fuzz_files[i] = NULL; files++; }
    }
    if (!exited && (fuzz_live_count > 0 || files > 0)) {
        fprintf(stderr, "fuzz: an input that returned normally left %zu allocations and %d files behind\n",
                fuzz_live_count, files);
        abort();
    }
    for (size_t i = 0; i < fuzz_live_cap; i++) {
        if (fuzz_live[i] != NULL && fuzz_live[i] != FUZZ_GONE) { free(fuzz_live[i]); }
        fuzz_live[i] = NULL;
    }
    fuzz_live_used = fuzz_live_count = 0;
}

// removes one entry of the harness's directory (nftw callback)
static inline int fuzz_remove_entry(const char* path, const struct stat* st, int flag, struct FTW* ftw) {
    return remove(path);
}

static char fuzz_dir[128]; // this process's files, removed when it exits normally

static inline void fuzz_remove_dir(void) { nftw(fuzz_dir, fuzz_remove_entry, 8, FTW_DEPTH | FTW_PHYS); }

// <a directory of this process's own>/name, for the files a harness writes
static inline const char* fuzz_path(const char* name) {
    static char path[256];
    if (fuzz_dir[0] == '\0') {
        snprintf(fuzz_dir, sizeof(fuzz_dir), "%s/llmc_fuzz_%d", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp",
                 (int)getpid());
        if (mkdir(fuzz_dir, 0700) != 0 && errno != EEXIST) { perror(fuzz_dir); abort(); }
        atexit(fuzz_remove_dir);
    }
    snprintf(path, sizeof(path), "%s/%s", fuzz_dir, name);
    return path;
}

// the input written to fuzz_path(name), for the loaders that take a path
static inline const char* fuzz_write_file(const char* name, const uint8_t* data, size_t size) {
    const char* path = fuzz_path(name);
    FILE* fp = fopen(path, "wb");
    if (fp == NULL || fwrite(data, 1, size, fp) != size || fclose(fp) != 0) { perror(path); abort(); }
    return path;
}

#ifdef FUZZ_REPLAY
// the regression test: every file of the target's seed corpus and kept inputs, once each
static inline int fuzz_replay_dir(const char* dir) {
    DIR* d = opendir(dir);
    if (d == NULL) { return 0; }
    int count = 0;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') { continue; }
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        FILE* fp = fopen(path, "rb");
        if (fp == NULL) { continue; }
        fseek(fp, 0, SEEK_END);
        long size = ftell(fp);
        fseek(fp, 0, SEEK_SET);
        uint8_t* data = (uint8_t*)malloc(size > 0 ? (size_t)size : 1);
        size_t got = fread(data, 1, (size_t)size, fp);
        fclose(fp);
        fuzz_run(data, got);
        free(data);
        count++;
    }
    closedir(d);
    return count;
}

int main(void) {
    int seeds = fuzz_replay_dir("build/fuzz/seeds/" FUZZ_TARGET);
    int kept = fuzz_replay_dir("fuzz/regressions/" FUZZ_TARGET);
    if (seeds == 0) {
        printf("no seeds in build/fuzz/seeds/" FUZZ_TARGET " (make build/fuzz/seeds makes them)\n");
        printf("fuzz_" FUZZ_TARGET ": 0 passed, 1 failed\n");
        return 1;
    }
    // reaching here is the test: a crash or a sanitizer report ends the process first
    printf("fuzz_" FUZZ_TARGET ": %d seeds and %d kept inputs replayed\n", seeds, kept);
    printf("fuzz_" FUZZ_TARGET ": %d passed, 0 failed\n", seeds + kept);
    return 0;
}
#else
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz_run(data, size);
    return 0;
}
#endif

// from here on, the code under test allocates, opens and exits through the functions above
#define malloc(n) fuzz_malloc(n)
#define calloc(k, n) fuzz_calloc(k, n)
#define realloc(p, n) fuzz_realloc(p, n)
#define free(p) fuzz_free(p)
#define fopen(path, mode) fuzz_fopen(path, mode)
#define fclose(fp) fuzz_fclose(fp)
#define exit(code) fuzz_exit(code)

#endif // FUZZ_FUZZ_H
