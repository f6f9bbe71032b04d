#include "kernels/isa.h"
#include "util/f16.h"

#include <math.h>
#include <string.h>

static const char *QT_NAMES[QT_COUNT] = {"f32",     "bf16",  "f16",    "q8",     "q4",      "mxfp4",  "q6",
                                         "q2_k",    "q3_k",  "iq1_s",  "iq1_m",  "iq2_xxs", "iq2_xs", "iq2_s",
                                         "iq3_xxs", "iq3_s", "iq4_nl", "iq4_xs", "q5_k",    "q6_k",   "q4_k"};

const char *qtype_name(QType q) { return (unsigned)q < QT_COUNT ? QT_NAMES[q] : "?"; }

int qtype_from_name(const char *name, QType *out) {
    for (int i = 0; i < QT_COUNT; i++)
        if (strcmp(name, QT_NAMES[i]) == 0) {
            *out = (QType)i;
            return 0;
        }
    return -1;
}

size_t qtype_row_bytes(QType q, int cols) {
    size_t blocks = ((size_t)cols + QBLOCK - 1) / QBLOCK;
    switch (q) {
    case QT_F32: return (size_t)cols * 4;
    case QT_BF16:
    case QT_F16: return (size_t)cols * 2;
    case QT_Q8: return blocks * 34;
    case QT_Q4: return blocks * 20;
    case QT_MXFP4: return blocks * 17;
    case QT_Q6: return blocks * 26;
    default: return lowbit_row_bytes(q, cols);
    }
}

/* Round to nearest even without branches on the mantissa (the KV cache stores every K/V row
 * through here): subnormal results come from one float addition that lines the 10 kept bits
 * up at the bottom, normal ones from rebiasing the exponent and adding the rounding bias.
 * Checked against a bit-by-bit reference on all 2^32 inputs; NaN becomes the quiet 0x7e00. */
uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000;
    x &= 0x7fffffff;
    if (x >= 0x47800000u) return (uint16_t)(sign | (x > 0x7f800000u ? 0x7e00 : 0x7c00)); /* >= 65536, inf, NaN */
    if (x < 0x38800000u) {                                                               /* below 2^-14: subnormal or zero */
        const uint32_t magic_bits = 126u << 23;
        float a, magic;
        memcpy(&a, &x, 4);
        memcpy(&magic, &magic_bits, 4);
        a += magic;
        memcpy(&x, &a, 4);
        return (uint16_t)(sign | (x - magic_bits));
    }
    x += 0xc8000fffu + ((x >> 13) & 1); /* exponent 127 -> 15, and half an ulp less the odd bit */
    return (uint16_t)(sign | (x >> 13));
}

float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
    x += 0x7FFF + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

static void store_f16(unsigned char *p, float v) {
    uint16_t h = f32_to_f16(v);
    memcpy(p, &h, 2);
}
static float load_f16(const unsigned char *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_to_f32(h);
}

/* Copies block b of x into a 32-wide buffer, zero-padding past cols. */
static void load_block(const float *x, int cols, int b, float out[QBLOCK]) {
    for (int j = 0; j < QBLOCK; j++) {
        int i = b * QBLOCK + j;
        out[j] = i < cols ? x[i] : 0.0f;
    }
}

static float block_amax(const float v[QBLOCK]) {
    float amax = 0;
    for (int j = 0; j < QBLOCK; j++) amax = fmaxf(amax, fabsf(v[j]));
    return amax;
}

