/* The low-bit dots of the vnni and amx sets: lowbit_avx512.c's build with AVX-512 VNNI, whose
 * multiply-add-accumulate takes one instruction where the others take two (the same bits). */
#if defined(__x86_64__) || defined(__i386__)
#define LOWBIT_TARGET "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"
#define LOWBIT_SET vnni
#define LOWBIT_ZMM 1
#define LOWBIT_VNNI 1
#include "kernels/lowbit_dots_x86.h"
#endif
