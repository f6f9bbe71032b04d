/* Internals shared by grammar_match.c (the stack-set DFA) and grammar_mask.c (the vocabulary
 * trie and token masks). Not part of the engine-facing API (that is grammar.h). */
#ifndef COLI_GRAMMAR_INTERNAL_H
#define COLI_GRAMMAR_INTERNAL_H
#include "grammar/grammar.h"

#define G_EMPTY 0      /* node 0: the empty stack (the output is complete) */
#define G_DEAD (-1)    /* transition into nothing */
#define G_UNKNOWN (-2) /* transition not computed yet */
#define G_INF_BYTES (1u << 30)
/* A grammar ambiguous enough to need more than this is refused mid-run (the run fails like an
 * allocation would): expansion steps of one generation (grammar_run_set_work_limit), stack
 * frames of the run. */
#define GRAMMAR_MAX_WORK 20000000ull
#define GRAMMAR_MAX_NODES 4000000u

/* A stack frame: the element to match next, and the frame to return to (a continuation). */
typedef struct {
    uint32_t pos;
    int32_t parent;
    uint32_t minb;
} GNode;

/* A DFA state: a set of stacks (each topped by a character element), and the bytes of a UTF-8
 * sequence read so far but not yet complete. */
typedef struct {
    uint32_t set_off, set_n; /* node ids, ascending, in r->pool */
    uint8_t pend[4], npend, need;
    uint8_t complete, finished;
    uint32_t minb;  /* bytes any completion needs at least */
    int32_t *next;  /* [256] transitions, lazily allocated */
    uint32_t *mask; /* cached allowed-token bits, or NULL */
    int32_t mask_count;
    uint32_t mask_maxnext; /* the largest minb of a state an allowed token leads to */
} GState;

typedef struct {
    uint64_t *keys;
    int32_t *vals;
    size_t cap, n;
} GMap; /* 64-bit key -> id */
/* A set of 64-bit keys emptied in O(1): a slot holds a key of this generation or counts as free. */
typedef struct {
    uint64_t *keys;
    uint32_t *stamp;
    size_t cap, n;
    uint32_t gen;
} GSeen;

struct GrammarVocab {
    int n; /* token ids 0..n */
    uint8_t *kind;
    const char **bytes; /* copies in pool */
    size_t *len;
    char *pool;
    /* preorder trie over GV_TEXT tokens: node i has byte[i] at depth[i] (1-based); its
     * subtree ends before skip[i]; tok[i] is the first token spelling it (-1: none), further
     * ones chained through same[] */
    uint32_t n_nodes;
    uint8_t *byte;
    uint16_t *depth;
    uint32_t *skip;
    int32_t *tok, *same;
    uint16_t max_depth;
    int32_t *added, n_added; /* GV_ADDED ids */
    int32_t *eos, n_eos;     /* GV_EOS ids */
};

struct GrammarRun {
    const Grammar *g;
    const GrammarVocab *v;
    int failed;
    GNode *nodes;
    size_t n_nodes, nodes_cap;
    GMap node_map;
    uint32_t *pool; /* every state's node ids */
    size_t pool_n, pool_cap;
    GState *st;
    size_t n_st, st_cap;
    GMap st_map; /* hash of (set, pending bytes) -> state */
    int32_t start, cur;
    uint8_t *added_ok; /* per vocab->added: the grammar spells its text */
    /* scratch for one advance */
    uint32_t *out;
    size_t out_n, out_cap;
    uint64_t *work;
    size_t work_n, work_cap;
    GSeen seen;
    /* masks */
    uint32_t *scratch_mask;                /* budget-filtered mask */
    int32_t *walk_state;                   /* per trie depth */
    size_t masks_cached, mask_cache_bytes; /* masks kept, and the bytes they may take */
    uint64_t masks_built, mask_hits;
    uint64_t work_total, work_limit; /* expansion steps since the last reset, and their limit */
};

int32_t gstate_next(GrammarRun *r, int32_t s, unsigned byte);
int gmap_get(const GMap *m, uint64_t key, int32_t *val);
int gmap_put(GMap *m, uint64_t key, int32_t val);
void gmap_free(GMap *m);
void grammar_mask_drop(GrammarRun *r); /* frees cached masks (the cache's memory bound) */

#endif
