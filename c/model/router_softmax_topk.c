/* Router: softmax over all experts, then the top-k probabilities, optionally renormalised to
 * sum to one (norm_topk_prob). */
#include <stdlib.h>
#include <string.h>

#include "util/fwd_alloc.h"
#include "model/blocks.h"
#include "model/router_common.h"
#include "kernels/ops.h"

typedef struct {
    RouterGate g; /* no bias */
    int renorm;
} SoftmaxTopk;

static int load(void *self, const JsonValue *spec, int experts, int top_k, BlockLoader *L) {
    SoftmaxTopk *p = self;
    p->renorm = json_get_bool(spec, "renorm", 0);
    router_gate_load(&p->g, spec, experts, top_k, GATE_NO_BIAS, L);
    return L->failed ? -1 : 0;
}

/* Picks the k largest probabilities; ties go to the lower expert index. */
static void top_k(const float *p, int n, int k, int *idx, float *val) {
    for (int j = 0; j < k; j++) {
        idx[j] = -1;
        val[j] = -1.0f;
    }
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

static void route(const void *self, const float *x, int T, int *sel, float *wts) {
    const SoftmaxTopk *p = self;
    const int E = p->g.E, K = p->g.K;
    float *probs = fwd_malloc(sizeof(float) * (size_t)T * E);
    if (!probs) return; /* fwd_oom() tells the caller, which leaves sel unread */
    matmul_f32(probs, x, T, p->g.w, E, p->g.H);
    for (int t = 0; t < T; t++) {
        softmax(probs + (size_t)t * E, E);
        top_k(probs + (size_t)t * E, E, K, sel + t * K, wts + t * K);
        if (p->renorm) {
            float s = 0;
            for (int j = 0; j < K; j++) s += wts[t * K + j];
            for (int j = 0; j < K; j++) wts[t * K + j] /= s;
        }
    }
    free(probs);
}

const RouterKind router_softmax_topk = {"softmax_topk", sizeof(SoftmaxTopk), load, route, router_gate_release, NULL};
