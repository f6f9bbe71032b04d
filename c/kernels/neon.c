/* NEON q8/q4/q6 dots (AArch64): the portable kernels' arithmetic with each block's integer dot
 * (int16 activations x widened weights, exact in int32) done 8 lanes at a time, so the results
 * are bit-identical to the portable reference. */
#if defined(__aarch64__)
#include <arm_neon.h>
#include <string.h>

#include "kernels/isa.h"

static inline float f16_at(const unsigned char *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_to_f32(h);
}

/* sum of w[j] * x[j], j < 32, for int16 w (four vectors of 8) and the activation block x */
static inline int32_t block_isum(const int16x8_t w[4], const int16_t *x) {
    int32x4_t acc = vdupq_n_s32(0);
    for (int k = 0; k < 4; k++) {
        const int16x8_t xv = vld1q_s16(x + 8 * k);
        acc = vmlal_s16(acc, vget_low_s16(w[k]), vget_low_s16(xv));
        acc = vmlal_high_s16(acc, w[k], xv);
    }
    return vaddvq_s32(acc);
}

/* Block b of signed weights (elements 0..15 in lo, 16..31 in hi; scale dw) against rows
 * t0..t0+nt-1: the portable kernel's float steps. */
static inline void signed_block(int8x16_t lo, int8x16_t hi, float dw, const QAct *a, int b, int t0, int nt, float *acc) {
    const int16x8_t w[4] = {vmovl_s8(vget_low_s8(lo)), vmovl_high_s8(lo), vmovl_s8(vget_low_s8(hi)), vmovl_high_s8(hi)};
    for (int r = 0; r < nt; r++) {
        const int16_t *xq = a->q + ((size_t)(t0 + r) * a->nb + b) * QBLOCK;
        const size_t k = (size_t)b * a->rows + t0 + r;
        acc[r] += (dw * a->d[k]) * (float)block_isum(w, xq);
    }
}

static void q8_row(const unsigned char *s, const QAct *a, int t0, int nt, float *out) {
    float acc[QDOT_MAX_ROWS] = {0};
    for (int b = 0; b < a->nb; b++, s += 34)
        signed_block(vld1q_s8((const int8_t *)(s + 2)), vld1q_s8((const int8_t *)(s + 18)), f16_at(s), a, b, t0, nt, acc);
    for (int r = 0; r < nt; r++) out[r] = acc[r];
}

static void q4_row(const unsigned char *s, const QAct *a, int t0, int nt, float *out) {
    float acc[QDOT_MAX_ROWS] = {0}, mins[QDOT_MAX_ROWS] = {0};
    for (int b = 0; b < a->nb; b++, s += 20) {
        const float dw = f16_at(s), mw = f16_at(s + 2);
        const uint8x16_t raw = vld1q_u8(s + 4), lo = vandq_u8(raw, vdupq_n_u8(15)), hi = vshrq_n_u8(raw, 4);
        const int16x8_t w[4] = {vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(lo))), vreinterpretq_s16_u16(vmovl_high_u8(lo)),
                                vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(hi))), vreinterpretq_s16_u16(vmovl_high_u8(hi))};
        for (int r = 0; r < nt; r++) {
            const int16_t *xq = a->q + ((size_t)(t0 + r) * a->nb + b) * QBLOCK;
            const size_t k = (size_t)b * a->rows + t0 + r;
            acc[r] += (dw * a->d[k]) * (float)block_isum(w, xq);
            mins[r] += mw * a->s[k];
        }
    }
    for (int r = 0; r < nt; r++) out[r] = acc[r] + mins[r];
}

/* q6: elements j and j+16 from nibble byte j; their high bits from byte j % 8 of the last 8,
 * a 64-bit shift by 2k bringing each byte's pair k to its low bits (quant.h's layout). */
static inline uint8x8_t shr64(uint8x8_t v, const int n) { return vreinterpret_u8_u64(vshr_n_u64(vreinterpret_u64_u8(v), n)); }

static void q6_row(const unsigned char *s, const QAct *a, int t0, int nt, float *out) {
    float acc[QDOT_MAX_ROWS] = {0};
    const uint8x16_t m4 = vdupq_n_u8(15), m2 = vdupq_n_u8(3);
    for (int b = 0; b < a->nb; b++, s += 26) {
        const float dw = f16_at(s);
        const uint8x16_t nib = vld1q_u8(s + 2);
        const uint8x8_t hb = vld1_u8(s + 18);
        const uint8x16_t h01 = vandq_u8(vcombine_u8(hb, shr64(hb, 2)), m2);
        const uint8x16_t h23 = vandq_u8(vcombine_u8(shr64(hb, 4), shr64(hb, 6)), m2);
        const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(nib, m4), vshlq_n_u8(h01, 4))), vdupq_n_s8(32));
        const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(nib, 4), vshlq_n_u8(h23, 4))), vdupq_n_s8(32));
        signed_block(lo, hi, dw, a, b, t0, nt, acc);
    }
    for (int r = 0; r < nt; r++) out[r] = acc[r];
}

#define QDOT_NEON(NAME, ROW)                                                                                           \
    void NAME(const unsigned char *w, size_t row_bytes, int nr, const QAct *a, int t0, int nt, float *y, size_t ldy) { \
        for (int r = 0; r < nr; r++) {                                                                                 \
            float out[QDOT_MAX_ROWS];                                                                                  \
            ROW(w + (size_t)r * row_bytes, a, t0, nt, out);                                                            \
            for (int i = 0; i < nt; i++) y[i * ldy + r] = out[i];                                                      \
        }                                                                                                              \
    }
QDOT_NEON(qdot_q8_neon, q8_row)
QDOT_NEON(qdot_q4_neon, q4_row)
QDOT_NEON(qdot_q6_neon, q6_row)

/* The NEON set: its dots, attention and DSA scores (row dots with this set's dot).
 * Dequantization, activation quantization, the MLA absorption and the delta rule are the
 * portable C, which the compiler vectorizes for NEON: NULL here, so `colibri version` lists
 * them. */
const Kernels kernel_set_neon = {
    .name = "neon",
    .isa = KI_NEON,
    .dot = dot_neon,
    .qdot = {[QT_Q8] = qdot_q8_neon, [QT_Q4] = qdot_q4_neon, [QT_MXFP4] = qdot_mxfp4_neon, [QT_Q6] = qdot_q6_neon},
    .dsa_scores = dsa_scores_neon,
    .kv = {{kv_dot_f32_portable, kv_axpy_f32_portable, kv_attend_neon_f32, kv_attend_neon_f32_block},
           {kv_dot_f16_portable, kv_axpy_f16_portable, kv_attend_neon_f16, kv_attend_neon_f16_block},
           {kv_dot_bf16_portable, kv_axpy_bf16_portable, kv_attend_neon_bf16, kv_attend_neon_bf16_block}},
};
#endif
