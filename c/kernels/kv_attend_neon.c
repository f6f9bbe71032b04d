/* NEON (AArch64, where it is always present) instances of the attention head-group kernel
 * (kv_attend_simd.h) for f32, f16 and bf16 cache rows, and the float dot of the neon set. */
#if defined(__aarch64__)
#include <arm_neon.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/isa.h"

#define ATT_EXP_ONLY
#include "kernels/kv_attend_simd.h"
#undef ATT_EXP_ONLY


#define NI __attribute__((always_inline)) static inline

NI float32x4_t n_fma(float32x4_t a, float32x4_t b, float32x4_t c) { return vfmaq_f32(c, a, b); }
NI float32x4_t n_fnma(float32x4_t a, float32x4_t b, float32x4_t c) { return vfmsq_f32(c, a, b); }
NI int32x4_t n_slli23(int32x4_t x, int s) {
    (void)s;
    return vshlq_n_s32(x, 23);
}
NI float32x4_t n_exp(float32x4_t x){ATT_EXP_BODY(float32x4_t, vdupq_n_f32, vmaxq_f32, vmulq_f32, vaddq_f32, n_fma, n_fnma,
                                                 vrndnq_f32, vcvtq_s32_f32, n_slli23, vaddq_s32, vdupq_n_s32,
                                                 vreinterpretq_f32_s32)} NI float32x4_t n_zero(void) {
    return vdupq_n_f32(0);
}
NI float32x4_t n_sellt(float32x4_t x, float32x4_t lim, float32x4_t a, float32x4_t b) {
    return vbslq_f32(vcltq_f32(x, lim), a, b);
}
NI float32x4_t n_f32(const unsigned char *r, int i) { return vld1q_f32((const float *)r + i); }
NI float32x4_t n_f16(const unsigned char *r, int i) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)r + i)));
}
NI float32x4_t n_bf16(const unsigned char *r, int i) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)r + i), 16));
}

#define VT float32x4_t
#define W 4
#define TGT
#define TGT_INLINE NI
#define VZERO n_zero
#define VSET1 vdupq_n_f32
#define VLOADF vld1q_f32
#define VSTORE vst1q_f32
#define VFMA n_fma
#define VMUL vmulq_f32
#define VADD vaddq_f32
#define VSUB vsubq_f32
#define VMAX vmaxq_f32
#define VEXP n_exp
#define VSELLT n_sellt
#define HCMAX 4
#define RBMAX 4
#define LOADE n_f32
#define LOADE_T float
#define ATT_NAME kv_attend_neon_f32
#define ATT_BLOCK_NAME kv_attend_neon_f32_block
#define ATT_REF kv_attend_ref_f32
#include "kernels/kv_attend_simd.h"
#undef LOADE
#undef LOADE_T
#undef ATT_NAME
#undef ATT_BLOCK_NAME
#undef ATT_REF
#define LOADE n_f16
#define LOADE_T uint16_t
#define ATT_NAME kv_attend_neon_f16
#define ATT_BLOCK_NAME kv_attend_neon_f16_block
#define ATT_REF kv_attend_ref_f16
#include "kernels/kv_attend_simd.h"
#undef LOADE
#undef LOADE_T
#undef ATT_NAME
#undef ATT_BLOCK_NAME
#undef ATT_REF
#define LOADE n_bf16
#define LOADE_T uint16_t
#define ATT_NAME kv_attend_neon_bf16
#define ATT_BLOCK_NAME kv_attend_neon_bf16_block
#define ATT_REF kv_attend_ref_bf16
#include "kernels/kv_attend_simd.h"

float dot_neon(const float *a, const float *b, int n) {
    float32x4_t s0 = vdupq_n_f32(0), s1 = vdupq_n_f32(0), s2 = vdupq_n_f32(0), s3 = vdupq_n_f32(0);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
        s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
        s2 = vfmaq_f32(s2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
        s3 = vfmaq_f32(s3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
    }
    for (; i + 4 <= n; i += 4) s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
    float r = vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}
#endif
