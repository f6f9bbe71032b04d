/* The gated delta rule: the chunked (prefill) form equals the recurrent (decode) form, over
 * several chunks and a partial one, from a non-zero state, and split at any point; and one
 * step matches the rule written out by hand. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels/delta_rule.h"

enum { T = 150, DK = 8, DV = 12 };

static float rnd(unsigned *s) {
    *s = *s * 1103515245u + 12345u;
    return ((float)((*s >> 8) & 0xffff) / 65536.0f) - 0.5f;
}

static float max_diff(const float *a, const float *b, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; i++) m = fmaxf(m, fabsf(a[i] - b[i]));
    return m;
}

void test_delta_rule(void) {
    static float q[T * DK], k[T * DK], v[T * DV], g[T], beta[T];
    static float o1[T * DV], o2[T * DV], o3[T * DV], S1[DK * DV], S2[DK * DV], S3[DK * DV];
    unsigned seed = 7;
    for (int t = 0; t < T; t++) {
        float nq = 0, nk = 0;
        for (int d = 0; d < DK; d++) {
            q[t * DK + d] = rnd(&seed);
            k[t * DK + d] = rnd(&seed);
        }
        for (int d = 0; d < DK; d++) {
            nq += q[t * DK + d] * q[t * DK + d];
            nk += k[t * DK + d] * k[t * DK + d];
        }
        for (int d = 0; d < DK; d++) {
            q[t * DK + d] /= sqrtf(nq) * sqrtf((float)DK);
            k[t * DK + d] /= sqrtf(nk);
        }
        for (int d = 0; d < DV; d++) v[t * DV + d] = 2 * rnd(&seed);
        g[t] = -0.3f * (rnd(&seed) + 0.5f) - (t % 37 == 0 ? 4.0f : 0.0f); /* a few strong decays */
        beta[t] = 0.5f + rnd(&seed);
    }
    for (int i = 0; i < DK * DV; i++) S1[i] = S2[i] = S3[i] = rnd(&seed);
    float *work = malloc(sizeof(float) * delta_rule_work_floats(DK, DV));
    DeltaIn in = {q, k, v, DK, DK, DV, DV, g, beta, T, DK, DV, 0};
    delta_rule_recurrent(&in, S1, o1);
    delta_rule_chunked(&in, S2, o2, work);
    float om = 0;
    for (int i = 0; i < T * DV; i++) om = fmaxf(om, fabsf(o1[i]));
    CHECK(om > 0.1f, "outputs are not trivial (max %g)", om);
    CHECK(max_diff(o1, o2, T * DV) <= 1e-5f * om, "chunked vs recurrent outputs differ by %g", max_diff(o1, o2, T * DV));
    CHECK(max_diff(S1, S2, DK * DV) <= 1e-5f, "chunked vs recurrent states differ by %g", max_diff(S1, S2, DK * DV));
    /* prefill of 70 positions, then 80 more from the state it left: the same as all at once */
    DeltaIn a = in, b = in;
    a.T = 70;
    b.q += 70 * DK;
    b.k += 70 * DK;
    b.v += 70 * DV;
    b.g += 70;
    b.beta += 70;
    b.T = T - 70;
    delta_rule_chunked(&a, S3, o3, work);
    delta_rule_chunked(&b, S3, o3 + 70 * DV, work);
    CHECK(max_diff(o1, o3, T * DV) <= 1e-5f * om, "split prefill differs by %g", max_diff(o1, o3, T * DV));
    CHECK(max_diff(S1, S3, DK * DV) <= 1e-5f, "split prefill state differs by %g", max_diff(S1, S3, DK * DV));
    /* one step by hand from S = 0, no decay: S = beta k v^T, o = beta (q . k) v */
    float S0[DK * DV] = {0}, o0[DV], g0 = 0, b0 = 0.75f, qk = 0;
    DeltaIn one = {q, k, v, DK, DK, DV, DV, &g0, &b0, 1, DK, DV, 0};
    delta_rule_recurrent(&one, S0, o0);
    for (int d = 0; d < DK; d++) qk += q[d] * k[d];
    float e = 0;
    for (int j = 0; j < DV; j++) e = fmaxf(e, fabsf(o0[j] - b0 * qk * v[j]));
    for (int d = 0; d < DK; d++)
        for (int j = 0; j < DV; j++) e = fmaxf(e, fabsf(S0[d * DV + j] - b0 * k[d] * v[j]));
    CHECK(e < 1e-6f, "one step differs from the rule by %g", e);
    /* KDA: one decay per key channel. Equal channels give the scalar rule; distinct ones agree
     * between the chunked and the recurrent form, whole or split. */
    static float gk[T * DK], o4[T * DV], o5[T * DV], S4[DK * DV], S5[DK * DV], S6[DK * DV];
    for (int t = 0; t < T; t++)
        for (int d = 0; d < DK; d++) gk[t * DK + d] = g[t];
    for (int i = 0; i < DK * DV; i++) S4[i] = 0.25f;
    memcpy(S5, S4, sizeof S4);
    DeltaIn kin = in;
    kin.g = gk;
    kin.gs = DK;
    float Sg[DK * DV];
    for (int i = 0; i < DK * DV; i++) Sg[i] = 0.25f;
    delta_rule_recurrent(&in, Sg, o3);
    kda_chunked(&kin, S4, o4, work);
    CHECK(max_diff(o3, o4, T * DV) <= 1e-5f * om, "KDA with equal channels differs from the scalar rule by %g",
          max_diff(o3, o4, T * DV));
    for (int t = 0; t < T; t++) /* channel 0 forgets almost at once (its factored decays underflow) */
        for (int d = 0; d < DK; d++) gk[t * DK + d] = d ? -0.6f * (rnd(&seed) + 0.5f) * (float)(d + 1) / DK : -30.0f;
    for (int i = 0; i < DK * DV; i++) S4[i] = S5[i] = S6[i] = rnd(&seed);
    kda_recurrent(&kin, S4, o4);
    kda_chunked(&kin, S5, o5, work);
    CHECK(max_diff(o4, o5, T * DV) <= 1e-5f * om, "KDA chunked vs recurrent outputs differ by %g", max_diff(o4, o5, T * DV));
    CHECK(max_diff(S4, S5, DK * DV) <= 1e-5f, "KDA chunked vs recurrent states differ by %g", max_diff(S4, S5, DK * DV));
    DeltaIn ka = kin, kb = kin;
    ka.T = 70;
    kb.q += 70 * DK;
    kb.k += 70 * DK;
    kb.v += 70 * DV;
    kb.g += 70 * DK;
    kb.beta += 70;
    kb.T = T - 70;
    kda_chunked(&ka, S6, o5, work);
    kda_chunked(&kb, S6, o5 + 70 * DV, work);
    CHECK(max_diff(o4, o5, T * DV) <= 1e-5f * om, "KDA split prefill differs by %g", max_diff(o4, o5, T * DV));
    CHECK(max_diff(S4, S6, DK * DV) <= 1e-5f, "KDA split prefill state differs by %g", max_diff(S4, S6, DK * DV));
    free(work);
}
