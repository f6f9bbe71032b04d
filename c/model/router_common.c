#include "model/router_common.h"

#include <stdlib.h>

const JsonValue *router_gate_load(RouterGate *g, const JsonValue *spec, int experts, int top_k, int bias, BlockLoader *L) {
    g->E = experts;
    g->K = top_k;
    g->H = L->a->hidden;
    const JsonValue *t = json_get(spec, "tensors");
    g->w = bl_vec(L, t, "weight", experts, g->H, 0);
    if (bias == GATE_BIAS) g->bias = bl_vec(L, t, "bias", 1, experts, 1);
    return t;
}

void router_gate_free(RouterGate *g) {
    free((void *)g->w);
    free((void *)g->bias);
}

void router_gate_release(void *self) { router_gate_free(self); }
