/* DSA lightning indexer (dsa_indexer.h). */
#include "model/dsa_indexer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dsa_score.h"
#include "util/fwd_alloc.h"
#include "kernels/ops.h"
#include "model/rope.h"

int dsa_load(DsaIndexer *d, const JsonValue *spec, int q_lora, int rope_dim, BlockLoader *L) {
    const int H = L->a->hidden;
    d->nh = bl_int(L, spec, "heads", 1, 4096);
    d->hd = bl_int(L, spec, "head_dim", 2, 4096);
    d->topk = bl_int(L, spec, "topk", 1, 1 << 30);
    d->eps = (float)bl_num(L, spec, "norm_eps", 1e-30, 1.0);
    const JsonValue *rope = bl_obj(L, spec, "rope");
    if (L->failed) return -1;
    const char *style = bl_str(L, rope, "style");
    if (L->failed) return -1;
    if (strcmp(style, "interleaved") && strcmp(style, "neox"))
        return bl_fail(L, "dsa indexer: rope style '%s' is not implemented (interleaved, neox)", style);
    d->interleaved = !strcmp(style, "interleaved");
    d->dr = rope_dim;
    if (!q_lora) return bl_fail(L, "dsa indexer: needs the query latent (q_lora_rank > 0)");
    if (d->hd < rope_dim) return bl_fail(L, "dsa indexer: head_dim %d is below the rope dim %d", d->hd, rope_dim);
    const JsonValue *t = json_get(spec, "tensors");
    d->wq_b = bl_mat(L, t, "wq_b", d->nh * d->hd, q_lora);
    d->wk = bl_mat(L, t, "wk", d->hd, H);
    d->wproj = bl_mat(L, t, "weights", d->nh, H);
    d->ln_w = bl_vec(L, t, "k_norm", 1, d->hd, 0);
    d->ln_b = bl_vec(L, t, "k_norm_bias", 1, d->hd, 0);
    return L->failed ? -1 : 0;
}

static void layernorm(float *v, const float *w, const float *b, int n, float eps) {
    float mean = 0, var = 0;
    for (int i = 0; i < n; i++) mean += v[i];
    mean /= (float)n;
    for (int i = 0; i < n; i++) var += (v[i] - mean) * (v[i] - mean);
    const float s = 1.0f / sqrtf(var / (float)n + eps);
    for (int i = 0; i < n; i++) v[i] = (v[i] - mean) * s * w[i] + b[i];
}

void dsa_store_keys(const DsaIndexer *d, const BlockRun *r, const float *x, int T, size_t stride, size_t off) {
    float *k = fwd_malloc(sizeof(float) * (size_t)T * d->hd);
    if (!k) return;
    matmul(k, x, T, &d->wk, NULL);
    for (int t = 0; t < T; t++) {
        float *kt = k + (size_t)t * d->hd;
        layernorm(kt, d->ln_w, d->ln_b, d->hd, d->eps);
        rope_rotate(kt, r->a, d->dr, r->p0 + t, d->interleaved);
        memcpy(r->state->pos + (size_t)(r->p0 + t) * stride + off, kt, sizeof(float) * d->hd); /* f32 keys */
    }
    free(k);
}

/* The k-th largest of c[0..n) (1 <= k <= n), reordering c: a three-way partition around the
 * middle element's value, kept to the side that holds rank k; the run of values equal to the
 * pivot ends a round at once, so the many ties of ReLU'd scores (zeros) cost one pass. */
static float kth_largest(float *c, int n, int k) {
    int lo = 0, hi = n, want = k - 1; /* rank want (0 = largest) within c[lo..hi) */
    for (;;) {
        const float p = c[lo + (hi - lo) / 2];
        int gt = lo, i = lo, lt = hi; /* [lo,gt) > p, [gt,i) == p, [lt,hi) < p */
        while (i < lt) {
            const float x = c[i];
            if (x > p) {
                c[i] = c[gt];
                c[gt++] = x;
                i++;
            } else if (x < p) {
                c[i] = c[--lt];
                c[lt] = x;
            } else i++;
        }
        if (want < gt) hi = gt;
        else if (want < lt) return p;
        else lo = lt;
    }
}

