/* The low-bit decoders of the K-quants and IQ4_XS with 512-bit vectors, for the dots of few
 * positions of the avx512 build (lowbit_dots_x86.h with LOWBIT_ZMM): one block's 256 int8 codes
 * straight into four registers, elements 64v..64v+63 in q[v], equal to lowbit.c's codes byte for
 * byte. Writing them to memory and loading them back, as the AVX2 decoders do, cost more than the
 * dot that reads them once. */
#ifndef COLI_LOWBIT_DECODE_ZMM_H
#define COLI_LOWBIT_DECODE_ZMM_H
#include <immintrin.h>

#include "kernels/lowbit_decode_x86.h"
#include "kernels/lowbit_grids.h"

#define ZMM_DECODE static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

/* The 32 bytes at p in both 256-bit halves. */
ZMM_DECODE __m512i twice256(const unsigned char *p) {
    return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)p));
}
/* Each 16-bit lane of v shifted right by lo in the low half, by hi in the high half. */
ZMM_DECODE __m512i srl_halves(__m512i v, int lo, int hi) {
    return _mm512_srlv_epi16(v, _mm512_inserti64x4(_mm512_set1_epi16((short)lo), _mm256_set1_epi16((short)hi), 1));
}

/* Q2_K: element 128h + 32k + j is bits 2k, 2k+1 of qs[32h + j]. */
ZMM_DECODE void z_q2_k(const unsigned char *b, __m512i *q) {
    const __m512i m3 = _mm512_set1_epi8(3);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i v = twice256(b + 16 + 32 * h);
        q[2 * h] = _mm512_and_si512(srl_halves(v, 0, 2), m3);
        q[2 * h + 1] = _mm512_and_si512(srl_halves(v, 4, 6), m3);
    }
}

/* Q3_K: Q2_K's crumbs from qs at 32, minus 4 where bit e / 32 of hm[e % 32] is clear. */
ZMM_DECODE void z_q3_k(const unsigned char *b, __m512i *q) {
    const __m512i m3 = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4), hm = twice256(b);
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        const __m512i c = _mm512_and_si512(srl_halves(twice256(b + 32 + 32 * (v / 2)), 4 * (v % 2), 4 * (v % 2) + 2), m3);
        const __m512i bit =
            _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * v))), _mm256_set1_epi8((char)(1 << (2 * v + 1))), 1);
        q[v] = _mm512_mask_sub_epi8(c, _mm512_testn_epi8_mask(hm, bit), c, four);
    }
}

/* Q4_K: elements 64c..64c+31 the low nibbles of qs[32c..32c+31] (at 16), 64c+32.. the high. */
ZMM_DECODE void z_q4_k(const unsigned char *b, __m512i *q) {
    const __m512i m4 = _mm512_set1_epi8(0xF);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) q[c] = _mm512_and_si512(srl_halves(twice256(b + 16 + 32 * c), 0, 4), m4);
}

/* Q5_K: Q4_K's nibbles from qs at 48, plus 16 where bit (element / 32) of qh[element % 32] is set. */
ZMM_DECODE void z_q5_k(const unsigned char *b, __m512i *q) {
    const __m512i m4 = _mm512_set1_epi8(0xF), hm = twice256(b + 16), sixteen = _mm512_set1_epi8(16);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m512i lo = _mm512_and_si512(srl_halves(twice256(b + 48 + 32 * c), 0, 4), m4);
        const __m512i bit =
            _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * c))), _mm256_set1_epi8((char)(1 << (2 * c + 1))), 1);
        q[c] = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(hm, bit), lo, sixteen);
    }
}

/* Q6_K: per half h, groups k = 0..3 of 32 take the low nibbles of ql[64h..64h+31] and
 * ql[64h+32..64h+63], then the high ones, with bits 2k, 2k+1 of qh[32h..] as bits 4, 5; minus 32. */
ZMM_DECODE void z_q6_k(const unsigned char *b, __m512i *q) {
    const __m512i m4 = _mm512_set1_epi8(0xF), m30 = _mm512_set1_epi8(0x30), off = _mm512_set1_epi8(32);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i ql = _mm512_loadu_si512((const void *)(b + 64 * h)), qh = twice256(b + 128 + 32 * h);
        /* groups 0, 1: qh bits 0-1 and 2-3 moved to 4-5; groups 2, 3: bits 4-5 and 6-7 */
        const __m512i h01 =
            _mm512_and_si512(_mm512_sllv_epi16(qh, _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1)), m30);
        const __m512i h23 = _mm512_and_si512(srl_halves(qh, 0, 2), m30);
        /* (ql & 0xF) | hi, then the high nibbles: ternary logic 0xEA is (a & b) | c */
        q[2 * h] = _mm512_sub_epi8(_mm512_ternarylogic_epi32(ql, m4, h01, 0xEA), off);
        q[2 * h + 1] = _mm512_sub_epi8(_mm512_ternarylogic_epi32(_mm512_srli_epi16(ql, 4), m4, h23, 0xEA), off);
    }
}

/* IQ4_XS: per 32 elements ib, the codebook values of the low nibbles of qs[16ib..16ib+15] (at 8)
 * then of their high nibbles. */
ZMM_DECODE void z_iq4_xs(const unsigned char *b, __m512i *q) {
    const __m512i kv = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)kvalues_iq4nl));
    const __m512i m4 = _mm512_set1_epi8(0xF);
    const long long four = 0x0004000400040004LL; /* the high nibbles' 128-bit lanes (1 and 3) shift by 4 */
    const __m512i sh = _mm512_set_epi64(four, four, 0, 0, four, four, 0, 0);
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        const __m256i two = _mm256_loadu_si256((const __m256i *)(const void *)(b + 8 + 32 * v)); /* blocks 2v, 2v + 1 */
        const __m512i dup =
            _mm512_shuffle_i64x2(_mm512_castsi256_si512(two), _mm512_castsi256_si512(two), _MM_SHUFFLE(1, 1, 0, 0));
        q[v] = _mm512_shuffle_epi8(kv, _mm512_and_si512(_mm512_srlv_epi16(dup, sh), m4));
    }
}

/* Two 32-coordinate groups as one register. */
ZMM_DECODE __m512i join256(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }
/* The lattice types: two groups of their decoder's 32 codes per register. */
#define LATTICE_ZMM(S)                                                                                              \
    ZMM_DECODE void z_##S(const unsigned char *b, __m512i *q) {                                                     \
        _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++) q[v] = join256(S##_32(b, 2 * v), S##_32(b, 2 * v + 1)); \
    }
LATTICE_ZMM(iq2_xxs)
LATTICE_ZMM(iq2_xs)
LATTICE_ZMM(iq2_s)
LATTICE_ZMM(iq3_xxs)
LATTICE_ZMM(iq3_s)
LATTICE_ZMM(iq1_s)
LATTICE_ZMM(iq1_m)

#endif
