#include "kv/kv_persist.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* v2: the layers' state as their descriptors lay it out, in the slot's KV element type. */
#define KV_MAGIC "COLIKV02"

typedef struct {
    char magic[8];
    uint64_t fingerprint;
    uint32_t n, n_layers, kv_type;
    uint32_t n_ck;           /* turn-boundary checkpoints of the fixed state after the layers (0 in older files) */
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
    /* A fresh file, never through a link someone planted under the temporary's name. */
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
        return -1;
    }
    KvHeader h = {KV_MAGIC, fp, (uint32_t)kv->n, (uint32_t)a->n_layers, (uint32_t)kv->type, (uint32_t)kv->n_ck, 0, 0};
    memcpy(h.magic, KV_MAGIC, 8);
    layout(kv, &h.per_pos, &h.fixed);
    uint64_t sum = 1469598103934665603ull;
    int bad = write_all(fd, &h, sizeof h, &sum) || write_all(fd, kv->tokens, sizeof(int32_t) * (size_t)kv->n, &sum);
    for (int l = 0; l < a->n_layers && !bad; l++) {
        const KvLayer *y = &kv->layer[l];
        bad = write_all(fd, y->pos, y->per_pos * (size_t)kv_held(kv, l), &sum) || write_all(fd, y->fixed, y->fixed_bytes, &sum);
    }
    for (int i = 0; i < kv->n_ck && !bad; i++) { /* so a resumed slot can still go back to a turn boundary */
        int32_t pos = kv->ck_pos[i];
        bad = write_all(fd, &pos, sizeof pos, &sum) || write_all(fd, kv->ck[i], kv_ck_bytes(kv), &sum);
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
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}

static int read_all(FILE *f, void *p, size_t n, uint64_t *sum) {
    if (fread(p, 1, n, f) != n) return -1;
    *sum = fnv(*sum, p, n);
    return 0;
}

/* *acc *= a without wrapping; -1 when the product does not fit. */
static int mul(uint64_t *acc, uint64_t a) { return __builtin_mul_overflow(*acc, a, acc) ? -1 : 0; }
static int add(uint64_t *acc, uint64_t a) { return __builtin_add_overflow(*acc, a, acc) ? -1 : 0; }

/* The exact length of a file holding n positions and n_ck checkpoints: header, tokens, each layer's
 * held positions and fixed state, the checkpoints (position, fixed state and rings), checksum. The layout comes from this engine's descriptors (the header's sums were
 * checked against them), so only n is the file's. */
static int expected_size(const KvCache *kv, uint64_t n, uint64_t n_ck, uint64_t *out) {
    uint64_t s = sizeof(KvHeader) + sizeof(uint64_t), tokens = n;
    if (mul(&tokens, sizeof(int32_t)) || add(&s, tokens)) return -1;
    for (int l = 0; l < kv->n_layers; l++) {
        const KvLayer *y = &kv->layer[l];
        uint64_t held = n < (uint64_t)y->cap ? n : (uint64_t)y->cap, b = y->per_pos;
        if (mul(&b, held) || add(&s, b) || add(&s, y->fixed_bytes)) return -1;
    }
    uint64_t ck = sizeof(int32_t) + (uint64_t)kv_ck_bytes(kv);
    if (mul(&ck, n_ck) || add(&s, ck)) return -1;
    *out = s;
    return 0;
}

uint64_t kv_save_size(const KvCache *kv) {
    uint64_t s;
    return expected_size(kv, (uint64_t)kv->n, (uint64_t)kv->n_ck, &s) ? 0 : s;
}

/* No inf or NaN among the cache's elements (f32, f16 or bf16 as the slot keeps them): a planted
 * value would poison every later attention score silently. */
static int all_finite(const void *p, size_t bytes, QType type) {
    if (type == QT_F32) {
        const float *x = p;
        for (size_t i = 0; i < bytes / sizeof(float); i++)
            if (!isfinite(x[i])) return 0;
        return 1;
    }
    const uint16_t *h = p, mask = type == QT_F16 ? 0x7C00 : 0x7F80; /* exponent all ones: inf or NaN */
    for (size_t i = 0; i < bytes / sizeof(uint16_t); i++)
        if ((h[i] & mask) == mask) return 0;
    return 1;
}

/* all_finite over n rows of a layer: each row's cache-type values, then its f32 tail (indexer keys). */
static int rows_finite(const KvLayer *y, size_t n, QType type) {
    if (!y->f32_tail) return all_finite(y->pos, y->per_pos * n, type);
    for (size_t j = 0; j < n; j++) {
        const unsigned char *row = y->pos + j * y->per_pos;
        if (!all_finite(row, y->per_pos - y->f32_tail, type) || !all_finite(row + y->per_pos - y->f32_tail, y->f32_tail, QT_F32))
            return 0;
    }
    return 1;
}

