/* AVX-512 (F/BW/VL/DQ) float dot, used by the bf16/f16/f32 matmuls (20-30 % faster prefill than
 * AVX2 on a Xeon). The q8/q4 integer dots stay AVX2 in this kernel set: a 512-bit version of
 * their int16 design (one vpmaddwd per 32-element block) measured 0-20 % slower than AVX2 there
 * (fewer vector ports at 512 bits, lower clocks), and VNNI's vpdpwssd gained under the noise.
 * Compiled with target attributes; kernels_use picks it at run time. */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include "kernels/isa.h"

#define A5 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

A5 float dot_avx512(const float *a, const float *b, int n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    if (i < n) { /* the tail under a mask: loads past n read nothing */
        __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
        i += 16;
        if (i < n) {
            m = (__mmask16)((1u << (n - i)) - 1);
            s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

/* The AVX-512 set: its own float dot, attention, absorption, DSA scores and delta rule; the
 * quantized dots and the KV row kernels stay AVX2's (see above, and kernels/kv_kernels.c). */
const Kernels kernel_set_avx512 = {
    .name = "avx512",
    .isa = KI_AVX512,
    .dequant_row = dequant_row_avx2,
    .dot = dot_avx512,
    .quantize_act = quantize_act_avx2,
    .qdot = {[QT_Q8] = qdot_q8_avx2,
             [QT_Q4] = qdot_q4_avx2,
             [QT_MXFP4] = qdot_mxfp4_avx2,
             [QT_Q6] = qdot_q6_avx2,
             LOWBIT_TYPES(LOWBIT_QDOT_avx512)},
    .lowbit_pack = 1,
    .kv = {{kv_dot_f32_portable, kv_axpy_f32_portable, kv_attend_avx512_f32, kv_attend_avx512_f32_block},
           {kv_dot_f16_avx2, kv_axpy_f16_avx2, kv_attend_avx512_f16, kv_attend_avx512_f16_block},
           {kv_dot_bf16_avx2, kv_axpy_bf16_avx2, kv_attend_avx512_bf16, kv_attend_avx512_bf16_block}},
    .mla_absorb = mla_absorb_avx512,
    .dsa_scores = dsa_scores_avx512,
    .delta_recurrent = delta_rule_recurrent_avx512,
    .delta_chunked = delta_rule_chunked_avx512,
    .kda_recurrent = kda_recurrent_avx512,
    .kda_chunked = kda_chunked_avx512,
};
#endif
