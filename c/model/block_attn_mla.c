/* Multi-head latent attention (DeepSeek-V2/V3, GLM-4.7-Flash, GLM-5). Queries come from x,
 * directly or through a low-rank q_a -> RMSNorm -> q_b; keys and values share one compressed
 * latent per position: kv_a(x) = [c (kv_lora) | k_rope (rope dim)], c RMS-normalised, k_rope
 * rotated and shared by every head. Per head, key = [W_uk c | k_rope], value = W_uv c, where
 * kv_b = per head [W_uk (nope rows); W_uv (v rows)].
 * State: per position the latent [c | k_rope] only, never the expanded keys and values.
 * Decode uses the weight-absorbed form: score = (W_uk^T q_nope) . c + q_rope . k_rope and
 * out = W_uv (sum p c); a prefill chunk that is most of the context expands keys and values of
 * every cached position once and attends over them. Both read the same cached latent.
 * RoPE: "interleaved" (pairs (x0,x1), (x2,x3)... as DeepSeek lays them out), "neox" (halves), or "none"
 * (Kimi-Linear: no position encoding at all). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/blocks.h"
#include "model/dsa_indexer.h"
#include "util/fwd_alloc.h"
#include "kernels/kv_kernels.h"
#include "kernels/mla_absorb.h"
#include "kernels/ops.h"
#include "model/rope.h"

typedef struct {
    int nh, ql, kl, dn, dr, dv, interleaved, norope;
    float scale, eps;
    QMat wq, wqa, wqb, wkva, wkvb, wo;
    const float *qa_norm, *kva_norm, *bqa, *bkva, *bo;
    int has_idx;    /* a DSA indexer picks each query's keys (GLM-5, DeepSeek-V3.2) */
    int shared_idx; /* GLM "shared" layers: no indexer, the last full layer's selection */
    DsaIndexer idx;
} AttnMla;

/* The selection of the last layer that ran an indexer, for the "shared" layers after it in the
 * same chunk (transformers passes the top-k up the layers the same way). Layers run in order;
 * a prefill pass (c/model/forward.c) runs a layer's chunks one after another before the next
 * layer, and batched decode runs a layer for every row (each its own KV slot), so there is one
 * record per slot and chunk of the running pass, keyed by the slot's first layer state
 * (r->state - r->layer) and p0/T. A chunk that opens a pass drops its slot's older records. */
typedef struct {
    const KvLayer *slot;
    unsigned char *keep; /* owned; NULL: every causal key */
    int p0, T;
} SelRecord;
static SelRecord *sels; /* oldest first */
static int n_sels, cap_sels;
#define SEL_SLOTS 64 /* records other slots keep (one each: decode rows); past it the oldest go */

static int sel_find(const KvLayer *slot, int p0, int T) {
    for (int i = 0; i < n_sels; i++)
        if (sels[i].slot == slot && sels[i].p0 == p0 && sels[i].T == T) return i;
    return -1;
}

/* Drops slot's records: all of them (a new pass), or only the one at p0 (a later indexer layer
 * supersedes it). */
static void sel_drop(const KvLayer *slot, int all, int p0) {
    int m = 0;
    for (int i = 0; i < n_sels; i++) {
        if (sels[i].slot == slot && (all || sels[i].p0 == p0)) free(sels[i].keep);
        else sels[m++] = sels[i];
    }
    n_sels = m;
}

/* Frees the oldest records of slots other than slot past SEL_SLOTS of them: a cache that is
 * gone (a one-shot logits pass) must not keep its selections for the engine's life. */
static void sel_bound(const KvLayer *slot) {
    int others = 0;
    for (int i = 0; i < n_sels; i++) others += sels[i].slot != slot;
    for (int i = 0; i < n_sels && others >= SEL_SLOTS;) {
        if (sels[i].slot == slot) {
            i++;
            continue;
        }
        free(sels[i].keep);
        memmove(sels + i, sels + i + 1, sizeof *sels * (size_t)(n_sels - i - 1));
        n_sels--;
        others--;
    }
}

