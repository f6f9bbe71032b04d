/* The block table: every attention, MLP and norm kind the engine implements is one BlockKind
 * (load / run / state size), found by the "kind" its layer spec names in colibri.json. Adding a
 * block is a new c/block_*.c file and a row in blocks.c (or blocks_register), never a branch in
 * forward.c. Routers of MoE blocks are a table of their own (RouterKind). */
#ifndef COLI_BLOCKS_H
#define COLI_BLOCKS_H
#include <stddef.h>
#include <stdint.h>

#include "io/container.h"
#include "io/json.h"
#include "model/model.h"

typedef enum { ROLE_NORM, ROLE_ATTN, ROLE_MLP } BlockRole;

/* What a block's loader may use: the container, the global facts, and error reporting. */
typedef struct {
    const Container *ct;
    const Arch *a;
    int layer; /* -1 for trunk blocks */
    char *err;
    size_t errlen;
    int failed;
} BlockLoader;

/* What a block's run may use: the model's global facts, its layer, and its slice of the KV slot. */
typedef struct {
    const Arch *a;
    int layer;
    int p0;                /* position of x's first row */
    int ctx;               /* positions the state holds */
    QType kv_type;         /* element type of the per-position state */
    KvLayer *state;        /* NULL for stateless blocks */
    const int32_t *tokens; /* the T token ids of x's rows (hash routing), or NULL */
    int in_pass;           /* rows of the same prefill pass before x's first (c/model/forward.c); 0: x opens it */
} BlockRun;

struct BlockKind {
    BlockRole role;
    const char *name; /* the spec's "kind" */
    size_t size;      /* bytes of the private struct load fills */
    /* Reads the block's spec object and tensors; 0 ok, -1 with L->err set (bl_fail). */
    int (*load)(void *self, const JsonValue *spec, BlockLoader *L);
    /* out[T][hidden] = block(x[T][hidden]); writes its state for positions p0..p0+T-1. */
    void (*run)(const void *self, const BlockRun *r, const float *x, int T, float *out);
    /* The block's state for one slot; NULL for stateless blocks. */
    StateDesc (*state)(const void *self, QType kv_type);
    void (*free)(void *self); /* releases what load allocated (not self itself) */
    /* The routed experts the expert store streams (an MLP block that has them); NULL otherwise. */
    struct ExpertLayer *(*experts)(void *self);
};

const BlockKind *block_find(BlockRole role, const char *name);
/* Adds a kind at run time (tests, experiments); 0 ok, -1 table full or name taken. */
int blocks_register(const BlockKind *k);
/* Loads spec (an object with "kind") into b; a NULL or JSON null spec leaves b empty. */
int block_load(Block *b, BlockRole role, const JsonValue *spec, BlockLoader *L);
void block_free(Block *b);
const char *block_role_name(BlockRole role);

/* MoE routers: scores for E experts -> the top_k chosen experts and their weights. */
typedef struct RouterKind RouterKind;
struct RouterKind {
    const char *name;
    size_t size;
    int (*load)(void *self, const JsonValue *spec, int experts, int top_k, BlockLoader *L);
    /* sel[T][top_k], wts[T][top_k] from x[T][hidden]; ties go to the lower expert index. */
    void (*route)(const void *self, const float *x, int T, int *sel, float *wts);
    void (*free)(void *self);
    /* Routers that choose by token id (hash routing): as route, given x's token ids; NULL otherwise.
     * route then only predicts (expert read-ahead). */
    void (*route_ids)(const void *self, const float *x, const int32_t *ids, int T, int *sel, float *wts);
};
const RouterKind *router_find(const char *name);

/* Loader helpers for blocks. Tensor names come from the spec's "tensors" object. */
int bl_fail(BlockLoader *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
QMat bl_mat_named(BlockLoader *L, const char *name, int rows, int cols);
/* key in tensors: required unless optional (then absent gives a zero QMat / NULL). */
QMat bl_mat(BlockLoader *L, const JsonValue *tensors, const char *key, int rows, int cols);
const float *bl_vec(BlockLoader *L, const JsonValue *tensors, const char *key, int rows, int cols, int optional);
const float *bl_vec_named(BlockLoader *L, const char *name, int rows, int cols);
int bl_int(BlockLoader *L, const JsonValue *spec, const char *key, int lo, int hi);
double bl_num(BlockLoader *L, const JsonValue *spec, const char *key, double lo, double hi);
const char *bl_str(BlockLoader *L, const JsonValue *spec, const char *key);
const JsonValue *bl_obj(BlockLoader *L, const JsonValue *spec, const char *key);

/* A layer from its manifest spec (model_load.c): its blocks, checked against the state the spec
 * declares; hc_model: the trunk has hyper-connection streams. 0, or -1 with L->err. */
int layer_load(BlockLoader *L, Layer *y, const JsonValue *spec, int hc_model);
/* What the layer keeps per KV slot for kv_type (its blocks' states together). */
StateDesc layer_state(const Layer *y, QType kv_type);
void layer_free(Layer *y);

#endif
