/*
 A minimal test harness. Each CHECK counts one passed or failed assertion;
 test_summary() prints "<name>: N passed, M failed" and returns the exit code.
*/
#ifndef TEST_TEST_H
#define TEST_TEST_H

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "llmc/utils.h"

static int test_passed = 0;
static int test_failed = 0;

#define CHECK(cond, ...) do {                                          \
    if (cond) { test_passed++; }                                       \
    else {                                                             \
        test_failed++;                                                 \
        fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
        fprintf(stderr, __VA_ARGS__);                                  \
        fprintf(stderr, "\n");                                         \
    }                                                                  \
} while (0)

static inline int test_summary(const char* name) {
    printf("%s: %d passed, %d failed\n", name, test_passed, test_failed);
    return test_failed == 0 ? 0 : 1;
}

// ----------------------------------------------------------------------------
// a private temporary directory for test files, and running code that is
// expected to exit (fatal errors) in a child process

static char tmp_dir[64];

// a path by value, so several can be alive at once
typedef struct { char s[128]; } Path;

// <tmp_dir>/<name>; our names are short, the bound keeps -Wformat-truncation quiet
static inline Path tmp_path(const char* name) {
    Path p;
    snprintf(p.s, sizeof(p.s), "%s/%.60s", tmp_dir, name);
    return p;
}

static inline int file_exists(const char* path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static inline long size_of(const char* path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

// creates /tmp/<name>_XXXXXX as tmp_dir
static inline void make_tmp_dir(const char* name) {
    snprintf(tmp_dir, sizeof(tmp_dir), "/tmp/%.30s_XXXXXX", name);
    if (mkdtemp(tmp_dir) == NULL) { fatal("mkdtemp: %s", strerror(errno)); }
}

// overwrites 4 bytes at offset (a crafted field of a file)
static inline void poke(const char* path, long offset, int32_t value) {
    FILE* fp = fopenCheck(path, "r+b");
    fseekCheck(fp, offset, SEEK_SET);
    fwriteCheck(&value, 4, 1, fp);
    fcloseCheck(fp);
}

// the first `bytes` bytes of the file at from (at most its size) into the file at to
static inline void copy_prefix(const char* from, const char* to, long bytes) {
    FILE* in = fopenCheck(from, "rb");
    FILE* out = fopenCheck(to, "wb");
    for (long i = 0; i < bytes; i++) {
        int c = fgetc(in);
        if (c == EOF) { break; }
        fputc(c, out);
    }
    fcloseCheck(in);
    fcloseCheck(out);
}

// run fn(arg) in a child with stderr captured; returns its exit status, stderr in out
static inline int run_child(void (*fn)(const void*), const void* arg, char* out, size_t outlen) {
    const Path log_path = tmp_path("child_stderr.txt");
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        if (freopen(log_path.s, "w", stderr) == NULL) { _exit(99); }
        fn(arg);
        exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    FILE* fp = fopenCheck(log_path.s, "rb");
    size_t n = fread(out, 1, outlen - 1, fp);
    out[n] = '\0';
    fcloseCheck(fp);
    remove(log_path.s);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// runs fn(arg) in a child and checks that it exits 1 with one line "error: ..." holding want
static inline void expect_child_error(void (*fn)(const void*), const void* arg, const char* want) {
    char err[1024];
    int rc = run_child(fn, arg, err, sizeof(err));
    CHECK(rc == 1, "expected exit 1, got %d (%s)", rc, err);
    CHECK(strncmp(err, "error: ", 7) == 0 && strstr(err, want) != NULL, "message '%s' lacks '%s'", err, want);
    CHECK(strchr(err, '\n') == strrchr(err, '\n'), "message is not one line: %s", err);
}

static inline void remove_tmp_dir(void) {
    DIR* dir = opendir(tmp_dir);
    if (dir == NULL) { return; }
    struct dirent* e;
    while ((e = readdir(dir)) != NULL) {
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) { remove(tmp_path(e->d_name).s); }
    }
    closedir(dir);
    rmdir(tmp_dir);
}

#endif // TEST_TEST_H
