/* The DSA indexer's scores of one query over a run of keys (c/model/dsa_indexer.c):
 *   s[j] = sum over heads h, in order, of (d > 0 ? w[h] * wscale * d : 0), d = (q_h . k_j) * scale
 * q: nh rows of hd floats; key j: hd f32 at keys + j * stride. The portable set takes each dot
 * with the kernel set's row dot; the x86 sets keep the heads in vector lanes and broadcast each
 * key element into fused multiply-adds (no horizontal sums, four keys per pass), so a dot's
 * rounding differs between sets, as the row dots' already did. */
#ifndef COLI_DSA_SCORE_H
#define COLI_DSA_SCORE_H
#include <stddef.h>


typedef void (*DsaScoreFn)(const float *q, const float *w, int nh, int hd, const unsigned char *keys, size_t stride, int n,
                           float scale, float wscale, float *s);

/* Through the current kernel set (kern.dsa_scores). */
void dsa_scores(const float *q, const float *w, int nh, int hd, const unsigned char *keys, size_t stride, int n, float scale,
                float wscale, float *s);
/* Per-thread scratch floats the x86 versions take (slot 4: the query transposed, heads padded). */
size_t dsa_score_scratch(int nh, int hd);

#endif
