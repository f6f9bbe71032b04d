/* The forward pass, top to bottom: embed, layers (attention + MLP/MoE), norm, head. */
#include <stdlib.h>
#include <string.h>

#include "fwd_alloc.h"
#include "layers.h"
#include "model.h"
#include "ops.h"

int forward_max_batch = 128;

static size_t kv_plane_bytes(const Arch *a, int ctx) {
    return (size_t)a->n_layers * ctx * a->n_kv_heads * a->head_dim * sizeof(float);
}

/* What kv_init allocates for one slot; READY reports it, so the planner's KV figure is checked
 * against the allocation itself rather than a copy of its formula. */
size_t kv_slot_bytes(const Arch *a, int ctx) {
    return 2 * kv_plane_bytes(a, ctx) + sizeof(int32_t) * (size_t)ctx;
}

int kv_init(KvCache *kv, const Arch *a, int ctx) {
    memset(kv, 0, sizeof(*kv));
    kv->ctx = ctx;
    kv->k = malloc(kv_plane_bytes(a, ctx));
    kv->v = malloc(kv_plane_bytes(a, ctx));
    kv->tokens = malloc(sizeof(int32_t) * (size_t)ctx);
    if (!kv->k || !kv->v || !kv->tokens) { kv_free(kv); return -1; }
    return 0;
}

void kv_free(KvCache *kv) {
    free(kv->k);
    free(kv->v);
    free(kv->tokens);
    memset(kv, 0, sizeof(*kv));
}

/* 0, or -1 when an allocation failed (fwd_alloc.h); the cache then keeps only earlier chunks. */
static int forward_chunk(const Model *m, KvCache *kv, const int32_t *tokens, int T, float *logits, int all_logits) {
    const Arch *a = &m->a;
    const int H = a->hidden;
    float *x = fwd_malloc(sizeof(float) * (size_t)T * H), *xn = fwd_malloc(sizeof(float) * (size_t)T * H);
    float *o = fwd_malloc(sizeof(float) * (size_t)T * H);
    size_t padded = ((size_t)H + 31) / 32 * 32;
    float *row = fwd_malloc(sizeof(float) * padded);
    if (!x || !xn || !o || !row) { free(x); free(xn); free(o); free(row); return -1; }
    for (int t = 0; t < T; t++) {
        kern.dequant_row(m->embed.qt, m->embed.data + (size_t)tokens[t] * m->embed.row_bytes, H, row);
        memcpy(x + (size_t)t * H, row, sizeof(float) * H);
    }
    free(row);
    for (int l = 0; l < a->n_layers && !fwd_oom(); l++) {
        const Layer *y = &m->layers[l];
        for (int t = 0; t < T; t++) rmsnorm(xn + (size_t)t * H, x + (size_t)t * H, y->attn_norm, H, a->rms_eps);
        attention(m, l, kv, xn, T, o);
        if (fwd_oom()) break;
        for (size_t i = 0; i < (size_t)T * H; i++) x[i] += o[i];
        for (int t = 0; t < T; t++) rmsnorm(xn + (size_t)t * H, x + (size_t)t * H, y->ffn_norm, H, a->rms_eps);
        if (a->layer_is_moe[l]) moe(m, l, xn, T, o);
        else mlp_dense(&y->mlp, xn, T, H, a->intermediate, o);
        for (size_t i = 0; i < (size_t)T * H; i++) x[i] += o[i];
    }
    if (logits && !fwd_oom()) {
        int first = all_logits ? 0 : T - 1;
        for (int t = first; t < T; t++) rmsnorm(xn + (size_t)t * H, x + (size_t)t * H, m->final_norm, H, a->rms_eps);
        matmul(logits, xn + (size_t)first * H, T - first, &m->lm_head, NULL);
    }
    int failed = fwd_oom();
    if (!failed) { /* positions count only once every layer holds them */
        memcpy(kv->tokens + kv->n, tokens, sizeof(int32_t) * (size_t)T);
        kv->n += T;
    }
    free(x); free(xn); free(o);
    return failed ? -1 : 0;
}

int forward(const Model *m, KvCache *kv, const int32_t *tokens, int T, float *logits, int all_logits) {
    int step = forward_max_batch > 0 ? forward_max_batch : 1;
    fwd_oom_clear();
    for (int s = 0; s < T; s += step) {
        int n = T - s < step ? T - s : step, last = s + n == T;
        float *dst = NULL;
        if (logits && all_logits) dst = logits + (size_t)s * m->a.vocab;
        else if (logits && last) dst = logits;
        if (forward_chunk(m, kv, tokens + s, n, dst, all_logits)) return -1;
    }
    return 0;
}
