/* GGUF block types -> float rows, following ggml's reference dequantization (ggml-quants.c)
 * value for value. Every block starts at a byte offset with no alignment promise, so scalars
 * are read with memcpy. */
#include "kernels/gguf_quants.h"

#include "kernels/lowbit.h"

#include <stdint.h>
#include <string.h>

typedef struct {
    const char *name;
    int type, block, bytes;
} GgufType;

static const GgufType TYPES[] = {
    {"GGUF_F32", GGUF_T_F32, 1, 4},
    {"GGUF_F16", GGUF_T_F16, 1, 2},
    {"GGUF_BF16", GGUF_T_BF16, 1, 2},
    {"GGUF_Q4_0", GGUF_T_Q4_0, 32, 18},
    {"GGUF_Q4_1", GGUF_T_Q4_1, 32, 20},
    {"GGUF_Q5_0", GGUF_T_Q5_0, 32, 22},
    {"GGUF_Q5_1", GGUF_T_Q5_1, 32, 24},
    {"GGUF_Q8_0", GGUF_T_Q8_0, 32, 34},
    {"GGUF_Q4_K", GGUF_T_Q4_K, 256, 144},
    {"GGUF_Q5_K", GGUF_T_Q5_K, 256, 176},
    {"GGUF_Q6_K", GGUF_T_Q6_K, 256, 210},
    {"GGUF_MXFP4", GGUF_T_MXFP4, 32, 17},
    {"GGUF_Q2_K", GGUF_T_Q2_K, 256, 84},
    {"GGUF_Q3_K", GGUF_T_Q3_K, 256, 110},
    {"GGUF_IQ1_S", GGUF_T_IQ1_S, 256, 50},
    {"GGUF_IQ1_M", GGUF_T_IQ1_M, 256, 56},
    {"GGUF_IQ2_XXS", GGUF_T_IQ2_XXS, 256, 66},
    {"GGUF_IQ2_XS", GGUF_T_IQ2_XS, 256, 74},
    {"GGUF_IQ2_S", GGUF_T_IQ2_S, 256, 82},
    {"GGUF_IQ3_XXS", GGUF_T_IQ3_XXS, 256, 98},
    {"GGUF_IQ3_S", GGUF_T_IQ3_S, 256, 110},
    {"GGUF_IQ4_NL", GGUF_T_IQ4_NL, 32, 18},
    {"GGUF_IQ4_XS", GGUF_T_IQ4_XS, 256, 136},
};

/* GGUF low-bit type -> the QType holding its blocks (lowbit.h). */
static const struct {
    int type;
    QType qt;
} LOWBIT[] = {{GGUF_T_Q2_K, QT_Q2_K},       {GGUF_T_Q3_K, QT_Q3_K},     {GGUF_T_IQ1_S, QT_IQ1_S},   {GGUF_T_IQ1_M, QT_IQ1_M},
              {GGUF_T_IQ2_XXS, QT_IQ2_XXS}, {GGUF_T_IQ2_XS, QT_IQ2_XS}, {GGUF_T_IQ2_S, QT_IQ2_S},   {GGUF_T_IQ3_XXS, QT_IQ3_XXS},
              {GGUF_T_IQ3_S, QT_IQ3_S},     {GGUF_T_IQ4_NL, QT_IQ4_NL}, {GGUF_T_IQ4_XS, QT_IQ4_XS}, {GGUF_T_Q5_K, QT_Q5_K},
              {GGUF_T_Q6_K, QT_Q6_K},       {GGUF_T_Q4_K, QT_Q4_K}};

QType gguf_lowbit_qtype(int type) {
    for (size_t i = 0; i < sizeof LOWBIT / sizeof LOWBIT[0]; i++)
        if (LOWBIT[i].type == type) return LOWBIT[i].qt;
    return QT_COUNT;
}
#define NTYPES (sizeof TYPES / sizeof TYPES[0])

static const GgufType *find(int type) {
    for (size_t i = 0; i < NTYPES; i++)
        if (TYPES[i].type == type) return &TYPES[i];
    return NULL;
}

int gguf_type_from_name(const char *name) {
    for (size_t i = 0; name && i < NTYPES; i++)
        if (!strcmp(name, TYPES[i].name)) return TYPES[i].type;
    return -1;
}

size_t gguf_row_bytes(int type, long long cols) {
    const GgufType *t = find(type);
    if (!t || cols < 1 || cols % t->block) return 0;
    return (size_t)(cols / t->block) * (size_t)t->bytes;
}

