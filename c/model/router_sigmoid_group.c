/* Router of DeepSeek-V3 / GLM-4.5 MoE layers: sigmoid scores; a per-expert correction bias
 * that steers selection only; group-limited selection (experts split into `groups` equal
 * groups, a group scored by the sum of its two best biased scores, only the best `topk_group`
 * groups eligible); the chosen experts weighted by their unbiased scores, optionally
 * renormalised, times `scale` (routed_scaling_factor). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/fwd_alloc.h"
#include "model/blocks.h"
#include "model/router_common.h"
#include "kernels/ops.h"

typedef struct {
    RouterGate g; /* bias: the correction (NULL: none) */
    int groups, topk_group, renorm;
    float scale;
} SigmoidGroup;

static int load(void *self, const JsonValue *spec, int experts, int top_k, BlockLoader *L) {
    SigmoidGroup *p = self;
    p->groups = bl_int(L, spec, "groups", 1, experts);
    p->topk_group = bl_int(L, spec, "topk_group", 1, experts);
    p->scale = (float)bl_num(L, spec, "scale", 1e-6, 1e6);
    p->renorm = json_get_bool(spec, "renorm", 0);
    if (L->failed) return -1;
    if (experts % p->groups) return bl_fail(L, "sigmoid_group: %d experts do not split into %d groups", experts, p->groups);
    if (p->topk_group > p->groups) return bl_fail(L, "sigmoid_group: topk_group %d exceeds %d groups", p->topk_group, p->groups);
    if (p->groups > 1 && experts / p->groups < 2)
        return bl_fail(L, "sigmoid_group: a group needs at least 2 experts (its score is the sum of its top 2)");
    if (top_k > p->topk_group * (experts / p->groups))
        return bl_fail(L, "sigmoid_group: top_k %d exceeds the %d experts of %d groups", top_k,
                       p->topk_group * (experts / p->groups), p->topk_group);
    router_gate_load(&p->g, spec, experts, top_k, GATE_BIAS, L);
    return L->failed ? -1 : 0;
}

/* Indices of the k largest of v[0..n) where ok[i]; ties go to the lower index. */
static void top_k(const float *v, const unsigned char *ok, int n, int k, int *idx) {
    float best[k > 0 ? k : 1];
    for (int j = 0; j < k; j++) {
        idx[j] = -1;
        best[j] = -INFINITY;
    }
    for (int i = 0; i < n; i++) {
        if (ok && !ok[i]) continue;
        int j = k;
        while (j > 0 && (idx[j - 1] < 0 || v[i] > best[j - 1])) j--;
        if (j == k) continue;
        memmove(idx + j + 1, idx + j, sizeof(int) * (size_t)(k - j - 1));
        memmove(best + j + 1, best + j, sizeof(float) * (size_t)(k - j - 1));
        idx[j] = i;
        best[j] = v[i];
    }
}

static void route(const void *self, const float *x, int T, int *sel, float *wts) {
    const SigmoidGroup *p = self;
    const int E = p->g.E, K = p->g.K, G = p->groups, per = E / G;
    float *score = fwd_malloc(sizeof(float) * (size_t)T * E), *choice = fwd_malloc(sizeof(float) * (size_t)E);
    float *gscore = fwd_malloc(sizeof(float) * (size_t)G);
    int *gidx = fwd_malloc(sizeof(int) * (size_t)G);
    unsigned char *ok = fwd_malloc((size_t)E);
    if (!score || !choice || !gscore || !gidx || !ok) goto out; /* fwd_oom() tells the caller */
    matmul_f32(score, x, T, p->g.w, E, p->g.H);
    for (int t = 0; t < T; t++) {
        float *s = score + (size_t)t * E;
        for (int e = 0; e < E; e++) {
            s[e] = 1.0f / (1.0f + expf(-s[e]));
            choice[e] = s[e] + (p->g.bias ? p->g.bias[e] : 0.0f);
        }
        memset(ok, 1, (size_t)E);
        if (G > 1) {
            for (int g = 0; g < G; g++) {
                int two[2];
                top_k(choice + g * per, NULL, per, 2, two);
                gscore[g] = choice[g * per + two[0]] + choice[g * per + two[1]];
            }
            top_k(gscore, NULL, G, p->topk_group, gidx);
            memset(ok, 0, (size_t)E);
            for (int j = 0; j < p->topk_group; j++) memset(ok + gidx[j] * per, 1, (size_t)per);
        }
        int *si = sel + t * K;
        float *w = wts + t * K, sum = 0;
        top_k(choice, ok, E, K, si);
        for (int j = 0; j < K; j++) sum += (w[j] = s[si[j]]);
        for (int j = 0; j < K; j++) w[j] = (p->renorm ? w[j] / (sum + 1e-20f) : w[j]) * p->scale;
    }
out:
    free(score);
    free(choice);
    free(gscore);
    free(gidx);
    free(ok);
}

const RouterKind router_sigmoid_group = {"sigmoid_group", sizeof(SigmoidGroup), load, route, router_gate_release, NULL};
