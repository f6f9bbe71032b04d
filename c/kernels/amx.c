/* AMX-INT8 q8/q4/q6 matmul: the portable kernels' arithmetic (exact int32 block dot, then
 * acc += (dw*dx) * isum block by block, mins apart for q4), so every result is bit-identical to
 * the portable reference whatever the batch, with the block dots done by tile multiplies.
 *
 * The int16 activations are split into a signed high byte and an unsigned low byte
 * (x = 256*hi + lo), so two tile dots per block give the int16 x int8 sum exactly (no int8
 * activation rounding: the oracle tests pass unchanged). Weights are the A tile, read in place
 * (16 rows, one 32-element block; q4 nibbles and q6 bits unpacked first); activations are the B tile,
 * packed once per matmul by amx_pack_act into the VNNI layout the tiles want. Each weight
 * block is loaded once per 16 positions; C comes back as 16 rows x N positions of int32.
 * Decode steps and tails of at most VNNI_SMALL_T positions run on the VNNI kernel of
 * kernels/vnni_small.c instead.
 *
 * Compiled with target attributes (this file alone uses AMX); kernels_use picks it at run time
 * after the kernel granted this process the tile state (quant.c). */
#if defined(__x86_64__)
#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/vnni_small.h"
#include "kernels/q6_unpack_x86.h"
#include "kernels/isa.h"

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

/* Whole 16-position tile groups (a last group of more than VNNI_SMALL_T positions too) are
 * packed for the tiles; a shorter last group goes to the small-batch kernel, in its layout
 * after the tile groups. */
static int tile_groups(int T) { return T / AMX_TILE_T + (T % AMX_TILE_T > VNNI_SMALL_T); }
static int small_tail(int T) { return T - tile_groups(T) * AMX_TILE_T > 0 ? T - tile_groups(T) * AMX_TILE_T : 0; }

size_t amx_pack_bytes(int T, int nb) { return (size_t)tile_groups(T) * nb * 1024 + vnni_small_pack_bytes(small_tail(T), nb); }

/* Position group g (16 positions, zero past T), block b: a 512-byte tile of high bytes, then
 * one of low bytes; tile row k/4 holds, for each position n, elements k..k+3 at n*4. */
AMX void amx_pack_act(const QAct *a, int8_t *dst) {
    const int T = a->rows, nb = a->nb, groups = tile_groups(T);
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
    if (small_tail(T)) vnni_small_pack(a, groups * AMX_TILE_T, small_tail(T), dst + (size_t)groups * nb * 1024);
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

/* A strip of 16 weight rows made ready once for every position group it meets: q4 blocks
 * unpacked to int8 (512 bytes a block), each block's scale (and q4 min) as 16 floats. Before,
 * every 16-position group unpacked and gathered them again, a quarter of a tile's work. */
typedef struct {
    int8_t *wq;
    float *dw, *mw;
    size_t cap; /* blocks the buffers hold */
} Strip;

static _Thread_local Strip tl_strip; /* grown to the widest row seen, kept for the next call */

/* A thread that ends (OpenMP ends the surplus ones when a team shrinks) frees its strip: the
 * key's destructor runs while the thread's own storage is still there. */
static pthread_key_t strip_key;
static pthread_once_t strip_key_once = PTHREAD_ONCE_INIT;

static void strip_free(void *p) {
    Strip *s = p;
    free(s->wq);
    free(s->dw);
    free(s->mw);
    *s = (Strip){0};
}

static void strip_key_make(void) { pthread_key_create(&strip_key, strip_free); }

static int strip_reserve(int nb) {
    if ((size_t)nb <= tl_strip.cap) return 0;
    if (!tl_strip.cap) {
        pthread_once(&strip_key_once, strip_key_make);
        pthread_setspecific(strip_key, &tl_strip);
    }
    int8_t *wq = aligned_alloc(64, (size_t)nb * 512);
    float *dw = aligned_alloc(64, (size_t)nb * 64), *mw = aligned_alloc(64, (size_t)nb * 64);
    if (!wq || !dw || !mw) {
        free(wq);
        free(dw);
        free(mw);
        return -1;
    }
    free(tl_strip.wq);
    free(tl_strip.dw);
    free(tl_strip.mw);
    tl_strip = (Strip){wq, dw, mw, (size_t)nb};
    return 0;
}

/* 16 q6 rows' block b unpacked to int8 q = u - 32, 32 bytes a row. */
AMX_INLINE void q6_unpack16(const unsigned char *w, size_t row_bytes, int8_t *out) {
    for (int r = 0; r < 16; r++) {
        __m128i lo, hi;
        q6_unpack_avx2(w + r * row_bytes, &lo, &hi);
        _mm_storeu_si128((__m128i *)(out + r * 32), lo);
        _mm_storeu_si128((__m128i *)(out + r * 32 + 16), hi);
    }
}

/* Weights the strip holds unpacked (q4 nibbles, q6 bits); q8 tiles load the rows in place. */
#define UNPACKED(qt) ((qt) != QT_Q8)

AMX_INLINE void strip_prepare(const QType qt, const unsigned char *w, size_t row_bytes, int nb, Strip *st) {
    const int q4 = qt == QT_Q4;
    const size_t bb = q4 ? 20 : qt == QT_Q6 ? 26 : 34;
    const __m512i rowoff = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                              _mm512_set1_epi32((int)row_bytes));
    for (int b = 0; b < nb; b++) {
        const unsigned char *wb = w + b * bb;
        const __m512i heads = block_heads(wb, rowoff);
        _mm512_store_ps(st->dw + 16 * b, f16_lo(heads));
        if (q4) {
            _mm512_store_ps(st->mw + 16 * b, f16_hi(heads));
            q4_unpack16(wb + 4, row_bytes, st->wq + (size_t)b * 512);
        } else if (qt == QT_Q6) q6_unpack16(wb, row_bytes, st->wq + (size_t)b * 512);
    }
}

