/* AMX-INT8 q8/q4 matmul: the portable kernels' arithmetic (exact int32 block dot, then
 * acc += (dw*dx) * isum block by block, mins apart for q4), so every result is bit-identical to
 * the portable reference whatever the batch, with the block dots done by tile multiplies.
 *
 * The int16 activations are split into a signed high byte and an unsigned low byte
 * (x = 256*hi + lo), so two tile dots per block give the int16 x int8 sum exactly (no int8
 * activation rounding: the oracle tests pass unchanged). Weights are the A tile, read in place
 * (16 rows, one 32-element block; q4 nibbles unpacked first); activations are the B tile,
 * packed once per matmul by amx_pack_act into the VNNI layout the tiles want. Each weight
 * block is loaded once per 16 positions; C comes back as 16 rows x N positions of int32.
 *
 * Compiled with target attributes (this file alone uses AMX); kernels_use picks it at run time
 * after the kernel granted this process the tile state (quant.c). */
#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#include "quant.h"

#define AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define AMX_INLINE AMX __attribute__((always_inline)) static inline

/* Tiles: 0 weights (A), 1/2 activation high/low bytes (B), 3/4 their sums (C). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileCfg;

/* The N (positions per tile) this thread's tiles are configured for; 0: not yet. */
static _Thread_local int tl_cfg_n;

AMX static void tiles_config(int n) {
    if (tl_cfg_n == n) return;
    TileCfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    c.rows[0] = 16, c.colsb[0] = 32;
    c.rows[1] = c.rows[2] = 8, c.colsb[1] = c.colsb[2] = (uint16_t)(n * 4);
    c.rows[3] = c.rows[4] = 16, c.colsb[3] = c.colsb[4] = (uint16_t)(n * 4);
    /* not _tile_loadconfig: GCC 12 sees its operand as a few bytes and drops the stores above */
    __asm__ volatile("ldtilecfg %0" ::"m"(c));
    tl_cfg_n = n;
}

/* A last group of at most this many positions runs on the VNNI kernel, one position at a
 * time: the tiles' cost per group hardly depends on how many positions it has. */
#define SMALL_T 4

size_t amx_pack_bytes(int T, int nb) { return (size_t)((T + AMX_TILE_T - 1) / AMX_TILE_T) * nb * 1024; }

/* Position group g (16 positions, zero past T), block b: a 512-byte tile of high bytes, then
 * one of low bytes; tile row k/4 holds, for each position n, elements k..k+3 at n*4. */
AMX void amx_pack_act(const QAct *a, int8_t *dst) {
    const int T = a->rows, nb = a->nb, groups = T / AMX_TILE_T + (T % AMX_TILE_T > SMALL_T);
    const __m256i rows = _mm256_set_epi32(7 * 64, 6 * 64, 5 * 64, 4 * 64, 3 * 64, 2 * 64, 64, 0);
    memset(dst, 0, (size_t)groups * nb * 1024);
    for (int t = 0; t < T && t / AMX_TILE_T < groups; t++) {
        const int g = t / AMX_TILE_T, n = t % AMX_TILE_T;
        for (int b = 0; b < nb; b++) {
            const __m512i x = _mm512_loadu_si512(a->q + ((size_t)t * nb + b) * QBLOCK);
            int8_t *hi = dst + ((size_t)g * nb + b) * 1024 + n * 4;
            /* arithmetic shift: the signed high byte; truncation: the low byte */
            _mm256_i32scatter_epi32(hi, rows, _mm512_cvtepi16_epi8(_mm512_srai_epi16(x, 8)), 1);
            _mm256_i32scatter_epi32(hi + 512, rows, _mm512_cvtepi16_epi8(x), 1);
        }
    }
}

/* 16 q4 rows' block b unpacked to int8 elements 0..31, 32 bytes a row. */
AMX_INLINE void q4_unpack16(const unsigned char *w, size_t row_bytes, int8_t *out) {
    const __m256i mask = _mm256_set1_epi8(15);
    for (int r = 0; r < 16; r += 2) {
        const __m256i v = _mm256_loadu2_m128i((const __m128i *)(w + (r + 1) * row_bytes), (const __m128i *)(w + r * row_bytes));
        const __m256i lo = _mm256_and_si256(v, mask), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
        _mm256_storeu_si256((__m256i *)(out + r * 32), _mm256_permute2x128_si256(lo, hi, 0x20));
        _mm256_storeu_si256((__m256i *)(out + (r + 1) * 32), _mm256_permute2x128_si256(lo, hi, 0x31));
    }
}

/* The f16 pair at the start of block b in each of 16 rows (q8: d and two quants; q4: d, m). */
AMX_INLINE __m512i block_heads(const unsigned char *w, __m512i rowoff) { return _mm512_i32gather_epi32(rowoff, w, 1); }

