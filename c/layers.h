/* Pieces several blocks share: the SwiGLU MLP (dense block, each routed expert). */
#ifndef COLI_LAYERS_H
#define COLI_LAYERS_H
#include "blocks.h"
#include "model.h"

typedef struct {
    QMat gate, up, down;
    const float *gate_b, *up_b, *down_b;
} Mlp;

/* out[T][hidden] = down(silu(gate(x)) * up(x)) for x[T][hidden]; inter is the MLP width. */
void mlp_swiglu(const Mlp *p, const float *x, int T, int inter, float *out);
/* Loads gate/up/down (and their biases when bias) from names in tensors, or from the "{e}"
 * templates in tensors with e substituted when e >= 0. */
void mlp_load(BlockLoader *L, Mlp *m, const JsonValue *tensors, int e, int hidden, int inter, int bias);
void mlp_release(Mlp *m);

#endif
