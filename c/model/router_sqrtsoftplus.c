/* Router of DeepSeek-V4 MoE layers: scores sqrt(softplus(w . x)) (or, with "score": "sigmoid",
 * sigmoid(w . x)); the chosen experts are the
 * top_k of scores + a correction bias (selection only), or, for hash-routed layers, fixed per
 * token (tid2eid[token][k]); weights are the chosen scores renormalised, times `scale`
 * (routed_scaling_factor). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/blocks.h"
#include "model/router_common.h"
#include "util/fwd_alloc.h"
#include "kernels/ops.h"

typedef struct {
    RouterGate g;         /* bias: the correction (selection only), or NULL */
    const float *tid2eid; /* [vocab][top_k] expert ids (stored as f32), or NULL */
    int vocab, sigmoid;
    float scale;
} SqrtSoftplus;

static int load(void *self, const JsonValue *spec, int experts, int top_k, BlockLoader *L) {
    SqrtSoftplus *p = self;
    p->vocab = L->a->vocab;
    p->scale = (float)bl_num(L, spec, "scale", 1e-6, 1e6);
    const char *score = json_get_str(spec, "score");
    if (score && strcmp(score, "sqrtsoftplus") && strcmp(score, "sigmoid"))
        return bl_fail(L, "sqrtsoftplus: score '%s' is not implemented (sqrtsoftplus, sigmoid)", score);
    p->sigmoid = score && !strcmp(score, "sigmoid");
    const JsonValue *t = router_gate_load(&p->g, spec, experts, top_k, GATE_BIAS, L);
    p->tid2eid = bl_vec(L, t, "tid2eid", p->vocab, top_k, 1);
    if (L->failed) return -1;
    if (p->g.bias && p->tid2eid) return bl_fail(L, "sqrtsoftplus: a hash-routed layer has no correction bias");
    for (long i = 0; p->tid2eid && i < (long)p->vocab * top_k; i++) {
        float e = p->tid2eid[i];
        if (!(e >= 0 && e < experts) || e != floorf(e))
            return bl_fail(L, "sqrtsoftplus: tid2eid[%ld][%ld] = %g is not an expert index below %d", i / top_k, i % top_k, e,
                           experts);
    }
    return 0;
}

static float sqrt_softplus(float x) { return sqrtf(x > 20.0f ? x : log1pf(expf(x))); } /* torch's threshold */

static void scores(const SqrtSoftplus *p, const float *x, int T, float *s) {
    matmul_f32(s, x, T, p->g.w, p->g.E, p->g.H);
    for (size_t i = 0; i < (size_t)T * p->g.E; i++) s[i] = p->sigmoid ? 1.0f / (1.0f + expf(-s[i])) : sqrt_softplus(s[i]);
}

static void weigh(const SqrtSoftplus *p, const float *s, const int *si, float *w) {
    float sum = 0;
    for (int j = 0; j < p->g.K; j++) sum += (w[j] = s[si[j]]);
    for (int j = 0; j < p->g.K; j++) w[j] = w[j] / (sum + 1e-20f) * p->scale;
}

/* Top-k of scores + bias, ties to the lower index. */
static void route(const void *self, const float *x, int T, int *sel, float *wts) {
    const SqrtSoftplus *p = self;
    const int E = p->g.E, K = p->g.K;
    float *s = fwd_malloc(sizeof(float) * (size_t)T * E);
    if (!s) return; /* fwd_oom() tells the caller */
    scores(p, x, T, s);
    for (int t = 0; t < T; t++) {
        const float *st = s + (size_t)t * E;
        int *si = sel + (size_t)t * K;
        float best[K];
        for (int j = 0; j < K; j++) {
            si[j] = -1;
            best[j] = -INFINITY;
        }
        for (int e = 0; e < E; e++) {
            float v = st[e] + (p->g.bias ? p->g.bias[e] : 0.0f);
            int j = K;
            while (j > 0 && (si[j - 1] < 0 || v > best[j - 1])) j--;
            if (j == K) continue;
            memmove(si + j + 1, si + j, sizeof(int) * (size_t)(K - j - 1));
            memmove(best + j + 1, best + j, sizeof(float) * (size_t)(K - j - 1));
            si[j] = e;
            best[j] = v;
        }
        weigh(p, st, si, wts + (size_t)t * K);
    }
    free(s);
}

static void route_ids(const void *self, const float *x, const int32_t *ids, int T, int *sel, float *wts) {
    const SqrtSoftplus *p = self;
    if (!p->tid2eid) {
        route(self, x, T, sel, wts);
        return;
    }
    float *s = fwd_malloc(sizeof(float) * (size_t)T * p->g.E);
    if (!s) return;
    scores(p, x, T, s);
    for (int t = 0; t < T; t++) {
        int *si = sel + (size_t)t * p->g.K;
        const int id = ids[t] >= 0 && ids[t] < p->vocab ? ids[t] : 0;
        for (int j = 0; j < p->g.K; j++) si[j] = (int)p->tid2eid[(size_t)id * p->g.K + j];
        weigh(p, s + (size_t)t * p->g.E, si, wts + (size_t)t * p->g.K);
    }
    free(s);
}

static void release(void *self) {
    SqrtSoftplus *p = self;
    router_gate_free(&p->g);
    free((void *)p->tid2eid);
}

const RouterKind router_sqrtsoftplus = {"sqrtsoftplus", sizeof(SqrtSoftplus), load, route, release, route_ids};
