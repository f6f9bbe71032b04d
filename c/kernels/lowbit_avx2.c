/* The AVX2 dots of the low-bit types: the block decode is lowbit.c's (scalar; a block serves
 * every activation row of the call), the 16-element integer sums are madd_epi16 over the int16
 * activations, and the float combination is lowbit_combine: exact integer sums in any order,
 * so the result is the portable dot's, bit for bit (tests/test_gguf_quants.py checks it). The
 * AVX-512, VNNI and AMX sets use these. */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "kernels/isa.h"
#include "kernels/lowbit.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 static void lowbit_qdot_avx2(QType qt, QDOT_ARGS) {
    const LowbitType *t = lowbit_type(qt);
    const int per = t->block / QBLOCK, nblk = a->nb / per;
    const __m256i ones = _mm256_set1_epi16(1);
    LowbitBlock blk;
    for (int r = 0; r < nr; r++) {
        float acc[QDOT_MAX_ROWS] = {0};
        const unsigned char *row = w + (size_t)r * row_bytes;
        for (int k = 0; k < nblk; k++) {
            t->decode(row + (size_t)k * t->bytes, &blk);
            for (int h = 0; h < per; h++) {
                const int b = k * per + h;
                const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk.q + QBLOCK * h)));
                const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk.q + QBLOCK * h + 16)));
                for (int i = 0; i < nt; i++) {
                    const int16_t *x = a->q + ((size_t)(t0 + i) * a->nb + b) * QBLOCK;
                    const __m256i x0 = _mm256_loadu_si256((const __m256i *)x), x1 = _mm256_loadu_si256((const __m256i *)(x + 16));
                    /* lanes: halves 0 and 1 of the weight dot, then of the activation sum */
                    __m256i s = _mm256_hadd_epi32(_mm256_madd_epi16(w0, x0), _mm256_madd_epi16(w1, x1));
                    if (t->has_min)
                        s = _mm256_hadd_epi32(s, _mm256_hadd_epi32(_mm256_madd_epi16(x0, ones), _mm256_madd_epi16(x1, ones)));
                    else s = _mm256_hadd_epi32(s, s);
                    const __m128i v = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
                    const int32_t is0 = _mm_cvtsi128_si32(v), is1 = _mm_extract_epi32(v, 1);
                    const int32_t xs0 = _mm_extract_epi32(v, 2), xs1 = _mm_extract_epi32(v, 3);
                    acc[i] += a->d[(size_t)b * a->rows + t0 + i] * lowbit_combine(&blk, h, t->has_min, is0, is1, xs0, xs1);
                }
            }
        }
        for (int i = 0; i < nt; i++) y[i * ldy + r] = acc[i];
    }
}

#define LOWBIT_AVX2(S, QT) \
    AVX2 void qdot_##S##_avx2(QDOT_ARGS) { lowbit_qdot_avx2(QT, w, row_bytes, nr, a, t0, nt, y, ldy); }
LOWBIT_TYPES(LOWBIT_AVX2)
#endif
