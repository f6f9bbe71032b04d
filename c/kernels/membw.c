/* `colibri membw [--threads N] [--mib M]`: the memory read rate with N threads, each reading its
 * share of an M MiB buffer (best of 5 passes). `coli bench` reports decode's achieved bandwidth
 * against it, measured with the thread count decode ran with: a one-thread scan is a floor that
 * two or more cores exceed. */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef uint64_t Line __attribute__((vector_size(64))); /* one cache line */

/* Sum of the 64-bit words of p[0..n) (p 64-byte aligned), a cache line per add in the widest
 * loads the CPU has: with word-sized loads one core keeps too few lines in flight and measured
 * 70-80 % of the rate of 64-byte loads (10.5 against 13.6 GB/s on one core, 19.8 against 24.6
 * on two). */
#if defined(__x86_64__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static uint64_t read_words(const uint64_t *p, size_t n) {
    Line a = {0}, b = {0};
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a += *(const Line *)(const void *)(p + i);
        b += *(const Line *)(const void *)(p + i + 8);
    }
    uint64_t s = 0;
    for (int k = 0; k < 8; k++) s += a[k] + b[k];
    for (; i < n; i++) s += p[i];
    return s;
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
    const size_t words = (size_t)mib << 17; /* 8-byte words in M MiB */
    uint64_t *buf = aligned_alloc(64, words * sizeof *buf);
    if (!buf) {
        fprintf(stderr, "colibri membw: cannot allocate %ld MiB\n", mib);
        return 1;
    }
#pragma omp parallel for num_threads((int)threads) schedule(static) /* each thread's pages first touched by it */
    for (size_t i = 0; i < words; i++) buf[i] = i;
    double best = 0;
    uint64_t sink = 0;
    for (int rep = 0; rep < 5; rep++) {
        const double t = omp_get_wtime();
#pragma omp parallel num_threads((int)threads) reduction(+ : sink)
        {
            const size_t n = (size_t)omp_get_num_threads(), id = (size_t)omp_get_thread_num();
            sink += read_words(buf + words * id / n, words * (id + 1) / n - words * id / n);
        }
        const double dt = omp_get_wtime() - t;
        if (rep == 0 || dt < best) best = dt;
    }
    free(buf);
    printf("membw threads=%ld mib=%ld gb_s=%.2f check=%llu\n", threads, mib, (double)words * 8 / best / 1e9,
           (unsigned long long)(sink & 1));
    return 0;
}
