/* Pieces several blocks share: the SwiGLU MLP (dense block, each routed expert). */
#ifndef COLI_LAYERS_H
#define COLI_LAYERS_H
#include "model/blocks.h"
#include "model/model.h"

typedef enum { ACT_SILU = 0, ACT_SWIGLU_CLAMP, ACT_SILU_CLAMP } MlpAct;

typedef struct {
    QMat gate, up, down;
    const float *gate_b, *up_b, *down_b;
    MlpAct act;
    float alpha, limit; /* ACT_SWIGLU_CLAMP */
} Mlp;

/* out[T][hidden] = down(act(gate(x), up(x))) for x[T][hidden]; inter is the MLP width.
 * ACT_SILU: silu(g) * u. ACT_SWIGLU_CLAMP (gpt-oss): g clamped above at limit, u to
 * [-limit, limit], then (u + 1) * g * sigmoid(alpha * g). ACT_SILU_CLAMP (DeepSeek-V4): the same
 * clamps, then silu(g) * u. out may be x: x is read only before out is written. */
void mlp_swiglu(const Mlp *p, const float *x, int T, int inter, float *out);
/* Loads gate/up/down (and their biases when bias) from names in tensors, or from the "{e}"
 * templates in tensors with e substituted when e >= 0. */
/* The spec's "act" (silu or swiglu_clamp with swiglu_alpha / swiglu_limit) into m; 0 ok. */
int mlp_act_load(BlockLoader *L, const JsonValue *spec, Mlp *m);
void mlp_load(BlockLoader *L, Mlp *m, const JsonValue *tensors, int e, int hidden, int inter, int bias);
void mlp_release(Mlp *m);

#endif
