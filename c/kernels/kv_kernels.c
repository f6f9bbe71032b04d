#include "kernels/isa.h"

#include <math.h>
#include <string.h>

#include "kernels/vec.h"

size_t kv_elem_size(QType t) { return t == QT_F32 ? 4 : 2; }

int kv_type_from_name(const char *s, QType *out) {
    if (!strcmp(s, "f16")) *out = QT_F16;
    else if (!strcmp(s, "bf16")) *out = QT_BF16;
    else if (!strcmp(s, "f32")) *out = QT_F32;
    else return -1;
    return 0;
}

void kv_store_row(QType t, const float *x, int n, void *dst) {
    if (t == QT_F32) {
        memcpy(dst, x, sizeof(float) * (size_t)n);
        return;
    }
    uint16_t *h = dst;
    if (t == QT_F16)
        for (int i = 0; i < n; i++) h[i] = f32_to_f16(x[i]);
    else
        for (int i = 0; i < n; i++) h[i] = f32_to_bf16(x[i]);
}

float kv_dot_f16_portable(const float *q, const void *row, int n) {
    const uint16_t *h = row;
    float s = 0;
    for (int i = 0; i < n; i++) s += q[i] * f16_to_f32(h[i]);
    return s;
}
void kv_axpy_f16_portable(float w, const void *row, int n, float *o) {
    const uint16_t *h = row;
    for (int i = 0; i < n; i++) o[i] += w * f16_to_f32(h[i]);
}
float kv_dot_bf16_portable(const float *q, const void *row, int n) {
    const uint16_t *h = row;
    float s = 0;
    for (int i = 0; i < n; i++) s += q[i] * bf16_to_f32(h[i]);
    return s;
}
void kv_axpy_bf16_portable(float w, const void *row, int n, float *o) {
    const uint16_t *h = row;
    for (int i = 0; i < n; i++) o[i] += w * bf16_to_f32(h[i]);
}
float kv_dot_f32_portable(const float *q, const void *row, int n) {
    const float *x = row;
    float s = 0;
    for (int i = 0; i < n; i++) s += q[i] * x[i];
    return s;
}
void kv_axpy_f32_portable(float w, const void *row, int n, float *o) {
    const float *x = row;
    for (int i = 0; i < n; i++) o[i] += w * x[i];
}

/* s[0..n) = softmax over the n scores and one extra logit `sink` that takes weight but has
 * no value row (gpt-oss attention sinks). */
static void softmax_sink(float *s, int n, float sink) {
    float mx = sink, sum = 0;
    for (int j = 0; j < n; j++) mx = s[j] > mx ? s[j] : mx;
    for (int j = 0; j < n; j++) {
        s[j] = expf(s[j] - mx);
        sum += s[j];
    }
    sum += expf(sink - mx);
    const float inv = 1.0f / sum;
    for (int j = 0; j < n; j++) s[j] *= inv;
}

