/* Plain float helpers every kernel family may use (vec.c); nothing here dispatches. */
#ifndef COLI_VEC_H
#define COLI_VEC_H
#include <stddef.h>

void softmax(float *x, int n);
float silu(float x);
/* Thread-local scratch that grows on demand; valid until the next call with the same slot.
 * Slots in use: 0 matmul (dequantized rows), 1 attention scores, 2 matmul (quantized activations),
 * 3 latent attention's gathered rows of a DSA selection, 4 its dequantized W_uk rows of a head or
 * the DSA indexer's transposed query (dsa_score.c). */
float *scratch(int slot, size_t n);

#endif
