#include "kv/kv_log.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define LOG_MAGIC "COLIKVL1"
#define REC_MAGIC 0x3143524bu /* "KRC1" */

typedef struct {
    char magic[8];
    uint64_t fingerprint, base_sum;
} LogHeader;
_Static_assert(sizeof(LogHeader) == KV_LOG_HEADER, "kv_log.h KV_LOG_HEADER");

typedef struct {
    uint32_t magic, n0, n1, n_ck; /* n_ck: the slot's turn-boundary checkpoints after n1 (kv_checkpoint) */
} RecHead;

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* Positions of layer y a record [n0, n1) carries: those the ring still holds after n1. */
static int first_held(const KvLayer *y, int n0, int n1) { return n1 - y->cap > n0 ? n1 - y->cap : n0; }

/* Bytes of a record for [n0, n1) with n_ck checkpoints (checksum included), or 0 when that does
 * not fit a size_t. */
static size_t record_len(const KvCache *kv, int n0, int n1, int n_ck) {
    size_t len = sizeof(RecHead) + sizeof(int32_t) * (size_t)(n1 - n0) + sizeof(uint64_t), ck;
    if (__builtin_mul_overflow(sizeof(int32_t) + kv_ck_bytes(kv), (size_t)n_ck, &ck) || __builtin_add_overflow(len, ck, &len))
        return 0;
    for (int l = 0; l < kv->n_layers; l++) {
        const KvLayer *y = &kv->layer[l];
        size_t rows = y->per_pos ? (size_t)(n1 - first_held(y, n0, n1)) : 0, b;
        if (__builtin_mul_overflow(rows, y->per_pos, &b) || __builtin_add_overflow(len, b, &len) ||
            __builtin_add_overflow(len, y->fixed_bytes, &len))
            return 0;
    }
    return len;
}

/* n0 lowered to the start of a group of rows a layer fills later: the turn may have rewritten them. */
static int settled(const KvCache *kv, int n0) {
    for (int l = 0; l < kv->n_layers; l++)
        if (kv->layer[l].settle > 1 && n0 % kv->layer[l].settle) n0 -= n0 % kv->layer[l].settle;
    return n0;
}

size_t kv_record_size(const KvCache *kv, int n0) { return record_len(kv, settled(kv, n0), kv->n, kv->n_ck); }

size_t kv_record_max(const Arch *a, int ctx) {
    return sizeof(RecHead) + sizeof(uint64_t) + kv_bytes(a, ctx) +
           KV_MAX_CHECKPOINTS * (sizeof(int32_t) + kv_checkpoint_bytes(a, ctx));
}

int kv_record_build(const KvCache *kv, int n0, KvRecord *r) {
    const int n1 = kv->n;
    n0 = settled(kv, n0);
    r->n0 = n0;
    r->n1 = n1;
    r->len = record_len(kv, n0, n1, kv->n_ck);
    r->buf = r->len ? malloc(r->len) : NULL;
    if (!r->buf) return -1;
    unsigned char *p = r->buf;
    RecHead h = {REC_MAGIC, (uint32_t)n0, (uint32_t)n1, (uint32_t)kv->n_ck};
    memcpy(p, &h, sizeof h);
    p += sizeof h;
    memcpy(p, kv->tokens + n0, sizeof(int32_t) * (size_t)(n1 - n0));
    p += sizeof(int32_t) * (size_t)(n1 - n0);
    for (int l = 0; l < kv->n_layers; l++) {
        const KvLayer *y = &kv->layer[l];
        for (int j = y->per_pos ? first_held(y, n0, n1) : n1; j < n1; j++, p += y->per_pos)
            memcpy(p, y->pos + (size_t)(j % y->cap) * y->per_pos, y->per_pos);
    }
    for (int l = 0; l < kv->n_layers; l++) {
        const KvLayer *y = &kv->layer[l];
        if (y->fixed_bytes) memcpy(p, y->fixed, y->fixed_bytes);
        p += y->fixed_bytes;
    }
    /* the checkpoints travel with every record: a resumed slot can still go back to a turn boundary */
    for (int i = 0; i < kv->n_ck; i++) {
        memcpy(p, &kv->ck_pos[i], sizeof(int32_t));
        memcpy(p + sizeof(int32_t), kv->ck[i], kv_ck_bytes(kv));
        p += sizeof(int32_t) + kv_ck_bytes(kv);
    }
    uint64_t sum = fnv(1469598103934665603ull, r->buf, r->len - sizeof sum);
    memcpy(p, &sum, sizeof sum);
    return 0;
}

