/* The gated delta rule's four entry points, included once per kernel set by delta_rule.c with
 * DR_ATTR (the set's target attribute) and DR(name) (the set's name for each function); the
 * helpers they call are delta_rule.c's. No include guard: it is a template. */
DR_ATTR void DR(delta_rule_recurrent)(const DeltaIn *in, float *S, float *o) {
    for (int t = 0; t < in->T; t++)
        rule_step(S, in->q + t * in->qs, in->k + t * in->ks, in->v + t * in->vs, NULL, expf(in->g[t]), in->beta[t],
                  o + t * in->os, in->dk, in->dv);
}

DR_ATTR void DR(delta_rule_chunked)(const DeltaIn *in, float *S, float *o, float *work) {
    const int dk = in->dk, dv = in->dv, C = DELTA_CHUNK;
    float *A = work, *U = A + C * C, *Vn = U + C * dv, *W = Vn + C * dv, *G = W + C * dk, *kd = G + C;
    for (int c0 = 0; c0 < in->T; c0 += C) {
        const int n = in->T - c0 < C ? in->T - c0 : C;
        const float *q = in->q + c0 * in->qs, *k = in->k + c0 * in->ks, *v = in->v + c0 * in->vs;
        const float *beta = in->beta + c0;
        float *oc = o + c0 * in->os;
        float acc = 0;
        for (int i = 0; i < n; i++) G[i] = acc += in->g[c0 + i];
        for (int i = 0; i < n; i++)
            for (int j = 0; j < i; j++) A[i * C + j] = beta[i] * dot(k + i * in->ks, k + j * in->ks, dk) * expf(G[i] - G[j]);
        for (int i = 0; i < n; i++) {
            float *u = U + i * dv, *w = W + i * dk;
            const float eg = expf(G[i]);
            for (int x = 0; x < dv; x++) u[x] = beta[i] * v[i * in->vs + x];
            for (int x = 0; x < dk; x++) w[x] = beta[i] * eg * k[i * in->ks + x];
            for (int j = 0; j < i; j++) {
                const float a = A[i * C + j];
                axpy(u, -a, U + j * dv, dv);
                axpy(w, -a, W + j * dk, dk);
            }
        }
        for (int i = 0; i < n; i++) { /* V' = U - W S, and the read of the old state */
            float *vn = Vn + i * dv, *ot = oc + i * in->os;
            const float eg = expf(G[i]);
            memcpy(vn, U + i * dv, sizeof(float) * (size_t)dv);
            memset(ot, 0, sizeof(float) * (size_t)dv);
            for (int d = 0; d < dk; d++) {
                const float wd = W[i * dk + d], qd = q[i * in->qs + d] * eg;
                const float *s = S + d * dv;
                axpy2(vn, -wd, ot, qd, s, dv);
            }
        }
        for (int i = 0; i < n; i++) { /* the chunk's own contribution */
            float *ot = oc + i * in->os;
            for (int j = 0; j <= i; j++) {
                const float a = dot(q + i * in->qs, k + j * in->ks, dk) * expf(G[i] - G[j]);
                axpy(ot, a, Vn + j * dv, dv);
            }
        }
        const float last = G[n - 1], el = expf(last);
        for (int i = 0; i < dk * dv; i++) S[i] *= el;
        for (int j = 0; j < n; j++) {
            const float e = expf(last - G[j]);
            for (int d = 0; d < dk; d++) kd[d] = e * k[j * in->ks + d];
            for (int d = 0; d < dk; d++) {
                float *s = S + d * dv;
                const float *vn = Vn + j * dv;
                axpy(s, kd[d], vn, dv);
            }
        }
    }
}

DR_ATTR void DR(kda_recurrent)(const DeltaIn *in, float *S, float *o) {
    float dec[1024]; /* dk <= 1024 */
    for (int t = 0; t < in->T; t++) {
        const float *g = in->g + t * in->gs;
        for (int d = 0; d < in->dk; d++) dec[d] = expf(g[d]);
        rule_step(S, in->q + t * in->qs, in->k + t * in->ks, in->v + t * in->vs, dec, 0, in->beta[t], o + t * in->os, in->dk,
                  in->dv);
    }
}

DR_ATTR void DR(kda_chunked)(const DeltaIn *in, float *S, float *o, float *work) {
    const int dk = in->dk, dv = in->dv, C = DELTA_CHUNK;
    float *A = work, *U = A + C * C, *Vn = U + C * dv, *W = Vn + C * dv, *G = W + C * dk, *kd = G + C * dk;
    float *kE = kd + C * dk, *qE = kE + C * dk, *kF = qE + C * dk; /* kF: [C / KDA_SUB][C][dk] */
    for (int c0 = 0; c0 < in->T; c0 += C) {
        const int n = in->T - c0 < C ? in->T - c0 : C;
        const float *q = in->q + c0 * in->qs, *k = in->k + c0 * in->ks, *v = in->v + c0 * in->vs;
        const float *beta = in->beta + c0;
        float *oc = o + c0 * in->os;
        for (int d = 0; d < dk; d++) {
            float acc = 0;
            for (int i = 0; i < n; i++) G[i * dk + d] = acc += in->g[(c0 + i) * in->gs + d];
        }
        kda_pair_decays(G, k, q, in->ks, in->qs, n, dk, kE, qE, kF);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < i; j++) A[i * C + j] = beta[i] * pair_dot(kE, kF, G, k, k, in->ks, in->ks, i, j, dk);
        for (int i = 0; i < n; i++) {
            float *u = U + i * dv, *w = W + i * dk;
            for (int x = 0; x < dv; x++) u[x] = beta[i] * v[i * in->vs + x];
            for (int x = 0; x < dk; x++) w[x] = beta[i] * expf(G[i * dk + x]) * k[i * in->ks + x];
            for (int j = 0; j < i; j++) {
                const float a = A[i * C + j];
                axpy(u, -a, U + j * dv, dv);
                axpy(w, -a, W + j * dk, dk);
            }
        }
        for (int i = 0; i < n; i++) {
            float *vn = Vn + i * dv, *ot = oc + i * in->os;
            memcpy(vn, U + i * dv, sizeof(float) * (size_t)dv);
            memset(ot, 0, sizeof(float) * (size_t)dv);
            for (int d = 0; d < dk; d++) {
                const float wd = W[i * dk + d], qd = q[i * in->qs + d] * expf(G[i * dk + d]);
                const float *s = S + d * dv;
                axpy2(vn, -wd, ot, qd, s, dv);
            }
        }
        for (int i = 0; i < n; i++) {
            float *ot = oc + i * in->os;
            for (int j = 0; j <= i; j++) axpy(ot, pair_dot(qE, kF, G, q, k, in->qs, in->ks, i, j, dk), Vn + j * dv, dv);
        }
        const float *last = G + (n - 1) * dk;
        for (int d = 0; d < dk; d++) {
            const float e = expf(last[d]);
            for (int x = 0; x < dv; x++) S[d * dv + x] *= e;
        }
        for (int j = 0; j < n; j++) {
            for (int d = 0; d < dk; d++) kd[d] = expf(last[d] - G[j * dk + d]) * k[j * in->ks + d];
            for (int d = 0; d < dk; d++) {
                float *s = S + d * dv;
                const float *vn = Vn + j * dv;
                axpy(s, kd[d], vn, dv);
            }
        }
    }
}
