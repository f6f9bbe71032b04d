/* GGUF's K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and i-quants, stored in the container
 * byte for byte as llama.cpp writes them; docs/container.md has each block layout. A row is
 * whole blocks (256 elements, 32 for IQ4_NL): a GGUF row always is, so nothing is padded.
 *
 * Every type decodes one block into small integers and float scales, one per 16 elements:
 *   x[j] = sc[j/16] * q[j] - mn[j/16]       (mn only for Q2_K, Q4_K and Q5_K, else x = sc * q)
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

typedef void (*LowbitDecodeFn)(const unsigned char *b, LowbitBlock *o);

typedef struct {
    int block, bytes, has_min; /* elements and bytes per block; a minimum (Q2_K, Q4_K, Q5_K) */
    LowbitDecodeFn scales;     /* one block's sc (and mn) */
    LowbitDecodeFn codes;      /* one block's q: what a SIMD set may replace with its own */
} LowbitType;

/* The type's block description, NULL if qt is not a low-bit type. */
const LowbitType *lowbit_type(QType qt);
/* One block, both halves, portable. */
void lowbit_decode(const LowbitType *t, const unsigned char *b, LowbitBlock *o);
/* One weight block's share of a dot against one activation row, from the integer sums of its
 * 16-element halves (is: q . x, xs: sum of x, for the minimum) and the row's scales d of its
 * per = block/32 activation blocks, added into the row's eight lanes acc (acc[h] += v[h]):
 *   v[h] = d[h] * ((sc[2h]*is[2h] + sc[2h+1]*is[2h+1]) - (mn[2h]*xs[2h] + mn[2h+1]*xs[2h+1]))
 * block after block; the dot is then lowbit_lanes_sum(acc), the tree
 * ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)) an 8-lane vector reduces in (IQ4_NL: a0 alone, the
 * other lanes stay 0). Every set evaluates exactly this, so all give the same bits. */
void lowbit_block_add(const LowbitBlock *blk, int per, int has_min, const int32_t *is, const int32_t *xs, const float *d,
                      float *acc);
float lowbit_lanes_sum(const float *acc);

/* The activation rows rearranged for SIMD dots against 256-element blocks, once per matmul, so a
 * dot needs no horizontal sums: per row t and block k, LOWBIT_PACK_BYTES at
 * (t * nb / 8 + k) * LOWBIT_PACK_BYTES, holding
 *   int16 x[256]: vector 8p + m (16 elements), elements 2l, 2l+1 = elements 2m, 2m+1 of the
 *                 block's 16-element part 2l + p: one multiply-add per vector leaves lane l
 *                 with part 2l + p's products, the lanes lowbit_block_add's halves read;
 *   float d[8]:   the scales of the block's eight activation blocks;
 *   float xs[16]: sum of x over part 2l (xs[l]) and over part 2l + 1 (xs[8 + l]).
 * With fewer than LOWBIT_PACKED_MIN_ROWS rows, x is instead each 64 elements' even ones, then its
 * odd ones (int16 x[64g + m] = element 64g + 2m, x[64g + 32 + m] = element 64g + 2m + 1), so
 * codes widened in place (a byte's low and high half of each 16-bit lane) meet their activations.
 * Only for rows of whole 256-element blocks (nb % 8 == 0). */
#define LOWBIT_PACK_BYTES (256 * 2 + 24 * 4)
/* The dots take the pack's rearranged x from this many positions on (matmul makes the pack at
 * every count; the dots of fewer positions read its d, its sums of x and the even and odd copy):
 * below, decoding a block's codes into lanes costs more than the horizontal sums it saves. */
#define LOWBIT_PACKED_MIN_ROWS 3
size_t lowbit_pack_bytes(int T, int nb);
void lowbit_pack_act(const QAct *a, unsigned char *dst);

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
    X(iq4_xs, QT_IQ4_XS)   \
    X(q5_k, QT_Q5_K)       \
    X(q6_k, QT_Q6_K)       \
    X(q4_k, QT_Q4_K)

#endif
