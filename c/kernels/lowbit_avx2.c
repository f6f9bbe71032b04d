/* The low-bit dots of the avx2 set (lowbit_dots_x86.h). */
#if defined(__x86_64__) || defined(__i386__)
#define LOWBIT_TARGET "avx2,fma,f16c"
#define LOWBIT_SET avx2
#include "kernels/lowbit_dots_x86.h"
#endif
