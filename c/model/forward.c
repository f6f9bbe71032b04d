/* The forward pass, top to bottom: embed, then each layer's blocks as its spec names them
 * (norm, attention, norm, MLP, each a block-table entry), final norm, head. */
#include <stdlib.h>
#include <string.h>

#include "model/blocks.h"
#include "util/fwd_alloc.h"
#include "model/hyper_conn.h"
#include "model/model.h"
#include "kernels/ops.h"
#include "util/op_prof.h"

int forward_max_batch = FORWARD_DEFAULT_BATCH;
int forward_stepwise = 0;
int forward_prefill_pass = 0;
ForwardProgress forward_progress = {NULL, NULL};
ForwardHidden forward_hidden = {NULL, NULL};

typedef struct {
    float *xn, *o;          /* a block's input (normed) and output, [T][hidden] */
    float *c, *post, *comb; /* hyper-connections: the collapsed input and the mix weights, or NULL */
} LayerScratch;

int forward_pass_step(void) {
    const int b = forward_max_batch > 0 ? forward_max_batch : 1;
    return forward_prefill_pass > b ? forward_prefill_pass : b;
}

int forward_default_batch(KernIsa isa) { return isa == KI_AMX ? FORWARD_DEFAULT_BATCH_AMX : FORWARD_DEFAULT_BATCH; }

static void run_block(const Block *b, const BlockRun *r, const float *x, int T, float *out) {
    b->kind->run(b->self, r, x, T, out);
}

/* Batched decode: row t is the next token of cache rows[t]. Attention runs per row on its own
 * slot, exactly as a one-row pass would; every other block sees all rows at once (one read of
 * each weight and routed expert per step), and computes each row the same whatever rows
 * surround it (the kernels' batch invariance), so a row's result never depends on the batch. */
static void attn_rows(const Block *b, const Arch *a, int l, KvCache *const *rows, const int32_t *tokens, const float *x, int T,
                      float *out) {
    for (int t = 0; t < T && !fwd_oom(); t++) {
        KvCache *kv = rows[t];
        BlockRun r = {a, l, kv->n, kv->ctx, kv->type, &kv->layer[l], tokens + t, 0};
        run_block(b, &r, x + (size_t)t * a->hidden, 1, out + (size_t)t * a->hidden);
    }
}

/* A prefill pass's attention, in the batch-sized chunks a chunk-by-chunk prefill runs: chunk s
 * starts at position kv->n + s, and this layer's state already holds every position before it,
 * so each chunk computes what it would alone (chunked attention forms depend on the chunk). */
static void attn_chunks(const Block *b, const Arch *a, int l, KvCache *kv, const int32_t *tokens, const float *x, int T, int sub,
                        float *out) {
    for (int s = 0; s < T && !fwd_oom(); s += sub) {
        const int n = T - s < sub ? T - s : sub;
        BlockRun r = {a, l, kv->n + s, kv->ctx, kv->type, &kv->layer[l], tokens + s, s};
        run_block(b, &r, x + (size_t)s * a->hidden, n, out + (size_t)s * a->hidden);
    }
}

/* One layer over x[T][hidden] in place: x += attn(attn_norm(x)); x += mlp(mlp_norm(x)), or with
 * S > 0 residual streams mixed by the layer's hyper-connections. rows / sub as forward_chunk's. */
static void layer_run(const Arch *a, const Layer *y, int l, int S, KvCache *kv, KvCache *const *rows, const int32_t *tokens,
                      float *x, int T, int sub, const LayerScratch *w) {
    const int H = a->hidden;
    BlockRun r = {a, l, kv->n, kv->ctx, kv->type, &kv->layer[l], tokens, 0};
    const Block *halves[2][2] = {{&y->attn_norm, &y->attn}, {&y->mlp_norm, &y->mlp}};
    for (int h = 0; h < 2; h++) {
        if (!halves[h][1]->kind) continue;
        if (S) hc_pre(y->hc[h], x, T, H, w->c, w->post, w->comb);
        run_block(halves[h][0], &r, S ? w->c : x, T, w->xn);
        /* attention's matmuls charge PROF_ATTN_PROJ (ops.c); an MoE block its own parts */
        const ProfOp norm = prof_enter(h == 0 ? PROF_ATTN_KV : PROF_MLP);
        if (rows && h == 0) attn_rows(halves[h][1], a, l, rows, tokens, w->xn, T, w->o);
        else if (h == 0 && sub < T) attn_chunks(halves[h][1], a, l, kv, tokens, w->xn, T, sub, w->o);
        else run_block(halves[h][1], &r, w->xn, T, w->o);
        prof_leave(norm);
        if (fwd_oom()) return; /* o is incomplete; forward() fails the pass */
        if (S) hc_post(S, x, T, H, w->o, w->post, w->comb);
        else
            for (size_t i = 0; i < (size_t)T * H; i++) x[i] += w->o[i];
    }
}

int forward_layer(const Arch *a, const Layer *y, int l, KvCache *kv, const int32_t *tokens, float *x, int T) {
    const int sub = forward_max_batch > 0 ? forward_max_batch : 1;
    float *xn = fwd_malloc(sizeof(float) * (size_t)T * a->hidden), *o = fwd_malloc(sizeof(float) * (size_t)T * a->hidden);
    if (xn && o) layer_run(a, y, l, 0, kv, NULL, tokens, x, T, sub, &(LayerScratch){xn, o, NULL, NULL, NULL});
    free(xn);
    free(o);
    return fwd_oom() ? -1 : 0;
}

