/* The vnni set's q8/q4/q6 matmul (AVX-512 VNNI without AMX tiles: AMD Zen 4, Intel Ice Lake and
 * Cascade Lake): every batch runs on the small-batch kernel of kernels/vnni_small.c, which loads
 * and transposes each 16-row weight block once for up to VNNI_SMALL_T positions and leaves each
 * row's exact block dot in its own lane. Prefill takes the positions VNNI_SMALL_T at a time over
 * a strip of rows small enough to stay in L2, so the strip comes from memory once per batch.
 * Same bits as the portable kernels whatever the batch (the kernel tests compare them).
 *
 * Compiled with target attributes; kernels_use picks it at run time. */
#if defined(__x86_64__)
#include "kernels/vnni_small.h"
#include "kernels/isa.h"

/* Weight bytes per strip: a quarter of a 1 MB L2, so the strip and the positions' packed
 * activations it meets stay there while every position group passes over it. */
#define STRIP_BYTES (256 * 1024)

size_t vnni_pack_bytes(int T, int nb) { return vnni_small_pack_bytes(T, nb); }

void vnni_pack_act(const QAct *a, int8_t *dst) { vnni_small_pack(a, 0, a->rows, dst); }

typedef void (*SmallFn)(const unsigned char *, size_t, int, const QAct *, int, int, const int8_t *, float *, size_t);

static void gemm(SmallFn small, QType qt, const unsigned char *w, size_t row_bytes, int nr, const QAct *a, const int8_t *packed,
                 float *y, size_t ldy) {
    const int T = a->rows, full = nr / 16 * 16;
    int strip = (int)(STRIP_BYTES / row_bytes) / 16 * 16;
    if (strip < 16) strip = 16;
    if (T <= VNNI_SMALL_T) strip = full; /* one pass: nothing to keep for a second one */
    for (int r0 = 0; r0 < full; r0 += strip) {
        const int n16 = full - r0 < strip ? full - r0 : strip;
        for (int t0 = 0; t0 < T; t0 += VNNI_SMALL_T) {
            const int n = T - t0 < VNNI_SMALL_T ? T - t0 : VNNI_SMALL_T;
            small(w + (size_t)r0 * row_bytes, row_bytes, n16, a, t0, n, packed + vnni_small_pack_bytes(t0, a->nb),
                  y + (size_t)t0 * ldy + r0, ldy);
        }
    }
    /* rows past the last whole 16: the portable kernel, which computes the same bits */
    if (full < nr) qdot_all_portable(qt, w + (size_t)full * row_bytes, row_bytes, nr - full, a, y + full, ldy);
}

void qgemm_q8_vnni(const unsigned char *w, size_t row_bytes, int nr, const QAct *a, const int8_t *packed, float *y, size_t ldy) {
    gemm(vnni_small_q8, QT_Q8, w, row_bytes, nr, a, packed, y, ldy);
}

void qgemm_q4_vnni(const unsigned char *w, size_t row_bytes, int nr, const QAct *a, const int8_t *packed, float *y, size_t ldy) {
    gemm(vnni_small_q4, QT_Q4, w, row_bytes, nr, a, packed, y, ldy);
}

void qgemm_q6_vnni(const unsigned char *w, size_t row_bytes, int nr, const QAct *a, const int8_t *packed, float *y, size_t ldy) {
    gemm(vnni_small_q6, QT_Q6, w, row_bytes, nr, a, packed, y, ldy);
}

/* The VNNI set: the AVX-512 set with every q8/q4/q6 batch on the small-batch kernel (the same
 * bits as the dots, which serve the rest). */
const Kernels kernel_set_vnni = {
    .name = "vnni",
    .isa = KI_VNNI,
    .dequant_row = dequant_row_avx2,
    .dot = dot_avx512,
    .quantize_act = quantize_act_avx2,
    .qdot = {[QT_Q8] = qdot_q8_avx2,
             [QT_Q4] = qdot_q4_avx2,
             [QT_MXFP4] = qdot_mxfp4_avx2,
             [QT_Q6] = qdot_q6_avx2,
             LOWBIT_TYPES(LOWBIT_QDOT_vnni)},
    .lowbit_pack = 1,
    .qgemm = {[QT_Q8] = qgemm_q8_vnni, [QT_Q4] = qgemm_q4_vnni, [QT_Q6] = qgemm_q6_vnni},
    .pack_bytes = vnni_pack_bytes,
    .pack_act = vnni_pack_act,
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
