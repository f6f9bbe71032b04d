/* Pieces several blocks share: loading the SwiGLU MLP (dense block, each routed expert; its
 * math is mlp_swiglu in kernels/ops.h), and the MoE layers of a model. */
#ifndef COLI_LAYERS_H
#define COLI_LAYERS_H
#include "model/blocks.h"
#include "model/model.h"
#include "kernels/ops.h"
#include "experts/expert_store.h"

/* Loads gate/up/down (and their biases when bias) from names in tensors, or from the "{e}"
 * templates in tensors with e substituted when e >= 0. */
/* The spec's "act" (silu or swiglu_clamp with swiglu_alpha / swiglu_limit) into m; 0 ok. */
int mlp_act_load(BlockLoader *L, const JsonValue *spec, Mlp *m);
void mlp_load(BlockLoader *L, Mlp *m, const JsonValue *tensors, int e, int hidden, int inter, int bias);
void mlp_release(Mlp *m);

/* The MoE layer of an MLP block with routed experts, else NULL (block_moe.c). */
ExpertLayer *moe_expert_layer(const Block *b);
/* The model's MoE layers in order into out[n_layers]; returns how many. */
int model_expert_layers(const Model *m, ExpertLayer **out);

#endif
