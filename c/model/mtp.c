/* The multi-token-prediction head: loading from the manifest's "mtp" entry, and running it. */
#include "model/mtp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/container.h"
#include "kernels/ops.h"
#include "model/blocks.h"
#include "util/fwd_alloc.h"

int mtp_load(Model *m, char *err, size_t errlen) {
    const JsonValue *list = json_get(ct_manifest(m->ct), "mtp");
    const JsonValue *mtp_layers = json_get(ct_manifest(m->ct), "mtp_layers");
    if (!list || list->type != JSON_ARR || !list->len) {
        snprintf(err, errlen, "--draft mtp: %s; use --draft lookup",
                 mtp_layers ? "the container keeps MTP layers but describes no way to run them (converted before colibri ran "
                              "them, or a layer lacks a part): re-run coli convert"
                            : "this model has no multi-token-prediction layers");
        return -1;
    }
    const JsonValue *e = &list->items[0];
    const int H = m->a.hidden, V = m->a.vocab;
    MtpHead *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, errlen, "out of memory loading the MTP layer");
        return -1;
    }
    m->mtp = p;
    p->layer = (int)json_get_int(e, "layer", -1);
    BlockLoader L = {m->ct, &m->a, p->layer, err, errlen, 0};
    if (m->hc_head) bl_fail(&L, "MTP layers of models with hyper-connection streams are not run by this engine");
    layer_load(&L, &p->y, bl_obj(&L, e, "spec"), 0);
    block_load(&p->enorm, ROLE_NORM, bl_obj(&L, e, "enorm"), &L);
    block_load(&p->hnorm, ROLE_NORM, bl_obj(&L, e, "hnorm"), &L);
    block_load(&p->head_norm, ROLE_NORM, bl_obj(&L, e, "head_norm"), &L);
    const char *proj = bl_str(&L, e, "eh_proj"), *embed = json_get_str(e, "embed"), *head = json_get_str(e, "head");
    if (!L.failed) p->eh_proj = bl_mat_named(&L, proj, H, 2 * H);
    if (!L.failed) p->embed = embed ? bl_mat_named(&L, embed, V, H) : m->embed;
    if (!L.failed) p->head = head ? bl_mat_named(&L, head, V, H) : m->lm_head;
    if (L.failed) {
        mtp_free(m);
        return -1;
    }
    p->a = m->a;
    p->a.n_layers = 1;
    p->state = layer_state(&p->y, m->a.kv_type);
    p->a.state = &p->state;
    return 0;
}

void mtp_free(Model *m) {
    MtpHead *p = m->mtp;
    if (!p) return;
    layer_free(&p->y);
    block_free(&p->enorm);
    block_free(&p->hnorm);
    block_free(&p->head_norm);
    free(p);
    m->mtp = NULL;
}

static void norm_rows(const Block *b, const MtpHead *p, const KvCache *mkv, const float *x, int T, float *out) {
    BlockRun r = {&p->a, -1, mkv->n, mkv->ctx, mkv->type, NULL, NULL, 0};
    b->kind->run(b->self, &r, x, T, out);
}

int mtp_run(const Model *m, KvCache *mkv, const float *h, const int32_t *next, int T, float *out, float *logits, int all_logits) {
    const MtpHead *p = m->mtp;
    const int H = m->a.hidden;
    const size_t padded = ((size_t)H + 31) / 32 * 32;
    float *emb = fwd_malloc(sizeof(float) * (size_t)T * H), *cat = fwd_malloc(sizeof(float) * (size_t)T * 2 * H);
    float *x = fwd_malloc(sizeof(float) * (size_t)T * H), *row = fwd_malloc(sizeof(float) * padded);
    float *xn = logits ? fwd_malloc(sizeof(float) * (size_t)T * H) : NULL;
    int failed = !emb || !cat || !x || !row || (logits && !xn);
    if (!failed) {
        for (int t = 0; t < T; t++) {
            kern.dequant_row(p->embed.qt, p->embed.data + (size_t)next[t] * p->embed.row_bytes, H, row);
            memcpy(emb + (size_t)t * H, row, sizeof(float) * H);
        }
        /* [enorm(embedding); hnorm(h)] per row, in the order the report concatenates them */
        norm_rows(&p->enorm, p, mkv, emb, T, x);
        if (h) norm_rows(&p->hnorm, p, mkv, h, T, emb);
        else memset(emb, 0, sizeof(float) * (size_t)T * H); /* RMSNorm of a zero state is zero */
        for (int t = 0; t < T; t++) {
            memcpy(cat + (size_t)t * 2 * H, x + (size_t)t * H, sizeof(float) * H);
            memcpy(cat + (size_t)t * 2 * H + H, emb + (size_t)t * H, sizeof(float) * H);
        }
        matmul(x, cat, T, &p->eh_proj, NULL);
        failed = forward_layer(&p->a, &p->y, 0, mkv, next, x, T) != 0;
    }
    if (!failed && out) memcpy(out, x, sizeof(float) * (size_t)T * H);
    if (!failed && logits) {
        const int first = all_logits ? 0 : T - 1;
        norm_rows(&p->head_norm, p, mkv, x + (size_t)first * H, T - first, xn + (size_t)first * H);
        matmul(logits, xn + (size_t)first * H, T - first, &p->head, NULL);
    }
    failed |= fwd_oom();
    if (!failed) {
        memcpy(mkv->tokens + mkv->n, next, sizeof(int32_t) * (size_t)T);
        mkv->n += T;
    }
    free(emb);
    free(cat);
    free(x);
    free(row);
    free(xn);
    return failed ? -1 : 0;
}
