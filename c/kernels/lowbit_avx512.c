/* The low-bit dots of the avx512 set (lowbit_vnni.c builds them again for vnni and amx):
 * lowbit_dots_x86.h's AVX2 code compiled for AVX-512VL, so it has 32 vector registers (1.4x the
 * prefill dots' rate on Zen 4; the same bits), and its 512-bit dots of few positions. */
#if defined(__x86_64__) || defined(__i386__)
#define LOWBIT_TARGET "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"
#define LOWBIT_SET avx512
#define LOWBIT_ZMM 1 /* the dots of few positions take 512-bit multiply-adds */
#include "kernels/lowbit_dots_x86.h"
#endif
