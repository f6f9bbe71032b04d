/* The forward pass, top to bottom: embed, then each layer's blocks as its spec names them
 * (norm, attention, norm, MLP, each a block-table entry), final norm, head. */
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "fwd_alloc.h"
#include "model.h"
#include "ops.h"

int forward_max_batch = 128;

static void run_block(const Block *b, const BlockRun *r, const float *x, int T, float *out) {
    b->kind->run(b->self, r, x, T, out);
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
        BlockRun r = {a, l, kv->n, kv->ctx, kv->type, &kv->layer[l]};
        const Block *halves[2][2] = {{&y->attn_norm, &y->attn}, {&y->mlp_norm, &y->mlp}};
        for (int h = 0; h < 2; h++) {
            if (!halves[h][1]->kind) continue;
            run_block(halves[h][0], &r, x, T, xn);
            run_block(halves[h][1], &r, xn, T, o);
            if (fwd_oom()) break; /* o is incomplete; forward() fails the pass */
            for (size_t i = 0; i < (size_t)T * H; i++) x[i] += o[i];
        }
    }
    if (logits && !fwd_oom()) {
        int first = all_logits ? 0 : T - 1;
        BlockRun r = {a, -1, kv->n, kv->ctx, kv->type, NULL};
        run_block(&m->final_norm, &r, x + (size_t)first * H, T - first, xn + (size_t)first * H);
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
        if (forward_chunk(m, kv, tokens + s, n, dst, all_logits)) {
            /* a recurrent state may hold part of the failed chunk: no prefix of it is trustworthy */
            if (!kv->truncatable) kv_restart(kv);
            return -1;
        }
    }
    return 0;
}
