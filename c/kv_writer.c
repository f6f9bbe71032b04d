#include "kv_writer.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kv_persist.h"

#define COMPACT_MIN (64 << 10) /* bytes of log always allowed: tiny slots do not rewrite every turn */

typedef struct Job {
    int slot;
    KvRecord r;
    struct Job *next;
} Job;

typedef struct {
    off_t log_len; /* valid bytes of the slot's log; 0: none */
    int has_base;
    int broken; /* a write failed: records that build on the disk are dropped until a whole one lands */
} SlotDisk;

struct KvWriter {
    char dir[4096];
    const Arch *a;
    int ctx, slots;
    uint64_t fp;
    SlotDisk *disk;
    Job *head, *tail;
    int stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
};

void kv_slot_paths(const char *dir, int slot, char *base, char *log, size_t n) {
    if (slot == 0) snprintf(base, n, "%s/.coli_kv", dir);
    else snprintf(base, n, "%s/.coli_kv.%d", dir, slot);
    snprintf(log, n, "%.*s.log", (int)(n > 5 ? n - 5 : 0), base);
}

/* A base file holding base + log + r: rebuilt in an image of the slot, written atomically,
 * then the log goes (a crash in between leaves a log whose base checksum no longer matches). */
static int write_base(KvWriter *w, int slot, const KvRecord *r) {
    char base[4200], log[4200], err[600], note[200];
    kv_slot_paths(w->dir, slot, base, log, sizeof base);
    SlotDisk *d = &w->disk[slot];
    KvCache img;
    if (kv_init(&img, w->a, w->ctx)) { fprintf(stderr, "colibri: no memory to save KV slot %d\n", slot); return -1; }
    if (r->n0 > 0) { /* compaction: what is on disk, then the record */
        uint64_t sum;
        off_t good;
        if (kv_restore(&img, w->a, w->fp, base, err, sizeof err) != 1 || kv_file_sum(base, &sum) ||
            kv_log_replay(&img, w->a, w->fp, sum, log, &good, note, sizeof note) < 0 || img.n < r->n0) {
            kv_free(&img);
            return -1;
        }
    }
    kv_record_apply(&img, r);
    int rc = kv_save(&img, w->a, w->fp, base, err, sizeof err);
    kv_free(&img);
    if (rc) { fprintf(stderr, "colibri: %s\n", err); return -1; }
    unlink(log);
    d->has_base = 1;
    d->log_len = 0;
    return 0;
}

static void write_one(KvWriter *w, Job *j) {
    SlotDisk *d = &w->disk[j->slot];
    char base[4200], log[4200], err[600];
    kv_slot_paths(w->dir, j->slot, base, log, sizeof base);
    int full = j->r.n0 == 0 || !d->has_base, rc;
    if (full) rc = write_base(w, j->slot, &j->r);
    else {
        uint64_t sum;
        struct stat st;
        rc = kv_file_sum(base, &sum);
        if (!rc) rc = kv_log_append(log, w->fp, sum, &d->log_len, &j->r, err, sizeof err);
        if (rc && err[0]) fprintf(stderr, "colibri: %s\n", err);
        /* a log longer than its base (and than a few pages): fold them, the next records start a fresh log */
        if (!rc && !stat(base, &st) && d->log_len > (st.st_size > COMPACT_MIN ? st.st_size : COMPACT_MIN))
            rc = write_base(w, j->slot, &j->r);
    }
    pthread_mutex_lock(&w->mu);
    if (rc) { /* the disk no longer follows the records: the next one must carry the slot whole */
        d->broken = 1;
        d->has_base = 0;
    } else if (full) d->broken = 0;
    pthread_mutex_unlock(&w->mu);
}

static void *run(void *arg) {
    KvWriter *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->head && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
        Job *j = w->head;
        if (!j) break; /* stopping, and nothing left */
        w->head = j->next;
        if (!w->head) w->tail = NULL;
        int skip = w->disk[j->slot].broken && j->r.n0 > 0; /* built on what failed to reach the disk */
        pthread_mutex_unlock(&w->mu);
        if (!skip) write_one(w, j);
        kv_record_free(&j->r);
        free(j);
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

KvWriter *kv_writer_start(const char *dir, int slots, const Arch *a, int ctx, uint64_t fingerprint) {
    KvWriter *w = calloc(1, sizeof *w);
    if (!w || !(w->disk = calloc((size_t)slots, sizeof(SlotDisk)))) { free(w); return NULL; }
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    w->a = a;
    w->ctx = ctx;
    w->slots = slots;
    w->fp = fingerprint;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->th, NULL, run, w)) { free(w->disk); free(w); return NULL; }
    return w;
}

void kv_writer_known(KvWriter *w, int slot, off_t log_len) {
    pthread_mutex_lock(&w->mu);
    w->disk[slot].has_base = 1;
    w->disk[slot].log_len = log_len;
    pthread_mutex_unlock(&w->mu);
}

void kv_writer_submit(KvWriter *w, int slot, KvRecord r) {
    Job *j = malloc(sizeof *j);
    if (!j) { kv_record_free(&r); fprintf(stderr, "colibri: no memory to save KV slot %d\n", slot); return; }
    *j = (Job){slot, r, NULL};
    pthread_mutex_lock(&w->mu);
    if (w->tail) w->tail->next = j;
    else w->head = j;
    w->tail = j;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

int kv_writer_needs_full(KvWriter *w, int slot) {
    pthread_mutex_lock(&w->mu);
    int v = w->disk[slot].broken || !w->disk[slot].has_base;
    pthread_mutex_unlock(&w->mu);
    return v;
}

void kv_writer_stop(KvWriter *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->th, NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w->disk);
    free(w);
}
