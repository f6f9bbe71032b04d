/* The gated delta rule for one value head (Qwen3.5/3.6 gated DeltaNet, as transformers'
 * torch_recurrent_gated_delta_rule / torch_chunk_gated_delta_rule compute it). Per position t,
 * with decay g_t <= 0 (log space) and learning rate beta_t:
 *   S = exp(g_t) S;  S += k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t
 * S is [dk][dv] row-major, updated in place. q is already L2-normalised and scaled; q, k and v
 * rows are `qs`, `ks`, `vs` floats apart, o rows `os`. Both forms compute the same function:
 * the recurrent one token by token (decode), the chunked one (prefill) through the WY/UT form
 * over chunks of DELTA_CHUNK positions, mostly dense products. Kimi's KDA is the same rule with
 * a decay per key channel (kda_*). */
#ifndef COLI_DELTA_RULE_H
#define COLI_DELTA_RULE_H
#include <stddef.h>

#define DELTA_CHUNK 64

typedef struct {
    const float *q, *k, *v; /* [T] rows of dk, dk, dv */
    size_t qs, ks, vs, os;
    const float *g, *beta; /* [T]; with gs > 0, g holds [T] rows of dk per-channel decays, gs apart */
    int T, dk, dv;
    size_t gs;
} DeltaIn;

void delta_rule_recurrent(const DeltaIn *in, float *S, float *o);
/* Kimi delta attention (KDA): the same rule with a decay per key channel, S[d][:] *= exp(g_t[d]);
 * needs gs > 0. The chunked form uses the same work size. */
void kda_recurrent(const DeltaIn *in, float *S, float *o);
void kda_chunked(const DeltaIn *in, float *S, float *o, float *work);
/* work: delta_rule_work_floats(dk, dv) floats */
void delta_rule_chunked(const DeltaIn *in, float *S, float *o, float *work);
size_t delta_rule_work_floats(int dk, int dv);

/* The short causal depthwise conv before the rule: x[T][cd] <- silu(sum_j w[c][j] window_j[c])
 * over [win; x], win holding the K-1 inputs before x (oldest first), moved on by T. 0, or -1
 * (win untouched) when memory ran out. */
int short_conv_silu(const float *w, int K, int cd, float *win, float *x, int T);

#endif
