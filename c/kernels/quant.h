/* Weight storage types and row kernels. Quantized rows are a sequence of 32-element blocks
 * (a short last row is zero-padded to a whole block), so one row is always whole bytes:
 *   q8 : [f16 scale d][32 x int8 q]                      x = d*q        (34 bytes / 32)
 *   q4 : [f16 scale d][f16 min m][16 bytes, 2 nibbles]   x = d*q + m    (20 bytes / 32)
 *        byte j holds element j (low nibble) and element j+16 (high nibble).
 *   mxfp4: [e8m0 E][16 bytes, 2 e2m1 nibbles, as q4]   x = e2m1 * 2^(E-127) (17 bytes / 32;
 *          gpt-oss releases' experts kept as they ship, c/kernels/mxfp4.c)
 *   q6 : [f16 scale d][16 bytes, low 4 bits as q4][8 bytes, high 2 bits]   x = d*(u - 32)
 *        (26 bytes / 32): u = element's 6 bits; byte j of the last 8 holds the high bits of
 *        elements j, j+8, j+16, j+24 at bits 0, 2, 4, 6. Every kernel unpacks q = u - 32
 *        (-31..31) to int8 and then runs q8's arithmetic, so q6 computes what a q8 block
 *        holding the same q would. */
#ifndef COLI_QUANT_H
#define COLI_QUANT_H
#include <stddef.h>
#include <stdint.h>

#include "util/f16.h"

/* After q6: GGUF's low-bit blocks kept byte for byte (c/kernels/lowbit.h), rows of whole
 * 256-element blocks (32 for IQ4_NL). */
typedef enum {
    QT_F32 = 0,
    QT_BF16,
    QT_F16,
    QT_Q8,
    QT_Q4,
    QT_MXFP4,
    QT_Q6,
    QT_Q2_K,
    QT_Q3_K,
    QT_IQ1_S,
    QT_IQ1_M,
    QT_IQ2_XXS,
    QT_IQ2_XS,
    QT_IQ2_S,
    QT_IQ3_XXS,
    QT_IQ3_S,
    QT_IQ4_NL,
    QT_IQ4_XS,
    QT_Q5_K,
    QT_Q6_K,
    QT_Q4_K,
    QT_COUNT
} QType;

#define QBLOCK 32

/* A weight matrix as the kernels see it: rows of row_bytes in storage type qt. */
typedef struct {
    QType qt;
    int rows, cols;
    size_t row_bytes;
    const unsigned char *data;
} QMat;

const char *qtype_name(QType q);
int qtype_from_name(const char *name, QType *out); /* 0 ok, -1 unknown */
/* 0 for a low-bit type whose block does not divide cols (those rows are never padded). */
size_t qtype_row_bytes(QType q, int cols);
/* The low-bit types' rows (c/kernels/lowbit.c): bytes (0 when cols is not whole blocks or q is
 * not low-bit), and cols floats from a row of whole blocks. */
size_t lowbit_row_bytes(QType q, int cols);
void lowbit_dequant_row(QType qt, const void *src, int cols, float *dst);

/* Row codecs (portable reference; quantize is used by the converter and writes the types
 * before QT_Q2_K only: the low-bit types come from GGUF files as they are). */
void quantize_row(QType q, const float *x, int cols, void *dst);
void dequant_row(QType q, const void *src, int cols, float *dst);
/* A q6 block's 32 elements as int8 q = u - 32 (the values q8 would hold with the same scale). */
void q6_unpack_block(const unsigned char *blk, int8_t q[QBLOCK]);

/* MXFP4 codecs (c/kernels/mxfp4.c): the container row from floats (the smallest power-of-two
 * scale that fits each block), back to floats, and from a release row (blocks with byte j =
 * elements 2j and 2j+1, and its own scales bytes): codes and scales copied, no rounding. */
void mxfp4_quantize_row(const float *x, int cols, void *dst);
void mxfp4_dequant_block_row(const void *src, int cols, float *dst);
void mxfp4_from_release(const unsigned char *blocks, const unsigned char *scales, int cols, void *dst);

uint16_t f32_to_f16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f); /* round to nearest even, like torch */

/* Activation rows quantized once per matmul for the integer kernels: each row is nb blocks of
 * 32 int16, zero-padded past cols like the weights, so padded weight elements (a q4 pad
 * decodes to m, not 0) meet q = 0 and, through s, a sum over real elements only.
 *   row t, block b:  q[(t*nb + b)*32 ..],  x ~ d[b*rows + t] * q,  s[b*rows + t] = d * (sum of q)
 * d and s are block-major so one block's scales for consecutive rows load as one vector.
 * int16 rather than ggml's int8: on AVX2 the per-block cost is nearly the same (madd_epi16
 * instead of maddubs+madd) and the activation error is 258x smaller, so q8/q4 containers stay
 * within float rounding of the dequantized weights run in f32 (int8 doubled the q8 oracle KL).
 * Each row is quantized on its own, so a row's result never depends on the batch around it.
 * lp: the same rows rearranged for the low-bit dots of a set that reads them so (Kernels'
 * lowbit_pack, lowbit.h's lowbit_pack_act), or NULL; it changes no result, only the speed. */
typedef struct {
    int nb, rows;
    int16_t *q;
    float *d, *s;
    const unsigned char *lp;
} QAct;

/* Activation rows per weight pass: each weight block is unpacked once and used this many times.
 * The low-bit types take more: decoding their blocks costs more than a dot against one row. */
#define QDOT_MAX_ROWS 4
#define LOWBIT_MAX_ROWS 64
static inline int qdot_pass_rows(QType qt) { return qt >= QT_Q2_K ? LOWBIT_MAX_ROWS : QDOT_MAX_ROWS; }

/* y[i*ldy + r] = (weight row r; rows row_bytes apart) . (activation row t0+i) for r < nr and
 * i < nt <= qdot_pass_rows(the weights' type): an integer dot per block and one float
 * multiply-add per block.
 * A row pair's result does not depend on nr, nt or t0 (batched prefill = token by token). */
typedef void (*QDotFn)(const unsigned char *w, size_t row_bytes, int nr, const QAct *a, int t0, int nt, float *y, size_t ldy);

/* The portable q8/q4/q6 dots (qt) over every activation row of a: the rows a matrix kernel's
 * tiles leave over, with the same bits. */
void qdot_all_portable(QType qt, const unsigned char *w, size_t row_bytes, int nr, const QAct *a, float *y, size_t ldy);

/* Matrix x matrix over every activation row of a (a->rows positions): y[t*ldy + r] for r < nr,
 * from the activations also packed once per matmul by pack_act (pack_bytes(T, nb) bytes).
 * Same bits as qdot, so a set may use either for any batch. */
typedef void (*QGemmFn)(const unsigned char *w, size_t row_bytes, int nr, const QAct *a, const int8_t *packed, float *y,
                        size_t ldy);
/* Positions per AMX tile. */
#define AMX_TILE_T 16

#endif
