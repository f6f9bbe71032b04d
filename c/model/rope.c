/* RoPE rotation shared by the MLA block and the DSA indexer (rope.h). */
#include "model/rope.h"

#include <math.h>
#include <string.h>

void rope_rotate(float *v, const Arch *a, int dim, int pos, int interleaved) {
    const int half = dim / 2;
    float tmp[dim];
    for (int i = 0; i < half; i++) {
        float ang = a->inv_freq[i] * (float)pos; /* float product, as transformers computes it */
        float c = (float)cos((double)ang) * a->rope_scale, s = (float)sin((double)ang) * a->rope_scale;
        float x1 = interleaved ? v[2 * i] : v[i], x2 = interleaved ? v[2 * i + 1] : v[i + half];
        tmp[i] = x1 * c - x2 * s;
        tmp[i + half] = x2 * c + x1 * s;
    }
    memcpy(v, tmp, sizeof(float) * dim);
}
