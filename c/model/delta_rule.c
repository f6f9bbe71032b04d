/* The gated delta rule, recurrent and chunked (delta_rule.h). */
#include "model/delta_rule.h"

#include <math.h>
#include <string.h>
#include <stdlib.h>

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

/* The hot loops run over contiguous rows of S; on x86 they are built for AVX-512, AVX2 and the
 * baseline and picked at load time (results differ between those only in rounding). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define HOT __attribute__((target_clones("arch=skylake-avx512", "arch=haswell", "default")))
#else
#define HOT
#endif

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
    for (int i = 0; i < n; i++) { y[i] += a * x[i]; z[i] += b * x[i]; }
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
        for (int j = 0; j < dv; j++) { row[j] *= e; delta[j] += kd * row[j]; }
    }
#pragma omp simd
    for (int j = 0; j < dv; j++) { delta[j] = (v[j] - delta[j]) * beta; ot[j] = 0; }
    for (int d = 0; d < dk; d++) {
        float *restrict row = S + (size_t)d * dv;
        const float kd = k[d], qd = q[d];
#pragma omp simd
        for (int j = 0; j < dv; j++) { row[j] += kd * delta[j]; ot[j] += qd * row[j]; }
    }
}

HOT void delta_rule_recurrent(const DeltaIn *in, float *S, float *o) {
    for (int t = 0; t < in->T; t++)
        rule_step(S, in->q + t * in->qs, in->k + t * in->ks, in->v + t * in->vs, NULL, expf(in->g[t]), in->beta[t],
                  o + t * in->os, in->dk, in->dv);
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
HOT void delta_rule_chunked(const DeltaIn *in, float *S, float *o, float *work) {
    const int dk = in->dk, dv = in->dv, C = DELTA_CHUNK;
    float *A = work, *U = A + C * C, *Vn = U + C * dv, *W = Vn + C * dv, *G = W + C * dk, *kd = G + C;
    for (int c0 = 0; c0 < in->T; c0 += C) {
        const int n = in->T - c0 < C ? in->T - c0 : C;
        const float *q = in->q + c0 * in->qs, *k = in->k + c0 * in->ks, *v = in->v + c0 * in->vs;
        const float *beta = in->beta + c0;
        float *oc = o + c0 * in->os;
        float acc = 0;
        for (int i = 0; i < n; i++) G[i] = acc += in->g[c0 + i];
        for (int i = 0; i < n; i++)
            for (int j = 0; j < i; j++)
                A[i * C + j] = beta[i] * dot(k + i * in->ks, k + j * in->ks, dk) * expf(G[i] - G[j]);
        for (int i = 0; i < n; i++) {
            float *u = U + i * dv, *w = W + i * dk;
            const float eg = expf(G[i]);
            for (int x = 0; x < dv; x++) u[x] = beta[i] * v[i * in->vs + x];
            for (int x = 0; x < dk; x++) w[x] = beta[i] * eg * k[i * in->ks + x];
            for (int j = 0; j < i; j++) {
                const float a = A[i * C + j];
                axpy(u, -a, U + j * dv, dv);
                axpy(w, -a, W + j * dk, dk);
            }
        }
        for (int i = 0; i < n; i++) { /* V' = U - W S, and the read of the old state */
            float *vn = Vn + i * dv, *ot = oc + i * in->os;
            const float eg = expf(G[i]);
            memcpy(vn, U + i * dv, sizeof(float) * (size_t)dv);
            memset(ot, 0, sizeof(float) * (size_t)dv);
            for (int d = 0; d < dk; d++) {
                const float wd = W[i * dk + d], qd = q[i * in->qs + d] * eg;
                const float *s = S + d * dv;
                axpy2(vn, -wd, ot, qd, s, dv);
            }
        }
        for (int i = 0; i < n; i++) { /* the chunk's own contribution */
            float *ot = oc + i * in->os;
            for (int j = 0; j <= i; j++) {
                const float a = dot(q + i * in->qs, k + j * in->ks, dk) * expf(G[i] - G[j]);
                axpy(ot, a, Vn + j * dv, dv);
            }
        }
        const float last = G[n - 1], el = expf(last);
        for (int i = 0; i < dk * dv; i++) S[i] *= el;
        for (int j = 0; j < n; j++) {
            const float e = expf(last - G[j]);
            for (int d = 0; d < dk; d++) kd[d] = e * k[j * in->ks + d];
            for (int d = 0; d < dk; d++) {
                float *s = S + d * dv;
                const float *vn = Vn + j * dv;
                axpy(s, kd[d], vn, dv);
            }
        }
    }
}

