/* The kernel tables (kernels/kernels.h): every set's table is complete once its NULL entries
 * are taken from the portable set, exactly those are listed as fallbacks, and every entry point
 * of the engine runs the entry of the set kernels_use chose (spies put into `kern` must be
 * called), so --kernels governs every family. */
#include <string.h>

#include "check.h"
#include "kernels/isa.h"
#include "kernels/ops.h"

typedef void (*AnyFn)(void);

/* Every entry a set may have, as (name, the raw table's pointer, the filled table's, portable's). */
#define FIELDS(X)                                 \
    X("dequant_row", dequant_row)                 \
    X("dot", dot)                                 \
    X("quantize_act", quantize_act)               \
    X("qdot.q8", qdot[QT_Q8])                     \
    X("qdot.q4", qdot[QT_Q4])                     \
    X("qdot.mxfp4", qdot[QT_MXFP4])               \
    X("qdot.q6", qdot[QT_Q6])                     \
    X("qdot.q2_k", qdot[QT_Q2_K])                 \
    X("qdot.q3_k", qdot[QT_Q3_K])                 \
    X("qdot.iq1_s", qdot[QT_IQ1_S])               \
    X("qdot.iq1_m", qdot[QT_IQ1_M])               \
    X("qdot.iq2_xxs", qdot[QT_IQ2_XXS])           \
    X("qdot.iq2_xs", qdot[QT_IQ2_XS])             \
    X("qdot.iq2_s", qdot[QT_IQ2_S])               \
    X("qdot.iq3_xxs", qdot[QT_IQ3_XXS])           \
    X("qdot.iq3_s", qdot[QT_IQ3_S])               \
    X("qdot.iq4_nl", qdot[QT_IQ4_NL])             \
    X("qdot.iq4_xs", qdot[QT_IQ4_XS])             \
    X("qdot.q5_k", qdot[QT_Q5_K])                 \
    X("qdot.q6_k", qdot[QT_Q6_K])                 \
    X("qdot.q4_k", qdot[QT_Q4_K])                 \
    X("kv.f32.dot", kv[0].dot)                    \
    X("kv.f32.axpy", kv[0].axpy)                  \
    X("kv.f32.attend", kv[0].attend)              \
    X("kv.f32.attend_block", kv[0].attend_block)  \
    X("kv.f16.dot", kv[1].dot)                    \
    X("kv.f16.axpy", kv[1].axpy)                  \
    X("kv.f16.attend", kv[1].attend)              \
    X("kv.f16.attend_block", kv[1].attend_block)  \
    X("kv.bf16.dot", kv[2].dot)                   \
    X("kv.bf16.axpy", kv[2].axpy)                 \
    X("kv.bf16.attend", kv[2].attend)             \
    X("kv.bf16.attend_block", kv[2].attend_block) \
    X("mla_absorb", mla_absorb)                   \
    X("dsa_scores", dsa_scores)                   \
    X("delta_recurrent", delta_recurrent)         \
    X("delta_chunked", delta_chunked)             \
    X("kda_recurrent", kda_recurrent)             \
    X("kda_chunked", kda_chunked)

static const Kernels *raw_table(KernIsa isa) {
    switch (isa) {
    case KI_PORTABLE: return &kernel_set_portable;
#if defined(__x86_64__) || defined(__i386__)
    case KI_AVX2: return &kernel_set_avx2;
    case KI_AVX512: return &kernel_set_avx512;
#endif
#if defined(__x86_64__)
    case KI_VNNI: return &kernel_set_vnni;
    case KI_AMX: return &kernel_set_amx;
#endif
#if defined(__aarch64__)
    case KI_NEON: return &kernel_set_neon;
#endif
    default: return NULL;
    }
}

/* name listed in the comma-separated list? */
static int listed(const char *list, const char *name) {
    const size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)); p += n)
        if ((p == list || p[-1] == ',') && (p[n] == ',' || !p[n])) return 1;
    return 0;
}

static void test_tables_complete(void) {
    const Kernels *port = &kernel_set_portable;
    for (int isa = 0; isa < KI_COUNT; isa++) {
        const Kernels *raw = raw_table((KernIsa)isa), *t = kernels_table((KernIsa)isa);
        char fb[1024];
        const int nfb = kernels_fallbacks((KernIsa)isa, fb, sizeof fb);
        CHECK(!raw == !t && (raw ? nfb >= 0 : nfb == -1), "%s: a table exactly where this build has the set",
              kernels_isa_name((KernIsa)isa));
        if (!raw) continue;
        CHECK(t->isa == (KernIsa)isa && !strcmp(t->name, kernels_isa_name((KernIsa)isa)), "%s: the table names its set", t->name);
        int nulls = 0;
#define CHECK_FIELD(NAME, F)                                                                                                \
    {                                                                                                                       \
        const int missing = raw->F == NULL;                                                                                 \
        nulls += missing;                                                                                                   \
        CHECK(t->F != NULL && (AnyFn)t->F == (missing ? (AnyFn)port->F : (AnyFn)raw->F), "%s: %s filled", raw->name, NAME); \
        CHECK(listed(fb, NAME) == missing, "%s: %s %s the fallbacks '%s'", raw->name, NAME,                                 \
              missing ? "missing from" : "wrongly in", fb);                                                                 \
    }
        FIELDS(CHECK_FIELD)
#undef CHECK_FIELD
        CHECK(nfb == nulls, "%s: %d fallbacks counted, %d entries NULL", raw->name, nfb, nulls);
        if (isa == KI_PORTABLE) CHECK(nulls == 0 && !fb[0], "the portable set has every entry");
    }
}