void quantize_row(QType q, const float *x, int cols, void *dst) {
    unsigned char *o = dst;
    int blocks = (cols + QBLOCK - 1) / QBLOCK;
    float v[QBLOCK];
    switch (q) {
    case QT_F32: memcpy(dst, x, (size_t)cols * 4); return;
    case QT_BF16:
        for (int i = 0; i < cols; i++) {
            uint16_t h = f32_to_bf16(x[i]);
            memcpy(o + 2 * i, &h, 2);
        }
        return;
    case QT_F16:
        for (int i = 0; i < cols; i++) store_f16(o + 2 * i, x[i]);
        return;
    case QT_Q8:
        for (int b = 0; b < blocks; b++, o += 34) {
            load_block(x, cols, b, v);
            store_f16(o, block_amax(v) / 127.0f);
            float d = load_f16(o), id = d != 0 ? 1.0f / d : 0.0f;
            for (int j = 0; j < QBLOCK; j++) {
                float r = roundf(v[j] * id);
                r = r > 127 ? 127 : (r < -127 ? -127 : r);
                o[2 + j] = (unsigned char)(int8_t)r;
            }
        }
        return;
    case QT_Q4:
        for (int b = 0; b < blocks; b++, o += 20) {
            load_block(x, cols, b, v);
            /* the padded tail of a short last block must not widen the range */
            int n = cols - b * QBLOCK < QBLOCK ? cols - b * QBLOCK : QBLOCK;
            float lo = v[0], hi = v[0];
            for (int j = 1; j < n; j++) {
                lo = fminf(lo, v[j]);
                hi = fmaxf(hi, v[j]);
            }
            store_f16(o, (hi - lo) / 15.0f);
            store_f16(o + 2, lo);
            float d = load_f16(o), m = load_f16(o + 2), id = d != 0 ? 1.0f / d : 0.0f;
            unsigned char qs[QBLOCK];
            for (int j = 0; j < QBLOCK; j++) {
                float r = j < n ? roundf((v[j] - m) * id) : 0;
                qs[j] = (unsigned char)(r < 0 ? 0 : (r > 15 ? 15 : r));
            }
            for (int j = 0; j < 16; j++) o[4 + j] = (unsigned char)(qs[j] | (qs[j + 16] << 4));
        }
        return;
    case QT_MXFP4: mxfp4_quantize_row(x, cols, dst); return;
    case QT_Q6:
        for (int b = 0; b < blocks; b++, o += 26) {
            load_block(x, cols, b, v);
            store_f16(o, block_amax(v) / 31.0f);
            float d = load_f16(o), id = d != 0 ? 1.0f / d : 0.0f;
            unsigned char u[QBLOCK];
            for (int j = 0; j < QBLOCK; j++) {
                float r = roundf(v[j] * id);
                u[j] = (unsigned char)((r > 31 ? 31 : (r < -32 ? -32 : r)) + 32);
            }
            for (int j = 0; j < 16; j++) o[2 + j] = (unsigned char)((u[j] & 15) | (u[j + 16] & 15) << 4);
            for (int j = 0; j < 8; j++)
                o[18 + j] = (unsigned char)(u[j] >> 4 | (u[j + 8] >> 4) << 2 | (u[j + 16] >> 4) << 4 | (u[j + 24] >> 4) << 6);
        }
        return;
    default: return;
    }
}

void q6_unpack_block(const unsigned char *blk, int8_t q[QBLOCK]) {
    const unsigned char *nib = blk + 2, *hb = blk + 18;
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)(((nib[j] & 15) | ((hb[j % 8] >> (2 * (j / 8))) & 3) << 4) - 32);
        q[j + 16] = (int8_t)(((nib[j] >> 4) | ((hb[j % 8] >> (2 * (j / 8) + 4)) & 3) << 4) - 32);
    }
}

void dequant_row_portable(QType q, const void *src, int cols, float *dst) {
    const unsigned char *s = src;
    int blocks = (cols + QBLOCK - 1) / QBLOCK;
    switch (q) {
    case QT_F32: memcpy(dst, src, (size_t)cols * 4); return;
    case QT_BF16:
        for (int i = 0; i < cols; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = bf16_to_f32(h);
        }
        return;
    case QT_F16:
        for (int i = 0; i < cols; i++) dst[i] = load_f16(s + 2 * i);
        return;
    case QT_Q8: /* writes whole blocks: dst must hold blocks*32 floats */
        for (int b = 0; b < blocks; b++, s += 34) {
            float d = load_f16(s);
            for (int j = 0; j < QBLOCK; j++) dst[b * QBLOCK + j] = d * (float)(int8_t)s[2 + j];
        }
        return;
    case QT_Q4:
        for (int b = 0; b < blocks; b++, s += 20) {
            float d = load_f16(s), m = load_f16(s + 2);
            for (int j = 0; j < 16; j++) {
                dst[b * QBLOCK + j] = d * (float)(s[4 + j] & 15) + m;
                dst[b * QBLOCK + j + 16] = d * (float)(s[4 + j] >> 4) + m;
            }
        }
        return;
    case QT_MXFP4: mxfp4_dequant_block_row(src, cols, dst); return; /* whole blocks, as q8 */
    case QT_Q6:                                                     /* whole blocks, as q8 */
        for (int b = 0; b < blocks; b++, s += 26) {
            float d = load_f16(s);
            int8_t q[QBLOCK];
            q6_unpack_block(s, q);
            for (int j = 0; j < QBLOCK; j++) dst[b * QBLOCK + j] = d * (float)q[j];
        }
        return;
    default: lowbit_dequant_row(q, src, cols, dst); return;
    }
}

float dot_portable(const float *a, const float *b, int n) {
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += a[i + k] * b[i + k];
    float s = 0;
    for (; i < n; i++) s += a[i] * b[i];
    return s + ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

void dequant_row(QType q, const void *src, int cols, float *dst) { dequant_row_portable(q, src, cols, dst); }

#define ACT_QMAX 32767.0f
/* Scale ACT_QMAX/amax; below this amax the reciprocal would overflow: the block counts as zero. */
#define ACT_TINY 1e-30f

/* Nearest-even rounding (nearbyintf in the default mode) is what the AVX2 conversion does, so
 * both kernel sets produce the same bytes. */
void quantize_act_portable(const float *x, int cols, const QAct *a, int t) {
    for (int b = 0; b < a->nb; b++) {
        size_t i = (size_t)t * a->nb + b;
        float v[QBLOCK], amax = 0;
        load_block(x, cols, b, v);
        for (int j = 0; j < QBLOCK; j++) amax = fmaxf(amax, fabsf(v[j]));
        float id = amax >= ACT_TINY ? ACT_QMAX / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < QBLOCK; j++) {
            int q = (int)nearbyintf(v[j] * id);
            a->q[i * QBLOCK + j] = (int16_t)q;
            sum += q;
        }
        size_t k = (size_t)b * a->rows + t;
        a->d[k] = amax >= ACT_TINY ? amax / ACT_QMAX : 0.0f;
        a->s[k] = a->d[k] * (float)sum;
    }
}