/* The recurrent rule with S row d decayed by exp(g_t[d]). */
HOT void kda_recurrent(const DeltaIn *in, float *S, float *o) {
    float dec[1024]; /* dk <= 1024 */
    for (int t = 0; t < in->T; t++) {
        const float *g = in->g + t * in->gs;
        for (int d = 0; d < in->dk; d++) dec[d] = expf(g[d]);
        rule_step(S, in->q + t * in->qs, in->k + t * in->ks, in->v + t * in->vs, dec, 0, in->beta[t], o + t * in->os,
                  in->dk, in->dv);
    }
}

/* Pairwise per-channel decays exp(G_i - G_j), j <= i, with few exponentials: positions fall in
 * sub-chunks of KDA_SUB; for j before i's sub-chunk (starting at b) the decay factors exactly as
 * exp(G_i - G_b) exp(G_b - G_j), both at most 1 since G only falls, so nothing overflows.
 * kE_i = k_i exp(G_i - G_b), qE_i likewise, kF[b / KDA_SUB][j] = k_j exp(G_b - G_j) for j < b. */
static void kda_pair_decays(const float *G, const float *k, const float *q, size_t ks, size_t qs, int n, int dk,
                            float *kE, float *qE, float *kF) {
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
HOT void kda_chunked(const DeltaIn *in, float *S, float *o, float *work) {
    const int dk = in->dk, dv = in->dv, C = DELTA_CHUNK;
    float *A = work, *U = A + C * C, *Vn = U + C * dv, *W = Vn + C * dv, *G = W + C * dk, *kd = G + C * dk;
    float *kE = kd + C * dk, *qE = kE + C * dk, *kF = qE + C * dk; /* kF: [C / KDA_SUB][C][dk] */
    for (int c0 = 0; c0 < in->T; c0 += C) {
        const int n = in->T - c0 < C ? in->T - c0 : C;
        const float *q = in->q + c0 * in->qs, *k = in->k + c0 * in->ks, *v = in->v + c0 * in->vs;
        const float *beta = in->beta + c0;
        float *oc = o + c0 * in->os;
        for (int d = 0; d < dk; d++) {
            float acc = 0;
            for (int i = 0; i < n; i++) G[i * dk + d] = acc += in->g[(c0 + i) * in->gs + d];
        }
        kda_pair_decays(G, k, q, in->ks, in->qs, n, dk, kE, qE, kF);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < i; j++)
                A[i * C + j] = beta[i] * pair_dot(kE, kF, G, k, k, in->ks, in->ks, i, j, dk);
        for (int i = 0; i < n; i++) {
            float *u = U + i * dv, *w = W + i * dk;
            for (int x = 0; x < dv; x++) u[x] = beta[i] * v[i * in->vs + x];
            for (int x = 0; x < dk; x++) w[x] = beta[i] * expf(G[i * dk + x]) * k[i * in->ks + x];
            for (int j = 0; j < i; j++) {
                const float a = A[i * C + j];
                axpy(u, -a, U + j * dv, dv);
                axpy(w, -a, W + j * dk, dk);
            }
        }
        for (int i = 0; i < n; i++) {
            float *vn = Vn + i * dv, *ot = oc + i * in->os;
            memcpy(vn, U + i * dv, sizeof(float) * (size_t)dv);
            memset(ot, 0, sizeof(float) * (size_t)dv);
            for (int d = 0; d < dk; d++) {
                const float wd = W[i * dk + d], qd = q[i * in->qs + d] * expf(G[i * dk + d]);
                const float *s = S + d * dv;
                axpy2(vn, -wd, ot, qd, s, dv);
            }
        }
        for (int i = 0; i < n; i++) {
            float *ot = oc + i * in->os;
            for (int j = 0; j <= i; j++)
                axpy(ot, pair_dot(qE, kF, G, q, k, in->qs, in->ks, i, j, dk), Vn + j * dv, dv);
        }
        const float *last = G + (n - 1) * dk;
        for (int d = 0; d < dk; d++) {
            const float e = expf(last[d]);
            for (int x = 0; x < dv; x++) S[d * dv + x] *= e;
        }
        for (int j = 0; j < n; j++) {
            for (int d = 0; d < dk; d++) kd[d] = expf(last[d] - G[j * dk + d]) * k[j * in->ks + d];
            for (int d = 0; d < dk; d++) {
                float *s = S + d * dv;
                const float *vn = Vn + j * dv;
                axpy(s, kd[d], vn, dv);
            }
        }
    }
}