void kv_record_free(KvRecord *r) {
    free(r->buf);
    r->buf = NULL;
}

void kv_record_apply(KvCache *kv, const KvRecord *r) {
    const unsigned char *p = r->buf + sizeof(RecHead);
    const int n0 = r->n0, n1 = r->n1;
    memcpy(kv->tokens + n0, p, sizeof(int32_t) * (size_t)(n1 - n0));
    p += sizeof(int32_t) * (size_t)(n1 - n0);
    for (int l = 0; l < kv->n_layers; l++) {
        KvLayer *y = &kv->layer[l];
        for (int j = y->per_pos ? first_held(y, n0, n1) : n1; j < n1; j++, p += y->per_pos)
            memcpy(y->pos + (size_t)(j % y->cap) * y->per_pos, p, y->per_pos);
    }
    for (int l = 0; l < kv->n_layers; l++) {
        KvLayer *y = &kv->layer[l];
        if (y->fixed_bytes) memcpy(y->fixed, p, y->fixed_bytes);
        p += y->fixed_bytes;
    }
    /* straight from the record into the slot, one checkpoint at a time: no scratch copy of them all,
     * so the writer's image costs what the RAM budget reserves for it (kv_writer_reserve) */
    RecHead h;
    memcpy(&h, r->buf, sizeof h);
    const size_t ckb = kv_ck_bytes(kv);
    kv_set_checkpoints(kv, 0, NULL, NULL);
    for (uint32_t i = 0; i < h.n_ck && i < KV_MAX_CHECKPOINTS; i++, p += sizeof(int32_t) + ckb) {
        unsigned char *ck = malloc(ckb ? ckb : 1);
        if (!ck) break; /* out of memory: fewer checkpoints, reuse falls back further */
        memcpy(&kv->ck_pos[kv->n_ck], p, sizeof(int32_t));
        memcpy(ck, p + sizeof(int32_t), ckb);
        kv->ck[kv->n_ck++] = ck;
    }
    kv->n = n1;
}

int kv_file_sum(const char *path, uint64_t *sum) {
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat st;
    int ok = !fstat(fd, &st) && S_ISREG(st.st_mode) && st.st_size >= (off_t)sizeof *sum &&
             pread(fd, sum, sizeof *sum, st.st_size - (off_t)sizeof *sum) == (ssize_t)sizeof *sum;
    close(fd);
    return ok ? 0 : -1;
}

static int write_all(int fd, const void *p, size_t n, off_t at) {
    const char *c = p;
    while (n) {
        ssize_t w = pwrite(fd, c, n, at);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        c += w;
        at += w;
        n -= (size_t)w;
    }
    return 0;
}

int kv_log_append(const char *log_path, uint64_t fp, uint64_t base_sum, off_t *len, const KvRecord *r, char *err, size_t errlen) {
    int fresh = *len == 0;
    int fd = open(log_path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | (fresh ? O_TRUNC : 0), 0600);
    if (fd < 0) {
        snprintf(err, errlen, "cannot write %s: %s", log_path, strerror(errno));
        return -1;
    }
    int bad = 0;
    if (fresh) {
        LogHeader h = {LOG_MAGIC, fp, base_sum};
        memcpy(h.magic, LOG_MAGIC, 8);
        bad = write_all(fd, &h, sizeof h, 0);
        *len = bad ? 0 : (off_t)sizeof h;
    }
    /* at the valid length: whatever a crash left past it is overwritten, then cut */
    bad = bad || write_all(fd, r->buf, r->len, *len) || ftruncate(fd, *len + (off_t)r->len) || fdatasync(fd);
    if (close(fd)) bad = 1;
    if (bad) {
        snprintf(err, errlen, "cannot append KV state to %s: %s (disk full?)", log_path, strerror(errno));
        return -1;
    }
    *len += (off_t)r->len;
    return 0;
}

static int all_finite(const unsigned char *p, size_t bytes, QType type) {
    if (type == QT_F32) {
        for (size_t i = 0; i + 4 <= bytes; i += 4) {
            float x;
            memcpy(&x, p + i, 4);
            if (!isfinite(x)) return 0;
        }
        return 1;
    }
    const uint16_t mask = type == QT_F16 ? 0x7C00 : 0x7F80; /* exponent all ones: inf or NaN */
    for (size_t i = 0; i + 2 <= bytes; i += 2) {
        uint16_t h;
        memcpy(&h, p + i, 2);
        if ((h & mask) == mask) return 0;
    }
    return 1;
}

