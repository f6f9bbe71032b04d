/* DeepSeek-V4's KV compressors (dsv4_compress.h), in transformers' order of operations. */
#include "model/dsv4_compress.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/fwd_alloc.h"
#include "kernels/ops.h"

int dsv4c_load(Dsv4Comp *c, const JsonValue *spec, int width, float eps, BlockLoader *L) {
    c->rate = bl_int(L, spec, "rate", 1, 1 << 16);
    c->overlap = json_get_bool(spec, "overlap", 0);
    c->width = width;
    c->eps = eps;
    const JsonValue *t = bl_obj(L, spec, "tensors");
    if (L->failed) return -1;
    const int C = (1 + c->overlap) * width, H = L->a->hidden;
    c->kv = bl_mat(L, t, "kv", C, H);
    c->gate = bl_mat(L, t, "gate", C, H);
    c->bias = bl_vec(L, t, "position_bias", c->rate, C, 0);
    c->norm = bl_vec(L, t, "norm", 1, width, 0);
    return L->failed ? -1 : 0;
}

void dsv4c_free(Dsv4Comp *c) {
    free((void *)c->bias);
    free((void *)c->norm);
}

/* tail: [rate][kv C | gate C] of the open window's positions; prev (overlap): [rate][kv W | gate W]
 * of the closed window's first series, its bias already added. */
size_t dsv4c_state_floats(const Dsv4Comp *c) {
    const size_t C = (size_t)(1 + c->overlap) * c->width;
    return (size_t)c->rate * 2 * C + (c->overlap ? (size_t)c->rate * 2 * c->width : 0);
}

int dsv4c_feed(const Dsv4Comp *c, float *state, const float *x, int T, int p0, float *entries, int *first_w) {
    const int m = c->rate, W = c->width, C = (1 + c->overlap) * W;
    float *tail = state, *prev = state + (size_t)m * 2 * C;
    float *kv = fwd_malloc(sizeof(float) * (size_t)T * C), *g = fwd_malloc(sizeof(float) * (size_t)T * C);
    float *lg = fwd_malloc(sizeof(float) * 2 * m), *vv = fwd_malloc(sizeof(float) * 2 * m);
    int n = 0;
    *first_w = p0 / m; /* the window open at p0 is the first that can close in this batch */
    if (!kv || !g || !lg || !vv) {
        n = -1;
        goto out;
    }
    matmul(kv, x, T, &c->kv, NULL);
    matmul(g, x, T, &c->gate, NULL);
    for (int t = 0; t < T; t++) {
        const int P = p0 + t, i = P % m, w = P / m;
        memcpy(tail + (size_t)i * 2 * C, kv + (size_t)t * C, sizeof(float) * C);
        memcpy(tail + (size_t)i * 2 * C + C, g + (size_t)t * C, sizeof(float) * C);
        if (i != m - 1) continue;
        float *e = entries + (size_t)n * W;
        for (int ch = 0; ch < W; ch++) {
            int k = 0;
            if (c->overlap && w > 0) /* window w-1's first series */
                for (int s = 0; s < m; s++, k++) {
                    vv[k] = prev[(size_t)s * 2 * W + ch];
                    lg[k] = prev[(size_t)s * 2 * W + W + ch];
                }
            const int off = c->overlap ? W : 0; /* this window's (second) series */
            for (int s = 0; s < m; s++, k++) {
                vv[k] = tail[(size_t)s * 2 * C + off + ch];
                lg[k] = tail[(size_t)s * 2 * C + C + off + ch] + c->bias[(size_t)s * C + off + ch];
            }
            float mx = -INFINITY, sum = 0, acc = 0;
            for (int j = 0; j < k; j++) mx = lg[j] > mx ? lg[j] : mx;
            for (int j = 0; j < k; j++) sum += (lg[j] = expf(lg[j] - mx));
            for (int j = 0; j < k; j++) acc += vv[j] * (lg[j] / sum);
            e[ch] = acc;
        }
        rmsnorm(e, e, c->norm, W, c->eps);
        if (c->overlap)
            for (int s = 0; s < m; s++) {
                memcpy(prev + (size_t)s * 2 * W, tail + (size_t)s * 2 * C, sizeof(float) * W);
                for (int ch = 0; ch < W; ch++)
                    prev[(size_t)s * 2 * W + W + ch] = tail[(size_t)s * 2 * C + C + ch] + c->bias[(size_t)s * C + ch];
            }
        n++;
    }
out:
    free(kv);
    free(g);
    free(lg);
    free(vv);
    return n;
}

void dsv4_rope_tail(float *v, int n, int rot, const float *inv_freq, float scale, int pos, float sign) {
    float *r = v + n - rot;
    for (int i = 0; i < rot / 2; i++) {
        float ang = inv_freq[i] * (float)pos; /* float product, as transformers computes it */
        float c = (float)cos((double)ang) * scale, s = sign * (float)sin((double)ang) * scale;
        float x0 = r[2 * i], x1 = r[2 * i + 1];
        r[2 * i] = x0 * c - x1 * s;
        r[2 * i + 1] = x1 * c + x0 * s;
    }
}
