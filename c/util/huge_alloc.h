/* Memory for weights that are streamed every token, backed by 2 MiB pages where the kernel gives
 * them (transparent huge pages in "madvise" mode take them only when asked). Read at the memory
 * rate, 4 KiB pages cost a TLB miss every 4 KiB: eight random q4 experts of 128 from DRAM (Zen 4,
 * decode kernels) read at 14.2 GB/s on one thread and 23.4 on two in 4 KiB pages, 19.0 and
 * 27.5-31.3 in 2 MiB pages. */
#ifndef COLI_HUGE_ALLOC_H
#define COLI_HUGE_ALLOC_H
#include <stddef.h>

#define HUGE_PAGE ((size_t)2 << 20)

/* bytes of zeroed memory aligned to 2 MiB, or NULL; pages are touched only as they are used */
void *huge_alloc(size_t bytes);
void huge_free(void *p, size_t bytes);
/* size bytes of file fd mapped read-only and shared at a 2 MiB-aligned address (so a range's
 * place in a huge page is its place in the file), or NULL; munmap(p, size) undoes it */
void *huge_map_file(int fd, size_t size);
/* The page-aligned range [addr, addr + len) of a read-only mapping replaced, at the same
 * addresses, by a read-only anonymous copy in huge pages: pointers into it stay valid and the
 * file's pages become reclaimable cache. 0, or -1 where a piece could not move (the rest stays
 * mapped from the file, which reads the same). */
int huge_take_over(void *addr, size_t len);

#endif
