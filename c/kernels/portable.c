/* The portable kernel set: plain C for every family, the reference every other set is tested
 * against, and the entries a set leaves NULL fall back to (dispatch.c lists them). */
#include "kernels/isa.h"

const Kernels kernel_set_portable = {
    .name = "portable",
    .isa = KI_PORTABLE,
    .dequant_row = dequant_row_portable,
    .dot = dot_portable,
    .quantize_act = quantize_act_portable,
    .qdot = {[QT_Q8] = qdot_q8_portable,
             [QT_Q4] = qdot_q4_portable,
             [QT_MXFP4] = qdot_mxfp4_portable,
             [QT_Q6] = qdot_q6_portable,
             LOWBIT_TYPES(LOWBIT_QDOT_portable)},
    .kv = {{kv_dot_f32_portable, kv_axpy_f32_portable, kv_attend_ref_f32, kv_attend_ref_f32_block},
           {kv_dot_f16_portable, kv_axpy_f16_portable, kv_attend_ref_f16, kv_attend_ref_f16_block},
           {kv_dot_bf16_portable, kv_axpy_bf16_portable, kv_attend_ref_bf16, kv_attend_ref_bf16_block}},
    .mla_absorb = mla_absorb_portable,
    .dsa_scores = dsa_scores_portable,
    .delta_recurrent = delta_rule_recurrent_portable,
    .delta_chunked = delta_rule_chunked_portable,
    .kda_recurrent = kda_recurrent_portable,
    .kda_chunked = kda_chunked_portable,
};
