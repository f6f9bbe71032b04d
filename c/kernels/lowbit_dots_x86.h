/* The x86 dots of the low-bit types, compiled once per kernel set that includes this file with its
 * LOWBIT_TARGET and LOWBIT_SET (lowbit_avx2.c; lowbit_avx512.c and lowbit_vnni.c, whose targets
 * give the same code 32 vector registers, so the prefill dots keep a position's sixteen
 * activation vectors in them, and define LOWBIT_ZMM for 512-bit dots of few positions). A block's
 * codes come from the decoders of lowbit_decode_x86.h (lowbit_decode_zmm.h), equal to lowbit.c's
 * byte for byte. The 16-element integer sums are madd_epi16 over the int16 activations, and a
 * block's float combination is lowbit_block_add's, evaluated in 8 lanes: exact integer sums and
 * the same float operations in the same order, so the result is the portable dot's, bit for bit
 * (tests/test_gguf_quants.py checks both the dot and, through it, the decoders). */
#ifndef COLI_LOWBIT_DOTS_X86_H
#define COLI_LOWBIT_DOTS_X86_H
#include <immintrin.h>
#include <string.h>

#include "kernels/isa.h"
#include "kernels/lowbit.h"
#include "kernels/lowbit_decode_x86.h"

#define LB __attribute__((target(LOWBIT_TARGET)))

/* acc plus the sums of a * b's 16-bit pairs per 32-bit lane: one instruction in a build with VNNI
 * (lowbit_vnni.c), the same wrapping integer sum. Not for chains of accumulation into one
 * register: its latency then costs more than the add it saves (the prefill dots, 15 % slower). */
#ifdef LOWBIT_VNNI
#define DPW512(acc, a, b) _mm512_dpwssd_epi32(acc, a, b)
#else
#define DPW512(acc, a, b) _mm512_add_epi32(acc, _mm512_madd_epi16(a, b))
#endif

static const LowbitDecodeFn CODES[] = {
    [QT_Q2_K - QT_Q2_K] = q_q2_k,     [QT_Q3_K - QT_Q2_K] = q_q3_k,       [QT_IQ1_S - QT_Q2_K] = q_iq1_s,
    [QT_IQ1_M - QT_Q2_K] = q_iq1_m,   [QT_IQ2_XXS - QT_Q2_K] = q_iq2_xxs, [QT_IQ2_XS - QT_Q2_K] = q_iq2_xs,
    [QT_IQ2_S - QT_Q2_K] = q_iq2_s,   [QT_IQ3_XXS - QT_Q2_K] = q_iq3_xxs, [QT_IQ3_S - QT_Q2_K] = q_iq3_s,
    [QT_IQ4_NL - QT_Q2_K] = q_iq4_nl, [QT_IQ4_XS - QT_Q2_K] = q_iq4_xs,   [QT_Q5_K - QT_Q2_K] = q_q5_k,
    [QT_Q6_K - QT_Q2_K] = q_q6_k,     [QT_Q4_K - QT_Q2_K] = q_q4_k,
};

/* The sums of each of v[0..8)'s eight int32 lanes. */
LB static inline __m256i hsum8(const __m256i *v) {
    const __m256i e = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i f = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(e, f, 0x20), _mm256_permute2x128_si256(e, f, 0x31));
}

/* Even and odd lanes of the 16 floats p[0..16), each as 8 lanes in order. */
LB static inline void even_odd(const float *p, __m256 *even, __m256 *odd) {
    const __m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);
    *even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
    *odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
}

LB static inline Scales8 scales8(const LowbitBlock *blk, int has_min) {
    Scales8 s;
    even_odd(blk->sc, &s.sce, &s.sco);
    if (has_min) even_odd(blk->mn, &s.mne, &s.mno);
    else s.mne = s.mno = _mm256_setzero_ps();
    return s;
}

/* lowbit_block_add's v of a 256-element block from its parts' integer sums in lanes (is_*: q . x,
 * xs_*: sum of x, both as floats of exact integers), in its order, for the row's lanes. */
