#include "kv_persist.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KV_MAGIC "COLIKV01"

typedef struct {
    char magic[8];
    uint64_t fingerprint;
    uint32_t n, kv_dim, n_layers, reserved;
} KvHeader;

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
    const size_t kvd = (size_t)a->n_kv_heads * a->head_dim;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) { snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno)); return -1; }
    KvHeader h = {KV_MAGIC, fp, (uint32_t)kv->n, (uint32_t)kvd, (uint32_t)a->n_layers, 0};
    memcpy(h.magic, KV_MAGIC, 8);
    uint64_t sum = 1469598103934665603ull;
    int bad = write_all(fd, &h, sizeof h, &sum) || write_all(fd, kv->tokens, sizeof(int32_t) * (size_t)kv->n, &sum);
    for (int l = 0; l < a->n_layers && !bad; l++) {
        size_t off = (size_t)l * kv->ctx * kvd, bytes = sizeof(float) * (size_t)kv->n * kvd;
        bad = write_all(fd, kv->k + off, bytes, &sum) || write_all(fd, kv->v + off, bytes, &sum);
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
    const size_t kvd = (size_t)a->n_kv_heads * a->head_dim;
    KvHeader h;
    uint64_t sum = 1469598103934665603ull, check;
    int rc = -1;
    if (read_all(f, &h, sizeof h, &sum) || memcmp(h.magic, KV_MAGIC, 8)) { snprintf(err, errlen, "%s: not a KV state file", path); goto out; }
    if (h.fingerprint != fp || h.kv_dim != kvd || (int)h.n_layers != a->n_layers) {
        snprintf(err, errlen, "%s: saved for another model; ignored", path);
        goto out;
    }
    if ((int)h.n > kv->ctx) { snprintf(err, errlen, "%s: %u positions exceed the context %d; ignored", path, h.n, kv->ctx); goto out; }
    if (read_all(f, kv->tokens, sizeof(int32_t) * h.n, &sum)) goto torn;
    for (uint32_t i = 0; i < h.n; i++)
        if (kv->tokens[i] < 0 || kv->tokens[i] >= a->vocab) goto torn;
    for (int l = 0; l < a->n_layers; l++) {
        size_t off = (size_t)l * kv->ctx * kvd, bytes = sizeof(float) * (size_t)h.n * kvd;
        if (read_all(f, kv->k + off, bytes, &sum) || read_all(f, kv->v + off, bytes, &sum)) goto torn;
    }
    if (fread(&check, 1, sizeof check, f) != sizeof check || check != sum) goto torn;
    kv->n = (int)h.n;
    rc = 1;
    goto out;
torn:
    snprintf(err, errlen, "%s: truncated or corrupt; ignored", path);
    kv->n = 0;
out:
    fclose(f);
    return rc;
}
