/* Crash-safe persistence of one KV slot: written to a temporary file, fsynced and renamed, so a
 * restarted engine finds either the previous or the new state, never a torn one. */
#ifndef COLI_KV_PERSIST_H
#define COLI_KV_PERSIST_H
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

uint64_t kv_fingerprint(const char *model_dir); /* FNV-1a of colibri.json; 0 if unreadable */
int kv_save(const KvCache *kv, const Arch *a, uint64_t fp, const char *path, char *err, size_t errlen);
/* The bytes kv_save writes for kv as it is now (0: too large). */
uint64_t kv_save_size(const KvCache *kv);
/* Restores into an initialised cache. 1 restored, 0 no file, -1 unusable (err says why). */
int kv_restore(KvCache *kv, const Arch *a, uint64_t fp, const char *path, char *err, size_t errlen);

#endif
