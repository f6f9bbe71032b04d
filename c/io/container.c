#include "io/container.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONTAINER_FORMAT_VERSION 1

static char *read_file(const char *path, size_t *len, size_t max) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && (size_t)n <= max && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
            if (fread(buf, 1, (size_t)n, f) == (size_t)n) {
                buf[n] = 0;
                *len = (size_t)n;
            } else {
                free(buf);
                buf = NULL;
            }
        }
    }
    fclose(f);
    return buf;
}

static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull;
    while (*s) h = (h ^ (unsigned char)*s++) * 1099511628211ull;
    return h;
}

static int table_put(Container *c, const CtTensor *t) {
    size_t i = hash_name(t->st->name) & (c->cap - 1);
    while (c->table[i].st) {
        if (strcmp(c->table[i].st->name, t->st->name) == 0) return -1;
        i = (i + 1) & (c->cap - 1);
    }
    c->table[i] = *t;
    return 0;
}

const CtTensor *ct_find(const Container *c, const char *name) {
    size_t i = hash_name(name) & (c->cap - 1);
    while (c->table[i].st) {
        if (strcmp(c->table[i].st->name, name) == 0) return &c->table[i];
        i = (i + 1) & (c->cap - 1);
    }
    return NULL;
}

void ct_populate(const Container *c) {
    for (size_t i = 0; i < c->n_shards; i++) st_populate(&c->shards[i]);
}

const JsonValue *ct_manifest(const Container *c) { return json_root(c->manifest); }

/* Checks a tensor's stored dtype/shape against its declared storage type and logical shape. */
static int check_storage(const StTensor *st, QType qt, long long rows, long long cols, char *err, size_t errlen) {
    size_t rb = qtype_row_bytes(qt, (int)cols);
    const char *want = qt == QT_F32 ? "F32" : qt == QT_BF16 ? "BF16" : qt == QT_F16 ? "F16" : "U8";
    const int blocked = qt != QT_F32 && qt != QT_BF16 && qt != QT_F16; /* rows of raw block bytes */
    if (blocked && rb == 0) {                                          /* a low-bit row of partial blocks */
        snprintf(err, errlen, "tensor '%s': %s rows of %lld columns are not whole blocks; the container is corrupt", st->name,
                 qtype_name(qt), cols);
        return -1;
    }
    long long want_cols = blocked ? (long long)rb : cols;
    int ok = strcmp(st->dtype, want) == 0 && ((st->ndim == 2 && st->shape[0] == rows && st->shape[1] == want_cols) ||
                                              (st->ndim == 1 && rows == 1 && st->shape[0] == want_cols));
    if (!ok) {
        snprintf(err, errlen, "tensor '%s': stored as %s %s but declared %s [%lld, %lld]; the container is corrupt", st->name,
                 st->dtype, st->ndim == 2 ? "2-D" : "other-rank", qtype_name(qt), rows, cols);
        return -1;
    }
    return 0;
}

Container *ct_open(const char *dir, char *err, size_t errlen) {
    Container *c = calloc(1, sizeof(Container));
    char path[4096], jerr[256];
    size_t len = 0, total = 0;
    char *text = NULL;
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    c->dir = strdup(dir);
    if (!c->dir) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    snprintf(path, sizeof path, "%s/colibri.json", dir);
    text = read_file(path, &len, 64u << 20);
    if (!text) {
        snprintf(err, errlen, "%s: no colibri.json; convert a checkpoint first with: coli convert SRC %s", dir, dir);
        goto fail;
    }
    c->manifest = json_parse(text, len, jerr, sizeof jerr);
    free(text);
    text = NULL;
    if (!c->manifest) {
        snprintf(err, errlen, "%s: %s", path, jerr);
        goto fail;
    }
    const JsonValue *m = json_root(c->manifest);
    const char *fmt = json_get_str(m, "format");
    if (!fmt || strcmp(fmt, "colibri-container") != 0) {
        snprintf(err, errlen, "%s: not a colibri container manifest", path);
        goto fail;
    }
    long long ver = json_get_int(m, "format_version", -1);
    if (ver != CONTAINER_FORMAT_VERSION) {
        snprintf(err, errlen, "%s: container format version %lld, this engine reads version %d; re-run coli convert", path, ver,
                 CONTAINER_FORMAT_VERSION);
        goto fail;
    }
    const JsonValue *shards = json_get(m, "shards");
    if (!shards || shards->type != JSON_ARR || shards->len == 0 || shards->len > 100000) {
        snprintf(err, errlen, "%s: manifest lists no shards", path);
        goto fail;
    }
    c->shards = calloc(shards->len, sizeof(StFile));
    c->meta_docs = calloc(shards->len, sizeof(JsonDoc *));
    if (!c->shards || !c->meta_docs) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < shards->len; i++) {
        const JsonValue *s = &shards->items[i];
        if (s->type != JSON_STR || strchr(s->str, '/') || s->str[0] == '.') {
            snprintf(err, errlen, "%s: shard entry %zu is not a plain file name", path, i);
            goto fail;
        }
        snprintf(path, sizeof path, "%s/%s", dir, s->str);
        if (st_open(&c->shards[i], path, err, errlen)) goto fail;
        c->n_shards++;
        total += c->shards[i].n;
    }
    c->cap = 16;
    while (c->cap < total * 2) c->cap <<= 1;
    c->table = calloc(c->cap, sizeof(CtTensor));
    if (!c->table) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < c->n_shards; i++) {
        StFile *f = &c->shards[i];
        const JsonValue *meta = f->metadata ? json_get(f->metadata, "colibri.tensors") : NULL;
        if (!meta) {
            snprintf(err, errlen, "%s: shard has no colibri.tensors metadata; it was not written by coli convert", f->path);
            goto fail;
        }
        c->meta_docs[i] = json_parse(meta->str, meta->len, jerr, sizeof jerr);
        if (!c->meta_docs[i]) {
            snprintf(err, errlen, "%s: colibri.tensors metadata: %s", f->path, jerr);
            goto fail;
        }
        const JsonValue *info = json_root(c->meta_docs[i]);
        for (size_t k = 0; k < f->n; k++) {
            const StTensor *st = &f->tensors[k];
            const JsonValue *e = json_get(info, st->name);
            QType qt;
            if (!e || e->type != JSON_ARR || e->len != 3 || e->items[0].type != JSON_STR ||
                qtype_from_name(e->items[0].str, &qt) || !e->items[1].is_int || !e->items[2].is_int || e->items[1].i < 1 ||
                e->items[2].i < 1 || e->items[2].i > (1 << 30)) {
                snprintf(err, errlen, "%s: tensor '%s' has no valid storage entry in colibri.tensors", f->path, st->name);
                goto fail;
            }
            CtTensor t = {st, qt, e->items[1].i, e->items[2].i};
            if (check_storage(st, qt, t.rows, t.cols, err, errlen)) goto fail;
            if (table_put(c, &t)) {
                snprintf(err, errlen, "tensor '%s' appears in more than one shard", st->name);
                goto fail;
            }
        }
    }
    return c;
fail:
    free(text);
    ct_close(c);
    return NULL;
}

void ct_close(Container *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n_shards; i++) { st_close(&c->shards[i]); }
    if (c->meta_docs)
        for (size_t i = 0; i < c->n_shards; i++) json_free(c->meta_docs[i]);
    free(c->meta_docs);
    free(c->shards);
    free(c->table);
    json_free(c->manifest);
    free(c->dir);
    free(c);
}
