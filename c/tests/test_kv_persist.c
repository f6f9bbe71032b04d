/* KV state files are untrusted input: crafted counts, sizes, fingerprints and checksums are
 * refused with a message and leave the slot empty; nothing is read past the slot's buffers
 * (the ASan build of these tests catches any overrun). Also the KV directory lock and the
 * clean-up of temporaries an interrupted save left. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "kv/kv_dir.h"
#include "kv/kv_persist.h"
#include "model/model.h"

#define FP 0x1234567890abcdefull
#define CTX 8

static char dir[256], path[300];

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

typedef struct { /* kv_persist.c's v2 header */
    char magic[8];
    uint64_t fingerprint;
    uint32_t n, n_layers, kv_type, n_ck;
    uint64_t per_pos, fixed;
} Header;

/* Writes a header, then body bytes, then (if with_sum) the checksum over both. */
static void craft(Header h, const void *body, size_t len, int with_sum) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        CHECK(0, "cannot write %s", path);
        return;
    }
    uint64_t sum = fnv(fnv(1469598103934665603ull, &h, sizeof h), body, len);
    fwrite(&h, sizeof h, 1, f);
    if (len) fwrite(body, 1, len, f);
    if (with_sum) fwrite(&sum, sizeof sum, 1, f);
    fclose(f);
}

static Header header(uint32_t n, const Arch *a) {
    Header h = {{'C', 'O', 'L', 'I', 'K', 'V', '0', '2'}, FP, n, (uint32_t)a->n_layers, (uint32_t)a->kv_type, 0, 0, 0};
    for (int l = 0; l < a->n_layers; l++) h.per_pos += a->state[l].per_pos;
    return h;
}

/* Two GQA-like layers: K and V of one head of 4 values per position, in the given type. */
static StateDesc states[2];
static Arch arch(QType kv_type) {
    Arch a = {0};
    a.vocab = 50;
    a.n_layers = 2;
    a.kv_type = kv_type;
    for (int l = 0; l < 2; l++) states[l] = (StateDesc){2 * 4 * (kv_type == QT_F32 ? 4 : 2), 0, 1, 0, 0, 0};
    a.state = states;
    return a;
}

/* Restores into a fresh slot; returns rc and checks that a refusal leaves the slot empty. */
static int restore(const Arch *a, char *err, size_t errlen) {
    KvCache kv;
    if (kv_init(&kv, a, CTX)) {
        CHECK(0, "kv_init");
        return -9;
    }
    kv.n = 3; /* a refusal must not leave a stale count behind */
    err[0] = 0;
    int rc = kv_restore(&kv, a, FP, path, err, errlen);
    CHECK(rc == 1 || kv.n == 0, "refused file left %d positions", kv.n);
    kv_free(&kv);
    return rc;
}

static void refused(const Arch *a, const char *what, const char *needle) {
    char err[512];
    int rc = restore(a, err, sizeof err);
    CHECK(rc == -1 && strstr(err, needle) && strstr(err, "slot starts empty"), "%s: rc %d '%s'", what, rc, err);
}

