/* Allocations inside the forward pass. They may fail (a long prompt on a full machine), and the
 * protocol promises the client `ERROR <id> out_of_memory` then, not a dead engine. A failure
 * returns NULL and raises a flag, because some sites sit inside OpenMP regions that cannot return
 * an error; the code there skips its work, and forward() reports the flag as a failed pass.
 *
 * Test hook: COLI_FAIL_ALLOC_AFTER=N makes the allocation after the first N guarded ones fail,
 * once, so tests can reach every out-of-memory path deterministically. */
#ifndef COLI_FWD_ALLOC_H
#define COLI_FWD_ALLOC_H
#include <stddef.h>

void *fwd_malloc(size_t n);
void *fwd_calloc(size_t n, size_t size);
void *fwd_aligned_alloc(size_t align, size_t n);
void fwd_oom_clear(void);
int fwd_oom(void); /* did a guarded allocation fail since the last clear? */

#endif
