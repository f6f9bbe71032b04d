/* AVX2 + FMA + F16C row kernels; compiled with target attributes so the rest of the engine
 * stays portable and the choice is made at run time (kernels_init). */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <string.h>

#include "quant.h"

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
        for (; i < cols; i++) { unsigned short h; memcpy(&h, s + 2 * i, 2); dst[i] = bf16_to_f32(h); }
        return;
    case QT_F16:
        for (; i + 8 <= cols; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 2 * i))));
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
    default: return;
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
#endif
