/* The AVX2 dots of the low-bit types. A block's float scales are lowbit.c's; its int8 codes come
 * from the SIMD decoders here (lattice rows gathered as 64-bit words, signs applied with
 * sign_epi8, bit fields unpacked 32 at a time), equal to lowbit.c's codes byte for byte. The
 * 16-element integer sums are madd_epi16 over the int16 activations, reduced eight halves at a
 * time, and a block's float combination is lowbit_block_sum's, evaluated in 8 lanes: exact
 * integer sums and the same float operations in the same order, so the result is the portable
 * dot's, bit for bit (tests/test_gguf_quants.py checks both the
 * dot and, through it, the decoders). The AVX-512, VNNI and AMX sets use these. */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <string.h>

#include "kernels/isa.h"
#include "kernels/lowbit.h"
#include "kernels/lowbit_grids.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
/* The block decoders: inlined into the dots of few positions, where a call per block shows. */
#define AVX2_DECODE AVX2 static inline __attribute__((always_inline))

static uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint16_t rd16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static int ld4(const int8_t *p) {
    int v;
    memcpy(&v, p, 4);
    return v;
}
/* The sign bytes of four 7-bit sign indexes packed in aux (k-th at bit 7k). */
static inline __attribute__((always_inline)) uint32_t ksigns4(uint32_t aux) {
    return (uint32_t)lowbit_ksigns[aux & 127] | (uint32_t)lowbit_ksigns[aux >> 7 & 127] << 8 |
           (uint32_t)lowbit_ksigns[aux >> 14 & 127] << 16 | (uint32_t)lowbit_ksigns[aux >> 21 & 127] << 24;
}

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

/* 32 lattice coordinates, negated where the sign bits say. */
AVX2 static inline void signed32(int8_t *q, __m256i g, uint32_t signs) {
    const __m256i s = _mm256_or_si256(sign_bytes(signs), _mm256_set1_epi8(1)); /* -1 or +1 */
    _mm256_storeu_si256((__m256i *)(void *)q, _mm256_sign_epi8(g, s));
}

AVX2_DECODE void q_iq2_xxs(const unsigned char *b, LowbitBlock *o) {
    for (int ib = 0; ib < 8; ib++) {
        const unsigned char *g = b + 2 + 8 * ib;
        signed32(o->q + 32 * ib, rows8(iq2xxs_grid[g[0]], iq2xxs_grid[g[1]], iq2xxs_grid[g[2]], iq2xxs_grid[g[3]]),
                 ksigns4(rd32(g + 4)));
    }
}

AVX2_DECODE void q_iq2_xs(const unsigned char *b, LowbitBlock *o) {
    for (int ib = 0; ib < 8; ib++) {
        const unsigned char *p = b + 2 + 8 * ib;
        const uint16_t v0 = rd16(p), v1 = rd16(p + 2), v2 = rd16(p + 4), v3 = rd16(p + 6);
        const uint32_t s = (uint32_t)lowbit_ksigns[v0 >> 9] | (uint32_t)lowbit_ksigns[v1 >> 9] << 8 |
                           (uint32_t)lowbit_ksigns[v2 >> 9] << 16 | (uint32_t)lowbit_ksigns[v3 >> 9] << 24;
        signed32(o->q + 32 * ib, rows8(iq2xs_grid[v0 & 511], iq2xs_grid[v1 & 511], iq2xs_grid[v2 & 511], iq2xs_grid[v3 & 511]),
                 s);
    }
}

AVX2_DECODE void q_iq2_s(const unsigned char *b, LowbitBlock *o) {
    const unsigned char *qs = b + 2, *sg = b + 34, *qh = b + 66;
    for (int ib = 0; ib < 8; ib++) {
        const unsigned char *g = qs + 4 * ib;
        const int h = qh[ib];
        signed32(o->q + 32 * ib,
                 rows8(iq2s_grid[g[0] | (h & 3) << 8], iq2s_grid[g[1] | (h >> 2 & 3) << 8], iq2s_grid[g[2] | (h >> 4 & 3) << 8],
                       iq2s_grid[g[3] | (h >> 6 & 3) << 8]),
                 rd32(sg + 4 * ib));
    }
}