/* The reference attention: per head, every score, a softmax, then the weighted V rows. */
static void attend_ref(float (*dot)(const float *, const void *, int), void (*axpy)(float, const void *, int, float *),
                       const float *q, int g, int hd, const void *k, const void *v, size_t stride, int n, float scale,
                       const float *sinks, float *sc, float *o) {
    const unsigned char *kb = k, *vb = v;
    for (int i = 0; i < g; i++) {
        float *s = sc + (size_t)i * n, *oi = o + (size_t)i * hd;
        for (int j = 0; j < n; j++) s[j] = dot(q + (size_t)i * hd, kb + (size_t)j * stride, hd) * scale;
        if (sinks) softmax_sink(s, n, sinks[i]);
        else softmax(s, n);
        memset(oi, 0, sizeof(float) * (size_t)hd);
        for (int j = 0; j < n; j++) axpy(s[j], vb + (size_t)j * stride, hd, oi);
    }
}
#define ATTEND_REF(NAME)                                                                                                      \
    void kv_attend_ref_##NAME(const float *q, int g, int hd, const void *k, const void *v, size_t stride, int n, float scale, \
                              const float *sinks, float *sc, float *o) {                                                      \
        attend_ref(kv_dot_##NAME##_portable, kv_axpy_##NAME##_portable, q, g, hd, k, v, stride, n, scale, sinks, sc, o);      \
    }
#define ATTEND_REF_BLOCK(NAME)                                                                                                  \
    void kv_attend_ref_##NAME##_block(const float *q, size_t qstep, int tq, int g, int hd, const void *k, const void *v,        \
                                      size_t stride, int n, int window, float scale, const float *sinks, float *sc, float *o,   \
                                      size_t ostep) {                                                                           \
        for (int t = 0; t < tq; t++) {                                                                                          \
            const size_t lo = window > 0 && n + t > window ? (size_t)(n + t - window) : 0;                                      \
            attend_ref(kv_dot_##NAME##_portable, kv_axpy_##NAME##_portable, q + t * qstep, g, hd,                               \
                       (const unsigned char *)k + lo * stride, (const unsigned char *)v + lo * stride, stride, n + t - (int)lo, \
                       scale, sinks, sc, o + t * ostep);                                                                        \
        }                                                                                                                       \
    }
ATTEND_REF(f32)
ATTEND_REF(f16)
ATTEND_REF(bf16)
ATTEND_REF_BLOCK(f32)
ATTEND_REF_BLOCK(f16)
ATTEND_REF_BLOCK(bf16)

int kv_type_index(QType t) { return t == QT_F32 ? 0 : t == QT_F16 ? 1 : t == QT_BF16 ? 2 : -1; }


int kv_attend_block_positions(int g, int span) {
    const size_t rows_cap = ((size_t)4 << 20) / (size_t)(span > 0 ? span : 1);
    int tq = g >= 64 ? 1 : 64 / g;
    while (tq > 1 && (size_t)tq * g > rows_cap) tq /= 2;
    return tq;
}

size_t kv_attend_scratch(int tq, int g, int hd, int n) {
    const size_t rp = ((size_t)tq * g + 15) / 16 * 16, np = ((size_t)n + tq - 1 + KV_ATT_KT - 1) / KV_ATT_KT * KV_ATT_KT;
    const size_t simd = (size_t)hd * (rp + KV_ATT_KT + KV_ATT_PT) + np * rp + 4 * rp;
    const size_t ref = (size_t)g * ((size_t)n + tq); /* the portable kernel: g rows of scores */
    return simd > ref ? simd : ref;
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 static inline __m256 wide_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
AVX2 static inline __m256 wide_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
AVX2 static inline float hsum(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
#define KV_AVX2(NAME, WIDE, SCALAR)                                                                                   \
    AVX2 float kv_dot_##NAME##_avx2(const float *q, const void *row, int n) {                                         \
        const uint16_t *h = row;                                                                                      \
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();                                                    \
        int i = 0;                                                                                                    \
        for (; i + 16 <= n; i += 16) {                                                                                \
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), WIDE(h + i), s0);                                            \
            s1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), WIDE(h + i + 8), s1);                                    \
        }                                                                                                             \
        for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), WIDE(h + i), s0);                     \
        float s = hsum(_mm256_add_ps(s0, s1));                                                                        \
        for (; i < n; i++) s += q[i] * SCALAR(h[i]);                                                                  \
        return s;                                                                                                     \
    }                                                                                                                 \
    AVX2 void kv_axpy_##NAME##_avx2(float w, const void *row, int n, float *o) {                                      \
        const uint16_t *h = row;                                                                                      \
        const __m256 vw = _mm256_set1_ps(w);                                                                          \
        int i = 0;                                                                                                    \
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(o + i, _mm256_fmadd_ps(vw, WIDE(h + i), _mm256_loadu_ps(o + i))); \
        for (; i < n; i++) o[i] += w * SCALAR(h[i]);                                                                  \
    }
KV_AVX2(f16, wide_f16, f16_to_f32)
KV_AVX2(bf16, wide_bf16, bf16_to_f32)
#endif
