/* Query absorption kernels (mla_absorb.h). One C body, inlined into an entry point per
 * instruction set (target attributes): the sums stay in vector registers over d (GCC/clang
 * vector types), where an axpy per term read and wrote the output row each time. The
 * standard's per-element operations are the same at every vector width, so the sets agree bit
 * for bit (c/tests checks it). */
#include "kernels/isa.h"

#include <string.h>

#define ABS_T 4  /* positions per register block */
#define ABS_C 16 /* columns per vector */

typedef float vcol __attribute__((vector_size(ABS_C * sizeof(float)), aligned(4)));
#define INLINE static inline __attribute__((always_inline))

/* (a macro: a function returning a 64-byte vector would change the generic code's ABI) */
#define LOAD_COL(v, p) memcpy(&(v), (p), sizeof(v))

/* Column c of one position, the scalar loop itself: a kl that is not a multiple of ABS_C. */
INLINE float absorb_one(const float *q, const float *w, size_t wstride, int dn, int c) {
    float a = 0;
    for (int d = 0; d < dn; d++) a += q[d] * w[(size_t)d * wstride + c];
    return a;
}

/* ABS_T positions from q (rows qstep apart) into o (rows ostep apart): one column vector of
 * all of them per pass over d. */
INLINE void absorb_block(float *o, size_t ostep, const float *q, size_t qstep, const float *w, size_t wstride, int dn, int kl) {
    const float *q0 = q, *q1 = q + qstep, *q2 = q + 2 * qstep, *q3 = q + 3 * qstep;
    int c = 0;
    for (; c + ABS_C <= kl; c += ABS_C) {
        vcol a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (int d = 0; d < dn; d++) {
            vcol wd;
            LOAD_COL(wd, w + (size_t)d * wstride + c);
            a0 += q0[d] * wd, a1 += q1[d] * wd, a2 += q2[d] * wd, a3 += q3[d] * wd;
        }
        memcpy(o + c, &a0, sizeof a0), memcpy(o + ostep + c, &a1, sizeof a1);
        memcpy(o + 2 * ostep + c, &a2, sizeof a2), memcpy(o + 3 * ostep + c, &a3, sizeof a3);
    }
    for (; c < kl; c++)
        for (int i = 0; i < ABS_T; i++) o[(size_t)i * ostep + c] = absorb_one(q + (size_t)i * qstep, w, wstride, dn, c);
}

/* One position: four column vectors per pass over d, so that four sums advance together (a
 * lone one waits out the add's latency at every term). */
INLINE void absorb_row(float *o, const float *q, const float *w, size_t wstride, int dn, int kl) {
    int c = 0;
    for (; c + 4 * ABS_C <= kl; c += 4 * ABS_C) {
        vcol a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (int d = 0; d < dn; d++) {
            const float *wd = w + (size_t)d * wstride + c;
            const float qd = q[d];
            vcol w0, w1, w2, w3;
            LOAD_COL(w0, wd), LOAD_COL(w1, wd + ABS_C), LOAD_COL(w2, wd + 2 * ABS_C), LOAD_COL(w3, wd + 3 * ABS_C);
            a0 += qd * w0, a1 += qd * w1, a2 += qd * w2, a3 += qd * w3;
        }
        memcpy(o + c, &a0, sizeof a0), memcpy(o + c + ABS_C, &a1, sizeof a1);
        memcpy(o + c + 2 * ABS_C, &a2, sizeof a2), memcpy(o + c + 3 * ABS_C, &a3, sizeof a3);
    }
    for (; c + ABS_C <= kl; c += ABS_C) {
        vcol a = {0};
        for (int d = 0; d < dn; d++) {
            vcol wd;
            LOAD_COL(wd, w + (size_t)d * wstride + c);
            a += q[d] * wd;
        }
        memcpy(o + c, &a, sizeof a);
    }
    for (; c < kl; c++) o[c] = absorb_one(q, w, wstride, dn, c);
}

INLINE void absorb(float *o, size_t ostep, const float *q, size_t qstep, int tn, const float *w, size_t wstride, int dn, int kl) {
    int t = 0;
    for (; t + ABS_T <= tn; t += ABS_T)
        absorb_block(o + (size_t)t * ostep, ostep, q + (size_t)t * qstep, qstep, w, wstride, dn, kl);
    for (; t < tn; t++) absorb_row(o + (size_t)t * ostep, q + (size_t)t * qstep, w, wstride, dn, kl);
}

#define ABSORB_ENTRY(NAME, ATTR)                                                                                         \
    ATTR void NAME(float *o, size_t ostep, const float *q, size_t qstep, int tn, const float *w, size_t wstride, int dn, \
                   int kl) {                                                                                             \
        absorb(o, ostep, q, qstep, tn, w, wstride, dn, kl);                                                              \
    }
ABSORB_ENTRY(mla_absorb_portable, )
#if defined(__x86_64__) || defined(__i386__)
ABSORB_ENTRY(mla_absorb_avx2, __attribute__((target("avx2"))))
ABSORB_ENTRY(mla_absorb_avx512, __attribute__((target("avx512f"))))
#endif