/* Eight 4-coordinate rows (IQ3's lattices) as one vector. */
AVX2 static inline __m256i rows4(const int8_t *r0, const int8_t *r1, const int8_t *r2, const int8_t *r3, const int8_t *r4,
                                 const int8_t *r5, const int8_t *r6, const int8_t *r7) {
    return _mm256_setr_epi32(ld4(r0), ld4(r1), ld4(r2), ld4(r3), ld4(r4), ld4(r5), ld4(r6), ld4(r7));
}

AVX2_DECODE void q_iq3_xxs(const unsigned char *b, LowbitBlock *o) {
    for (int ib = 0; ib < 8; ib++) {
        const unsigned char *g = b + 2 + 8 * ib;
        signed32(o->q + 32 * ib,
                 rows4(iq3xxs_grid[g[0]], iq3xxs_grid[g[1]], iq3xxs_grid[g[2]], iq3xxs_grid[g[3]], iq3xxs_grid[g[4]],
                       iq3xxs_grid[g[5]], iq3xxs_grid[g[6]], iq3xxs_grid[g[7]]),
                 ksigns4(rd32(b + 66 + 4 * ib)));
    }
}

AVX2_DECODE void q_iq3_s(const unsigned char *b, LowbitBlock *o) {
    const unsigned char *qs = b + 2, *qh = b + 66, *sg = b + 74;
    for (int ib = 0; ib < 8; ib++) {
        const unsigned char *g = qs + 8 * ib; /* rows 8ib + j, the ninth index bit is bit j of qh[ib] */
        const int h = qh[ib];
        signed32(o->q + 32 * ib,
                 rows4(iq3s_grid[g[0] | (h & 1) << 8], iq3s_grid[g[1] | (h >> 1 & 1) << 8], iq3s_grid[g[2] | (h >> 2 & 1) << 8],
                       iq3s_grid[g[3] | (h >> 3 & 1) << 8], iq3s_grid[g[4] | (h >> 4 & 1) << 8],
                       iq3s_grid[g[5] | (h >> 5 & 1) << 8], iq3s_grid[g[6] | (h >> 6 & 1) << 8],
                       iq3s_grid[g[7] | (h >> 7 & 1) << 8]),
                 rd32(sg + 4 * ib));
    }
}

/* 8 * coordinate (-1, 0, 1) + delta per group of 8 (delta: +-1 in each byte). */
AVX2 static inline void iq1_32(int8_t *q, __m256i g, __m256i delta) {
    _mm256_storeu_si256((__m256i *)(void *)q, _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), g), delta));
}

AVX2_DECODE void q_iq1_s(const unsigned char *b, LowbitBlock *o) {
    for (int ib = 0; ib < 8; ib++) {
        const uint16_t qh = rd16(b + 34 + 2 * ib);
        const unsigned char *qs = b + 2 + 4 * ib;
        iq1_32(o->q + 32 * ib,
               rows8(iq1s_grid[qs[0] | (qh & 7) << 8], iq1s_grid[qs[1] | (qh >> 3 & 7) << 8],
                     iq1s_grid[qs[2] | (qh >> 6 & 7) << 8], iq1s_grid[qs[3] | (qh >> 9 & 7) << 8]),
               _mm256_set1_epi8((char)(1 - 2 * (qh >> 15)))); /* no branch: the signs are random */
    }
}

AVX2_DECODE void q_iq1_m(const unsigned char *b, LowbitBlock *o) {
    const unsigned char *qs = b + 0, *qh = b + 32;
    const __m256i one = _mm256_set1_epi8(1), eight = _mm256_set1_epi64x(0x08);
    for (int ib = 0; ib < 8; ib++) {
        const unsigned char *g = qs + 4 * ib;
        const int h0 = qh[2 * ib], h1 = qh[2 * ib + 1]; /* nibbles of groups 4ib .. 4ib+3 */
        const __m256i nib = _mm256_setr_epi64x(h0 & 0xF, h0 >> 4, h1 & 0xF, h1 >> 4);
        /* delta -1 where the nibble's bit 3 is set: compare per 64-bit group, then every byte */
        const __m256i neg = _mm256_cmpeq_epi64(_mm256_and_si256(nib, eight), eight);
        iq1_32(o->q + 32 * ib,
               rows8(iq1s_grid[g[0] | (h0 & 7) << 8], iq1s_grid[g[1] | (h0 >> 4 & 7) << 8], iq1s_grid[g[2] | (h1 & 7) << 8],
                     iq1s_grid[g[3] | (h1 >> 4 & 7) << 8]),
               _mm256_or_si256(neg, one));
    }
}

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

