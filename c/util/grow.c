#include "util/grow.h"

#include <stdint.h>
#include <stdlib.h>

void *grow_array(void *p, size_t *cap, size_t need, size_t size, size_t first) {
    if (need <= *cap && p) return p;
    if (!size) size = 1;
    size_t max = SIZE_MAX / size; /* the most elements whose bytes a size_t can count */
    if (need > max) return NULL;
    size_t c = *cap ? *cap : first ? first : 1;
    if (c > max) c = max;
    /* Doubling stops at max rather than wrapping; max >= need, so the loop ends. */
    while (c < need) c = c > max / 2 ? max : c * 2;
    void *np = realloc(p, c * size);
    if (!np) return NULL;
    *cap = c;
    return np;
}
