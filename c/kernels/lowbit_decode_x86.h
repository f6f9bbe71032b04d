/* The x86 decoders of the low-bit blocks (lowbit.h), AVX2, for the dot kernels that include
 * this (lowbit_avx2.c): each block's int8 codes (q_*, equal to lowbit.c's codes
 * byte for byte) and its float scales straight into vector lanes (s8_*, equal to lowbit.c's
 * sc_* floats). Static inline, so each kernel gets them inlined into its own loops. */
#ifndef COLI_LOWBIT_DECODE_X86_H
#define COLI_LOWBIT_DECODE_X86_H
#include <immintrin.h>
#include <string.h>

#include "kernels/lowbit.h"
#include "kernels/lowbit_grids.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
/* The block decoders: inlined into the dots of few positions, where a call per block shows. */
#define AVX2_DECODE AVX2 static inline __attribute__((always_inline))

static inline uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint16_t rd16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline int ld4(const int8_t *p) {
    int v;
    memcpy(&v, p, 4);
    return v;
}
/* -1 or +1 per byte as a 64-bit word for each 7-bit sign index: byte j -1 where bit j of
 * lowbit_ksigns's byte (the index with an eighth bit for even parity) is set. One load per eight
 * signs, where looking up the byte and expanding its bits in vectors took more (IQ2_XXS, IQ2_XS,
 * IQ3_XXS). */
#define LB_SB(s, j) (((s) >> (j) & 1) ? 0xFFull << (8 * (j)) : 0x01ull << (8 * (j)))
#define LB_SM(s) (LB_SB(s, 0) | LB_SB(s, 1) | LB_SB(s, 2) | LB_SB(s, 3) | LB_SB(s, 4) | LB_SB(s, 5) | LB_SB(s, 6) | LB_SB(s, 7))
#define LB_KS(i) ((i) | (((i) ^ (i) >> 1 ^ (i) >> 2 ^ (i) >> 3 ^ (i) >> 4 ^ (i) >> 5 ^ (i) >> 6) & 1) << 7)
#define LB_X4(F, i) F(i), F((i) + 1), F((i) + 2), F((i) + 3)
#define LB_X16(F, i) LB_X4(F, i), LB_X4(F, (i) + 4), LB_X4(F, (i) + 8), LB_X4(F, (i) + 12)
#define LB_X64(F, i) LB_X16(F, i), LB_X16(F, (i) + 16), LB_X16(F, (i) + 32), LB_X16(F, (i) + 48)
#define LB_KM(i) LB_SM(LB_KS(i))
static const uint64_t KSIGN_MASK[128] = {LB_X64(LB_KM, 0), LB_X64(LB_KM, 64)};

/* Four 8-coordinate lattice rows as one vector, loaded straight from the table (assembling them
 * in a stack array first made every decode wait on a failed store-to-load forward). */
