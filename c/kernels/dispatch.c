/* The one place that picks a kernel set: what this CPU and build run, --kernels, and the
 * portable fallbacks of the entries a set leaves NULL. */
#include <stdio.h>
#include <string.h>

#include "kernels/isa.h"

Kernels kern;

static const char *const ISA_NAMES[KI_COUNT] = {"portable", "avx2", "avx512", "neon", "vnni", "amx"};

const char *kernels_isa_name(KernIsa isa) { return (unsigned)isa < KI_COUNT ? ISA_NAMES[isa] : "?"; }

const char *kernels_all_names(void) { return "portable, avx2, avx512, vnni, amx, neon"; }

int kernels_isa_from_name(const char *name, KernIsa *out) {
    for (int i = 0; i < KI_COUNT; i++)
        if (!strcmp(name, ISA_NAMES[i])) {
            *out = (KernIsa)i;
            return 0;
        }
    return -1;
}

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
/* The CPU has AMX-INT8 and the kernel lets this process use the tile state (Linux asks for it
 * once per process, ARCH_REQ_XCOMP_PERM; older kernels or a seccomp filter refuse it, and the
 * AVX-512 set runs instead). Asked once; every thread then inherits the permission. */
static int amx_granted(void) {
    static int granted = -1;
    if (granted < 0) {
        unsigned a, b, c, d; /* CPUID leaf 7: EDX bit 24 AMX-TILE, bit 25 AMX-INT8 */
        int cpu = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 1) && (d >> 25 & 1);
        granted = cpu && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    }
    return granted;
}
#endif

int kernels_supported(KernIsa isa) {
    if (isa == KI_PORTABLE) return 1;
#if defined(__aarch64__)
    if (isa == KI_NEON) return 1; /* part of every AArch64 CPU */
#endif
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    if (isa == KI_AVX2) return avx2;
    if (isa == KI_AVX512)
        return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#endif
#if defined(__x86_64__)
    if (isa == KI_VNNI) return kernels_supported(KI_AVX512) && __builtin_cpu_supports("avx512vnni");
    if (isa == KI_AMX) return kernels_supported(KI_VNNI) && amx_granted();
#endif
    return 0;
}

/* The table of each set this build has, as its file wrote it. */
static const Kernels *built(KernIsa isa) {
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

/* Every entry the portable set has, by name. A set may leave any of them NULL: it then runs the
 * portable one. qgemm, pack_bytes and pack_act are optional in every set (matmul runs qdot
 * without them), so they are no fallbacks. */
typedef void (*AnyFn)(void);
#define ENTRY(field) {#field, offsetof(Kernels, field)}
static const struct {
    const char *name;
    size_t off;
} ENTRIES[] = {
    ENTRY(dequant_row),
    ENTRY(dot),
    ENTRY(quantize_act),
    {"qdot.q8", offsetof(Kernels, qdot[QT_Q8])},
    {"qdot.q4", offsetof(Kernels, qdot[QT_Q4])},
    {"qdot.mxfp4", offsetof(Kernels, qdot[QT_MXFP4])},
    {"qdot.q6", offsetof(Kernels, qdot[QT_Q6])},
#define LOWBIT_ENTRY(S, QT) {"qdot." #S, offsetof(Kernels, qdot[QT])},
    LOWBIT_TYPES(LOWBIT_ENTRY)
#undef LOWBIT_ENTRY
#define KV_ENTRIES(I, T)                                                                              \
    {"kv." T ".dot", offsetof(Kernels, kv[I].dot)}, {"kv." T ".axpy", offsetof(Kernels, kv[I].axpy)}, \
        {"kv." T ".attend", offsetof(Kernels, kv[I].attend)}, {                                       \
        "kv." T ".attend_block", offsetof(Kernels, kv[I].attend_block)                                \
    }
        KV_ENTRIES(0, "f32"),
    KV_ENTRIES(1, "f16"),
    KV_ENTRIES(2, "bf16"),
    ENTRY(mla_absorb),
    ENTRY(dsa_scores),
    ENTRY(delta_recurrent),
    ENTRY(delta_chunked),
    ENTRY(kda_recurrent),
    ENTRY(kda_chunked),
};
#define N_ENTRIES (sizeof ENTRIES / sizeof ENTRIES[0])

static AnyFn entry(const Kernels *k, size_t i) {
    AnyFn f;
    memcpy(&f, (const char *)k + ENTRIES[i].off, sizeof f);
    return f;
}

static Kernels filled[KI_COUNT];
static unsigned char fallback[KI_COUNT][N_ENTRIES];
static int filled_done[KI_COUNT];

const Kernels *kernels_table(KernIsa isa) {
    if ((unsigned)isa >= KI_COUNT || !built(isa)) return NULL;
    if (!filled_done[isa]) { /* once, before any thread runs a kernel (kernels_init at start) */
        filled[isa] = *built(isa);
        for (size_t i = 0; i < N_ENTRIES; i++) {
            if (entry(&filled[isa], i)) continue;
            const AnyFn f = entry(&kernel_set_portable, i);
            memcpy((char *)&filled[isa] + ENTRIES[i].off, &f, sizeof f);
            fallback[isa][i] = 1;
        }
        filled_done[isa] = 1;
    }
    return &filled[isa];
}

int kernels_fallbacks(KernIsa isa, char *buf, size_t len) {
    if (len) buf[0] = 0;
    if (!kernels_table(isa)) return -1;
    int n = 0;
    size_t at = 0;
    for (size_t i = 0; i < N_ENTRIES; i++) {
        if (!fallback[isa][i]) continue;
        int w = snprintf(buf + at, at < len ? len - at : 0, "%s%s", n ? "," : "", ENTRIES[i].name);
        if (w > 0) at += (size_t)w;
        n++;
    }
    return n;
}

int kernels_use(KernIsa isa) {
    if ((unsigned)isa >= KI_COUNT || !kernels_supported(isa) || !kernels_table(isa)) return -1;
    kern = *kernels_table(isa);
    return 0;
}

void kernels_init(int force_portable) {
    KernIsa best = KI_PORTABLE;
    for (int i = KI_COUNT - 1; i > 0 && !force_portable; i--)
        if (kernels_supported((KernIsa)i)) {
            best = (KernIsa)i;
            break;
        }
    kernels_use(best);
}

const KvKernels *kv_kernels_for(KernIsa isa, QType t) {
    const Kernels *k = kernels_table(isa);
    const int i = kv_type_index(t);
    return k && i >= 0 ? &k->kv[i] : NULL;
}
