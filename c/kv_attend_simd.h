/* One attention head group (KvAttendFn) in SIMD, included once per instruction set and element
 * type by kv_attend_x86.c, which defines:
 *   VT W TGT TGT_INLINE   vector type, lanes, function attributes
 *   VZERO VSET1 VLOADF VSTORE VFMA VMUL VSUB VMAX VHSUM VHMAX VEXP   vector ops
 *   STORE4(p, a, b, c, d, scale)   p[0..3] = scale * (the lane sums of a, b, c, d)
 *   LOADE(row, i)         W elements of a cache row from element i, as floats
 *   HCMAX                 query heads whose V accumulators fit in registers at once (<= 4)
 *   ATT_NAME ATT_REF      this function and the portable one it leaves hd % W != 0 to
 * Scores go four positions at a time (one horizontal reduction for four dots), over tiles of
 * positions small enough that the K tile stays in L1 while every head of the group reads it;
 * values accumulate in registers for up to HCMAX heads x 4 vectors of dimensions per pass over
 * the V rows. The 1/sum of the softmax is applied once to the output. */

#ifndef ATT_EXP_BODY
/* exp for x <= 0 (softmax numerators): 2^round(x/ln2) times a degree-6 polynomial on the
 * remainder (Cephes expf), within 2 ulp of expf; below -87.3 it clamps to ~1e-38 (not 0).
 * FMA(a, b, c) = a*b + c, FNMA(a, b, c) = c - a*b. */
#define ATT_EXP_BODY(VT, SET1, MAX, MUL, ADD, FMA, FNMA, ROUND, CVTI, SLLI, ADDI, SET1I, CASTI)                \
    x = MAX(x, SET1(-87.33654f));                                                                       \
    VT nf = ROUND(MUL(x, SET1(1.44269504088896341f)));                                                  \
    VT r = FNMA(nf, SET1(0.693359375f), x);                                                             \
    r = FNMA(nf, SET1(-2.12194440e-4f), r);                                                             \
    VT p = SET1(1.9875691500e-4f);                                                                      \
    p = FMA(p, r, SET1(1.3981999507e-3f));                                                              \
    p = FMA(p, r, SET1(8.3334519073e-3f));                                                              \
    p = FMA(p, r, SET1(4.1665795894e-2f));                                                              \
    p = FMA(p, r, SET1(1.6666665459e-1f));                                                              \
    p = FMA(p, r, SET1(5.0000001201e-1f));                                                              \
    VT y = ADD(FMA(MUL(p, r), r, r), SET1(1.0f));                                                       \
    return MUL(y, CASTI(SLLI(ADDI(CVTI(nf), SET1I(127)), 23)));
#endif

#ifndef ATT_EXP_ONLY
#define ATT_TILE 64
#define ATT_CAT_(a, b) a##b
#define ATT_CAT(a, b) ATT_CAT_(a, b)
#define ATT_VACC ATT_CAT(ATT_NAME, _vacc)
#define ATT_SOFTMAX ATT_CAT(ATT_NAME, _softmax)

/* s[0..n) = exp(s - max); returns 1/sum. sink: an extra logit in the max and the sum (no value
 * row), -INFINITY for none. */
TGT_INLINE float ATT_SOFTMAX(float *s, int n, float sink) {
    VT m = VSET1(-INFINITY);
    int j = 0;
    for (; j + W <= n; j += W) m = VMAX(m, VLOADF(s + j));
    float mx = VHMAX(m);
    for (int t = j; t < n; t++) mx = s[t] > mx ? s[t] : mx;
    mx = sink > mx ? sink : mx;
    const VT vmx = VSET1(mx);
    VT sum = VZERO();
    for (j = 0; j + W <= n; j += W) {
        VT e = VEXP(VSUB(VLOADF(s + j), vmx));
        VSTORE(s + j, e);
        sum = VADD(sum, e);
    }
    if (j < n) { /* the tail through one padded vector; pads are -inf: exp gives ~0, not summed */
        float pad[W];
        for (int t = 0; t < W; t++) pad[t] = j + t < n ? s[j + t] : -INFINITY;
        VT e = VEXP(VSUB(VLOADF(pad), vmx));
        VSTORE(pad, e);
        for (int t = 0; j + t < n; t++) s[j + t] = pad[t];
    }
    float tot = VHSUM(sum);
    for (; j < n; j++) tot += s[j];
    if (sink > -INFINITY) tot += expf(sink - mx);
    return 1.0f / tot;
}

