/* One engine per KV directory. Two engines on one directory would overwrite each other's slots,
 * so the directory is locked (flock on DIR/.coli_kv.lock) for the engine's whole life; holding
 * the lock also proves that a leftover temporary belongs to a save that died, not one running. */
#ifndef COLI_KV_DIR_H
#define COLI_KV_DIR_H
#include <stddef.h>

/* Takes the lock without waiting: the lock's fd (keep it open), or with err naming the
 * directory and what to do: KV_DIR_BUSY when another engine holds it (it may go away: worth a
 * retry), -1 when it cannot be created. */
#define KV_DIR_BUSY (-2)
int kv_dir_lock(const char *dir, char *err, size_t errlen);
/* Removes the temporaries (.coli_kv.tmp, .coli_kv.N.tmp) interrupted saves left; call it only
 * while holding the lock. Each removal is reported on stderr. Returns how many were removed. */
int kv_dir_clean(const char *dir);

#endif
