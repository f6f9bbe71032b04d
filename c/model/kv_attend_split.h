/* Attention for heads whose values are narrower (or wider) than their queries and keys
 * (MiMo-V2-Flash: q/k heads of 192, v heads of 128), which the KvAttendFn kernels, one head
 * size for both, do not cover. */
#ifndef COLI_KV_ATTEND_SPLIT_H
#define COLI_KV_ATTEND_SPLIT_H
#include <stddef.h>

#include "kernels/kv_kernels.h"

/* The g query heads q[i*hd ..] attend over positions 0..n-1 (K row j at k + j*stride bytes,
 * hd values; V row j at v + j*stride, vd values): o[i*vd ..] = sum_j p_ij V_j with p_i the
 * softmax of scale * q_i . K_j, joined by sinks[i] (a logit without a value row) when sinks
 * is not NULL. sc: scratch for n floats. Same result whatever g, the batch or the thread. */
void kv_attend_split(const KvKernels *kk, const float *q, int g, int hd, int vd, const void *k, const void *v, size_t stride,
                     int n, float scale, const float *sinks, float *sc, float *o);

#endif
