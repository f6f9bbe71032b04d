/* The parallel expert path gives the serial expert loop's result bit for bit: random q4 experts,
 * positions that pick overlapping experts, two threads. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "util/fwd_alloc.h"
#include "experts/moe_exec.h"
#include "kernels/ops.h"

enum { E = 6, K = 2, H = 40, WIDTH = 24, T = 5 };

static float rnd(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return ((*s >> 8) / 16777216.0f) * 2 - 1;
}

static QMat random_mat(int rows, int cols, unsigned *seed) {
    QMat m = {QT_Q4, rows, cols, qtype_row_bytes(QT_Q4, cols), NULL};
    unsigned char *d = malloc(m.row_bytes * rows);
    float *r = malloc(sizeof(float) * cols);
    for (int i = 0; i < rows; i++) {
        for (int j = 0; j < cols; j++) r[j] = rnd(seed);
        quantize_row(QT_Q4, r, cols, d + i * m.row_bytes);
    }
    free(r);
    m.data = d;
    return m;
}

void test_moe_exec(void) {
    unsigned seed = 3;
    Mlp ex[E];
    memset(ex, 0, sizeof ex);
    for (int e = 0; e < E; e++) {
        ex[e].gate = random_mat(WIDTH, H, &seed);
        ex[e].up = random_mat(WIDTH, H, &seed);
        ex[e].down = random_mat(H, WIDTH, &seed);
    }
    float x[T * H], wts[T * K], want[T * H], got[T * H], y[T * H];
    int sel[T * K] = {4, 1, 1, 4, 0, 5, 4, 2, 1, 0}; /* expert 3 unused, 1 and 4 shared */
    for (int i = 0; i < T * H; i++) x[i] = rnd(&seed);
    for (int i = 0; i < T * K; i++) wts[i] = 0.5f + rnd(&seed) / 4;
    /* the serial loop of block_moe.c, written out: expert order, then position order */
    memset(want, 0, sizeof want);
    for (int e = 0; e < E; e++)
        for (int i = 0; i < T * K; i++) {
            if (sel[i] != e) continue;
            mlp_swiglu(&ex[e], x + (i / K) * H, 1, WIDTH, y);
            for (int d = 0; d < H; d++) want[(i / K) * H + d] += wts[i] * y[d];
        }
    const int threads = omp_get_max_threads();
    omp_set_num_threads(2);
    CHECK(moe_parallel_ok(T * K, 1e12) && !moe_parallel_ok(100000, 1e12), "decode-sized layers take the parallel path");
    CHECK(!moe_parallel_ok(T * K, 0), "work too small for a parallel region stays on the calling thread");
    memset(got, 0, sizeof got);
    CHECK(moe_run_experts_parallel(ex, E, K, WIDTH, H, sel, wts, x, T, got) == 0 && !fwd_oom(), "parallel experts ran");
    CHECK(!memcmp(got, want, sizeof got), "parallel experts equal the serial loop bit for bit");
    omp_set_num_threads(threads);
    for (int e = 0; e < E; e++) {
        free((void *)ex[e].gate.data);
        free((void *)ex[e].up.data);
        free((void *)ex[e].down.data);
    }
}
