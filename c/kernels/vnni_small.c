/* The small-batch q8/q4/q6 kernel (1 to VNNI_SMALL_T positions: a decode step has as many as a
 * continuous-batching step has streams), AVX-512 VNNI with weight rows in the lanes.
 *
 * Each 16-row x 32-element weight block is loaded and transposed once (lane = row, dword k =
 * elements 4k..4k+3) and then serves every position; a position's four activation bytes are
 * broadcast to all lanes, so vpdpbusd leaves each row's exact block dot in its own lane with no
 * horizontal sums. The int16 activations are split as in kernels/amx.c (x = 256*hi + lo), the
 * block dot is exact in int32, and the float steps are the portable kernel's, in its order:
 * every result is bit-identical to qdot_*_portable whatever the number of positions.
 *
 * Compiled with target attributes; reached through the vnni set (kernels/vnni.c: every batch,
 * 8 positions at a time) and the amx set (kernels/amx.c: decode steps and tails past its tiles). */
#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#include "kernels/vnni_small.h"

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define VNNI_INLINE VNNI __attribute__((always_inline)) static inline
/* The short constant loops below carry "#pragma GCC unroll": at -O2 GCC leaves some of them
 * rolled and then keeps the block's vectors on the stack, a fifth of the q4 kernel's time. */

/* Bytes per position and block in the small layout: signed high bytes, the low bytes less 128
 * (signed, for q8), unsigned low bytes, then the block's int32 sum of the activations (q6
 * takes its weights' offset of 32 off with it) and q8's int32 correction (below), padded to
 * two cache lines. */
#define SMALL_BLOCK 128
#define SMALL_SUM 96
#define SMALL_Q8C 100

size_t vnni_small_pack_bytes(int n, int nb) { return (size_t)n * nb * SMALL_BLOCK; }

VNNI void vnni_small_pack(const QAct *a, int t0, int n, int8_t *dst) {
    const int nb = a->nb;
    for (int t = 0; t < n; t++)
        for (int b = 0; b < nb; b++) {
            const __m512i x = _mm512_loadu_si512(a->q + ((size_t)(t0 + t) * nb + b) * QBLOCK);
            const __m256i hi = _mm512_cvtepi16_epi8(_mm512_srai_epi16(x, 8));
            int8_t *o = dst + ((size_t)t * nb + b) * SMALL_BLOCK;
            _mm256_storeu_si256((__m256i *)o, hi);
            const __m256i lo = _mm512_cvtepi16_epi8(x);
            _mm256_storeu_si256((__m256i *)(o + 32), _mm256_xor_si256(lo, _mm256_set1_epi8((char)0x80)));
            _mm256_storeu_si256((__m256i *)(o + 64), lo);
            const __m512i one = _mm512_set1_epi16(1);
            const int32_t shi = _mm512_reduce_add_epi32(_mm512_madd_epi16(_mm512_srai_epi16(x, 8), one));
            const int32_t slo = _mm512_reduce_add_epi32(_mm512_madd_epi16(_mm512_and_si512(x, _mm512_set1_epi16(0xff)), one));
            const int32_t sum = 256 * shi + slo; /* x = 256*hi + lo */
            /* q8 (see small16): 2^15 sum(hi) + 2^7 sum(lo) - 2^19, taken off; wraps like the dots */
            const int32_t q8c = (int32_t)(0u - ((uint32_t)shi << 15) - ((uint32_t)slo << 7) + (1u << 19));
            memcpy(o + SMALL_SUM, &sum, sizeof sum);
            memcpy(o + SMALL_Q8C, &q8c, sizeof q8c);
        }
}

/* Lane L holds row 4*(L%4) + L/4 (what the in-lane 4x4 transposes below produce); the map is
 * its own inverse, so the same index vector puts rows back in order. */
VNNI_INLINE __m512i lane_rows(void) { return _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0); }

/* 16 rows' 16 bytes at p (rows row_bytes apart) as 4 vectors, vector k lane L = dword k of
 * row 4*(L%4) + L/4. */