AVX2 static inline __m256i rows8(const int8_t *r0, const int8_t *r1, const int8_t *r2, const int8_t *r3) {
    const __m128i lo = _mm_castpd_si128(
        _mm_loadh_pd(_mm_castsi128_pd(_mm_loadl_epi64((const __m128i *)(const void *)r0)), (const double *)(const void *)r1));
    const __m128i hi = _mm_castpd_si128(
        _mm_loadh_pd(_mm_castsi128_pd(_mm_loadl_epi64((const __m128i *)(const void *)r2)), (const double *)(const void *)r3));
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

/* 0xFF in byte 8k + j where bit j of byte k of signs is set. */
AVX2 static inline __m256i sign_bytes(uint32_t signs) {
    const __m256i sel =
        _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bits = _mm256_set1_epi64x(0x8040201008040201LL);
    const __m256i m = _mm256_shuffle_epi8(_mm256_set1_epi32((int)signs), sel);
    return _mm256_cmpeq_epi8(_mm256_and_si256(m, bits), bits);
}
/* The masks of four 7-bit sign indexes packed in aux (k-th at bit 7k) as one vector. */
AVX2 static inline __m256i ksigns4(uint32_t aux) {
    return _mm256_setr_epi64x((long long)KSIGN_MASK[aux & 127], (long long)KSIGN_MASK[aux >> 7 & 127],
                              (long long)KSIGN_MASK[aux >> 14 & 127], (long long)KSIGN_MASK[aux >> 21 & 127]);
}
/* -1 or +1 per byte from four raw sign bytes: expanding the bits in vectors beats four table
 * loads when the bytes come as one word (IQ2_S, IQ3_S). */
AVX2 static inline __m256i sign_bits(uint32_t signs) { return _mm256_or_si256(sign_bytes(signs), _mm256_set1_epi8(1)); }

/* Each lattice type's 32 codes of group ib as a vector: its q_* decoder stores them, the
 * 512-bit dots (lowbit_decode_zmm.h) keep them in registers. */
AVX2_DECODE __m256i iq2_xxs_32(const unsigned char *b, int ib) {
    const unsigned char *g = b + 2 + 8 * ib;
    return _mm256_sign_epi8(rows8(iq2xxs_grid[g[0]], iq2xxs_grid[g[1]], iq2xxs_grid[g[2]], iq2xxs_grid[g[3]]),
                            ksigns4(rd32(g + 4)));
}

AVX2_DECODE __m256i iq2_xs_32(const unsigned char *b, int ib) {
    const unsigned char *p = b + 2 + 8 * ib;
    const uint16_t v0 = rd16(p), v1 = rd16(p + 2), v2 = rd16(p + 4), v3 = rd16(p + 6);
    const __m256i s = _mm256_setr_epi64x((long long)KSIGN_MASK[v0 >> 9], (long long)KSIGN_MASK[v1 >> 9],
                                         (long long)KSIGN_MASK[v2 >> 9], (long long)KSIGN_MASK[v3 >> 9]);
    return _mm256_sign_epi8(rows8(iq2xs_grid[v0 & 511], iq2xs_grid[v1 & 511], iq2xs_grid[v2 & 511], iq2xs_grid[v3 & 511]), s);
}

AVX2_DECODE __m256i iq2_s_32(const unsigned char *b, int ib) {
    const unsigned char *g = b + 2 + 4 * ib;
    const int h = b[66 + ib];
    return _mm256_sign_epi8(rows8(iq2s_grid[g[0] | (h & 3) << 8], iq2s_grid[g[1] | (h >> 2 & 3) << 8],
                                  iq2s_grid[g[2] | (h >> 4 & 3) << 8], iq2s_grid[g[3] | (h >> 6 & 3) << 8]),
                            sign_bits(rd32(b + 34 + 4 * ib)));
}

/* Eight 4-coordinate rows (IQ3's lattices) as one vector. */
AVX2 static inline __m256i rows4(const int8_t *r0, const int8_t *r1, const int8_t *r2, const int8_t *r3, const int8_t *r4,
                                 const int8_t *r5, const int8_t *r6, const int8_t *r7) {
    return _mm256_setr_epi32(ld4(r0), ld4(r1), ld4(r2), ld4(r3), ld4(r4), ld4(r5), ld4(r6), ld4(r7));
}

AVX2_DECODE __m256i iq3_xxs_32(const unsigned char *b, int ib) {
    const unsigned char *g = b + 2 + 8 * ib;
    const __m256i grid = rows4(iq3xxs_grid[g[0]], iq3xxs_grid[g[1]], iq3xxs_grid[g[2]], iq3xxs_grid[g[3]], iq3xxs_grid[g[4]],
                               iq3xxs_grid[g[5]], iq3xxs_grid[g[6]], iq3xxs_grid[g[7]]);
    return _mm256_sign_epi8(grid, ksigns4(rd32(b + 66 + 4 * ib)));
}

AVX2_DECODE __m256i iq3_s_32(const unsigned char *b, int ib) {
    const unsigned char *g = b + 2 + 8 * ib; /* rows 8ib + j, the ninth index bit is bit j of qh[ib] */
    const int h = b[66 + ib];
    const __m256i grid =
        rows4(iq3s_grid[g[0] | (h & 1) << 8], iq3s_grid[g[1] | (h >> 1 & 1) << 8], iq3s_grid[g[2] | (h >> 2 & 1) << 8],
              iq3s_grid[g[3] | (h >> 3 & 1) << 8], iq3s_grid[g[4] | (h >> 4 & 1) << 8], iq3s_grid[g[5] | (h >> 5 & 1) << 8],
              iq3s_grid[g[6] | (h >> 6 & 1) << 8], iq3s_grid[g[7] | (h >> 7 & 1) << 8]);
    return _mm256_sign_epi8(grid, sign_bits(rd32(b + 74 + 4 * ib)));
}

/* 8 * coordinate (-1, 0, 1) + delta per group of 8 (delta: +-1 in each byte). */
AVX2 static inline __m256i iq1_32(__m256i g, __m256i delta) {
    return _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), g), delta);
}

