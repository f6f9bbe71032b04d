/* SwiGLU MLPs: the dense block and the routed-expert block (softmax top-k router). */
#include <stdlib.h>
#include <string.h>

#include "fwd_alloc.h"
#include "layers.h"
#include "ops.h"

void mlp_dense(const Mlp *p, const float *x, int T, int hidden, int inter, float *out) {
    float *g = fwd_malloc(sizeof(float) * (size_t)T * inter), *u = fwd_malloc(sizeof(float) * (size_t)T * inter);
    if (!g || !u) { free(g); free(u); return; } /* fwd_oom() tells the caller */
    matmul(g, x, T, &p->gate, p->gate_b);
    matmul(u, x, T, &p->up, p->up_b);
    for (size_t i = 0; i < (size_t)T * inter; i++) g[i] = silu(g[i]) * u[i];
    matmul(out, g, T, &p->down, p->down_b);
    (void)hidden;
    free(g);
    free(u);
}

/* Picks the k largest probabilities; ties go to the lower expert index. */
static void top_k(const float *p, int n, int k, int *idx, float *val) {
    for (int j = 0; j < k; j++) { idx[j] = -1; val[j] = -1.0f; }
    for (int e = 0; e < n; e++) {
        int j = k;
        while (j > 0 && p[e] > val[j - 1]) j--;
        if (j == k) continue;
        memmove(idx + j + 1, idx + j, sizeof(int) * (size_t)(k - j - 1));
        memmove(val + j + 1, val + j, sizeof(float) * (size_t)(k - j - 1));
        idx[j] = e;
        val[j] = p[e];
    }
}

void moe(const Model *m, int l, const float *x, int T, float *out) {
    const Arch *a = &m->a;
    const Layer *y = &m->layers[l];
    const int E = a->n_experts, K = a->top_k, H = a->hidden, I = a->moe_intermediate;
    float *probs = fwd_malloc(sizeof(float) * (size_t)T * E);
    int *sel = fwd_malloc(sizeof(int) * (size_t)T * K);
    float *wts = fwd_malloc(sizeof(float) * (size_t)T * K);
    int *count = fwd_calloc((size_t)E, sizeof(int)), *rows = fwd_malloc(sizeof(int) * (size_t)T * K);
    float *xin = fwd_malloc(sizeof(float) * (size_t)T * H), *yout = fwd_malloc(sizeof(float) * (size_t)T * H);
    if (!probs || !sel || !wts || !count || !rows || !xin || !yout) goto out; /* fwd_oom() tells the caller */
    matmul_f32(probs, x, T, y->router, E, H);
    for (int t = 0; t < T; t++) {
        softmax(probs + (size_t)t * E, E);
        top_k(probs + (size_t)t * E, E, K, sel + t * K, wts + t * K);
        if (a->norm_topk_prob) {
            float s = 0;
            for (int j = 0; j < K; j++) s += wts[t * K + j];
            for (int j = 0; j < K; j++) wts[t * K + j] /= s;
        }
        for (int j = 0; j < K; j++) count[sel[t * K + j]]++;
    }
    memset(out, 0, sizeof(float) * (size_t)T * H);
    /* Batch-union: each selected expert runs once over all the positions that chose it. */
    for (int e = 0; e < E && !fwd_oom(); e++) {
        if (!count[e]) continue;
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < K; j++)
                if (sel[t * K + j] == e) { rows[n] = t * K + j; memcpy(xin + (size_t)n * H, x + (size_t)t * H, sizeof(float) * H); n++; }
        mlp_dense(&y->experts[e], xin, n, H, I, yout);
        for (int r = 0; r < n; r++) {
            int t = rows[r] / K;
            float w = wts[rows[r]];
            for (int d = 0; d < H; d++) out[(size_t)t * H + d] += w * yout[(size_t)r * H + d];
        }
    }
out:
    free(probs); free(sel); free(wts); free(count); free(rows); free(xin); free(yout);
}
