/*
 A deadline for whatever the process does next. In a data-parallel run a
 collective waits for every process, so a process that died or hangs would
 leave the others waiting forever inside NCCL or a device synchronisation,
 where no error ever comes back. Instead the training loop arms the watchdog
 before each phase (a step, a validation, a checkpoint) and disarms it after
 (with several processes; a single process has no one to wait for);
 if a phase outlives its deadline, a background thread prints what was being
 waited for and ends the process (exit status 1). Checkpoints are written to
 a temporary name and renamed, so the last complete one stays usable.
*/
#ifndef LLMC_WATCHDOG_H
#define LLMC_WATCHDOG_H

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int running;
    int armed;
    struct timespec deadline;  // CLOCK_REALTIME, for pthread_cond_timedwait
    double seconds;
    char what[256];
} Watchdog;

static inline void* watchdog_main(void* arg) {
    Watchdog* w = (Watchdog*)arg;
    pthread_mutex_lock(&w->lock);
    while (w->running) {
        if (!w->armed) {
            pthread_cond_wait(&w->changed, &w->lock);
            continue;
        }
        if (pthread_cond_timedwait(&w->changed, &w->lock, &w->deadline) == ETIMEDOUT && w->armed) {
            fprintf(stderr, "error: %s did not finish within %g s: another process of the run died or hangs; "
                            "stopping (the last complete checkpoint is intact)\n", w->what, w->seconds);
            fflush(stdout);
            fflush(stderr);
            _exit(1); // not exit(): other threads may be stuck inside the CUDA driver
        }
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

// with enabled = 0 the watchdog stays off and arming it does nothing
static inline void watchdog_start(Watchdog* w, int enabled) {
    memset(w, 0, sizeof(*w));
    if (!enabled) { return; }
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->changed, NULL);
    w->running = 1;
    if (pthread_create(&w->thread, NULL, watchdog_main, w) != 0) {
        fprintf(stderr, "error: cannot start the watchdog thread\n");
        exit(1);
    }
}

// from now on, `what` must finish within `seconds` (printf-style description)
static inline void watchdog_arm(Watchdog* w, double seconds, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static inline void watchdog_arm(Watchdog* w, double seconds, const char* fmt, ...) {
    if (!w->running) { return; }
    pthread_mutex_lock(&w->lock);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->what, sizeof(w->what), fmt, ap);
    va_end(ap);
    clock_gettime(CLOCK_REALTIME, &w->deadline);
    w->deadline.tv_sec += (time_t)seconds;
    w->deadline.tv_nsec += (long)((seconds - (double)(time_t)seconds) * 1e9);
    if (w->deadline.tv_nsec >= 1000000000L) {
        w->deadline.tv_sec++;
        w->deadline.tv_nsec -= 1000000000L;
    }
    w->seconds = seconds;
    w->armed = 1;
    pthread_cond_signal(&w->changed);
    pthread_mutex_unlock(&w->lock);
}

static inline void watchdog_disarm(Watchdog* w) {
    if (!w->running) { return; }
    pthread_mutex_lock(&w->lock);
    w->armed = 0;
    pthread_cond_signal(&w->changed);
    pthread_mutex_unlock(&w->lock);
}

static inline void watchdog_stop(Watchdog* w) {
    if (!w->running) { return; }
    pthread_mutex_lock(&w->lock);
    w->running = 0;
    w->armed = 0;
    pthread_cond_signal(&w->changed);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->changed);
}

#endif // LLMC_WATCHDOG_H
