/* Low-bit blocks from floats (lowbit_quantize.h): weighted least-squares scale searches and the
 * block layouts lowbit.c decodes. */
#include "kernels/lowbit_quantize.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#include "kernels/lowbit.h"
#include "kernels/lowbit_grids.h"
#include "util/f16.h"

#define STEPS 10        /* candidate reciprocal scales: the base one times 1 + k*STEP, |k| <= STEPS */
#define STEP 0.02f      /* so the search spans +-20% around the scale that fits the extreme value */
#define REFINE_ROUNDS 2 /* re-rounding against the fitted scale, then refitting */

static float f16_round(float v) { return f16_to_f32(f32_to_f16(v)); }
static void put_f16(unsigned char *p, float v) {
    uint16_t h = f32_to_f16(v);
    memcpy(p, &h, 2);
}
static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }
static int nearest(float v) { return (int)lrintf(v); }

/* The v of largest magnitude, with its sign (0 when every v is 0). */
static float extreme(int n, const float *v) {
    float amax = 0, vmax = 0;
    for (int j = 0; j < n; j++)
        if (fabsf(v[j]) > amax) {
            amax = fabsf(v[j]);
            vmax = v[j];
        }
    return vmax;
}

/* The scale d and integer codes L in [lo, hi] minimising sum w (v - d L)^2: candidate
 * reciprocal scales map the extreme v near each end of the range, each candidate's codes get
 * their least-squares d (error = sum w v^2 - (sum w v L)^2 / sum w L^2, so the largest ratio
 * wins), then the codes are rounded again against the winner and refitted. */
static float fit_grid(int n, const float *v, const float *w, int lo, int hi, int *L) {
    const float vmax = extreme(n, v);
    int cand[256];
    float best = 0, bestd = 0;
    for (int j = 0; j < n; j++) L[j] = 0;
    if (vmax == 0) return 0;
    for (int e = 0; e < 2; e++) {
        const int end = e ? hi : lo;
        if (end == 0) continue;
        for (int k = -STEPS; k <= STEPS; k++) {
            const float id = (float)end * (1.0f + STEP * (float)k) / vmax;
            float slx = 0, sl2 = 0;
            for (int j = 0; j < n; j++) {
                cand[j] = clampi(nearest(id * v[j]), lo, hi);
                slx += w[j] * v[j] * (float)cand[j];
                sl2 += w[j] * (float)(cand[j] * cand[j]);
            }
            if (sl2 > 0 && slx * slx / sl2 > best) {
                best = slx * slx / sl2;
                bestd = slx / sl2;
                memcpy(L, cand, sizeof(int) * (size_t)n);
            }
        }
    }
    for (int r = 0; r < REFINE_ROUNDS && bestd != 0; r++) {
        float slx = 0, sl2 = 0;
        for (int j = 0; j < n; j++) {
            cand[j] = clampi(nearest(v[j] / bestd), lo, hi);
            slx += w[j] * v[j] * (float)cand[j];
            sl2 += w[j] * (float)(cand[j] * cand[j]);
        }
        if (!(sl2 > 0 && slx * slx / sl2 > best)) break;
        best = slx * slx / sl2;
        bestd = slx / sl2;
        memcpy(L, cand, sizeof(int) * (size_t)n);
    }
    return bestd;
}

/* x ~ a*L - m with a >= 0, m >= 0 and L in [0, nmax] (Q2_K's sub-blocks): for each candidate
 * reciprocal scale over the range [min(x, 0), max(x)], the codes get the weighted 2x2
 * least-squares (a, -m), with m clamped to >= 0; the least weighted error wins. */