AMX_INLINE __m512 f16_lo(__m512i v) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)); }
AMX_INLINE __m512 f16_hi(__m512i v) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16))); }

/* The exact block sums 256*hi + lo as floats. */
AMX_INLINE __m512 isum_ps(const int32_t *hi, const int32_t *lo) {
    const __m512i h = _mm512_loadu_si512(hi), l = _mm512_loadu_si512(lo);
    return _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(h, 8), l));
}

/* 16 weight rows (w: row 0) x positions t0..t0+n-1 (group g of the packed activations), the
 * whole row. q4 adds the min term. Results to y[(t0+i)*ldy + r]. */
AMX_INLINE void tile16(const int q4, const unsigned char *w, size_t row_bytes, const QAct *a, const int8_t *packed,
                       int g, int n, float *y, size_t ldy) {
    const int nb = a->nb, t0 = g * AMX_TILE_T;
    const size_t bb = q4 ? 20 : 34;
    const __m512i rowoff = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                              _mm512_set1_epi32((int)row_bytes));
    int32_t chi[256] __attribute__((aligned(64))), clo[256] __attribute__((aligned(64)));
    int8_t wq[512] __attribute__((aligned(64)));
    const int8_t *pk = packed + (size_t)g * nb * 1024;
    /* prefill: acc[r] holds row r against the n positions, one lane each */
    const __mmask16 live = (__mmask16)((1u << n) - 1);
    __m512 acc[16], mins[16];
    for (int r = 0; r < 16; r++) acc[r] = mins[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++, pk += 1024) {
        const unsigned char *wb = w + b * bb;
        if (q4) { q4_unpack16(wb + 4, row_bytes, wq); _tile_loadd(0, wq, 32); }
        else _tile_loadd(0, wb + 2, row_bytes);
        _tile_loadd(1, pk, 64);
        _tile_loadd(2, pk + 512, 64);
        _tile_zero(3);
        _tile_zero(4);
        if (q4) { _tile_dpbusd(3, 0, 1); _tile_dpbuud(4, 0, 2); }
        else { _tile_dpbssd(3, 0, 1); _tile_dpbsud(4, 0, 2); }
        _tile_stored(3, chi, 64);
        _tile_stored(4, clo, 64);
        const __m512i heads = block_heads(wb, rowoff);
        float dw[16], mw[16];
        _mm512_storeu_ps(dw, f16_lo(heads));
        if (q4) _mm512_storeu_ps(mw, f16_hi(heads));
        const size_t k = (size_t)b * a->rows + t0;
        const __m512 dx = _mm512_maskz_loadu_ps(live, a->d + k);
        const __m512 sx = q4 ? _mm512_maskz_loadu_ps(live, a->s + k) : dx;
#pragma GCC unroll 16
        for (int r = 0; r < 16; r++) {
            const __m512 sc = _mm512_mul_ps(_mm512_set1_ps(dw[r]), dx);
            acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(sc, isum_ps(chi + 16 * r, clo + 16 * r)));
            if (q4) mins[r] = _mm512_add_ps(mins[r], _mm512_mul_ps(_mm512_set1_ps(mw[r]), sx));
        }
    }
    float out[16][16];
    for (int r = 0; r < 16; r++) _mm512_storeu_ps(out[r], q4 ? _mm512_add_ps(acc[r], mins[r]) : acc[r]);
    for (int i = 0; i < n; i++)
        for (int r = 0; r < 16; r++) y[(size_t)(t0 + i) * ldy + r] = out[r][i];
}

/* ---- decode (one position): AVX-512 VNNI, 16 rows in the lanes ----
 * Each row's block dot is a vector of lane partial sums; a transpose-and-add tree turns 16 rows'
 * vectors into one vector of their exact block sums, then the float steps are portable's. */

/* Lane sums of v[0..3] within each 128-bit group: result group g, lane j = row j's group-g sum. */
AMX_INLINE __m512i sum4x4(const __m512i *v) {
    const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[0], v[1]), _mm512_unpackhi_epi32(v[0], v[1]));
    const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2], v[3]), _mm512_unpackhi_epi32(v[2], v[3]));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
}

/* 16 rows' whole-vector sums, row r in lane r. */
AMX_INLINE __m512i hsum16(const __m512i *v) {
    const __m512i u0 = sum4x4(v), u1 = sum4x4(v + 4), u2 = sum4x4(v + 8), u3 = sum4x4(v + 12);
    const __m512i s01 = _mm512_add_epi32(_mm512_shuffle_i32x4(u0, u1, 0x88), _mm512_shuffle_i32x4(u0, u1, 0xDD));
    const __m512i s23 = _mm512_add_epi32(_mm512_shuffle_i32x4(u2, u3, 0x88), _mm512_shuffle_i32x4(u2, u3, 0xDD));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(s01, s23, 0x88), _mm512_shuffle_i32x4(s01, s23, 0xDD));
}

