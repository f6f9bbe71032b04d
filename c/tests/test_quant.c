/* Round trips of every storage type, every kernel set this CPU runs (AVX2, AVX-512, VNNI, AMX) against the
 * portable reference, and the integer (quantized-activation) dots of q8/q4 weights. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels/ops.h"
#include "kernels/kernels.h"

static float rnd(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return ((*s >> 8) / 16777216.0f) * 2 - 1;
}

static void test_qdot(void);
static void test_quant_kernels(void);

/* f32_to_f16 over a spread of all float bit patterns below the f16 range: its result is the
 * nearest f16 (neither neighbour is closer) and a tie goes to the even one. */
static void check_f16_nearest_even(void) {
    int bad = 0;
    for (uint64_t i = 0; i < (1ull << 31); i += 2053) {
        uint32_t u = (uint32_t)i;
        float f;
        memcpy(&f, &u, 4);
        if (!(f < 65504.0f)) break; /* the bit patterns grow with the value */
        const uint16_t h = f32_to_f16(f);
        const double e = fabs((double)f - f16_to_f32(h));
        const double up = fabs((double)f - f16_to_f32((uint16_t)(h + 1)));
        const double down = h ? fabs((double)f - f16_to_f32((uint16_t)(h - 1))) : 1e30;
        bad += e > up || e > down || ((e == up || e == down) && (h & 1));
    }
    CHECK(bad == 0, "f16 conversion: %d values not rounded to the nearest even f16", bad);
}

void test_quant(void) {
    for (int isa = KI_COUNT - 1; isa >= 0; isa--) {
        if (!kernels_supported((KernIsa)isa)) continue;
        CHECK(kernels_use((KernIsa)isa) == 0 && kern.isa == (KernIsa)isa, "kernel set %s", kernels_isa_name((KernIsa)isa));
        test_quant_kernels();
    }
    KernIsa isa;
    CHECK(kernels_isa_from_name("avx512", &isa) == 0 && isa == KI_AVX512 && kernels_isa_from_name("sse", &isa) == -1,
          "kernel names");
    CHECK(kernels_use(KI_COUNT) == -1, "an unknown kernel set is refused");
    kernels_init(0);
}

