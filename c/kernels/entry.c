/* The kernel families' entry points for the rest of the engine: each calls the set in use
 * (kern, dispatch.c). matmul and the other ops (ops.c) read kern the same way. */
#include "kernels/kernels.h"

void delta_rule_recurrent(const DeltaIn *in, float *S, float *o) { kern.delta_recurrent(in, S, o); }
void delta_rule_chunked(const DeltaIn *in, float *S, float *o, float *work) { kern.delta_chunked(in, S, o, work); }
void kda_recurrent(const DeltaIn *in, float *S, float *o) { kern.kda_recurrent(in, S, o); }
void kda_chunked(const DeltaIn *in, float *S, float *o, float *work) { kern.kda_chunked(in, S, o, work); }

void mla_absorb(float *o, size_t ostep, const float *q, size_t qstep, int tn, const float *w, size_t wstride, int dn, int kl) {
    kern.mla_absorb(o, ostep, q, qstep, tn, w, wstride, dn, kl);
}

void dsa_scores(const float *q, const float *w, int nh, int hd, const unsigned char *keys, size_t stride, int n, float scale,
                float wscale, float *s) {
    kern.dsa_scores(q, w, nh, hd, keys, stride, n, scale, wscale, s);
}

const KvKernels *kv_kernels(QType t) {
    const int i = kv_type_index(t);
    return i < 0 ? NULL : &kern.kv[i];
}
