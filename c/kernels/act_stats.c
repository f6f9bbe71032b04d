/* Activation statistics (act_stats.h). The file act_stats_write leaves, little-endian:
 *   "COLISTAT" u32 version (1) u32 n
 *   n times: u32 name bytes, the name, u32 cols, f64 positions, f32 sums[cols]
 * Matrices no position reached are left out. One lock guards the table: experts run on
 * several threads at once, and calibration is not the serving path. */
#include "kernels/act_stats.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *name;
    int cols;
    double positions;
    float *sums; /* cols, allocated when first reached */
} Entry;

typedef struct {
    uintptr_t key; /* 0: empty */
    int entry;
} Slot;

int act_stats_on;
static Entry *entries;
static int n_entries, cap_entries;
static Slot *table;
static size_t table_cap, n_keys; /* a power of two, at most half full */

static size_t slot_of(uintptr_t key) {
    size_t h = (size_t)(key >> 4) * 0x9E3779B97F4A7C15ull;
    for (size_t i = h & (table_cap - 1);; i = (i + 1) & (table_cap - 1))
        if (table[i].key == key || !table[i].key) return i;
}

static int grow_table(void) {
    Slot *old = table;
    size_t old_cap = table_cap, cap = table_cap ? table_cap * 2 : 1024;
    Slot *t = calloc(cap, sizeof *t);
    if (!t) return -1;
    table = t;
    table_cap = cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].key) table[slot_of(old[i].key)] = old[i];
    free(old);
    return 0;
}

/* key -> entry; -1: out of memory (the statistics then stop, act_stats_write says so). */
static int bind(uintptr_t key, int entry) {
    if (!key) return 0;
    if ((n_keys + 1) * 2 > table_cap && grow_table()) return -1;
    size_t i = slot_of(key);
    n_keys += !table[i].key;
    table[i] = (Slot){key, entry};
    return 0;
}

static int lookup(uintptr_t key) {
    if (!table_cap) return -1;
    size_t i = slot_of(key);
    return table[i].key ? table[i].entry : -1;
}

static int oom;

void act_stats_begin(void) {
    act_stats_end();
    act_stats_on = 1;
}

void act_stats_end(void) {
    for (int i = 0; i < n_entries; i++) {
        free(entries[i].name);
        free(entries[i].sums);
    }
    free(entries);
    free(table);
    entries = NULL;
    table = NULL;
    n_entries = cap_entries = 0;
    table_cap = n_keys = 0;
    oom = act_stats_on = 0;
}

void act_stats_name(const void *data, const char *name) {
    if (!act_stats_on || !data) return;
#pragma omp critical(act_stats)
    {
        if (n_entries == cap_entries) {
            int cap = cap_entries ? cap_entries * 2 : 256;
            Entry *e = realloc(entries, sizeof *e * (size_t)cap);
            if (e) {
                entries = e;
                cap_entries = cap;
            }
        }
        char *copy = n_entries < cap_entries ? strdup(name) : NULL;
        if (!copy || bind((uintptr_t)data, n_entries)) {
            free(copy);
            oom = 1;
        } else entries[n_entries++] = (Entry){copy, 0, 0, NULL};
    }
}

void act_stats_alias(const void *copy, const void *orig) {
    if (!act_stats_on) return;
#pragma omp critical(act_stats)
    {
        int e = lookup((uintptr_t)orig);
        if (e >= 0 && bind((uintptr_t)copy, e)) oom = 1;
    }
}

void act_stats_observe(const QMat *w, const float *x, int T) {
    const int cols = w->cols;
#pragma omp critical(act_stats)
    {
        int e = lookup((uintptr_t)w->data);
        Entry *en = e >= 0 ? &entries[e] : NULL;
        if (en && !en->sums) {
            en->sums = calloc((size_t)cols, sizeof(float));
            en->cols = cols;
            if (!en->sums) oom = 1;
        }
        if (en && en->sums && en->cols == cols) {
            for (int c = 0; c < cols; c++) {
                double s = 0; /* a pass's positions in double, then one rounding into the sum */
                for (int t = 0; t < T; t++) s += (double)x[(size_t)t * cols + c] * x[(size_t)t * cols + c];
                en->sums[c] += (float)s;
            }
            en->positions += T;
        }
    }
}

void act_stats_counts(int *named, int *counted) {
    int c = 0;
    for (int i = 0; i < n_entries; i++) c += entries[i].positions > 0;
    *named = n_entries;
    *counted = c;
}

static int put(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n ? 0 : -1; }

int act_stats_write(const char *path, char *err, size_t errlen) {
    if (oom) {
        snprintf(err, errlen, "out of memory for the activation statistics");
        return -1;
    }
    FILE *f = fopen(path, "wb");
    if (!f) {
        snprintf(err, errlen, "cannot write %s", path);
        return -1;
    }
    uint32_t version = 1, n = 0;
    for (int i = 0; i < n_entries; i++) n += entries[i].positions > 0;
    int bad = put(f, "COLISTAT", 8) || put(f, &version, 4) || put(f, &n, 4);
    for (int i = 0; i < n_entries && !bad; i++) {
        const Entry *en = &entries[i];
        if (!(en->positions > 0)) continue;
        uint32_t len = (uint32_t)strlen(en->name), cols = (uint32_t)en->cols;
        bad = put(f, &len, 4) || put(f, en->name, len) || put(f, &cols, 4) || put(f, &en->positions, 8) ||
              put(f, en->sums, sizeof(float) * (size_t)cols);
    }
    if (fclose(f) || bad) {
        remove(path);
        snprintf(err, errlen, "cannot write %s (disk full?)", path);
        return -1;
    }
    return 0;
}
