/* Shared helpers for the libFuzzer harnesses: parsers that take a path get the fuzz input
 * through a file in a private temporary directory, so the real entry point runs unchanged. */
#ifndef COLI_FUZZ_HARNESS_H
#define COLI_FUZZ_HARNESS_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The fixture model (a 1-layer llama converted by coli convert); the Makefile passes its path. */
#ifndef FUZZ_ASSETS
#define FUZZ_ASSETS "fuzz/assets/tiny"
#endif

static inline const char *fuzz_tmpdir(void) {
    static char dir[64];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/coli_fuzz_XXXXXX");
        if (!mkdtemp(dir)) {
            perror("mkdtemp");
            abort();
        }
    }
    return dir;
}

/* Writes bytes to DIR/name (replacing it) and returns the path (static buffer). */
static inline const char *fuzz_write(const char *dir, const char *name, const void *p, size_t n) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f)) {
        perror(path);
        abort();
    }
    return path;
}

/* Whole file into a malloc'd buffer; aborts when the fixture is missing (a broken setup, not a finding). */
static inline char *fuzz_slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz: cannot open fixture %s\n", path);
        abort();
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (!b || fread(b, 1, (size_t)n, f) != (size_t)n) abort();
    b[n] = 0;
    fclose(f);
    *len = (size_t)n;
    return b;
}

#endif
