/* What every router loads the same way: its sizes and its gate, logits = W x (+ b). A router's
 * struct starts with a RouterGate, so router_gate_release can free any of them. */
#ifndef COLI_ROUTER_COMMON_H
#define COLI_ROUTER_COMMON_H
#include "model/blocks.h"

typedef struct {
    const float *w, *bias; /* [E][H], [E] or NULL (no bias, or the router takes none) */
    int E, K, H;           /* experts, top_k, the model's hidden size */
} RouterGate;

enum { GATE_NO_BIAS, GATE_BIAS }; /* GATE_BIAS: read the spec's optional "bias" tensor */

/* Sets the sizes and reads the spec's "weight" tensor, and its "bias" with GATE_BIAS; returns
 * the spec's "tensors" object for the router's own tensors. Failure: L->failed, L->err set. */
const JsonValue *router_gate_load(RouterGate *g, const JsonValue *spec, int experts, int top_k, int bias, BlockLoader *L);
void router_gate_free(RouterGate *g);
/* RouterKind.free for a router that owns nothing beyond its gate. */
void router_gate_release(void *self);

#endif