/* 16 weight rows (w: row 0, made ready in st) x positions t0..t0+n-1 (group g of the packed
 * activations), the whole row. q4 adds the min term. Results to y[(t0+i)*ldy + r]. */
AMX_INLINE void tile16(const QType qt, const unsigned char *w, size_t row_bytes, const Strip *st, const QAct *a,
                       const int8_t *packed, int g, int n, float *y, size_t ldy) {
    const int nb = a->nb, t0 = g * AMX_TILE_T, q4 = qt == QT_Q4;
    int32_t chi[256] __attribute__((aligned(64))), clo[256] __attribute__((aligned(64)));
    const int8_t *pk = packed + (size_t)g * nb * 1024;
    /* prefill: acc[r] holds row r against the n positions, one lane each */
    const __mmask16 live = (__mmask16)((1u << n) - 1);
    __m512 acc[16], mins[16];
    for (int r = 0; r < 16; r++) acc[r] = mins[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++, pk += 1024) {
        if (UNPACKED(qt)) _tile_loadd(0, st->wq + (size_t)b * 512, 32);
        else _tile_loadd(0, w + b * 34 + 2, row_bytes);
        _tile_loadd(1, pk, 64);
        _tile_loadd(2, pk + 512, 64);
        _tile_zero(3);
        _tile_zero(4);
        if (q4) {
            _tile_dpbusd(3, 0, 1);
            _tile_dpbuud(4, 0, 2);
        } else {
            _tile_dpbssd(3, 0, 1);
            _tile_dpbsud(4, 0, 2);
        }
        _tile_stored(3, chi, 64);
        _tile_stored(4, clo, 64);
        const float *dw = st->dw + 16 * b, *mw = st->mw + 16 * b;
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

AMX_INLINE void gemm(const QType qt, const unsigned char *w, size_t row_bytes, int nr, const QAct *a, const int8_t *packed,
                     float *y, size_t ldy) {
    const int T = a->rows, groups = (T + AMX_TILE_T - 1) / AMX_TILE_T;
    int full = nr / 16 * 16;
    /* Positions in chunks that stay in L2 while the rows pass over them; the short last group
     * goes last so the tiles are configured at most twice. */
    enum { CHUNK = 8 };
    const int full_groups = T / AMX_TILE_T;
    const int n_tail = T - full_groups * AMX_TILE_T;
    if ((full_groups || n_tail > VNNI_SMALL_T) && full && strip_reserve(a->nb))
        full = 0; /* no memory for the strip: the portable kernel below, the same bits */
    for (int g0 = 0; g0 < full_groups && full; g0 += CHUNK) {
        const int g1 = g0 + CHUNK < full_groups ? g0 + CHUNK : full_groups;
        tiles_config(AMX_TILE_T);
        for (int r = 0; r < full; r += 16) {
            strip_prepare(qt, w + (size_t)r * row_bytes, row_bytes, a->nb, &tl_strip);
            for (int g = g0; g < g1; g++)
                tile16(qt, w + (size_t)r * row_bytes, row_bytes, &tl_strip, a, packed, g, AMX_TILE_T, y + r, ldy);
        }
    }
    if (groups > full_groups) {
        const int n = n_tail, t0 = full_groups * AMX_TILE_T;
        if (n > VNNI_SMALL_T) {
            if (full) tiles_config(n);
            for (int r = 0; r < full; r += 16) {
                strip_prepare(qt, w + (size_t)r * row_bytes, row_bytes, a->nb, &tl_strip);
                tile16(qt, w + (size_t)r * row_bytes, row_bytes, &tl_strip, a, packed, full_groups, n, y + r, ldy);
            }
        } else if (full) { /* decode and short tails: each weight block once for all n positions */
            void (*small)(const unsigned char *, size_t, int, const QAct *, int, int, const int8_t *, float *, size_t) =
                qt == QT_Q4   ? vnni_small_q4
                : qt == QT_Q6 ? vnni_small_q6
                              : vnni_small_q8;
            small(w, row_bytes, full, a, t0, n, packed + (size_t)full_groups * a->nb * 1024, y + (size_t)t0 * ldy, ldy);
        }
    }
    /* rows past the last whole tile: the portable kernel, which computes the same bits */
    if (full < nr) qdot_all_portable(qt, w + (size_t)full * row_bytes, row_bytes, nr - full, a, y + full, ldy);
}

AMX void qgemm_q8_amx(const unsigned char *w, size_t row_bytes, int nr, const QAct *a, const int8_t *packed, float *y,
                      size_t ldy) {
    gemm(QT_Q8, w, row_bytes, nr, a, packed, y, ldy);
}

AMX void qgemm_q4_amx(const unsigned char *w, size_t row_bytes, int nr, const QAct *a, const int8_t *packed, float *y,
                      size_t ldy) {
    gemm(QT_Q4, w, row_bytes, nr, a, packed, y, ldy);
}

AMX void qgemm_q6_amx(const unsigned char *w, size_t row_bytes, int nr, const QAct *a, const int8_t *packed, float *y,
                      size_t ldy) {
    gemm(QT_Q6, w, row_bytes, nr, a, packed, y, ldy);
}

/* The AMX set: tiles (and the small-batch kernel for 1-8 rows) for every q8/q4/q6 batch, whose
 * bits are the portable arithmetic's, so the dots left over for other shapes are portable's too;
 * mxfp4 and the float families are the AVX-512 set's. */
const Kernels kernel_set_amx = {
    .name = "amx",
    .isa = KI_AMX,
    .dequant_row = dequant_row_avx2,
    .dot = dot_avx512,
    .quantize_act = quantize_act_avx2,
    .qdot = {[QT_Q8] = qdot_q8_portable,
             [QT_Q4] = qdot_q4_portable,
             [QT_MXFP4] = qdot_mxfp4_avx2,
             [QT_Q6] = qdot_q6_portable,
             LOWBIT_TYPES(LOWBIT_QDOT_vnni)},
    .lowbit_pack = 1,
    .qgemm = {[QT_Q8] = qgemm_q8_amx, [QT_Q4] = qgemm_q4_amx, [QT_Q6] = qgemm_q6_amx},
    .pack_bytes = amx_pack_bytes,
    .pack_act = amx_pack_act,
    .kv = {{kv_dot_f32_portable, kv_axpy_f32_portable, kv_attend_avx512_f32, kv_attend_avx512_f32_block},
           {kv_dot_f16_avx2, kv_axpy_f16_avx2, kv_attend_avx512_f16, kv_attend_avx512_f16_block},
           {kv_dot_bf16_avx2, kv_axpy_bf16_avx2, kv_attend_avx512_bf16, kv_attend_avx512_bf16_block}},
    .mla_absorb = mla_absorb_avx512,
    .dsa_scores = dsa_scores_avx512,
    .delta_recurrent = delta_rule_recurrent_avx512,
    .delta_chunked = delta_rule_chunked_avx512,
    .kda_recurrent = kda_recurrent_avx512,
    .kda_chunked = kda_chunked_avx512,
};
#endif
