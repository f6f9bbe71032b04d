/* KV persistence off the request path: the protocol loop hands each finished turn's record
 * (kv_log.h: only the positions the turn added, copied) to one writer thread, which appends it
 * to the slot's log and fsyncs, or, for a first save, writes a new base file. When a log grows
 * past its base, the writer folds both into a new base (compaction) on its own time. Nothing
 * the loop does waits for the disk; EOF drains the queue before the engine exits. */
#ifndef COLI_KV_WRITER_H
#define COLI_KV_WRITER_H
#include "kv_log.h"

typedef struct KvWriter KvWriter;

/* dir: the --kv-dir; slots: how many; a, ctx: the slots' geometry (for the writer's own images
 * when it writes a base). NULL when out of memory. */
KvWriter *kv_writer_start(const char *dir, int slots, const Arch *a, int ctx, uint64_t fingerprint);
/* A restored slot: its base exists and its log is `log_len` bytes long (0: none). */
void kv_writer_known(KvWriter *w, int slot, off_t log_len);
/* Queues record r (ownership passes) for slot. */
void kv_writer_submit(KvWriter *w, int slot, KvRecord r);
/* 1 while the slot's next record must start at 0 (no base written yet, or a write failed). */
int kv_writer_needs_full(KvWriter *w, int slot);
/* Writes what is queued, then stops the thread. */
void kv_writer_stop(KvWriter *w);
/* The file names of slot i: base (.coli_kv[.i]) and log (... .log). */
void kv_slot_paths(const char *dir, int slot, char *base, char *log, size_t n);

#endif