VNNI_INLINE void transpose16x4(const unsigned char *p, size_t row_bytes, __m512i *v) {
    __m512i z[4];
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        const unsigned char *r = p + (size_t)4 * g * row_bytes;
        __m512i t = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)r));
        t = _mm512_inserti32x4(t, _mm_loadu_si128((const __m128i *)(r + row_bytes)), 1);
        t = _mm512_inserti32x4(t, _mm_loadu_si128((const __m128i *)(r + 2 * row_bytes)), 2);
        z[g] = _mm512_inserti32x4(t, _mm_loadu_si128((const __m128i *)(r + 3 * row_bytes)), 3);
    }
    const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    v[0] = _mm512_unpacklo_epi64(t0, t2);
    v[1] = _mm512_unpackhi_epi64(t0, t2);
    v[2] = _mm512_unpacklo_epi64(t1, t3);
    v[3] = _mm512_unpackhi_epi64(t1, t3);
}

VNNI_INLINE __m512i bcast(const int8_t *p) { return _mm512_set1_epi32(*(const int32_t *)(const void *)p); }

/* acc + vpdpbusd(u, the signed dword at p in every lane), with the broadcast folded into the
 * instruction's memory operand: GCC emits a separate vpbroadcastd for bcast(). */
VNNI_INLINE __m512i dpbusd_bcast(__m512i acc, __m512i u, const int8_t *p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int32_t *)(const void *)p));
    return acc;
}

VNNI_INLINE __m512 f16_lo(__m512i v) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)); }
VNNI_INLINE __m512 f16_hi(__m512i v) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16))); }

/* One 16-row block's dots against n positions, its weights v[8] in lanes (q4/q6: the unsigned
 * codes; q8: biased by 128, sw the rows' sums << 7), its f16 scales dw/mw: into acc and mins. */
VNNI_INLINE void block_dots(const QType qt, const __m512i *v, __m512i sw, __m512 dw, __m512 mw, const QAct *a, int t0,
                            const int8_t *pk, const int n, int b, __m512 *acc, __m512 *mins) {
    const int nb = a->nb, q4 = qt == QT_Q4;
    const size_t kd = (size_t)b * a->rows + t0;
#pragma GCC unroll 8
    for (int i = 0; i < n; i++, pk += (size_t)nb * SMALL_BLOCK) {
        __m512i h = _mm512_setzero_si512(), l = _mm512_setzero_si512(), isum;
        if (q4 || qt == QT_Q6) {
            /* nibbles (q6: u <= 63) unsigned, high bytes signed; low bytes unsigned, the
             * weights as signed */
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                h = dpbusd_bcast(h, v[k], pk + 4 * k);
                l = _mm512_dpbusd_epi32(l, bcast(pk + 64 + 4 * k), v[k]);
            }
            isum = _mm512_add_epi32(_mm512_slli_epi32(h, 8), l);
            if (qt == QT_Q6) /* q = u - 32: the exact signed sum */
                isum = _mm512_sub_epi32(isum, _mm512_slli_epi32(bcast(pk + SMALL_SUM), 5));
        } else {
            /* q8: with u = w + 128, hi signed and lo' = lo - 128,
             *   sum w*x = 256 sum u*hi + sum u*lo' + 128 sum w - 2^15 sum hi - 2^7 sum lo + 2^19,
             * the last three terms the pack's correction; exact modulo 2^32, as the result is */
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                h = dpbusd_bcast(h, v[k], pk + 4 * k);
                l = dpbusd_bcast(l, v[k], pk + 32 + 4 * k);
            }
            isum = _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(h, 8), l), _mm512_add_epi32(sw, bcast(pk + SMALL_Q8C)));
        }
        const __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(a->d[kd + i]));
        acc[i] = _mm512_add_ps(acc[i], _mm512_mul_ps(sc, _mm512_cvtepi32_ps(isum)));
        if (q4) mins[i] = _mm512_add_ps(mins[i], _mm512_mul_ps(mw, _mm512_set1_ps(a->s[kd + i])));
    }
}

/* q4 nibble dwords (byte j: element j low, j+16 high) as the eight unsigned code vectors */
VNNI_INLINE void q4_codes(const __m512i *p, __m512i *v) {
    const __m512i m4 = _mm512_set1_epi8(15);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        v[k] = _mm512_and_si512(p[k], m4);
        v[k + 4] = _mm512_and_si512(_mm512_srli_epi16(p[k], 4), m4);
    }
}

/* the next 16 rows (contiguous) into cache, block b's share of them: the rows are read 16 at a
 * time, a pattern the hardware prefetcher does not follow. Into L2, not L1: 16 rows are as
 * large as L1 (34 KB at 2048 columns of q8, 70 KB at 4096), so into L1 they evicted the rows
 * being read (Zen 4, decode of a 2048-column q8 matrix past the caches: 18-20 GB/s with T0,
 * 25-33 with T1, on 2 threads) */
