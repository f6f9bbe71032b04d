/* Kernels over the KV cache's storage type (f32, f16, bf16): row dot/axpy and a whole
 * attention head group. f16/bf16 rows are widened in registers. The set follows the engine's
 * kernels (kernels_init / kernels_use): portable, AVX2+F16C, or AVX-512. */
#ifndef COLI_KV_KERNELS_H
#define COLI_KV_KERNELS_H
#include <stddef.h>

#include "quant.h"

/* The g query heads q[i*hd ..] (i < g) that share one KV head attend over positions 0..n-1,
 * whose K row j starts at k + j*stride bytes and V row j at v + j*stride:
 *   o[i*hd ..] = sum_j softmax_j(scale * q_i . K_j) * V_j.
 * sinks: NULL, or one learned logit per head (sinks[i]) that joins each head's softmax without
 * a value row, so the weights sum to less than one (gpt-oss).
 * sc is scratch for g*n floats. Each head's result depends only on its own inputs (not on g,
 * the batch or the thread), so batched prefill equals token by token. */
typedef void (*KvAttendFn)(const float *q, int g, int hd, const void *k, const void *v, size_t stride, int n,
                           float scale, const float *sinks, float *sc, float *o);

typedef struct {
    float (*dot)(const float *q, const void *row, int n);            /* q . row */
    void (*axpy)(float w, const void *row, int n, float *o);         /* o += w * row */
    KvAttendFn attend;
} KvKernels;

/* Kernels for rows stored as t (QT_F32, QT_F16 or QT_BF16) in the current kernel set. */
const KvKernels *kv_kernels(QType t);
/* The same for an explicit set (tests compare each with the portable one); NULL if not built. */
const KvKernels *kv_kernels_for(KernIsa isa, QType t);
size_t kv_elem_size(QType t);
/* dst[0..n) = x[0..n) stored as t (round to nearest even). */
void kv_store_row(QType t, const float *x, int n, void *dst);
int kv_type_from_name(const char *s, QType *out); /* "f16", "bf16", "f32"; 0 ok */

#endif
