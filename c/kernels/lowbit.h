/* GGUF's low-bit block types (K-quants Q2_K/Q3_K and the i-quants), stored in the container
 * byte for byte as llama.cpp writes them; docs/container.md has each block layout. A row is
 * whole blocks (256 elements, 32 for IQ4_NL): a GGUF row always is, so nothing is padded.
 *
 * Every type decodes one block into small integers and float scales, one per 16 elements:
 *   x[j] = sc[j/16] * q[j] - mn[j/16]       (mn only for Q2_K, else x = sc * q)
 * with q int8: the K-quant codes, the i-quant lattice coordinate with its sign, or for
 * IQ1_S/IQ1_M 8*(coordinate + delta) (delta = +-1/8, so q is odd and sc carries the 1/8, a
 * power of two: the product is the reference's value exactly). dequantization evaluates the
 * formula in float in the reference's order, so it equals gguf-py's bit for bit; the dots take
 * integer sums of q against the int16 activations per 16 elements. */
#ifndef COLI_LOWBIT_H
#define COLI_LOWBIT_H
#include <stdint.h>

#include "kernels/quant.h"

#define LOWBIT_MAX_BLOCK 256

typedef struct {
    int8_t q[LOWBIT_MAX_BLOCK];
    float sc[LOWBIT_MAX_BLOCK / 16], mn[LOWBIT_MAX_BLOCK / 16];
} LowbitBlock;

typedef struct {
    int block, bytes, has_min;                              /* elements and bytes per block; Q2_K's minimum */
    void (*decode)(const unsigned char *b, LowbitBlock *o); /* one block */
} LowbitType;

/* The type's block description, NULL if qt is not a low-bit type. */
const LowbitType *lowbit_type(QType qt);
/* One 32-element activation block's share of a dot, from the integer sums of its two halves
 * (h: the block's index within blk): every set combines them here, so all give the same bits. */
float lowbit_combine(const LowbitBlock *blk, int h, int has_min, int32_t is0, int32_t is1, int32_t xs0, int32_t xs1);

/* Every low-bit type as X(suffix, QType), in enum order: the kernel sets name their dots
 * qdot_<suffix>_<set>. */
#define LOWBIT_TYPES(X)    \
    X(q2_k, QT_Q2_K)       \
    X(q3_k, QT_Q3_K)       \
    X(iq1_s, QT_IQ1_S)     \
    X(iq1_m, QT_IQ1_M)     \
    X(iq2_xxs, QT_IQ2_XXS) \
    X(iq2_xs, QT_IQ2_XS)   \
    X(iq2_s, QT_IQ2_S)     \
    X(iq3_xxs, QT_IQ3_XXS) \
    X(iq3_s, QT_IQ3_S)     \
    X(iq4_nl, QT_IQ4_NL)   \
    X(iq4_xs, QT_IQ4_XS)

#endif
