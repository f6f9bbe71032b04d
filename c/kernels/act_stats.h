/* Activation statistics for calibrated quantization (`colibri calibrate`, `coli convert
 * --calibrate`): per weight matrix, the sum over positions of each input column's squared
 * activation, and the positions counted, as llama.cpp's imatrix collects them.
 *
 * A matrix is known by the address of its bytes: the loader names each container tensor it
 * points a QMat at (act_stats_name), and the expert cache re-points a slot's copy at the
 * expert it now holds (act_stats_alias), so streamed experts count as themselves. matmul and
 * matmul_fused record every x they multiply (act_stats_observe). Off unless act_stats_begin
 * ran, so serving pays one branch per matmul. */
#ifndef COLI_ACT_STATS_H
#define COLI_ACT_STATS_H
#include <stddef.h>

#include "kernels/quant.h"

extern int act_stats_on;

void act_stats_begin(void);
void act_stats_end(void);
/* Names the matrix whose bytes start at data (a container tensor's name, copied). */
void act_stats_name(const void *data, const char *name);
/* From now on bytes at copy are the matrix named at orig (a cache slot taking an expert). */
void act_stats_alias(const void *copy, const void *orig);
/* Adds x[T][w->cols]'s squares to w's sums; a matrix never named is not counted. */
void act_stats_observe(const QMat *w, const float *x, int T);
/* Writes the counted matrices (file format in act_stats.c). 0, or -1 with err set. */
int act_stats_write(const char *path, char *err, size_t errlen);
/* Matrices named and matrices with at least one position counted. */
void act_stats_counts(int *named, int *counted);

#endif