static float h2f(const unsigned char *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_to_f32(h);
}

/* 6-bit scale and min j of a K-quant super-block (ggml's get_scale_min_k4). */
static void scale_min_k4(int j, const unsigned char *q, int *d, int *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static void block_q4_0(const unsigned char *b, float *y) {
    float d = h2f(b);
    for (int j = 0; j < 16; j++) {
        y[j] = ((b[2 + j] & 0xF) - 8) * d;
        y[j + 16] = ((b[2 + j] >> 4) - 8) * d;
    }
}

static void block_q4_1(const unsigned char *b, float *y) {
    float d = h2f(b), m = h2f(b + 2);
    for (int j = 0; j < 16; j++) {
        y[j] = (b[4 + j] & 0xF) * d + m;
        y[j + 16] = (b[4 + j] >> 4) * d + m;
    }
}

/* Q5_0/Q5_1: the fifth bits of the 32 elements are one little-endian u32. */
static void block_q5(const unsigned char *b, float *y, int with_min) {
    float d = h2f(b), m = with_min ? h2f(b + 2) : 0.0f;
    const unsigned char *qhp = b + (with_min ? 4 : 2), *qs = qhp + 4;
    uint32_t qh = (uint32_t)qhp[0] | (uint32_t)qhp[1] << 8 | (uint32_t)qhp[2] << 16 | (uint32_t)qhp[3] << 24;
    int off = with_min ? 0 : 16;
    for (int j = 0; j < 16; j++) {
        int x0 = (int)((qs[j] & 0xF) | (((qh >> j) << 4) & 0x10)) - off;
        int x1 = (int)((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - off;
        y[j] = with_min ? x0 * d + m : x0 * d;
        y[j + 16] = with_min ? x1 * d + m : x1 * d;
    }
}

static void block_q8_0(const unsigned char *b, float *y) {
    float d = h2f(b);
    for (int j = 0; j < 32; j++) y[j] = (int8_t)b[2 + j] * d;
}

static void block_q4_k(const unsigned char *b, float *y) {
    float d = h2f(b), dmin = h2f(b + 2);
    const unsigned char *sc = b + 4, *q = b + 16;
    for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
        int s, m;
        scale_min_k4(is, sc, &s, &m);
        float d1 = d * s, m1 = dmin * m;
        scale_min_k4(is + 1, sc, &s, &m);
        float d2 = d * s, m2 = dmin * m;
        for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
    }
}

static void block_q5_k(const unsigned char *b, float *y) {
    float d = h2f(b), dmin = h2f(b + 2);
    const unsigned char *sc = b + 4, *qh = b + 16, *ql = b + 48;
    unsigned u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < 256; j += 64, is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
        int s, m;
        scale_min_k4(is, sc, &s, &m);
        float d1 = d * s, m1 = dmin * m;
        scale_min_k4(is + 1, sc, &s, &m);
        float d2 = d * s, m2 = dmin * m;
        for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    }
}

static void block_q6_k(const unsigned char *b, float *y) {
    const unsigned char *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = h2f(b + 208);
    for (int n = 0; n < 256; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = (int)((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
            int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * sc[is] * q1;
            y[l + 32] = d * sc[is + 2] * q2;
            y[l + 64] = d * sc[is + 4] * q3;
            y[l + 96] = d * sc[is + 6] * q4;
        }
    }
}

void gguf_dequant_row(int type, const void *src, long long cols, float *dst) {
    const GgufType *t = find(type);
    if (!t || gguf_row_bytes(type, cols) == 0) return;
    const unsigned char *s = src;
    long long nb = cols / t->block;
    switch (type) {
    case GGUF_T_F32: memcpy(dst, src, (size_t)cols * 4); return;
    case GGUF_T_F16:
        for (long long i = 0; i < cols; i++) dst[i] = h2f(s + 2 * i);
        return;
    case GGUF_T_BF16:
        for (long long i = 0; i < cols; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = bf16_to_f32(h);
        }
        return;
    case GGUF_T_MXFP4: mxfp4_dequant_block_row(src, (int)cols, dst); return; /* colibri's mxfp4 block */
    default:
        if (gguf_lowbit_qtype(type) != QT_COUNT) {
            lowbit_dequant_row(gguf_lowbit_qtype(type), src, (int)cols, dst);
            return;
        }
        break;
    }
    for (long long i = 0; i < nb; i++, s += t->bytes, dst += t->block) {
        switch (type) {
        case GGUF_T_Q4_0: block_q4_0(s, dst); break;
        case GGUF_T_Q4_1: block_q4_1(s, dst); break;
        case GGUF_T_Q5_0: block_q5(s, dst, 0); break;
        case GGUF_T_Q5_1: block_q5(s, dst, 1); break;
        case GGUF_T_Q8_0: block_q8_0(s, dst); break;
        case GGUF_T_Q4_K: block_q4_k(s, dst); break;
        case GGUF_T_Q5_K: block_q5_k(s, dst); break;
        case GGUF_T_Q6_K: block_q6_k(s, dst); break;
        default: return;
        }
    }
}

/* f16 of v if that is finite, else -1 (the keep path then falls back to re-quantization). */
static int f16_finite(float v, unsigned char *p) {
    uint16_t h = f32_to_f16(v);
    if ((h & 0x7C00) == 0x7C00) return -1;
    memcpy(p, &h, 2);
    return 0;
}

int gguf_keep_row(int type, const void *src, long long cols, QType qt, void *dst) {
    const unsigned char *s = src;
    unsigned char *o = dst;
    if (type == GGUF_T_MXFP4 && qt == QT_MXFP4 && gguf_row_bytes(type, cols)) {
        memcpy(dst, src, (size_t)cols / 32 * 17);
        return 1;
    }
    if (gguf_lowbit_qtype(type) != QT_COUNT && gguf_lowbit_qtype(type) == qt && gguf_row_bytes(type, cols)) {
        memcpy(dst, src, gguf_row_bytes(type, cols)); /* the container's block is GGUF's */
        return 1;
    }
    if (gguf_row_bytes(type, cols) == 0 || (qt != QT_Q8 && qt != QT_Q4)) return 0;
    long long nb = cols / 32;
    if (type == GGUF_T_Q8_0 && qt == QT_Q8) {
        memcpy(dst, src, (size_t)nb * 34);
        return 1;
    } /* same block */
    if (type == GGUF_T_Q4_1 && qt == QT_Q4) {
        memcpy(dst, src, (size_t)nb * 20);
        return 1;
    } /* same block */
    if (type == GGUF_T_Q4_0 && qt == QT_Q4) { /* x = d(q-8) = dq + m with m = -8d, exact in f16 */
        for (long long i = 0; i < nb; i++, s += 18, o += 20) {
            memcpy(o, s, 2);
            if (f16_finite(-8.0f * h2f(s), o + 2)) return 0;
            memcpy(o + 4, s + 2, 16);
        }
        return 1;
    }
    if ((type == GGUF_T_Q4_0 || type == GGUF_T_Q5_0) && qt == QT_Q8) { /* same scale; q-8 or q-16 fits int8 */
        int bytes = type == GGUF_T_Q4_0 ? 18 : 22;
        for (long long i = 0; i < nb; i++, s += bytes, o += 34) {
            memcpy(o, s, 2);
            const unsigned char *qs = s + (type == GGUF_T_Q4_0 ? 2 : 6);
            uint32_t qh = 0;
            if (type == GGUF_T_Q5_0) qh = (uint32_t)s[2] | (uint32_t)s[3] << 8 | (uint32_t)s[4] << 16 | (uint32_t)s[5] << 24;
            for (int j = 0; j < 32; j++) {
                int q = j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4;
                q = type == GGUF_T_Q4_0 ? q - 8 : (q | (int)(((qh >> j) & 1) << 4)) - 16;
                o[2 + j] = (unsigned char)(int8_t)q;
            }
        }
        return 1;
    }
    if (type == GGUF_T_Q4_K && qt == QT_Q4) { /* per 32-element sub-block: x = (d*sc) q - dmin*m */
        for (long long i = 0; i < nb / 8; i++, s += 144) {
            float d = h2f(s), dmin = h2f(s + 2);
            const unsigned char *q = s + 16;
            for (int sub = 0; sub < 8; sub++, o += 20) {
                int sc, m;
                scale_min_k4(sub, s + 4, &sc, &m);
                if (f16_finite(d * sc, o) || f16_finite(-(dmin * m), o + 2)) return 0;
                const unsigned char *qq = q + 32 * (sub / 2);
                int shift = (sub & 1) * 4;
                for (int j = 0; j < 16; j++)
                    o[4 + j] = (unsigned char)(((qq[j] >> shift) & 0xF) | (((qq[j + 16] >> shift) & 0xF) << 4));
            }
        }
        return 1;
    }
    return 0;
}
