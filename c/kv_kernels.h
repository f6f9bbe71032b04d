/* Row kernels over the KV cache's storage type: f32 rows go through the engine's float kernels
 * unchanged; f16/bf16 rows are widened in registers (F16C/AVX2 when the engine runs its AVX2
 * kernels, a portable loop otherwise; the choice follows kernels_init at kv_init time). */
#ifndef COLI_KV_KERNELS_H
#define COLI_KV_KERNELS_H
#include <stddef.h>

#include "quant.h"

typedef struct {
    float (*dot)(const float *q, const void *row, int n);            /* q . row */
    void (*axpy)(float w, const void *row, int n, float *o);         /* o += w * row */
} KvKernels;

/* Kernels for rows stored as t (QT_F16 or QT_BF16); NULL for QT_F32, whose rows are plain floats. */
const KvKernels *kv_kernels(QType t);
size_t kv_elem_size(QType t);
/* dst[0..n) = x[0..n) stored as t (round to nearest even). */
void kv_store_row(QType t, const float *x, int n, void *dst);
int kv_type_from_name(const char *s, QType *out); /* "f16", "bf16", "f32"; 0 ok */

#endif
