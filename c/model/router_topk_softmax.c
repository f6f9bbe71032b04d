/* Router: logits = W x + b, the top-k logits chosen, then a softmax over those k alone
 * (gpt-oss). Ties go to the lower expert index. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/fwd_alloc.h"
#include "model/blocks.h"
#include "model/router_common.h"
#include "kernels/ops.h"

typedef struct {
    RouterGate g;
} TopkSoftmax;

static int load(void *self, const JsonValue *spec, int experts, int top_k, BlockLoader *L) {
    TopkSoftmax *p = self;
    router_gate_load(&p->g, spec, experts, top_k, GATE_BIAS, L);
    return L->failed ? -1 : 0;
}

static void route(const void *self, const float *x, int T, int *sel, float *wts) {
    const TopkSoftmax *p = self;
    const int E = p->g.E, K = p->g.K;
    float *logits = fwd_malloc(sizeof(float) * (size_t)T * E);
    if (!logits) return; /* fwd_oom() tells the caller, which leaves sel unread */
    matmul_f32(logits, x, T, p->g.w, E, p->g.H);
    for (int t = 0; t < T; t++) {
        float *lg = logits + (size_t)t * E, *w = wts + (size_t)t * K;
        int *s = sel + (size_t)t * K;
        if (p->g.bias)
            for (int e = 0; e < E; e++) lg[e] += p->g.bias[e];
        for (int j = 0; j < K; j++) {
            s[j] = -1;
            w[j] = -INFINITY;
        }
        for (int e = 0; e < E; e++) { /* insertion into the sorted top K */
            int j = K;
            while (j > 0 && lg[e] > w[j - 1]) j--;
            if (j == K) continue;
            memmove(s + j + 1, s + j, sizeof(int) * (size_t)(K - j - 1));
            memmove(w + j + 1, w + j, sizeof(float) * (size_t)(K - j - 1));
            s[j] = e;
            w[j] = lg[e];
        }
        softmax(w, K); /* w[0] is the largest */
    }
    free(logits);
}

const RouterKind router_topk_softmax = {"topk_softmax", sizeof(TopkSoftmax), load, route, router_gate_release, NULL};
