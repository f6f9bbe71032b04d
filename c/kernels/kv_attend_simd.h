/* Attention over the KV cache in SIMD (KvAttendBlockFn, KvAttendFn), included once per
 * instruction set and element type by kv_attend_x86.c / kv_attend_neon.c, which define:
 *   VT W TGT TGT_INLINE   vector type, lanes, function attributes
 *   VZERO VSET1 VLOADF VSTORE VFMA VMUL VSUB VADD VMAX VEXP   vector ops
 *   VSELLT(x, lim, a, b)  per lane: x < lim ? a : b
 *   LOADE(row, i)         W elements of a cache row from element i, as floats
 *   LOADE_T               the cache's element type (its size)
 *   HCMAX                 query rows whose V accumulators fit in registers at once (<= 4)
 *   RBMAX                 row vectors (W query rows each) per score tile (<= 4)
 *   ATT_NAME ATT_BLOCK_NAME ATT_REF   these functions and the portable one for hd % W != 0
 * Query rows (every head of every position in the block) lie in vector lanes for the scores
 * and the softmax: each K element, widened once per tile, is broadcast to W rows, so a K row
 * read from memory serves them all and no dot needs a horizontal sum. Values accumulate with
 * lanes over dimensions, a tile of V rows (widened once) serving every query row. Per query
 * row the arithmetic is fixed whatever the block: its score is an FMA chain over d in order,
 * its softmax sum runs over positions in order, its output an FMA chain over positions in
 * order times 1/sum. So a row's bits depend on its own inputs only, not on the block size,
 * the group or the lane it lands in: batched prefill equals decode. */
#ifndef ATT_EXP_BODY
/* exp for x <= 0 (softmax numerators): 2^round(x/ln2) times a degree-6 polynomial on the
 * remainder (Cephes expf), within 2 ulp of expf; below -87.3 it clamps to ~1e-38 (not 0).
 * FMA(a, b, c) = a*b + c, FNMA(a, b, c) = c - a*b. */
#define ATT_EXP_BODY(VT, SET1, MAX, MUL, ADD, FMA, FNMA, ROUND, CVTI, SLLI, ADDI, SET1I, CASTI) \
    x = MAX(x, SET1(-87.33654f));                                                               \
    VT nf = ROUND(MUL(x, SET1(1.44269504088896341f)));                                          \
    VT r = FNMA(nf, SET1(0.693359375f), x);                                                     \
    r = FNMA(nf, SET1(-2.12194440e-4f), r);                                                     \
    VT p = SET1(1.9875691500e-4f);                                                              \
    p = FMA(p, r, SET1(1.3981999507e-3f));                                                      \
    p = FMA(p, r, SET1(8.3334519073e-3f));                                                      \
    p = FMA(p, r, SET1(4.1665795894e-2f));                                                      \
    p = FMA(p, r, SET1(1.6666665459e-1f));                                                      \
    p = FMA(p, r, SET1(5.0000001201e-1f));                                                      \
    VT y = ADD(FMA(MUL(p, r), r, r), SET1(1.0f));                                               \
    return MUL(y, CASTI(SLLI(ADDI(CVTI(nf), SET1I(127)), 23)));
#endif

#ifndef ATT_EXP_ONLY
#define ATT_CAT_(a, b) a##b
#define ATT_CAT(a, b) ATT_CAT_(a, b)
#define ATT_QK ATT_CAT(ATT_NAME, _qk)
#define ATT_VACC ATT_CAT(ATT_NAME, _vacc)
#define ATT_SOFTMAX ATT_CAT(ATT_NAME, _softmax)
#define ATT_VROWS ATT_CAT(ATT_NAME, _vrows)
#define ATT_V_AHEAD 16

/* Scores of rb row vectors at np positions: s[p*Rp + i*W + lane] = scale * (q_row . K_p), the
 * dot an FMA chain over d = 0..hd-1. qt: Q transposed (qt[d*Rp + row]); kt: K rows as floats. */
