/* GQA attention with optional per-head q/k RMSNorm and NeoX-style (rotate-half) RoPE. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fwd_alloc.h"
#include "layers.h"
#include "ops.h"

/* Rotates the first rotary_dim dims of one head in place, HF rotate_half layout. */
static void rope(float *v, const Arch *a, int pos) {
    int half = a->rotary_dim / 2;
    for (int i = 0; i < half; i++) {
        float ang = a->inv_freq[i] * (float)pos; /* float product, as transformers computes it */
        float c = (float)cos((double)ang) * a->rope_scale, s = (float)sin((double)ang) * a->rope_scale;
        float x1 = v[i], x2 = v[i + half];
        v[i] = x1 * c - x2 * s;
        v[i + half] = x2 * c + x1 * s;
    }
}

void attention(const Model *m, int l, KvCache *kv, const float *x, int T, float *out) {
    const Arch *a = &m->a;
    const Layer *y = &m->layers[l];
    const int hd = a->head_dim, nh = a->n_heads, nkv = a->n_kv_heads, qd = nh * hd, kvd = nkv * hd;
    const int p0 = kv->n, group = nh / nkv;
    float *q = fwd_malloc(sizeof(float) * (size_t)T * qd);
    float *k = fwd_malloc(sizeof(float) * (size_t)T * kvd);
    float *v = fwd_malloc(sizeof(float) * (size_t)T * kvd);
    float *att = fwd_malloc(sizeof(float) * (size_t)T * qd);
    if (!q || !k || !v || !att) { free(q); free(k); free(v); free(att); return; } /* fwd_oom() tells the caller */
    matmul(q, x, T, &y->wq, y->bq);
    matmul(k, x, T, &y->wk, y->bk);
    matmul(v, x, T, &y->wv, y->bv);
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < nh; h++) {
            float *qh = q + (size_t)t * qd + h * hd;
            if (y->q_norm) rmsnorm(qh, qh, y->q_norm, hd, a->rms_eps);
            rope(qh, a, p0 + t);
        }
        for (int h = 0; h < nkv; h++) {
            float *kh = k + (size_t)t * kvd + h * hd;
            if (y->k_norm) rmsnorm(kh, kh, y->k_norm, hd, a->rms_eps);
            rope(kh, a, p0 + t);
        }
    }
    float *kc = kv->k + (size_t)l * kv->ctx * kvd, *vc = kv->v + (size_t)l * kv->ctx * kvd;
    memcpy(kc + (size_t)p0 * kvd, k, sizeof(float) * (size_t)T * kvd);
    memcpy(vc + (size_t)p0 * kvd, v, sizeof(float) * (size_t)T * kvd);
    const float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < nh; h++) {
            const int n = p0 + t + 1, kh = h / group;
            const float *qh = q + (size_t)t * qd + h * hd;
            float *sc = scratch(1, (size_t)n);
            if (!sc) continue; /* out of memory: fwd_oom() fails the pass */
            for (int j = 0; j < n; j++) sc[j] = kern.dot(qh, kc + (size_t)j * kvd + kh * hd, hd) * scale;
            softmax(sc, n);
            float *o = att + (size_t)t * qd + h * hd;
            memset(o, 0, sizeof(float) * hd);
            for (int j = 0; j < n; j++) {
                const float *vj = vc + (size_t)j * kvd + kh * hd, w = sc[j];
                for (int d = 0; d < hd; d++) o[d] += w * vj[d];
            }
        }
    }
    matmul(out, att, T, &y->wo, y->bo);
    free(q); free(k); free(v); free(att);
}
