/* The kernel sets: one table per ISA (portable.c, avx2.c, avx512.c, vnni.c, amx.c, neon.c)
 * holding every kernel family, and the one place that picks a set (dispatch.c) from the CPU and
 * --kernels. The rest of the engine calls through `kern`, the set in use. An entry a set leaves
 * NULL is taken from the portable table when the set is chosen, and listed by
 * kernels_fallbacks (`colibri version`, READY), never silently. */
#ifndef COLI_KERNELS_H
#define COLI_KERNELS_H
#include <stddef.h>

#include "kernels/delta_rule.h"
#include "kernels/dsa_score.h"
#include "kernels/kv_kernels.h"
#include "kernels/mla_absorb.h"
#include "kernels/quant.h"

/* Kernel sets, best last among those a CPU runs: on x86 one that has a set has every x86 set
 * before it; neon is the AArch64 set. */
typedef enum { KI_PORTABLE = 0, KI_AVX2, KI_AVX512, KI_NEON, KI_VNNI, KI_AMX, KI_COUNT } KernIsa;

typedef void (*DeltaRuleFn)(const DeltaIn *in, float *S, float *o);
typedef void (*DeltaChunkFn)(const DeltaIn *in, float *S, float *o, float *work);

/* One kernel set: portable, AVX2+FMA+F16C, AVX-512 F/BW/VL/DQ, NEON, AVX-512 VNNI, or AMX-INT8
 * tiles on AVX-512 VNNI. */
typedef struct {
    const char *name;
    KernIsa isa;
    /* quantized rows and matrices */
    void (*dequant_row)(QType q, const void *src, int cols, float *dst);
    float (*dot)(const float *a, const float *b, int n);
    /* Quantizes activation row t of x (cols floats) into a. Bit-identical across kernels. */
    void (*quantize_act)(const float *x, int cols, const QAct *a, int t);
    QDotFn qdot[QT_COUNT];   /* QT_Q8, QT_Q4, QT_MXFP4 and QT_Q6; NULL for the float types */
    QGemmFn qgemm[QT_COUNT]; /* NULL where the set has none (matmul then uses qdot) */
    size_t (*pack_bytes)(int T, int nb);
    void (*pack_act)(const QAct *a, int8_t *dst);
    int lowbit_pack; /* its low-bit dots read the activations rearranged (QAct.lp, lowbit.h) */
    /* attention over the KV cache, per storage type: [0] f32, [1] f16, [2] bf16 */
    KvKernels kv[3];
    /* latent attention's query absorption, the DSA indexer's scores */
    MlaAbsorbFn mla_absorb;
    DsaScoreFn dsa_scores;
    /* the gated delta rule (DeltaNet) and its per-channel form (KDA) */
    DeltaRuleFn delta_recurrent;
    DeltaChunkFn delta_chunked;
    DeltaRuleFn kda_recurrent;
    DeltaChunkFn kda_chunked;
} Kernels;

/* The set in use. */
extern Kernels kern;

/* The best set this CPU runs, or portable when force_portable. */
void kernels_init(int force_portable);
const char *kernels_isa_name(KernIsa isa);
int kernels_isa_from_name(const char *name, KernIsa *out); /* 0 ok, -1 unknown */
/* "portable, avx2, avx512, vnni, amx, neon": every set's name, for messages. */
const char *kernels_all_names(void);
int kernels_supported(KernIsa isa); /* this CPU and build run it */
int kernels_use(KernIsa isa);       /* 0 ok, -1 not supported here */
/* A set's table with its portable fallbacks filled in (tests compare each set with portable);
 * NULL when this build has no such set (neon on x86, the x86 sets on AArch64). */
const Kernels *kernels_table(KernIsa isa);
/* The entries the set takes from the portable table, comma-separated into buf ("" when it has
 * them all); returns how many. -1 when this build has no such set. */
int kernels_fallbacks(KernIsa isa, char *buf, size_t len);
/* The KV kernels of an explicit set for rows stored as t; NULL if the set is not built here. */
const KvKernels *kv_kernels_for(KernIsa isa, QType t);

#endif
