/* Attention over an f16 KV cache timed under each kernel set named, on random data: one KV
 * head's group of query heads for T positions after DEPTH cached ones (a prefill chunk at
 * depth; T = 1 is a decode step), the cache laid out as the GQA block stores it (K then V of
 * every KV head per position). Per position (attend) and, where the kernels have it, in blocks
 * of TQ positions (attend_block). The fastest of repeated runs over about a second. A dev
 * tool, not part of the engine:
 *   gcc -O2 -std=c11 -D_GNU_SOURCE -fopenmp -Ic -o build/kv_attend_bench tools/kv_attend_bench.c \
 *       $(ls c/*/*.c | grep -v c/engine/main.c) -lm
 *   OMP_NUM_THREADS=1 build/kv_attend_bench DEPTH T G HD KVHEADS TQ SET [SET...]
 *   e.g. 4096 512 8 128 4 8 portable avx2 avx512
 * KVB_COLD=1 reads the cache from memory (T = 1: one decode step of one layer's KV head). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_kernels.h"
#include "ops.h"
#include "quant.h"

static float rnd(unsigned *s) { *s = *s * 1664525u + 1013904223u; return ((*s >> 8) / 16777216.0f) * 2 - 1; }

/* KVB_COLD=1: a 64 MB buffer is read between the runs, so that the cache rows come from memory
 * as in a model's decode step, where every layer's weights pass through the caches in between. */
static unsigned char *evict_buf;
static volatile unsigned evict_sink;
static void evict(void) {
    const size_t n = (size_t)64 << 20;
    if (!evict_buf) {
        evict_buf = malloc(n);
        memset(evict_buf, 1, n);
    }
    unsigned a = 0;
    for (size_t i = 0; i < n; i += 64) a += evict_buf[i];
    evict_sink = a;
}

static double best_of(double (*run)(void *), void *ctx) {
    const int cold = getenv("KVB_COLD") && atoi(getenv("KVB_COLD"));
    double best = 1e30, spent = 0;
    for (int i = 0; i < 50 && (spent < 1.0 || i < 2); i++) {
        if (cold) evict();
        double t = run(ctx);
        spent += t;
        best = t < best ? t : best;
    }
    return best;
}

typedef struct {
    const KvKernels *kk;
    int depth, T, g, hd, tq;
    size_t stride;
    const unsigned char *cache;
    const float *q;
    float *sc, *o;
} Ctx;

static double run_single(void *p) {
    Ctx *c = p;
    double t0 = omp_get_wtime();
    for (int t = 0; t < c->T; t++)
        c->kk->attend(c->q + (size_t)t * c->g * c->hd, c->g, c->hd, c->cache, c->cache + (size_t)c->hd * 2, c->stride,
                      c->depth + t + 1, 1.0f / 11.3f, NULL, c->sc, c->o + (size_t)t * c->g * c->hd);
    return omp_get_wtime() - t0;
}

#ifdef KV_ATT_KT
static double run_block(void *p) {
    Ctx *c = p;
    const size_t step = (size_t)c->g * c->hd;
    double t0 = omp_get_wtime();
    for (int t = 0; t < c->T; t += c->tq) {
        const int tc = c->T - t < c->tq ? c->T - t : c->tq;
        c->kk->attend_block(c->q + t * step, step, tc, c->g, c->hd, c->cache, c->cache + (size_t)c->hd * 2, c->stride,
                            c->depth + t + 1, 0, 1.0f / 11.3f, NULL, c->sc, c->o + t * step, step);
    }
    return omp_get_wtime() - t0;
}
#endif

int main(int argc, char **argv) {
    if (argc < 8) {
        fprintf(stderr, "usage: %s DEPTH T G HD KVHEADS TQ SET [SET...]\n", argv[0]);
        return 2;
    }
    const int depth = atoi(argv[1]), T = atoi(argv[2]), g = atoi(argv[3]), hd = atoi(argv[4]), nkv = atoi(argv[5]);
    const int tq = atoi(argv[6]);
    if (depth < 0 || T < 1 || g < 1 || hd < 1 || nkv < 1 || tq < 1) { fprintf(stderr, "sizes must be positive\n"); return 2; }
    const int N = depth + T;
    const size_t stride = (size_t)2 * nkv * hd * 2;
    unsigned seed = 1;
    unsigned char *cache = malloc(stride * N);
    float *row = malloc(sizeof(float) * hd), *q = malloc(sizeof(float) * T * g * hd), *o = malloc(sizeof(float) * T * g * hd);
    for (int j = 0; j < N; j++)
        for (int h = 0; h < 2 * nkv; h++) {
            for (int d = 0; d < hd; d++) row[d] = rnd(&seed);
            kv_store_row(QT_F16, row, hd, cache + j * stride + (size_t)h * hd * 2);
        }
    for (int i = 0; i < T * g * hd; i++) q[i] = 2 * rnd(&seed);
    double flops = 0;
    for (int t = 0; t < T; t++) flops += 4.0 * g * hd * (depth + t + 1);
    for (int a = 7; a < argc; a++) {
        int isa = -1;
        for (int k = 0; k < KI_COUNT; k++)
            if (!strcmp(argv[a], kernels_isa_name((KernIsa)k))) isa = k;
        if (isa < 0 || !kernels_supported((KernIsa)isa)) { printf("%-9s not available\n", argv[a]); continue; }
        Ctx c = {kv_kernels_for((KernIsa)isa, QT_F16), depth, T, g, hd, tq, stride, cache, q, NULL, o};
#ifdef KV_ATT_KT
        c.sc = malloc(sizeof(float) * kv_attend_scratch(tq, g, hd, N));
#else
        c.sc = malloc(sizeof(float) * (size_t)g * N);
#endif
        double s = best_of(run_single, &c);
        printf("%-9s per position: %8.2f ms  %6.1f GFLOP/s", argv[a], s * 1e3, flops / s * 1e-9);
#ifdef KV_ATT_KT
        double b = best_of(run_block, &c);
        printf("   blocks of %d: %8.2f ms  %6.1f GFLOP/s", tq, b * 1e3, flops / b * 1e-9);
#endif
        printf("\n");
        free(c.sc);
    }
    free(cache); free(row); free(q); free(o);
    return 0;
}
