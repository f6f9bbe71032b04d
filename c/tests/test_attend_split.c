/* kv_attend_split (v heads of another size than q/k, optional sinks) against a double-precision
 * reference, for each cache type; with vd == hd it also agrees with the kernels' attend (sinks
 * included), and a head's result does not depend on the group it is computed with. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model/kv_attend_split.h"

static float rnd(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return ((*s >> 8) / 16777216.0f) * 2 - 1;
}

static float stored(QType t, const unsigned char *row, int i) {
    return t == QT_F32   ? ((const float *)row)[i]
           : t == QT_F16 ? f16_to_f32(((const uint16_t *)row)[i])
                         : bf16_to_f32(((const uint16_t *)row)[i]);
}

void test_attend_split(void) {
    const QType types[3] = {QT_F32, QT_F16, QT_BF16};
    const int dims[][2] = {{48, 32}, {32, 48}, {24, 24}, {192, 128}}, ns[] = {1, 5, 70};
    unsigned seed = 11;
    double worst = 0, worst_same = 0;
    int alone = 1;
    for (int ti = 0; ti < 3; ti++)
        for (size_t di = 0; di < sizeof dims / sizeof *dims; di++)
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
                for (int with_sinks = 0; with_sinks < 2; with_sinks++) {
                    const int hd = dims[di][0], vd = dims[di][1], n = ns[ni], g = 3;
                    const QType t = types[ti];
                    const size_t es = kv_elem_size(t), stride = (size_t)(hd + vd) * es;
                    unsigned char *cache = malloc(stride * n);
                    float q[3 * 192], row[192], sinks[3], o[3 * 128 + 3 * 192], o1[192], sc[70];
                    for (int i = 0; i < g * hd; i++) q[i] = 2 * rnd(&seed);
                    for (int i = 0; i < g; i++) sinks[i] = 2 * rnd(&seed);
                    for (int j = 0; j < n; j++) {
                        for (int d = 0; d < hd; d++) row[d] = rnd(&seed);
                        kv_store_row(t, row, hd, cache + j * stride);
                        for (int d = 0; d < vd; d++) row[d] = rnd(&seed);
                        kv_store_row(t, row, vd, cache + j * stride + hd * es);
                    }
                    const float scale = 1.0f / sqrtf((float)hd);
                    const KvKernels *kk = kv_kernels(t);
                    kv_attend_split(kk, q, g, hd, vd, cache, cache + hd * es, stride, n, scale, with_sinks ? sinks : NULL, sc, o);
                    for (int i = 0; i < g; i++) {
                        double s[70], mx = with_sinks ? sinks[i] : -INFINITY, sum = 0;
                        for (int j = 0; j < n; j++) {
                            s[j] = 0;
                            for (int d = 0; d < hd; d++) s[j] += (double)q[i * hd + d] * stored(t, cache + j * stride, d);
                            s[j] *= scale;
                            mx = fmax(mx, s[j]);
                        }
                        for (int j = 0; j < n; j++) sum += (s[j] = exp(s[j] - mx));
                        if (with_sinks) sum += exp(sinks[i] - mx);
                        for (int d = 0; d < vd; d++) {
                            double r = 0;
                            for (int j = 0; j < n; j++) r += s[j] / sum * stored(t, cache + j * stride + hd * es, d);
                            worst = fmax(worst, fabs(r - o[i * vd + d]));
                        }
                    }
                    kv_attend_split(kk, q + (g - 1) * hd, 1, hd, vd, cache, cache + hd * es, stride, n, scale,
                                    with_sinks ? sinks + g - 1 : NULL, sc, o1);
                    alone &= !memcmp(o1, o + (g - 1) * vd, sizeof(float) * vd);
                    if (hd == vd) { /* the kernels' attend computes the same */
                        float o2[3 * 192], *sc2 = malloc(sizeof(float) * kv_attend_scratch(1, g, hd, n));
                        kk->attend(q, g, hd, cache, cache + hd * es, stride, n, scale, with_sinks ? sinks : NULL, sc2, o2);
                        free(sc2);
                        for (int i = 0; i < g * hd; i++) worst_same = fmax(worst_same, fabs(o2[i] - o[i]));
                    }
                    free(cache);
                }
    CHECK(worst < 1e-5, "split attention differs from the double reference by %g", worst);
    CHECK(worst_same < 1e-5, "split attention with vd == hd differs from the kernels' attend by %g", worst_same);
    CHECK(alone, "split attention: a head's result depends on its group");
}
