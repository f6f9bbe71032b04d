/* The expert store's internals shared by its two halves: expert_store.c (set-up, geometry,
 * statistics) and expert_run.c (the forward pass through the cache). Not for other files. */
#ifndef COLI_EXPERT_CACHE_H
#define COLI_EXPERT_CACHE_H
#include "experts/expert_store.h"

#define PAGE 4096u
#define ALIGN_DOWN(x) ((x) & ~(uint64_t)(PAGE - 1))
#define ALIGN_UP(x) (((x) + PAGE - 1) & ~(uint64_t)(PAGE - 1))

typedef struct {
    int nseg;
    int file[3];
    uint64_t off[3], len[3]; /* segments as stored */
    int tseg[3];             /* gate/up/down: which segment, */
    uint64_t toff[3];        /* and the tensor's file offset */
} ExpertGeom;

enum { SLOT_EMPTY, SLOT_LOADING, SLOT_READY };

typedef struct {
    unsigned char *buf;
    int expert, state, busy, pinned;
    uint64_t last;
    Mlp mlp; /* QMats into buf */
    IoReq req;
} Slot;

struct ExpertCache {
    int cap;
    int *slot_of;        /* [E]: slot holding (or loading) the expert, -1 */
    Slot *slots;         /* [cap] */
    unsigned char *bufs; /* the slots' buffers, one after another (huge_alloc) */
    size_t bufs_bytes;
    ExpertGeom *geom;    /* [E] */
    uint64_t seg_dst[3]; /* where each segment lands in a slot */
    uint64_t tick;
};

/* Points slot si of c at expert e's bytes and fills its read request (state LOADING). */
void slot_assign(ExpertStore *s, ExpertCache *c, const ExpertLayer *xl, int si, int e);
/* A read that failed is fatal: the message names the expert and the file. */
void read_failed(const ExpertStore *s, const ExpertLayer *xl, int e, int err) __attribute__((noreturn));
/* A slot that may take a new expert, or -1 (see expert_store.c). */
int victim(const ExpertCache *c, const unsigned char *avoid);

#endif
