/* Round trips of every storage type, and the AVX2 kernels against the portable reference. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "quant.h"

static float rnd(unsigned *s) { *s = *s * 1664525u + 1013904223u; return ((*s >> 8) / 16777216.0f) * 2 - 1; }

void test_quant(void) {
    unsigned seed = 7;
    const int cols_list[] = {32, 64, 96, 45, 7, 1000};
    for (size_t c = 0; c < sizeof cols_list / sizeof *cols_list; c++) {
        int cols = cols_list[c], padded = (cols + 31) / 32 * 32;
        float *x = malloc(sizeof(float) * padded), *y = malloc(sizeof(float) * padded), *z = malloc(sizeof(float) * padded);
        unsigned char *buf = malloc(qtype_row_bytes(QT_F32, padded));
        for (int i = 0; i < cols; i++) x[i] = rnd(&seed) * 3;
        /* worst-case error per element, relative to the row's absolute max */
        const float tol[QT_COUNT] = {0, 1.0f / 128, 1.0f / 1024, 1.0f / 127, 1.0f / 15 + 1e-3f};
        float amax = 0;
        for (int i = 0; i < cols; i++) amax = fmaxf(amax, fabsf(x[i]));
        for (int q = 0; q < QT_COUNT; q++) {
            quantize_row((QType)q, x, cols, buf);
            dequant_row((QType)q, buf, cols, y);
            float err = 0;
            for (int i = 0; i < cols; i++) err = fmaxf(err, fabsf(y[i] - x[i]));
            /* q4 step is range/15 with range <= 2*amax; rounding error is half a step */
            float bound = (q == QT_Q4 ? amax * (tol[q] + 2e-3f) : amax * tol[q]) + 1e-6f;
            CHECK(err <= bound, "%s cols=%d max error %g > %g", qtype_name((QType)q), cols, err, bound);
            memset(z, 0, sizeof(float) * padded);
            kern.dequant_row((QType)q, buf, cols, z);
            float diff = 0;
            for (int i = 0; i < cols; i++) diff = fmaxf(diff, fabsf(z[i] - y[i]));
            CHECK(diff == 0, "%s kernel %s differs from portable by %g (cols=%d)", qtype_name((QType)q), kern.name, diff, cols);
        }
        double ref = 0;
        for (int i = 0; i < cols; i++) ref += (double)x[i] * x[i];
        CHECK(fabs(kern.dot(x, x, cols) - ref) <= 1e-4 * ref + 1e-6, "dot(x, x) cols=%d", cols);
        free(x); free(y); free(z); free(buf);
    }
    /* exact cases */
    CHECK(f16_to_f32(f32_to_f16(1.5f)) == 1.5f, "f16 1.5");
    CHECK(f16_to_f32(f32_to_f16(65504.0f)) == 65504.0f, "f16 max");
    CHECK(isinf(f16_to_f32(f32_to_f16(1e6f))), "f16 overflow is inf");
    CHECK(f16_to_f32(f32_to_f16(5.960464477539063e-08f)) == 5.960464477539063e-08f, "f16 smallest subnormal");
    CHECK(bf16_to_f32(f32_to_bf16(1.00390625f)) == 1.0f, "bf16 ties to even (down)");
    CHECK(bf16_to_f32(f32_to_bf16(1.01171875f)) == 1.015625f, "bf16 ties to even (up)");
    CHECK(isnan(bf16_to_f32(f32_to_bf16(NAN))), "bf16 NaN stays NaN");
    QType q;
    CHECK(qtype_from_name("q4", &q) == 0 && q == QT_Q4, "q4 name");
    CHECK(qtype_from_name("q3", &q) == -1, "unknown qtype refused");
    float zero[32] = {0}, out[32];
    unsigned char blk[34];
    quantize_row(QT_Q8, zero, 32, blk);
    dequant_row(QT_Q8, blk, 32, out);
    CHECK(out[0] == 0 && out[31] == 0, "all-zero block round trips");
}
