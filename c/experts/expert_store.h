/* The expert store: where the routed experts of every MoE layer come from. Resident (no --ram,
 * no --cap): each expert's gate/up/down point into the shard mappings, as before. Streaming:
 * the dense trunk stays mapped, the experts' file ranges are unmapped, and each MoE layer has
 * a cache of `cap` aligned slots filled by one pread per expert from an I/O thread pool
 * (docs/architecture.md, "Expert streaming"). Results never depend on the mode: each expert's
 * output rows are kept apart and summed in expert order, whatever order the experts ran in. */
#ifndef COLI_EXPERT_STORE_H
#define COLI_EXPERT_STORE_H
#include <stdint.h>

#include "experts/io_pool.h"
#include "io/container.h"
#include "kernels/ops.h"

typedef struct ExpertCache ExpertCache;
typedef struct ExpertStore ExpertStore;

/* The routed experts of one MoE layer, as the block that owns them fills it at load. */
typedef struct ExpertLayer {
    int layer, E, K, H, width;
    Mlp *experts; /* [E]: QMats into the shard mappings (used when resident) */
    /* this layer's router, with which the previous MoE layer predicts its experts (read-ahead):
     * sel[T][K], wts[T][K] from x[T][H] */
    void (*predict)(const void *self, const float *x, int T, int *sel, float *wts);
    const void *predict_self;
    /* set by expert_store_init */
    ExpertStore *store;
    ExpertCache *cache;       /* NULL: resident */
    int index;                /* among the MoE layers */
    struct ExpertLayer *next; /* the next MoE layer, NULL for the last */
} ExpertLayer;

/* out[T][hidden] = sum over j of wts[t][j] * expert sel[t][j] (x[t]); each distinct expert runs
 * once over all the rows that chose it (batch-union). */
void expert_layer_run(const ExpertLayer *xl, const float *x, int T, const int *sel, const float *wts, float *out);

typedef struct {
    uint64_t hits, misses; /* expert lookups served from RAM / read from the model files */
    uint64_t bytes_read;   /* bytes the store read */
    double io_wait_ms;     /* time the forward pass waited for reads */
    double read_busy_s;    /* time at least one read was in flight */
} ExpertStats;

typedef struct {
    int cap;       /* slots per MoE layer, 1..E (streaming) */
    int direct;    /* try O_DIRECT */
    int readahead; /* next-layer read-ahead */
    int io_threads;
    const uint64_t *pin_counts; /* [moe_layers][experts] from .coli_usage, or NULL: pin nothing */
} StoreOptions;

struct ExpertStore {
    const Container *ct;
    int n;                 /* MoE layers: the trunk's, then the MTP head's when it drafts */
    int n_trunk;           /* the trunk's: what .coli_usage, pins and ROUTING frames count */
    ExpertLayer **layers;  /* [n] */
    int experts;           /* E of the widest MoE layer */
    uint64_t expert_bytes; /* gate + up + down of one expert (the largest) */
    uint64_t slot_bytes;   /* what a cache slot holds: the expert's pages plus alignment slack */
    uint64_t expert_total; /* every routed expert's bytes */
    int split_reason;      /* 1: some expert is not one byte range; it is read tensor by tensor */
    int streaming, cap, direct, readahead, pinned;
    IoPool pool;
    int pool_started;
    int n_files, *fd_direct, *fd_buf;
    uint32_t *turn_counts; /* [n][experts]: routing of this turn (positions x top-k) */
    ExpertStats st;        /* this turn */
    double pool_busy0;
    uint64_t pool_bytes0;
};

/* Takes the model's n MoE layers (in order) and measures their experts; no I/O. 0 ok, -1 out
 * of memory or a tensor outside the shards. */
int expert_store_init(ExpertStore *s, const Container *ct, ExpertLayer *const *layers, int n, char *err, size_t errlen);
/* Bytes of every tensor that is not a routed expert (f32 tensors twice: loaders copy them). */
uint64_t expert_store_dense_bytes(const ExpertStore *s);
/* Switches to streaming with o->cap slots per layer. 0 ok, -1 with err. */
int expert_store_stream(ExpertStore *s, const StoreOptions *o, char *err, size_t errlen);
/* A model without routed experts under a budget: its weights move into anonymous huge pages,
 * as streaming moves the dense weights of one with experts. */
void expert_store_hold_dense(const ExpertStore *s);
void expert_store_free(ExpertStore *s);
/* Per-turn statistics and routing counts start from zero. */
void expert_store_turn_begin(ExpertStore *s);
/* Folds the pool's counters into s->st (call before reading it). */
void expert_store_turn_end(ExpertStore *s);
/* Experts in RAM now (pinned included); L * E when resident. */
uint64_t expert_store_cached(const ExpertStore *s);

#endif