AVX2_DECODE __m256i iq1_s_32(const unsigned char *b, int ib) {
    const uint16_t qh = rd16(b + 34 + 2 * ib);
    const unsigned char *qs = b + 2 + 4 * ib;
    return iq1_32(rows8(iq1s_grid[qs[0] | (qh & 7) << 8], iq1s_grid[qs[1] | (qh >> 3 & 7) << 8],
                        iq1s_grid[qs[2] | (qh >> 6 & 7) << 8], iq1s_grid[qs[3] | (qh >> 9 & 7) << 8]),
                  _mm256_set1_epi8((char)(1 - 2 * (qh >> 15)))); /* no branch: the signs are random */
}

AVX2_DECODE __m256i iq1_m_32(const unsigned char *b, int ib) {
    const unsigned char *g = b + 4 * ib;
    const int h0 = b[32 + 2 * ib], h1 = b[32 + 2 * ib + 1]; /* nibbles of groups 4ib .. 4ib+3 */
    const __m256i nib = _mm256_setr_epi64x(h0 & 0xF, h0 >> 4, h1 & 0xF, h1 >> 4), eight = _mm256_set1_epi64x(0x08);
    /* delta -1 where the nibble's bit 3 is set: compare per 64-bit group, then every byte */
    const __m256i neg = _mm256_cmpeq_epi64(_mm256_and_si256(nib, eight), eight);
    return iq1_32(rows8(iq1s_grid[g[0] | (h0 & 7) << 8], iq1s_grid[g[1] | (h0 >> 4 & 7) << 8], iq1s_grid[g[2] | (h1 & 7) << 8],
                        iq1s_grid[g[3] | (h1 >> 4 & 7) << 8]),
                  _mm256_or_si256(neg, _mm256_set1_epi8(1)));
}

#define LATTICE_DECODER(S)                                                                                      \
    AVX2_DECODE void q_##S(const unsigned char *b, LowbitBlock *o) {                                            \
        for (int ib = 0; ib < 8; ib++) _mm256_storeu_si256((__m256i *)(void *)(o->q + 32 * ib), S##_32(b, ib)); \
    }
LATTICE_DECODER(iq2_xxs)
LATTICE_DECODER(iq2_xs)
LATTICE_DECODER(iq2_s)
LATTICE_DECODER(iq3_xxs)
LATTICE_DECODER(iq3_s)
LATTICE_DECODER(iq1_s)
LATTICE_DECODER(iq1_m)

/* Bits 2k, 2k+1 of 32 bytes. */
AVX2 static inline __m256i crumbs(__m256i v, int k) {
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * k)), _mm256_set1_epi8(3));
}

AVX2_DECODE void q_q2_k(const unsigned char *b, LowbitBlock *o) {
    for (int h = 0; h < 2; h++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(b + 16 + 32 * h));
        for (int k = 0; k < 4; k++) _mm256_storeu_si256((__m256i *)(void *)(o->q + 128 * h + 32 * k), crumbs(v, k));
    }
}

AVX2_DECODE void q_q3_k(const unsigned char *b, LowbitBlock *o) {
    const __m256i hm = _mm256_loadu_si256((const __m256i *)(const void *)b), four = _mm256_set1_epi8(4);
    for (int h = 0; h < 2; h++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(b + 32 + 32 * h));
        for (int k = 0; k < 4; k++) {
            const __m256i bit = _mm256_set1_epi8((char)(1 << (4 * h + k)));
            const __m256i clear = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), _mm256_setzero_si256());
            _mm256_storeu_si256((__m256i *)(void *)(o->q + 128 * h + 32 * k),
                                _mm256_sub_epi8(crumbs(v, k), _mm256_and_si256(clear, four)));
        }
    }
}

/* Q5_K: the nibbles of qs (32 bytes per 64 elements) and bit g of qh[l] as 16 for group g. */
AVX2_DECODE void q_q5_k(const unsigned char *b, LowbitBlock *o) {
    const __m256i hm = _mm256_loadu_si256((const __m256i *)(const void *)(b + 16)), m4 = _mm256_set1_epi8(0xF);
    for (int c = 0; c < 4; c++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(b + 48 + 32 * c));
        for (int s = 0; s < 2; s++) {
            const __m256i bit = _mm256_set1_epi8((char)(1 << (2 * c + s)));
            const __m256i hi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit), _mm256_set1_epi8(16));
            const __m256i lo = _mm256_and_si256(s ? _mm256_srli_epi16(v, 4) : v, m4);
            _mm256_storeu_si256((__m256i *)(void *)(o->q + 64 * c + 32 * s), _mm256_or_si256(lo, hi));
        }
    }
}