TGT_INLINE void ATT_QK(const float *qt, int Rp, const float *kt, int hd, float *s, float scale, const int rb, const int np) {
    VT acc[4][8];
#pragma GCC unroll 4
    for (int i = 0; i < rb; i++)
#pragma GCC unroll 8
        for (int p = 0; p < np; p++) acc[i][p] = VZERO();
    for (int d = 0; d < hd; d++) {
        VT qv[4];
#pragma GCC unroll 4
        for (int i = 0; i < rb; i++) qv[i] = VLOADF(qt + (size_t)d * Rp + i * W);
#pragma GCC unroll 8
        for (int p = 0; p < np; p++) {
            const VT kv = VSET1(kt[(size_t)p * hd + d]);
#pragma GCC unroll 4
            for (int i = 0; i < rb; i++) acc[i][p] = VFMA(qv[i], kv, acc[i][p]);
        }
    }
    const VT vs = VSET1(scale);
#pragma GCC unroll 4
    for (int i = 0; i < rb; i++)
#pragma GCC unroll 8
        for (int p = 0; p < np; p++) VSTORE(s + (size_t)p * Rp + i * W, VMUL(acc[i][p], vs));
}

/* Row vector rows[0..W) of the scores, lane l valid at positions lo[l] <= j < lim[l], all
 * lanes at ja <= j < jb, none below j0 or from N: s = exp(s - max) where valid (0 elsewhere
 * from j0); sum[l] = the valid weights summed in position order, plus exp(sink - max) for a
 * sink (sink lanes -INFINITY: none). */
TGT_INLINE void ATT_SOFTMAX(float *s, int Rp, int j0, int ja, int jb, int N, const float *lo, const float *lim, const float *sink,
                            int has_sink, float *sum) {
    const VT vlo = VLOADF(lo), vl = VLOADF(lim), ninf = VSET1(-INFINITY);
    if (ja >= jb) ja = jb = N; /* no position every lane sees */
    VT m = VLOADF(sink);
    int j = j0;
#define ATT_VALID(x, other) VSELLT(VSET1((float)j), vl, VSELLT(VSET1((float)j), vlo, other, x), other)
    for (; j < ja; j++) m = VMAX(m, ATT_VALID(VLOADF(s + (size_t)j * Rp), ninf));
    for (; j < jb; j++) m = VMAX(m, VLOADF(s + (size_t)j * Rp));
    for (; j < N; j++) m = VMAX(m, ATT_VALID(VLOADF(s + (size_t)j * Rp), ninf));
    VT a = VZERO();
    for (j = j0; j < ja; j++) {
        const VT e = ATT_VALID(VEXP(VSUB(VLOADF(s + (size_t)j * Rp), m)), VZERO());
        VSTORE(s + (size_t)j * Rp, e);
        a = VADD(a, e);
    }
    for (; j < jb; j++) {
        const VT e = VEXP(VSUB(VLOADF(s + (size_t)j * Rp), m));
        VSTORE(s + (size_t)j * Rp, e);
        a = VADD(a, e);
    }
    for (; j < N; j++) {
        const VT e = ATT_VALID(VEXP(VSUB(VLOADF(s + (size_t)j * Rp), m)), VZERO());
        VSTORE(s + (size_t)j * Rp, e);
        a = VADD(a, e);
    }
#undef ATT_VALID
    if (has_sink) a = VADD(a, VEXP(VSUB(VLOADF(sink), m)));
    VSTORE(sum, a);
}

/* Asks for cache rows j0..j0+cnt-1 (hd elements of es bytes each) ahead of their tile: rows
 * lie a whole position apart, too far for the hardware prefetcher to run ahead. */
TGT_INLINE void ATT_CAT(ATT_NAME, _prefetch)(const unsigned char *b, size_t stride, int j0, int cnt, int N, size_t bytes) {
    for (int j = j0; j < j0 + cnt && j < N; j++)
        for (size_t c = 0; c < bytes; c += 64) __builtin_prefetch(b + (size_t)j * stride + c);
}

/* o[i*hd ..] /= sum[i] for the g rows: each output's FMA chain times 1/sum. */
TGT_INLINE void ATT_CAT(ATT_NAME, _normalize)(float *o, int g, int hd, const float *sum) {
    for (int i = 0; i < g; i++) {
        const VT inv = VSET1(1.0f / sum[i]);
        float *oi = o + (size_t)i * hd;
        for (int c = 0; c < hd; c += W) VSTORE(oi + c, VMUL(VLOADF(oi + c), inv));
    }
}

