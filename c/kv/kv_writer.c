#include "kv/kv_writer.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kv/kv_persist.h"

#define COMPACT_MIN (64 << 10) /* bytes of log always allowed: tiny slots do not rewrite every turn */

typedef struct Job {
    int slot;
    KvRecord r;
    struct Job *next;
} Job;

typedef struct {
    /* the files as the queued records leave them (the loop's view, decides whole records) */
    uint64_t base_bytes; /* 0: no base */
    uint64_t log_bytes;  /* 0: no log */
    /* the files as written so far (the writer's view) */
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
    size_t held, limit, peak; /* record bytes queued or being written; their bound; the most held */
    unsigned long waits;      /* turns that waited for room */
    pthread_mutex_t mu;
    pthread_cond_t cv, room;
    pthread_t th;
};

size_t kv_writer_reserve(const Arch *a, int ctx) {
    return KV_WRITER_RECORDS * kv_record_max(a, ctx) + kv_bytes(a, ctx) + KV_MAX_CHECKPOINTS * kv_checkpoint_bytes(a, ctx);
}

void kv_slot_paths(const char *dir, int slot, char *base, char *log, size_t n) {
    if (slot == 0) snprintf(base, n, "%s/.coli_kv", dir);
    else snprintf(base, n, "%s/.coli_kv.%d", dir, slot);
    snprintf(log, n, "%.*s.log", (int)(n > 5 ? n - 5 : 0), base);
}

/* A base file holding whole record r, built in an image of the slot and written atomically;
 * then the log goes (a crash in between leaves a log whose base checksum no longer matches). */
static int write_base(KvWriter *w, int slot, const KvRecord *r) {
    char base[4200], log[4200], err[600];
    kv_slot_paths(w->dir, slot, base, log, sizeof base);
    KvCache img;
    if (kv_init(&img, w->a, w->ctx)) {
        fprintf(stderr, "colibri: no memory to save KV slot %d\n", slot);
        return -1;
    }
    kv_record_apply(&img, r);
    int rc = kv_save(&img, w->a, w->fp, base, err, sizeof err);
    kv_free(&img);
    if (rc) {
        fprintf(stderr, "colibri: %s\n", err);
        return -1;
    }
    unlink(log);
    return 0;
}

