/* The per-layer blocks the forward pass composes. */
#ifndef COLI_LAYERS_H
#define COLI_LAYERS_H
#include "model.h"

/* x[T][hidden] is the normalized input; out[T][hidden] receives the attention output.
 * Positions are kv->n .. kv->n+T-1; K/V for them are written into the cache. */
void attention(const Model *m, int layer, KvCache *kv, const float *x, int T, float *out);
/* Dense SwiGLU MLP: out[T][hidden]. */
void mlp_dense(const Mlp *p, const float *x, int T, int hidden, int inter, float *out);
/* Routed experts: out[T][hidden] = sum over top-k experts of weight * expert(x). */
void moe(const Model *m, int layer, const float *x, int T, float *out);

#endif
