/* KV persistence off the request path: the protocol loop hands each finished turn's record
 * (kv_log.h: only the positions the turn added, copied) to one writer thread, which appends it
 * to the slot's log and fdatasyncs, or, for a whole record, writes a new base file. When a log
 * grows past its base, the slot's next record is a whole one, which becomes the new base (the
 * writer never reads its files back). EOF drains the queue before the engine exits.
 *
 * What the writer holds is bounded, and the RAM budget reserves it (kv_writer_reserve):
 * - per slot at most one queued record: a newer turn of a slot whose record is still queued
 *   replaces it (kv_writer_withdraw), by one record built from the slot since the older one's
 *   start, which is what the disk would hold had the older turn never been saved apart;
 * - the records queued or being written, all slots together, at most KV_WRITER_RECORDS whole
 *   slots' worth; a turn past that waits for the disk (back-pressure: said once on stderr and
 *   counted in END's kv_writer_waits), so the next request waits on the previous one's fsync
 *   only when the disk falls that far behind;
 * - while it writes a base, one image of a slot. */
#ifndef COLI_KV_WRITER_H
#define COLI_KV_WRITER_H
#include "kv_log.h"

#define KV_WRITER_RECORDS 2 /* whole slots' worth of records queued or in flight: one writing, one waiting */

typedef struct KvWriter KvWriter;

/* Bytes the writer may hold for slots of ctx positions: its records' bound plus one image. */
size_t kv_writer_reserve(const Arch *a, int ctx);
/* dir: the --kv-dir; slots: how many; a, ctx: the slots' geometry (for the writer's own images
 * when it writes a base). NULL when out of memory. */
KvWriter *kv_writer_start(const char *dir, int slots, const Arch *a, int ctx, uint64_t fingerprint);
/* A restored slot: its base exists and its log is `log_len` bytes long (0: none). */
void kv_writer_known(KvWriter *w, int slot, off_t log_len);
/* Takes back the slot's queued record (one not yet being written): its n0, or -1 when none. */
int kv_writer_withdraw(KvWriter *w, int slot);
/* Makes room for a record of len bytes, waiting while the bound is full (never when nothing
 * is held, so any record fits); the bytes count as held until the record is written or dropped. */
void kv_writer_admit(KvWriter *w, size_t len);
/* Gives back admitted bytes whose record could not be built. */
void kv_writer_release(KvWriter *w, size_t len);
/* Queues record r (admitted; ownership passes) for slot. */
void kv_writer_submit(KvWriter *w, int slot, KvRecord r);
/* 1 while the slot's next record must start at 0 (no base written yet, a write failed, or the
 * log has outgrown its base). */
int kv_writer_needs_full(KvWriter *w, int slot);
/* The most bytes held at once so far, and how many turns waited for room. */
void kv_writer_stats(KvWriter *w, size_t *peak, unsigned long *waits);
/* Writes what is queued, then stops the thread. */
void kv_writer_stop(KvWriter *w);
/* The file names of slot i: base (.coli_kv[.i]) and log (... .log). */
void kv_slot_paths(const char *dir, int slot, char *base, char *log, size_t n);

#endif