static const LowbitDecodeFn CODES[] = {
    [QT_Q2_K - QT_Q2_K] = q_q2_k,     [QT_Q3_K - QT_Q2_K] = q_q3_k,       [QT_IQ1_S - QT_Q2_K] = q_iq1_s,
    [QT_IQ1_M - QT_Q2_K] = q_iq1_m,   [QT_IQ2_XXS - QT_Q2_K] = q_iq2_xxs, [QT_IQ2_XS - QT_Q2_K] = q_iq2_xs,
    [QT_IQ2_S - QT_Q2_K] = q_iq2_s,   [QT_IQ3_XXS - QT_Q2_K] = q_iq3_xxs, [QT_IQ3_S - QT_Q2_K] = q_iq3_s,
    [QT_IQ4_NL - QT_Q2_K] = q_iq4_nl, [QT_IQ4_XS - QT_Q2_K] = q_iq4_xs,
};

/* The sums of each of v[0..8)'s eight int32 lanes. */
AVX2 static inline __m256i hsum8(const __m256i *v) {
    const __m256i e = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i f = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(e, f, 0x20), _mm256_permute2x128_si256(e, f, 0x31));
}

/* Even and odd lanes of the 16 floats p[0..16), each as 8 lanes in order. */
AVX2 static inline void even_odd(const float *p, __m256 *even, __m256 *odd) {
    const __m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);
    *even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
    *odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
}

/* A block's float scales split as the lanes of its parts: even parts (0, 2, ..) and odd ones. */
typedef struct {
    __m256 sce, sco, mne, mno;
} Scales8;

AVX2 static inline Scales8 scales8(const LowbitBlock *blk, int has_min) {
    Scales8 s;
    even_odd(blk->sc, &s.sce, &s.sco);
    if (has_min) even_odd(blk->mn, &s.mne, &s.mno);
    else s.mne = s.mno = _mm256_setzero_ps();
    return s;
}

/* lowbit_block_sum of a 256-element block from its parts' integer sums in lanes (is_*: q . x,
 * xs_*: sum of x, both as floats of exact integers), in lowbit_block_sum's order. */