LB static inline __m256 block_lanes(const Scales8 *s, int has_min, __m256i is_even, __m256i is_odd, __m256 xs_even, __m256 xs_odd,
                                    __m256 d) {
    __m256 part =
        _mm256_add_ps(_mm256_mul_ps(s->sce, _mm256_cvtepi32_ps(is_even)), _mm256_mul_ps(s->sco, _mm256_cvtepi32_ps(is_odd)));
    if (has_min) part = _mm256_sub_ps(part, _mm256_add_ps(_mm256_mul_ps(s->mne, xs_even), _mm256_mul_ps(s->mno, xs_odd)));
    return _mm256_mul_ps(d, part);
}

/* lowbit_lanes_sum of a row's lanes. */
LB static inline float lanes_sum(__m256 v) {
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* a0+a4, a1+a5, .. */
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                              /* +(a2+a6), +(a3+a7) */
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

/* block_lanes of a 256-element block, its eight parts in the lanes of one vector. */
LB static inline __m256 block_sum8(const LowbitBlock *blk, int has_min, const __m256i *pw_even, const __m256i *pw_odd,
                                   const __m256i *px_even, const __m256i *px_odd, __m256 d) {
    const Scales8 s = scales8(blk, has_min);
    __m256 xse = _mm256_setzero_ps(), xso = xse;
    if (has_min) xse = _mm256_cvtepi32_ps(hsum8(px_even)), xso = _mm256_cvtepi32_ps(hsum8(px_odd));
    return block_lanes(&s, has_min, hsum8(pw_even), hsum8(pw_odd), xse, xso, d);
}

/* Whether a type's codes may be negative (sign-extended when widened) or never are (masked). */
#define LB_SIGNED_q2_k 0
#define LB_SIGNED_q4_k 0
#define LB_SIGNED_q5_k 0
#define LB_SIGNED_q3_k 1
#define LB_SIGNED_q6_k 1
#define LB_SIGNED_iq1_s 1
#define LB_SIGNED_iq1_m 1
#define LB_SIGNED_iq2_xxs 1
#define LB_SIGNED_iq2_xs 1
#define LB_SIGNED_iq2_s 1
#define LB_SIGNED_iq3_xxs 1
#define LB_SIGNED_iq3_s 1
#define LB_SIGNED_iq4_xs 1

/* The dots of few positions below go one weight row at a time: two interleaved rows overlapped
 * their chains of dependent operations (1.1x in the caches) but streamed a matrix past the
 * caches 2.4x slower. With fewer than LOWBIT_PACKED_MIN_ROWS positions in the matmul they read
 * the pack's even and odd elements (lowbit.h): a code byte's 16-bit lane holds it and its odd
 * neighbour, widened in place by shifts, so two multiply-adds per activation vector leave four
 * consecutive elements' sums per 32-bit lane. The same integer sums and float operations as the
 * portable dot: the same bits. */
#ifdef LOWBIT_ZMM
#include "kernels/lowbit_decode_zmm.h"

typedef void (*LowbitZcodesFn)(const unsigned char *, __m512i *);

/* The sixteen parts' sums of a block from z[h], the multiply-adds of activation block h against
 * its 32 codes (lanes 0-7: part 2h's pairs, 8-15: part 2h + 1's): even parts in *even's lanes,
 * odd in *odd's, the lanes block_lanes reads. A transposing tree of unpacks and adds. */
LB static inline void part_sums16(const __m512i *z, __m256i *even, __m256i *odd) {
    __m512i w[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) /* per 128-bit lane: z[2i] lanes 0+2, z[2i+1] 0+2, z[2i] 1+3, z[2i+1] 1+3 */
        w[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]), _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]));
    /* per 128-bit lane q: the sums of z[0..3]'s (X) and z[4..7]'s (Y) four lanes of q */
    const __m512i X
    = _mm512_add_epi32(_mm512_unpacklo_epi64(w[0], w[1]), _mm512_unpackhi_epi64(w[0], w[1]));
    const __m512i Y = _mm512_add_epi32(_mm512_unpacklo_epi64(w[2], w[3]), _mm512_unpackhi_epi64(w[2], w[3]));
    /* 128-bit lanes: even parts 0-6, odd 1-7, even 8-14, odd 9-15 */
    const __m512i S = _mm512_add_epi32(_mm512_shuffle_i32x4(X, Y, _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm512_shuffle_i32x4(X, Y, _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i P = _mm512_shuffle_i32x4(S, S, _MM_SHUFFLE(3, 1, 2, 0));
    *even = _mm512_castsi512_si256(P);
    *odd = _mm512_extracti64x4_epi64(P, 1);
}

/* The same from z[v], the sums of four consecutive elements of each 64 (lanes 4j..4j+3 hold
 * part 4v + j's). */
LB static inline void part_sums4(const __m512i *z, __m256i *even, __m256i *odd) {
    const __m512i s1 = _mm512_add_epi32(_mm512_unpacklo_epi32(z[0], z[1]), _mm512_unpackhi_epi32(z[0], z[1]));
    const __m512i s2 = _mm512_add_epi32(_mm512_unpacklo_epi32(z[2], z[3]), _mm512_unpackhi_epi32(z[2], z[3]));
    /* lane 4j + v: part 4v + j */
    const __m512i R = _mm512_add_epi32(_mm512_unpacklo_epi64(s1, s2), _mm512_unpackhi_epi64(s1, s2));
    const __m512i P = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15), R);
    *even = _mm512_castsi512_si256(P);
    *odd = _mm512_extracti64x4_epi64(P, 1);
}