/* The portable integer dots walk a weight row once and use each decoded block for all nt
 * activation rows; per row: acc += (dw*dx) * (integer block dot). int_block does it for
 * block b of integer weights q (q8, q6 and q4 unpacked) with scale dw. */
static void int_block(const int8_t *q, float dw, const QAct *a, int b, int t0, int nt, float *acc) {
    for (int r = 0; r < nt; r++) {
        const int16_t *xq = a->q + ((size_t)(t0 + r) * a->nb + b) * QBLOCK;
        size_t k = (size_t)b * a->rows + t0 + r;
        int32_t isum = 0;
        for (int j = 0; j < QBLOCK; j++) isum += q[j] * xq[j];
        acc[r] += (dw * a->d[k]) * (float)isum;
    }
}

static void qdot_q8_row(const unsigned char *s, const QAct *a, int t0, int nt, float *out) {
    float acc[QDOT_MAX_ROWS] = {0};
    for (int b = 0; b < a->nb; b++, s += 34) int_block((const int8_t *)(s + 2), load_f16(s), a, b, t0, nt, acc);
    for (int r = 0; r < nt; r++) out[r] = acc[r];
}

/* q6: q8's arithmetic on the unpacked block. */
static void qdot_q6_row(const unsigned char *s, const QAct *a, int t0, int nt, float *out) {
    float acc[QDOT_MAX_ROWS] = {0};
    for (int b = 0; b < a->nb; b++, s += 26) {
        int8_t q[QBLOCK];
        q6_unpack_block(s, q);
        int_block(q, load_f16(s), a, b, t0, nt, acc);
    }
    for (int r = 0; r < nt; r++) out[r] = acc[r];
}

/* q4: x.w = dw*dx*sum(q*qx) + mw*(dx*sum(qx)); the second sum is the activation's s. */
static void qdot_q4_row(const unsigned char *s, const QAct *a, int t0, int nt, float *out) {
    float acc[QDOT_MAX_ROWS] = {0}, mins[QDOT_MAX_ROWS] = {0};
    for (int b = 0; b < a->nb; b++, s += 20) {
        float mw = load_f16(s + 2);
        int8_t q[QBLOCK];
        for (int j = 0; j < 16; j++) {
            q[j] = (int8_t)(s[4 + j] & 15);
            q[j + 16] = (int8_t)(s[4 + j] >> 4);
        }
        int_block(q, load_f16(s), a, b, t0, nt, acc);
        for (int r = 0; r < nt; r++) mins[r] += mw * a->s[(size_t)b * a->rows + t0 + r];
    }
    for (int r = 0; r < nt; r++) out[r] = acc[r] + mins[r];
}

static void qdot_each_row(void (*row)(const unsigned char *, const QAct *, int, int, float *), const unsigned char *w,
                          size_t row_bytes, int nr, const QAct *a, int t0, int nt, float *y, size_t ldy) {
    for (int r = 0; r < nr; r++) {
        float out[QDOT_MAX_ROWS];
        row(w + (size_t)r * row_bytes, a, t0, nt, out);
        for (int i = 0; i < nt; i++) y[i * ldy + r] = out[i];
    }
}

void qdot_q8_portable(const unsigned char *w, size_t row_bytes, int nr, const QAct *a, int t0, int nt, float *y, size_t ldy) {
    qdot_each_row(qdot_q8_row, w, row_bytes, nr, a, t0, nt, y, ldy);
}

void qdot_q4_portable(const unsigned char *w, size_t row_bytes, int nr, const QAct *a, int t0, int nt, float *y, size_t ldy) {
    qdot_each_row(qdot_q4_row, w, row_bytes, nr, a, t0, nt, y, ldy);
}

void qdot_q6_portable(const unsigned char *w, size_t row_bytes, int nr, const QAct *a, int t0, int nt, float *y, size_t ldy) {
    qdot_each_row(qdot_q6_row, w, row_bytes, nr, a, t0, nt, y, ldy);
}

void qdot_all_portable(QType qt, const unsigned char *w, size_t row_bytes, int nr, const QAct *a, float *y, size_t ldy) {
    const QDotFn f = qt == QT_Q4 ? qdot_q4_portable : qt == QT_Q6 ? qdot_q6_portable : qdot_q8_portable;
    for (int t0 = 0; t0 < a->rows; t0 += QDOT_MAX_ROWS)
        f(w, row_bytes, nr, a, t0, a->rows - t0 < QDOT_MAX_ROWS ? a->rows - t0 : QDOT_MAX_ROWS, y + (size_t)t0 * ldy, ldy);
}
