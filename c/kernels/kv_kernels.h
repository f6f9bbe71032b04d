/* Kernels over the KV cache's storage type (f32, f16, bf16): row dot/axpy and a whole
 * attention head group. f16/bf16 rows are widened in registers. Each kernel set's table
 * (kernels/kernels.h) holds one KvKernels per storage type. */
#ifndef COLI_KV_KERNELS_H
#define COLI_KV_KERNELS_H
#include <stddef.h>

#include "kernels/quant.h"

/* The g query heads q[i*hd ..] (i < g) that share one KV head attend over positions 0..n-1,
 * whose K row j starts at k + j*stride bytes and V row j at v + j*stride:
 *   o[i*hd ..] = sum_j softmax_j(scale * q_i . K_j) * V_j.
 * sinks: NULL, or one learned logit per head (sinks[i]) that joins each head's softmax without
 * a value row, so the weights sum to less than one (gpt-oss).
 * sc is scratch for kv_attend_scratch(1, g, hd, n) floats. Each head's result depends only on
 * its own inputs (not on g, the batch or the thread), so batched prefill equals token by token. */
typedef void (*KvAttendFn)(const float *q, int g, int hd, const void *k, const void *v, size_t stride, int n, float scale,
                           const float *sinks, float *sc, float *o);
/* The same for tq consecutive query positions at once (causal): position t < tq, whose g heads
 * are q + t*qstep (floats) and whose result goes to o + t*ostep, attends over positions
 * 0..n+t-1, or with window > 0 only its last window of them (n <= window). Each K/V row read
 * then serves all tq*g query rows. Every row gets the bits that KvAttendFn gives it alone over
 * its own positions. sc: kv_attend_scratch(tq, g, hd, n) floats. */
typedef void (*KvAttendBlockFn)(const float *q, size_t qstep, int tq, int g, int hd, const void *k, const void *v, size_t stride,
                                int n, int window, float scale, const float *sinks, float *sc, float *o, size_t ostep);

typedef struct {
    float (*dot)(const float *q, const void *row, int n);    /* q . row */
    void (*axpy)(float w, const void *row, int n, float *o); /* o += w * row */
    KvAttendFn attend;
    KvAttendBlockFn attend_block;
} KvKernels;

/* Positions per K tile (a multiple of the score steps, 6 and 8) and per V tile of the SIMD
 * kernels, whose rows are widened to floats once per tile. */
#define KV_ATT_KT 24
#define KV_ATT_PT 32
/* Floats of scratch an attend_block call needs (attend: tq = 1). */
size_t kv_attend_scratch(int tq, int g, int hd, int n);
/* Positions a block attends together when g query heads share a KV head over span positions:
 * ~64 query rows, fewer where their scores (rows x positions) would pass 4M floats; at least 1. */
int kv_attend_block_positions(int g, int span);

/* Kernels for rows stored as t (QT_F32, QT_F16 or QT_BF16) in the current kernel set; NULL for
 * another type. kv_kernels_for (kernels/kernels.h) names the set. */
const KvKernels *kv_kernels(QType t);
/* The index of t in a set's kv[] (0 f32, 1 f16, 2 bf16), -1 for another type. */
int kv_type_index(QType t);
size_t kv_elem_size(QType t);
/* dst[0..n) = x[0..n) stored as t (round to nearest even). */
void kv_store_row(QType t, const float *x, int n, void *dst);
int kv_type_from_name(const char *s, QType *out); /* "f16", "bf16", "f32"; 0 ok */

#endif
