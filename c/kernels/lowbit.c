/* The low-bit GGUF blocks (lowbit.h) decoded as gguf-py's reference (gguf/quants.py) reads
 * them, with every float formula in the reference's order of operations. */
#include "kernels/lowbit.h"

#include "util/f16.h"

#include <stddef.h>
#include <string.h>

#include "kernels/lowbit_grids.h"

static float h2f(const unsigned char *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_to_f32(h);
}

static uint32_t u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint16_t u16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* Eight lattice coordinates with the signs of sign byte s (bit j set: element j negative). */
static void signed8(int8_t *q, const int8_t *g, unsigned s) {
    for (int j = 0; j < 8; j++) q[j] = (int8_t)(s >> j & 1 ? -g[j] : g[j]);
}

/* Each type decodes in two halves, the float scales (sc_*) and the int8 codes (q_*), so a SIMD
 * set can replace the codes half alone and keep the scales bit for bit. */

/* Q2_K, 84 bytes: scales[16] (low nibble scale, high nibble min, per 16), qs[64] (2 bits:
 * element 128h + 32k + l is bits 2k of qs[32h + l]), d, dmin. */
static void sc_q2_k(const unsigned char *b, LowbitBlock *o) {
    const float d = h2f(b + 80), dmin = h2f(b + 82);
    for (int i = 0; i < 16; i++) {
        o->sc[i] = d * (float)(b[i] & 0xF);
        o->mn[i] = dmin * (float)(b[i] >> 4);
    }
}
static void q_q2_k(const unsigned char *b, LowbitBlock *o) {
    for (int e = 0; e < 256; e++) o->q[e] = (int8_t)(b[16 + 32 * (e / 128) + e % 32] >> (2 * (e / 32 % 4)) & 3);
}

/* Q3_K, 110 bytes: hmask[32] (element 32k + l: bit k of hmask[l], clear = minus 4), qs[64] (as
 * Q2_K), scales[12] (16 6-bit scales biased by 32), d. */
static void sc_q3_k(const unsigned char *b, LowbitBlock *o) {
    const unsigned char *sc = b + 96;
    const float d = h2f(b + 108);
    for (int i = 0; i < 16; i++) {
        int lo = (i < 8 ? sc[i] : sc[i - 8] >> 4) & 0xF, hi = sc[8 + i % 4] >> (2 * (i / 4)) & 3;
        o->sc[i] = d * (float)((lo | hi << 4) - 32);
    }
}
static void q_q3_k(const unsigned char *b, LowbitBlock *o) {
    const unsigned char *hm = b, *qs = b + 32;
    for (int e = 0; e < 256; e++) {
        int ql = qs[32 * (e / 128) + e % 32] >> (2 * (e / 32 % 4)) & 3, h = hm[e % 32] >> (e / 32) & 1;
        o->q[e] = (int8_t)(ql - (h ? 0 : 4));
    }
}

/* IQ2_XXS, 66 bytes: d, then per 32 elements two u32: four grid indexes (bytes) and four 7-bit
 * sign indexes + a 4-bit scale. */
static void sc_iq2_xxs(const unsigned char *b, LowbitBlock *o) {
    const float d = h2f(b);
    for (int ib = 0; ib < 8; ib++) o->sc[2 * ib] = o->sc[2 * ib + 1] = d * (0.5f + (float)(u32(b + 6 + 8 * ib) >> 28)) * 0.25f;
}
static void q_iq2_xxs(const unsigned char *b, LowbitBlock *o) {
    for (int ib = 0; ib < 8; ib++) {
        const unsigned char *g = b + 2 + 8 * ib;
        const uint32_t aux = u32(g + 4);
        for (int k = 0; k < 4; k++) signed8(o->q + 32 * ib + 8 * k, iq2xxs_grid[g[k]], lowbit_ksigns[aux >> (7 * k) & 127]);
    }
}

/* IQ2_XS, 74 bytes: d, qs[32] u16 (9-bit grid index, 7-bit sign index, per 8), scales[8] (two
 * 4-bit scales, per 16). */