AVX2 static inline float block_sum_lanes(const Scales8 *s, int has_min, __m256i is_even, __m256i is_odd, __m256 xs_even,
                                         __m256 xs_odd, __m256 d) {
    __m256 part =
        _mm256_add_ps(_mm256_mul_ps(s->sce, _mm256_cvtepi32_ps(is_even)), _mm256_mul_ps(s->sco, _mm256_cvtepi32_ps(is_odd)));
    if (has_min) part = _mm256_sub_ps(part, _mm256_add_ps(_mm256_mul_ps(s->mne, xs_even), _mm256_mul_ps(s->mno, xs_odd)));
    const __m256 v = _mm256_mul_ps(d, part);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* v0+v4, v1+v5, .. */
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                              /* +(v2+v6), +(v3+v7) */
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

/* lowbit_block_sum of a 256-element block, its eight parts in the lanes of one vector. */
AVX2 static inline float block_sum8(const LowbitBlock *blk, int has_min, const __m256i *pw_even, const __m256i *pw_odd,
                                    const __m256i *px_even, const __m256i *px_odd, __m256 d) {
    const Scales8 s = scales8(blk, has_min);
    __m256 xse = _mm256_setzero_ps(), xso = xse;
    if (has_min) xse = _mm256_cvtepi32_ps(hsum8(px_even)), xso = _mm256_cvtepi32_ps(hsum8(px_odd));
    return block_sum_lanes(&s, has_min, hsum8(pw_even), hsum8(pw_odd), xse, xso, d);
}

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
/* The dots of fewer positions than LOWBIT_PACKED_MIN_ROWS, one weight row at a time: the block's
 * scales straight into lanes (s8_*), its codes widened in their own order, and per position
 * sixteen multiply-adds against the activation blocks as they are, two horizontal sums for the
 * parts' integer sums, and the pack's d and xs (so Q2_K's sums of x are not redone per row).
 * Instantiated per type so the decoders inline. Same sums, same float operations in the same
 * order: the portable dot's bits. */
/* The eight lanes of hsum8's result from its first level of pairs (hadd of v[2j], v[2j+1]). */
AVX2 static inline __m256i hsum8_pairs(const __m256i *p) {
    const __m256i e = _mm256_hadd_epi32(p[0], p[1]), f = _mm256_hadd_epi32(p[2], p[3]);
    return _mm256_add_epi32(_mm256_permute2x128_si256(e, f, 0x20), _mm256_permute2x128_si256(e, f, 0x31));
}

AVX2 static inline __attribute__((always_inline)) void
lowbit_qdot_few(LowbitDecodeFn codes, Scales8 (*scales)(const unsigned char *), int bytes, int has_min, int NT, QDOT_ARGS) {
    (void)nt; /* the positions are NT, a constant per instance */
    const int nk = a->nb / 8;
    for (int r = 0; r < nr; r++) {
        float acc[2] = {0, 0};
        const unsigned char *row = w + (size_t)r * row_bytes;
        for (int k = 0; k < nk; k++) {
            const unsigned char *bb = row + (size_t)k * bytes;
            LowbitBlock blk;
            const Scales8 s = scales(bb);
            codes(bb, &blk);
            __m256i pe[2][4], po[2][4]; /* per position, the first level of hsum8's pairs */
#pragma GCC unroll 4
            for (int h = 0; h < 8; h += 2) {
                __m256i wq[4];
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++)
                    wq[j] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(blk.q + 32 * h + 16 * j)));
#pragma GCC unroll 2
                for (int i = 0; i < NT; i++) {
                    const __m256i *x =
                        (const __m256i *)(const void *)(a->q + ((size_t)(t0 + i) * a->nb + (size_t)k * 8 + h) * QBLOCK);
                    pe[i][h / 2] = _mm256_hadd_epi32(_mm256_madd_epi16(wq[0], _mm256_loadu_si256(x)),
                                                     _mm256_madd_epi16(wq[2], _mm256_loadu_si256(x + 2)));
                    po[i][h / 2] = _mm256_hadd_epi32(_mm256_madd_epi16(wq[1], _mm256_loadu_si256(x + 1)),
                                                     _mm256_madd_epi16(wq[3], _mm256_loadu_si256(x + 3)));
                }
            }
#pragma GCC unroll 2
            for (int i = 0; i < NT; i++) {
                const float *f = (const float *)(const void *)(a->lp + ((size_t)(t0 + i) * nk + k) * LOWBIT_PACK_BYTES + 512);
                acc[i] += block_sum_lanes(&s, has_min, hsum8_pairs(pe[i]), hsum8_pairs(po[i]), _mm256_loadu_ps(f + 8),
                                          _mm256_loadu_ps(f + 16), _mm256_loadu_ps(f));
            }
        }
        for (int i = 0; i < NT; i++) y[i * ldy + r] = acc[i];
    }
}

/* A block's 256 codes as int16 in lowbit_pack_act's order (vector 8p + m: elements 2m, 2m+1 of
 * parts 2l + p in lanes l): bytes 32l..32l+31 hold parts 2l and 2l+1, one per 128-bit lane, so
 * an 8 x 8 transpose of their 16-bit pairs within the lanes leaves pair m of the even parts in
 * the low lane of vector m and of the odd parts in the high one. */
AVX2 static inline void codes_lanes(const int8_t *q, __m256i *wv) {
    __m256i r[8], a[8], b[8];
    for (int l = 0; l < 8; l++) r[l] = _mm256_loadu_si256((const __m256i *)(const void *)(q + 32 * l));
    for (int i = 0; i < 4; i++) {
        a[2 * i] = _mm256_unpacklo_epi16(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm256_unpackhi_epi16(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {                                         /* rows 4i..4i+3 */
        b[4 * i + 0] = _mm256_unpacklo_epi32(a[4 * i], a[4 * i + 2]);     /* pairs 0, 1 */
        b[4 * i + 1] = _mm256_unpackhi_epi32(a[4 * i], a[4 * i + 2]);     /* pairs 2, 3 */
        b[4 * i + 2] = _mm256_unpacklo_epi32(a[4 * i + 1], a[4 * i + 3]); /* pairs 4, 5 */
        b[4 * i + 3] = _mm256_unpackhi_epi32(a[4 * i + 1], a[4 * i + 3]); /* pairs 6, 7 */
    }
    for (int j = 0; j < 4; j++) {
        const __m256i c0 = _mm256_unpacklo_epi64(b[j], b[4 + j]), c1 = _mm256_unpackhi_epi64(b[j], b[4 + j]);
        wv[2 * j] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(c0));
        wv[8 + 2 * j] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(c0, 1));
        wv[2 * j + 1] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(c1));
        wv[8 + 2 * j + 1] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(c1, 1));
    }
}

