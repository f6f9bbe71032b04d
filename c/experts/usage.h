/* Learned expert usage, `.coli_usage` next to colibri.json: routing counts summed over turns,
 * read at start-up to pin the hottest experts (docs/architecture.md). The file is written with
 * tmp + fsync + rename, so a crash leaves the previous file or the new one, never a torn one.
 * Its size is bounded: L x E counts, halved together whenever one passes USAGE_MAX_COUNT. */
#ifndef COLI_USAGE_H
#define COLI_USAGE_H
#include <stddef.h>
#include <stdint.h>

#define USAGE_MAX_COUNT (1ull << 40)

typedef struct {
    int layers, experts;
    uint64_t turns;
    uint64_t *counts; /* [layers][experts] */
} Usage;

/* Empty usage for the geometry; 0 ok, -1 out of memory. */
int usage_init(Usage *u, int layers, int experts);
void usage_free(Usage *u);
/* Reads path into u (initialised for its geometry). 1 loaded; 0 no file; -1 ignored (corrupt or
 * another geometry), with warn saying why. u keeps zero counts unless loaded. */
int usage_load(Usage *u, const char *path, char *warn, size_t warnlen);
/* Adds one turn's counts [layers][experts]. */
void usage_add(Usage *u, const uint32_t *turn);
/* 0 ok; -1 with err (e.g. a read-only model directory). */
int usage_save(const Usage *u, const char *path, char *err, size_t errlen);

#endif
