/* AVX2 + FMA + F16C row kernels; compiled with target attributes so the rest of the engine
 * stays portable and the choice is made at run time (kernels_init). */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <string.h>

#include "kernels/q6_unpack_x86.h"
#include "kernels/isa.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 static inline __m256 load8_bf16(const unsigned char *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

AVX2 static inline float f16s(const unsigned char *p) {
    unsigned short h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

AVX2 void dequant_row_avx2(QType q, const void *src, int cols, float *dst) {
    const unsigned char *s = src;
    int blocks = (cols + QBLOCK - 1) / QBLOCK, i = 0;
    switch (q) {
    case QT_F32: memcpy(dst, src, (size_t)cols * 4); return;
    case QT_BF16:
        for (; i + 8 <= cols; i += 8) _mm256_storeu_ps(dst + i, load8_bf16(s + 2 * i));
        for (; i < cols; i++) {
            unsigned short h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = bf16_to_f32(h);
        }
        return;
    case QT_F16:
        for (; i + 8 <= cols; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 2 * i))));
        for (; i < cols; i++) dst[i] = f16s(s + 2 * i);
        return;
    case QT_Q8:
        for (int b = 0; b < blocks; b++, s += 34) {
            __m256 d = _mm256_set1_ps(f16s(s));
            for (int k = 0; k < 4; k++) {
                __m128i q8 = _mm_loadl_epi64((const __m128i *)(s + 2 + 8 * k));
                __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
                _mm256_storeu_ps(dst + b * QBLOCK + 8 * k, _mm256_mul_ps(d, v));
            }
        }
        return;
    case QT_Q4: {
        const __m128i lowmask = _mm_set1_epi8(15);
        for (int b = 0; b < blocks; b++, s += 20) {
            __m256 d = _mm256_set1_ps(f16s(s)), m = _mm256_set1_ps(f16s(s + 2));
            __m128i raw = _mm_loadu_si128((const __m128i *)(s + 4));
            __m128i lo = _mm_and_si128(raw, lowmask), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), lowmask);
            float *o = dst + b * QBLOCK;
            _mm256_storeu_ps(o, _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), m));
            _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), m));
            _mm256_storeu_ps(o + 16, _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), m));
            _mm256_storeu_ps(o + 24, _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), m));
        }
        return;
    }
    case QT_Q6:
        for (int b = 0; b < blocks; b++, s += 26) {
            __m256 d = _mm256_set1_ps(f16s(s));
            __m128i q[2];
            q6_unpack_avx2(s, &q[0], &q[1]);
            for (int k = 0; k < 4; k++) {
                __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(k & 1 ? _mm_srli_si128(q[k / 2], 8) : q[k / 2]));
                _mm256_storeu_ps(dst + b * QBLOCK + 8 * k, _mm256_mul_ps(d, v));
            }
        }
        return;
    default: dequant_row(q, src, cols, dst); return; /* the portable codec (mxfp4) */
    }
}

AVX2 float dot_avx2(const float *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float r = _mm_cvtss_f32(h);
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

/* ---- int16 activations x q8/q4 weights: integer dot per block, one FMA per block ---- */

#define AVX2_INLINE AVX2 __attribute__((always_inline)) static inline
#define ACT_QMAX 32767.0f /* as quantize_act_portable */
#define ACT_TINY 1e-30f

AVX2_INLINE float hsum_ps(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

AVX2_INLINE float hmax_ps(__m256 v) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

AVX2_INLINE int hsum_epi32(__m256i v) {
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(h);
}

/* Bit-identical to quantize_act_portable: same amax, same product v*(ACT_QMAX/amax), and
 * cvtps_epi32 rounds to nearest even like nearbyintf. */
AVX2 void quantize_act_avx2(const float *x, int cols, const QAct *a, int t) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int b = 0; b < a->nb; b++) {
        size_t i = (size_t)t * a->nb + b;
        const float *p = x + (size_t)b * QBLOCK;
        float tail[QBLOCK];
        if ((b + 1) * QBLOCK > cols) { /* zero-pad the short last block */
            memset(tail, 0, sizeof tail);
            memcpy(tail, p, sizeof(float) * (size_t)(cols - b * QBLOCK));
            p = tail;
        }
        __m256 v[4], m = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(p + 8 * k);
            m = _mm256_max_ps(m, _mm256_and_ps(v[k], absmask));
        }
        float amax = hmax_ps(m);
        __m256 id = _mm256_set1_ps(amax >= ACT_TINY ? ACT_QMAX / amax : 0.0f);
        __m256i q[4];
        for (int k = 0; k < 4; k++) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], id));
        int sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
        int16_t *o = a->q + i * QBLOCK;
        for (int k = 0; k < 2; k++) { /* packs works per 128-bit lane; the permute restores order */
            __m256i p16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2 * k], q[2 * k + 1]), 0xD8);
            _mm256_storeu_si256((__m256i *)(o + 16 * k), p16);
        }
        size_t k = (size_t)b * a->rows + t;
        a->d[k] = amax >= ACT_TINY ? amax / ACT_QMAX : 0.0f;
        a->s[k] = a->d[k] * (float)sum;
    }
}

