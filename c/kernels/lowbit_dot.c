/* The portable dots of the low-bit types (lowbit.h) against the int16 activation blocks.
 *
 * Activations stay the engine's int16 blocks of 32 (quant.h) rather than ggml's int8 q8_K:
 * the matmul plumbing is shared with q8/q4/q6, and the activation error (half a step of
 * amax/32767 per element) is 258x below int8's, far under the weights' own 2-4 bit rounding, so
 * the dot stays within float rounding of dequant(w) . x (tests/test_gguf_quants.py states the
 * bound). Per 32 activation elements: two 16-element integer sums (the weights' scale
 * granularity), combined per weight block by lowbit_block_add into eight lanes per row, whose
 * order lowbit_dots_x86.h evaluates as a vector, so every set gives the same bits. */
#include "kernels/isa.h"
#include "kernels/lowbit.h"

void lowbit_block_add(const LowbitBlock *blk, int per, int has_min, const int32_t *is, const int32_t *xs, const float *d,
                      float *acc) {
    for (int h = 0; h < per; h++) {
        float part = blk->sc[2 * h] * (float)is[2 * h] + blk->sc[2 * h + 1] * (float)is[2 * h + 1];
        if (has_min) part = part - (blk->mn[2 * h] * (float)xs[2 * h] + blk->mn[2 * h + 1] * (float)xs[2 * h + 1]);
        acc[h] += d[h] * part;
    }
}

float lowbit_lanes_sum(const float *a) { return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])); }

static void lowbit_qdot(QType qt, QDOT_ARGS) {
    const LowbitType *t = lowbit_type(qt);
    const int per = t->block / QBLOCK, nblk = a->nb / per;
    LowbitBlock blk;
    for (int r = 0; r < nr; r++) {
        float acc[LOWBIT_MAX_ROWS][8] = {{0}};
        const unsigned char *row = w + (size_t)r * row_bytes;
        for (int k = 0; k < nblk; k++) {
            lowbit_decode(t, row + (size_t)k * t->bytes, &blk);
            for (int i = 0; i < nt; i++) {
                int32_t is[16], xs[16];
                float d[8];
                for (int h = 0; h < per; h++) {
                    const int b = k * per + h;
                    const int8_t *q = blk.q + QBLOCK * h;
                    const int16_t *x = a->q + ((size_t)(t0 + i) * a->nb + b) * QBLOCK;
                    int32_t is0 = 0, is1 = 0, xs0 = 0, xs1 = 0;
                    for (int j = 0; j < 16; j++) {
                        is0 += q[j] * x[j];
                        is1 += q[j + 16] * x[j + 16];
                        xs0 += x[j];
                        xs1 += x[j + 16];
                    }
                    is[2 * h] = is0, is[2 * h + 1] = is1, xs[2 * h] = xs0, xs[2 * h + 1] = xs1;
                    d[h] = a->d[(size_t)b * a->rows + t0 + i];
                }
                lowbit_block_add(&blk, per, t->has_min, is, xs, d, acc[i]);
            }
        }
        for (int i = 0; i < nt; i++) y[i * ldy + r] = lowbit_lanes_sum(acc[i]);
    }
}

#define LOWBIT_PORTABLE(S, QT) \
    void qdot_##S##_portable(QDOT_ARGS) { lowbit_qdot(QT, w, row_bytes, nr, a, t0, nt, y, ldy); }
LOWBIT_TYPES(LOWBIT_PORTABLE)