/* Spies: each records that the entry point reached it. */
static int spied;
static void spy_absorb(float *o, size_t ostep, const float *q, size_t qstep, int tn, const float *w, size_t wstride, int dn,
                       int kl) {
    (void)o, (void)ostep, (void)q, (void)qstep, (void)tn, (void)w, (void)wstride, (void)dn, (void)kl;
    spied |= 1;
}
static void spy_scores(const float *q, const float *w, int nh, int hd, const unsigned char *keys, size_t stride, int n,
                       float scale, float wscale, float *s) {
    (void)q, (void)w, (void)nh, (void)hd, (void)keys, (void)stride, (void)n, (void)scale, (void)wscale, (void)s;
    spied |= 2;
}
static void spy_rec(const DeltaIn *in, float *S, float *o) { (void)in, (void)S, (void)o, spied |= 4; }
static void spy_chunk(const DeltaIn *in, float *S, float *o, float *w) { (void)in, (void)S, (void)o, (void)w, spied |= 8; }
static void spy_kda_rec(const DeltaIn *in, float *S, float *o) { (void)in, (void)S, (void)o, spied |= 16; }
static void spy_kda_chunk(const DeltaIn *in, float *S, float *o, float *w) { (void)in, (void)S, (void)o, (void)w, spied |= 32; }
static void spy_qdot(const unsigned char *w, size_t rb, int nr, const QAct *a, int t0, int nt, float *y, size_t ldy) {
    (void)w, (void)rb, (void)a, (void)t0, (void)ldy;
    for (int i = 0; i < nt; i++)
        for (int r = 0; r < nr; r++) y[(size_t)i * ldy + r] = 0;
    spied |= 64;
}
static void spy_dequant(QType q, const void *src, int cols, float *dst) {
    (void)q, (void)src;
    memset(dst, 0, sizeof(float) * (size_t)cols);
    spied |= 128;
}

static void test_entry_points_follow_kern(void) {
    for (int isa = 0; isa < KI_COUNT; isa++) {
        if (!kernels_supported((KernIsa)isa)) continue;
        CHECK(kernels_use((KernIsa)isa) == 0 && !memcmp(&kern, kernels_table((KernIsa)isa), sizeof kern),
              "--kernels %s: the set in use is that set's table", kernels_isa_name((KernIsa)isa));
        for (int t = 0; t < 3; t++) {
            const QType qt = t == 0 ? QT_F32 : t == 1 ? QT_F16 : QT_BF16;
            CHECK(kv_kernels(qt) == &kern.kv[t] && kv_kernels_for((KernIsa)isa, qt) == &kernels_table((KernIsa)isa)->kv[t],
                  "%s: the KV kernels of %s come from the set", kern.name, qtype_name(qt));
        }
        kern.mla_absorb = spy_absorb;
        kern.dsa_scores = spy_scores;
        kern.delta_recurrent = spy_rec;
        kern.delta_chunked = spy_chunk;
        kern.kda_recurrent = spy_kda_rec;
        kern.kda_chunked = spy_kda_chunk;
        kern.qdot[QT_Q8] = spy_qdot;
        kern.qgemm[QT_Q8] = NULL; /* matmul then takes the dot */
        kern.dequant_row = spy_dequant;
        spied = 0;
        float o[4] = {0}, x[64] = {0}, y[4];
        DeltaIn in = {0};
        mla_absorb(o, 1, x, 1, 0, x, 1, 0, 0);
        dsa_scores(x, x, 1, 1, (const unsigned char *)x, 4, 0, 1, 1, o);
        delta_rule_recurrent(&in, x, o);
        delta_rule_chunked(&in, x, o, x);
        kda_recurrent(&in, x, o);
        kda_chunked(&in, x, o, x);
        unsigned char wq8[2 * 34] = {0}, wbf[2 * 64] = {0};
        const QMat q8 = {QT_Q8, 2, 32, 34, wq8}, bf = {QT_BF16, 2, 32, 64, wbf};
        matmul(y, x, 1, &q8, NULL);
        matmul(y, x, 1, &bf, NULL);
        CHECK(spied == 255, "%s: every entry point ran the set's entry (missed: 0x%x)", kernels_isa_name((KernIsa)isa),
              255 & ~spied);
    }
    kernels_init(0);
}

void test_kernel_table(void) {
    test_tables_complete();
    test_entry_points_follow_kern();
}
