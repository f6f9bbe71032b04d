/* IEEE half to float, exact (every f16 is a float): the scale fields of quantized blocks, read
 * by the kernels of every band above. */
#ifndef COLI_UTIL_F16_H
#define COLI_UTIL_F16_H
#include <stdint.h>

float f16_to_f32(uint16_t h);

#endif