VNNI_INLINE void prefetch_next(const unsigned char *next, int b, size_t bb) {
    if (next)
        for (size_t o = (size_t)b * 16 * bb; o < (size_t)(b + 1) * 16 * bb; o += 64)
            _mm_prefetch((const char *)next + o, _MM_HINT_T1);
}

/* 16 q4 rows, four blocks (80 bytes a row: dwords 5j the scales of block j, 5j+1..5j+4 its
 * nibbles) from five transposes: the scales come out of the same transposes as the nibbles
 * instead of a gather per block, which on Zen 4 stalled decode from DRAM (11 GB/s a thread
 * with the gathers, 16 without them). */
VNNI_INLINE void q4_four_blocks(const unsigned char *w, size_t row_bytes, const QAct *a, int t0, const int8_t *packed,
                                const int n, int b, const unsigned char *next, __m512 *acc, __m512 *mins) {
    __m512i d[20];
    const unsigned char *wb = w + (size_t)b * 20;
    transpose16x4(wb, row_bytes, d);
    /* block j's dwords end in transpose j + 1: each block runs once its transposes are done, so
     * no more than two transposes' vectors are live beside the accumulators */
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        transpose16x4(wb + 16 * (j + 1), row_bytes, d + 4 * (j + 1));
        prefetch_next(next, b + j, 20);
        __m512i v[8];
        q4_codes(d + 5 * j + 1, v);
        block_dots(QT_Q4, v, _mm512_setzero_si512(), f16_lo(d[5 * j]), f16_hi(d[5 * j]), a, t0,
                   packed + (size_t)(b + j) * SMALL_BLOCK, n, b + j, acc, mins);
    }
}

/* 16 weight rows (w: row 0) x n positions (packed by vnni_small_pack; scales from position t0
 * of a), the whole row; results to y[i*ldy + r]. n is a constant in each instance. */
VNNI_INLINE void small16(const QType qt, const unsigned char *w, size_t row_bytes, const QAct *a, int t0, const int8_t *packed,
                         const int n, const unsigned char *next, float *y, size_t ldy) {
    const int nb = a->nb, q4 = qt == QT_Q4;
    const size_t bb = q4 ? 20 : qt == QT_Q6 ? 26 : 34;
    const __m512i perm = lane_rows();
    const __m512i rowoff = _mm512_mullo_epi32(perm, _mm512_set1_epi32((int)row_bytes));
    const __m512i m4 = _mm512_set1_epi8(15), ones = _mm512_set1_epi8(1);
    __m512 acc[VNNI_SMALL_T], mins[VNNI_SMALL_T];
#pragma GCC unroll 8
    for (int i = 0; i < n; i++) acc[i] = mins[i] = _mm512_setzero_ps();
    int b = 0;
    if (q4)
        for (; b + 4 <= nb; b += 4) q4_four_blocks(w, row_bytes, a, t0, packed, n, b, next, acc, mins);
    /* q6: the next block's scale comes with this block's high bits (below) */
    __m512i q6_next_heads =
        qt == QT_Q6 && b < nb ? _mm512_i32gather_epi32(rowoff, w + (size_t)b * bb, 1) : _mm512_setzero_si512();
    for (; b < nb; b++) {
        const unsigned char *wb = w + (size_t)b * bb;
        prefetch_next(next, b, bb);
        const __m512i heads = qt == QT_Q6 ? q6_next_heads : _mm512_i32gather_epi32(rowoff, wb, 1);
        const __m512 dw = f16_lo(heads), mw = q4 ? f16_hi(heads) : dw;
        __m512i v[8], sw = _mm512_setzero_si512();
        if (qt == QT_Q6) { /* u of elements 4k..4k+3: nibble dword k (k < 4) or the high nibbles
                              of dword k - 4, and bits 4-5 from high-bit dword k % 2, whose pair
                              k / 2 a shift by 4 - 2 * (k / 2) moves there */
            __m512i p[4], hb[4];
            transpose16x4(wb + 2, row_bytes, p);
            if (b + 1 < nb) { /* bytes 18-33: the high bits, then the next block's scale (its
                                 dword 2's low half): one transpose instead of three gathers */
                transpose16x4(wb + 18, row_bytes, hb);
                q6_next_heads = hb[2];
            } else { /* the row's last block: 16 bytes from 18 would run past the row */
                hb[0] = _mm512_i32gather_epi32(rowoff, wb + 18, 1);
                hb[1] = _mm512_i32gather_epi32(rowoff, wb + 22, 1);
            }
            const __m512i m30 = _mm512_set1_epi8(0x30);
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                const __m512i lo = k < 4 ? p[k] : _mm512_srli_epi16(p[k - 4], 4);
                const int j = k >> 1;
                const __m512i h = j == 0   ? _mm512_slli_epi16(hb[k & 1], 4)
                                  : j == 1 ? _mm512_slli_epi16(hb[k & 1], 2)
                                  : j == 2 ? hb[k & 1]
                                           : _mm512_srli_epi16(hb[k & 1], 2);
                /* (lo & 0x0f) | (h & 0x30): 0xf8 is A | (B & C) with A = lo & 0x0f */
                v[k] = _mm512_ternarylogic_epi32(_mm512_and_si512(lo, m4), h, m30, 0xf8);
            }
        } else if (q4) {
            __m512i p[4];
            transpose16x4(wb + 4, row_bytes, p);
            q4_codes(p, v);
        } else {
            transpose16x4(wb + 2, row_bytes, v);
            transpose16x4(wb + 18, row_bytes, v + 4);
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) sw = _mm512_dpbusd_epi32(sw, ones, v[k]); /* the rows' sums */
            sw = _mm512_slli_epi32(sw, 7);
            /* the weights biased by 128 go in as the unsigned operand, so the activations can
             * be the broadcast one */
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) v[k] = _mm512_xor_si512(v[k], _mm512_set1_epi8((char)0x80));
        }
        block_dots(qt, v, sw, dw, mw, a, t0, packed + (size_t)b * SMALL_BLOCK, n, b, acc, mins);
    }