/* Whether a record read from a file may touch the slot: its tokens are in the vocabulary and
 * its per-position values finite (as kv_restore checks a base file). */
static int record_sane(const KvCache *kv, const Arch *a, const KvRecord *r) {
    const unsigned char *p = r->buf + sizeof(RecHead);
    for (int i = 0; i < r->n1 - r->n0; i++) {
        int32_t t;
        memcpy(&t, p + 4 * (size_t)i, 4);
        if (t < 0 || t >= a->vocab) return 0;
    }
    p += sizeof(int32_t) * (size_t)(r->n1 - r->n0);
    RecHead h;
    memcpy(&h, r->buf, sizeof h);
    const size_t ckb = kv_ck_bytes(kv), cks = (sizeof(int32_t) + ckb) * h.n_ck;
    size_t rest = r->len - (size_t)(p - r->buf) - sizeof(uint64_t), fixed = 0;
    for (int l = 0; l < kv->n_layers; l++) fixed += kv->layer[l].fixed_bytes;
    if (!all_finite(p, rest - fixed - cks, kv->type) || !all_finite(p + rest - fixed - cks, fixed, QT_F32)) return 0;
    const unsigned char *c = p + rest - cks;
    for (uint32_t i = 0, prev = 0; i < h.n_ck; i++, c += sizeof(int32_t) + ckb) { /* increasing, within the slot */
        int32_t pos;
        memcpy(&pos, c, sizeof pos);
        if (pos < 0 || pos > r->n1 || (i && (uint32_t)pos <= prev)) return 0;
        prev = (uint32_t)pos;
        if (!all_finite(c + sizeof(int32_t), kv->fixed_total, QT_F32) ||
            !all_finite(c + sizeof(int32_t) + kv->fixed_total, kv->ring_total, kv->type))
            return 0;
    }
    return 1;
}

int kv_log_replay(KvCache *kv, const Arch *a, uint64_t fp, uint64_t base_sum, const char *log_path, off_t *good, char *note,
                  size_t notelen) {
    *good = 0;
    note[0] = 0;
    int fd = open(log_path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? 0 : -1;
    struct stat st;
    LogHeader h;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        snprintf(note, notelen, "not a regular file");
        return -1;
    }
    if (pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h || memcmp(h.magic, LOG_MAGIC, 8) || h.fingerprint != fp ||
        h.base_sum != base_sum) {
        close(fd);
        return 0; /* another base's log (a crash between a full save and the log's removal): not ours */
    }
    off_t at = sizeof h;
    int applied = 0;
    for (;;) {
        RecHead rh;
        if (at == st.st_size) break;
        if (pread(fd, &rh, sizeof rh, at) != (ssize_t)sizeof rh) {
            snprintf(note, notelen, "its last record is cut off");
            break;
        }
        if (rh.magic != REC_MAGIC || rh.n_ck > KV_MAX_CHECKPOINTS || (rh.n_ck && !kv_keeps_checkpoints(kv)) ||
            rh.n0 > (uint32_t)kv->n || rh.n1 < rh.n0 || rh.n1 > (uint32_t)kv->ctx) {
            snprintf(note, notelen, "a record does not fit this slot");
            break;
        }
        size_t len = record_len(kv, (int)rh.n0, (int)rh.n1, (int)rh.n_ck);
        if (!len || (off_t)len > st.st_size - at) {
            snprintf(note, notelen, "its last record is cut off");
            break;
        }
        KvRecord r = {malloc(len), len, (int)rh.n0, (int)rh.n1};
        if (!r.buf) {
            snprintf(note, notelen, "no memory to read it");
            break;
        }
        uint64_t sum;
        int ok = pread(fd, r.buf, len, at) == (ssize_t)len;
        if (ok) memcpy(&sum, r.buf + len - sizeof sum, sizeof sum);
        ok = ok && sum == fnv(1469598103934665603ull, r.buf, len - sizeof sum) && record_sane(kv, a, &r);
        if (ok) kv_record_apply(kv, &r);
        kv_record_free(&r);
        if (!ok) {
            snprintf(note, notelen, "a record is corrupt (checksum, token or value)");
            break;
        }
        at += (off_t)len;
        applied++;
    }
    if (at < st.st_size && ftruncate(fd, at)) snprintf(note + strlen(note), notelen - strlen(note), "; cannot cut it");
    close(fd);
    *good = at;
    return applied;
}
