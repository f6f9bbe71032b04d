/* DeepSeek-V4's KV compressors: every `rate` positions of a compressed layer fold into one entry,
 * a per-channel softmax-gated sum of their kv projections (gate + a learned per-slot bias), then
 * RMSNorm and RoPE at the window's first position. The overlapping kind (CSA) projects two
 * series per position and folds window w-1's first with window w's second (2 x rate slots).
 * What a slot keeps between calls is fixed: the pending positions of the open window (and, for
 * the overlapping kind, the closed window's first series). The indexer (CSA's lightning indexer)
 * runs its own compressor at index_head_dim and scores entries per query. */
#ifndef COLI_DSV4_COMPRESS_H
#define COLI_DSV4_COMPRESS_H
#include "model/blocks.h"

typedef struct {
    int rate, width, overlap; /* entry width; overlap: two series (CSA) */
    float eps;
    QMat kv, gate;     /* [(1 + overlap) * width][hidden] */
    const float *bias; /* [rate][(1 + overlap) * width] */
    const float *norm; /* [width] */
} Dsv4Comp;

/* Reads {rate, overlap, tensors: kv, gate, position_bias, norm} at `width`; 0 ok. */
int dsv4c_load(Dsv4Comp *c, const JsonValue *spec, int width, float eps, BlockLoader *L);
void dsv4c_free(Dsv4Comp *c);
/* f32 values of the per-slot state. */
size_t dsv4c_state_floats(const Dsv4Comp *c);
/* Feeds x[T][hidden] at positions p0..: every window that closes yields its entry (before RoPE)
 * into entries[k][width], k-th closing window first_w + k; returns how many closed (-1: no memory). */
int dsv4c_feed(const Dsv4Comp *c, float *state, const float *x, int T, int p0, float *entries, int *first_w);
/* Interleaved RoPE on the trailing rot dims of v[n] at pos (sign -1 undoes it). */
void dsv4_rope_tail(float *v, int n, int rot, const float *inv_freq, float scale, int pos, float sign);

#endif
