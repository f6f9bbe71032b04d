/* Hyper-connections (hyper_conn.h), computed in f32 in transformers' order of operations. */
#include "model/hyper_conn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/fwd_alloc.h"
#include "kernels/ops.h"

HyperConn *hc_load(BlockLoader *L, const JsonValue *spec, int head) {
    if (!spec || spec->type != JSON_OBJ) {
        bl_fail(L, "hyper-connection spec is not an object; re-run coli convert");
        return NULL;
    }
    HyperConn *h = calloc(1, sizeof *h);
    if (!h) {
        bl_fail(L, "out of memory");
        return NULL;
    }
    h->n = bl_int(L, spec, "n", 1, 64);
    h->iters = head ? 0 : bl_int(L, spec, "iters", 1, 1000);
    h->eps = (float)bl_num(L, spec, "eps", 0.0, 1.0);
    h->norm_eps = (float)bl_num(L, spec, "norm_eps", 0.0, 1.0);
    const JsonValue *t = bl_obj(L, spec, "tensors");
    if (L->failed) {
        free(h);
        return NULL;
    }
    const int m = head ? h->n : (2 + h->n) * h->n;
    h->fn = bl_vec(L, t, "fn", m, h->n * L->a->hidden, 0);
    h->base = bl_vec(L, t, "base", 1, m, 0);
    h->scale = bl_vec(L, t, "scale", 1, head ? 1 : 3, 0);
    if (L->failed) {
        hc_free(h);
        return NULL;
    }
    return h;
}

void hc_free(HyperConn *h) {
    if (!h) return;
    free((void *)h->fn);
    free((void *)h->base);
    free((void *)h->scale);
    free(h);
}

static float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

/* mix[T][m] = fn . (xs[t] / rms(xs[t])): the flattened streams, normalized without a weight. */
static float *mixes(const HyperConn *h, const float *xs, int T, int H, int m) {
    const int nH = h->n * H;
    float *flat = fwd_malloc(sizeof(float) * (size_t)T * nH), *mix = fwd_malloc(sizeof(float) * (size_t)T * m);
    if (!flat || !mix) {
        free(flat);
        free(mix);
        return NULL;
    }
    for (int t = 0; t < T; t++) {
        const float *x = xs + (size_t)t * nH;
        float ss = 0;
        for (int i = 0; i < nH; i++) ss += x[i] * x[i];
        const float r = 1.0f / sqrtf(ss / (float)nH + h->norm_eps);
        for (int i = 0; i < nH; i++) flat[(size_t)t * nH + i] = x[i] * r;
    }
    matmul_f32(mix, flat, T, h->fn, m, nH);
    free(flat);
    return mix;
}

void hc_pre(const HyperConn *h, const float *xs, int T, int H, float *collapsed, float *post, float *comb) {
    const int n = h->n, m = (2 + n) * n;
    float *mix = mixes(h, xs, T, H, m);
    if (!mix) return; /* fwd_oom() tells the caller */
    for (int t = 0; t < T; t++) {
        const float *w = mix + (size_t)t * m;
        float pre[64], *c = comb + (size_t)t * n * n;
        for (int j = 0; j < n; j++) {
            pre[j] = sigm(w[j] * h->scale[0] + h->base[j]) + h->eps;
            post[(size_t)t * n + j] = 2.0f * sigm(w[n + j] * h->scale[1] + h->base[n + j]);
        }
        for (int j = 0; j < n; j++) { /* row j: softmax over k, then + eps */
            float *row = c + j * n, mx = -INFINITY, sum = 0;
            for (int k = 0; k < n; k++) {
                row[k] = w[2 * n + j * n + k] * h->scale[2] + h->base[2 * n + j * n + k];
                mx = row[k] > mx ? row[k] : mx;
            }
            for (int k = 0; k < n; k++) sum += (row[k] = expf(row[k] - mx));
            for (int k = 0; k < n; k++) row[k] = row[k] / sum + h->eps;
        }
        for (int it = 0; it < h->iters; it++) { /* columns first, then rows and columns iters-1 times */
            if (it > 0)
                for (int j = 0; j < n; j++) {
                    float s = 0;
                    for (int k = 0; k < n; k++) s += c[j * n + k];
                    for (int k = 0; k < n; k++) c[j * n + k] /= s + h->eps;
                }
            for (int k = 0; k < n; k++) {
                float s = 0;
                for (int j = 0; j < n; j++) s += c[j * n + k];
                for (int j = 0; j < n; j++) c[j * n + k] /= s + h->eps;
            }
        }
        float *o = collapsed + (size_t)t * H;
        const float *x = xs + (size_t)t * n * H;
        for (int i = 0; i < H; i++) {
            float s = 0;
            for (int j = 0; j < n; j++) s += pre[j] * x[(size_t)j * H + i];
            o[i] = s;
        }
    }
    free(mix);
}

void hc_post(int n, float *xs, int T, int H, const float *out, const float *post, const float *comb) {
    float *old = fwd_malloc(sizeof(float) * (size_t)n * H);
    if (!old) return;
    for (int t = 0; t < T; t++) {
        float *x = xs + (size_t)t * n * H;
        const float *c = comb + (size_t)t * n * n, *p = post + (size_t)t * n, *o = out + (size_t)t * H;
        memcpy(old, x, sizeof(float) * (size_t)n * H);
        for (int k = 0; k < n; k++)
            for (int i = 0; i < H; i++) {
                float s = 0;
                for (int j = 0; j < n; j++) s += c[j * n + k] * old[(size_t)j * H + i];
                x[(size_t)k * H + i] = p[k] * o[i] + s;
            }
    }
    free(old);
}

void hc_head(const HyperConn *h, const float *xs, int T, int H, float *out) {
    const int n = h->n;
    float *mix = mixes(h, xs, T, H, n);
    if (!mix) return;
    for (int t = 0; t < T; t++) {
        float pre[64];
        for (int j = 0; j < n; j++) pre[j] = sigm(mix[(size_t)t * n + j] * h->scale[0] + h->base[j]) + h->eps;
        const float *x = xs + (size_t)t * n * H;
        for (int i = 0; i < H; i++) {
            float s = 0;
            for (int j = 0; j < n; j++) s += pre[j] * x[(size_t)j * H + i];
            out[(size_t)t * H + i] = s;
        }
    }
    free(mix);
}
