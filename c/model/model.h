/* The whole model in three parts: the global facts (from the container manifest), the layers
 * (each a few blocks named by the manifest's per-layer specs, see blocks.h), and the run state
 * (KV cache and scratch). */
#ifndef COLI_MODEL_H
#define COLI_MODEL_H
#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

#define MAX_EOS 8

/* What one layer keeps per KV slot (docs/architecture.md). A layer either grows with the
 * context (per_pos bytes per cached position, e.g. GQA K/V) or keeps a fixed state (recurrent
 * layers), or both. A layer that is not truncatable cannot be cut back to an arbitrary prefix:
 * prefix reuse falls back to a checkpointed position for it. A windowed layer keeps only its
 * last `window` positions (a ring of min(ctx, window) slots: position j lives in slot j % cap);
 * once the ring has wrapped, no earlier prefix can be rebuilt from it. */
typedef struct {
    size_t per_pos;  /* bytes per cached position */
    size_t fixed;    /* bytes per slot, whatever the length */
    int truncatable; /* 1: the state at any prefix is the prefix of the state */
    int window;      /* > 0: positions kept (sliding window); 0: all */
    size_t f32_tail; /* bytes at the end of each position's row kept as f32 whatever the cache type */
    int settle;      /* > 1: a row may change until its group of `settle` positions is complete
                      * (compressed entries fill their window's rows when it closes) */
} StateDesc;

/* Facts that hold for the whole model; everything per layer lives in the layer specs. */
typedef struct {
    char family[32];
    int vocab, hidden, n_layers, max_pos, tie_embeddings;
    int rotary_dim;   /* RoPE table shared by the attention blocks that rotate */
    float rope_scale; /* multiplies cos/sin (YaRN attention factor) */
    float *inv_freq;  /* [rotary_dim / 2] */
    int eos[MAX_EOS], n_eos;
    int bos;
    QType kv_type;          /* element type of per-position state: QT_F16 (default), QT_BF16, QT_F32 */
    const StateDesc *state; /* [n_layers], filled by model_load for kv_type */
} Arch;

/* One block of a layer: an entry of the block table and its loaded parameters. */
typedef struct BlockKind BlockKind;
typedef struct {
    const BlockKind *kind; /* NULL: the layer has no such block */
    void *self;            /* kind-private: weights and geometry */
} Block;

/* Pre-norm residual layer: x += attn(attn_norm(x)); x += mlp(mlp_norm(x)). Either half may be
 * absent (a layer without attention, or without an MLP). */
typedef struct HyperConn HyperConn;
typedef struct {
    Block attn_norm, attn, mlp_norm, mlp;
    HyperConn *hc[2]; /* NULL, or the hyper-connections around attn / mlp (the model has hc_head) */
} Layer;

typedef struct Container Container;
typedef struct MtpHead MtpHead;

typedef struct {
    Arch a;
    QMat embed, lm_head;
    Block final_norm;
    HyperConn *hc_head; /* NULL, or the final collapse of the residual streams (hyper_conn.h) */
    Layer *layers;
    StateDesc *state; /* [n_layers]: a.state points here */
    Container *ct;
    MtpHead *mtp; /* NULL, or the multi-token-prediction head (mtp.h), loaded for --draft mtp */
} Model;

extern const char *const ENGINE_FAMILIES[]; /* NULL-terminated */

/* Loads DIR/colibri.json and its shards; validates every tensor the layer specs name. */
int model_load(Model *m, const char *dir, char *err, size_t errlen);
/* Recomputes the state descriptors for another KV element type (before any kv_init). */
int model_set_kv_type(Model *m, QType kv_type, char *err, size_t errlen);
void model_free(Model *m);

/* One layer's slice of a KV slot: per-position state [ctx][per_pos] and the fixed state. */
typedef struct {
    unsigned char *pos;   /* [cap][per_pos]: position j in slot j % cap */
    unsigned char *fixed; /* [fixed_bytes], the state after the slot's n positions */
    size_t per_pos, fixed_bytes;
    size_t f32_tail; /* bytes at the end of each row that are f32 (StateDesc.f32_tail) */
    int settle;      /* StateDesc.settle */
    int cap;         /* positions held: ctx, or min(ctx, window) for a windowed layer */
    int truncatable;
} KvLayer;

#define KV_MAX_CHECKPOINTS 4

/* One KV slot: its token history lets a new prompt reuse the common prefix. */
typedef struct {
    int ctx; /* capacity in positions */
    int n;   /* positions filled */
    int n_layers;
    QType type;         /* per-position element type */
    KvLayer *layer;     /* [n_layers] */
    int32_t *tokens;    /* [ctx]; non-NULL once initialised */
    size_t fixed_total; /* sum of the layers' fixed state */
    size_t ring_total;  /* sum of the windowed layers' rings (cap < ctx) */
    int truncatable;    /* every layer truncatable: any prefix can be reused */
    int n_ck;           /* checkpoints of the fixed state and the rings, oldest first */
    int ck_pos[KV_MAX_CHECKPOINTS];
    unsigned char *ck[KV_MAX_CHECKPOINTS]; /* [fixed_total + ring_total] each */
    int last_common;                       /* kv_reuse: positions the prompt shared with the slot (before any fallback) */
} KvCache;