/* Takes ownership of keep; 0, or -1 (keep freed, fwd_oom() set) when the table cannot grow. */
static int keep_selection(const KvLayer *slot, unsigned char *keep, int p0, int T, int in_pass) {
    sel_drop(slot, in_pass == 0, p0);
    sel_bound(slot);
    if (n_sels == cap_sels) {
        int cap = cap_sels ? 2 * cap_sels : 16;
        SelRecord *g = fwd_malloc(sizeof *g * (size_t)cap);
        if (!g) {
            free(keep);
            return -1;
        }
        if (n_sels) memcpy(g, sels, sizeof *g * (size_t)n_sels);
        free(sels);
        sels = g;
        cap_sels = cap;
    }
    sels[n_sels++] = (SelRecord){slot, keep, p0, T};
    return 0;
}

/* Bytes of one cached position: the latent [c | k_rope] in the cache's type, then the indexer
 * key if any, always f32: its top-k selection is a hard threshold, and f16 rounding of the keys
 * flips near-tied selections (measured: 0.43 max logit error on the glm_moe_dsa oracle at f16,
 * 3e-4 with f32 keys). */
static size_t row_stride(const AttnMla *y, QType kv_type) {
    return (size_t)(y->kl + y->dr) * kv_elem_size(kv_type) + (y->has_idx ? (size_t)y->idx.hd * sizeof(float) : 0);
}

static int load(void *self, const JsonValue *spec, BlockLoader *L) {
    AttnMla *p = self;
    const int H = L->a->hidden;
    p->nh = bl_int(L, spec, "heads", 1, 1024);
    p->ql = bl_int(L, spec, "q_lora_rank", 0, 1 << 16);
    p->kl = bl_int(L, spec, "kv_lora_rank", 1, 1 << 16);
    p->dn = bl_int(L, spec, "qk_nope_head_dim", 0, 4096);
    p->dr = bl_int(L, spec, "qk_rope_head_dim", 2, 4096);
    p->dv = bl_int(L, spec, "v_head_dim", 1, 4096);
    p->scale = (float)bl_num(L, spec, "scale", 1e-6, 1e6);
    p->eps = (float)bl_num(L, spec, "norm_eps", 1e-30, 1.0);
    const JsonValue *rope = bl_obj(L, spec, "rope");
    if (L->failed) return -1;
    const char *style = bl_str(L, rope, "style");
    int dim = bl_int(L, rope, "dim", 0, 4096);
    if (L->failed) return -1;
    if (strcmp(style, "interleaved") && strcmp(style, "neox") && strcmp(style, "none"))
        return bl_fail(L, "mla: rope style '%s' is not implemented (interleaved, neox, none)", style);
    p->interleaved = !strcmp(style, "interleaved");
    p->norope = !strcmp(style, "none"); /* Kimi-Linear: the shared key part is not rotated (NoPE) */
    if (dim != p->dr || (!p->norope && dim != L->a->rotary_dim))
        return bl_fail(L, "mla: rope.dim %d must equal qk_rope_head_dim %d and the model's RoPE table (%d)", dim, p->dr,
                       L->a->rotary_dim);
    const int qkd = p->dn + p->dr, qd = p->nh * qkd;
    const JsonValue *t = json_get(spec, "tensors");
    if (p->ql) {
        p->wqa = bl_mat(L, t, "q_a", p->ql, H);
        p->bqa = bl_vec(L, t, "q_a_bias", 1, p->ql, 1);
        p->qa_norm = bl_vec(L, t, "q_a_norm", 1, p->ql, 0);
        p->wqb = bl_mat(L, t, "q_b", qd, p->ql);
    } else {
        p->wq = bl_mat(L, t, "q", qd, H);
    }
    p->wkva = bl_mat(L, t, "kv_a", p->kl + p->dr, H);
    p->bkva = bl_vec(L, t, "kv_a_bias", 1, p->kl + p->dr, 1);
    p->kva_norm = bl_vec(L, t, "kv_a_norm", 1, p->kl, 0);
    p->wkvb = bl_mat(L, t, "kv_b", p->nh * (p->dn + p->dv), p->kl);
    p->wo = bl_mat(L, t, "o", H, p->nh * p->dv);
    p->bo = bl_vec(L, t, "o_bias", 1, H, 1);
    const JsonValue *ix = json_get(spec, "indexer");
    static int last_indexer_layer = -1; /* layers load in order; layer 0 starts a model */
    if (L->layer == 0) last_indexer_layer = -1;
    if (!L->failed && ix && ix->type != JSON_NULL && json_get_bool(ix, "shared", 0)) {
        if (last_indexer_layer < 0 || last_indexer_layer >= L->layer)
            return bl_fail(L, "mla: a shared DSA indexer needs a layer with its own indexer before it");
        p->shared_idx = 1;
    } else if (!L->failed && ix && ix->type != JSON_NULL) {
        p->has_idx = 1;
        last_indexer_layer = L->layer;
        if ((p->kl + p->dr) % 2) /* the f32 keys after a 2-byte latent must stay 4-byte aligned */
            return bl_fail(L, "mla: a DSA indexer needs kv_lora_rank + qk_rope_head_dim even, got %d", p->kl + p->dr);
        if (dsa_load(&p->idx, ix, p->ql, p->dr, L)) return -1;
    }
    return L->failed ? -1 : 0;
}