/* Q4_K: the nibbles of qs (32 bytes per 64 elements, low nibbles first). */
AVX2_DECODE void q_q4_k(const unsigned char *b, LowbitBlock *o) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    for (int c = 0; c < 4; c++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(b + 16 + 32 * c));
        _mm256_storeu_si256((__m256i *)(void *)(o->q + 64 * c), _mm256_and_si256(v, m4));
        _mm256_storeu_si256((__m256i *)(void *)(o->q + 64 * c + 32), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
    }
}

/* Q6_K: per half, groups k = 0..3 take the low nibbles of ql bytes 0..31 and 32..63, then the
 * high ones, with qh's bits 2k, 2k+1. */
AVX2_DECODE void q_q6_k(const unsigned char *b, LowbitBlock *o) {
    const __m256i m4 = _mm256_set1_epi8(0xF), off = _mm256_set1_epi8(32);
    for (int h = 0; h < 2; h++) {
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(const void *)(b + 128 + 32 * h));
        for (int k = 0; k < 4; k++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(b + 64 * h + 32 * (k % 2)));
            const __m256i lo = _mm256_and_si256(k < 2 ? v : _mm256_srli_epi16(v, 4), m4);
            const __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(crumbs(qh, k), 4));
            _mm256_storeu_si256((__m256i *)(void *)(o->q + 128 * h + 32 * k), _mm256_sub_epi8(q, off));
        }
    }
}

/* 32 codebook values from 16 bytes of nibbles (element j low nibble of byte j, j + 16 high). */
AVX2 static inline void nl32(int8_t *q, const unsigned char *qs) {
    const __m128i kv = _mm_loadu_si128((const __m128i *)(const void *)kvalues_iq4nl), m = _mm_set1_epi8(0xF);
    const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)qs);
    _mm_storeu_si128((__m128i *)(void *)q, _mm_shuffle_epi8(kv, _mm_and_si128(v, m)));
    _mm_storeu_si128((__m128i *)(void *)(q + 16), _mm_shuffle_epi8(kv, _mm_and_si128(_mm_srli_epi16(v, 4), m)));
}

AVX2_DECODE void q_iq4_nl(const unsigned char *b, LowbitBlock *o) { nl32(o->q, b + 2); }

AVX2_DECODE void q_iq4_xs(const unsigned char *b, LowbitBlock *o) {
    for (int ib = 0; ib < 8; ib++) nl32(o->q + 32 * ib, b + 8 + 16 * ib);
}

/* A block's float scales split as the lanes of its parts: even parts (0, 2, ..) and odd ones. */
typedef struct {
    __m256 sce, sco, mne, mno;
} Scales8;

/* The float scales of one block straight into Scales8's lanes, for the dots of few positions: the
 * fields are unpacked in vectors and each lane evaluates the sc_* formula of lowbit.c in its order
 * of operations, so the floats are those lowbit_decode writes (a scalar decode stored and loaded
 * back as vectors costs more than the dot it feeds when it is used once). */
AVX2 static inline float f16_at(const unsigned char *p) { return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(rd16(p)))); }
/* d * k per lane. */
AVX2 static inline __m256 d_k(float d, __m256i k) { return _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(k)); }
/* (d * (0.5 + s)) * c per lane, the i-quants' scale. */
AVX2 static inline __m256 d_half(float d, __m256i s, float c) {
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(d), _mm256_add_ps(_mm256_set1_ps(0.5f), _mm256_cvtepi32_ps(s))),
                         _mm256_set1_ps(c));
}
AVX2 static inline Scales8 same8(__m256 sc) { return (Scales8){sc, sc, _mm256_setzero_ps(), _mm256_setzero_ps()}; }
AVX2 static inline Scales8 pair8(__m256 sce, __m256 sco) { return (Scales8){sce, sco, _mm256_setzero_ps(), _mm256_setzero_ps()}; }
/* Four bytes (or u16s, widened) as lanes 0,0,1,1,2,2,3,3. */
AVX2 static inline __m256i dup4(__m256i v) { return _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3)); }
AVX2 static inline uint32_t ld32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