static void sc_iq2_xs(const unsigned char *b, LowbitBlock *o) {
    const float d = h2f(b);
    for (int i = 0; i < 16; i++) o->sc[i] = d * (0.5f + (float)(b[66 + i / 2] >> (4 * (i % 2)) & 0xF)) * 0.25f;
}
static void q_iq2_xs(const unsigned char *b, LowbitBlock *o) {
    for (int g = 0; g < 32; g++) {
        const uint16_t v = u16(b + 2 + 2 * g);
        signed8(o->q + 8 * g, iq2xs_grid[v & 511], lowbit_ksigns[v >> 9]);
    }
}

/* IQ2_S, 82 bytes: d, qs[32] (grid index low bits), signs[32] (one byte per 8), qh[8] (2 high
 * index bits per 8), scales[8] (as IQ2_XS). */
static void sc_iq2_s(const unsigned char *b, LowbitBlock *o) {
    const float d = h2f(b);
    const unsigned char *sc = b + 74;
    for (int i = 0; i < 16; i++) o->sc[i] = d * (0.5f + (float)(sc[i / 2] >> (4 * (i % 2)) & 0xF)) * 0.25f;
}
static void q_iq2_s(const unsigned char *b, LowbitBlock *o) {
    const unsigned char *qs = b + 2, *sg = b + 34, *qh = b + 66;
    for (int g = 0; g < 32; g++) signed8(o->q + 8 * g, iq2s_grid[qs[g] | (qh[g / 4] >> (2 * (g % 4)) & 3) << 8], sg[g]);
}

/* IQ3_XXS, 98 bytes: d, qs[64] (grid index per 4), then per 32 elements one u32: four 7-bit sign
 * indexes + a 4-bit scale. */
static void sc_iq3_xxs(const unsigned char *b, LowbitBlock *o) {
    const float d = h2f(b);
    for (int ib = 0; ib < 8; ib++) o->sc[2 * ib] = o->sc[2 * ib + 1] = d * (0.5f + (float)(u32(b + 66 + 4 * ib) >> 28)) * 0.5f;
}
static void q_iq3_xxs(const unsigned char *b, LowbitBlock *o) {
    for (int ib = 0; ib < 8; ib++) {
        const uint32_t aux = u32(b + 66 + 4 * ib);
        for (int k = 0; k < 4; k++) {
            int8_t g[8];
            memcpy(g, iq3xxs_grid[b[2 + 8 * ib + 2 * k]], 4);
            memcpy(g + 4, iq3xxs_grid[b[2 + 8 * ib + 2 * k + 1]], 4);
            signed8(o->q + 32 * ib + 8 * k, g, lowbit_ksigns[aux >> (7 * k) & 127]);
        }
    }
}

/* IQ3_S, 110 bytes: d, qs[64] (grid index low bits per 4), qh[8] (the ninth bits), signs[32],
 * scales[4] (two 4-bit scales, per 32). */
static void sc_iq3_s(const unsigned char *b, LowbitBlock *o) {
    const float d = h2f(b);
    const unsigned char *sc = b + 106;
    for (int i = 0; i < 16; i++) o->sc[i] = d * (float)(1 + 2 * (sc[i / 4] >> (4 * (i / 2 % 2)) & 0xF));
}
static void q_iq3_s(const unsigned char *b, LowbitBlock *o) {
    const unsigned char *qs = b + 2, *qh = b + 66, *sg = b + 74;
    for (int k = 0; k < 32; k++) {
        int8_t g[8];
        for (int h = 0; h < 2; h++) {
            int gi = 2 * k + h;
            memcpy(g + 4 * h, iq3s_grid[qs[gi] | (qh[gi / 8] >> (gi % 8) & 1) << 8], 4);
        }
        signed8(o->q + 8 * k, g, sg[k]);
    }
}

