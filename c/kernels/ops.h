/* Shared math ops every family is built from. */
#ifndef COLI_OPS_H
#define COLI_OPS_H
#include "model/model.h"

/* y[T][rows] = x[T][cols] . W^T (+ bias); parallel over rows, several positions per weight pass. */
void matmul(float *y, const float *x, int T, const QMat *w, const float *bias);
/* y[T][rows] = x[T][cols] . W^T for a plain f32 matrix (router). */
void matmul_f32(float *y, const float *x, int T, const float *w, int rows, int cols);
void rmsnorm(float *y, const float *x, const float *w, int n, float eps);
void softmax(float *x, int n);
float silu(float x);
/* Whether a parallel region pays for work of this many 32-element dots (starting one costs
 * ~2 us with spinning threads, ~60 us with sleeping ones); only speed depends on it. */
int par_worth(double block_dots);
/* Threads a parallel region here runs on (for code built without OpenMP's header: the fuzzers). */
int par_threads(void);
/* Thread-local scratch that grows on demand; valid until the next call with the same slot.
 * Slots in use: 0 matmul (dequantized rows), 1 attention scores, 2 matmul (quantized activations),
 * 3 latent attention's gathered rows of a DSA selection, 4 its dequantized W_uk rows of a head or
 * the DSA indexer's transposed query (dsa_score.c). */
float *scratch(int slot, size_t n);

#endif
