/* Growing an array by doubling, the one mechanism the tokenizer, grammar, JSON and protocol
 * code all need. The pointer comes back rather than through a void ** (which would alias a
 * T ** as void ** and is undefined behaviour), so a call reads
 *
 *     T *v = grow_array(a->v, &a->cap, a->n + 1, sizeof *v, 64);
 *     if (!v) return -1;   (a->v and a->cap are still the old, valid ones)
 *     a->v = v;
 */
#ifndef COLI_GROW_H
#define COLI_GROW_H
#include <stddef.h>

/* Makes room for `need` elements of `size` bytes in `p`, whose capacity is *cap elements. When
 * they fit already, returns p as it is. Otherwise the capacity doubles from *cap (from `first`
 * when *cap is 0) until it holds `need`, p is realloc'ed to it and *cap updated. Returns NULL,
 * leaving p and *cap untouched, when realloc fails or need * size would overflow size_t.
 * A NULL p with need 0 still gets `first` elements, so NULL always means failure. */
void *grow_array(void *p, size_t *cap, size_t need, size_t size, size_t first);

#endif
