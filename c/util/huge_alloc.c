#include "util/huge_alloc.h"

#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

static size_t round_up(size_t n) { return (n + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1); }

static void advise_huge(void *p, size_t len) {
#ifdef MADV_HUGEPAGE
    madvise(p, len, MADV_HUGEPAGE); /* advice: where refused, 4 KiB pages work the same */
#else
    (void)p, (void)len;
#endif
}

/* len bytes of address space at an address whose offset in a huge page is phase, or NULL: a
 * mapping one huge page longer, trimmed. */
static unsigned char *place(size_t len, size_t phase, int prot, int flags) {
    unsigned char *raw = mmap(NULL, len + HUGE_PAGE, prot, flags | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    unsigned char *p = (unsigned char *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1)) + phase;
    if (p >= raw + HUGE_PAGE) p -= HUGE_PAGE;
    if (p > raw) munmap(raw, (size_t)(p - raw));
    if (raw + HUGE_PAGE > p) munmap(p + len, (size_t)(raw + HUGE_PAGE - p));
    return p;
}

void *huge_alloc(size_t bytes) {
    if (!bytes) return NULL;
    unsigned char *p = place(round_up(bytes), 0, PROT_READ | PROT_WRITE, 0);
    if (p) advise_huge(p, round_up(bytes));
    return p;
}

void huge_free(void *p, size_t bytes) {
    if (p) munmap(p, round_up(bytes));
}

void *huge_map_file(int fd, size_t size) {
    const size_t len = (size + 4095) & ~(size_t)4095;
    unsigned char *at = place(len, 0, PROT_NONE, 0);
    if (!at) return NULL;
    void *p = mmap(at, size, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
        munmap(at, len);
        return NULL;
    }
    return p;
}

/* One piece of huge_take_over: its copy made, then moved in as whole page tables (at the same
 * phase its huge pages stay huge). */
static int take_over_piece(unsigned char *addr, size_t len) {
    unsigned char *q = place(len, (uintptr_t)addr & (HUGE_PAGE - 1), PROT_READ | PROT_WRITE, 0);
    if (!q) return -1;
    advise_huge(q, len);
    memcpy(q, addr, len);
    if (mprotect(q, len, PROT_READ) || mremap(q, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, addr) == MAP_FAILED) {
        munmap(q, len);
        return -1;
    }
    return 0;
}

/* In pieces of 64 MiB, so that no more than one piece is held twice at a time. */
int huge_take_over(void *addr, size_t len) {
    const size_t piece = 32 * HUGE_PAGE;
    for (size_t o = 0; o < len; o += piece)
        if (take_over_piece((unsigned char *)addr + o, len - o < piece ? len - o : piece)) return -1;
    return 0;
}
