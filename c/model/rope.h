/* RoPE over the model's shared table (Arch.inv_freq, Arch.rope_scale), for the blocks whose
 * rotated vectors only meet in dot products (MLA and its DSA indexer). */
#ifndef COLI_ROPE_H
#define COLI_ROPE_H
#include "model/model.h"

/* Rotates v[0..dim) for position pos. interleaved: pairs (v0,v1), (v2,v3)... (DeepSeek's
 * layout), written back as halves (the cos-side results first), as transformers does; else
 * NeoX halves (v[i], v[i + dim/2]). dim <= 2 * Arch.rotary_dim/2 entries of the table. */
void rope_rotate(float *v, const Arch *a, int dim, int pos, int interleaved);

#endif
