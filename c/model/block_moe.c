/* Routed-experts block: a router (router table) picks top_k of E SwiGLU experts per position;
 * out = sum of weight * expert(x). */
#include <stdlib.h>
#include <string.h>

#include "util/op_prof.h"
#include "experts/expert_store.h"
#include "util/fwd_alloc.h"
#include "model/layers.h"
#include "kernels/ops.h"

typedef struct {
    int E, K, width;
    const RouterKind *router;
    void *router_self;
    Mlp *experts;   /* [E] */
    ExpertLayer xl; /* where the experts come from: the mapping or the expert store */
} Moe;

static int load(void *self, const JsonValue *spec, BlockLoader *L) {
    Moe *p = self;
    p->E = bl_int(L, spec, "experts", 1, 4096);
    p->K = bl_int(L, spec, "top_k", 1, 4096);
    p->width = bl_int(L, spec, "width", 1, 1 << 20);
    Mlp act = {0};
    const JsonValue *rs = bl_obj(L, spec, "router"), *ex = bl_obj(L, spec, "expert_tensors");
    if (L->failed || mlp_act_load(L, spec, &act)) return -1;
    if (p->K > p->E) return bl_fail(L, "moe: top_k %d exceeds %d experts", p->K, p->E);
    /* expert biases (gpt-oss): "{e}" templates gate_bias / up_bias / down_bias beside the weights */
    const int bias = json_get_str(ex, "gate_bias") || json_get_str(ex, "up_bias") || json_get_str(ex, "down_bias");
    const char *rk = bl_str(L, rs, "kind");
    if (L->failed) return -1;
    if (!(p->router = router_find(rk))) return bl_fail(L, "router kind '%s' is not implemented by this engine", rk);
    if (!(p->router_self = calloc(1, p->router->size))) return bl_fail(L, "out of memory");
    if (p->router->load(p->router_self, rs, p->E, p->K, L)) return -1;
    if (!(p->experts = calloc((size_t)p->E, sizeof(Mlp)))) return bl_fail(L, "out of memory");
    for (int e = 0; e < p->E && !L->failed; e++) {
        p->experts[e] = (Mlp){.act = act.act, .alpha = act.alpha, .limit = act.limit};
        mlp_load(L, &p->experts[e], ex, e, L->a->hidden, p->width, bias);
    }
    p->xl = (ExpertLayer){.layer = L->layer,
                          .E = p->E,
                          .K = p->K,
                          .H = L->a->hidden,
                          .width = p->width,
                          .experts = p->experts,
                          .predict = p->router->route,
                          .predict_self = p->router_self};
    return L->failed ? -1 : 0;
}

static void run(const void *self, const BlockRun *r, const float *x, int T, float *out) {
    const Moe *p = self;
    int *sel = fwd_malloc(sizeof(int) * (size_t)T * p->K);
    float *wts = fwd_malloc(sizeof(float) * (size_t)T * p->K);
    /* forward always passes the token ids; a hash router's route alone only predicts */
    const ProfOp was = prof_enter(PROF_ROUTER);
    if (sel && wts && p->router->route_ids && r->tokens) p->router->route_ids(p->router_self, x, r->tokens, T, sel, wts);
    else if (sel && wts) p->router->route(p->router_self, x, T, sel, wts);
    /* fwd_oom() tells the caller when an allocation (or the router) could not finish */
    prof_switch_if(PROF_EXPERTS);
    if (sel && wts && !fwd_oom()) expert_layer_run(&p->xl, x, T, sel, wts, out);
    prof_leave(was);
    free(sel);
    free(wts);
}

static void release(void *self) {
    Moe *p = self;
    if (p->router && p->router->free) p->router->free(p->router_self);
    free(p->router_self);
    for (int e = 0; p->experts && e < p->E; e++) mlp_release(&p->experts[e]); /* their biases */
    free(p->experts);
}

static ExpertLayer *experts(void *self) { return &((Moe *)self)->xl; }

const BlockKind block_moe = {ROLE_MLP, "moe", sizeof(Moe), load, run, NULL, release, experts};

ExpertLayer *moe_expert_layer(const Block *b) { return b->kind && b->kind->experts ? b->kind->experts(b->self) : NULL; }

int model_expert_layers(const Model *m, ExpertLayer **out) {
    int n = 0;
    for (int l = 0; l < m->a.n_layers; l++)
        if ((out[n] = moe_expert_layer(&m->layers[l].mlp))) n++;
    return n;
}