static StateDesc state(const void *self, QType kv_type) {
    const AttnMla *p = self;
    StateDesc s = {.per_pos = row_stride(p, kv_type),
                   .truncatable = 1,
                   .f32_tail = p->has_idx ? (size_t)p->idx.hd * sizeof(float) : 0}; /* the indexer's keys */
    return s;
}

/* A view of rows [r0, r0 + n) of w. */
static QMat rows_of(const QMat *w, int r0, int n) {
    QMat v = *w;
    v.rows = n;
    v.data = w->data + (size_t)r0 * w->row_bytes;
    return v;
}

/* dst[0..n) = cached row (kv element type) as floats. */
static void load_row(const KvKernels *kk, const unsigned char *row, int n, float *dst) {
    if (!kk) {
        memcpy(dst, row, sizeof(float) * n);
        return;
    }
    memset(dst, 0, sizeof(float) * n);
    kk->axpy(1.0f, row, n, dst);
}

/* o[0..n) += w * x[0..n), in steps of 16 on restrict pointers: -O2 vectorizes that (its cost
 * model refuses loops that need an alias check or a scalar tail), with the scalar loop's bits. */
static inline void axpy(float *restrict o, const float *restrict x, float w, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int u = 0; u < 16; u++) o[i + u] += w * x[i + u];
    for (; i < n; i++) o[i] += w * x[i];
}

/* Query heads attending together over the latent: a chunk reads each cached row once for all
 * its heads. Chunks of at most 64 heads (the block kernel's rows), halved while a decode step
 * would leave a thread without a chunk, down to 16 (one AVX-512 vector of rows). */
static int head_chunk(int nh, int T) {
    const int threads = par_threads();
    int chunks = (nh + 63) / 64;
    while ((long)chunks * T < threads && (nh + chunks - 1) / chunks > 16) chunks *= 2;
    return (nh + chunks - 1) / chunks;
}

/* Positions whose absorbed queries and latent outputs ([T][nh][kl + dr] floats each) are held
 * at once: about 1M floats, so a long chunk of a 128-head model stays within a few MB. */
static int absorbed_positions(int nh, int hd, int T) {
    const long per = (long)nh * hd, tb = per > 0 ? (1L << 20) / per : T;
    return tb < 1 ? 1 : (tb < T ? (int)tb : T);
}

/* Decode and the later chunks of a prefill, through the latent: position p0 + t attends over
 * positions 0..p0+t (or the indexer's kept ones, in order) with key [W_uk^T q_nope | q_rope] .
 * [c | k_rope] and value c, i.e. one KV head of kl + dr dimensions shared by every query head,
 * run by the block kernel (the last dr output dimensions are the k_rope sum, unused); then
 * out = W_uv o per head. A row's bits do not depend on the chunk, its heads' grouping or the
 * thread (kv_kernels.h), so prefill through here equals decode. */