static void test_restore(void) {
    Arch a = arch(QT_F32);
    const size_t kvd = 4; /* values of K (and of V) per position */
    KvCache kv;
    char err[512];
    if (kv_init(&kv, &a, CTX)) {
        CHECK(0, "kv_init");
        return;
    }
    kv.n = 5;
    for (int i = 0; i < CTX; i++) kv.tokens[i] = i + 1;
    for (int l = 0; l < a.n_layers; l++)
        for (size_t i = 0; i < CTX * 2 * kvd; i++) ((float *)kv.layer[l].pos)[i] = (float)(l * 1000 + i);
    CHECK(kv_save(&kv, &a, FP, path, err, sizeof err) == 0, "save: %s", err);
    KvCache back;
    kv_init(&back, &a, CTX);
    CHECK(kv_restore(&back, &a, FP, path, err, sizeof err) == 1 && back.n == 5, "round trip: %s", err);
    CHECK(!memcmp(back.tokens, kv.tokens, 5 * sizeof(int32_t)) &&
              !memcmp(back.layer[0].pos, kv.layer[0].pos, 5 * a.state[0].per_pos) &&
              !memcmp(back.layer[1].pos, kv.layer[1].pos, 5 * a.state[1].per_pos),
          "round trip data");
    kv_free(&back);
    struct stat st;
    stat(path, &st);
    size_t good_len = (size_t)st.st_size;
    unsigned char *good = malloc(good_len);
    FILE *f = fopen(path, "rb");
    CHECK(f && fread(good, 1, good_len, f) == good_len, "read back");
    if (f) fclose(f);
    kv_free(&kv);

    /* Counts that a signed comparison once let through, with far more body than the slot holds. */
    size_t big = 64 * 1024;
    unsigned char *body = calloc(1, big);
    craft(header(0x80000000u, &a), body, big, 1);
    refused(&a, "count 2^31", "exceed the context");
    craft(header(0xffffffffu, &a), body, big, 1);
    refused(&a, "count 2^32-1", "exceed the context");
    craft(header(CTX + 1, &a), body, big, 1);
    refused(&a, "count ctx+1", "exceed the context");

    /* Truncated, overlong, header only, shorter than a header. */
    for (size_t cut = 1; cut <= 10; cut += 9) {
        f = fopen(path, "wb");
        fwrite(good, 1, good_len - cut, f);
        fclose(f);
        refused(&a, "truncated", "truncated");
    }
    f = fopen(path, "wb");
    fwrite(good, 1, good_len, f);
    fputc(0, f);
    fclose(f);
    refused(&a, "trailing byte", "truncated or corrupt");
    craft(header(5, &a), NULL, 0, 0);
    refused(&a, "header only", "truncated");
    f = fopen(path, "wb");
    fwrite(good, 1, 12, f);
    fclose(f);
    refused(&a, "shorter than a header", "not a KV state file");

    /* Another model: fingerprint, state layout, layer count; another KV type; an unknown version. */
    Header h = header(2, &a);
    h.fingerprint ^= 1;
    craft(h, body, 2 * 4 + 2 * 2 * 2 * kvd * 4, 1);
    refused(&a, "wrong fingerprint", "another model");
    h = header(2, &a);
    h.per_pos *= 2;
    craft(h, body, 2 * 4 + 2 * 2 * 2 * 8 * 4, 1);
    refused(&a, "wrong state layout", "another model");
    h = header(2, &a);
    h.kv_type = QT_F16;
    craft(h, body, 2 * 4 + 2 * 2 * 2 * kvd * 2, 1);
    refused(&a, "another KV type", "saved with a f16 KV cache");
    h = header(2, &a);
    h.n_layers = 0x80000002u;
    craft(h, body, big, 1);
    refused(&a, "wrong layer count", "another model");
    h = header(2, &a);
    h.n_ck = 7; /* more checkpoints than an engine keeps, and on a truncatable model */
    craft(h, body, 2 * 4 + 2 * 2 * 2 * kvd * 4, 1);
    refused(&a, "unknown version", "version");
    memcpy(body, "COLIKV01", 8); /* the previous format's magic */
    f = fopen(path, "wb");
    fwrite(body, 1, 64, f);
    fclose(f);
    refused(&a, "bad magic", "not a KV state file");
    memset(body, 0, 8);

    /* Well-formed sizes with bad content: checksum, token range, non-finite values. */
    const size_t n = 2, len = n * 4 + 2 * 2 * n * kvd * 4;
    int32_t *tok = (int32_t *)body;
    tok[0] = 1;
    tok[1] = 2;
    craft(header(n, &a), body, len, 1);
    char err2[512];
    CHECK(restore(&a, err2, sizeof err2) == 1, "crafted good file restores: %s", err2);
    craft(header(n, &a), body, len, 0);
    f = fopen(path, "ab");
    uint64_t zero = 0;
    fwrite(&zero, sizeof zero, 1, f);
    fclose(f);
    refused(&a, "bad checksum", "corrupt");
    tok[1] = 50;
    craft(header(n, &a), body, len, 1);
    refused(&a, "token outside the vocabulary", "corrupt");
    tok[1] = -1;
    craft(header(n, &a), body, len, 1);
    refused(&a, "negative token", "corrupt");
    tok[1] = 2;
    float nan = 0.0f / 0.0f;
    memcpy(body + n * 4 + 3 * 4, &nan, 4);
    craft(header(n, &a), body, len, 1);
    refused(&a, "nan in K", "corrupt");
    memset(body + n * 4 + 3 * 4, 0, 4);

    /* f16 and bf16 caches: an inf/NaN bit pattern is refused too. */
    for (QType t = QT_BF16; t <= QT_F16; t++) {
        Arch h16 = arch(t);
        const size_t len16 = n * 4 + 2 * n * h16.state[0].per_pos;
        craft(header(n, &h16), body, len16, 1);
        CHECK(restore(&h16, err2, sizeof err2) == 1, "crafted good %s file restores: %s", qtype_name(t), err2);
        uint16_t bad = t == QT_F16 ? 0x7E00 : 0x7FC0; /* NaN */
        memcpy(body + n * 4 + 2 * 5, &bad, 2);
        craft(header(n, &h16), body, len16, 1);
        refused(&h16, "nan in a 16-bit cache", "corrupt");
        memset(body + n * 4 + 2 * 5, 0, 2);
    }

    /* Not a regular file: a FIFO must not hang the start-up; a missing file is simply cold. */
    unlink(path);
    if (mkfifo(path, 0600) == 0) refused(&a, "fifo", "not a regular file");
    unlink(path);
    CHECK(restore(&a, err, sizeof err) == 0, "missing file: rc 0");
    free(body);
    free(good);
}