/* The f16 at p in lane 0 (a q8 block's d). */
AVX2_INLINE __m128 f16_one(const unsigned char *p) {
    unsigned short h;
    memcpy(&h, p, 2);
    return _mm_cvtph_ps(_mm_cvtsi32_si128(h));
}

/* The two f16 at p (a q4 block's d and m) in lanes 0 and 1, one conversion. */
AVX2_INLINE __m128 f16_pair(const unsigned char *p) {
    int bits;
    memcpy(&bits, p, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
}

/* Weight elements 0..15 and 16..31 as int16 against the activation block: 8 int32 lane sums
 * (exact: |products| <= 128 x 32767, four per lane) as floats. */
AVX2_INLINE __m256 block_dot(__m256i w_lo, __m256i w_hi, const int16_t *x) {
    __m256i lo = _mm256_madd_epi16(w_lo, _mm256_loadu_si256((const __m256i *)x));
    __m256i hi = _mm256_madd_epi16(w_hi, _mm256_loadu_si256((const __m256i *)(x + 16)));
    return _mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi));
}

/* Floats p[0..nt-1] in the low lanes, zeros above (nt is a compile-time constant). */
AVX2_INLINE __m128 load_n(const float *p, const int nt) {
    if (nt == 1) return _mm_load_ss(p);
    __m128 two = _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)p)); /* no alignment needed */
    if (nt == 2) return two;
    if (nt == 3) return _mm_movelh_ps(two, _mm_load_ss(p + 2));
    return _mm_loadu_ps(p);
}

/* w * p[r] in lane r < nt, w taken from lane 0: one weight-block factor times the nt rows'
 * factors; lanes >= nt are unused. Lane 0 is the same IEEE product whether nt is 1 (scalar)
 * or more (vector). */
AVX2_INLINE __m128 times_n(__m128 w, const float *p, const int nt) {
    if (nt == 1) return _mm_mul_ss(w, _mm_load_ss(p)); /* lanes 1-3: whatever w has there */
    return _mm_mul_ps(_mm_broadcastss_ps(w), load_n(p, nt));
}

/* Lane r of v in all 8 lanes. */
AVX2_INLINE __m256 lane(__m128 v, const int r) {
    if (r == 0) return _mm256_broadcastss_ps(v);
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(v), _mm256_set1_epi32(r));
}

/* One weight block (q8, or q6 when q6) against one block of nt activation rows (x: row 0's
 * block, later rows xrow int16 apart; d: their scales): acc[r] += (dw*d[r]) * dot_r, the
 * scales as one vector. */
