/* The gated delta rule, recurrent and chunked (delta_rule.h). */
#include "kernels/delta_rule.h"

#include <math.h>
#include <string.h>
#include <stdlib.h>

#include "kernels/isa.h"
#include "util/fwd_alloc.h"
#include "kernels/ops.h"

int short_conv_silu(const float *w, int K, int cd, float *win, float *x, int T) {
    const int W = K - 1;
    float *buf = fwd_malloc(sizeof(float) * (size_t)(W + T) * cd);
    if (!buf) return -1;
    memcpy(buf, win, sizeof(float) * (size_t)W * cd);
    memcpy(buf + (size_t)W * cd, x, sizeof(float) * (size_t)T * cd);
#pragma omp parallel for schedule(static)
    for (int c = 0; c < cd; c++) {
        const float *wc = w + (size_t)c * K;
        for (int t = 0; t < T; t++) {
            float s = 0;
            for (int j = 0; j < K; j++) s += wc[j] * buf[(size_t)(t + j) * cd + c];
            x[(size_t)t * cd + c] = silu(s);
        }
    }
    memcpy(win, buf + (size_t)T * cd, sizeof(float) * (size_t)W * cd);
    free(buf);
    return 0;
}

#define KDA_SUB 16 /* kda_chunked's sub-chunks (kda_pair_decays) */


static inline void axpy(float *restrict y, float a, const float *restrict x, int n) {
#pragma omp simd
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

static inline float dot(const float *restrict a, const float *restrict b, int n) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* y += a x and z += b x at once */
static inline void axpy2(float *restrict y, float a, float *restrict z, float b, const float *restrict x, int n) {
#pragma omp simd
    for (int i = 0; i < n; i++) {
        y[i] += a * x[i];
        z[i] += b * x[i];
    }
}

/* One position of the rule, the decay per row of S (dec[d]) or for all of it (dec == NULL,
 * decay): two passes over S, decay + read, then write + output. */
static inline void rule_step(float *restrict S, const float *restrict q, const float *restrict k, const float *restrict v,
                             const float *dec, float decay, float beta, float *restrict ot, int dk, int dv) {
    float delta[1024]; /* dv <= 1024 (the blocks' loaders check) */
    memset(delta, 0, sizeof(float) * (size_t)dv);
    for (int d = 0; d < dk; d++) {
        float *restrict row = S + (size_t)d * dv;
        const float e = dec ? dec[d] : decay, kd = k[d];
#pragma omp simd
        for (int j = 0; j < dv; j++) {
            row[j] *= e;
            delta[j] += kd * row[j];
        }
    }
#pragma omp simd
    for (int j = 0; j < dv; j++) {
        delta[j] = (v[j] - delta[j]) * beta;
        ot[j] = 0;
    }
    for (int d = 0; d < dk; d++) {
        float *restrict row = S + (size_t)d * dv;
        const float kd = k[d], qd = q[d];
#pragma omp simd
        for (int j = 0; j < dv; j++) {
            row[j] += kd * delta[j];
            ot[j] += qd * row[j];
        }
    }
}


size_t delta_rule_work_floats(int dk, int dv) {
    const size_t C = DELTA_CHUNK;
    /* A, U, V', W, G (KDA: per channel), k; KDA's factored decays: kE, qE, kF */
    return C * C + C * dv * 2 + C * dk * 3 + C * dk * 2 + (C / KDA_SUB) * C * dk;
}

/* One chunk of n positions: with G the cumulative decay inside the chunk and
 * A[i][j] = beta_i (k_i . k_j) exp(G_i - G_j) for j < i, solve (I + A) U = beta v and
 * (I + A) W = beta exp(G) k by forward substitution; then the corrected values
 * V' = U - W S, the outputs o_i = exp(G_i) q_i S + sum_{j<=i} (q_i . k_j) exp(G_i - G_j) V'_j,
 * and S = exp(G_last) S + sum_j exp(G_last - G_j) k_j V'_j^T. */

/* The recurrent rule with S row d decayed by exp(g_t[d]). */

/* Pairwise per-channel decays exp(G_i - G_j), j <= i, with few exponentials: positions fall in
 * sub-chunks of KDA_SUB; for j before i's sub-chunk (starting at b) the decay factors exactly as
 * exp(G_i - G_b) exp(G_b - G_j), both at most 1 since G only falls, so nothing overflows.
 * kE_i = k_i exp(G_i - G_b), qE_i likewise, kF[b / KDA_SUB][j] = k_j exp(G_b - G_j) for j < b. */
static void kda_pair_decays(const float *G, const float *k, const float *q, size_t ks, size_t qs, int n, int dk, float *kE,
                            float *qE, float *kF) {
    for (int i = 0; i < n; i++) {
        const float *gb = G + (i / KDA_SUB * KDA_SUB) * dk, *gi = G + i * dk;
        for (int d = 0; d < dk; d++) {
            const float e = expf(gi[d] - gb[d]);
            kE[i * dk + d] = k[i * ks + d] * e;
            qE[i * dk + d] = q[i * qs + d] * e;
        }
    }
    for (int b = KDA_SUB; b < n; b += KDA_SUB)
        for (int j = 0; j < b; j++)
            for (int d = 0; d < dk; d++)
                kF[((size_t)(b / KDA_SUB) * DELTA_CHUNK + j) * dk + d] = k[j * ks + d] * expf(G[b * dk + d] - G[j * dk + d]);
}

/* sum_d x_i[d] k_j[d] exp(G_i[d] - G_j[d]): factored (kda_pair_decays) across sub-chunks, direct within one */
static inline float pair_dot(const float *xE, const float *kF, const float *G, const float *x, const float *k, size_t xs,
                             size_t ks, int i, int j, int dk) {
    const int b = i / KDA_SUB * KDA_SUB;
    if (j < b) return dot(xE + i * dk, kF + ((size_t)(b / KDA_SUB) * DELTA_CHUNK + j) * dk, dk);
    float s = 0;
    for (int d = 0; d < dk; d++) s += x[i * xs + d] * k[j * ks + d] * expf(G[i * dk + d] - G[j * dk + d]);
    return s;
}

/* delta_rule_chunked with a per-channel cumulative decay G_i[d]: the pairwise decay
 * exp(G_i - G_j) moves inside the key products, and exp(G_i), exp(G_last - G_j) scale
 * channels rather than whole rows. */

/* The four entry points per kernel set (kernels/delta_rule_body.h): the baseline, AVX2 and
 * AVX-512 builds of the same loops (results differ between them only in rounding); the helpers
 * above stay baseline code, as they were under the target_clones these replace. */
#define DR_ATTR
#define DR(name) name##_portable
#include "kernels/delta_rule_body.h"
#undef DR_ATTR
#undef DR
#if defined(__x86_64__) || defined(__i386__)
#define DR_ATTR __attribute__((target("arch=haswell")))
#define DR(name) name##_avx2
#include "kernels/delta_rule_body.h"
#undef DR_ATTR
#undef DR
#define DR_ATTR __attribute__((target("arch=skylake-avx512")))
#define DR(name) name##_avx512
#include "kernels/delta_rule_body.h"
#undef DR_ATTR
#undef DR
#endif