static float fit_min_scale(int n, const float *x, const float *w, int nmax, int *L, float *mn) {
    float lo = 0, hi = x[0];
    for (int j = 0; j < n; j++) {
        lo = fminf(lo, x[j]);
        hi = fmaxf(hi, x[j]);
    }
    *mn = -lo;
    for (int j = 0; j < n; j++) L[j] = 0;
    if (hi <= lo) return 0;
    int cand[256];
    float best_err = INFINITY, best_a = (hi - lo) / (float)nmax;
    for (int k = -5; k <= 2 * STEPS; k++) { /* nmax - 0.5 .. nmax + 2 codes over the range */
        const float id = ((float)nmax + 0.1f * (float)k) / (hi - lo);
        float sw = 0, sl = 0, sl2 = 0, sx = 0, sxl = 0;
        for (int j = 0; j < n; j++) {
            cand[j] = clampi(nearest(id * (x[j] - lo)), 0, nmax);
            const float l = (float)cand[j];
            sw += w[j];
            sl += w[j] * l;
            sl2 += w[j] * l * l;
            sx += w[j] * x[j];
            sxl += w[j] * x[j] * l;
        }
        const float D = sw * sl2 - sl * sl;
        float a = D > 0 ? (sw * sxl - sx * sl) / D : 0, b = D > 0 ? (sl2 * sx - sl * sxl) / D : 1;
        if (b > 0) { /* a positive minimum is not representable (nor one code for all): the scale alone */
            if (!(sl2 > 0)) continue;
            b = 0;
            a = sxl / sl2;
        }
        if (a < 0) continue;
        float err = 0;
        for (int j = 0; j < n; j++) {
            const float diff = a * (float)cand[j] + b - x[j];
            err += w[j] * diff * diff;
        }
        if (err < best_err) {
            best_err = err;
            best_a = a;
            *mn = -b;
            memcpy(L, cand, sizeof(int) * (size_t)n);
        }
    }
    return best_a;
}

/* The index of the IQ4_NL codebook value nearest v (the codebook is ascending): how many of the
 * midpoints between neighbours lie below v, a tie going to the lower value. Every midpoint is a
 * multiple of 1/2, so with c = ceil(2v) - 1, "v > m" is "c >= 2m": a table over c answers it
 * without a branch (a binary search's mispredicted branches made IQ4 writing 4x slower) and
 * without 15 compares (the candidate searches below call it ~1300 times per 32 weights). */
static const float iq4_midpoints[15] = {/* (kvalues_iq4nl[k] + kvalues_iq4nl[k + 1]) / 2 */
                                        -115.5f, -93.5f, -74.0f, -57.0f, -42.0f, -28.5f, -16.0f, -4.5f,
                                        7.0f,    19.0f,  31.5f,  45.5f,  61.0f,  79.0f,  101.0f};
#define CODE_LUT_HALF 256 /* c in [-256, 256): every doubled midpoint (-231 .. 202) lies inside */
static unsigned char code_lut[2 * CODE_LUT_HALF];
static pthread_once_t code_lut_once = PTHREAD_ONCE_INIT;

static void code_lut_make(void) {
    for (int c = -CODE_LUT_HALF; c < CODE_LUT_HALF; c++) {
        int q = 0;
        for (int k = 0; k < 15; k++) q += c >= (int)(2 * iq4_midpoints[k]);
        code_lut[c + CODE_LUT_HALF] = (unsigned char)q;
    }
}

static int nearest_code(float v) {
    const float c = fminf(fmaxf(ceilf(2 * v) - 1, -CODE_LUT_HALF), CODE_LUT_HALF - 1); /* NaN: -256, code 0 */
    return code_lut[(int)c + CODE_LUT_HALF];
}

/* x ~ d * codebook[idx] for a sub-block of n, as fit_grid does for integer codes. */
static float fit_codebook(int n, const float *x, const float *w, int *idx) {
    const float vmax = extreme(n, x);
    int cand[32];
    float best = 0, bestd = 0;
    for (int j = 0; j < n; j++) idx[j] = nearest_code(0);
    if (vmax == 0) return 0;
    for (int e = 0; e < 2; e++) {
        const float end = (float)kvalues_iq4nl[e ? 15 : 0];
        for (int k = -STEPS; k <= STEPS; k++) {
            const float id = end * (1.0f + 0.4f * STEP * (float)k) / vmax;
            float sqx = 0, sq2 = 0;
            for (int j = 0; j < n; j++) {
                cand[j] = nearest_code(id * x[j]);
                const float q = (float)kvalues_iq4nl[cand[j]];
                sqx += w[j] * x[j] * q;
                sq2 += w[j] * q * q;
            }
            if (sq2 > 0 && sqx * sqx / sq2 > best) {
                best = sqx * sqx / sq2;
                bestd = sqx / sq2;
                memcpy(idx, cand, sizeof(int) * (size_t)n);
            }
        }
    }
    return bestd;
}

