/* The forward pass, top to bottom: embed, then each layer's blocks as its spec names them
 * (norm, attention, norm, MLP, each a block-table entry), final norm, head. */
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "model.h"
#include "ops.h"

int forward_max_batch = 128;

static void run_block(const Block *b, const BlockRun *r, const float *x, int T, float *out) {
    b->kind->run(b->self, r, x, T, out);
}

static void forward_chunk(const Model *m, KvCache *kv, const int32_t *tokens, int T, float *logits, int all_logits) {
    const Arch *a = &m->a;
    const int H = a->hidden;
    float *x = malloc(sizeof(float) * (size_t)T * H), *xn = malloc(sizeof(float) * (size_t)T * H);
    float *o = malloc(sizeof(float) * (size_t)T * H);
    if (!x || !xn || !o) abort();
    size_t padded = ((size_t)H + 31) / 32 * 32;
    float *row = malloc(sizeof(float) * padded);
    for (int t = 0; t < T; t++) {
        kern.dequant_row(m->embed.qt, m->embed.data + (size_t)tokens[t] * m->embed.row_bytes, H, row);
        memcpy(x + (size_t)t * H, row, sizeof(float) * H);
    }
    free(row);
    for (int l = 0; l < a->n_layers; l++) {
        const Layer *y = &m->layers[l];
        BlockRun r = {a, l, kv->n, kv->ctx, kv->type, &kv->layer[l]};
        const Block *halves[2][2] = {{&y->attn_norm, &y->attn}, {&y->mlp_norm, &y->mlp}};
        for (int h = 0; h < 2; h++) {
            if (!halves[h][1]->kind) continue;
            run_block(halves[h][0], &r, x, T, xn);
            run_block(halves[h][1], &r, xn, T, o);
            for (size_t i = 0; i < (size_t)T * H; i++) x[i] += o[i];
        }
    }
    memcpy(kv->tokens + kv->n, tokens, sizeof(int32_t) * (size_t)T);
    kv->n += T;
    if (logits) {
        int first = all_logits ? 0 : T - 1;
        BlockRun r = {a, -1, kv->n, kv->ctx, kv->type, NULL};
        run_block(&m->final_norm, &r, x + (size_t)first * H, T - first, xn + (size_t)first * H);
        matmul(logits, xn + (size_t)first * H, T - first, &m->lm_head, NULL);
    }
    free(x); free(xn); free(o);
}

void forward(const Model *m, KvCache *kv, const int32_t *tokens, int T, float *logits, int all_logits) {
    int step = forward_max_batch > 0 ? forward_max_batch : 1;
    for (int s = 0; s < T; s += step) {
        int n = T - s < step ? T - s : step, last = s + n == T;
        float *dst = NULL;
        if (logits && all_logits) dst = logits + (size_t)s * m->a.vocab;
        else if (logits && last) dst = logits;
        forward_chunk(m, kv, tokens + s, n, dst, all_logits);
    }
}
