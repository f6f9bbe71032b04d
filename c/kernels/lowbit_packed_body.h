/* The low-bit dots against lowbit_pack_act's rows, included once per target by lowbit_avx2.c
 * with LP_ATTR (the target attribute), LP_NAME (the function) and LP_DOT(acc, w, x) (acc plus
 * the pairwise products of the int16 lanes of w and x, as int32 lanes). Block by block, the
 * block of up to eight rows is decoded once into lanes (4 KB, in L1) and each position's packed
 * block is loaded once for all of them; per row and position, sixteen multiply-adds leave the
 * parts' integer sums in the lanes lowbit_block_sum reads, with no horizontal sums. Each
 * (row, position) still adds its blocks in order, and integer sums are exact, so every LP_DOT
 * and every blocking gives the same bits. No include guard: it is a template. */
LP_ATTR static void LP_NAME(const LowbitType *t, LowbitDecodeFn codes, QDOT_ARGS) {
    enum { R = 8 };
    const int nk = a->nb / 8, has_min = t->has_min;
    float acc[R][LOWBIT_MAX_ROWS];
    __m256i wv[R][16];
    Scales8 s[R];
    LowbitBlock blk;
    for (int r0 = 0; r0 < nr; r0 += R) {
        const int n = nr - r0 < R ? nr - r0 : R;
        for (int r = 0; r < n; r++)
            for (int i = 0; i < nt; i++) acc[r][i] = 0;
        for (int k = 0; k < nk; k++) {
            for (int r = 0; r < n; r++) {
                const unsigned char *bb = w + (size_t)(r0 + r) * row_bytes + (size_t)k * t->bytes;
                t->scales(bb, &blk);
                codes(bb, &blk);
                codes_lanes(blk.q, wv[r]);
                s[r] = scales8(&blk, has_min);
            }
            for (int i = 0; i < nt; i++) {
                const unsigned char *p = a->lp + ((size_t)(t0 + i) * nk + k) * LOWBIT_PACK_BYTES;
                const __m256i *xp = (const __m256i *)(const void *)p;
                const float *f = (const float *)(const void *)(p + 512);
                __m256i xv[16];
                for (int m = 0; m < 16; m++) xv[m] = _mm256_loadu_si256(xp + m);
                const __m256 xse = _mm256_loadu_ps(f + 8), xso = _mm256_loadu_ps(f + 16), d = _mm256_loadu_ps(f);
                for (int r = 0; r < n; r++) {
                    __m256i se = _mm256_setzero_si256(), so = se;
                    for (int m = 0; m < 8; m++) {
                        se = LP_DOT(se, wv[r][m], xv[m]);
                        so = LP_DOT(so, wv[r][8 + m], xv[8 + m]);
                    }
                    acc[r][i] += block_sum_lanes(&s[r], has_min, se, so, xse, xso, d);
                }
            }
        }
        for (int r = 0; r < n; r++)
            for (int i = 0; i < nt; i++) y[i * ldy + r0 + r] = acc[r][i];
    }
}
