/* AVX2 (+FMA, F16C) and AVX-512 (F/BW/VL/DQ) instances of the attention head-group kernel
 * (kv_attend_simd.h) for f32, f16 and bf16 cache rows. Compiled with target attributes, so the
 * rest of the engine stays portable; the avx2 and avx512 tables hold them. */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/isa.h"

#define ATT_EXP_ONLY
#include "kernels/kv_attend_simd.h"
#undef ATT_EXP_ONLY


/* ---------------- AVX2 ---------------- */
#define A2 __attribute__((target("avx2,fma,f16c")))
#define A2I A2 __attribute__((always_inline)) static inline

A2I __m256 a2_round(__m256 x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
A2I __m256 a2_exp(__m256 x){ATT_EXP_BODY(__m256, _mm256_set1_ps, _mm256_max_ps, _mm256_mul_ps, _mm256_add_ps, _mm256_fmadd_ps,
                                         _mm256_fnmadd_ps, a2_round, _mm256_cvtps_epi32, _mm256_slli_epi32, _mm256_add_epi32,
                                         _mm256_set1_epi32, _mm256_castsi256_ps)} A2I __m256
    a2_sellt(__m256 x, __m256 lim, __m256 a, __m256 b) {
    return _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, lim, _CMP_LT_OQ));
}
A2I __m256 a2_f32(const unsigned char *r, int i) { return _mm256_loadu_ps((const float *)r + i); }
A2I __m256 a2_f16(const unsigned char *r, int i) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)r + i)));
}
A2I __m256 a2_bf16(const unsigned char *r, int i) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)r + i))), 16));
}

A2I void a2_transpose8(__m256 r[8]) { /* r[i][j] -> r[j][i] */
    __m256 t[8], u[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; i += 4) { /* u[i + c], 128-bit lane k: rows i..i+3, column 4k + c */
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
#pragma GCC unroll 8
    for (int c = 0; c < 4; c++) {
        r[c] = _mm256_permute2f128_ps(u[c], u[c + 4], 0x20);
        r[c + 4] = _mm256_permute2f128_ps(u[c], u[c + 4], 0x31);
    }
}

#define VT __m256
#define W 8
#define TGT A2
#define TGT_INLINE A2I
#define VZERO _mm256_setzero_ps
#define VSET1 _mm256_set1_ps
#define VLOADF _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
#define VFMA _mm256_fmadd_ps
#define VMUL _mm256_mul_ps
#define VADD _mm256_add_ps
#define VSUB _mm256_sub_ps
#define VMAX _mm256_max_ps
#define VEXP a2_exp
#define VSELLT a2_sellt
#define HCMAX 2
#define RBMAX 2
#define VTRANSPOSE a2_transpose8
#define ATT_POS_ROWS 3 /* 4 rows spill the 16 registers: measured slower */
#define LOADE a2_f32
#define LOADE_T float
#define ATT_NAME kv_attend_avx2_f32
#define ATT_BLOCK_NAME kv_attend_avx2_f32_block
#define ATT_REF kv_attend_ref_f32
#include "kernels/kv_attend_simd.h"
#undef LOADE
#undef LOADE_T
#undef ATT_NAME
#undef ATT_BLOCK_NAME
#undef ATT_REF
#define LOADE a2_f16
#define LOADE_T uint16_t
#define ATT_NAME kv_attend_avx2_f16
#define ATT_BLOCK_NAME kv_attend_avx2_f16_block
#define ATT_REF kv_attend_ref_f16
#include "kernels/kv_attend_simd.h"
#undef LOADE
#undef LOADE_T
#undef ATT_NAME
#undef ATT_BLOCK_NAME
#undef ATT_REF
#define LOADE a2_bf16
#define LOADE_T uint16_t
#define ATT_NAME kv_attend_avx2_bf16
#define ATT_BLOCK_NAME kv_attend_avx2_bf16_block
#define ATT_REF kv_attend_ref_bf16
#include "kernels/kv_attend_simd.h"
#undef LOADE
#undef LOADE_T
#undef ATT_NAME
#undef ATT_BLOCK_NAME
#undef ATT_REF
#undef VT
#undef W
#undef TGT
#undef TGT_INLINE
#undef VZERO
#undef VSET1
#undef VLOADF
#undef VSTORE
#undef VFMA
#undef VMUL
#undef VADD
#undef VSUB
#undef VMAX
#undef VEXP
#undef VSELLT
#undef HCMAX
#undef RBMAX
#undef VTRANSPOSE
#undef ATT_POS_ROWS

/* ---------------- AVX-512 ---------------- */
#define A5 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define A5I A5 __attribute__((always_inline)) static inline

A5I __m512 a5_round(__m512 x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
A5I __m512 a5_exp(__m512 x){ATT_EXP_BODY(__m512, _mm512_set1_ps, _mm512_max_ps, _mm512_mul_ps, _mm512_add_ps, _mm512_fmadd_ps,
                                         _mm512_fnmadd_ps, a5_round, _mm512_cvtps_epi32, _mm512_slli_epi32, _mm512_add_epi32,
                                         _mm512_set1_epi32, _mm512_castsi512_ps)} A5I __m512
    a5_sellt(__m512 x, __m512 lim, __m512 a, __m512 b) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, lim, _CMP_LT_OQ), b, a);
}
A5I __m512 a5_f32(const unsigned char *r, int i) { return _mm512_loadu_ps((const float *)r + i); }
A5I __m512 a5_f16(const unsigned char *r, int i) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)r + i)));
}
A5I __m512 a5_bf16(const unsigned char *r, int i) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)r + i))), 16));
}