/* A scale's weight in the super-block fit: an error e in sub-block scale s moves each value by
 * e*L, so it costs e^2 * sum w L^2. */
static float code_weight(int n, const float *w, const int *L, const int8_t *book) {
    float s = 0;
    for (int j = 0; j < n; j++) {
        const float q = book ? (float)book[L[j]] : (float)L[j];
        s += w[j] * q * q;
    }
    return s;
}

/* 2-bit codes at their Q2_K/Q3_K place: element e is bits 2*(e/32%4) of qs[32*(e/128) + e%32]. */
static void put_2bit(unsigned char *qs, int e, int v) {
    qs[32 * (e / 128) + e % 32] |= (unsigned char)((v & 3) << (2 * (e / 32 % 4)));
}

static void q2_k_block(const float *x, const float *w, unsigned char *b) {
    int L[256], Ls[16], Lm[16];
    float a[16], m[16], wa[16], wm[16];
    for (int i = 0; i < 16; i++) {
        a[i] = fit_min_scale(16, x + 16 * i, w + 16 * i, 3, L + 16 * i, &m[i]);
        wa[i] = code_weight(16, w + 16 * i, L + 16 * i, NULL);
        wm[i] = 0;
        for (int j = 0; j < 16; j++) wm[i] += w[16 * i + j];
    }
    const float d = f16_round(fit_grid(16, a, wa, 0, 15, Ls)), dmin = f16_round(fit_grid(16, m, wm, 0, 15, Lm));
    memset(b, 0, 84);
    for (int i = 0; i < 16; i++) {
        b[i] = (unsigned char)(Ls[i] | Lm[i] << 4);
        const float sd = d * (float)Ls[i], md = dmin * (float)Lm[i];
        for (int j = 0; j < 16; j++) {
            const int e = 16 * i + j;
            put_2bit(b + 16, e, sd > 0 ? clampi(nearest((x[e] + md) / sd), 0, 3) : 0);
        }
    }
    put_f16(b + 80, d);
    put_f16(b + 82, dmin);
}

/* Q3_K and Q6_K: each 16-element sub-block's scale on codes [lo, hi], then the super-block's f16
 * scale d over the sub-block scales as integers [slo, shi] (Ls), weighted by sum w L^2. */
static float fit_signed_scales(const float *x, const float *w, int lo, int hi, int slo, int shi, int *Ls) {
    int L[256];
    float s[16], ws[16];
    for (int i = 0; i < 16; i++) {
        s[i] = fit_grid(16, x + 16 * i, w + 16 * i, lo, hi, L + 16 * i);
        ws[i] = code_weight(16, w + 16 * i, L + 16 * i, NULL);
    }
    return f16_round(fit_grid(16, s, ws, slo, shi, Ls));
}

static void q3_k_block(const float *x, const float *w, unsigned char *b) {
    int Ls[16];
    const float d = fit_signed_scales(x, w, -4, 3, -32, 31, Ls);
    memset(b, 0, 110);
    unsigned char *hm = b, *qs = b + 32, *sc = b + 96;
    for (int i = 0; i < 16; i++) {
        const int u = Ls[i] + 32;
        sc[i % 8] |= (unsigned char)((u & 15) << (i < 8 ? 0 : 4));
        sc[8 + i % 4] |= (unsigned char)((u >> 4) << (2 * (i / 4)));
        const float sd = d * (float)Ls[i];
        for (int j = 0; j < 16; j++) {
            const int e = 16 * i + j, q = sd != 0 ? clampi(nearest(x[e] / sd), -4, 3) : 0;
            put_2bit(qs, e, (q + 4) & 3);
            if (q >= 0) hm[e % 32] |= (unsigned char)(1 << (e / 32)); /* set: no minus 4 */
        }
    }
    put_f16(b + 108, d);
}

