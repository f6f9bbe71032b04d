/* The small-batch kernel (c/kernels/vnni_small.c) of the vnni and amx sets: at most VNNI_SMALL_T positions,
 * each weight block read once for all of them, bit-identical to the portable dots. */
#ifndef COLI_KERNELS_VNNI_SMALL_H
#define COLI_KERNELS_VNNI_SMALL_H
#include "kernels/quant.h"

/* Positions per call: the amx set sends a decode step's rows or the tail past whole 16-position
 * tile groups here rather than to the tiles, whose cost hardly depends on the positions; the
 * vnni set sends every batch, this many positions at a time. */
#define VNNI_SMALL_T 8

/* Bytes of the small layout for n positions of nb blocks. */
size_t vnni_small_pack_bytes(int n, int nb);
/* Positions t0..t0+n-1 of a into the small layout. */
void vnni_small_pack(const QAct *a, int t0, int n, int8_t *dst);
/* y[i*ldy + r] = row r . position t0+i for r < nr16 (a multiple of 16), i < n <= VNNI_SMALL_T. */
void vnni_small_q4(const unsigned char *w, size_t row_bytes, int nr16, const QAct *a, int t0, int n, const int8_t *packed,
                   float *y, size_t ldy);
void vnni_small_q8(const unsigned char *w, size_t row_bytes, int nr16, const QAct *a, int t0, int n, const int8_t *packed,
                   float *y, size_t ldy);
void vnni_small_q6(const unsigned char *w, size_t row_bytes, int nr16, const QAct *a, int t0, int n, const int8_t *packed,
                   float *y, size_t ldy);

#endif
