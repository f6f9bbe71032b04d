/* The converter's writer of GGUF low-bit blocks from floats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS), the
 * inverse of c/kernels/lowbit.c's decoders.
 *
 * Every scale is chosen by weighted least squares, not round-to-nearest: a block minimises
 * sum_j w_j (x_j - xq_j)^2 with w_j = imp[j] (the mean square of the activation that column
 * meets, from calibration: for y = W a, sum_j E[a_j^2] dW_j^2 is the output's error), or
 * w_j = 1 without calibration (plain squared error). Each sub-block tries ~20 candidate scales,
 * keeps the one with the least error, then the super-block's scale grid is fitted the same way,
 * and the codes are chosen again against the scales exactly as they decode (f16-rounded). */
#ifndef COLI_LOWBIT_QUANTIZE_H
#define COLI_LOWBIT_QUANTIZE_H
#include "kernels/quant.h"

/* 1 when qt can be written from floats: every type before the low-bit ones, and the low-bit
 * types above. The lattice i-quants (IQ1/IQ2/IQ3) are kept from GGUF files only. */
int qtype_writable(QType qt);

/* One row of cols floats as qt, into qtype_row_bytes(qt, cols) bytes. imp: cols importance
 * weights (>= 0) or NULL; the types before the low-bit ones ignore it (quantize_row).
 * 0 ok; -1 when qt is not writable or a low-bit row is not whole blocks. */
int quantize_row_weighted(QType qt, const float *x, const float *imp, int cols, void *dst);

#endif
