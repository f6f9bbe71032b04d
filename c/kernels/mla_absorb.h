/* Latent attention's query absorption (c/model/block_attn_mla.c): one head's W_uk^T q_nope for a run
 * of positions, o[t][c] = sum over d < dn, in d order, of q[t][d] * w[d][c] for c < kl.
 * Each term is a multiply then an add (never fused), so every kernel set and every number of
 * positions gives the one-row scalar loop's bits: prefill through it equals decode. */
#ifndef COLI_MLA_ABSORB_H
#define COLI_MLA_ABSORB_H
#include <stddef.h>


/* o rows ostep floats apart, q rows qstep, w (dequantized W_uk rows of the head) wstride. */
typedef void (*MlaAbsorbFn)(float *o, size_t ostep, const float *q, size_t qstep, int tn, const float *w, size_t wstride, int dn,
                            int kl);

/* Through the current kernel set (kern.mla_absorb). */
void mla_absorb(float *o, size_t ostep, const float *q, size_t qstep, int tn, const float *w, size_t wstride, int dn, int kl);

#endif