/* Q4_K and Q5_K: x ~ (d*sc_j) q - dmin*m_j per 32-element sub-block j, q in [0, nmax], the
 * eight 6-bit scales and mins packed as ggml's get_scale_min_k4 reads them; Q5_K's fifth bit
 * of element e is bit e/32 of qh[e%32]. */
static void k4_block(const float *x, const float *w, int nmax, unsigned char *b) {
    int L[256], Ls[8], Lm[8];
    float a[8], m[8], wa[8], wm[8];
    for (int j = 0; j < 8; j++) {
        a[j] = fit_min_scale(32, x + 32 * j, w + 32 * j, nmax, L + 32 * j, &m[j]);
        wa[j] = code_weight(32, w + 32 * j, L + 32 * j, NULL);
        wm[j] = 0;
        for (int i = 0; i < 32; i++) wm[j] += w[32 * j + i];
    }
    const float d = f16_round(fit_grid(8, a, wa, 0, 63, Ls)), dmin = f16_round(fit_grid(8, m, wm, 0, 63, Lm));
    const int five = nmax > 15, qs_at = five ? 48 : 16;
    memset(b, 0, five ? 176 : 144);
    put_f16(b, d);
    put_f16(b + 2, dmin);
    unsigned char *sc = b + 4, *qh = b + 16, *qs = b + qs_at;
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            sc[j] = (unsigned char)Ls[j];
            sc[j + 4] = (unsigned char)Lm[j];
        } else {
            sc[j + 4] = (unsigned char)((Ls[j] & 15) | (Lm[j] & 15) << 4);
            sc[j - 4] |= (unsigned char)((Ls[j] >> 4) << 6);
            sc[j] |= (unsigned char)((Lm[j] >> 4) << 6);
        }
        const float sd = d * (float)Ls[j], md = dmin * (float)Lm[j];
        for (int i = 0; i < 32; i++) {
            const int e = 32 * j + i, q = sd > 0 ? clampi(nearest((x[e] + md) / sd), 0, nmax) : 0;
            qs[32 * (e / 64) + e % 32] |= (unsigned char)((q & 15) << (4 * (e / 32 % 2)));
            if (five && q > 15) qh[e % 32] |= (unsigned char)(1 << (e / 32));
        }
    }
}
static void q4_k_block(const float *x, const float *w, unsigned char *b) { k4_block(x, w, 15, b); }
static void q5_k_block(const float *x, const float *w, unsigned char *b) { k4_block(x, w, 31, b); }

/* Q6_K: x ~ (d*sc_i) q per 16, q in [-32, 31] stored as q + 32 (low nibble of element 128h + i
 * at nibble i/64 of ql[64h + i%64], high two bits at 2*(i/32) of qh[32h + i%32]), the sixteen
 * scales int8. */
static void q6_k_block(const float *x, const float *w, unsigned char *b) {
    int Ls[16];
    const float d = fit_signed_scales(x, w, -32, 31, -128, 127, Ls);
    memset(b, 0, 210);
    for (int i = 0; i < 16; i++) {
        b[192 + i] = (unsigned char)(int8_t)Ls[i];
        const float sd = d * (float)Ls[i];
        for (int j = 0; j < 16; j++) {
            const int e = 16 * i + j, h = e / 128, k = e % 128;
            const int u = (sd != 0 ? clampi(nearest(x[e] / sd), -32, 31) : 0) + 32;
            b[64 * h + k % 64] |= (unsigned char)((u & 15) << (4 * (k / 64)));
            b[128 + 32 * h + k % 32] |= (unsigned char)((u >> 4) << (2 * (k / 32)));
        }
    }
    put_f16(b + 208, d);
}