/* One weight row against the pack's even and odd elements. */
LB static inline __attribute__((always_inline)) void few_split_row(LowbitZcodesFn zcodes,
                                                                   Scales8 (*scales)(const unsigned char *), int bytes,
                                                                   int has_min, int SIGNED, int NT, const unsigned char *row,
                                                                   const QAct *a, int t0, float *y, size_t ldy) {
    const int nk = a->nb / 8;
    const __m512i low = _mm512_set1_epi16(0xFF);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int k = 0; k < nk; k++) {
        const unsigned char *bb = row + (size_t)k * bytes;
        const Scales8 s = scales(bb);
        __m512i c[4], ev[4], od[4];
        zcodes(bb, c);
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            ev[v] = SIGNED ? _mm512_srai_epi16(_mm512_slli_epi16(c[v], 8), 8) : _mm512_and_si512(c[v], low);
            od[v] = SIGNED ? _mm512_srai_epi16(c[v], 8) : _mm512_srli_epi16(c[v], 8);
        }
#pragma GCC unroll 2
        for (int i = 0; i < NT; i++) {
            const unsigned char *p = a->lp + ((size_t)(t0 + i) * nk + k) * LOWBIT_PACK_BYTES;
            const __m512i *x = (const __m512i *)(const void *)p;
            const float *f = (const float *)(const void *)(p + 512);
            __m512i z[4];
            __m256i se, so;
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++)
                z[v] = DPW512(_mm512_madd_epi16(ev[v], _mm512_loadu_si512(x + 2 * v)), od[v], _mm512_loadu_si512(x + 2 * v + 1));
            part_sums4(z, &se, &so);
            acc[i] = _mm256_add_ps(
                acc[i], block_lanes(&s, has_min, se, so, _mm256_loadu_ps(f + 8), _mm256_loadu_ps(f + 16), _mm256_loadu_ps(f)));
        }
    }
    for (int i = 0; i < NT; i++) y[i * ldy] = lanes_sum(acc[i]);
}

/* One weight row against the activation blocks as they are (the last positions of a larger
 * matmul, whose pack holds lowbit_pack_act's other layout): the codes sign-extended, one
 * multiply-add per activation block, the parts' sums by part_sums16. */
LB static inline __attribute__((always_inline)) void few_zmm_row(LowbitZcodesFn zcodes, Scales8 (*scales)(const unsigned char *),
                                                                 int bytes, int has_min, int NT, const unsigned char *row,
                                                                 const QAct *a, int t0, float *y, size_t ldy) {
    const int nk = a->nb / 8;
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int k = 0; k < nk; k++) {
        const unsigned char *bb = row + (size_t)k * bytes;
        const Scales8 s = scales(bb);
        __m512i c[4], wq[8];
        zcodes(bb, c);
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            wq[2 * v] = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(c[v]));
            wq[2 * v + 1] = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(c[v], 1));
        }
