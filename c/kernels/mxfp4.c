/* MXFP4 rows (gpt-oss releases' expert format, kept as-is): blocks of 32 values, each
 * [e8m0 byte E][16 bytes of e2m1 nibbles: byte j = element j (low) and element j + 16 (high)],
 * x = e2m1(code) * 2^(E - 127) (GGUF's block_mxfp4 byte for byte). The dots use the codes as
 * doubled integers (-12..12) and the block scale 2^(E - 128), exact in f32, against the int16
 * activations (QAct): acc += (dw * dx) * (integer block dot), as the q8 dot does. Portable,
 * AVX2 (also the AVX-512 set's: the int16 design gains nothing at 512 bits, see kernels/avx512.c)
 * and NEON (the portable arithmetic, bit for bit). */
#include <math.h>
#include <string.h>

#include "kernels/quant.h"

#define MX_BYTES 17
static const int8_t MX_INT[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* 2^(E - 128): the scale of the doubled integer codes. E < 2 is a subnormal f32. */
static inline float mx_half_scale(unsigned char e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

void mxfp4_dequant_block_row(const void *src, int cols, float *dst) { /* whole blocks */
    const unsigned char *s = src;
    for (int b = 0; b < (cols + QBLOCK - 1) / QBLOCK; b++, s += MX_BYTES) {
        const float d = mx_half_scale(s[0]);
        for (int j = 0; j < 16; j++) {
            dst[b * QBLOCK + j] = d * (float)MX_INT[s[1 + j] & 15];
            dst[b * QBLOCK + j + 16] = d * (float)MX_INT[s[1 + j] >> 4];
        }
    }
}

/* Nearest e2m1 code of v (in units of the block scale, |v| <= 6); ties to the even code. */
static unsigned char e2m1_code(float v) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float a = v < 0 ? -v : v;
    int best = 0;
    for (int i = 1; i < 8; i++) {
        float di = a - mag[i] < 0 ? mag[i] - a : a - mag[i], db = a - mag[best] < 0 ? mag[best] - a : a - mag[best];
        if (di < db || (di == db && !(i & 1))) best = i;
    }
    return (unsigned char)(best | (v < 0 && best ? 8 : 0));
}

/* The smallest power-of-two scale that fits the block's largest magnitude in e2m1's 6. */
void mxfp4_quantize_row(const float *x, int cols, void *dst) {
    unsigned char *o = dst;
    for (int b = 0; b < (cols + QBLOCK - 1) / QBLOCK; b++, o += MX_BYTES) {
        float v[QBLOCK], amax = 0;
        for (int j = 0; j < QBLOCK; j++) {
            v[j] = b * QBLOCK + j < cols ? x[b * QBLOCK + j] : 0.0f;
            float a = v[j] < 0 ? -v[j] : v[j];
            amax = a > amax ? a : amax;
        }
        int ex, e = -127; /* 2^e: the scale; E = e + 127 in 0..254 */
        if (amax > 0) {
            float m = frexpf(amax / 6.0f, &ex); /* amax/6 = m 2^ex, m in [0.5, 1): 2^e >= amax/6 */
            e = m == 0.5f ? ex - 1 : ex;
            e = e < -127 ? -127 : (e > 127 ? 127 : e);
        }
        const float inv = 1.0f / (mx_half_scale((unsigned char)(e + 127)) * 2.0f);
        o[0] = (unsigned char)(e + 127);
        unsigned char q[QBLOCK];
        for (int j = 0; j < QBLOCK; j++) q[j] = e2m1_code(v[j] * inv);
        for (int j = 0; j < 16; j++) o[1 + j] = (unsigned char)(q[j] | q[j + 16] << 4);
    }
}

/* An MXFP4 row in the release layout (blocks: byte j = elements 2j low, 2j+1 high; scales one
 * byte per 32) as a container row, codes and scales copied. */
void mxfp4_from_release(const unsigned char *blocks, const unsigned char *scales, int cols, void *dst) {
    unsigned char *o = dst;
    for (int b = 0; b < cols / QBLOCK; b++, o += MX_BYTES) {
        unsigned char q[QBLOCK];
        for (int j = 0; j < 16; j++) {
            q[2 * j] = blocks[b * 16 + j] & 15;
            q[2 * j + 1] = blocks[b * 16 + j] >> 4;
        }
        o[0] = scales[b];
        for (int j = 0; j < 16; j++) o[1 + j] = (unsigned char)(q[j] | q[j + 16] << 4);
    }
}

static void mx_row_portable(const unsigned char *s, const QAct *a, int t0, int nt, float *out) {
    float acc[QDOT_MAX_ROWS] = {0};
    for (int b = 0; b < a->nb; b++, s += MX_BYTES) {
        const float dw = mx_half_scale(s[0]);
        int16_t w[QBLOCK];
        for (int j = 0; j < 16; j++) {
            w[j] = MX_INT[s[1 + j] & 15];
            w[j + 16] = MX_INT[s[1 + j] >> 4];
        }
        for (int r = 0; r < nt; r++) {
            const int16_t *xq = a->q + ((size_t)(t0 + r) * a->nb + b) * QBLOCK;
            int32_t isum = 0;
            for (int j = 0; j < QBLOCK; j++) isum += w[j] * xq[j];
            acc[r] += (dw * a->d[(size_t)b * a->rows + t0 + r]) * (float)isum;
        }
    }
    for (int r = 0; r < nt; r++) out[r] = acc[r];
}

void qdot_mxfp4_portable(const unsigned char *w, size_t row_bytes, int nr, const QAct *a, int t0, int nt, float *y, size_t ldy) {
    for (int r = 0; r < nr; r++) {
        float out[QDOT_MAX_ROWS];
        mx_row_portable(w + (size_t)r * row_bytes, a, t0, nt, out);
        for (int i = 0; i < nt; i++) y[i * ldy + r] = out[i];
    }
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MX_AVX2 __attribute__((target("avx2,fma,f16c")))
#define MX_INLINE MX_AVX2 __attribute__((always_inline)) static inline

MX_INLINE float mx_hsum(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* One weight row against nt activation rows: the 16 code bytes become two int16 vectors by a
 * byte shuffle through the code table; per block and row one madd pass and one FMA. */
MX_INLINE void mx_row_avx2(const unsigned char *w, const QAct *a, int t0, const int nt, const size_t ds, float *out) {
    const __m128i table = _mm_loadu_si128((const __m128i *)MX_INT), low = _mm_set1_epi8(15);
    const size_t xrow = (size_t)a->nb * QBLOCK;
    const int16_t *x = a->q + t0 * xrow;
    const float *d = a->d + t0;
    __m256 acc[QDOT_MAX_ROWS];
    for (int r = 0; r < nt; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < a->nb; b++, w += MX_BYTES, x += QBLOCK) {
        const __m128i raw = _mm_loadu_si128((const __m128i *)(w + 1));
        const __m256i lo = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(table, _mm_and_si128(raw, low)));
        const __m256i hi = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(raw, 4), low)));
        const float dw = mx_half_scale(w[0]);
#pragma GCC unroll 4
        for (int r = 0; r < nt; r++) {
            const int16_t *xr = x + r * xrow;
            __m256i s = _mm256_add_epi32(_mm256_madd_epi16(lo, _mm256_loadu_si256((const __m256i *)xr)),
                                         _mm256_madd_epi16(hi, _mm256_loadu_si256((const __m256i *)(xr + 16))));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * d[b * ds + r]), _mm256_cvtepi32_ps(s), acc[r]);
        }
    }
    for (int r = 0; r < nt; r++) out[r] = mx_hsum(acc[r]);
}