/* 0, or -1 when an allocation failed (fwd_alloc.h); the cache then keeps only earlier passes.
 * rows: NULL (T positions of kv), or T caches for batched decode (kv is rows[0]). sub: the
 * positions attention takes at a time (T, or the batch in a longer prefill pass); every other
 * block sees all T rows, so each routed expert is read once for the whole pass. */
static int forward_chunk(const Model *m, KvCache *kv, KvCache *const *rows, const int32_t *tokens, int T, float *logits,
                         int all_logits, int sub) {
    const Arch *a = &m->a;
    const int H = a->hidden, hc = m->hc_head != NULL, S = hc ? m->hc_head->n : 1; /* S residual streams */
    float *x = fwd_malloc(sizeof(float) * (size_t)T * S * H), *xn = fwd_malloc(sizeof(float) * (size_t)T * H);
    float *o = fwd_malloc(sizeof(float) * (size_t)T * H);
    size_t padded = ((size_t)H + 31) / 32 * 32;
    float *row = fwd_malloc(sizeof(float) * padded);
    /* hyper-connections: the collapsed block input, and the expand / mix weights */
    float *c = hc ? fwd_malloc(sizeof(float) * (size_t)T * H) : NULL;
    float *post = hc ? fwd_malloc(sizeof(float) * (size_t)T * S) : NULL;
    float *comb = hc ? fwd_malloc(sizeof(float) * (size_t)T * S * S) : NULL;
    if (!x || !xn || !o || !row || (hc && (!c || !post || !comb))) {
        free(x);
        free(xn);
        free(o);
        free(row);
        free(c);
        free(post);
        free(comb);
        return -1;
    }
    const ProfOp was = prof_enter(PROF_NORM); /* the glue between blocks */
    for (int t = 0; t < T; t++) {
        kern.dequant_row(m->embed.qt, m->embed.data + (size_t)tokens[t] * m->embed.row_bytes, H, row);
        for (int j = 0; j < S; j++) memcpy(x + ((size_t)t * S + j) * H, row, sizeof(float) * H);
    }
    free(row);
    LayerScratch w = {xn, o, c, post, comb};
    for (int l = 0; l < a->n_layers && !fwd_oom(); l++) {
        layer_run(a, &m->layers[l], l, hc ? S : 0, kv, rows, tokens, x, T, sub, &w);
        if (forward_progress.fn && T > sub && !rows) forward_progress.fn(forward_progress.ctx, l + 1, a->n_layers);
    }
    if (forward_hidden.fn && !hc && !fwd_oom()) { /* the last layer's output, before the final norm */
        if (rows)
            for (int t = 0; t < T; t++) forward_hidden.fn(forward_hidden.ctx, rows[t], x + (size_t)t * H, 1, tokens + t);
        else forward_hidden.fn(forward_hidden.ctx, kv, x, T, tokens);
    }
    if (logits && !fwd_oom()) {
        const ProfOp norm = prof_enter(PROF_HEAD);
        int first = all_logits ? 0 : T - 1;
        BlockRun r = {a, -1, kv->n, kv->ctx, kv->type, NULL, tokens, 0};
        if (hc) hc_head(m->hc_head, x + (size_t)first * S * H, T - first, H, c + (size_t)first * H);
        run_block(&m->final_norm, &r, (hc ? c : x) + (size_t)first * H, T - first, xn + (size_t)first * H);
        matmul(logits, xn + (size_t)first * H, T - first, &m->lm_head, NULL);
        prof_leave(norm);
    }
    int failed = fwd_oom();
    if (!failed && rows) /* positions count only once every layer holds them */
        for (int t = 0; t < T; t++) rows[t]->tokens[rows[t]->n++] = tokens[t];
    else if (!failed) {
        memcpy(kv->tokens + kv->n, tokens, sizeof(int32_t) * (size_t)T);
        kv->n += T;
    }
    free(x);
    free(xn);
    free(o);
    free(c);
    free(post);
    free(comb);
    prof_leave(was);
    return failed ? -1 : 0;
}

int forward(const Model *m, KvCache *kv, const int32_t *tokens, int T, float *logits, int all_logits) {
    const int batch = forward_max_batch > 0 ? forward_max_batch : 1, step = forward_pass_step();
    fwd_oom_clear();
    for (int s = 0; s < T; s += step) {
        int n = T - s < step ? T - s : step, last = s + n == T;
        float *dst = NULL;
        if (logits && all_logits) dst = logits + (size_t)s * m->a.vocab;
        else if (logits && last) dst = logits;
        if (forward_chunk(m, kv, NULL, tokens + s, n, dst, all_logits, batch)) {
            /* a recurrent state may hold part of the failed chunk: no prefix of it is trustworthy */
            if (!kv->truncatable) kv_restart(kv);
            return -1;
        }
    }
    return 0;
}

int forward_rows(const Model *m, KvCache *const *rows, const int32_t *tokens, int R, float *logits) {
    int step = forward_max_batch > 0 ? forward_max_batch : 1;
    fwd_oom_clear();
    for (int s = 0; s < R; s += step) {
        int n = R - s < step ? R - s : step;
        if (forward_chunk(m, rows[s], rows + s, tokens + s, n, logits + (size_t)s * m->a.vocab, 1, n)) {
            for (int r = 0; r < R; r++) /* as in forward: a half-updated recurrent state is dropped */
                if (!rows[r]->truncatable) kv_restart(rows[r]);
            return -1;
        }
    }
    return 0;
}
