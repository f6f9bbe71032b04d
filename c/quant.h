/* Weight storage types and row kernels. Quantized rows are a sequence of 32-element blocks
 * (a short last row is zero-padded to a whole block), so one row is always whole bytes:
 *   q8 : [f16 scale d][32 x int8 q]                      x = d*q        (34 bytes / 32)
 *   q4 : [f16 scale d][f16 min m][16 bytes, 2 nibbles]   x = d*q + m    (20 bytes / 32)
 *        byte j holds element j (low nibble) and element j+16 (high nibble). */
#ifndef COLI_QUANT_H
#define COLI_QUANT_H
#include <stddef.h>
#include <stdint.h>

typedef enum { QT_F32 = 0, QT_BF16, QT_F16, QT_Q8, QT_Q4, QT_COUNT } QType;

#define QBLOCK 32

const char *qtype_name(QType q);
int qtype_from_name(const char *name, QType *out); /* 0 ok, -1 unknown */
size_t qtype_row_bytes(QType q, int cols);

/* Row codecs (portable reference; quantize is used by the converter). */
void quantize_row(QType q, const float *x, int cols, void *dst);
void dequant_row(QType q, const void *src, int cols, float *dst);

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f); /* round to nearest even, like torch */

/* Run-time selected kernels (portable or AVX2). */
typedef struct {
    const char *name;
    void (*dequant_row)(QType q, const void *src, int cols, float *dst);
    float (*dot)(const float *a, const float *b, int n);
} Kernels;
extern Kernels kern;
void kernels_init(int force_portable);

#endif