#pragma GCC unroll 2
        for (int i = 0; i < NT; i++) {
            const __m512i *x = (const __m512i *)(const void *)(a->q + ((size_t)(t0 + i) * a->nb + (size_t)k * 8) * QBLOCK);
            const float *f = (const float *)(const void *)(a->lp + ((size_t)(t0 + i) * nk + k) * LOWBIT_PACK_BYTES + 512);
            __m512i z[8];
            __m256i se, so;
#pragma GCC unroll 8
            for (int h = 0; h < 8; h++) z[h] = _mm512_madd_epi16(wq[h], _mm512_loadu_si512(x + h));
            part_sums16(z, &se, &so);
            acc[i] = _mm256_add_ps(
                acc[i], block_lanes(&s, has_min, se, so, _mm256_loadu_ps(f + 8), _mm256_loadu_ps(f + 16), _mm256_loadu_ps(f)));
        }
    }
    for (int i = 0; i < NT; i++) y[i * ldy] = lanes_sum(acc[i]);
}

#define LOWBIT_FEW_CALL(S, HAS_MIN, NT)                                                                  \
    do {                                                                                                 \
        for (int r = 0; r < nr; r++) {                                                                   \
            const unsigned char *row = w + (size_t)r * row_bytes;                                        \
            if (a->rows < LOWBIT_PACKED_MIN_ROWS)                                                        \
                few_split_row(z_##S, s8_##S, bytes, HAS_MIN, LB_SIGNED_##S, NT, row, a, t0, y + r, ldy); \
            else few_zmm_row(z_##S, s8_##S, bytes, HAS_MIN, NT, row, a, t0, y + r, ldy);                 \
        }                                                                                                \
    } while (0)
#else
/* The eight lanes of hsum8's result from its first level of pairs (hadd of v[2j], v[2j+1]). */
LB static inline __m256i hsum8_pairs(const __m256i *p) {
    const __m256i e = _mm256_hadd_epi32(p[0], p[1]), f = _mm256_hadd_epi32(p[2], p[3]);
    return _mm256_add_epi32(_mm256_permute2x128_si256(e, f, 0x20), _mm256_permute2x128_si256(e, f, 0x31));
}

/* The AVX2 build's dots of the last one or two positions of a larger matmul (whose pack holds
 * the rearranged layout), one weight row at a time: the block's scales straight into lanes
 * (s8_*), its codes widened in their own order, and per position
 * sixteen multiply-adds against the activation blocks as they are, two horizontal sums for the
 * parts' integer sums, the pack's d and xs (so Q2_K's sums of x are not redone per row).
 * Instantiated per type so the decoders inline. Same sums, same float operations in the same
 * order: the portable dot's bits. */
LB static inline __attribute__((always_inline)) void
lowbit_qdot_few(LowbitDecodeFn codes, Scales8 (*scales)(const unsigned char *), int bytes, int has_min, int NT, QDOT_ARGS) {
    (void)nt; /* the positions are NT, a constant per instance */
    const int nk = a->nb / 8;
    for (int r = 0; r < nr; r++) {
        __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
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
                acc[i] = _mm256_add_ps(acc[i], block_lanes(&s, has_min, hsum8_pairs(pe[i]), hsum8_pairs(po[i]),
                                                           _mm256_loadu_ps(f + 8), _mm256_loadu_ps(f + 16), _mm256_loadu_ps(f)));
            }
        }
        for (int i = 0; i < NT; i++) y[i * ldy + r] = lanes_sum(acc[i]);
    }
}

/* The AVX2 build's against the even and odd copy: each 32 codes of the decoder's block widened in place, two multiply-adds
 * per 32 elements leave four elements' sums per lane (lanes 0-3 part 2h, 4-7 part 2h + 1), two
 * levels of horizontal adds the parts'. */
