/* `colibri membw [--threads N] [--mib M]`: the memory read rate with N threads, each reading its
 * share of M MiB. `coli bench` reports decode's achieved bandwidth against it, measured with the
 * thread count decode ran with: a one-thread scan is a floor that two or more cores exceed.
 *
 * The rate is what the best of a few read patterns reaches, because which one feeds a core best
 * differs by CPU: one sequential stream, four or sixteen interleaved streams (more cache lines in
 * flight; the decode kernels read 16 weight rows at once), each without and with software
 * prefetch 512 bytes ahead. Measured, 1 thread: an AVX2 EPYC read 10.4-10.9 GB/s in one stream
 * and 20.6-25.0 in four prefetched ones; an AMX Xeon VM read 9.4-10.5 in one stream, 10.5-12.1
 * in four, and 5.6-7.5 with prefetch; a Zen 4 VM 19.2-19.3 in one or four and 24.9-25.4 in
 * sixteen (which both engines' decode had exceeded). Every thread owns a buffer it allocated and
 * first touched (its pages on its node), in 2 MiB pages as the engine holds its weights (Zen 4,
 * 2 threads: 44.6-46.7 GB/s in 4 KiB pages, 48.7-49.5 in 2 MiB ones).
 * Each pattern: best of 5 passes. */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/huge_alloc.h"

typedef uint64_t Chunk __attribute__((vector_size(32))); /* one 32-byte load */

#define MAX_STREAMS 16
#define PREFETCH 512

typedef struct {
    int streams, prefetch;
    const char *name;
} Pattern;

static const Pattern PATTERNS[] = {{1, 0, "1-stream"},          {4, 0, "4-stream"},          {16, 0, "16-stream"},
                                   {1, 1, "1-stream+prefetch"}, {4, 1, "4-stream+prefetch"}, {16, 1, "16-stream+prefetch"}};

/* Sum of the 64-bit words of p[0..n) (p 64-byte aligned, n a multiple of MAX_STREAMS * 8), read
 * as `streams` interleaved sequential streams, a cache line of each per step. */
#if defined(__x86_64__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static uint64_t read_streams(const uint64_t *p, size_t n, int streams, int prefetch) {
    const size_t per = n / (size_t)streams; /* words per stream, whole 64-byte lines */
    Chunk acc[MAX_STREAMS] = {{0}};
    for (size_t i = 0; i < per; i += 8)
        for (int k = 0; k < streams; k++) {
            const uint64_t *s = p + (size_t)k * per + i;
            if (prefetch) __builtin_prefetch((const char *)s + PREFETCH, 0, 0);
            acc[k] += *(const Chunk *)(const void *)s;
            acc[k] += *(const Chunk *)(const void *)(s + 4);
        }
    uint64_t sum = 0;
    for (int k = 0; k < streams; k++)
        for (int j = 0; j < 4; j++) sum += acc[k][j];
    return sum;
}

int membw_main(int argc, char **argv) {
    long threads = omp_get_max_threads(), mib = 1024;
    for (int i = 2; i < argc; i++) {
        long *dst = !strcmp(argv[i], "--threads") ? &threads : !strcmp(argv[i], "--mib") ? &mib : NULL;
        char *end = NULL;
        long v = dst && i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
        if (!dst || !end || *end || v < 1 || v > (dst == &mib ? 1L << 20 : 4096)) {
            fprintf(stderr, "usage: colibri membw [--threads N (1-4096)] [--mib M (1-1048576)]\n");
            return 2;
        }
        *dst = v, i++;
    }
    const size_t unit = MAX_STREAMS * 8, words = ((size_t)mib << 17) / (size_t)threads / unit * unit; /* per thread */
    if (words == 0) {
        fprintf(stderr, "colibri membw: %ld MiB is too little for %ld threads\n", mib, threads);
        return 2;
    }
    uint64_t **bufs = calloc((size_t)threads, sizeof *bufs);
    int failed = !bufs;
#pragma omp parallel num_threads((int)threads) reduction(| : failed)
    if (bufs) { /* allocated and first touched by the thread that reads it */
        uint64_t *b = huge_alloc(words * sizeof *b);
        if (b)
            for (size_t i = 0; i < words; i++) b[i] = i;
        bufs[omp_get_thread_num()] = b;
        failed |= !b || omp_get_num_threads() != threads; /* a smaller team would leave buffers unread */
    }
    double best = 0;
    const char *method = "";
    uint64_t sink = 0;
    for (size_t m = 0; m < sizeof PATTERNS / sizeof PATTERNS[0] && !failed; m++)
        for (int rep = 0; rep < 5; rep++) {
            const double t = omp_get_wtime();
#pragma omp parallel num_threads((int)threads) reduction(+ : sink)
            sink += read_streams(bufs[omp_get_thread_num()], words, PATTERNS[m].streams, PATTERNS[m].prefetch);
            const double dt = omp_get_wtime() - t;
            if (best == 0 || dt < best) best = dt, method = PATTERNS[m].name;
        }
    for (long i = 0; bufs && i < threads; i++) huge_free(bufs[i], words * sizeof **bufs);
    free(bufs);
    if (failed) {
        fprintf(stderr, "colibri membw: cannot allocate %ld MiB\n", mib);
        return 1;
    }
    printf("membw threads=%ld mib=%ld gb_s=%.2f check=%llu method=%s\n", threads, mib,
           (double)words * (double)threads * 8 / best / 1e9, (unsigned long long)(sink & 1), method);
    return 0;
}