/* o[i*hd + d0 ..] += for hc rows and nvc vectors of dimensions, positions j0..j1-1 of the tile
 * vt (its row 0 is position t0): w[j*ps + i*rs] * V_j, each an FMA chain in position order;
 * first: start from 0 instead of o. */
TGT_INLINE void ATT_VACC(const float *w, size_t ps, size_t rs, const float *vt, const unsigned char *vb, size_t stride, int hd,
                         int t0, int j0, int j1, int d0, const int hc, const int nvc, int first, float *o) {
    VT acc[HCMAX][4];
#pragma GCC unroll 4
    for (int i = 0; i < hc; i++)
#pragma GCC unroll 4
        for (int c = 0; c < nvc; c++) acc[i][c] = first ? VZERO() : VLOADF(o + (size_t)i * hd + d0 + c * W);
    for (int j = j0; j < j1; j++) {
        VT x[4];
        if (vt) {
            const float *r = vt + (size_t)(j - t0) * hd + d0;
#pragma GCC unroll 4
            for (int c = 0; c < nvc; c++) x[c] = VLOADF(r + c * W);
        } else { /* rows straight from the cache, asked for ATT_V_AHEAD rows ahead */
#pragma GCC unroll 4
            for (int c = 0; c < nvc; c++) x[c] = LOADE(vb + (size_t)j * stride, d0 + c * W);
            ATT_CAT(ATT_NAME, _prefetch)(vb + (size_t)d0 * sizeof(LOADE_T), stride, j + ATT_V_AHEAD, 1, j1,
                                         (size_t)nvc * W * sizeof(LOADE_T));
        }
#pragma GCC unroll 4
        for (int i = 0; i < hc; i++) {
            const VT wv = VSET1(w[(size_t)j * ps + (size_t)i * rs]);
#pragma GCC unroll 4
            for (int c = 0; c < nvc; c++) acc[i][c] = VFMA(wv, x[c], acc[i][c]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < hc; i++)
#pragma GCC unroll 4
        for (int c = 0; c < nvc; c++) VSTORE(o + (size_t)i * hd + d0 + c * W, acc[i][c]);
}

/* Every row i < g: o[i*hd ..] += positions js..je-1 of the V tile vt (row 0 is position t0)
 * weighted by w[j*ps + i*rs], in register tiles of HCMAX rows and 4 vectors (ATT_VACC). */
TGT_INLINE void ATT_VROWS(const float *w, size_t ps, size_t rs, const float *vt, const unsigned char *vb, size_t stride, int hd,
                          int t0, int js, int je, int g, int first, float *o) {
    const int nv = hd / W;
    for (int i0 = 0; i0 < g; i0 += HCMAX) {
        const int hc = g - i0 < HCMAX ? g - i0 : HCMAX;
        const float *wi = w + (size_t)i0 * rs;
        float *oi = o + (size_t)i0 * hd;
        for (int c0 = 0; c0 < nv; c0 += 4) {
            const int nvc = nv - c0 < 4 ? nv - c0 : 4, d0 = c0 * W;
#define ATT_CASE(H, C) \
    case (H) * 8 + (C): ATT_VACC(wi, ps, rs, vt, vb, stride, hd, t0, js, je, d0, H, C, first, oi); break;
            switch (hc * 8 + nvc) {
                ATT_CASE(1, 1)
                ATT_CASE(1, 2)
                ATT_CASE(1, 3)
                ATT_CASE(1, 4)
#if HCMAX >= 2
                ATT_CASE(2, 1)
                ATT_CASE(2, 2)
                ATT_CASE(2, 3)
                ATT_CASE(2, 4)
#endif
#if HCMAX >= 3
                ATT_CASE(3, 1)
                ATT_CASE(3, 2)
                ATT_CASE(3, 3)
                ATT_CASE(3, 4)
#endif
#if HCMAX >= 4
                ATT_CASE(4, 1)
                ATT_CASE(4, 2)
                ATT_CASE(4, 3)
                ATT_CASE(4, 4)
#endif
            default: break;
            }
#undef ATT_CASE
        }
    }
}

/* Rows of cache positions j0..j0+cnt-1 as floats (dst[(j-j0)*hd ..]); rows past N are zeros. */
TGT_INLINE void ATT_CAT(ATT_NAME, _widen)(const unsigned char *b, size_t stride, int j0, int cnt, int N, int hd, float *dst) {
    for (int j = j0; j < j0 + cnt; j++)
        for (int c = 0; c < hd; c += W)
            VSTORE(dst + (size_t)(j - j0) * hd + c, j < N ? LOADE(b + (size_t)j * stride, c) : VZERO());
}


#ifdef VTRANSPOSE
/* Decode steps (one position) with few query rows, g <= ATT_POS_ROWS heads per KV head: with the
 * rows in the lanes most of every score vector would be empty, so here the positions lie in the
 * lanes. W cache rows are read W elements at a time and transposed in registers (VTRANSPOSE), one
 * FMA then serving W positions of one row; the value rows are read straight from the cache, each
 * widened once as it is used (no tile to fill: few rows share it). Every score, weight, sum and
 * output is the arithmetic the rows-in-lanes path does for that row (below), in the same order, so
 * the bits are the same: a decode step still equals its position in a batched prefill. */

/* Blocks of W positions one pass scores at once: independent FMA chains for the few rows. */
#define ATT_POS_NB(R) ((R) <= 2 ? 4 : (R) <= 4 ? 2 : 1)

/* Scores of rows r < R at positions p0 .. p0 + nb*W - 1: s[r*rs + p] = scale * (q_r . K_p), the
 * FMA chain over d = 0..hd-1 of ATT_QK. Rows past N-1 are read as row N-1 (their scores are not
 * used); vectors that start at or past N are not stored. */
TGT_INLINE void ATT_CAT(ATT_NAME, _qk_pos)(const float *q, int hd, const unsigned char *kb, size_t stride, int p0, int N,
                                           float *s, size_t rs, float scale, const int R, const int nb) {
    VT acc[4][ATT_POS_ROWS];
#pragma GCC unroll 4
    for (int b = 0; b < nb; b++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) acc[b][r] = VZERO();
    const unsigned char *row[4][W];
#pragma GCC unroll 4
    for (int b = 0; b < nb; b++)
#pragma GCC unroll 16
        for (int l = 0; l < W; l++) {
            const int p = p0 + b * W + l;
            row[b][l] = kb + (size_t)(p < N ? p : N - 1) * stride;
        }
    for (int d0 = 0; d0 < hd; d0 += W) {
#pragma GCC unroll 4
        for (int b = 0; b < nb; b++) {
            VT t[W];
#pragma GCC unroll 16
            for (int l = 0; l < W; l++) t[l] = LOADE(row[b][l], d0);
            VTRANSPOSE(t);
#pragma GCC unroll 16
            for (int dd = 0; dd < W; dd++)
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) acc[b][r] = VFMA(VSET1(q[(size_t)r * hd + d0 + dd]), t[dd], acc[b][r]);
        }
    }
    const VT vs = VSET1(scale);
#pragma GCC unroll 4
    for (int b = 0; b < nb; b++)
        if (p0 + b * W < N)
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) VSTORE(s + (size_t)r * rs + p0 + b * W, VMUL(acc[b][r], vs));
}