static void touch(const char *name, size_t bytes) {
    char p[400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    for (size_t i = 0; f && i < bytes; i++) fputc('x', f);
    if (f) fclose(f);
}

static int exists(const char *name) {
    char p[400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

static void test_dir_lock_and_clean(void) {
    char err[1024];
    int fd = kv_dir_lock(dir, err, sizeof err);
    CHECK(fd >= 0, "first lock: %s", err);
    /* flock conflicts between open file descriptions even within one process: a second engine */
    int second = kv_dir_lock(dir, err, sizeof err);
    CHECK(second == KV_DIR_BUSY && strstr(err, dir) && strstr(err, "in use by another colibri engine") && strstr(err, "--kv-dir"),
          "second lock refused: '%s'", err);
    char pid[32];
    snprintf(pid, sizeof pid, "(pid %d)", (int)getpid());
    CHECK(strstr(err, pid) != NULL, "message names the holder: '%s'", err);
    close(fd);
    fd = kv_dir_lock(dir, err, sizeof err);
    CHECK(fd >= 0, "lock free again after the holder closed it: %s", err);
    close(fd);
    char missing[300];
    snprintf(missing, sizeof missing, "%s/no/such", dir);
    CHECK(kv_dir_lock(missing, err, sizeof err) == -1 && strstr(err, "--kv-dir") && strstr(err, missing),
          "missing directory: '%s'", err);

    touch(".coli_kv.tmp", 1000);
    touch(".coli_kv.3.tmp", 10);
    touch(".coli_kv.x.tmp", 1);
    touch(".coli_kv", 1);
    touch(".coli_kv.2", 1);
    touch("other.tmp", 1);
    CHECK(kv_dir_clean(dir) == 2, "two temporaries removed");
    CHECK(!exists(".coli_kv.tmp") && !exists(".coli_kv.3.tmp"), "slot temporaries gone");
    CHECK(exists(".coli_kv.x.tmp") && exists(".coli_kv") && exists(".coli_kv.2") && exists("other.tmp") &&
              exists(".coli_kv.lock"),
          "everything else kept");
}

void test_kv_persist(void) {
    snprintf(dir, sizeof dir, "/tmp/coli_kvtest_XXXXXX");
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp: %s", strerror(errno));
        return;
    }
    snprintf(path, sizeof path, "%s/.coli_kv", dir);
    test_restore();
    test_dir_lock_and_clean();
    const char *names[] = {".coli_kv", ".coli_kv.tmp", ".coli_kv.x.tmp", ".coli_kv.2", "other.tmp", ".coli_kv.lock"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char p[400];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
}