static void attend_absorbed(const AttnMla *y, const BlockRun *r, const float *q, int T, const unsigned char *keep, float *att) {
    const int kl = y->kl, dn = y->dn, dr = y->dr, dv = y->dv, qkd = dn + dr, nh = y->nh, hd = kl + dr, p0 = r->p0;
    const size_t es = kv_elem_size(r->kv_type), stride = row_stride(y, r->kv_type), rowb = (size_t)hd * es;
    const size_t pad = ((size_t)kl + 31) / 32 * 32, n_all = (size_t)p0 + T;
    const KvKernels *kk = kv_kernels(r->kv_type);
    const unsigned char *cache = r->state->pos;
    const int tb = absorbed_positions(nh, hd, T), hc = head_chunk(nh, tb), nchunk = (nh + hc - 1) / hc;
    float *qa = fwd_malloc(sizeof(float) * (size_t)tb * nh * hd), *oa = fwd_malloc(sizeof(float) * (size_t)tb * nh * hd);
    float *olat = fwd_malloc(sizeof(float) * (size_t)tb * kl), *ov = fwd_malloc(sizeof(float) * (size_t)tb * dv);
    if (!qa || !oa || !olat || !ov) goto out;
    for (int t0 = 0; t0 < T && !fwd_oom(); t0 += tb) {
        const int tn = T - t0 < tb ? T - t0 : tb;
#pragma omp parallel for schedule(dynamic, 1)
        for (int h = 0; h < nh; h++) { /* W_uk^T q_nope: the head's rows dequantized once for the tn positions */
            float *wh = scratch(4, (size_t)dn * pad);
            if (!wh) continue; /* out of memory: fwd_oom() fails the pass */
            const int r0 = h * (dn + dv);
            for (int d = 0; d < dn; d++)
                kern.dequant_row(y->wkvb.qt, y->wkvb.data + (size_t)(r0 + d) * y->wkvb.row_bytes, kl, wh + (size_t)d * pad);
            for (int t = 0; t < tn; t++)
                memcpy(qa + ((size_t)t * nh + h) * hd + kl, q + ((size_t)(t0 + t) * nh + h) * qkd + dn, sizeof(float) * dr);
            mla_absorb(qa + (size_t)h * hd, (size_t)nh * hd, q + ((size_t)t0 * nh + h) * qkd, (size_t)nh * qkd, tn, wh, pad, dn,
                       kl);
        }
        /* Without a selection, tq consecutive positions share each row read too (causal). */
        const int tq = keep ? 1 : kv_attend_block_positions(hc, p0 + t0 + tn), nblk = (tn + tq - 1) / tq;
        const size_t qstep = (size_t)nh * hd;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
        for (int b = 0; b < nblk; b++) {
            for (int c = 0; c < nchunk; c++) {
                const int t = b * tq, tc = tn - t < tq ? tn - t : tq, h0 = c * hc, g = nh - h0 < hc ? nh - h0 : hc;
                const int pos = p0 + t0 + t;
                const unsigned char *rows = cache;
                size_t rstride = stride;
                int n = pos + 1;
                if (keep) { /* the indexer's kept positions, gathered in order */
                    const unsigned char *kt = keep + (size_t)(t0 + t) * n_all;
                    int m = 0;
                    for (int j = 0; j < n; j++) m += kt[j] != 0;
                    unsigned char *gbuf = (unsigned char *)scratch(3, ((size_t)m * rowb + 3) / 4);
                    if (!gbuf) continue; /* out of memory: fwd_oom() fails the pass */
                    for (int j = 0, k = 0; j < n; j++)
                        if (kt[j]) memcpy(gbuf + (size_t)k++ * rowb, cache + (size_t)j * stride, rowb);
                    rows = gbuf, rstride = rowb, n = m;
                }
                float *sc = scratch(1, kv_attend_scratch(tc, g, hd, n));
                if (!sc) continue;
                const size_t off = (size_t)t * qstep + (size_t)h0 * hd;
                if (n > 0)
                    kk->attend_block(qa + off, qstep, tc, g, hd, rows, rows, rstride, n, 0, y->scale, NULL, sc, oa + off, qstep);
                else /* nothing kept: no value, as a softmax over nothing would give */
                    for (int i = 0; i < g; i++) memset(oa + off + (size_t)i * hd, 0, sizeof(float) * hd);
            }
        }
        for (int h = 0; h < nh && !fwd_oom(); h++) { /* W_uv per head, over the tn positions */
            for (int t = 0; t < tn; t++) memcpy(olat + (size_t)t * kl, oa + ((size_t)t * nh + h) * hd, sizeof(float) * kl);
            QMat uv = rows_of(&y->wkvb, h * (dn + dv) + dn, dv);
            matmul(ov, olat, tn, &uv, NULL);
            for (int t = 0; t < tn; t++) memcpy(att + ((size_t)(t0 + t) * nh + h) * dv, ov + (size_t)t * dv, sizeof(float) * dv);
        }
    }
out:
    free(qa);
    free(oa);
    free(olat);
    free(ov);
}