/* 32 codebook indexes as IQ4_NL/IQ4_XS pack them: byte j holds j (low) and j+16 (high). */
static void put_nibbles(unsigned char *qs, const float *x, float sd) {
    for (int j = 0; j < 16; j++) {
        const int lo = sd != 0 ? nearest_code(x[j] / sd) : nearest_code(0);
        const int hi = sd != 0 ? nearest_code(x[j + 16] / sd) : nearest_code(0);
        qs[j] = (unsigned char)(lo | hi << 4);
    }
}

static void iq4_nl_block(const float *x, const float *w, unsigned char *b) {
    int idx[32];
    const float d = f16_round(fit_codebook(32, x, w, idx));
    put_f16(b, d);
    put_nibbles(b + 2, x, d);
}

static void iq4_xs_block(const float *x, const float *w, unsigned char *b) {
    int idx[256], Ls[8];
    float s[8], ws[8];
    for (int ib = 0; ib < 8; ib++) {
        s[ib] = fit_codebook(32, x + 32 * ib, w + 32 * ib, idx + 32 * ib);
        ws[ib] = code_weight(32, w + 32 * ib, idx + 32 * ib, kvalues_iq4nl);
    }
    const float d = f16_round(fit_grid(8, s, ws, -32, 31, Ls));
    memset(b, 0, 136);
    put_f16(b, d);
    uint16_t sh = 0;
    for (int ib = 0; ib < 8; ib++) {
        const int u = Ls[ib] + 32;
        sh |= (uint16_t)((u >> 4) << (2 * ib));
        b[4 + ib / 2] |= (unsigned char)((u & 15) << (4 * (ib % 2)));
        put_nibbles(b + 8 + 16 * ib, x + 32 * ib, d * (float)Ls[ib]);
    }
    b[2] = (unsigned char)(sh & 0xFF);
    b[3] = (unsigned char)(sh >> 8);
}

typedef void (*BlockWriter)(const float *x, const float *w, unsigned char *b);

static BlockWriter writer(QType qt) {
    switch (qt) {
    case QT_Q2_K: return q2_k_block;
    case QT_Q3_K: return q3_k_block;
    case QT_IQ4_NL: return iq4_nl_block;
    case QT_IQ4_XS: return iq4_xs_block;
    case QT_Q4_K: return q4_k_block;
    case QT_Q5_K: return q5_k_block;
    case QT_Q6_K: return q6_k_block;
    default: return NULL;
    }
}

int qtype_writable(QType qt) { return qt < QT_Q2_K || writer(qt) != NULL; }

int quantize_row_weighted(QType qt, const float *x, const float *imp, int cols, void *dst) {
    if (qt < QT_Q2_K) {
        quantize_row(qt, x, cols, dst);
        return 0;
    }
    const BlockWriter put = writer(qt);
    const LowbitType *t = lowbit_type(qt);
    pthread_once(&code_lut_once, code_lut_make);
    if (!put || !t || cols <= 0 || cols % t->block) return -1;
    /* Columns no calibration text reached keep a small weight: their values still matter a
     * little, and a sub-block of zero weights would have no least-squares scale. */
    double mean = 0;
    if (imp) {
        for (int c = 0; c < cols; c++) mean += imp[c] > 0 ? imp[c] : 0;
        mean /= cols;
    }
    const float floor_w = (float)(mean * 1e-3);
    float v[LOWBIT_MAX_BLOCK], w[LOWBIT_MAX_BLOCK];
    unsigned char *o = dst;
    for (int c0 = 0; c0 < cols; c0 += t->block, o += t->bytes) {
        for (int j = 0; j < t->block; j++) {
            const float xv = x[c0 + j];
            v[j] = isfinite(xv) ? xv : 0.0f;
            w[j] = mean > 0 ? fmaxf(imp[c0 + j], floor_w) : 1.0f;
        }
        put(v, w, o);
    }
    return 0;
}
