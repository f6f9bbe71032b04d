#include "kv_persist.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
    /* A fresh file, never through a link someone planted under the temporary's name. */
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
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

/* *acc *= a without wrapping; -1 when the product does not fit. */
static int mul(uint64_t *acc, uint64_t a) { return __builtin_mul_overflow(*acc, a, acc) ? -1 : 0; }

/* The exact length of a file holding n positions: header, tokens, K and V per layer, checksum. */
static int expected_size(uint64_t n, uint64_t kvd, uint64_t layers, uint64_t *out) {
    uint64_t s = n; /* floats of K and V in all layers, then bytes, then the whole file */
    if (mul(&s, kvd) || mul(&s, 2 * layers) || mul(&s, sizeof(float))) return -1;
    uint64_t tokens = n * sizeof(int32_t); /* n < 2^32: cannot wrap */
    if (__builtin_add_overflow(s, tokens + sizeof(KvHeader) + sizeof(uint64_t), &s)) return -1;
    *out = s;
    return 0;
}

static int all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* Every field of the file is untrusted (a shared model folder is enough to plant one): the header
 * must describe this model and fit this slot, and the file must be exactly as long as the header
 * says, before a byte lands in the slot. On any refusal the slot stays empty (n = 0). */
int kv_restore(KvCache *kv, const Arch *a, uint64_t fp, const char *path, char *err, size_t errlen) {
    kv->n = 0;
    /* O_NONBLOCK: a FIFO planted under the slot's name must not hang the start-up */
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return 0;
        snprintf(err, errlen, "%s: cannot open (%s); ignored, the slot starts empty", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file; ignored, the slot starts empty", path);
        close(fd);
        return -1;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) { close(fd); snprintf(err, errlen, "%s: cannot read (%s); ignored", path, strerror(errno)); return -1; }
    const uint64_t kvd = (uint64_t)a->n_kv_heads * (uint64_t)a->head_dim;
    KvHeader h;
    uint64_t sum = 1469598103934665603ull, check, want;
    int rc = -1;
    if (read_all(f, &h, sizeof h, &sum) || memcmp(h.magic, KV_MAGIC, 8)) {
        snprintf(err, errlen, "%s: not a KV state file; ignored, the slot starts empty", path);
        goto out;
    }
    if (h.reserved != 0) { snprintf(err, errlen, "%s: unknown KV file version; ignored, the slot starts empty", path); goto out; }
    if (h.fingerprint != fp || h.kv_dim != kvd || h.n_layers != (uint32_t)a->n_layers) {
        snprintf(err, errlen, "%s: saved for another model; ignored, the slot starts empty", path);
        goto out;
    }
    if ((uint64_t)h.n > (uint64_t)kv->ctx) {
        snprintf(err, errlen, "%s: %u positions exceed the context of %d (--ctx); ignored, the slot starts empty", path,
                 h.n, kv->ctx);
        goto out;
    }
    if (expected_size(h.n, kvd, h.n_layers, &want)) {
        snprintf(err, errlen, "%s: header sizes do not fit in a file: corrupt; ignored, the slot starts empty", path);
        goto out;
    }
    if ((uint64_t)st.st_size != want) {
        snprintf(err, errlen, "%s: %lld bytes where its header promises %llu: truncated or corrupt; ignored, the slot "
                 "starts empty", path, (long long)st.st_size, (unsigned long long)want);
        goto out;
    }
    const size_t n = h.n, bytes = sizeof(float) * n * (size_t)kvd; /* both fit: checked above */
    if (read_all(f, kv->tokens, sizeof(int32_t) * n, &sum)) goto torn;
    for (size_t i = 0; i < n; i++)
        if (kv->tokens[i] < 0 || kv->tokens[i] >= a->vocab) goto torn;
    for (int l = 0; l < a->n_layers; l++) {
        float *k = kv->k + (size_t)l * kv->ctx * kvd, *v = kv->v + (size_t)l * kv->ctx * kvd;
        if (read_all(f, k, bytes, &sum) || read_all(f, v, bytes, &sum)) goto torn;
        if (!all_finite(k, bytes / sizeof(float)) || !all_finite(v, bytes / sizeof(float))) goto torn;
    }
    if (fread(&check, 1, sizeof check, f) != sizeof check || check != sum) goto torn;
    kv->n = (int)n;
    rc = 1;
    goto out;
torn:
    snprintf(err, errlen, "%s: corrupt (bad token, value or checksum); ignored, the slot starts empty", path);
    kv->n = 0;
out:
    fclose(f);
    return rc;
}
