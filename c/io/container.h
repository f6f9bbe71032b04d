/* A colibri container: colibri.json (manifest with the normalized architecture) plus
 * safetensors shards whose "colibri.tensors" metadata records each tensor's storage type. */
#ifndef COLI_CONTAINER_H
#define COLI_CONTAINER_H
#include <stddef.h>

#include "io/json.h"
#include "kernels/quant.h"
#include "io/safetensors.h"

typedef struct {
    const StTensor *st;
    QType qt;
    long long rows, cols;
} CtTensor;

struct Container {
    char *dir;
    JsonDoc *manifest;
    StFile *shards;
    size_t n_shards;
    JsonDoc **meta_docs; /* parsed "colibri.tensors" per shard */
    CtTensor *table;     /* open addressing by name */
    size_t cap;
};
typedef struct Container Container;

Container *ct_open(const char *dir, char *err, size_t errlen);
void ct_close(Container *c);
/* Every shard's pages mapped now: only for a model read in place (no expert ranges unmapped). */
void ct_populate(const Container *c);
const JsonValue *ct_manifest(const Container *c);
const CtTensor *ct_find(const Container *c, const char *name);

#endif