AVX2_INLINE void q8_block(const int q6, const unsigned char *w, const int16_t *x, size_t xrow, const float *d, const int nt,
                          __m256 *acc) {
    __m128i q_lo, q_hi;
    if (q6) q6_unpack_avx2(w, &q_lo, &q_hi);
    else q_lo = _mm_loadu_si128((const __m128i *)(w + 2)), q_hi = _mm_loadu_si128((const __m128i *)(w + 18));
    const __m256i lo = _mm256_cvtepi8_epi16(q_lo), hi = _mm256_cvtepi8_epi16(q_hi);
    const __m128 sc = times_n(f16_one(w), d, nt);
#pragma GCC unroll 4
    for (int r = 0; r < nt; r++) acc[r] = _mm256_fmadd_ps(lane(sc, r), block_dot(lo, hi, x + r * xrow), acc[r]);
}

/* As q8_block, plus the min term: lane r of mins += mw * s[r]. */
AVX2_INLINE void q4_block(const unsigned char *w, const int16_t *x, size_t xrow, const float *d, const float *s, const int nt,
                          __m256 *acc, __m128 *mins) {
    /* byte j widened to int16: its low nibble is element j, the byte >> 4 is element j+16 */
    const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(w + 4)));
    const __m256i lo = _mm256_and_si256(bytes, _mm256_set1_epi16(15)), hi = _mm256_srli_epi16(bytes, 4);
    const __m128 dm = f16_pair(w);
    const __m128 sc = times_n(dm, d, nt);
    *mins = _mm_add_ps(*mins, times_n(_mm_movehdup_ps(dm), s, nt));
#pragma GCC unroll 4
    for (int r = 0; r < nt; r++) acc[r] = _mm256_fmadd_ps(lane(sc, r), block_dot(lo, hi, x + r * xrow), acc[r]);
}

/* One weight row against activation rows t0..t0+nt-1. ds is a->rows (the block stride of d and
 * s), passed separately so that decode (one row) gets it as the constant 1. Every operation on
 * a row pair is the same whatever nt is (lanes of one vector instead of scalars change
 * nothing), so batched prefill equals token by token bit for bit. */
AVX2_INLINE void qdot_q8_row(const int q6, const unsigned char *w, const QAct *a, int t0, const int nt, const size_t ds,
                             float *out) {
    const size_t xrow = (size_t)a->nb * QBLOCK, bb = q6 ? 26 : 34;
    const int16_t *x = a->q + t0 * xrow;
    const float *d = a->d + t0;
    __m256 acc[QDOT_MAX_ROWS];
    for (int r = 0; r < nt; r++) acc[r] = _mm256_setzero_ps();
#pragma GCC unroll 2
    for (int b = 0; b < a->nb; b++, w += bb, x += QBLOCK) q8_block(q6, w, x, xrow, d + b * ds, nt, acc);
    for (int r = 0; r < nt; r++) out[r] = hsum_ps(acc[r]);
}

AVX2_INLINE void qdot_q4_row(const unsigned char *w, const QAct *a, int t0, const int nt, const size_t ds, float *out) {
    const size_t xrow = (size_t)a->nb * QBLOCK;
    const int16_t *x = a->q + t0 * xrow;
    const float *d = a->d + t0, *s = a->s + t0;
    __m256 acc[QDOT_MAX_ROWS];
    __m128 mins = _mm_setzero_ps();
    for (int r = 0; r < nt; r++) acc[r] = _mm256_setzero_ps();
#pragma GCC unroll 2
    for (int b = 0; b < a->nb; b++, w += 20, x += QBLOCK) q4_block(w, x, xrow, d + b * ds, s + b * ds, nt, acc, &mins);
    float m[4];
    _mm_storeu_ps(m, mins);
    for (int r = 0; r < nt; r++) out[r] = hsum_ps(acc[r]) + m[r];
}

/* Weight rows one after another; nt (and ds for decode) are constants in each instance, so the
 * accumulators live in registers. */
AVX2_INLINE void q8_rows(const int q6, const unsigned char *w, size_t row_bytes, int nr, const QAct *a, int t0, const int nt,
                         const size_t ds, float *y, size_t ldy) {
    for (int r = 0; r < nr; r++, w += row_bytes) {
        float out[QDOT_MAX_ROWS];
        qdot_q8_row(q6, w, a, t0, nt, ds, out);
        for (int i = 0; i < nt; i++) y[i * ldy + r] = out[i];
    }
}