int kv_init(KvCache *kv, const Arch *a, int ctx);
void kv_free(KvCache *kv);
size_t kv_bytes(const Arch *a, int ctx);  /* what kv_init allocates for ctx positions */
size_t kv_bytes_per_token(const Arch *a); /* per-position state over the layers (no token id, no fixed state) */
/* Positions of layer l's per-position state held in the slot: min(n, cap). */
int kv_held(const KvCache *kv, int l);
/* Rewinds kv so that a prompt ids[0..n) can continue from it; returns the positions kept
 * (at most n - 1, so the last prompt token is always recomputed). Truncatable layers keep the
 * longest common prefix; a non-truncatable layer, or a ring that has wrapped since, restores
 * the latest checkpoint within it, or restarts from 0. */
int kv_reuse(KvCache *kv, const int32_t *ids, int n);
/* Empties the slot: no positions, zero fixed state, no checkpoints. */
void kv_restart(KvCache *kv);
/* Records the fixed state and the rings at the current position (a turn boundary) for later
 * reuse. */
void kv_checkpoint(KvCache *kv);
/* The slot's fixed states and rings, kv_ck_bytes of them, into dst / back from src: a draft's
 * verify pass undoes a recurrent state with them. */
void kv_fixed_save(KvCache *kv, unsigned char *dst);
void kv_fixed_load(KvCache *kv, const unsigned char *src);
/* Whether this slot keeps checkpoints (a recurrent state or a ring), and the bytes of one. */
int kv_keeps_checkpoints(const KvCache *kv);
size_t kv_ck_bytes(const KvCache *kv);
/* What one checkpoint of a slot of ctx positions takes (0: the slot keeps none); a slot keeps up
 * to KV_MAX_CHECKPOINTS, which the RAM budget counts. */
size_t kv_checkpoint_bytes(const Arch *a, int ctx);
/* Replaces the slot's checkpoints by n_ck ones: positions pos[], kv_ck_bytes each, back to back
 * in bytes (a restored file or log record). Out of memory keeps fewer: never wrong, only slower. */
void kv_set_checkpoints(KvCache *kv, int n_ck, const int32_t *pos, const unsigned char *bytes);

/* Runs tokens[0..T) at positions kv->n.. and appends them to the cache. When logits is not
 * NULL it receives [T][vocab] (all_logits) or [vocab] for the last position only. 0, or -1
 * when memory ran out: the cache then holds a consistent prefix (the chunks that completed). */
int forward(const Model *m, KvCache *kv, const int32_t *tokens, int T, float *logits, int all_logits);

/* One decode step for R slots: tokens[i] goes to rows[i] (distinct caches, each at its own
 * position), logits[i][vocab] is its result, the same bits forward() gives that row alone.
 * 0, or -1 when memory ran out (rows of the chunks that completed keep their position). */
int forward_rows(const Model *m, KvCache *const *rows, const int32_t *tokens, int R, float *logits);

/* Largest batch one forward call processes; longer prompts go in chunks of this size. */
extern int forward_max_batch;
/* 1: recurrent layers (gated DeltaNet, KDA) take their one-token form at every pass length, so a
 * draft's verify pass computes, position by position, what plain decoding would (their chunked
 * prefill form rounds differently). Set around verify passes only. */
extern int forward_stepwise;
/* Positions of one prefill pass when experts stream (--prefill-pass): a multiple of the batch,
 * run layer by layer so each routed expert is read once per pass; attention still takes a batch
 * at a time, so results do not depend on it. 0 or the batch: chunk by chunk. */
extern int forward_prefill_pass;
/* The positions forward() takes per pass: forward_prefill_pass, at least one batch. */
int forward_pass_step(void);
/* Called by forward() after each layer of a pass longer than one batch (a prompt prefilled
 * layer by layer reaches its positions only at the last layer, so a caller reporting progress
 * needs the layers in between); NULL: none. */
typedef struct {
    void (*fn)(void *ctx, int layers_done, int layers);
    void *ctx;
} ForwardProgress;
extern ForwardProgress forward_progress;
/* Called by forward() with the last layer's output x[T][hidden] (before the final norm) of the
 * positions kv->n.. (not yet appended), fed tokens[0..T); batched decode calls it per row. The
 * multi-token-prediction drafter (mtp.h) builds on these states; NULL: none. Not called for
 * models with hyper-connection streams. */
typedef struct {
    void (*fn)(void *ctx, KvCache *kv, const float *x, int T, const int32_t *tokens);
    void *ctx;
} ForwardHidden;
extern ForwardHidden forward_hidden;
/* One layer y (index l of kv's layers) over x[T][hidden] in place, at positions kv->n..; attention
 * takes a batch at a time. 0, or -1 when memory ran out. */
int forward_layer(const Arch *a, const Layer *y, int l, KvCache *kv, const int32_t *tokens, float *x, int T);
/* Automatic passes cover a whole prompt up to this many positions. */
#define PREFILL_PASS_MAX 4096

/* The prefill batch without --batch, by kernel set. AMX tiles take 16 positions of one expert
 * at a time, and at 128 positions, 128 experts and top-8 an expert meets 8 on average (half a
 * tile); 512 positions gives each about 32, which prefilled 512 tokens 1.2-1.5x faster in
 * paired runs (the other sets' row kernels gain little from it). The scratch grows with it;
 * a tight --ram still lowers it (c/engine/engine_stream.c), and the planner mirrors this choice. */
#define FORWARD_DEFAULT_BATCH 128
#define FORWARD_DEFAULT_BATCH_AMX 512
int forward_default_batch(KernIsa isa);

#endif
