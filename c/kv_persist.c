#include "kv_persist.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* v2: the layers' state as their descriptors lay it out, in the slot's KV element type. */
#define KV_MAGIC "COLIKV02"

typedef struct {
    char magic[8];
    uint64_t fingerprint;
    uint32_t n, n_layers, kv_type, reserved;
    uint64_t per_pos, fixed; /* sums over the layers' descriptors: a cross-check of the layout */
} KvHeader;

static void layout(const KvCache *kv, uint64_t *per_pos, uint64_t *fixed) {
    *per_pos = *fixed = 0;
    for (int l = 0; l < kv->n_layers; l++) {
        *per_pos += kv->layer[l].per_pos;
        *fixed += kv->layer[l].fixed_bytes;
    }
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

uint64_t kv_fingerprint(const char *model_dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/colibri.json", model_dir);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    uint64_t h = 1469598103934665603ull;
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) h = fnv(h, buf, n);
    fclose(f);
    return h;
}

static int write_all(int fd, const void *p, size_t n, uint64_t *sum) {
    const char *c = p;
    *sum = fnv(*sum, p, n);
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

int kv_save(const KvCache *kv, const Arch *a, uint64_t fp, const char *path, char *err, size_t errlen) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) { snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno)); return -1; }
    KvHeader h = {KV_MAGIC, fp, (uint32_t)kv->n, (uint32_t)a->n_layers, (uint32_t)kv->type, 0, 0, 0};
    memcpy(h.magic, KV_MAGIC, 8);
    layout(kv, &h.per_pos, &h.fixed);
    uint64_t sum = 1469598103934665603ull;
    int bad = write_all(fd, &h, sizeof h, &sum) || write_all(fd, kv->tokens, sizeof(int32_t) * (size_t)kv->n, &sum);
    for (int l = 0; l < a->n_layers && !bad; l++) {
        const KvLayer *y = &kv->layer[l];
        bad = write_all(fd, y->pos, y->per_pos * (size_t)kv_held(kv, l), &sum) || write_all(fd, y->fixed, y->fixed_bytes, &sum);
    }
    uint64_t check = sum;
    bad = bad || write_all(fd, &check, sizeof check, &sum) || fsync(fd);
    if (close(fd)) bad = 1;
    if (bad || rename(tmp, path)) {
        snprintf(err, errlen, "cannot save KV state to %s: %s (disk full?)", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", path);
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) { fsync(dfd); close(dfd); }
    return 0;
}

static int read_all(FILE *f, void *p, size_t n, uint64_t *sum) {
    if (fread(p, 1, n, f) != n) return -1;
    *sum = fnv(*sum, p, n);
    return 0;
}

int kv_restore(KvCache *kv, const Arch *a, uint64_t fp, const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    KvHeader h;
    uint64_t per_pos, fixed;
    layout(kv, &per_pos, &fixed);
    uint64_t sum = 1469598103934665603ull, check;
    int rc = -1;
    if (read_all(f, &h, sizeof h, &sum) || memcmp(h.magic, KV_MAGIC, 8)) { snprintf(err, errlen, "%s: not a KV state file", path); goto out; }
    if (h.fingerprint != fp || (int)h.n_layers != a->n_layers || h.per_pos != per_pos || h.fixed != fixed) {
        snprintf(err, errlen, "%s: saved for another model; ignored", path);
        goto out;
    }
    if (h.kv_type != (uint32_t)kv->type) {
        snprintf(err, errlen, "%s: saved with a %s KV cache, this engine keeps %s (--kv); ignored", path,
                 qtype_name((QType)(h.kv_type < QT_COUNT ? h.kv_type : 0)), qtype_name(kv->type));
        goto out;
    }
    if ((int)h.n > kv->ctx) { snprintf(err, errlen, "%s: %u positions exceed the context %d; ignored", path, h.n, kv->ctx); goto out; }
    if (read_all(f, kv->tokens, sizeof(int32_t) * h.n, &sum)) goto torn;
    for (uint32_t i = 0; i < h.n; i++)
        if (kv->tokens[i] < 0 || kv->tokens[i] >= a->vocab) goto torn;
    kv->n = (int)h.n; /* kv_held depends on it; reset below if the file is torn */
    for (int l = 0; l < a->n_layers; l++) {
        KvLayer *y = &kv->layer[l];
        if (read_all(f, y->pos, y->per_pos * (size_t)kv_held(kv, l), &sum) || read_all(f, y->fixed, y->fixed_bytes, &sum)) goto torn;
    }
    if (fread(&check, 1, sizeof check, f) != sizeof check || check != sum) goto torn;
    kv->n = (int)h.n;
    rc = 1;
    goto out;
torn:
    snprintf(err, errlen, "%s: truncated or corrupt; ignored", path);
    kv->n = 0;
    for (int l = 0; l < a->n_layers; l++) /* no half-read recurrent state survives */
        if (kv->layer[l].fixed) memset(kv->layer[l].fixed, 0, kv->layer[l].fixed_bytes);
out:
    fclose(f);
    return rc;
}
