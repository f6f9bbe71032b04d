/* DeepSeek sparse attention (DSA) lightning indexer, part of an "mla" block (GLM-5,
 * DeepSeek-V3.2): per position one indexer key, LayerNorm(wk x) with its first rope dims
 * rotated, kept (as f32) in the layer's state after the latent; per query, index score of key j =
 * sum over indexer heads of w_h * relu(q_h . k_j / sqrt(head_dim)), w = weights(x) / sqrt(heads),
 * q = wq_b(q_a-normalised query latent), rotated alike; the query attends to its top-k keys. */
#ifndef COLI_DSA_INDEXER_H
#define COLI_DSA_INDEXER_H
#include "model/blocks.h"

typedef struct {
    int nh, hd, topk, dr, interleaved;
    float eps;
    QMat wq_b, wk, wproj;
    const float *ln_w, *ln_b;
} DsaIndexer;

/* Reads spec (the mla spec's "indexer" object); q_lora is the query latent's width. */
int dsa_load(DsaIndexer *d, const JsonValue *spec, int q_lora, int rope_dim, BlockLoader *L);
/* Writes the indexer keys of x[T] (positions p0..), f32, into the state rows at byte offset off. */
void dsa_store_keys(const DsaIndexer *d, const BlockRun *r, const float *x, int T, size_t stride, size_t off);
/* keep[t][j] for j < n_all = p0 + T: 1 where query t attends to key j (its top-k of the keys
 * up to itself; all of them while there are at most topk). Returns keep (malloc'd, [T][n_all])
 * or NULL when every query keeps every causal key (or memory ran out: fwd_oom()). */
unsigned char *dsa_select(const DsaIndexer *d, const BlockRun *r, const float *x, const float *qa, int T, size_t stride,
                          size_t off);
/* Marks the k best of s[0..n) in keep, which the caller has zeroed (ties: the lower index; a NaN
 * ranks below every number). */
void dsa_mark_top(const float *s, int n, int k, unsigned char *keep);
void dsa_release(DsaIndexer *d);

#endif