/* 8*(coordinate + delta) for eight IQ1 lattice coordinates (-1, 0, 1): odd integers. */
static void iq1_eight(int8_t *q, const int8_t *g, int neg) {
    for (int j = 0; j < 8; j++) q[j] = (int8_t)(8 * g[j] + (neg ? -1 : 1));
}

/* IQ1_S, 50 bytes: d, qs[32] (grid index low bits per 8), qh[8] u16 per 32 elements (3 high
 * index bits per 8, a 3-bit scale, the delta's sign in bit 15). */
static void sc_iq1_s(const unsigned char *b, LowbitBlock *o) {
    const float d = h2f(b);
    for (int ib = 0; ib < 8; ib++)
        o->sc[2 * ib] = o->sc[2 * ib + 1] = d * (float)(2 * (u16(b + 34 + 2 * ib) >> 12 & 7) + 1) * 0.125f;
}
static void q_iq1_s(const unsigned char *b, LowbitBlock *o) {
    for (int ib = 0; ib < 8; ib++) {
        const uint16_t qh = u16(b + 34 + 2 * ib);
        for (int k = 0; k < 4; k++)
            iq1_eight(o->q + 32 * ib + 8 * k, iq1s_grid[b[2 + 4 * ib + k] | (qh >> (3 * k) & 7) << 8], qh & 0x8000);
    }
}

/* IQ1_M, 56 bytes: qs[32], qh[16] (per 8: 3 high index bits and the delta's sign, a nibble),
 * scales[8] as four u16 (four 3-bit scales per 64 elements; the f16 d in their top nibbles). */
static void sc_iq1_m(const unsigned char *b, LowbitBlock *o) {
    uint16_t s[4], dh = 0;
    for (int i = 0; i < 4; i++) {
        s[i] = u16(b + 48 + 2 * i);
        dh |= (uint16_t)((s[i] & 0xF000) >> (12 - 4 * i));
    }
    const float d = f16_to_f32(dh);
    for (int i = 0; i < 16; i++) o->sc[i] = d * (float)(2 * (s[i / 4] >> (3 * (i % 4)) & 7) + 1) * 0.125f;
}
static void q_iq1_m(const unsigned char *b, LowbitBlock *o) {
    const unsigned char *qs = b, *qh = b + 32;
    for (int g = 0; g < 32; g++) {
        const int nib = qh[g / 2] >> (4 * (g % 2)) & 0xF;
        iq1_eight(o->q + 8 * g, iq1s_grid[qs[g] | (nib & 7) << 8], nib & 8);
    }
}

/* IQ4_NL, 18 bytes per 32: d, qs[16] (element j: low nibble of qs[j], j+16: high nibble), as
 * indexes into the non-linear codebook. */
static void sc_iq4_nl(const unsigned char *b, LowbitBlock *o) { o->sc[0] = o->sc[1] = h2f(b); }
static void q_iq4_nl(const unsigned char *b, LowbitBlock *o) {
    for (int j = 0; j < 16; j++) {
        o->q[j] = kvalues_iq4nl[b[2 + j] & 0xF];
        o->q[j + 16] = kvalues_iq4nl[b[2 + j] >> 4];
    }
}

/* IQ4_XS, 136 bytes: d, scales_h u16 (2 high bits per 32), scales_l[4] (low nibbles), qs[128]
 * (IQ4_NL's nibble order per 32); scales biased by 32. */
static void sc_iq4_xs(const unsigned char *b, LowbitBlock *o) {
    const float d = h2f(b);
    const uint16_t sh = u16(b + 2);
    for (int ib = 0; ib < 8; ib++) {
        const int ls = (b[4 + ib / 2] >> (4 * (ib % 2)) & 0xF) | (sh >> (2 * ib) & 3) << 4;
        o->sc[2 * ib] = o->sc[2 * ib + 1] = d * (float)(ls - 32);
    }
}
static void q_iq4_xs(const unsigned char *b, LowbitBlock *o) {
    for (int ib = 0; ib < 8; ib++) {
        const unsigned char *qs = b + 8 + 16 * ib;
        for (int j = 0; j < 16; j++) {
            o->q[32 * ib + j] = kvalues_iq4nl[qs[j] & 0xF];
            o->q[32 * ib + j + 16] = kvalues_iq4nl[qs[j] >> 4];
        }
    }
}

