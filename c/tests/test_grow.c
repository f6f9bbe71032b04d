/* grow_array: the doubling every growable array in the engine goes through. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "util/grow.h"

void test_grow(void) {
    /* from nothing: the first capacity, even when fewer are needed */
    size_t cap = 0;
    int *v = grow_array(NULL, &cap, 1, sizeof *v, 16);
    CHECK(v && cap == 16, "first growth gave cap %zu", cap);
    if (!v) return;
    for (int i = 0; i < 16; i++) v[i] = i;

    /* an exact fit keeps the array as it is */
    int *same = grow_array(v, &cap, 16, sizeof *v, 16);
    CHECK(same == v && cap == 16, "exact fit moved the array or changed cap to %zu", cap);

    /* one more doubles; a bigger need doubles until it fits; the contents stay */
    v = grow_array(v, &cap, 17, sizeof *v, 16);
    CHECK(v && cap == 32, "17 of 16 gave cap %zu", cap);
    if (!v) return;
    v = grow_array(v, &cap, 100, sizeof *v, 16);
    CHECK(v && cap == 128, "100 of 32 gave cap %zu", cap);
    if (!v) return;
    int ok = 1;
    for (int i = 0; i < 16; i++) ok &= v[i] == i;
    CHECK(ok, "the contents did not survive growth");

    /* need * size overflowing size_t is refused, the array and cap untouched */
    int *keep = v;
    size_t before = cap;
    CHECK(!grow_array(v, &cap, SIZE_MAX / sizeof *v + 1, sizeof *v, 16), "an overflowing need was granted");
    CHECK(cap == before && v == keep && v[15] == 15, "a refused growth changed the array (cap %zu)", cap);
    free(v);

    /* need 0 on an empty array still allocates, so NULL only ever means failure */
    cap = 0;
    char *b = grow_array(NULL, &cap, 0, 1, 8);
    CHECK(b && cap == 8, "need 0 from empty gave %p cap %zu", (void *)b, cap);
    free(b);
}
