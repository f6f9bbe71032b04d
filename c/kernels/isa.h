/* Inside c/kernels only: every kernel set's entry points, named <family>_<set>, and the tables
 * that hold them (the set files' kernel_set_<set>). The rest of the engine uses kernels.h. */
#ifndef COLI_KERNELS_ISA_H
#define COLI_KERNELS_ISA_H
#include "kernels/kernels.h"
#include "kernels/lowbit.h"

#define QDOT_ARGS const unsigned char *w, size_t row_bytes, int nr, const QAct *a, int t0, int nt, float *y, size_t ldy
#define QGEMM_ARGS const unsigned char *w, size_t row_bytes, int nr, const QAct *a, const int8_t *packed, float *y, size_t ldy
#define KV_ATTEND_ARGS                                                                                                  \
    const float *q, int g, int hd, const void *k, const void *v, size_t stride, int n, float scale, const float *sinks, \
        float *sc, float *o
#define KV_ATTEND_BLOCK_ARGS                                                                                             \
    const float *q, size_t qstep, int tq, int g, int hd, const void *k, const void *v, size_t stride, int n, int window, \
        float scale, const float *sinks, float *sc, float *o, size_t ostep
#define MLA_ABSORB_ARGS \
    float *o, size_t ostep, const float *q, size_t qstep, int tn, const float *w, size_t wstride, int dn, int kl
#define DSA_SCORE_ARGS                                                                                                          \
    const float *q, const float *w, int nh, int hd, const unsigned char *keys, size_t stride, int n, float scale, float wscale, \
        float *s

/* Every family of one set: the quantized dots, the KV kernels of each storage type, the MLA
 * absorption, the DSA scores and the delta rule, as far as the set has them. */
#define KV_ROW_DECL(SET, T)                                           \
    float kv_dot_##T##_##SET(const float *q, const void *row, int n); \
    void kv_axpy_##T##_##SET(float w, const void *row, int n, float *o);
#define KV_ATTEND_DECL(SET, T)                  \
    void kv_attend_##SET##_##T(KV_ATTEND_ARGS); \
    void kv_attend_##SET##_##T##_block(KV_ATTEND_BLOCK_ARGS);
#define DELTA_DECL(SET)                                                                \
    void delta_rule_recurrent_##SET(const DeltaIn *in, float *S, float *o);            \
    void delta_rule_chunked_##SET(const DeltaIn *in, float *S, float *o, float *work); \
    void kda_recurrent_##SET(const DeltaIn *in, float *S, float *o);                   \
    void kda_chunked_##SET(const DeltaIn *in, float *S, float *o, float *work);

/* portable (quant.c, mxfp4.c, kv_kernels.c, mla_absorb.c, dsa_score.c, delta_rule.c) */
void dequant_row_portable(QType q, const void *src, int cols, float *dst);
float dot_portable(const float *a, const float *b, int n);
void quantize_act_portable(const float *x, int cols, const QAct *a, int t);
void qdot_q8_portable(QDOT_ARGS);
void qdot_q4_portable(QDOT_ARGS);
void qdot_q6_portable(QDOT_ARGS);
void qdot_mxfp4_portable(QDOT_ARGS);
#define LOWBIT_DECL(S, QT) void qdot_##S##_portable(QDOT_ARGS);
LOWBIT_TYPES(LOWBIT_DECL) /* lowbit_dot.c */
#undef LOWBIT_DECL
KV_ROW_DECL(portable, f32)
KV_ROW_DECL(portable, f16)
KV_ROW_DECL(portable, bf16)
KV_ATTEND_DECL(ref, f32)
KV_ATTEND_DECL(ref, f16)
KV_ATTEND_DECL(ref, bf16)
void mla_absorb_portable(MLA_ABSORB_ARGS);
void dsa_scores_portable(DSA_SCORE_ARGS);
DELTA_DECL(portable)

