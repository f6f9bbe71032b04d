/* Per head: scores through the cache type's row dot, the softmax with its optional sink, the
 * value rows summed through axpy (kv_attend_split.h). */
#include <math.h>
#include <string.h>

#include "model/kv_attend_split.h"

void kv_attend_split(const KvKernels *kk, const float *q, int g, int hd, int vd, const void *k, const void *v, size_t stride,
                     int n, float scale, const float *sinks, float *sc, float *o) {
    const unsigned char *kb = k, *vb = v;
    for (int i = 0; i < g; i++) {
        const float *qi = q + (size_t)i * hd;
        float *oi = o + (size_t)i * vd, mx = sinks ? sinks[i] : -INFINITY;
        for (int j = 0; j < n; j++) {
            sc[j] = kk->dot(qi, kb + (size_t)j * stride, hd) * scale;
            mx = sc[j] > mx ? sc[j] : mx;
        }
        float sum = sinks ? expf(sinks[i] - mx) : 0.0f;
        for (int j = 0; j < n; j++) sum += (sc[j] = expf(sc[j] - mx));
        memset(oi, 0, sizeof(float) * (size_t)vd);
        const float inv = 1.0f / sum;
        for (int j = 0; j < n; j++) kk->axpy(sc[j] * inv, vb + (size_t)j * stride, vd, oi);
    }
}