A5I void a5_transpose16(__m512 r[16]) { /* r[i][j] -> r[j][i] */
    __m512 t[16], u[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i += 4) { /* u[i + c], 128-bit lane k: rows i..i+3, column 4k + c */
        u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
#pragma GCC unroll 16
    for (int c = 0; c < 4; c++) {
        const __m512 a = _mm512_shuffle_f32x4(u[c], u[c + 4], 0x88), b = _mm512_shuffle_f32x4(u[c], u[c + 4], 0xDD);
        const __m512 e = _mm512_shuffle_f32x4(u[c + 8], u[c + 12], 0x88), f = _mm512_shuffle_f32x4(u[c + 8], u[c + 12], 0xDD);
        r[c] = _mm512_shuffle_f32x4(a, e, 0x88);
        r[c + 8] = _mm512_shuffle_f32x4(a, e, 0xDD);
        r[c + 4] = _mm512_shuffle_f32x4(b, f, 0x88);
        r[c + 12] = _mm512_shuffle_f32x4(b, f, 0xDD);
    }
}

#define VT __m512
#define W 16
#define TGT A5
#define TGT_INLINE A5I
#define VZERO _mm512_setzero_ps
#define VSET1 _mm512_set1_ps
#define VLOADF _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define VFMA _mm512_fmadd_ps
#define VMUL _mm512_mul_ps
#define VADD _mm512_add_ps
#define VSUB _mm512_sub_ps
#define VMAX _mm512_max_ps
#define VEXP a5_exp
#define VSELLT a5_sellt
#define HCMAX 4
#define RBMAX 4
#define VTRANSPOSE a5_transpose16
#define ATT_POS_ROWS 8 /* decode groups up to this many heads take the positions-in-lanes path */
#define LOADE a5_f32
#define LOADE_T float
#define ATT_NAME kv_attend_avx512_f32
#define ATT_BLOCK_NAME kv_attend_avx512_f32_block
#define ATT_REF kv_attend_ref_f32
#include "kernels/kv_attend_simd.h"
#undef LOADE
#undef LOADE_T
#undef ATT_NAME
#undef ATT_BLOCK_NAME
#undef ATT_REF
#define LOADE a5_f16
#define LOADE_T uint16_t
#define ATT_NAME kv_attend_avx512_f16
#define ATT_BLOCK_NAME kv_attend_avx512_f16_block
#define ATT_REF kv_attend_ref_f16
#include "kernels/kv_attend_simd.h"
#undef LOADE
#undef LOADE_T
#undef ATT_NAME
#undef ATT_BLOCK_NAME
#undef ATT_REF
#define LOADE a5_bf16
#define LOADE_T uint16_t
#define ATT_NAME kv_attend_avx512_bf16
#define ATT_BLOCK_NAME kv_attend_avx512_bf16_block
#define ATT_REF kv_attend_ref_bf16
#include "kernels/kv_attend_simd.h"
#endif