/* As hsum16 for vectors holding two blocks, groups 0 and 2 the first, 1 and 3 the second. */
AMX_INLINE void hsum16_pair(const __m512i *v, __m512i *b0, __m512i *b1) {
    const __m512i u0 = sum4x4(v), u1 = sum4x4(v + 4), u2 = sum4x4(v + 8), u3 = sum4x4(v + 12);
    const __m512i s01 = _mm512_add_epi32(_mm512_shuffle_i32x4(u0, u1, 0x44), _mm512_shuffle_i32x4(u0, u1, 0xEE));
    const __m512i s23 = _mm512_add_epi32(_mm512_shuffle_i32x4(u2, u3, 0x44), _mm512_shuffle_i32x4(u2, u3, 0xEE));
    *b0 = _mm512_shuffle_i32x4(s01, s23, 0x88);
    *b1 = _mm512_shuffle_i32x4(s01, s23, 0xDD);
}

/* Decode streams 16 rows at once, 16 interleaved streams that the hardware prefetcher follows
 * poorly: each row is fetched this many bytes ahead (a 330 MB q8 head: 36 -> 26 ms, q4 rows
 * 46 -> 38 ms on one thread, fastest of 4-5 runs; 512 and 1024 were slower than 256). */
#define PF_AHEAD 256
/* q8: int8 weights widened to int16 against the int16 block, vpdpwssd (exact in int32). */
AMX static void decode16_q8(const unsigned char *w, size_t row_bytes, const QAct *a, int t, float *y) {
    const __m512i rowoff = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                              _mm512_set1_epi32((int)row_bytes));
    __m512 acc = _mm512_setzero_ps();
    for (int b = 0; b < a->nb; b++) {
        const unsigned char *wb = w + (size_t)b * 34;
        const __m512i x = _mm512_loadu_si512(a->q + ((size_t)t * a->nb + b) * QBLOCK);
        __m512i v[16];
        for (int r = 0; r < 16; r++) _mm_prefetch((const char *)(wb + r * row_bytes + PF_AHEAD), _MM_HINT_T0);
        for (int r = 0; r < 16; r++)
            v[r] = _mm512_dpwssd_epi32(_mm512_setzero_si512(),
                                       _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(wb + r * row_bytes + 2))), x);
        const __m512 sc = _mm512_mul_ps(f16_lo(block_heads(wb, rowoff)), _mm512_set1_ps(a->d[(size_t)b * a->rows + t]));
        acc = _mm512_add_ps(acc, _mm512_mul_ps(sc, _mm512_cvtepi32_ps(hsum16(v))));
    }
    _mm512_storeu_ps(y, acc);
}

/* q4: two blocks a vector, nibbles as they lie (low nibbles of both blocks, then high ones);
 * the activation's signed high byte times the nibbles (vpdpbusd: nibbles unsigned) shifted by 8,
 * plus its unsigned low byte times the nibbles (nibbles as signed bytes: 0..15). */
AMX static void decode16_q4(const unsigned char *w, size_t row_bytes, const QAct *a, int t, float *y) {
    const __m512i rowoff = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                              _mm512_set1_epi32((int)row_bytes));
    const __m256i m4 = _mm256_set1_epi8(15);
    const __m512i lanes = _mm512_set_epi64(7, 6, 3, 2, 5, 4, 1, 0); /* qwords 0 1 4 5 2 3 6 7 */
    __m512 acc = _mm512_setzero_ps(), mins = _mm512_setzero_ps();
    const int nb = a->nb;
    for (int b = 0; b < nb; b += 2) {
        const int two = b + 1 < nb;
        /* activation: x_b0[0..15] x_b1[0..15] x_b0[16..31] x_b1[16..31], as high and low bytes */
        const int16_t *xq = a->q + ((size_t)t * nb + b) * QBLOCK;
        const float *d = a->d + (size_t)b * a->rows + t, *sv = a->s + (size_t)b * a->rows + t;
        const __m512i x0 = _mm512_loadu_si512(xq);
        const __m512i x1 = two ? _mm512_loadu_si512(xq + QBLOCK) : _mm512_setzero_si512();
        /* int16 -> bytes: elements 0..31 of block b then of block b+1 (64 bytes) */
        const __m512i hi16 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srai_epi16(x0, 8))),
                                                _mm512_cvtepi16_epi8(_mm512_srai_epi16(x1, 8)), 1);
        const __m512i lo16 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(x0)), _mm512_cvtepi16_epi8(x1), 1);
        /* reorder 16-byte groups b0[0..15] b0[16..31] b1[0..15] b1[16..31] to b0lo b1lo b0hi b1hi */
        const __m512i xh = _mm512_permutexvar_epi64(lanes, hi16), xl = _mm512_permutexvar_epi64(lanes, lo16);
        const unsigned char *wb = w + (size_t)b * 20;
        __m512i v[16];
        for (int r = 0; r < 16; r++) _mm_prefetch((const char *)(wb + r * row_bytes + PF_AHEAD), _MM_HINT_T0);
        for (int r = 0; r < 16; r++) {
            const unsigned char *p = wb + r * row_bytes + 4;
            const __m128i q0 = _mm_loadu_si128((const __m128i *)p);
            const __m128i q1 = two ? _mm_loadu_si128((const __m128i *)(p + 20)) : _mm_setzero_si128();
            const __m256i raw = _mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1);
            const __m512i nib = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(raw, m4)),
                                                   _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4), 1);
            const __m512i h = _mm512_dpbusd_epi32(_mm512_setzero_si512(), nib, xh);
            v[r] = _mm512_dpbusd_epi32(_mm512_slli_epi32(h, 8), xl, nib);
        }
        __m512i s0, s1;
        hsum16_pair(v, &s0, &s1);
        const __m512i h0 = block_heads(wb, rowoff);
        acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(f16_lo(h0), _mm512_set1_ps(d[0])), _mm512_cvtepi32_ps(s0)));
        mins = _mm512_add_ps(mins, _mm512_mul_ps(f16_hi(h0), _mm512_set1_ps(sv[0])));
        if (two) {
            const __m512i h1 = block_heads(wb + 20, rowoff);
            acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(f16_lo(h1), _mm512_set1_ps(d[a->rows])), _mm512_cvtepi32_ps(s1)));
            mins = _mm512_add_ps(mins, _mm512_mul_ps(f16_hi(h1), _mm512_set1_ps(sv[a->rows])));
        }
    }
    _mm512_storeu_ps(y, _mm512_add_ps(acc, mins));
}