/* Every field of the file is untrusted (a shared model folder is enough to plant one): the header
 * must describe this model and fit this slot, and the file must be exactly as long as the header
 * says, before a byte lands in the slot. On any refusal the slot stays empty (n = 0). */
int kv_restore(KvCache *kv, const Arch *a, uint64_t fp, const char *path, char *err, size_t errlen) {
    kv_restart(kv);
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
    if (!f) {
        close(fd);
        snprintf(err, errlen, "%s: cannot read (%s); ignored", path, strerror(errno));
        return -1;
    }
    KvHeader h;
    uint64_t per_pos, fixed;
    layout(kv, &per_pos, &fixed);
    uint64_t sum = 1469598103934665603ull, check, want;
    int rc = -1;
    if (read_all(f, &h, sizeof h, &sum) || memcmp(h.magic, KV_MAGIC, 8)) {
        snprintf(err, errlen, "%s: not a KV state file (or one saved by an older engine); ignored, the slot starts empty", path);
        goto out;
    }
    if (h.n_ck > KV_MAX_CHECKPOINTS || (h.n_ck && !kv_keeps_checkpoints(kv))) {
        snprintf(err, errlen, "%s: unknown KV file version; ignored, the slot starts empty", path);
        goto out;
    }
    if (h.fingerprint != fp || h.n_layers != (uint32_t)a->n_layers || h.per_pos != per_pos || h.fixed != fixed) {
        snprintf(err, errlen, "%s: saved for another model; ignored, the slot starts empty", path);
        goto out;
    }
    if (h.kv_type != (uint32_t)kv->type) {
        snprintf(err, errlen, "%s: saved with a %s KV cache, this engine keeps %s (--kv); ignored, the slot starts empty", path,
                 qtype_name((QType)(h.kv_type < QT_COUNT ? h.kv_type : 0)), qtype_name(kv->type));
        goto out;
    }
    if ((uint64_t)h.n > (uint64_t)kv->ctx) {
        snprintf(err, errlen, "%s: %u positions exceed the context of %d (--ctx); ignored, the slot starts empty", path, h.n,
                 kv->ctx);
        goto out;
    }
    if (expected_size(kv, h.n, h.n_ck, &want)) {
        snprintf(err, errlen, "%s: header sizes do not fit in a file: corrupt; ignored, the slot starts empty", path);
        goto out;
    }
    if ((uint64_t)st.st_size != want) {
        snprintf(err, errlen,
                 "%s: %lld bytes where its header promises %llu: truncated or corrupt; ignored, the slot "
                 "starts empty",
                 path, (long long)st.st_size, (unsigned long long)want);
        goto out;
    }
    const size_t n = h.n; /* fits: at most ctx */
    if (read_all(f, kv->tokens, sizeof(int32_t) * n, &sum)) goto torn;
    for (size_t i = 0; i < n; i++)
        if (kv->tokens[i] < 0 || kv->tokens[i] >= a->vocab) goto torn;
    kv->n = (int)n; /* kv_held depends on it; reset below if the file is torn */
    for (int l = 0; l < a->n_layers; l++) {
        KvLayer *y = &kv->layer[l];
        size_t bytes = y->per_pos * (size_t)kv_held(kv, l);
        if (read_all(f, y->pos, bytes, &sum) || read_all(f, y->fixed, y->fixed_bytes, &sum)) goto torn;
        if (!rows_finite(y, (size_t)kv_held(kv, l), kv->type) || !all_finite(y->fixed, y->fixed_bytes, QT_F32)) goto torn;
    }
    for (uint32_t i = 0; i < h.n_ck; i++) { /* increasing positions within the slot's history */
        int32_t pos;
        if (read_all(f, &pos, sizeof pos, &sum) || pos < 0 || pos > (int32_t)n || (i && pos <= kv->ck_pos[i - 1])) goto torn;
        unsigned char *ck = malloc(kv_ck_bytes(kv));
        if (!ck) goto torn;
        kv->ck[i] = ck;
        kv->ck_pos[i] = pos;
        kv->n_ck = (int)i + 1;
        if (read_all(f, ck, kv_ck_bytes(kv), &sum) || !all_finite(ck, kv->fixed_total, QT_F32) ||
            !all_finite(ck + kv->fixed_total, kv->ring_total, kv->type))
            goto torn;
    }
    if (fread(&check, 1, sizeof check, f) != sizeof check || check != sum) goto torn;
    rc = 1;
    goto out;
torn:
    snprintf(err, errlen, "%s: corrupt (bad token, value or checksum); ignored, the slot starts empty", path);
    kv_restart(kv); /* no half-read recurrent state or checkpoint survives */
out:
    fclose(f);
    return rc;
}