/* Positions whose latents are expanded per matmul: the expansion is a matrix product (the
 * quantized kernels' tiles), and its row buffer stays small beside the expanded rows. */
#define EXPAND_ROWS 128

/* Whether position p0 + t attends over every one of its causal keys (no selection, or one that
 * kept them all: a selection keeps top-k of them, all while the context is at most k). */
static int keeps_all(const unsigned char *keep, size_t n_all, int t, int n) {
    if (!keep) return 1;
    const unsigned char *kt = keep + (size_t)t * n_all;
    for (int j = 0; j < n; j++)
        if (!kt[j]) return 0;
    return 1;
}

/* Prefill: expand every cached position's per-head keys [W_uk c | k_rope] and values W_uv c
 * once, as f32 rows of xd = max(dn + dr, dv) floats (zero-padded: zeros add nothing to a dot and
 * the padded output dimensions are dropped), then attend head by head with the block kernel,
 * tq consecutive positions per K/V row read. A position whose selection dropped keys attends
 * over its kept ones with a row loop. */
static void attend_expanded(const AttnMla *y, const BlockRun *r, const float *q, int T, const unsigned char *keep, float *att) {
    const int kl = y->kl, dn = y->dn, dr = y->dr, dv = y->dv, qkd = dn + dr, nh = y->nh, w = dn + dv, p0 = r->p0;
    const int xd = qkd > dv ? qkd : dv, n_all = p0 + T;
    const size_t stride = row_stride(y, r->kv_type), estride = (size_t)nh * 2 * xd * sizeof(float);
    const KvKernels *kk = kv_kernels(r->kv_type), *kf = kv_kernels(QT_F32);
    const unsigned char *cache = r->state->pos;
    float *e = fwd_malloc(estride * (size_t)n_all); /* [position][head][K xd | V xd] */
    float *lat = fwd_malloc(sizeof(float) * EXPAND_ROWS * (kl + dr)), *c = fwd_malloc(sizeof(float) * EXPAND_ROWS * kl);
    float *kv = fwd_malloc(sizeof(float) * EXPAND_ROWS * nh * w);
    float *qp = qkd < xd ? fwd_malloc(sizeof(float) * (size_t)T * nh * xd) : NULL; /* queries padded to xd */
    float *op = dv < xd ? fwd_malloc(sizeof(float) * (size_t)T * nh * xd) : NULL;  /* outputs before the drop */
    unsigned char *full = fwd_malloc((size_t)T);
    if (!e || !lat || !c || !kv || (qkd < xd && !qp) || (dv < xd && !op) || !full) goto out;
    for (int j0 = 0; j0 < n_all && !fwd_oom(); j0 += EXPAND_ROWS) {
        const int jn = n_all - j0 < EXPAND_ROWS ? n_all - j0 : EXPAND_ROWS;
        for (int j = 0; j < jn; j++) {
            load_row(kk, cache + (size_t)(j0 + j) * stride, kl + dr, lat + (size_t)j * (kl + dr));
            memcpy(c + (size_t)j * kl, lat + (size_t)j * (kl + dr), sizeof(float) * kl);
        }
        matmul(kv, c, jn, &y->wkvb, NULL);
        for (int j = 0; j < jn; j++)
            for (int h = 0; h < nh; h++) {
                float *k = e + ((size_t)(j0 + j) * nh + h) * 2 * xd, *v = k + xd;
                const float *src = kv + ((size_t)j * nh + h) * w;
                memcpy(k, src, sizeof(float) * dn);
                memcpy(k + dn, lat + (size_t)j * (kl + dr) + kl, sizeof(float) * dr);
                memset(k + qkd, 0, sizeof(float) * (xd - qkd));
                memcpy(v, src + dn, sizeof(float) * dv);
                memset(v + dv, 0, sizeof(float) * (xd - dv));
            }
    }
    if (fwd_oom()) goto out;
    const float *qx = q;
    if (qp) {
        for (size_t i = 0; i < (size_t)T * nh; i++) {
            memcpy(qp + i * xd, q + i * qkd, sizeof(float) * qkd);
            memset(qp + i * xd + qkd, 0, sizeof(float) * (xd - qkd));
        }
        qx = qp;
    }
    float *ox = op ? op : att;
    for (int t = 0; t < T; t++) full[t] = (unsigned char)keeps_all(keep, (size_t)n_all, t, p0 + t + 1);
    const int tq = kv_attend_block_positions(1, n_all), nblk = (T + tq - 1) / tq;
    const size_t qstep = (size_t)nh * xd;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < nblk; b++) {
        for (int h = 0; h < nh; h++) {
            const int t0 = b * tq, tn = T - t0 < tq ? T - t0 : tq;
            const float *eh = e + (size_t)h * 2 * xd;
            for (int t = t0; t < t0 + tn;) { /* runs of positions that keep all their keys go together */
                int run = 0;
                while (t + run < t0 + tn && full[t + run] == full[t]) run++;
                if (full[t]) {
                    const int n = p0 + t + 1;
                    float *sc = scratch(1, kv_attend_scratch(run, 1, xd, n));
                    if (sc)
                        kf->attend_block(qx + (size_t)t * qstep + (size_t)h * xd, qstep, run, 1, xd, eh, eh + xd, estride, n, 0,
                                         y->scale, NULL, sc, ox + (size_t)t * qstep + (size_t)h * xd, qstep);
                } else {
                    for (int u = t; u < t + run; u++) {
                        const int n = p0 + u + 1;
                        const float *qh = qx + (size_t)u * qstep + (size_t)h * xd;
                        const unsigned char *kt = keep + (size_t)u * n_all;
                        float *sc = scratch(1, (size_t)n), *o = ox + (size_t)u * qstep + (size_t)h * xd;
                        if (!sc) continue; /* out of memory: fwd_oom() fails the pass */
                        for (int j = 0; j < n; j++)
                            sc[j] = kt[j] ? kern.dot(qh, eh + (size_t)j * nh * 2 * xd, xd) * y->scale : -INFINITY;
                        softmax(sc, n);
                        memset(o, 0, sizeof(float) * xd);
                        for (int j = 0; j < n; j++)
                            if (kt[j]) axpy(o, eh + (size_t)j * nh * 2 * xd + xd, sc[j], xd);
                    }
                }
                t += run;
            }
        }
    }
    if (op)
        for (size_t i = 0; i < (size_t)T * nh; i++) memcpy(att + i * dv, op + i * xd, sizeof(float) * dv);
