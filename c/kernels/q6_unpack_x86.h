/* A q6 block's 32 elements as int8 q = u - 32 (layout in quant.h), shared by the x86 kernel
 * sets that unpack whole rows (the AVX2 dots, the AMX tile strips). Byte e of one vector is
 * element e's nibble (the high lane takes the nibble bytes >> 4), of another its high-bit pair:
 * qword k holds the 8 high-bit bytes >> 2k, whose low bits are then elements 8k..8k+7's pairs. */
#ifndef COLI_Q6_UNPACK_X86_H
#define COLI_Q6_UNPACK_X86_H
#include <immintrin.h>
#include <string.h>

/* blk: the block (its f16 scale first); q_lo: elements 0..15, q_hi: 16..31. */
__attribute__((target("avx2"), always_inline)) static inline void q6_unpack_avx2(const unsigned char *blk, __m128i *q_lo,
                                                                                 __m128i *q_hi) {
    const __m128i nib = _mm_loadu_si128((const __m128i *)(blk + 2));
    long long hb;
    memcpy(&hb, blk + 18, sizeof hb);
    const __m256i n2 = _mm256_inserti128_si256(_mm256_castsi128_si256(nib), _mm_srli_epi16(nib, 4), 1);
    const __m256i h4 = _mm256_srlv_epi64(_mm256_set1_epi64x(hb), _mm256_set_epi64x(6, 4, 2, 0));
    const __m256i u = _mm256_or_si256(_mm256_and_si256(n2, _mm256_set1_epi8(15)),
                                      _mm256_slli_epi16(_mm256_and_si256(h4, _mm256_set1_epi8(3)), 4));
    const __m256i q = _mm256_sub_epi8(u, _mm256_set1_epi8(32));
    *q_lo = _mm256_castsi256_si128(q);
    *q_hi = _mm256_extracti128_si256(q, 1);
}

#endif