MX_INLINE void mx_rows_avx2(const unsigned char *w, size_t row_bytes, int nr, const QAct *a, int t0, const int nt,
                            const size_t ds, float *y, size_t ldy) {
    for (int r = 0; r < nr; r++, w += row_bytes) {
        float out[QDOT_MAX_ROWS];
        mx_row_avx2(w, a, t0, nt, ds, out);
        for (int i = 0; i < nt; i++) y[i * ldy + r] = out[i];
    }
}

MX_AVX2 void qdot_mxfp4_avx2(const unsigned char *w, size_t row_bytes, int nr, const QAct *a, int t0, int nt, float *y,
                             size_t ldy) {
    const size_t ds = (size_t)a->rows;
    switch (nt) {
    case 1:
        if (ds == 1) mx_rows_avx2(w, row_bytes, nr, a, t0, 1, 1, y, ldy);
        else mx_rows_avx2(w, row_bytes, nr, a, t0, 1, ds, y, ldy);
        return;
    case 2: mx_rows_avx2(w, row_bytes, nr, a, t0, 2, ds, y, ldy); return;
    case 3: mx_rows_avx2(w, row_bytes, nr, a, t0, 3, ds, y, ldy); return;
    default: mx_rows_avx2(w, row_bytes, nr, a, t0, 4, ds, y, ldy); return;
    }
}
#endif

#if defined(__aarch64__)
#include <arm_neon.h>

static void mx_row_neon(const unsigned char *s, const QAct *a, int t0, int nt, float *out) {
    const int8x16_t table = vld1q_s8(MX_INT);
    float acc[QDOT_MAX_ROWS] = {0};
    for (int b = 0; b < a->nb; b++, s += MX_BYTES) {
        const float dw = mx_half_scale(s[0]);
        const uint8x16_t raw = vld1q_u8(s + 1);
        const int8x16_t lo = vqtbl1q_s8(table, vandq_u8(raw, vdupq_n_u8(15))), hi = vqtbl1q_s8(table, vshrq_n_u8(raw, 4));
        const int16x8_t w[4] = {vmovl_s8(vget_low_s8(lo)), vmovl_high_s8(lo), vmovl_s8(vget_low_s8(hi)), vmovl_high_s8(hi)};
        for (int r = 0; r < nt; r++) {
            const int16_t *xq = a->q + ((size_t)(t0 + r) * a->nb + b) * QBLOCK;
            int32x4_t s4 = vdupq_n_s32(0);
            for (int k = 0; k < 4; k++) {
                const int16x8_t xv = vld1q_s16(xq + 8 * k);
                s4 = vmlal_s16(s4, vget_low_s16(w[k]), vget_low_s16(xv));
                s4 = vmlal_high_s16(s4, w[k], xv);
            }
            acc[r] += (dw * a->d[(size_t)b * a->rows + t0 + r]) * (float)vaddvq_s32(s4);
        }
    }
    for (int r = 0; r < nt; r++) out[r] = acc[r];
}

void qdot_mxfp4_neon(const unsigned char *w, size_t row_bytes, int nr, const QAct *a, int t0, int nt, float *y, size_t ldy) {
    for (int r = 0; r < nr; r++) {
        float out[QDOT_MAX_ROWS];
        mx_row_neon(w + (size_t)r * row_bytes, a, t0, nt, out);
        for (int i = 0; i < nt; i++) y[i * ldy + r] = out[i];
    }
}
#endif