AVX2_INLINE void q4_rows(const unsigned char *w, size_t row_bytes, int nr, const QAct *a, int t0, const int nt, const size_t ds,
                         float *y, size_t ldy) {
    for (int r = 0; r < nr; r++, w += row_bytes) {
        float out[QDOT_MAX_ROWS];
        qdot_q4_row(w, a, t0, nt, ds, out);
        for (int i = 0; i < nt; i++) y[i * ldy + r] = out[i];
    }
}

#define SIGNED_CASES(q6)                                                  \
    const size_t ds = (size_t)a->rows;                                    \
    switch (nt) {                                                         \
    case 1:                                                               \
        if (ds == 1) q8_rows(q6, w, row_bytes, nr, a, t0, 1, 1, y, ldy);  \
        else q8_rows(q6, w, row_bytes, nr, a, t0, 1, ds, y, ldy);         \
        return;                                                           \
    case 2: q8_rows(q6, w, row_bytes, nr, a, t0, 2, ds, y, ldy); return;  \
    case 3: q8_rows(q6, w, row_bytes, nr, a, t0, 3, ds, y, ldy); return;  \
    default: q8_rows(q6, w, row_bytes, nr, a, t0, 4, ds, y, ldy); return; \
    }

AVX2 void qdot_q8_avx2(const unsigned char *w, size_t row_bytes, int nr, const QAct *a, int t0, int nt, float *y, size_t ldy) {
    SIGNED_CASES(0)
}

AVX2 void qdot_q6_avx2(const unsigned char *w, size_t row_bytes, int nr, const QAct *a, int t0, int nt, float *y, size_t ldy) {
    SIGNED_CASES(1)
}

AVX2 void qdot_q4_avx2(const unsigned char *w, size_t row_bytes, int nr, const QAct *a, int t0, int nt, float *y, size_t ldy) {
    const size_t ds = (size_t)a->rows;
    switch (nt) {
    case 1:
        if (ds == 1) q4_rows(w, row_bytes, nr, a, t0, 1, 1, y, ldy);
        else q4_rows(w, row_bytes, nr, a, t0, 1, ds, y, ldy);
        return;
    case 2: q4_rows(w, row_bytes, nr, a, t0, 2, ds, y, ldy); return;
    case 3: q4_rows(w, row_bytes, nr, a, t0, 3, ds, y, ldy); return;
    default: q4_rows(w, row_bytes, nr, a, t0, 4, ds, y, ldy); return;
    }
}

/* The AVX2 set (AVX2 + FMA + F16C). f32 KV rows keep the portable row dot and axpy (the
 * compiler vectorizes them as well). */
const Kernels kernel_set_avx2 = {
    .name = "avx2",
    .isa = KI_AVX2,
    .dequant_row = dequant_row_avx2,
    .dot = dot_avx2,
    .quantize_act = quantize_act_avx2,
    .qdot = {[QT_Q8] = qdot_q8_avx2,
             [QT_Q4] = qdot_q4_avx2,
             [QT_MXFP4] = qdot_mxfp4_avx2,
             [QT_Q6] = qdot_q6_avx2,
             LOWBIT_TYPES(LOWBIT_QDOT_avx2)},
    .lowbit_pack = 1,
    .kv = {{kv_dot_f32_portable, kv_axpy_f32_portable, kv_attend_avx2_f32, kv_attend_avx2_f32_block},
           {kv_dot_f16_avx2, kv_axpy_f16_avx2, kv_attend_avx2_f16, kv_attend_avx2_f16_block},
           {kv_dot_bf16_avx2, kv_axpy_bf16_avx2, kv_attend_avx2_bf16, kv_attend_avx2_bf16_block}},
    .mla_absorb = mla_absorb_avx2,
    .dsa_scores = dsa_scores_avx2,
    .delta_recurrent = delta_rule_recurrent_avx2,
    .delta_chunked = delta_rule_chunked_avx2,
    .kda_recurrent = kda_recurrent_avx2,
    .kda_chunked = kda_chunked_avx2,
};
#endif