/* The dots against lowbit_pack_act's rows. Block by block, the block of up to eight rows is
 * decoded once into lanes (4 KB, in L1) and each position's packed block is loaded once for all
 * of them; per row and position, sixteen multiply-adds leave the parts' integer sums in the lanes
 * lowbit_block_sum reads, with no horizontal sums. Each (row, position) still adds its blocks in
 * order and integer sums are exact, so the bits are the portable dot's at any blocking. */
AVX2 static void lowbit_qdot_packed(const LowbitType *t, LowbitDecodeFn codes, QDOT_ARGS) {
    enum { R = 8 };
    const int nk = a->nb / 8, has_min = t->has_min;
    float acc[R][LOWBIT_MAX_ROWS];
    __m256i wv[R][16];
    Scales8 s[R];
    LowbitBlock blk;
    for (int r0 = 0; r0 < nr; r0 += R) {
        const int n = nr - r0 < R ? nr - r0 : R;
        for (int r = 0; r < n; r++)
            for (int i = 0; i < nt; i++) acc[r][i] = 0;
        for (int k = 0; k < nk; k++) {
            for (int r = 0; r < n; r++) {
                const unsigned char *bb = w + (size_t)(r0 + r) * row_bytes + (size_t)k * t->bytes;
                t->scales(bb, &blk);
                codes(bb, &blk);
                codes_lanes(blk.q, wv[r]);
                s[r] = scales8(&blk, has_min);
            }
            for (int i = 0; i < nt; i++) {
                const unsigned char *p = a->lp + ((size_t)(t0 + i) * nk + k) * LOWBIT_PACK_BYTES;
                const __m256i *xp = (const __m256i *)(const void *)p;
                const float *f = (const float *)(const void *)(p + 512);
                __m256i xv[16];
                for (int m = 0; m < 16; m++) xv[m] = _mm256_loadu_si256(xp + m);
                const __m256 xse = _mm256_loadu_ps(f + 8), xso = _mm256_loadu_ps(f + 16), d = _mm256_loadu_ps(f);
                for (int r = 0; r < n; r++) {
                    __m256i se = _mm256_setzero_si256(), so = se;
                    for (int m = 0; m < 8; m++) {
                        se = _mm256_add_epi32(se, _mm256_madd_epi16(wv[r][m], xv[m]));
                        so = _mm256_add_epi32(so, _mm256_madd_epi16(wv[r][8 + m], xv[8 + m]));
                    }
                    acc[r][i] += block_sum_lanes(&s[r], has_min, se, so, xse, xso, d);
                }
            }
        }
        for (int r = 0; r < n; r++)
            for (int i = 0; i < nt; i++) y[i * ldy + r0 + r] = acc[r][i];
    }
}