static void test_quant_kernels(void) {
    unsigned seed = 7;
    const int cols_list[] = {32, 64, 96, 45, 7, 1000};
    for (size_t c = 0; c < sizeof cols_list / sizeof *cols_list; c++) {
        int cols = cols_list[c], padded = (cols + 31) / 32 * 32;
        float *x = malloc(sizeof(float) * padded), *y = malloc(sizeof(float) * padded), *z = malloc(sizeof(float) * padded);
        unsigned char *buf = malloc(qtype_row_bytes(QT_F32, padded));
        for (int i = 0; i < cols; i++) x[i] = rnd(&seed) * 3;
        /* worst-case error per element, relative to the row's absolute max */
        /* mxfp4: the scale 2^e puts amax in (3, 6]; the widest code step there is 2 (4 to 6), so
         * the error is at most one scale unit, under amax / 3 */
        const float tol[QT_Q2_K] = {0, 1.0f / 128, 1.0f / 1024, 1.0f / 127, 1.0f / 15 + 1e-3f, 1.0f / 3, 1.0f / 62 + 1e-3f};
        float amax = 0;
        for (int i = 0; i < cols; i++) amax = fmaxf(amax, fabsf(x[i]));
        for (int q = 0; q < QT_Q2_K; q++) { /* the types quantize_row writes (not GGUF's low-bit ones) */
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
        free(x);
        free(y);
        free(z);
        free(buf);
    }
    /* exact cases */
    CHECK(f16_to_f32(f32_to_f16(1.5f)) == 1.5f, "f16 1.5");
    CHECK(f16_to_f32(f32_to_f16(65504.0f)) == 65504.0f, "f16 max");
    CHECK(isinf(f16_to_f32(f32_to_f16(1e6f))), "f16 overflow is inf");
    CHECK(f16_to_f32(f32_to_f16(5.960464477539063e-08f)) == 5.960464477539063e-08f, "f16 smallest subnormal");
    CHECK(f32_to_f16(65519.0f) == 0x7bff && f32_to_f16(65520.0f) == 0x7c00, "f16 rounds to max, ties to inf");
    CHECK(f32_to_f16(2.98023223876953125e-08f) == 0 && f32_to_f16(2.99e-08f) == 1, "f16 half the smallest subnormal ties to 0");
    CHECK(f32_to_f16(-0.0f) == 0x8000 && f32_to_f16(NAN) == 0x7e00 && f32_to_f16(-INFINITY) == 0xfc00, "f16 signs, NaN, inf");
    check_f16_nearest_even();
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
    test_qdot();
}

/* ---- quantized activations x q8/q4 weights ---- */

static QAct act_alloc(int T, int cols) {
    int nb = (cols + QBLOCK - 1) / QBLOCK;
    QAct a = {nb,  T, malloc(sizeof(int16_t) * QBLOCK * nb * T), malloc(sizeof(float) * nb * T), malloc(sizeof(float) * nb * T),
              NULL};
    return a;
}

static void act_free(QAct *a) {
    free(a->q);
    free(a->d);
    free(a->s);
}

static int act_equal(const QAct *a, const QAct *b, int T) {
    size_t n = (size_t)a->nb * T;
    return !memcmp(a->q, b->q, n * QBLOCK * sizeof(int16_t)) && !memcmp(a->d, b->d, n * sizeof(float)) &&
           !memcmp(a->s, b->s, n * sizeof(float));
}

/* Random weights and activations: portable and SIMD agree, and both are within the activation
 * quantization error of the double-precision dot of the dequantized weights. */
static void check_qdot_random(QType qt, int cols, const Kernels *port, const Kernels *fast, unsigned *seed) {
    enum { T = 6, ROWS = 3 };
    const int nb = (cols + QBLOCK - 1) / QBLOCK;
    const size_t rb = qtype_row_bytes(qt, cols);
    float *x = malloc(sizeof(float) * T * cols), *wf = malloc(sizeof(float) * nb * QBLOCK);
    float *wd = malloc(sizeof(float) * ROWS * nb * QBLOCK);
    unsigned char *w = malloc(rb * ROWS);
    for (int i = 0; i < T * cols; i++) x[i] = rnd(seed) * (i % 17 == 3 ? 20 : 1); /* some outliers */
    for (int r = 0; r < ROWS; r++) {
        for (int i = 0; i < cols; i++) wf[i] = rnd(seed) + (r == 1 ? 0.5f : 0); /* row 1: q4 min far from 0 */
        quantize_row(qt, wf, cols, w + r * rb);
        dequant_row(qt, w + r * rb, cols, wd + (size_t)r * nb * QBLOCK);
    }
    QAct ap = act_alloc(T, cols), af = act_alloc(T, cols);
    for (int t = 0; t < T; t++) {
        port->quantize_act(x + t * cols, cols, &ap, t);
        fast->quantize_act(x + t * cols, cols, &af, t);
    }
    CHECK(act_equal(&ap, &af, T), "%s cols=%d: activation quantization differs between kernels", qtype_name(qt), cols);
    int pad_ok = 1;
    for (int t = 0; t < T; t++)
        for (int j = cols; j < nb * QBLOCK; j++) pad_ok &= ap.q[(size_t)t * nb * QBLOCK + j] == 0;
    CHECK(pad_ok, "cols=%d: activation padding is not zero", cols);
    float yp[T * ROWS], yf[T * ROWS], y1[ROWS];
    port->qdot[qt](w, rb, ROWS, &ap, 0, 4, yp, ROWS);
    port->qdot[qt](w, rb, ROWS, &ap, 4, T - 4, yp + 4 * ROWS, ROWS);
    fast->qdot[qt](w, rb, ROWS, &af, 0, 4, yf, ROWS);
    fast->qdot[qt](w, rb, ROWS, &af, 4, T - 4, yf + 4 * ROWS, ROWS);
    for (int t = 0; t < T; t++) {
        /* one activation row at a time and one weight row at a time give the same bits */
        fast->qdot[qt](w, rb, ROWS, &af, t, 1, y1, ROWS);
        for (int r = 0; r < ROWS; r++) {
            float one;
            fast->qdot[qt](w + r * rb, rb, 1, &af, t, 1, &one, 1);
            CHECK(y1[r] == yf[t * ROWS + r] && one == y1[r], "%s cols=%d: batched dot differs from single", qtype_name(qt), cols);
        }
        for (int r = 0; r < ROWS; r++) {
            const float *wr = wd + (size_t)r * nb * QBLOCK, *xt = x + t * cols;
            double ref = 0, mag = 0, bound = 0;
            for (int b = 0; b < nb; b++) {
                double amax = 0, wabs = 0;
                for (int j = b * QBLOCK; j < cols && j < (b + 1) * QBLOCK; j++) {
                    ref += (double)wr[j] * xt[j];
                    mag += fabs((double)wr[j] * xt[j]);
                    amax = fmax(amax, fabs(xt[j]));
                    wabs += fabs(wr[j]);
                }
                bound += amax / 65534 * wabs; /* rounding moves each x by at most half a step, amax/32767/2 */
            }
            double gp = yp[t * ROWS + r], gf = yf[t * ROWS + r];
            /* float sums of <= 32 block terms, in different orders: a few ulps of the magnitude;
             * the q4 terms d*q and m can be ~3x the dequantized weight, hence 1e-5 */
            double sum_tol = 1e-5 * (mag + 1e-3);
            CHECK(fabs(gp - gf) <= sum_tol, "%s cols=%d t=%d r=%d: portable %g vs %s %g", qtype_name(qt), cols, t, r, gp,
                  fast->name, gf);
            if (fast->isa == KI_NEON) /* the portable arithmetic, with SIMD integer block dots */
                CHECK(gp == gf, "%s cols=%d t=%d r=%d: neon %g is not portable's %g", qtype_name(qt), cols, t, r, gf, gp);
            CHECK(fabs(gf - ref) <= 1.01 * bound + sum_tol, "%s cols=%d t=%d r=%d: %g vs double %g (bound %g)", qtype_name(qt),
                  cols, t, r, gf, ref, bound);
        }
    }
    act_free(&ap);
    act_free(&af);
    free(x);
    free(wf);
    free(wd);
    free(w);
}

/* Integer inputs whose every product and partial sum is exact in float: each kernel must give
 * the integer dot exactly (the per-block integer arithmetic has no rounding). Activation blocks
 * are pinned to amax 32767 (scale 1), q8 weights to amax 127 (scale 1), q6 to amax 31 (scale 1),
 * q4 weights to -8..7 (scale 1, min -8). */
static void check_qdot_exact(QType qt, int cols, const Kernels *k, unsigned *seed) {
    const int nb = (cols + QBLOCK - 1) / QBLOCK;
    const size_t rb = qtype_row_bytes(qt, cols);
    float *x = malloc(sizeof(float) * cols), *wf = malloc(sizeof(float) * cols);
    unsigned char *w = malloc(rb);
    double want = 0;
    static const float e2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    for (int i = 0; i < cols; i++) {
        int j = i % QBLOCK;
        x[i] = j == 5 ? 32767 : (float)((int)(rnd(seed) * 100));
        if (qt == QT_Q8) wf[i] = j == 0 ? 127 : (j == 5 ? 1 : (float)(int)(rnd(seed) * 127));
        else if (qt == QT_Q6) wf[i] = j == 0 ? -31 : (j == 9 ? 31 : (float)(int)(rnd(seed) * 31)); /* amax 31: scale 1 */
        else if (qt == QT_MXFP4) /* amax 6: scale 1, every value an e2m1 code (halves: exact sums) */
            wf[i] = j == 0 ? 6 : e2m1[(int)((rnd(seed) + 1) * 3.99f)] * (rnd(seed) < 0 ? -1 : 1);
        else wf[i] = j == 0 ? -8 : (j == 1 ? 7 : (float)((int)((rnd(seed) + 1) * 7.5f) - 8));
    }
    /* a short last block still needs its pins */
    if (cols % QBLOCK && cols % QBLOCK <= 5) x[cols - 1] = 32767;
    if (qt == QT_Q4 && cols % QBLOCK == 1) wf[cols - 1] = 0; /* one element: range 0, q4 d = 0 */
    quantize_row(qt, wf, cols, w);
    float *wd = malloc(sizeof(float) * nb * QBLOCK);
    dequant_row(qt, w, cols, wd);
    for (int i = 0; i < cols; i++) want += (double)wd[i] * (double)x[i];
    int exact_w = 1;
    for (int i = 0; i < cols; i++) exact_w &= wd[i] == wf[i] || qt == QT_Q4;
    CHECK(exact_w, "%s cols=%d: pinned weights did not round-trip exactly", qtype_name(qt), cols);
    QAct a = act_alloc(1, cols);
    k->quantize_act(x, cols, &a, 0);
    float got;
    k->qdot[qt](w, rb, 1, &a, 0, 1, &got, 1);
    CHECK(got == (float)want && fabs(want) < 8388608.0, "%s %s cols=%d: exact integer dot %g, want %.1f", k->name, qtype_name(qt),
          cols, got, want);
    act_free(&a);
    free(x);
    free(wf);
    free(wd);
    free(w);
}

/* matmul over q8/q4 weights: a batch gives each row exactly what it gets alone, bias included. */
static void check_matmul_batch(QType qt, int cols, unsigned *seed) {
    enum { T = 7, ROWS = 19 };
    const size_t rb = qtype_row_bytes(qt, cols);
    unsigned char *data = malloc(rb * ROWS);
    float *x = malloc(sizeof(float) * T * cols), *wf = malloc(sizeof(float) * cols), bias[ROWS];
    float yb[T * ROWS], y1[ROWS];
    for (int r = 0; r < ROWS; r++) {
        for (int i = 0; i < cols; i++) wf[i] = rnd(seed);
        quantize_row(qt, wf, cols, data + r * rb);
        bias[r] = rnd(seed);
    }
    for (int i = 0; i < T * cols; i++) x[i] = rnd(seed);
    QMat w = {qt, ROWS, cols, rb, data};
    matmul(yb, x, T, &w, bias);
    int same = 1;
    for (int t = 0; t < T; t++) {
        matmul(y1, x + t * cols, 1, &w, bias);
        same &= !memcmp(y1, yb + t * ROWS, sizeof y1);
    }
    CHECK(same, "%s cols=%d: batched matmul differs from row by row", qtype_name(qt), cols);
    free(data);
    free(x);
    free(wf);
}

/* A set's matrix x matrix kernel (AMX tiles, and the small-batch kernel for decode steps of 1 to
 * 8 rows, tails past whole tiles and the vnni set's every batch) against the portable dots, bit
 * for bit: row counts on and off the 16-row tile and, at the widest rows, past the vnni set's
 * 256 KB strip (520 rows of 1000 columns: 1-3 strips in every format); every small batch,
 * position counts around the 16-position tile and the small-batch limit and past the AMX L2
 * chunk (128), outliers in the activations so high bytes use their full range. */
static void check_qgemm(QType qt, int cols, const Kernels *port, const Kernels *fast, unsigned *seed) {
    const int nb = (cols + QBLOCK - 1) / QBLOCK, rows_list[] = {16, 35, 520},
              T_list[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 21, 24, 25, 150};
    const int n_T = (int)(sizeof T_list / sizeof *T_list);
    const size_t rb = qtype_row_bytes(qt, cols);
    for (int ri = 0; ri < 3; ri++)
        for (int ti = 0; ti < n_T; ti++) {
            const int R = rows_list[ri], T = T_list[ti];
            if (R > 35 && (cols < 1000 || (T != 1 && T != 9 && T != 150))) continue; /* the strips: a few cases */
            unsigned char *w = malloc(rb * R);
            float *x = malloc(sizeof(float) * T * cols), *wf = malloc(sizeof(float) * cols);
            float *yp = malloc(sizeof(float) * T * R), *yf = malloc(sizeof(float) * T * R);
            for (int r = 0; r < R; r++) {
                for (int i = 0; i < cols; i++) wf[i] = rnd(seed) + (r % 3 == 1 ? 0.7f : 0);
                quantize_row(qt, wf, cols, w + r * rb);
            }
            for (int i = 0; i < T * cols; i++) x[i] = rnd(seed) * (i % 13 == 2 ? 50 : 1);
            QAct a = act_alloc(T, cols);
            for (int t = 0; t < T; t++) port->quantize_act(x + t * cols, cols, &a, t);
            for (int t0 = 0; t0 < T; t0 += QDOT_MAX_ROWS)
                port->qdot[qt](w, rb, R, &a, t0, T - t0 < QDOT_MAX_ROWS ? T - t0 : QDOT_MAX_ROWS, yp + t0 * R, R);
            int8_t *packed = malloc(fast->pack_bytes(T, nb));
            fast->pack_act(&a, packed);
            fast->qgemm[qt](w, rb, R, &a, packed, yf, R);
            CHECK(!memcmp(yp, yf, sizeof(float) * T * R), "%s %s cols=%d rows=%d T=%d: matrix kernel differs from portable",
                  fast->name, qtype_name(qt), cols, R, T);
            act_free(&a);
            free(w);
            free(x);
            free(wf);
            free(yp);
            free(yf);
            free(packed);
        }
}

static void test_qdot(void) {
    unsigned seed = 11;
    Kernels fast = kern, port;
    kernels_use(KI_PORTABLE);
    port = kern;
    kern = fast;
    /* 128 and 200 columns: the small-batch q4 kernel's groups of four blocks alone and with a tail */
    const int cols_list[] = {32, 64, 96, 45, 7, 1, 128, 200, 1000};
    for (size_t c = 0; c < sizeof cols_list / sizeof *cols_list; c++) {
        int cols = cols_list[c];
        for (QType qt = QT_Q8; qt < QT_Q2_K; qt++) { /* low-bit types: test_lowbit.c */
            check_qdot_random(qt, cols, &port, &fast, &seed);
            check_qdot_exact(qt, cols, &port, &seed);
            check_qdot_exact(qt, cols, &fast, &seed);
            check_matmul_batch(qt, cols, &seed);
            if (fast.qgemm[qt]) check_qgemm(qt, cols, &port, &fast, &seed);
        }
    }
    /* an all-zero row and a row of tiny values quantize to zero blocks, not NaN */
    float z[40] = {0};
    z[3] = 1e-38f;
    QAct a = act_alloc(1, 40);
    fast.quantize_act(z, 40, &a, 0);
    CHECK(a.d[0] == 0 && a.q[3] == 0 && a.s[1] == 0, "tiny activations quantize to zero");
    act_free(&a);
}
