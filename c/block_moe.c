/* Routed-experts block: a router (router table) picks top_k of E SwiGLU experts per position;
 * out = sum of weight * expert(x). */
#include <stdlib.h>
#include <string.h>

#include "fwd_alloc.h"
#include "layers.h"
#include "moe_exec.h"
#include "ops.h"

typedef struct {
    int E, K, width;
    const RouterKind *router;
    void *router_self;
    Mlp *experts; /* [E] */
} Moe;

static int load(void *self, const JsonValue *spec, BlockLoader *L) {
    Moe *p = self;
    p->E = bl_int(L, spec, "experts", 1, 4096);
    p->K = bl_int(L, spec, "top_k", 1, 4096);
    p->width = bl_int(L, spec, "width", 1, 1 << 20);
    const char *act = bl_str(L, spec, "act");
    const JsonValue *rs = bl_obj(L, spec, "router"), *ex = bl_obj(L, spec, "expert_tensors");
    if (L->failed) return -1;
    if (p->K > p->E) return bl_fail(L, "moe: top_k %d exceeds %d experts", p->K, p->E);
    if (strcmp(act, "silu")) return bl_fail(L, "moe: activation '%s' is not implemented (silu)", act);
    const char *rk = bl_str(L, rs, "kind");
    if (L->failed) return -1;
    if (!(p->router = router_find(rk))) return bl_fail(L, "router kind '%s' is not implemented by this engine", rk);
    if (!(p->router_self = calloc(1, p->router->size))) return bl_fail(L, "out of memory");
    if (p->router->load(p->router_self, rs, p->E, p->K, L)) return -1;
    if (!(p->experts = calloc((size_t)p->E, sizeof(Mlp)))) return bl_fail(L, "out of memory");
    for (int e = 0; e < p->E && !L->failed; e++) mlp_load(L, &p->experts[e], ex, e, L->a->hidden, p->width, 0);
    return L->failed ? -1 : 0;
}

static void run(const void *self, const BlockRun *r, const float *x, int T, float *out) {
    const Moe *p = self;
    const int E = p->E, K = p->K, H = r->a->hidden;
    int *sel = fwd_malloc(sizeof(int) * (size_t)T * K);
    float *wts = fwd_malloc(sizeof(float) * (size_t)T * K);
    int *count = fwd_calloc((size_t)E, sizeof(int)), *rows = fwd_malloc(sizeof(int) * (size_t)T * K);
    float *xin = fwd_malloc(sizeof(float) * (size_t)T * H), *yout = fwd_malloc(sizeof(float) * (size_t)T * H);
    if (!sel || !wts || !count || !rows || !xin || !yout) goto out; /* fwd_oom() tells the caller */
    p->router->route(p->router_self, x, T, sel, wts);
    if (fwd_oom()) goto out; /* the router could not finish: sel is not filled */
    for (int i = 0; i < T * K; i++) count[sel[i]]++;
    memset(out, 0, sizeof(float) * (size_t)T * H);
    if (moe_parallel_ok(T * K)) { /* few rows (decode): experts in parallel, same bits (moe_exec.c) */
        moe_run_experts_parallel(p->experts, E, K, p->width, H, sel, wts, x, T, out);
        goto out;
    }
    /* Batch-union: each selected expert runs once over all the positions that chose it. */
    for (int e = 0; e < E && !fwd_oom(); e++) {
        if (!count[e]) continue;
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < K; j++)
                if (sel[t * K + j] == e) { rows[n] = t * K + j; memcpy(xin + (size_t)n * H, x + (size_t)t * H, sizeof(float) * H); n++; }
        mlp_swiglu(&p->experts[e], xin, n, p->width, yout);
        for (int i = 0; i < n; i++) {
            int t = rows[i] / K;
            float w = wts[rows[i]];
            for (int d = 0; d < H; d++) out[(size_t)t * H + d] += w * yout[(size_t)i * H + d];
        }
    }
out:
    free(sel); free(wts); free(count); free(rows); free(xin); free(yout);
}

static void release(void *self) {
    Moe *p = self;
    if (p->router && p->router->free) p->router->free(p->router_self);
    free(p->router_self);
    free(p->experts); /* experts hold no owned buffers (no biases) */
}

const BlockKind block_moe = {ROLE_MLP, "moe", sizeof(Moe), load, run, NULL, release};