/* o[i*hd + d0 ..] for hc heads and nvc vectors of dimensions from d0: one pass over V. */
TGT_INLINE void ATT_VACC(const float *w, int n, const unsigned char *vb, size_t stride, int d0, const int hc,
                         const int nvc, const float *inv, float *o, int hd) {
    VT acc[HCMAX][4];
#pragma GCC unroll 4
    for (int i = 0; i < hc; i++)
#pragma GCC unroll 4
        for (int c = 0; c < nvc; c++) acc[i][c] = VZERO();
    for (int j = 0; j < n; j++) {
        const unsigned char *r = vb + (size_t)j * stride;
        VT x[4];
#pragma GCC unroll 4
        for (int c = 0; c < nvc; c++) x[c] = LOADE(r, d0 + c * W);
#pragma GCC unroll 4
        for (int i = 0; i < hc; i++) {
            const VT wv = VSET1(w[(size_t)i * n + j]);
#pragma GCC unroll 4
            for (int c = 0; c < nvc; c++) acc[i][c] = VFMA(wv, x[c], acc[i][c]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < hc; i++)
#pragma GCC unroll 4
        for (int c = 0; c < nvc; c++) VSTORE(o + (size_t)i * hd + d0 + c * W, VMUL(acc[i][c], VSET1(inv[i])));
}

TGT void ATT_NAME(const float *q, int g, int hd, const void *k, const void *v, size_t stride, int n, float scale,
                  const float *sinks, float *sc, float *o) {
    if (hd % W) { ATT_REF(q, g, hd, k, v, stride, n, scale, sinks, sc, o); return; }
    const int nv = hd / W;
    const unsigned char *kb = k, *vb = v;
    for (int j0 = 0; j0 < n; j0 += ATT_TILE) {
        const int j1 = j0 + ATT_TILE < n ? j0 + ATT_TILE : n;
        for (int i = 0; i < g; i++) {
            const float *qi = q + (size_t)i * hd;
            float *s = sc + (size_t)i * n;
            int j = j0;
            for (; j + 4 <= j1; j += 4) {
                const unsigned char *r = kb + (size_t)j * stride;
                VT a0 = VZERO(), a1 = VZERO(), a2 = VZERO(), a3 = VZERO();
                for (int c = 0; c < nv; c++) {
                    const VT qv = VLOADF(qi + c * W);
                    a0 = VFMA(qv, LOADE(r, c * W), a0);
                    a1 = VFMA(qv, LOADE(r + stride, c * W), a1);
                    a2 = VFMA(qv, LOADE(r + 2 * stride, c * W), a2);
                    a3 = VFMA(qv, LOADE(r + 3 * stride, c * W), a3);
                }
                STORE4(s + j, a0, a1, a2, a3, scale);
            }
            for (; j < j1; j++) {
                const unsigned char *r = kb + (size_t)j * stride;
                VT a = VZERO();
                for (int c = 0; c < nv; c++) a = VFMA(VLOADF(qi + c * W), LOADE(r, c * W), a);
                s[j] = VHSUM(a) * scale;
            }
        }
    }
    for (int i0 = 0; i0 < g; i0 += HCMAX) {
        const int hc = g - i0 < HCMAX ? g - i0 : HCMAX;
        float inv[HCMAX];
        for (int i = 0; i < hc; i++) inv[i] = ATT_SOFTMAX(sc + (size_t)(i0 + i) * n, n, sinks ? sinks[i0 + i] : -INFINITY);
        const float *w = sc + (size_t)i0 * n;
        float *oi = o + (size_t)i0 * hd;
        for (int c0 = 0; c0 < nv; c0 += 4) {
            const int nvc = nv - c0 < 4 ? nv - c0 : 4, d0 = c0 * W;
#define ATT_CASE(H, C) case (H) * 8 + (C): ATT_VACC(w, n, vb, stride, d0, H, C, inv, oi, hd); break;
            switch (hc * 8 + nvc) {
                ATT_CASE(1, 1) ATT_CASE(1, 2) ATT_CASE(1, 3) ATT_CASE(1, 4)
#if HCMAX >= 2
                ATT_CASE(2, 1) ATT_CASE(2, 2) ATT_CASE(2, 3) ATT_CASE(2, 4)
#endif
#if HCMAX >= 3
                ATT_CASE(3, 1) ATT_CASE(3, 2) ATT_CASE(3, 3) ATT_CASE(3, 4)
#endif
#if HCMAX >= 4
                ATT_CASE(4, 1) ATT_CASE(4, 2) ATT_CASE(4, 3) ATT_CASE(4, 4)
#endif
            default: break;
            }
#undef ATT_CASE
        }
    }
}

#undef ATT_VACC
#undef ATT_SOFTMAX
#endif /* ATT_EXP_ONLY */
