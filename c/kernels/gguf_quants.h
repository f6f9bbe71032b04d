/* GGUF (ggml) tensor block types as conversion sources: one row at a time to float, plus the
 * lossless "keep" paths into colibri's own q8/q4 blocks. Type names are "GGUF_<ggml name>",
 * e.g. "GGUF_Q4_K"; the numeric values are ggml's type ids. */
#ifndef COLI_GGUF_QUANTS_H
#define COLI_GGUF_QUANTS_H
#include <stddef.h>

#include "kernels/quant.h"

enum {
    GGUF_T_F32 = 0,
    GGUF_T_F16 = 1,
    GGUF_T_Q4_0 = 2,
    GGUF_T_Q4_1 = 3,
    GGUF_T_Q5_0 = 6,
    GGUF_T_Q5_1 = 7,
    GGUF_T_Q8_0 = 8,
    GGUF_T_Q2_K = 10,
    GGUF_T_Q3_K = 11,
    GGUF_T_Q4_K = 12,
    GGUF_T_Q5_K = 13,
    GGUF_T_Q6_K = 14,
    GGUF_T_IQ2_XXS = 16,
    GGUF_T_IQ2_XS = 17,
    GGUF_T_IQ3_XXS = 18,
    GGUF_T_IQ1_S = 19,
    GGUF_T_IQ4_NL = 20,
    GGUF_T_IQ3_S = 21,
    GGUF_T_IQ2_S = 22,
    GGUF_T_IQ4_XS = 23,
    GGUF_T_IQ1_M = 29,
    GGUF_T_BF16 = 30,
    GGUF_T_MXFP4 = 39
};

/* ggml type id for "GGUF_Q4_K" etc., -1 if unknown or unsupported. */
int gguf_type_from_name(const char *name);
/* Bytes of one row of cols elements; 0 if the type is unknown, cols < 1 or cols is not a
 * multiple of the type's block size. */
size_t gguf_row_bytes(int type, long long cols);
/* Decodes one row (gguf_row_bytes(type, cols) bytes) into cols floats; the caller has
 * checked gguf_row_bytes(type, cols) != 0. */
void gguf_dequant_row(int type, const void *src, long long cols, float *dst);
/* Writes the row into colibri storage qt without going through float re-quantization when
 * that is possible: byte copies (Q8_0 -> q8, Q4_1 -> q4), exact re-encodings (Q4_0 -> q4/q8,
 * Q5_0 -> q8), Q4_K -> q4 (sub-block scale and min rounded to f16, nibbles kept) and MXFP4 ->
 * mxfp4 (the same block), and each low-bit type (Q2_K, Q3_K, the IQ types) into its own
 * QType (a byte copy: the container holds GGUF's block).
 * Returns 1 if dst was written, 0 if the caller must dequantize and quantize. */
int gguf_keep_row(int type, const void *src, long long cols, QType qt, void *dst);
/* The engine QType that holds GGUF type `type`'s blocks as they are (QT_Q2_K for Q2_K, ...),
 * QT_COUNT if there is none. */
QType gguf_lowbit_qtype(int type);

#endif
