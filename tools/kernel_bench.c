/* One quantized matmul timed under each kernel set named, on random weights: the fastest of
 * repeated calls over about a second each. A dev tool, not part of the engine:
 *   gcc -O2 -std=c11 -D_GNU_SOURCE -fopenmp -Ic -o build/kernel_bench tools/kernel_bench.c \
 *       $(find c -name '*.c' ! -path 'c/tests/*' ! -name main.c) -lm
 *   OMP_NUM_THREADS=1 build/kernel_bench ROWS COLS T TYPE SET [SET...]   e.g. 2048 2048 512 q4 avx512 amx
 * TYPE: q8, q6, q4, or a low-bit type (q2_k, iq2_xxs, ...): those the converter writes are quantized,
 * the others are random blocks. A set named SET:nopack runs its low-bit dots on the activation
 * blocks as they are, not on lowbit_pack_act's copy. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/lowbit_quantize.h"
#include "kernels/ops.h"
#include "kernels/quant.h"

static float rnd(unsigned *s) { *s = *s * 1664525u + 1013904223u; return ((*s >> 8) / 16777216.0f) * 2 - 1; }

int main(int argc, char **argv) {
    QType qt;
    if (argc < 6 || qtype_from_name(argv[4], &qt) || (qt != QT_Q8 && qt != QT_Q6 && qt != QT_Q4 && qt < QT_Q2_K)) {
        fprintf(stderr, "usage: %s ROWS COLS T q8|q6|q4|LOWBIT SET[:nopack] [SET...]\n", argv[0]);
        return 2;
    }
    const int rows = atoi(argv[1]), cols = atoi(argv[2]), T = atoi(argv[3]);
    if (rows < 1 || cols < 1 || T < 1) { fprintf(stderr, "ROWS, COLS and T must be positive\n"); return 2; }
    unsigned seed = 1;
    const size_t rb = qtype_row_bytes(qt, cols);
    if (!rb) { fprintf(stderr, "%s rows need a multiple of its block in COLS\n", argv[4]); return 2; }
    unsigned char *w = malloc(rb * rows);
    float *wf = malloc(sizeof(float) * cols), *x = malloc(sizeof(float) * T * cols), *y = malloc(sizeof(float) * T * rows);
    for (int r = 0; r < rows; r++) {
        for (int i = 0; i < cols; i++) wf[i] = rnd(&seed);
        if (qt < QT_Q2_K) quantize_row(qt, wf, cols, w + r * rb);
        else if (!qtype_writable(qt) || quantize_row_weighted(qt, wf, NULL, cols, w + r * rb))
            for (size_t i = 0; i < rb; i++) w[r * rb + i] = (unsigned char)(rnd(&seed) * 127 + 128);
    }
    for (size_t i = 0; i < (size_t)T * cols; i++) x[i] = rnd(&seed);
    const QMat m = {qt, rows, cols, rb, w};
    for (int k = 5; k < argc; k++) {
        KernIsa isa;
        char name[32];
        snprintf(name, sizeof name, "%s", argv[k]);
        char *colon = strchr(name, ':');
        if (colon) *colon = 0;
        if (kernels_isa_from_name(name, &isa) || kernels_use(isa)) { printf("%-8s not runnable here\n", argv[k]); continue; }
        if (colon && !strcmp(colon + 1, "nopack")) kern.lowbit_pack = 0;
        matmul(y, x, T, &m, NULL);
        double best = 1e9, t0 = omp_get_wtime();
        for (int reps = 0; omp_get_wtime() - t0 < 1.0 || reps < 3; reps++) {
            double t = omp_get_wtime();
            matmul(y, x, T, &m, NULL);
            t = omp_get_wtime() - t;
            best = t < best ? t : best;
        }
        /* weight bytes over time: against `colibri membw` once the matrix is past the caches */
        printf("%-14s %s %dx%d T=%d: %.3f ms  %.1f GMAC/s  %.2f GB/s of weights\n", argv[k], argv[4], rows, cols, T,
               best * 1e3, (double)rows * cols * T / best / 1e9, (double)rb * rows / best / 1e9);
    }
    free(w); free(wf); free(x); free(y);
    return 0;
}