void qdot_q8_portable(const unsigned char *w, size_t row_bytes, int nr, const QAct *a, int t0, int nt, float *y, size_t ldy);
void qdot_q4_portable(const unsigned char *w, size_t row_bytes, int nr, const QAct *a, int t0, int nt, float *y, size_t ldy);

AMX_INLINE void gemm(const int q4, const unsigned char *w, size_t row_bytes, int nr, const QAct *a, const int8_t *packed,
                     float *y, size_t ldy) {
    const int T = a->rows, full = nr / 16 * 16, groups = (T + AMX_TILE_T - 1) / AMX_TILE_T;
    /* Positions in chunks that stay in L2 while the rows pass over them; the short last group
     * goes last so the tiles are configured at most twice. */
    enum { CHUNK = 8 };
    const int full_groups = T / AMX_TILE_T;
    for (int g0 = 0; g0 < full_groups; g0 += CHUNK) {
        const int g1 = g0 + CHUNK < full_groups ? g0 + CHUNK : full_groups;
        tiles_config(AMX_TILE_T);
        for (int r = 0; r < full; r += 16)
            for (int g = g0; g < g1; g++)
                tile16(q4, w + (size_t)r * row_bytes, row_bytes, a, packed, g, AMX_TILE_T, y + r, ldy);
    }
    if (groups > full_groups) {
        const int n = T - full_groups * AMX_TILE_T, t0 = full_groups * AMX_TILE_T;
        if (n > SMALL_T) {
            tiles_config(n);
            for (int r = 0; r < full; r += 16)
                tile16(q4, w + (size_t)r * row_bytes, row_bytes, a, packed, full_groups, n, y + r, ldy);
        } else /* decode and short tails: no tiles */
            for (int r = 0; r < full; r += 16)
                for (int t = t0; t < T; t++)
                    (q4 ? decode16_q4 : decode16_q8)(w + (size_t)r * row_bytes, row_bytes, a, t, y + (size_t)t * ldy + r);
    }
    /* rows past the last whole tile: the portable kernel, which computes the same bits */
    if (full < nr)
        for (int t0 = 0; t0 < T; t0 += QDOT_MAX_ROWS)
            (q4 ? qdot_q4_portable : qdot_q8_portable)(w + (size_t)full * row_bytes, row_bytes, nr - full, a, t0,
                                                       T - t0 < QDOT_MAX_ROWS ? T - t0 : QDOT_MAX_ROWS,
                                                       y + (size_t)t0 * ldy + full, ldy);
}

AMX void qgemm_q8_amx(const unsigned char *w, size_t row_bytes, int nr, const QAct *a, const int8_t *packed,
                      float *y, size_t ldy) {
    gemm(0, w, row_bytes, nr, a, packed, y, ldy);
}

AMX void qgemm_q4_amx(const unsigned char *w, size_t row_bytes, int nr, const QAct *a, const int8_t *packed,
                      float *y, size_t ldy) {
    gemm(1, w, row_bytes, nr, a, packed, y, ldy);
}

#endif
