/*
 A minimal test harness. Each CHECK counts one passed or failed assertion;
 test_summary() prints "<name>: N passed, M failed" and returns the exit code.
*/
#ifndef TEST_TEST_H
#define TEST_TEST_H

#include <math.h>
#include <stdio.h>

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

#endif // TEST_TEST_H
