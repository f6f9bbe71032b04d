/* huge_alloc.c: aligned anonymous memory, 2 MiB-aligned file mappings, and a mapped range taken
 * over by an anonymous copy at the same addresses. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "util/huge_alloc.h"

static unsigned char byte_at(size_t i) { return (unsigned char)(i * 131 + (i >> 12)); }

void test_huge_alloc(void) {
    unsigned char *a = huge_alloc(5u << 20);
    CHECK(a && ((uintptr_t)a & (HUGE_PAGE - 1)) == 0, "huge_alloc gave %p", (void *)a);
    if (a) {
        int zero = 1;
        for (size_t i = 0; i < (5u << 20); i += 4093) zero &= a[i] == 0;
        CHECK(zero, "huge_alloc's memory is not zeroed");
        memset(a, 7, 5u << 20);
        huge_free(a, 5u << 20);
    }
    CHECK(huge_alloc(0) == NULL, "huge_alloc(0) gave memory");

    /* a file over two take-over pieces (64 MiB each), ending mid-page */
    char path[] = "/tmp/coli_huge_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp failed");
    if (fd < 0) return;
    const size_t size = (size_t)70 << 20 | 123;
    unsigned char *buf = malloc(size);
    for (size_t i = 0; i < size; i++) buf[i] = byte_at(i);
    CHECK(write(fd, buf, size) == (ssize_t)size, "short write");
    unsigned char *m = huge_map_file(fd, size);
    CHECK(m && ((uintptr_t)m & (HUGE_PAGE - 1)) == 0, "huge_map_file gave %p", (void *)m);
    if (!m) {
        close(fd);
        unlink(path);
        free(buf);
        return;
    }
    CHECK(!memcmp(m, buf, size), "the mapping differs from the file");
    /* pages [1, end of the file's last page) move; page 0 stays the file's */
    const size_t lo = 4096, hi = (size + 4095) & ~(size_t)4095;
    CHECK(huge_take_over(m + lo, hi - lo) == 0, "huge_take_over failed");
    CHECK(!memcmp(m, buf, size), "the contents changed in the take-over");
    /* the file changes under both: the shared page shows it, the copy does not */
    const unsigned char x = (unsigned char)~byte_at(0), y = (unsigned char)~byte_at(size - 1);
    CHECK(pwrite(fd, &x, 1, 0) == 1 && pwrite(fd, &y, 1, (off_t)(size - 1)) == 1, "pwrite failed");
    CHECK(m[0] == x, "page 0 no longer shows the file");
    CHECK(m[size - 1] == byte_at(size - 1), "the taken-over range still shows the file");
    CHECK(m[(size_t)65 << 20] == byte_at((size_t)65 << 20), "the second piece differs");
    munmap(m, size);
    close(fd);
    unlink(path);
    free(buf);
}