static void write_one(KvWriter *w, Job *j) {
    char base[4200], log[4200], err[600] = "";
    kv_slot_paths(w->dir, j->slot, base, log, sizeof base);
    pthread_mutex_lock(&w->mu);
    SlotDisk d = w->disk[j->slot];
    pthread_mutex_unlock(&w->mu);
    int rc;
    if (j->r.n0 == 0) {
        rc = write_base(w, j->slot, &j->r);
        if (!rc) d.has_base = 1, d.log_len = 0, d.broken = 0;
    } else {
        uint64_t sum;
        rc = kv_file_sum(base, &sum);
        if (!rc) rc = kv_log_append(log, w->fp, sum, &d.log_len, &j->r, err, sizeof err);
        if (rc && err[0]) fprintf(stderr, "colibri: %s\n", err);
    }
    pthread_mutex_lock(&w->mu);
    SlotDisk *s = &w->disk[j->slot];
    s->log_len = d.log_len;
    s->has_base = d.has_base;
    s->broken = d.broken;
    if (rc) { /* the disk no longer follows the records: the next one must carry the slot whole */
        s->broken = 1;
        s->has_base = 0;
    }
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
        int skip = (w->disk[j->slot].broken || !w->disk[j->slot].has_base) && j->r.n0 > 0; /* built on what failed */
        pthread_mutex_unlock(&w->mu);
        if (!skip) write_one(w, j);
        size_t len = j->r.len;
        kv_record_free(&j->r);
        free(j);
        pthread_mutex_lock(&w->mu);
        w->held -= len;
        pthread_cond_broadcast(&w->room);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

KvWriter *kv_writer_start(const char *dir, int slots, const Arch *a, int ctx, uint64_t fingerprint) {
    KvWriter *w = calloc(1, sizeof *w);
    if (!w || !(w->disk = calloc((size_t)slots, sizeof(SlotDisk)))) {
        free(w);
        return NULL;
    }
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    w->a = a;
    w->ctx = ctx;
    w->slots = slots;
    w->fp = fingerprint;
    w->limit = KV_WRITER_RECORDS * kv_record_max(a, ctx);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    pthread_cond_init(&w->room, NULL);
    if (pthread_create(&w->th, NULL, run, w)) {
        free(w->disk);
        free(w);
        return NULL;
    }
    return w;
}

void kv_writer_known(KvWriter *w, int slot, off_t log_len) {
    char base[4200], log[4200];
    struct stat st;
    kv_slot_paths(w->dir, slot, base, log, sizeof base);
    pthread_mutex_lock(&w->mu);
    SlotDisk *d = &w->disk[slot];
    d->has_base = 1;
    d->log_len = log_len;
    d->base_bytes = stat(base, &st) ? 0 : (uint64_t)st.st_size;
    d->log_bytes = (uint64_t)log_len;
    pthread_mutex_unlock(&w->mu);
}

int kv_writer_next_full(KvWriter *w, int slot, size_t delta_len) {
    pthread_mutex_lock(&w->mu);
    const SlotDisk *d = &w->disk[slot];
    /* as the writer used to compact after an append: a log longer than its base (and than a few
     * pages) is folded into a new base, which the whole record writes directly */
    uint64_t log = (d->log_bytes ? d->log_bytes : KV_LOG_HEADER) + delta_len;
    int v = d->broken || !d->base_bytes || log > (d->base_bytes > COMPACT_MIN ? d->base_bytes : COMPACT_MIN);
    pthread_mutex_unlock(&w->mu);
    return v;
}

void kv_writer_admit(KvWriter *w, int slot, int full, size_t len) {
    pthread_mutex_lock(&w->mu);
    for (Job **p = &w->head, *prev = NULL; full && *p;) { /* superseded: the whole record's base replaces them */
        Job *j = *p;
        if (j->slot != slot) {
            prev = j;
            p = &j->next;
            continue;
        }
        *p = j->next;
        if (w->tail == j) w->tail = prev;
        w->held -= j->r.len;
        kv_record_free(&j->r);
        free(j);
    }
    if (w->held && w->held + len > w->limit) {
        if (!w->waits++)
            fprintf(stderr,
                    "colibri: the KV writer is behind the disk (%.1f MB queued, its bound is %.1f MB); turns "
                    "wait for it to catch up (back-pressure, counted in END's kv_writer_waits; said once)\n",
                    w->held / 1e6, w->limit / 1e6);
        while (w->held && w->held + len > w->limit) pthread_cond_wait(&w->room, &w->mu);
    }
    w->held += len;
    if (w->held > w->peak) w->peak = w->held;
    pthread_mutex_unlock(&w->mu);
}

void kv_writer_release(KvWriter *w, size_t len) {
    pthread_mutex_lock(&w->mu);
    w->held -= len;
    pthread_cond_broadcast(&w->room);
    pthread_mutex_unlock(&w->mu);
}

void kv_writer_submit(KvWriter *w, int slot, KvRecord r, uint64_t base_bytes) {
    Job *j = malloc(sizeof *j);
    if (!j) {
        kv_writer_release(w, r.len);
        kv_record_free(&r);
        fprintf(stderr, "colibri: no memory to save KV slot %d\n", slot);
        return;
    }
    *j = (Job){slot, r, NULL};
    pthread_mutex_lock(&w->mu);
    SlotDisk *d = &w->disk[slot];
    if (r.n0 == 0) d->base_bytes = base_bytes, d->log_bytes = 0;
    else d->log_bytes = (d->log_bytes ? d->log_bytes : KV_LOG_HEADER) + r.len;
    if (w->tail) w->tail->next = j;
    else w->head = j;
    w->tail = j;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void kv_writer_stats(KvWriter *w, size_t *peak, unsigned long *waits) {
    pthread_mutex_lock(&w->mu);
    *peak = w->peak;
    *waits = w->waits;
    pthread_mutex_unlock(&w->mu);
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
    pthread_cond_destroy(&w->room);
    free(w->disk);
    free(w);
}