/* Q5_K, 176 bytes: d, dmin, scales[12] (Q4_K's 6-bit scale and min per 32), qh[32] (element e's
 * fifth bit: bit e/32 of qh[e%32]), qs[128] (element e: nibble (e/32)%2 of qs[32*(e/64) + e%32]). */
static void scale_min_k4(int j, const unsigned char *q, int *d, int *m) {
    if (j < 4) *d = q[j] & 63, *m = q[j + 4] & 63;
    else *d = (q[j + 4] & 0xF) | (q[j - 4] >> 6) << 4, *m = (q[j + 4] >> 4) | (q[j] >> 6) << 4;
}
static void sc_q5_k(const unsigned char *b, LowbitBlock *o) {
    const float d = h2f(b), dmin = h2f(b + 2);
    for (int j = 0; j < 8; j++) {
        int s, m;
        scale_min_k4(j, b + 4, &s, &m);
        o->sc[2 * j] = o->sc[2 * j + 1] = d * (float)s;
        o->mn[2 * j] = o->mn[2 * j + 1] = dmin * (float)m;
    }
}
static void q_q5_k(const unsigned char *b, LowbitBlock *o) {
    const unsigned char *qh = b + 16, *qs = b + 48;
    for (int e = 0; e < 256; e++)
        o->q[e] = (int8_t)((qs[32 * (e / 64) + e % 32] >> (4 * (e / 32 % 2)) & 0xF) | (qh[e % 32] >> (e / 32) & 1) << 4);
}

/* Q4_K, 144 bytes: Q5_K without qh: d, dmin, scales[12], qs[128] at 16. */
static void q_q4_k(const unsigned char *b, LowbitBlock *o) {
    const unsigned char *qs = b + 16;
    for (int e = 0; e < 256; e++) o->q[e] = (int8_t)(qs[32 * (e / 64) + e % 32] >> (4 * (e / 32 % 2)) & 0xF);
}

/* Q6_K, 210 bytes: ql[128], qh[64], scales[16] (int8, per 16), d. Element 128h + e (e < 128):
 * nibble e/64 of ql[64h + e%64], two high bits at 2*(e/32) of qh[32h + e%32], minus 32. */
static void sc_q6_k(const unsigned char *b, LowbitBlock *o) {
    const float d = h2f(b + 208);
    for (int i = 0; i < 16; i++) o->sc[i] = d * (float)(int8_t)b[192 + i];
}
static void q_q6_k(const unsigned char *b, LowbitBlock *o) {
    for (int e = 0; e < 256; e++) {
        const int h = e / 128, i = e % 128;
        const int lo = b[64 * h + i % 64] >> (4 * (i / 64)) & 0xF, hi = b[128 + 32 * h + i % 32] >> (2 * (i / 32)) & 3;
        o->q[e] = (int8_t)((lo | hi << 4) - 32);
    }
}

static const LowbitType TYPES[] = {
    [QT_Q2_K - QT_Q2_K] = {256, 84, 1, sc_q2_k, q_q2_k},          [QT_Q3_K - QT_Q2_K] = {256, 110, 0, sc_q3_k, q_q3_k},
    [QT_IQ1_S - QT_Q2_K] = {256, 50, 0, sc_iq1_s, q_iq1_s},       [QT_IQ1_M - QT_Q2_K] = {256, 56, 0, sc_iq1_m, q_iq1_m},
    [QT_IQ2_XXS - QT_Q2_K] = {256, 66, 0, sc_iq2_xxs, q_iq2_xxs}, [QT_IQ2_XS - QT_Q2_K] = {256, 74, 0, sc_iq2_xs, q_iq2_xs},
    [QT_IQ2_S - QT_Q2_K] = {256, 82, 0, sc_iq2_s, q_iq2_s},       [QT_IQ3_XXS - QT_Q2_K] = {256, 98, 0, sc_iq3_xxs, q_iq3_xxs},
    [QT_IQ3_S - QT_Q2_K] = {256, 110, 0, sc_iq3_s, q_iq3_s},      [QT_IQ4_NL - QT_Q2_K] = {32, 18, 0, sc_iq4_nl, q_iq4_nl},
    [QT_IQ4_XS - QT_Q2_K] = {256, 136, 0, sc_iq4_xs, q_iq4_xs},   [QT_Q5_K - QT_Q2_K] = {256, 176, 1, sc_q5_k, q_q5_k},
    [QT_Q6_K - QT_Q2_K] = {256, 210, 0, sc_q6_k, q_q6_k},         [QT_Q4_K - QT_Q2_K] = {256, 144, 1, sc_q5_k, q_q4_k},
};