LB static inline __attribute__((always_inline)) void few_split_row8(LowbitDecodeFn codes,
                                                                    Scales8 (*scales)(const unsigned char *), int bytes,
                                                                    int has_min, int SIGNED, int NT, const unsigned char *row,
                                                                    const QAct *a, int t0, float *y, size_t ldy) {
    const int nk = a->nb / 8;
    const __m256i low = _mm256_set1_epi16(0xFF);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int k = 0; k < nk; k++) {
        const unsigned char *bb = row + (size_t)k * bytes;
        const Scales8 s = scales(bb);
        LowbitBlock blk;
        codes(bb, &blk);
#pragma GCC unroll 2
        for (int i = 0; i < NT; i++) {
            const unsigned char *p = a->lp + ((size_t)(t0 + i) * nk + k) * LOWBIT_PACK_BYTES;
            const int16_t *x = (const int16_t *)(const void *)p;
            const float *f = (const float *)(const void *)(p + 512);
            __m256i z[8];
#pragma GCC unroll 8
            for (int h = 0; h < 8; h++) {
                const __m256i c = _mm256_loadu_si256((const __m256i *)(const void *)(blk.q + 32 * h));
                const __m256i ev = SIGNED ? _mm256_srai_epi16(_mm256_slli_epi16(c, 8), 8) : _mm256_and_si256(c, low);
                const __m256i od = SIGNED ? _mm256_srai_epi16(c, 8) : _mm256_srli_epi16(c, 8);
                const int16_t *xe = x + 64 * (h / 2) + 16 * (h % 2);
                z[h] = _mm256_add_epi32(_mm256_madd_epi16(ev, _mm256_loadu_si256((const __m256i *)(const void *)xe)),
                                        _mm256_madd_epi16(od, _mm256_loadu_si256((const __m256i *)(const void *)(xe + 32))));
            }
            /* 128-bit lanes: even parts 0-6 | odd 1-7, and even 8-14 | odd 9-15 */
            const __m256i e1 = _mm256_hadd_epi32(_mm256_hadd_epi32(z[0], z[1]), _mm256_hadd_epi32(z[2], z[3]));
            const __m256i e2 = _mm256_hadd_epi32(_mm256_hadd_epi32(z[4], z[5]), _mm256_hadd_epi32(z[6], z[7]));
            acc[i] = _mm256_add_ps(acc[i], block_lanes(&s, has_min, _mm256_permute2x128_si256(e1, e2, 0x20),
                                                       _mm256_permute2x128_si256(e1, e2, 0x31), _mm256_loadu_ps(f + 8),
                                                       _mm256_loadu_ps(f + 16), _mm256_loadu_ps(f)));
        }
    }
    for (int i = 0; i < NT; i++) y[i * ldy] = lanes_sum(acc[i]);
}

#define LOWBIT_FEW_CALL(S, HAS_MIN, NT)                                                                                         \
    do {                                                                                                                        \
        if (a->rows < LOWBIT_PACKED_MIN_ROWS)                                                                                   \
            for (int r = 0; r < nr; r++)                                                                                        \
                few_split_row8(q_##S, s8_##S, bytes, HAS_MIN, LB_SIGNED_##S, NT, w + (size_t)r * row_bytes, a, t0, y + r, ldy); \
        else lowbit_qdot_few(q_##S, s8_##S, bytes, HAS_MIN, NT, w, row_bytes, nr, a, t0, NT, y, ldy);                           \
    } while (0)
#endif

/* A block's 256 codes as int16 in lowbit_pack_act's order (vector 8p + m: elements 2m, 2m+1 of
 * parts 2l + p in lanes l): bytes 32l..32l+31 hold parts 2l and 2l+1, one per 128-bit lane, so
 * an 8 x 8 transpose of their 16-bit pairs within the lanes leaves pair m of the even parts in
 * the low lane of vector m and of the odd parts in the high one. */
LB static inline void codes_lanes(const int8_t *q, __m256i *wv) {
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
 * lowbit_block_add reads, with no horizontal sums. Each (row, position) still adds its blocks in
 * order and integer sums are exact, so the bits are the portable dot's at any blocking. */
LB static void lowbit_qdot_packed(const LowbitType *t, LowbitDecodeFn codes, QDOT_ARGS) {
    enum { R = 8 };
    const int nk = a->nb / 8, has_min = t->has_min;
    __m256 acc[R][LOWBIT_MAX_ROWS];
    __m256i wv[R][16];
    Scales8 s[R];
    LowbitBlock blk;
    for (int r0 = 0; r0 < nr; r0 += R) {
        const int n = nr - r0 < R ? nr - r0 : R;
        for (int r = 0; r < n; r++)
            for (int i = 0; i < nt; i++) acc[r][i] = _mm256_setzero_ps();
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
#pragma GCC unroll 16
                for (int m = 0; m < 16; m++) xv[m] = _mm256_loadu_si256(xp + m);
                const __m256 xse = _mm256_loadu_ps(f + 8), xso = _mm256_loadu_ps(f + 16), d = _mm256_loadu_ps(f);
                for (int r = 0; r < n; r++) {
                    __m256i se = _mm256_setzero_si256(), so = se;
#pragma GCC unroll 8
                    for (int m = 0; m < 8; m++) {
                        se = _mm256_add_epi32(se, _mm256_madd_epi16(wv[r][m], xv[m]));
                        so = _mm256_add_epi32(so, _mm256_madd_epi16(wv[r][8 + m], xv[8 + m]));
                    }
                    acc[r][i] = _mm256_add_ps(acc[r][i], block_lanes(&s[r], has_min, se, so, xse, xso, d));
                }
            }
        }
        for (int r = 0; r < n; r++)
            for (int i = 0; i < nt; i++) y[i * ldy + r0 + r] = lanes_sum(acc[r][i]);
    }
}

#define FEW(S, HAS_MIN)                              \
    LB static void few_##S(int bytes, QDOT_ARGS) {   \
        if (nt == 1) LOWBIT_FEW_CALL(S, HAS_MIN, 1); \
        else LOWBIT_FEW_CALL(S, HAS_MIN, 2);         \
    }
