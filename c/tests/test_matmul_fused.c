/* matmul_fused against separate matmul calls, bit for bit, in every kernel set this CPU runs: one
 * parallel region over all the matrices' tiles must give each row what its own matmul gives, at
 * any thread count (only the split of the tiles between threads changes). Decode (T=1), a small
 * batch and a batch past the 16-position tile; q8/q4/q6 with a low-bit matrix in one group, and a
 * group of low-bit matrices alone, with and without biases. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels/kernels.h"
#include "kernels/lowbit_quantize.h"
#include "kernels/ops.h"

enum { COLS = 2048 };

static float rnd(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return ((*s >> 8) / 16777216.0f) * 2 - 1;
}

static QMat make_matrix(QType qt, int rows, unsigned *seed) {
    const size_t rb = qtype_row_bytes(qt, COLS);
    unsigned char *data = malloc(rb * rows);
    float wf[COLS];
    for (int r = 0; r < rows; r++) {
        for (int i = 0; i < COLS; i++) wf[i] = rnd(seed) + (r % 5 == 2 ? 0.5f : 0);
        CHECK(quantize_row_weighted(qt, wf, NULL, COLS, data + r * rb) == 0, "%s row written", qtype_name(qt));
    }
    return (QMat){qt, rows, COLS, rb, data};
}

static void check_group(int n, const QType *types, const int *rows, int with_bias, unsigned *seed) {
    QMat w[MATMUL_FUSE_MAX];
    const QMat *wp[MATMUL_FUSE_MAX];
    float *bias[MATMUL_FUSE_MAX], *want[MATMUL_FUSE_MAX], *got[MATMUL_FUSE_MAX];
    const int T_list[] = {1, 3, 17}, threads_list[] = {1, 2, 3}, threads_before = omp_get_max_threads();
    for (int i = 0; i < n; i++) {
        w[i] = make_matrix(types[i], rows[i], seed);
        wp[i] = &w[i];
        bias[i] = NULL;
        if (with_bias) {
            bias[i] = malloc(sizeof(float) * rows[i]);
            for (int r = 0; r < rows[i]; r++) bias[i][r] = rnd(seed);
        }
    }
    for (int ti = 0; ti < 3; ti++) {
        const int T = T_list[ti];
        float *x = malloc(sizeof(float) * T * COLS);
        for (int i = 0; i < T * COLS; i++) x[i] = rnd(seed) * (i % 11 == 3 ? 20 : 1);
        for (int i = 0; i < n; i++) {
            want[i] = malloc(sizeof(float) * T * rows[i]);
            got[i] = malloc(sizeof(float) * T * rows[i]);
        }
        omp_set_num_threads(1);
        for (int i = 0; i < n; i++) matmul(want[i], x, T, wp[i], bias[i]);
        for (int th = 0; th < 3; th++) {
            omp_set_num_threads(threads_list[th]);
            for (int i = 0; i < n; i++) memset(got[i], 0xff, sizeof(float) * T * rows[i]); /* NaN where unwritten */
            matmul_fused(n, got, x, T, wp, (const float *const *)bias);
            int same = 1;
            for (int i = 0; i < n; i++) same &= !memcmp(got[i], want[i], sizeof(float) * T * rows[i]);
            CHECK(same, "%s: fused group of %d (%s first) T=%d threads=%d differs from separate matmuls", kern.name, n,
                  qtype_name(types[0]), T, threads_list[th]);
            for (int i = 0; i < n; i++) matmul(got[i], x, T, wp[i], bias[i]);
            same = 1;
            for (int i = 0; i < n; i++) same &= !memcmp(got[i], want[i], sizeof(float) * T * rows[i]);
            CHECK(same, "%s: matmul T=%d threads=%d differs from one thread", kern.name, T, threads_list[th]);
        }
        for (int i = 0; i < n; i++) {
            free(want[i]);
            free(got[i]);
        }
        free(x);
    }
    omp_set_num_threads(threads_before);
    for (int i = 0; i < n; i++) {
        free((void *)w[i].data);
        free(bias[i]);
    }
}

void test_matmul_fused(void) {
    const QType mixed[] = {QT_Q8, QT_Q4, QT_Q6, QT_IQ4_XS}, lowbit[] = {QT_Q2_K, QT_Q3_K};
    const int mixed_rows[] = {520, 136, 131, 72}, lowbit_rows[] = {264, 100};
    for (int isa = KI_COUNT - 1; isa >= 0; isa--) {
        if (!kernels_supported((KernIsa)isa)) continue;
        CHECK(kernels_use((KernIsa)isa) == 0, "kernel set %s", kernels_isa_name((KernIsa)isa));
        unsigned seed = 11;
        check_group(4, mixed, mixed_rows, 1, &seed);
        check_group(2, lowbit, lowbit_rows, 0, &seed);
        check_group(3, mixed, mixed_rows, 0, &seed);
    }
    kernels_init(0);
}
