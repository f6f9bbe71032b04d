/* The i-quant lattices (generated into lowbit_grids.c by tools/gen_lowbit_grids.py from the
 * `gguf` package): one row per lattice point, the point's 8 (or 4) coordinates. */
#ifndef COLI_LOWBIT_GRIDS_H
#define COLI_LOWBIT_GRIDS_H
#include <stdint.h>

extern const int8_t iq2xxs_grid[256][8]; /* values 8, 25, 43 */
extern const int8_t iq2xs_grid[512][8];
extern const int8_t iq2s_grid[1024][8];
extern const int8_t iq3xxs_grid[256][4]; /* values 4 .. 62 */
extern const int8_t iq3s_grid[512][4];   /* odd values 1 .. 15 */
extern const int8_t iq1s_grid[2048][8];  /* values -1, 0, 1 */
/* Sign byte of 7 stored sign bits: bit 7 makes the count of minus signs even. */
extern const uint8_t lowbit_ksigns[128];
extern const int8_t kvalues_iq4nl[16]; /* IQ4_NL/IQ4_XS's non-linear 4-bit codebook */

#endif