FEW(q2_k, 1)
FEW(q3_k, 0)
FEW(iq1_s, 0)
FEW(iq1_m, 0)
FEW(iq2_xxs, 0)
FEW(iq2_xs, 0)
FEW(iq2_s, 0)
FEW(iq3_xxs, 0)
FEW(iq3_s, 0)
FEW(iq4_xs, 0)
FEW(q5_k, 1)
FEW(q6_k, 0)
#define s8_q4_k s8_q5_k /* the same scale bytes */
FEW(q4_k, 1)

/* Per type, the dots of few positions (none for IQ4_NL, whose 32-element blocks take the path below). */
static void (*const FEWS[])(int, QDOT_ARGS) = {
    [QT_Q2_K - QT_Q2_K] = few_q2_k,   [QT_Q3_K - QT_Q2_K] = few_q3_k,       [QT_IQ1_S - QT_Q2_K] = few_iq1_s,
    [QT_IQ1_M - QT_Q2_K] = few_iq1_m, [QT_IQ2_XXS - QT_Q2_K] = few_iq2_xxs, [QT_IQ2_XS - QT_Q2_K] = few_iq2_xs,
    [QT_IQ2_S - QT_Q2_K] = few_iq2_s, [QT_IQ3_XXS - QT_Q2_K] = few_iq3_xxs, [QT_IQ3_S - QT_Q2_K] = few_iq3_s,
    [QT_IQ4_NL - QT_Q2_K] = NULL,     [QT_IQ4_XS - QT_Q2_K] = few_iq4_xs,   [QT_Q5_K - QT_Q2_K] = few_q5_k,
    [QT_Q6_K - QT_Q2_K] = few_q6_k,   [QT_Q4_K - QT_Q2_K] = few_q4_k,
};

LB static void lowbit_qdot_set(QType qt, QDOT_ARGS) {
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
        float acc[LOWBIT_MAX_ROWS][8] = {{0}}; /* lowbit_block_add's lanes per position */
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
                    lowbit_block_add(&blk, 1, 0, is, xs, dp, acc[i]);
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
                _mm256_storeu_ps(acc[i], _mm256_add_ps(_mm256_loadu_ps(acc[i]), block_sum8(&blk, has_min, pe, po, xe, xo, d)));
            }
        }
        for (int i = 0; i < nt; i++) y[i * ldy + r] = lowbit_lanes_sum(acc[i]);
    }
}

#define LB_NAME2(S, SET) qdot_##S##_##SET
#define LB_NAME(S, SET) LB_NAME2(S, SET)
#define LOWBIT_DOT(S, QT) \
    LB void LB_NAME(S, LOWBIT_SET)(QDOT_ARGS) { lowbit_qdot_set(QT, w, row_bytes, nr, a, t0, nt, y, ldy); }
LOWBIT_TYPES(LOWBIT_DOT)
#endif