#define FEW(S, QT)                                                                                                \
    AVX2 static void few_##S(int bytes, QDOT_ARGS) {                                                              \
        if (nt == 1) lowbit_qdot_few(q_##S, s8_##S, bytes, QT == QT_Q2_K, 1, w, row_bytes, nr, a, t0, 1, y, ldy); \
        else lowbit_qdot_few(q_##S, s8_##S, bytes, QT == QT_Q2_K, 2, w, row_bytes, nr, a, t0, 2, y, ldy);         \
    }
FEW(q2_k, QT_Q2_K)
FEW(q3_k, QT_Q3_K)
FEW(iq1_s, QT_IQ1_S)
FEW(iq1_m, QT_IQ1_M)
FEW(iq2_xxs, QT_IQ2_XXS)
FEW(iq2_xs, QT_IQ2_XS)
FEW(iq2_s, QT_IQ2_S)
FEW(iq3_xxs, QT_IQ3_XXS)
FEW(iq3_s, QT_IQ3_S)
FEW(iq4_xs, QT_IQ4_XS)

/* Per type, the dots of few positions (none for IQ4_NL, whose 32-element blocks take the path below). */
static void (*const FEWS[])(int, QDOT_ARGS) = {
    [QT_Q2_K - QT_Q2_K] = few_q2_k,   [QT_Q3_K - QT_Q2_K] = few_q3_k,       [QT_IQ1_S - QT_Q2_K] = few_iq1_s,
    [QT_IQ1_M - QT_Q2_K] = few_iq1_m, [QT_IQ2_XXS - QT_Q2_K] = few_iq2_xxs, [QT_IQ2_XS - QT_Q2_K] = few_iq2_xs,
    [QT_IQ2_S - QT_Q2_K] = few_iq2_s, [QT_IQ3_XXS - QT_Q2_K] = few_iq3_xxs, [QT_IQ3_S - QT_Q2_K] = few_iq3_s,
    [QT_IQ4_NL - QT_Q2_K] = NULL,     [QT_IQ4_XS - QT_Q2_K] = few_iq4_xs,
};

AVX2 static void lowbit_qdot_avx2(QType qt, QDOT_ARGS) {
    const LowbitType *t = lowbit_type(qt);
    const LowbitDecodeFn codes = CODES[qt - QT_Q2_K];
    const int per = t->block / QBLOCK, nblk = a->nb / per, has_min = t->has_min;
    if (a->lp && per == 8 && nt >= LOWBIT_PACKED_MIN_ROWS) {
        lowbit_qdot_packed(t, codes, w, row_bytes, nr, a, t0, nt, y, ldy);
        return;
    }
    if (a->lp && FEWS[qt - QT_Q2_K]) {
        FEWS[qt - QT_Q2_K](t->bytes, w, row_bytes, nr, a, t0, nt, y, ldy);
        return;
    }
    const __m256i ones = _mm256_set1_epi16(1);
    LowbitBlock blk;
    for (int r = 0; r < nr; r++) {
        float acc[LOWBIT_MAX_ROWS] = {0};
        const unsigned char *row = w + (size_t)r * row_bytes;
        for (int k = 0; k < nblk; k++) {
            const unsigned char *bb = row + (size_t)k * t->bytes;
            t->scales(bb, &blk);
            codes(bb, &blk);
            __m256i w16[16];
            for (int j = 0; j < 2 * per; j++)
                w16[j] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(blk.q + 16 * j)));
            for (int i = 0; i < nt; i++) {
                const int16_t *x = a->q + ((size_t)(t0 + i) * a->nb + (size_t)k * per) * QBLOCK;
                const float *dp = a->d + (size_t)k * per * a->rows + t0 + i;
                if (per == 1) { /* IQ4_NL: one activation block per weight block */
                    int32_t is[16], xs[16] = {0};
                    __m256i pw[8] = {0};
                    for (int j = 0; j < 2; j++)
                        pw[j] = _mm256_madd_epi16(w16[j], _mm256_loadu_si256((const __m256i *)(const void *)(x + 16 * j)));
                    _mm256_storeu_si256((__m256i *)(void *)is, hsum8(pw));
                    acc[i] += lowbit_block_sum(&blk, 1, 0, is, xs, dp);
                    continue;
                }
                __m256i pe[8], po[8], xe[8], xo[8];
                for (int h = 0; h < 8; h++) {
                    const __m256i x0 = _mm256_loadu_si256((const __m256i *)(const void *)(x + 32 * h));
                    const __m256i x1 = _mm256_loadu_si256((const __m256i *)(const void *)(x + 32 * h + 16));
                    pe[h] = _mm256_madd_epi16(w16[2 * h], x0);
                    po[h] = _mm256_madd_epi16(w16[2 * h + 1], x1);
                    if (has_min) xe[h] = _mm256_madd_epi16(x0, ones), xo[h] = _mm256_madd_epi16(x1, ones);
                }
                const size_t ds = (size_t)a->rows;
                const __m256 d =
                    _mm256_setr_ps(dp[0], dp[ds], dp[2 * ds], dp[3 * ds], dp[4 * ds], dp[5 * ds], dp[6 * ds], dp[7 * ds]);
                acc[i] += block_sum8(&blk, has_min, pe, po, xe, xo, d);
            }
        }
        for (int i = 0; i < nt; i++) y[i * ldy + r] = acc[i];
    }
}

#define LOWBIT_AVX2(S, QT) \
    AVX2 void qdot_##S##_avx2(QDOT_ARGS) { lowbit_qdot_avx2(QT, w, row_bytes, nr, a, t0, nt, y, ldy); }
LOWBIT_TYPES(LOWBIT_AVX2)
#endif