/* Row r's scores at lo..N-1 become exp(s - max) in place and sum[r] their sum in position
 * order, plus exp(sink - max) for a sink: what ATT_SOFTMAX gives a row in a lane (the max is
 * exact in any order; the exps run over whole vectors from lo rounded down, inside the row). */
TGT_INLINE void ATT_CAT(ATT_NAME, _softmax_pos)(float *s, size_t rs, int R, int lo, int N, const float *sinks, float *sum) {
    const int a0 = lo / W * W;
    for (int r = 0; r < R; r++) {
        float *sr = s + (size_t)r * rs;
        VT mv = VSET1(sinks ? sinks[r] : -INFINITY);
        int j = lo;
        for (; j < N && j % W; j++) mv = VMAX(mv, VSET1(sr[j]));
        for (; j + W <= N; j += W) mv = VMAX(mv, VLOADF(sr + j));
        for (; j < N; j++) mv = VMAX(mv, VSET1(sr[j]));
        float lanes[W], m = -INFINITY;
        VSTORE(lanes, mv);
        for (int l = 0; l < W; l++) m = lanes[l] > m ? lanes[l] : m;
        const VT vm = VSET1(m);
        for (j = a0; j < N; j += W) VSTORE(sr + j, VEXP(VSUB(VLOADF(sr + j), vm)));
        float a = 0.0f;
        for (j = lo; j < N; j++) a += sr[j];
        if (sinks) {
            VSTORE(lanes, VEXP(VSUB(VSET1(sinks[r]), vm)));
            a += lanes[0];
        }
        sum[r] = a;
    }
}

