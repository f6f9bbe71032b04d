/* DSA indexer scores (dsa_score.h). */
#include "kernels/isa.h"

#include <string.h>

#include "kernels/vec.h"

#define LANES_MAX 16 /* heads per vector: AVX-512 */

size_t dsa_score_scratch(int nh, int hd) { return (size_t)hd * ((nh + LANES_MAX - 1) / LANES_MAX * LANES_MAX); }

/* One head's term of a score, from its raw dot: the ReLU'd, scaled dot times the head's weight. */
static inline float score_term(float dot, float w, float scale, float wscale) {
    const float d = dot * scale;
    return d > 0 ? w * wscale * d : 0.0f;
}

/* Each score as row dots, with the set's own dot: the portable set's, and NEON's. */
static inline void scores_rows(float (*dot)(const float *, const float *, int), const float *q, const float *w, int nh, int hd,
                               const unsigned char *keys, size_t stride, int n, float scale, float wscale, float *s) {
    for (int j = 0; j < n; j++) {
        const float *k = (const float *)(keys + (size_t)j * stride);
        float acc = 0;
        for (int h = 0; h < nh; h++) acc += score_term(dot(q + (size_t)h * hd, k, hd), w[h], scale, wscale);
        s[j] = acc;
    }
}

void dsa_scores_portable(DSA_SCORE_ARGS) { scores_rows(dot_portable, q, w, nh, hd, keys, stride, n, scale, wscale, s); }
#if defined(__aarch64__)
void dsa_scores_neon(DSA_SCORE_ARGS) { scores_rows(dot_neon, q, w, nh, hd, keys, stride, n, scale, wscale, s); }
#endif

#if defined(__x86_64__) || defined(__i386__)
/* qt[i][h] = q[h][i], heads padded with zeros to a multiple of lanes. */
static void transpose_q(const float *q, int nh, int hd, int nhp, float *qt) {
    for (int i = 0; i < hd; i++) {
        float *row = qt + (size_t)i * nhp;
        for (int h = 0; h < nh; h++) row[h] = q[(size_t)h * hd + i];
        for (int h = nh; h < nhp; h++) row[h] = 0;
    }
}

/* Heads h0..end-1's dots (dots[0..end-h0)) added to a score as its terms, in head order. */
static inline float add_terms(float acc, const float *dots, int h0, int end, const float *w, float scale, float wscale) {
    for (int i = 0; h0 + i < end; i++) acc += score_term(dots[i], w[h0 + i], scale, wscale);
    return acc;
}

#include <immintrin.h>

/* One body per vector type: V the vector, L its lanes, SET1/LOAD/FMA/STORE its operations. */
#define SCORES_X86(NAME, ATTR, V, L, ZERO, SET1, LOAD, FMA, STORE)                                                               \
    ATTR void NAME(const float *q, const float *w, int nh, int hd, const unsigned char *keys, size_t stride, int n, float scale, \
                   float wscale, float *s) {                                                                                     \
        const int nhp = (nh + LANES_MAX - 1) / LANES_MAX * LANES_MAX;                                                            \
        float *qt = scratch(4, dsa_score_scratch(nh, hd));                                                                       \
        if (!qt) return; /* out of memory: fwd_oom() fails the pass */                                                           \
        transpose_q(q, nh, hd, nhp, qt);                                                                                         \
        float dots[4][LANES_MAX];                                                                                                \
        int j = 0;                                                                                                               \
        for (; j + 4 <= n; j += 4) {                                                                                             \
            const float *k0 = (const float *)(keys + (size_t)j * stride),                                                        \
                        *k1 = (const float *)((const unsigned char *)k0 + stride);                                               \
            const float *k2 = (const float *)((const unsigned char *)k1 + stride),                                               \
                        *k3 = (const float *)((const unsigned char *)k2 + stride);                                               \
            float a[4] = {0, 0, 0, 0};                                                                                           \
            for (int h0 = 0; h0 < nh; h0 += L) {                                                                                 \
                V s0 = ZERO, s1 = ZERO, s2 = ZERO, s3 = ZERO;                                                                    \
                for (int i = 0; i < hd; i++) {                                                                                   \
                    const V qv = LOAD(qt + (size_t)i * nhp + h0);                                                                \
                    s0 = FMA(SET1(k0[i]), qv, s0), s1 = FMA(SET1(k1[i]), qv, s1);                                                \
                    s2 = FMA(SET1(k2[i]), qv, s2), s3 = FMA(SET1(k3[i]), qv, s3);                                                \
                }                                                                                                                \
                STORE(dots[0], s0), STORE(dots[1], s1), STORE(dots[2], s2), STORE(dots[3], s3);                                  \
                for (int u = 0; u < 4; u++) a[u] = add_terms(a[u], dots[u], h0, h0 + L < nh ? h0 + L : nh, w, scale, wscale);    \
            }                                                                                                                    \
            memcpy(s + j, a, sizeof a);                                                                                          \
        }                                                                                                                        \
        for (; j < n; j++) {                                                                                                     \
            const float *k0 = (const float *)(keys + (size_t)j * stride);                                                        \
            float a = 0;                                                                                                         \
            for (int h0 = 0; h0 < nh; h0 += L) {                                                                                 \
                V s0 = ZERO;                                                                                                     \
                for (int i = 0; i < hd; i++) s0 = FMA(SET1(k0[i]), LOAD(qt + (size_t)i * nhp + h0), s0);                         \
                STORE(dots[0], s0);                                                                                              \
                a = add_terms(a, dots[0], h0, h0 + L < nh ? h0 + L : nh, w, scale, wscale);                                      \
            }                                                                                                                    \
            s[j] = a;                                                                                                            \
        }                                                                                                                        \
    }
SCORES_X86(dsa_scores_avx2, __attribute__((target("avx2,fma"))), __m256, 8, _mm256_setzero_ps(), _mm256_set1_ps, _mm256_loadu_ps,
           _mm256_fmadd_ps, _mm256_storeu_ps)
SCORES_X86(dsa_scores_avx512, __attribute__((target("avx512f"))), __m512, 16, _mm512_setzero_ps(), _mm512_set1_ps,
           _mm512_loadu_ps, _mm512_fmadd_ps, _mm512_storeu_ps)
#endif