void lowbit_decode(const LowbitType *t, const unsigned char *b, LowbitBlock *o) {
    t->scales(b, o);
    t->codes(b, o);
}

const LowbitType *lowbit_type(QType qt) {
    return qt >= QT_Q2_K && qt < QT_COUNT && qt - QT_Q2_K < (int)(sizeof TYPES / sizeof TYPES[0]) ? &TYPES[qt - QT_Q2_K] : NULL;
}

size_t lowbit_row_bytes(QType qt, int cols) {
    const LowbitType *t = lowbit_type(qt);
    return t && cols > 0 && cols % t->block == 0 ? (size_t)(cols / t->block) * (size_t)t->bytes : 0;
}

void lowbit_dequant_row(QType qt, const void *src, int cols, float *dst) {
    const LowbitType *t = lowbit_type(qt);
    if (!t) return;
    const unsigned char *s = src;
    LowbitBlock blk;
    for (int i = 0; i < cols / t->block; i++, s += t->bytes, dst += t->block) {
        lowbit_decode(t, s, &blk);
        for (int j = 0; j < t->block; j++)
            dst[j] = t->has_min ? blk.sc[j / 16] * (float)blk.q[j] - blk.mn[j / 16] : blk.sc[j / 16] * (float)blk.q[j];
    }
}

size_t lowbit_pack_bytes(int T, int nb) { return nb % 8 ? 0 : (size_t)T * (size_t)(nb / 8) * LOWBIT_PACK_BYTES; }

void lowbit_pack_act(const QAct *a, unsigned char *dst) {
    const int nk = a->nb / 8;
    for (int t = 0; t < a->rows; t++)
        for (int k = 0; k < nk; k++) {
            unsigned char *o = dst + ((size_t)t * nk + k) * LOWBIT_PACK_BYTES;
            const int16_t *x = a->q + ((size_t)t * a->nb + (size_t)k * 8) * QBLOCK;
            float f[24];
            int16_t xt[256];
            if (a->rows >= LOWBIT_PACKED_MIN_ROWS) {
                for (int v = 0; v < 16; v++)
                    for (int l = 0; l < 8; l++) {
                        const int part = 2 * l + v / 8, m = v % 8;
                        xt[16 * v + 2 * l] = x[16 * part + 2 * m];
                        xt[16 * v + 2 * l + 1] = x[16 * part + 2 * m + 1];
                    }
            } else { /* the even and odd elements of each 64 */
                for (int g = 0; g < 4; g++)
                    for (int m = 0; m < 32; m++) xt[64 * g + m] = x[64 * g + 2 * m], xt[64 * g + 32 + m] = x[64 * g + 2 * m + 1];
            }
            memcpy(o, xt, sizeof xt);
            for (int h = 0; h < 8; h++) {
                f[h] = a->d[(size_t)(k * 8 + h) * a->rows + t];
                int32_t e = 0, od = 0;
                for (int j = 0; j < 16; j++) e += x[32 * h + j], od += x[32 * h + 16 + j];
                f[8 + h] = (float)e;
                f[16 + h] = (float)od;
            }
            memcpy(o + 512, f, sizeof f);
        }
}
