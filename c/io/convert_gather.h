/* convert-jobs whose source rows are not contiguous rows of a float tensor: a strided gather
 * (transposed or interleaved sources, gpt-oss's fused experts) and MXFP4 rows (gpt-oss
 * releases: e2m1 nibbles with an e8m0 scale per 32 values, in a separate scales tensor). */
#ifndef COLI_CONVERT_GATHER_H
#define COLI_CONVERT_GATHER_H
#include "kernels/quant.h"

/* The job's fields after the common eight (from the tab before them), or NULL when it is an
 * ordinary job. */
const char *gather_fields(const char *line);
/* Runs one such job: rows x cols of source dt at (src, soff), written as qt at (dfd, doff),
 * weighted by imp (cols importance weights, or NULL: lowbit_quantize.h). 0 ok; -1 with the
 * reason on stderr. */
int gather_job(const char *fields, const char *src, long long soff, const char *dt, long long rows, long long cols, int dfd,
               long long doff, QType qt, const float *imp);
/* MXFP4 -> f32: n values from blocks (n/2 bytes, low nibble first) and scales (n/32 bytes). */
void mxfp4_dequant_row(const unsigned char *blocks, const unsigned char *scales, long long n, float *dst);

#endif