TGT void ATT_CAT(ATT_NAME, _decode_pos)(const float *q, int g, int hd, const void *k, const void *v, size_t stride, int n, int lo,
                                        float scale, const float *sinks, float *sc, float *o) {
    const size_t rs = (size_t)(n + W - 1) / W * W;
    float *s = sc, *sum = s + (size_t)g * rs;
    const unsigned char *kb = k, *vb = v;
    const size_t rowb = (size_t)hd * sizeof(LOADE_T);
    const int nb = ATT_POS_NB(g);
    /* K rows two passes ahead (one pass takes too little time to hide a read from memory); the
     * first value rows during the softmax */
    ATT_CAT(ATT_NAME, _prefetch)(kb, stride, lo / W * W, 2 * nb * W, n, rowb);
    for (int p0 = lo / W * W; p0 < n; p0 += nb * W) {
        ATT_CAT(ATT_NAME, _prefetch)(kb, stride, p0 + 2 * nb * W, nb * W, n, rowb);
        switch (g) {
#define ATT_CASE(R) \
    case R: ATT_CAT(ATT_NAME, _qk_pos)(q, hd, kb, stride, p0, n, s, rs, scale, R, ATT_POS_NB(R)); break;
            ATT_CASE(1)
            ATT_CASE(2)
            ATT_CASE(3)
#if ATT_POS_ROWS >= 8
            ATT_CASE(4)
            ATT_CASE(5)
            ATT_CASE(6)
            ATT_CASE(7)
            ATT_CASE(8)
#endif
#undef ATT_CASE
        default: break;
        }
    }
    ATT_CAT(ATT_NAME, _prefetch)(vb, stride, lo, ATT_V_AHEAD, n, rowb);
    ATT_CAT(ATT_NAME, _softmax_pos)(s, rs, g, lo, n, sinks, sum);
    ATT_VROWS(s, 1, rs, NULL, vb, stride, hd, 0, lo, n, g, 1, o);
    ATT_CAT(ATT_NAME, _normalize)(o, g, hd, sum);
}
#undef ATT_POS_NB
#endif

