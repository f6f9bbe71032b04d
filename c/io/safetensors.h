/* Strict safetensors shard reader: every header offset, dtype and shape is validated before
 * any tensor byte is touched, so a corrupt or hostile file is a clear error, never a crash. */
#ifndef COLI_SAFETENSORS_H
#define COLI_SAFETENSORS_H
#include <stddef.h>
#include <stdint.h>

#include "io/json.h"

#define ST_MAX_DIMS 8

typedef struct {
    const char *name;
    char dtype[12];
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t offset; /* absolute file offset of the first byte */
    uint64_t nbytes;
    const unsigned char *data; /* inside the mapping */
} StTensor;

typedef struct {
    char *path;
    unsigned char *map;
    size_t size;
    uint64_t data_start;
    StTensor *tensors;
    size_t n;
    JsonDoc *header;           /* owns tensor names */
    const JsonValue *metadata; /* "__metadata__" object or NULL */
} StFile;

int st_open(StFile *f, const char *path, char *err, size_t errlen);
void st_close(StFile *f);
void st_populate(const StFile *f);       /* fault every page of the mapping in now */
size_t st_dtype_size(const char *dtype); /* 0 when unknown */

#endif