#pragma GCC unroll 8
    for (int i = 0; i < n; i++)
        _mm512_storeu_ps(y + (size_t)i * ldy, _mm512_permutexvar_ps(perm, q4 ? _mm512_add_ps(acc[i], mins[i]) : acc[i]));
}

VNNI_INLINE void small_rows(const QType qt, const unsigned char *w, size_t row_bytes, int nr16, const QAct *a, int t0,
                            const int8_t *packed, const int n, float *y, size_t ldy) {
    for (int r = 0; r < nr16; r += 16)
        small16(qt, w + (size_t)r * row_bytes, row_bytes, a, t0, packed, n,
                r + 16 < nr16 ? w + (size_t)(r + 16) * row_bytes : NULL, y + r, ldy);
}

#define SMALL_CASES(qt)                                                                       \
    switch (n) {                                                                              \
    case 1: small_rows(qt, w, row_bytes, nr16, a, t0, packed, 1, y, ldy); return;             \
    case 2: small_rows(qt, w, row_bytes, nr16, a, t0, packed, 2, y, ldy); return;             \
    case 3: small_rows(qt, w, row_bytes, nr16, a, t0, packed, 3, y, ldy); return;             \
    case 4: small_rows(qt, w, row_bytes, nr16, a, t0, packed, 4, y, ldy); return;             \
    case 5: small_rows(qt, w, row_bytes, nr16, a, t0, packed, 5, y, ldy); return;             \
    case 6: small_rows(qt, w, row_bytes, nr16, a, t0, packed, 6, y, ldy); return;             \
    case 7: small_rows(qt, w, row_bytes, nr16, a, t0, packed, 7, y, ldy); return;             \
    default: small_rows(qt, w, row_bytes, nr16, a, t0, packed, VNNI_SMALL_T, y, ldy); return; \
    }

VNNI void vnni_small_q4(const unsigned char *w, size_t row_bytes, int nr16, const QAct *a, int t0, int n, const int8_t *packed,
                        float *y, size_t ldy) {
    SMALL_CASES(QT_Q4)
}

VNNI void vnni_small_q8(const unsigned char *w, size_t row_bytes, int nr16, const QAct *a, int t0, int n, const int8_t *packed,
                        float *y, size_t ldy) {
    SMALL_CASES(QT_Q8)
}

VNNI void vnni_small_q6(const unsigned char *w, size_t row_bytes, int nr16, const QAct *a, int t0, int n, const int8_t *packed,
                        float *y, size_t ldy) {
    SMALL_CASES(QT_Q6)
}

#endif
