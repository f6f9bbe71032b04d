/* The whole model in three parts: the architecture (from the container manifest), the
 * weights (views into the mapped shards), and the run state (KV cache and scratch). */
#ifndef COLI_MODEL_H
#define COLI_MODEL_H
#include <stddef.h>
#include <stdint.h>

#include "quant.h"

#define MAX_EOS 8

typedef struct {
    char family[32];
    int vocab, hidden, n_layers, n_heads, n_kv_heads, head_dim, rotary_dim;
    int intermediate;           /* dense MLP width */
    int n_experts, top_k, moe_intermediate, norm_topk_prob;
    int qk_norm, q_bias, k_bias, v_bias, o_bias, mlp_bias, tie_embeddings;
    float rms_eps, rope_scale;  /* rope_scale multiplies cos/sin (YaRN attention factor) */
    float *inv_freq;            /* [rotary_dim / 2] */
    int max_pos;
    unsigned char *layer_is_moe; /* [n_layers] */
    int eos[MAX_EOS], n_eos;
    int bos;
} Arch;

typedef struct {
    QType qt;
    int rows, cols;
    size_t row_bytes;
    const unsigned char *data;
} QMat;

typedef struct {
    QMat gate, up, down;
    const float *gate_b, *up_b, *down_b;
} Mlp;

typedef struct {
    const float *attn_norm, *ffn_norm, *q_norm, *k_norm;
    QMat wq, wk, wv, wo;
    const float *bq, *bk, *bv, *bo;
    Mlp mlp;             /* dense layers */
    const float *router; /* [n_experts][hidden] */
    Mlp *experts;        /* [n_experts] */
} Layer;

typedef struct Container Container;

typedef struct {
    Arch a;
    QMat embed, lm_head;
    const float *final_norm;
    Layer *layers;
    Container *ct;
} Model;

extern const char *const ENGINE_FAMILIES[]; /* NULL-terminated */

/* Loads DIR/colibri.json and its shards; validates every tensor the architecture needs. */
int model_load(Model *m, const char *dir, char *err, size_t errlen);
void model_free(Model *m);

/* One KV cache: its token history lets a new prompt reuse the common prefix. */
typedef struct {
    int ctx;      /* capacity in positions */
    int n;        /* positions filled */
    float *k, *v; /* [n_layers][ctx][n_kv_heads*head_dim] */
    int32_t *tokens;
} KvCache;

int kv_init(KvCache *kv, const Arch *a, int ctx);
size_t kv_slot_bytes(const Arch *a, int ctx);
void kv_free(KvCache *kv);

/* Runs tokens[0..T) at positions kv->n.. and appends them to the cache. When logits is not
 * NULL it receives [T][vocab] (all_logits) or [vocab] for the last position only. 0, or -1
 * when memory ran out: the cache then holds a consistent prefix (the chunks that completed). */
int forward(const Model *m, KvCache *kv, const int32_t *tokens, int T, float *logits, int all_logits);

/* Largest batch one forward call processes; longer prompts go in chunks of this size. */
extern int forward_max_batch;

#endif
