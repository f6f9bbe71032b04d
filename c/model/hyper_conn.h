/* Hyper-connections (DeepSeek-V4's mHC): the residual is n streams per position. Before a block
 * the streams collapse into its input (weights `pre`); after it the block's output expands back
 * (weights `post`) onto the streams mixed by a doubly-stochastic matrix (`comb`, Sinkhorn-Knopp).
 * All three come from the streams themselves: one linear map of their RMS-normalized concatenation. */
#ifndef COLI_HYPER_CONN_H
#define COLI_HYPER_CONN_H
#include "model/blocks.h"

typedef struct HyperConn {
    int n, iters; /* streams; Sinkhorn iterations (0: a head, which only collapses) */
    float eps, norm_eps;
    const float *fn;    /* [(2 + n) * n or n][n * hidden] */
    const float *base;  /* [(2 + n) * n or n] */
    const float *scale; /* [3] or [1] */
} HyperConn;

/* Loads {n, iters, eps, norm_eps, tensors: fn/base/scale}; head: the final collapse (no iters). */
HyperConn *hc_load(BlockLoader *L, const JsonValue *spec, int head);
void hc_free(HyperConn *h);
/* From streams xs[T][n][H]: collapsed[T][H] (the block's input), post[T][n], comb[T][n][n]. */
void hc_pre(const HyperConn *h, const float *xs, int T, int H, float *collapsed, float *post, float *comb);
/* xs[t][k] = post[t][k] * out[t] + sum_j comb[t][j][k] * xs[t][j]. */
void hc_post(int n, float *xs, int T, int H, const float *out, const float *post, const float *comb);
/* The final collapse: out[T][H] = sum_j (sigmoid(mix_j * scale + base_j) + eps) * xs[t][j]. */
void hc_head(const HyperConn *h, const float *xs, int T, int H, float *out);

#endif
