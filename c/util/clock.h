/* Monotonic time for the engine's own measurements (TTFT, I/O wait, grammar time). */
#ifndef COLI_CLOCK_H
#define COLI_CLOCK_H
#include <time.h>

static inline double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

#endif
