/* KV persistence off the request path: the protocol loop hands each finished turn's record
 * (kv_log.h: only the positions the turn added, copied) to one writer thread, which appends it
 * to the slot's log and fdatasyncs, or, for a whole record, writes a new base file and removes
 * the log. EOF drains the queue before the engine exits.
 *
 * Which record is whole is decided when it is queued, from the sizes the files will have once
 * the queue lands (a slot's first save, a cut back to 0, or a log that would outgrow its base,
 * which compacts), never from how far the disk has got: the files after EOF are those a write
 * without a queue would leave, whatever the disk's speed.
 *
 * What the writer holds is bounded, and the RAM budget reserves it (kv_writer_reserve): the
 * records queued or being written, all slots together, at most KV_WRITER_RECORDS whole slots'
 * worth, plus one image of a slot while it writes a base. A whole record supersedes the slot's
 * records still queued (the base it writes replaces what they would append), which frees their
 * bytes; a turn that still finds no room waits for the disk (back-pressure: said once on stderr
 * and counted in END's kv_writer_waits), so the next request waits on the previous one's fsync
 * only when the disk has fallen that far behind. */
#ifndef COLI_KV_WRITER_H
#define COLI_KV_WRITER_H
#include "kv/kv_log.h"

#define KV_WRITER_RECORDS 2 /* whole slots' worth of records queued or in flight: one writing, one waiting */

typedef struct KvWriter KvWriter;

/* Bytes the writer may hold for slots of ctx positions: its records' bound plus one image. */
size_t kv_writer_reserve(const Arch *a, int ctx);
/* dir: the --kv-dir; slots: how many; a, ctx: the slots' geometry (for the writer's own images
 * when it writes a base). NULL when out of memory. */
KvWriter *kv_writer_start(const char *dir, int slots, const Arch *a, int ctx, uint64_t fingerprint);
/* A restored slot: its base exists and its log is `log_len` bytes long (0: none). */
void kv_writer_known(KvWriter *w, int slot, off_t log_len);
/* 1 when the slot's next record must be whole rather than the delta of delta_len bytes: no base
 * yet, a write failed, or the log would outgrow its base. */
int kv_writer_next_full(KvWriter *w, int slot, size_t delta_len);
/* Makes room for a record of len bytes (full: a whole one, which first drops the slot's queued
 * records), waiting while the bound is full, never when nothing is held; the bytes count as
 * held until the record is written or dropped. */
void kv_writer_admit(KvWriter *w, int slot, int full, size_t len);
/* Gives back admitted bytes whose record could not be built. */
void kv_writer_release(KvWriter *w, size_t len);
/* Queues admitted record r (ownership passes) for slot; base_bytes: for a whole record, the
 * size of the base it writes (kv_save_size). */
void kv_writer_submit(KvWriter *w, int slot, KvRecord r, uint64_t base_bytes);
/* The most record bytes held at once so far, and how many turns waited for room. */
void kv_writer_stats(KvWriter *w, size_t *peak, unsigned long *waits);
/* Writes what is queued, then stops the thread. */
void kv_writer_stop(KvWriter *w);
/* The file names of slot i: base (.coli_kv[.i]) and log (... .log). */
void kv_slot_paths(const char *dir, int slot, char *base, char *log, size_t n);

#endif