TGT void ATT_BLOCK_NAME(const float *q, size_t qstep, int tq, int g, int hd, const void *k, const void *v, size_t stride, int n,
                        int window, float scale, const float *sinks, float *sc, float *o, size_t ostep) {
#define ATT_LO(t) (window > 0 && n + (t) > window ? n + (t) - window : 0) /* position t's first */
    if (hd % W) {
        for (int t = 0; t < tq; t++)
            ATT_REF(q + t * qstep, g, hd, (const unsigned char *)k + (size_t)ATT_LO(t) * stride,
                    (const unsigned char *)v + (size_t)ATT_LO(t) * stride, stride, n + t - ATT_LO(t), scale, sinks, sc,
                    o + t * ostep);
        return;
    }
#ifdef VTRANSPOSE
    if (tq == 1 && g <= ATT_POS_ROWS) {
        ATT_CAT(ATT_NAME, _decode_pos)(q, g, hd, k, v, stride, n, ATT_LO(0), scale, sinks, sc, o);
        return;
    }
#endif
    const int R = tq * g, Rp = (R + W - 1) / W * W, nrv = Rp / W, N = n + tq - 1;
    const int Np = (N + KV_ATT_KT - 1) / KV_ATT_KT * KV_ATT_KT;
    float *qt = sc, *kt = qt + (size_t)hd * Rp, *vt = kt + (size_t)KV_ATT_KT * hd, *s = vt + (size_t)KV_ATT_PT * hd;
    float *lo = s + (size_t)Np * Rp, *lim = lo + Rp, *sk = lim + Rp, *sum = sk + Rp;
    const unsigned char *kb = k, *vb = v;
    const size_t rowb = (size_t)hd * sizeof(LOADE_T);
    for (int r = 0; r < Rp; r++) {
        const int t = r / g, i = r % g;
        for (int d = 0; d < hd; d++) qt[(size_t)d * Rp + r] = r < R ? q[t * qstep + (size_t)i * hd + d] : 0.0f;
        lo[r] = r < R ? (float)ATT_LO(t) : 0.0f;
        lim[r] = r < R ? (float)(n + t) : 1.0f; /* a pad row keeps one position: finite, unused */
        sk[r] = sinks && r < R ? sinks[i] : -INFINITY;
    }
    for (int j0 = ATT_LO(0) / KV_ATT_KT * KV_ATT_KT; j0 < Np; j0 += KV_ATT_KT) {
        ATT_CAT(ATT_NAME, _widen)(kb, stride, j0, KV_ATT_KT, N, hd, kt);
        ATT_CAT(ATT_NAME, _prefetch)(kb, stride, j0 + KV_ATT_KT, KV_ATT_KT, N, rowb);
        for (int v0 = 0; v0 < nrv; v0 += RBMAX) {
            const int rb = nrv - v0 < RBMAX ? nrv - v0 : RBMAX;
            float *sv = s + (size_t)j0 * Rp + v0 * W;
            const float *qv = qt + v0 * W;
            if (rb == 1)
                for (int p = 0; p < KV_ATT_KT; p += 8) ATT_QK(qv, Rp, kt + (size_t)p * hd, hd, sv + (size_t)p * Rp, scale, 1, 8);
#if RBMAX >= 2
            else if (rb == 2)
                for (int p = 0; p < KV_ATT_KT; p += 6) ATT_QK(qv, Rp, kt + (size_t)p * hd, hd, sv + (size_t)p * Rp, scale, 2, 6);
#endif
#if RBMAX >= 3
            else if (rb == 3)
                for (int p = 0; p < KV_ATT_KT; p += 6) ATT_QK(qv, Rp, kt + (size_t)p * hd, hd, sv + (size_t)p * Rp, scale, 3, 6);
#endif
#if RBMAX >= 4
            else
                for (int p = 0; p < KV_ATT_KT; p += 6) ATT_QK(qv, Rp, kt + (size_t)p * hd, hd, sv + (size_t)p * Rp, scale, 4, 6);
#endif
        }
    }
    for (int v0 = 0; v0 < nrv; v0++) { /* rows v0*W .. last, of positions first/g .. last/g */
        const int first = v0 * W, last = ((v0 + 1) * W < R ? (v0 + 1) * W : R) - 1;
        ATT_SOFTMAX(s + v0 * W, Rp, ATT_LO(first / g), ATT_LO(last / g), n, N, lo + v0 * W, lim + v0 * W, sk + v0 * W,
                    sinks != NULL, sum + v0 * W);
    }
    for (int j0 = ATT_LO(0) / KV_ATT_PT * KV_ATT_PT; j0 < N; j0 += KV_ATT_PT) {
        const int cnt = N - j0 < KV_ATT_PT ? N - j0 : KV_ATT_PT;
        ATT_CAT(ATT_NAME, _widen)(vb, stride, j0, cnt, N, hd, vt);
        ATT_CAT(ATT_NAME, _prefetch)(vb, stride, j0 + KV_ATT_PT, KV_ATT_PT, N, rowb);
        for (int t = 0; t < tq; t++) {
            const int je = j0 + cnt < n + t ? j0 + cnt : n + t, js = ATT_LO(t) > j0 ? ATT_LO(t) : j0;
            if (je <= js) continue;
            ATT_VROWS(s + t * g, (size_t)Rp, 1, vt, NULL, 0, hd, j0, js, je, g, js == ATT_LO(t), o + t * ostep);
        }
    }
    for (int t = 0; t < tq; t++) ATT_CAT(ATT_NAME, _normalize)(o + t * ostep, g, hd, sum + t * g);
}

TGT void ATT_NAME(const float *q, int g, int hd, const void *k, const void *v, size_t stride, int n, float scale,
                  const float *sinks, float *sc, float *o) {
    ATT_BLOCK_NAME(q, 0, 1, g, hd, k, v, stride, n, 0, scale, sinks, sc, o, 0);
}
#undef ATT_LO

#undef ATT_QK
#undef ATT_VACC
#undef ATT_SOFTMAX
#undef ATT_VROWS
#undef ATT_V_AHEAD
#endif /* ATT_EXP_ONLY */