AVX2_DECODE Scales8 s8_q2_k(const unsigned char *b) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)b);
    const __m256i e =
        _mm256_cvtepu8_epi32(_mm_shuffle_epi8(v, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1)));
    const __m256i o =
        _mm256_cvtepu8_epi32(_mm_shuffle_epi8(v, _mm_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, -1, -1, -1, -1, -1, -1, -1, -1)));
    const __m256i m = _mm256_set1_epi32(0xF);
    const float d = f16_at(b + 80), dmin = f16_at(b + 82);
    return (Scales8){d_k(d, _mm256_and_si256(e, m)), d_k(d, _mm256_and_si256(o, m)), d_k(dmin, _mm256_srli_epi32(e, 4)),
                     d_k(dmin, _mm256_srli_epi32(o, 4))};
}

/* Q3_K's 6-bit scale i: low nibble of byte i (i < 8) or high of i - 8, two high bits from byte
 * 8 + i % 4 at 2 * (i / 4). The 16 bytes loaded end at the block's end (scales at 96..107). */
AVX2_DECODE Scales8 s8_q3_k(const unsigned char *b) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(b + 94)); /* scale byte j at j + 2 */
    const __m256i lsh = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4), hsh = _mm256_setr_epi32(0, 0, 2, 2, 4, 4, 6, 6);
    const __m256i m4 = _mm256_set1_epi32(0xF), m2 = _mm256_set1_epi32(3), bias = _mm256_set1_epi32(32);
    const float d = f16_at(b + 108);
    __m256 sc[2];
    for (int p = 0; p < 2; p++) { /* lanes of scales 2l + p */
        const __m128i lo_idx =
            _mm_setr_epi8(2 + p, 4 + p, 6 + p, 8 + p, 2 + p, 4 + p, 6 + p, 8 + p, -1, -1, -1, -1, -1, -1, -1, -1);
        const __m128i hi_idx =
            _mm_setr_epi8(10 + p, 12 + p, 10 + p, 12 + p, 10 + p, 12 + p, 10 + p, 12 + p, -1, -1, -1, -1, -1, -1, -1, -1);
        const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_cvtepu8_epi32(_mm_shuffle_epi8(v, lo_idx)), lsh), m4);
        const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_cvtepu8_epi32(_mm_shuffle_epi8(v, hi_idx)), hsh), m2);
        sc[p] = d_k(d, _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), bias));
    }
    return pair8(sc[0], sc[1]);
}

/* The top nibbles of the eight u32s at b + 6 + 8 ib (bytes 2..65). */
AVX2_DECODE Scales8 s8_iq2_xxs(const unsigned char *b) {
    const __m256 v0 = _mm256_loadu_ps((const float *)(const void *)(b + 2)),
                 v1 = _mm256_loadu_ps((const float *)(const void *)(b + 34));
    const __m256i aux = _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(v0, v1, 0xDD)), 0xD8);
    return same8(d_half(f16_at(b), _mm256_srli_epi32(aux, 28), 0.25f));
}

/* Two 4-bit scales per byte, part 2l low and 2l + 1 high (IQ2_XS at 66, IQ2_S at 74). */
AVX2 static inline Scales8 nibble_scales(const unsigned char *b, const unsigned char *sc) {
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)sc));
    const float d = f16_at(b);
    return pair8(d_half(d, _mm256_and_si256(v, _mm256_set1_epi32(0xF)), 0.25f), d_half(d, _mm256_srli_epi32(v, 4), 0.25f));
}
AVX2_DECODE Scales8 s8_iq2_xs(const unsigned char *b) { return nibble_scales(b, b + 66); }
AVX2_DECODE Scales8 s8_iq2_s(const unsigned char *b) { return nibble_scales(b, b + 74); }

AVX2_DECODE Scales8 s8_iq3_xxs(const unsigned char *b) {
    const __m256i aux = _mm256_loadu_si256((const __m256i *)(const void *)(b + 66));
    return same8(d_half(f16_at(b), _mm256_srli_epi32(aux, 28), 0.5f));
}

/* Four bytes, a 4-bit scale per 32 elements: ib's is byte ib / 2 at 4 * (ib % 2). */
AVX2 static inline __m256i nibbles8(const unsigned char *p) {
    const __m256i v = dup4(_mm256_cvtepu8_epi32(_mm_cvtsi32_si128((int)ld32(p))));
    return _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4)), _mm256_set1_epi32(0xF));
}

