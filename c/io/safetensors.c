#include "io/safetensors.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/huge_alloc.h"

#define ST_MAX_HEADER (256u << 20)

size_t st_dtype_size(const char *d) {
    static const struct {
        const char *n;
        size_t s;
    } T[] = {{"F64", 8}, {"I64", 8}, {"U64", 8}, {"F32", 4}, {"I32", 4},  {"U32", 4},     {"F16", 2},    {"BF16", 2},
             {"I16", 2}, {"U16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
        if (strcmp(d, T[i].n) == 0) return T[i].s;
    return 0;
}

static int by_offset(const void *a, const void *b) {
    const StTensor *x = *(const StTensor *const *)a, *y = *(const StTensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

#define FAIL(...)                           \
    do {                                    \
        snprintf(err, errlen, __VA_ARGS__); \
        goto fail;                          \
    } while (0)

int st_open(StFile *f, const char *path, char *err, size_t errlen) {
    memset(f, 0, sizeof(*f));
    StTensor **order = NULL;
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot open", path);
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        snprintf(err, errlen, "%s: not a regular file", path);
        return -1;
    }
    f->size = (size_t)st.st_size;
    f->path = strdup(path);
    if (!f->path) FAIL("%s: out of memory", path);
    if (f->size < 8) FAIL("%s: file too short for a safetensors header (%zu bytes)", path, f->size);
    if (!(f->map = huge_map_file(fd, f->size))) FAIL("%s: mmap failed", path);
    close(fd);
    fd = -1;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | f->map[i];
    if (hlen > ST_MAX_HEADER || hlen > f->size - 8)
        FAIL("%s: header length %llu exceeds the file (%zu bytes) or the %u MiB cap; the file is truncated or not safetensors",
             path, (unsigned long long)hlen, f->size, ST_MAX_HEADER >> 20);
    f->data_start = 8 + hlen;
    char jerr[200];
    f->header = json_parse((const char *)f->map + 8, hlen, jerr, sizeof jerr);
    if (!f->header) FAIL("%s: bad safetensors header: %s", path, jerr);
    const JsonValue *root = json_root(f->header);
    if (root->type != JSON_OBJ) FAIL("%s: safetensors header is not a JSON object", path);
    f->tensors = calloc(root->len ? root->len : 1, sizeof(StTensor));
    order = calloc(root->len ? root->len : 1, sizeof(StTensor *));
    if (!f->tensors || !order) FAIL("%s: out of memory", path);
    uint64_t data_size = f->size - f->data_start;
    for (size_t i = 0; i < root->len; i++) {
        const char *name = root->keys[i];
        const JsonValue *v = &root->items[i];
        if (strcmp(name, "__metadata__") == 0) {
            if (v->type != JSON_OBJ) FAIL("%s: __metadata__ is not an object", path);
            for (size_t k = 0; k < v->len; k++)
                if (v->items[k].type != JSON_STR) FAIL("%s: __metadata__ value '%s' is not a string", path, v->keys[k]);
            f->metadata = v;
            continue;
        }
        StTensor *t = &f->tensors[f->n];
        t->name = name;
        const char *dt = json_get_str(v, "dtype");
        const JsonValue *shape = json_get(v, "shape"), *offs = json_get(v, "data_offsets");
        if (!dt || !shape || shape->type != JSON_ARR || !offs || offs->type != JSON_ARR || offs->len != 2)
            FAIL("%s: tensor '%s' lacks dtype, shape or data_offsets", path, name);
        size_t es = st_dtype_size(dt);
        if (!es || strlen(dt) >= sizeof t->dtype) FAIL("%s: tensor '%s' has unknown dtype '%s'", path, name, dt);
        strcpy(t->dtype, dt);
        if (shape->len > ST_MAX_DIMS) FAIL("%s: tensor '%s' has %zu dimensions (max %d)", path, name, shape->len, ST_MAX_DIMS);
        t->ndim = (int)shape->len;
        uint64_t count = 1;
        for (int d = 0; d < t->ndim; d++) {
            const JsonValue *s = &shape->items[d];
            if (s->type != JSON_NUM || !s->is_int || s->i < 0) FAIL("%s: tensor '%s' has a bad shape", path, name);
            t->shape[d] = s->i;
            if (s->i && count > UINT64_MAX / (uint64_t)s->i) FAIL("%s: tensor '%s' shape overflows", path, name);
            count *= (uint64_t)s->i;
        }
        const JsonValue *a = &offs->items[0], *b = &offs->items[1];
        if (a->type != JSON_NUM || !a->is_int || b->type != JSON_NUM || !b->is_int || a->i < 0 || b->i < a->i)
            FAIL("%s: tensor '%s' has bad data_offsets", path, name);
        if ((uint64_t)b->i > data_size)
            FAIL("%s: tensor '%s' ends at byte %lld past the end of the data (%llu bytes); the file is truncated", path, name,
                 (long long)b->i, (unsigned long long)data_size);
        t->nbytes = (uint64_t)(b->i - a->i);
        if (count > UINT64_MAX / es || count * es != t->nbytes)
            FAIL("%s: tensor '%s' has %llu bytes but its dtype and shape need %llu", path, name, (unsigned long long)t->nbytes,
                 (unsigned long long)(count * es));
        t->offset = f->data_start + (uint64_t)a->i;
        t->data = f->map + t->offset;
        order[f->n] = t;
        f->n++;
    }
    qsort(order, f->n, sizeof *order, by_offset);
    for (size_t i = 1; i < f->n; i++)
        if (order[i]->offset < order[i - 1]->offset + order[i - 1]->nbytes)
            FAIL("%s: tensors '%s' and '%s' overlap", path, order[i - 1]->name, order[i]->name);
    free(order);
    return 0;
fail:
    free(order);
    if (fd >= 0) close(fd);
    st_close(f);
    return -1;
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14; older kernels answer EINVAL and take the loop */
#endif

/* Maps the whole file into the page tables now. A resident model's weights are read from this
 * mapping; left to fault in on first use, a short prompt's decode took each expert's first use as
 * a page fault per 4 KiB (a 24-layer MoE decoded at 8 tok/s instead of 17 for its first 64
 * tokens). */
void st_populate(const StFile *f) {
    if (!f->map) return;
    if (madvise(f->map, f->size, MADV_POPULATE_READ) == 0) return;
    const long page = sysconf(_SC_PAGESIZE);
    volatile unsigned char sink = 0;
    for (size_t o = 0; o < f->size; o += (size_t)page) sink ^= f->map[o];
    (void)sink;
}

void st_close(StFile *f) {
    if (f->map) munmap(f->map, f->size);
    json_free(f->header);
    free(f->tensors);
    free(f->path);
    memset(f, 0, sizeof(*f));
}
