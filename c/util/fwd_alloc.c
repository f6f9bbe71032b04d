#include "util/fwd_alloc.h"

#include <stdlib.h>

static int failed;
static long long fail_at = -2; /* -2: the environment not read yet; -1: the hook is off */
static long long count;

/* True when the test hook says this allocation must fail. */
static int injected_failure(void) {
    long long n, at;
#pragma omp critical(fwd_alloc_hook)
    {
        if (fail_at == -2) {
            const char *v = getenv("COLI_FAIL_ALLOC_AFTER");
            char *end;
            fail_at = v && *v ? strtoll(v, &end, 10) : -1;
            if (v && *v && (*end || fail_at < 0)) fail_at = -1;
        }
        at = fail_at;
        n = count++;
    }
    return at >= 0 && n == at;
}

static void *checked(void *p) {
    if (!p) {
#pragma omp atomic write
        failed = 1;
    }
    return p;
}

void *fwd_malloc(size_t n) { return checked(injected_failure() ? NULL : malloc(n)); }
void *fwd_calloc(size_t n, size_t size) { return checked(injected_failure() ? NULL : calloc(n, size)); }
void *fwd_aligned_alloc(size_t align, size_t n) { return checked(injected_failure() ? NULL : aligned_alloc(align, n)); }

void fwd_oom_clear(void) {
#pragma omp atomic write
    failed = 0;
}

int fwd_oom(void) {
    int f;
#pragma omp atomic read
    f = failed;
    return f;
}
