/* Incremental KV persistence: next to each slot's base file (kv_persist.c, rewritten whole
 * and atomically) an append-only log of the turns since, so saving a turn writes only its new
 * positions. A record says "cut the slot back to n0, then append positions n0..n1, and this is
 * the fixed state after n1"; replaying base + log rebuilds the slot byte for byte. The log names
 * its base by the base file's checksum, so a log left beside a newer base is never applied, and
 * a record torn by a crash (or damaged) ends the replay: the slot comes back as of the last
 * whole record, an earlier turn's state, never a mix. */
#ifndef COLI_KV_LOG_H
#define COLI_KV_LOG_H
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "model/model.h"

typedef struct {
    unsigned char *buf; /* the record's bytes, checksum included */
    size_t len;
    int n0, n1;
} KvRecord;

/* Copies kv's positions [n0, kv->n) and its fixed state into a record, n0 lowered to the start of
 * any group of rows a layer fills later (StateDesc.settle); 0, or -1 out of memory. */
int kv_record_build(const KvCache *kv, int n0, KvRecord *r);
void kv_record_free(KvRecord *r);
/* The bytes kv_record_build(kv, n0) will allocate (0: too large for a size_t). */
size_t kv_record_size(const KvCache *kv, int n0);
/* The largest record a slot of ctx positions can need: all of it, with every checkpoint. */
size_t kv_record_max(const Arch *a, int ctx);
/* Applies a record (built here, or read and checked by kv_log_replay) to kv. */
void kv_record_apply(KvCache *kv, const KvRecord *r);

#define KV_LOG_HEADER 24 /* bytes before a log's first record: magic, fingerprint, the base's checksum */

/* The checksum that ends a base file (its identity for the log); 0 ok, -1 unreadable. */
int kv_file_sum(const char *path, uint64_t *sum);
/* Appends r to the log at log_path (created, with its header, when absent or not this base's);
 * fdatasyncs. *len is the log's valid length (0: none yet), updated. 0 ok, -1 with err. */
int kv_log_append(const char *log_path, uint64_t fp, uint64_t base_sum, off_t *len, const KvRecord *r, char *err, size_t errlen);
/* Replays the log onto kv (just restored from its base). Returns the records applied (0: no
 * log, or one for another base) and sets *good to the log's valid length (a torn tail is cut
 * off the file); -1 when the log cannot be read. A damaged record stops the replay; *note then
 * says why (empty otherwise). */
int kv_log_replay(KvCache *kv, const Arch *a, uint64_t fp, uint64_t base_sum, const char *log_path, off_t *good, char *note,
                  size_t notelen);

#endif