AVX2_DECODE Scales8 s8_iq3_s(const unsigned char *b) {
    const __m256i s = nibbles8(b + 106);
    return same8(d_k(f16_at(b), _mm256_add_epi32(_mm256_slli_epi32(s, 1), _mm256_set1_epi32(1))));
}

/* (d * (2s + 1)) * 0.125 per lane, IQ1's scale. */
AVX2 static inline __m256 d_odd8(float d, __m256i s) {
    return _mm256_mul_ps(d_k(d, _mm256_add_epi32(_mm256_slli_epi32(s, 1), _mm256_set1_epi32(1))), _mm256_set1_ps(0.125f));
}

AVX2_DECODE Scales8 s8_iq1_s(const unsigned char *b) {
    const __m256i qh = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(b + 34)));
    return same8(d_odd8(f16_at(b), _mm256_and_si256(_mm256_srli_epi32(qh, 12), _mm256_set1_epi32(7))));
}

AVX2_DECODE Scales8 s8_iq1_m(const unsigned char *b) {
    uint16_t dh = 0;
    for (int i = 0; i < 4; i++) dh |= (uint16_t)((rd16(b + 48 + 2 * i) & 0xF000) >> (12 - 4 * i));
    const float d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(dh)));
    const __m256i s = dup4(_mm256_cvtepu16_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(b + 48))));
    const __m256i m = _mm256_set1_epi32(7);
    const __m256i e = _mm256_and_si256(_mm256_srlv_epi32(s, _mm256_setr_epi32(0, 6, 0, 6, 0, 6, 0, 6)), m);
    const __m256i o = _mm256_and_si256(_mm256_srlv_epi32(s, _mm256_setr_epi32(3, 9, 3, 9, 3, 9, 3, 9)), m);
    return pair8(d_odd8(d, e), d_odd8(d, o));
}

AVX2_DECODE Scales8 s8_iq4_xs(const unsigned char *b) {
    const __m256i hi = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32(rd16(b + 2)), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)), _mm256_set1_epi32(3));
    const __m256i ls = _mm256_or_si256(nibbles8(b + 4), _mm256_slli_epi32(hi, 4));
    return same8(d_k(f16_at(b), _mm256_sub_epi32(ls, _mm256_set1_epi32(32))));
}

/* Q4_K and Q5_K: eight 6-bit scales and mins per 32 (ggml's get_scale_min_k4) from bytes 4..15. */
AVX2_DECODE Scales8 s8_q5_k(const unsigned char *b) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(b + 4));
#define BYTES8(...) _mm256_cvtepu8_epi32(_mm_shuffle_epi8(v, _mm_setr_epi8(__VA_ARGS__, -1, -1, -1, -1, -1, -1, -1, -1)))
    const __m256i low = _mm256_setr_epi32(63, 63, 63, 63, 15, 15, 15, 15), two = _mm256_set1_epi32(3);
    const __m256i sc =
        _mm256_or_si256(_mm256_and_si256(BYTES8(0, 1, 2, 3, 8, 9, 10, 11), low),
                        _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(BYTES8(-1, -1, -1, -1, 0, 1, 2, 3), 6), two), 4));
    const __m256i lo_m = _mm256_srlv_epi32(BYTES8(4, 5, 6, 7, 8, 9, 10, 11), _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    const __m256i mn =
        _mm256_or_si256(_mm256_and_si256(lo_m, low),
                        _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(BYTES8(-1, -1, -1, -1, 4, 5, 6, 7), 6), two), 4));
#undef BYTES8
    const __m256 s = d_k(f16_at(b), sc), m = d_k(f16_at(b + 2), mn);
    return (Scales8){s, s, m, m};
}

/* Q6_K: sixteen int8 scales at 192. */
AVX2_DECODE Scales8 s8_q6_k(const unsigned char *b) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(b + 192));
    const __m256i e =
        _mm256_cvtepi8_epi32(_mm_shuffle_epi8(v, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1)));
    const __m256i o =
        _mm256_cvtepi8_epi32(_mm_shuffle_epi8(v, _mm_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, -1, -1, -1, -1, -1, -1, -1, -1)));
    const float d = f16_at(b + 208);
    return pair8(d_k(d, e), d_k(d, o));
}

#endif
