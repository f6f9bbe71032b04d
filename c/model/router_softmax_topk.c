/* Router: softmax over all experts, then the top-k probabilities, optionally renormalised to
 * sum to one (norm_topk_prob). */
#include <stdlib.h>
#include <string.h>

#include "util/fwd_alloc.h"
#include "model/blocks.h"
#include "kernels/ops.h"

typedef struct {
    const float *w; /* [experts][hidden] */
    int E, K, H, renorm;
} SoftmaxTopk;

static int load(void *self, const JsonValue *spec, int experts, int top_k, BlockLoader *L) {
    SoftmaxTopk *p = self;
    p->E = experts;
    p->K = top_k;
    p->H = L->a->hidden;
    p->renorm = json_get_bool(spec, "renorm", 0);
    p->w = bl_vec(L, json_get(spec, "tensors"), "weight", experts, p->H, 0);
    return L->failed ? -1 : 0;
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

static void route(const void *self, const float *x, int T, int *sel, float *wts) {
    const SoftmaxTopk *p = self;
    const int E = p->E, K = p->K;
    float *probs = fwd_malloc(sizeof(float) * (size_t)T * E);
    if (!probs) return; /* fwd_oom() tells the caller, which leaves sel unread */
    matmul_f32(probs, x, T, p->w, E, p->H);
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

static void release(void *self) { free((void *)((SoftmaxTopk *)self)->w); }

const RouterKind router_softmax_topk = {"softmax_topk", sizeof(SoftmaxTopk), load, route, release, NULL};