out:
    free(e);
    free(lat);
    free(c);
    free(kv);
    free(qp);
    free(op);
    free(full);
}

static void run(const void *self, const BlockRun *r, const float *x, int T, float *out) {
    const AttnMla *y = self;
    const int nh = y->nh, kl = y->kl, dr = y->dr, qkd = y->dn + y->dr, qd = nh * qkd;
    float *q = fwd_malloc(sizeof(float) * (size_t)T * qd), *kva = fwd_malloc(sizeof(float) * (size_t)T * (kl + dr));
    float *att = fwd_malloc(sizeof(float) * (size_t)T * nh * y->dv);
    float *qa = y->ql ? fwd_malloc(sizeof(float) * (size_t)T * y->ql) : NULL;
    unsigned char *keep = NULL;                         /* [T][p0 + T] from the DSA indexer; NULL: every causal key */
    if (!q || !kva || !att || (y->ql && !qa)) goto out; /* fwd_oom() tells the caller */
    if (y->ql) {
        matmul(qa, x, T, &y->wqa, y->bqa);
        for (int t = 0; t < T; t++) rmsnorm(qa + (size_t)t * y->ql, qa + (size_t)t * y->ql, y->qa_norm, y->ql, y->eps);
        matmul(q, qa, T, &y->wqb, NULL);
    } else {
        matmul(q, x, T, &y->wq, NULL);
    }
    matmul(kva, x, T, &y->wkva, y->bkva);
    if (fwd_oom()) goto out;
    const size_t es = kv_elem_size(r->kv_type), stride = row_stride(y, r->kv_type);
    for (int t = 0; t < T; t++) {
        const int pos = r->p0 + t;
        for (int h = 0; h < nh && !y->norope; h++)
            rope_rotate(q + (size_t)t * qd + h * qkd + y->dn, r->a, dr, pos, y->interleaved);
        float *lat = kva + (size_t)t * (kl + dr);
        rmsnorm(lat, lat, y->kva_norm, kl, y->eps);
        if (!y->norope) rope_rotate(lat + kl, r->a, dr, pos, y->interleaved);
        unsigned char *dst = r->state->pos + (size_t)pos * stride;
        kv_store_row(r->kv_type, lat, kl, dst);
        kv_store_row(r->kv_type, lat + kl, dr, dst + (size_t)kl * es);
    }
    if (y->has_idx) {
        const size_t off = (size_t)(kl + dr) * es;
        dsa_store_keys(&y->idx, r, x, T, stride, off);
        if (!fwd_oom()) keep = dsa_select(&y->idx, r, x, qa, T, stride, off);
        if (fwd_oom()) {
            free(keep);
            goto out;
        } /* a selection cut short is nobody's */
        /* owned there now, for the shared layers that follow */
        if (keep_selection(r->state - r->layer, keep, r->p0, T, r->in_pass)) {
            keep = NULL;
            goto out;
        }
    }
    if (y->shared_idx) {
        /* load checked that an indexer layer comes first; it ran on this chunk before */
        int i = sel_find(r->state - r->layer, r->p0, T);
        if (i < 0) {
            fprintf(stderr, "colibri: internal error: a shared DSA layer ran without its indexer layer's selection\n");
            abort();
        }
        keep = sels[i].keep;
    }
    /* Expanding costs every cached position's keys and values once per chunk: worth it only
     * while the chunk is most of the context (a prompt's first chunks). Later chunks and decode
     * attend through the latent, so a long context never expands. */
    const int n_all = r->p0 + T;
    if (T > 1 && 2 * T >= n_all) attend_expanded(y, r, q, T, keep, att);
    else attend_absorbed(y, r, q, T, keep, att);
    if (!fwd_oom()) matmul(out, att, T, &y->wo, y->bo);
out:
    free(q);
    free(kva);
    free(att);
    free(qa); /* keep belongs to sels */
}

static void release(void *self) {
    AttnMla *p = self;
    free((void *)p->qa_norm);
    free((void *)p->kva_norm);
    free((void *)p->bqa);
    free((void *)p->bkva);
    free((void *)p->bo);
    if (p->has_idx) dsa_release(&p->idx);
}

const BlockKind block_attn_mla = {ROLE_ATTN, "mla", sizeof(AttnMla), load, run, state, release, NULL};
