/* The portable dots of the low-bit types (lowbit.h) against the int16 activation blocks.
 *
 * Activations stay the engine's int16 blocks of 32 (quant.h) rather than ggml's int8 q8_K:
 * the matmul plumbing is shared with q8/q4/q6, and the activation error (half a step of
 * amax/32767 per element) is 258x below int8's, far under the weights' own 2-4 bit rounding, so
 * the dot stays within float rounding of dequant(w) . x (tests/test_gguf_quants.py states the
 * bound). Per 32 activation elements: two 16-element integer sums (the weights' scale
 * granularity), combined in float exactly as lowbit_avx2.c combines them, so every set gives
 * the same bits. */
#include "kernels/isa.h"
#include "kernels/lowbit.h"

/* acc += d * (sc0*is0 + sc1*is1 - (mn0*xs0 + mn1*xs1)) for 16-element halves 2h, 2h+1. */
float lowbit_combine(const LowbitBlock *blk, int h, int has_min, int32_t is0, int32_t is1, int32_t xs0, int32_t xs1) {
    float part = blk->sc[2 * h] * (float)is0 + blk->sc[2 * h + 1] * (float)is1;
    if (has_min) part = part - (blk->mn[2 * h] * (float)xs0 + blk->mn[2 * h + 1] * (float)xs1);
    return part;
}

static void lowbit_qdot(QType qt, QDOT_ARGS) {
    const LowbitType *t = lowbit_type(qt);
    const int per = t->block / QBLOCK, nblk = a->nb / per;
    LowbitBlock blk;
    for (int r = 0; r < nr; r++) {
        float acc[QDOT_MAX_ROWS] = {0};
        const unsigned char *row = w + (size_t)r * row_bytes;
        for (int k = 0; k < nblk; k++) {
            t->decode(row + (size_t)k * t->bytes, &blk);
            for (int h = 0; h < per; h++) {
                const int b = k * per + h;
                const int8_t *q = blk.q + QBLOCK * h;
                for (int i = 0; i < nt; i++) {
                    const int16_t *x = a->q + ((size_t)(t0 + i) * a->nb + b) * QBLOCK;
                    int32_t is0 = 0, is1 = 0, xs0 = 0, xs1 = 0;
                    for (int j = 0; j < 16; j++) {
                        is0 += q[j] * x[j];
                        is1 += q[j + 16] * x[j + 16];
                        xs0 += x[j];
                        xs1 += x[j + 16];
                    }
                    acc[i] += a->d[(size_t)b * a->rows + t0 + i] * lowbit_combine(&blk, h, t->has_min, is0, is1, xs0, xs1);
                }
            }
        }
        for (int i = 0; i < nt; i++) y[i * ldy + r] = acc[i];
    }
}

#define LOWBIT_PORTABLE(S, QT) \
    void qdot_##S##_portable(QDOT_ARGS) { lowbit_qdot(QT, w, row_bytes, nr, a, t0, nt, y, ldy); }
LOWBIT_TYPES(LOWBIT_PORTABLE)