#if defined(__x86_64__) || defined(__i386__)
/* avx2 (avx2.c, mxfp4.c, kv_kernels.c, kv_attend_x86.c, mla_absorb.c, dsa_score.c, delta_rule.c) */
void dequant_row_avx2(QType q, const void *src, int cols, float *dst);
float dot_avx2(const float *a, const float *b, int n);
void quantize_act_avx2(const float *x, int cols, const QAct *a, int t);
void qdot_q8_avx2(QDOT_ARGS);
void qdot_q4_avx2(QDOT_ARGS);
void qdot_q6_avx2(QDOT_ARGS);
void qdot_mxfp4_avx2(QDOT_ARGS);
#define LOWBIT_DECL(S, QT) void qdot_##S##_avx2(QDOT_ARGS);
LOWBIT_TYPES(LOWBIT_DECL) /* lowbit_avx2.c */
#undef LOWBIT_DECL
#define LOWBIT_DECL(S, QT) void qdot_##S##_avx512(QDOT_ARGS);
LOWBIT_TYPES(LOWBIT_DECL) /* lowbit_avx512.c */
#undef LOWBIT_DECL
#define LOWBIT_DECL(S, QT) void qdot_##S##_vnni(QDOT_ARGS);
LOWBIT_TYPES(LOWBIT_DECL) /* lowbit_vnni.c */
#undef LOWBIT_DECL
KV_ROW_DECL(avx2, f16)
KV_ROW_DECL(avx2, bf16)
KV_ATTEND_DECL(avx2, f32)
KV_ATTEND_DECL(avx2, f16)
KV_ATTEND_DECL(avx2, bf16)
void mla_absorb_avx2(MLA_ABSORB_ARGS);
void dsa_scores_avx2(DSA_SCORE_ARGS);
DELTA_DECL(avx2)
/* avx512 (avx512.c, kv_attend_x86.c, mla_absorb.c, dsa_score.c, delta_rule.c) */
float dot_avx512(const float *a, const float *b, int n);
KV_ATTEND_DECL(avx512, f32)
KV_ATTEND_DECL(avx512, f16)
KV_ATTEND_DECL(avx512, bf16)
void mla_absorb_avx512(MLA_ABSORB_ARGS);
void dsa_scores_avx512(DSA_SCORE_ARGS);
DELTA_DECL(avx512)
#endif
#if defined(__x86_64__)
/* vnni (vnni.c over vnni_small.c), amx (amx.c) */
size_t vnni_pack_bytes(int T, int nb);
void vnni_pack_act(const QAct *a, int8_t *dst);
void qgemm_q8_vnni(QGEMM_ARGS);
void qgemm_q4_vnni(QGEMM_ARGS);
void qgemm_q6_vnni(QGEMM_ARGS);
size_t amx_pack_bytes(int T, int nb);
void amx_pack_act(const QAct *a, int8_t *dst);
void qgemm_q8_amx(QGEMM_ARGS);
void qgemm_q4_amx(QGEMM_ARGS);
void qgemm_q6_amx(QGEMM_ARGS);
#endif
#if defined(__aarch64__)
/* neon (neon.c, mxfp4.c, kv_attend_neon.c) */
float dot_neon(const float *a, const float *b, int n);
void qdot_q8_neon(QDOT_ARGS);
void qdot_q4_neon(QDOT_ARGS);
void qdot_q6_neon(QDOT_ARGS);
void qdot_mxfp4_neon(QDOT_ARGS);
void dsa_scores_neon(DSA_SCORE_ARGS);
KV_ATTEND_DECL(neon, f32)
KV_ATTEND_DECL(neon, f16)
KV_ATTEND_DECL(neon, bf16)
#endif

/* Table entries for every low-bit type's dot: .qdot = {..., LOWBIT_TYPES(LOWBIT_QDOT_avx2)}. */
#define LOWBIT_QDOT_portable(S, QT) [QT] = qdot_##S##_portable,
#define LOWBIT_QDOT_avx2(S, QT) [QT] = qdot_##S##_avx2,
#define LOWBIT_QDOT_avx512(S, QT) [QT] = qdot_##S##_avx512,
#define LOWBIT_QDOT_vnni(S, QT) [QT] = qdot_##S##_vnni,

/* The tables, each in its set's file; the ones this build has. */
extern const Kernels kernel_set_portable;
#if defined(__x86_64__) || defined(__i386__)
extern const Kernels kernel_set_avx2, kernel_set_avx512;
#endif
#if defined(__x86_64__)
extern const Kernels kernel_set_vnni, kernel_set_amx;
#endif
#if defined(__aarch64__)
extern const Kernels kernel_set_neon;
#endif

#endif