/* Every score above the k-th largest, then the first ones equal to it. O(n): a top-k of 2048
 * kept by insertion cost a few million moves per query at 4k positions. */
void dsa_mark_top(const float *s, int n, int k, unsigned char *keep) {
    if (n <= 0 || k <= 0) return;
    if (k >= n) {
        memset(keep, 1, (size_t)n);
        return;
    }
    float *c = fwd_malloc(sizeof(float) * (size_t)n);
    if (!c) return;                                                     /* fwd_oom() fails the pass */
    for (int j = 0; j < n; j++) c[j] = s[j] == s[j] ? s[j] : -INFINITY; /* a NaN ranks last */
    const float v = kth_largest(c, n, k);
    int kept = 0;
    for (int j = 0; j < n; j++)
        if (s[j] > v) keep[j] = 1, kept++;
    for (int j = 0; j < n && kept < k; j++)
        if (s[j] == v || (s[j] != s[j] && v == -INFINITY)) keep[j] = 1, kept++;
    free(c);
}

/* Query t's row of keep: its top-k keys by index score; the scores in parts (> 1: across the
 * threads). */
static void select_query(const DsaIndexer *d, const BlockRun *r, int t, const float *q, const float *w,
                         const unsigned char *cache, size_t stride, int n_all, float scale, float wscale, int parts,
                         unsigned char *keep) {
    const int n = r->p0 + t + 1, nh = d->nh, hd = d->hd;
    unsigned char *kt = keep + (size_t)t * n_all;
    memset(kt, 0, (size_t)n_all);
    if (n <= d->topk) {
        memset(kt, 1, (size_t)n);
        return;
    }
    float *s = scratch(1, (size_t)n);
    if (!s) return; /* out of memory: fwd_oom() fails the pass */
    const float *qt = q + (size_t)t * nh * hd, *wt = w + (size_t)t * nh;
#pragma omp parallel for schedule(static) if (parts > 1)
    for (int c = 0; c < parts; c++) {
        const int j0 = (int)((long)n * c / parts), j1 = (int)((long)n * (c + 1) / parts);
        dsa_scores(qt, wt, nh, hd, cache + (size_t)j0 * stride, stride, j1 - j0, scale, wscale, s + j0);
    }
    dsa_mark_top(s, n, d->topk, kt);
}

unsigned char *dsa_select(const DsaIndexer *d, const BlockRun *r, const float *x, const float *qa, int T, size_t stride,
                          size_t off) {
    const int n_all = r->p0 + T, nh = d->nh, hd = d->hd;
    if (n_all <= d->topk) return NULL; /* every query keeps all its keys */
    unsigned char *keep = fwd_malloc((size_t)T * n_all);
    float *q = fwd_malloc(sizeof(float) * (size_t)T * nh * hd), *w = fwd_malloc(sizeof(float) * (size_t)T * nh);
    if (!keep || !q || !w) {
        free(keep);
        keep = NULL;
        goto out;
    }
    matmul(q, qa, T, &d->wq_b, NULL);
    matmul(w, x, T, &d->wproj, NULL);
    const float scale = 1.0f / sqrtf((float)hd), wscale = 1.0f / sqrtf((float)nh);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) rope_rotate(q + ((size_t)t * nh + h) * hd, r->a, d->dr, r->p0 + t, d->interleaved);
    const unsigned char *cache = r->state->pos + off;
    /* A query per task; at decode (fewer queries than threads) the keys of each query split
     * across the threads instead, in a region of its own: one nested in the query loop's, even
     * an inactive one, would start fresh threads every time. A key's score does not depend on
     * the split. */
    const int split = T < par_threads();
    if (split)
        for (int t = 0; t < T; t++) select_query(d, r, t, q, w, cache, stride, n_all, scale, wscale, par_threads(), keep);
    else {
#pragma omp parallel for schedule(dynamic, 1)
        for (int t = 0; t < T; t++) select_query(d, r, t, q, w, cache, stride, n_all, scale, wscale, 1, keep);
    }
out:
    free(q);
    free(w);
    return keep;
}

void dsa_release(DsaIndexer *d) {
    free((void *)d->ln_w);
    free((void *)d->ln_b);
}
