/* DeepSeek-V4 attention: low-rank queries (q_a, RMSNorm, q_b, then each head RMS-normalized
 * without a weight), one shared K=V head (kv, RMSNorm), interleaved RoPE on the trailing rope.dim
 * dims of every head (pairs (v0, v1), (v2, v3)... rotated in place), a sliding window with
 * learned sinks, the rotation undone on the attention output (so each value contributes by
 * relative position), then the grouped low-rank output projection: o_groups groups of heads,
 * each projected by its own o_lora_rank rows of o_a, mixed by o_b.
 * A compressed layer ("compress", dsv4_compress.h) also attends to the entries its compressor
 * made of every closed window before the query: all of them (HCA), or the index_topk its
 * lightning indexer scores best (CSA: sum over indexer heads of w_h * relu(q_h . key)).
 * State, sliding layer: per position the one K=V row (head_dim values); the slot keeps only the
 * window (a ring, position j in slot j % cap). Compressed layer: entry w in the rows of its
 * window's positions, row w * rate + s holding piece s of it (ceil(head_dim / rate) values in
 * the cache's type, then ceil(index_head_dim / rate) f32 of the indexer's key, the last pieces
 * zero-padded; rows of an open window are zero); fixed: the window's K=V rows (f32, position j
 * in row j % window) and the compressors' open windows. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/blocks.h"
#include "model/dsv4_compress.h"
#include "util/fwd_alloc.h"
#include "kernels/kv_kernels.h"
#include "kernels/ops.h"

typedef struct {
    int nh, hd, ql, rot, groups, rank, window;
    float eps, rope_scale;
    float *inv_freq; /* [rot / 2] */
    QMat q_a, q_b, kv, o_a, o_b;
    const float *q_a_norm, *kv_norm, *sinks;
    int compressed, indexed; /* a compressor; and an indexer (CSA) */
    Dsv4Comp comp, icomp;
    int inh, ihd, topk; /* indexer heads, head size, entries kept per query */
    QMat iq_b, iw;      /* [inh * ihd][q_lora_rank], [inh][hidden] */
} AttnDsv4;

static int load_compress(AttnDsv4 *p, const JsonValue *c, BlockLoader *L) {
    p->compressed = 1;
    if (dsv4c_load(&p->comp, c, p->hd, p->eps, L)) return -1;
    const JsonValue *ix = json_get(c, "indexer");
    if (!ix || ix->type == JSON_NULL) return 0;
    p->indexed = 1;
    p->inh = bl_int(L, ix, "heads", 1, 4096);
    p->ihd = bl_int(L, ix, "head_dim", 2, 4096);
    p->topk = bl_int(L, ix, "top_k", 1, 1 << 30);
    if (L->failed || dsv4c_load(&p->icomp, ix, p->ihd, p->eps, L)) return -1;
    if (p->icomp.rate != p->comp.rate || p->icomp.overlap != p->comp.overlap)
        return bl_fail(L, "dsv4: the indexer compresses at rate %d, the layer at %d", p->icomp.rate, p->comp.rate);
    if (p->ihd < p->rot) return bl_fail(L, "dsv4: index head_dim %d must hold the %d RoPE dims", p->ihd, p->rot);
    const JsonValue *t = json_get(ix, "tensors");
    p->iq_b = bl_mat(L, t, "q_b", p->inh * p->ihd, p->ql);
    p->iw = bl_mat(L, t, "weights", p->inh, L->a->hidden);
    return L->failed ? -1 : 0;
}

static int load(void *self, const JsonValue *spec, BlockLoader *L) {
    AttnDsv4 *p = self;
    const int H = L->a->hidden;
    p->nh = bl_int(L, spec, "heads", 1, 1024);
    p->hd = bl_int(L, spec, "head_dim", 2, 4096);
    p->ql = bl_int(L, spec, "q_lora_rank", 1, 1 << 16);
    p->groups = bl_int(L, spec, "o_groups", 1, 1024);
    p->rank = bl_int(L, spec, "o_lora_rank", 1, 1 << 16);
    p->window = bl_int(L, spec, "window", 1, 1 << 30);
    p->eps = (float)bl_num(L, spec, "eps", 0.0, 1.0);
    const JsonValue *rope = bl_obj(L, spec, "rope");
    if (L->failed) return -1;
    const char *style = bl_str(L, rope, "style");
    p->rot = bl_int(L, rope, "dim", 0, p->hd);
    const JsonValue *inv = json_get(rope, "inv_freq");
    if (L->failed) return -1;
    if (strcmp(style, "interleaved_tail"))
        return bl_fail(L, "dsv4: rope style '%s' is not implemented (interleaved_tail)", style);
    if (p->rot % 2 || !inv || inv->type != JSON_ARR || (int)inv->len != p->rot / 2)
        return bl_fail(L, "dsv4: rope.dim must be even and rope.inv_freq list rope.dim/2 = %d numbers", p->rot / 2);
    if (p->nh % p->groups) return bl_fail(L, "dsv4: %d heads do not split into %d output groups", p->nh, p->groups);
    if (!(p->inv_freq = malloc(sizeof(float) * (inv->len + 1)))) return bl_fail(L, "out of memory");
    for (size_t i = 0; i < inv->len; i++) p->inv_freq[i] = (float)inv->items[i].num;
    p->rope_scale = json_get(rope, "scale") ? (float)bl_num(L, rope, "scale", 1e-6, 1e6) : 1.0f;
    const JsonValue *t = json_get(spec, "tensors");
    p->q_a = bl_mat(L, t, "q_a", p->ql, H);
    p->q_a_norm = bl_vec(L, t, "q_a_norm", 1, p->ql, 0);
    p->q_b = bl_mat(L, t, "q_b", p->nh * p->hd, p->ql);
    p->kv = bl_mat(L, t, "kv", p->hd, H);
    p->kv_norm = bl_vec(L, t, "kv_norm", 1, p->hd, 0);
    p->o_a = bl_mat(L, t, "o_a", p->groups * p->rank, p->nh * p->hd / p->groups);
    p->o_b = bl_mat(L, t, "o_b", H, p->groups * p->rank);
    p->sinks = bl_vec(L, t, "sinks", 1, p->nh, 0);
    const JsonValue *c = json_get(spec, "compress");
    if (!L->failed && c && c->type != JSON_NULL && load_compress(p, c, L)) return -1;
    return L->failed ? -1 : 0;
}

#define HEADS_PER_TASK 8 /* query heads one attention task runs (decode splits a position's heads) */

/* Values of an entry of n that one of its window's m rows holds. */
static int piece(int n, int m) { return (n + m - 1) / m; }

/* f32 values of a compressed layer's fixed state: the window's rows, then the compressors'. */
static size_t fixed_floats(const AttnDsv4 *p) {
    return (size_t)p->window * p->hd + dsv4c_state_floats(&p->comp) + (p->indexed ? dsv4c_state_floats(&p->icomp) : 0);
}

static StateDesc state(const void *self, QType kv_type) {
    const AttnDsv4 *p = self;
    if (!p->compressed)
        return (StateDesc){.per_pos = (size_t)p->hd * kv_elem_size(kv_type), .truncatable = 1, .window = p->window};
    const int m = p->comp.rate;
    const size_t tail = p->indexed ? (size_t)piece(p->ihd, m) * 4 : 0;
    return (StateDesc){.per_pos = (size_t)piece(p->hd, m) * kv_elem_size(kv_type) + tail,
                       .fixed = 4 * fixed_floats(p),
                       .truncatable = 0,
                       .f32_tail = tail,
                       .settle = m};
}

static void unit_rms(float *v, int n, float eps) {
    float ss = 0;
    for (int i = 0; i < n; i++) ss += v[i] * v[i];
    const float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) v[i] *= r;
}

/* Indices of the k best of s[0..n) into idx, ties to the lower index; returns how many. */
static int top_k(const float *s, int n, int k, int *idx) {
    if (k > n) k = n;
    float best[k > 0 ? k : 1];
    for (int j = 0; j < k; j++) idx[j] = -1;
    for (int i = 0; i < n; i++) {
        int j = k;
        while (j > 0 && (idx[j - 1] < 0 || s[i] > best[j - 1])) j--;
        if (j == k) continue;
        memmove(idx + j + 1, idx + j, sizeof(int) * (size_t)(k - j - 1));
        memmove(best + j + 1, best + j, sizeof(float) * (size_t)(k - j - 1));
        idx[j] = i;
        best[j] = s[i];
    }
    return k;
}

/* The compressors take this batch; the entries of every window that closes go to the slot.
 * 0, or -1 out of memory. */
static int compress(const AttnDsv4 *y, const BlockRun *r, const float *x, int T, float *cstate, float *istate) {
    const int m = y->comp.rate, maxe = T / m + 1, pk = piece(y->hd, m), pi = y->indexed ? piece(y->ihd, m) : 0;
    const size_t es = kv_elem_size(r->kv_type), stride = r->state->per_pos;
    const int wmax = m * (pk > pi ? pk : pi); /* an entry padded to whole pieces */
    float *e = fwd_calloc((size_t)maxe * wmax, sizeof(float));
    int w0, n;
    if (!e) return -1;
    memset(r->state->pos + (size_t)r->p0 * stride, 0, (size_t)T * stride); /* until their window closes */
    if ((n = dsv4c_feed(&y->comp, cstate, x, T, r->p0, e, &w0)) < 0) {
        free(e);
        return -1;
    }
    for (int k = n - 1; k >= 0; k--) { /* spread to padded strides, last first (in place) */
        memmove(e + (size_t)k * wmax, e + (size_t)k * y->hd, sizeof(float) * y->hd);
        memset(e + (size_t)k * wmax + y->hd, 0, sizeof(float) * (size_t)(wmax - y->hd));
    }
    for (int k = 0; k < n; k++) {
        float *v = e + (size_t)k * wmax;
        dsv4_rope_tail(v, y->hd, y->rot, y->inv_freq, y->rope_scale, (w0 + k) * m, 1.0f);
        for (int s = 0; s < m; s++)
            kv_store_row(r->kv_type, v + (size_t)s * pk, pk, r->state->pos + ((size_t)(w0 + k) * m + s) * stride);
    }
    if (y->indexed) {
        if ((n = dsv4c_feed(&y->icomp, istate, x, T, r->p0, e, &w0)) < 0) {
            free(e);
            return -1;
        }
        for (int k = n - 1; k >= 0; k--) {
            memmove(e + (size_t)k * wmax, e + (size_t)k * y->ihd, sizeof(float) * y->ihd);
            memset(e + (size_t)k * wmax + y->ihd, 0, sizeof(float) * (size_t)(wmax - y->ihd));
        }
        for (int k = 0; k < n; k++) {
            float *v = e + (size_t)k * wmax;
            dsv4_rope_tail(v, y->ihd, y->rot, y->inv_freq, y->rope_scale, (w0 + k) * m, 1.0f);
            for (int s = 0; s < m; s++)
                memcpy(r->state->pos + ((size_t)(w0 + k) * m + s) * stride + (size_t)pk * es, v + (size_t)s * pi,
                       sizeof(float) * pi);
        }
    }
    free(e);
    return 0;
}

/* One query of a compressed layer: its window rows win[n_w][hd] (f32) and the entries its
 * position may see, all (HCA) or the indexer's top_k (CSA), in one softmax with the sinks. */
static void attend_compressed(const AttnDsv4 *y, const BlockRun *r, const float *q, const float *win, int n_w, int P,
                              const float *iq, const float *iw, float *o) {
    const int hd = y->hd, m = y->comp.rate, nc = (P + 1) / m, pk = piece(hd, m), pi = y->indexed ? piece(y->ihd, m) : 0;
    const size_t es = kv_elem_size(r->kv_type), stride = r->state->per_pos, ent = (size_t)m * stride;
    int k = nc, *sel = fwd_malloc(sizeof(int) * (size_t)(nc > 0 ? nc : 1));
    float *sc = NULL, *rows = fwd_malloc(sizeof(float) * (size_t)(n_w + nc) * hd);
    float *ent_f = fwd_malloc(sizeof(float) * (size_t)m * pk); /* one entry, padded */
    if (!sel || !rows || !ent_f) goto out;
    if (y->indexed && nc > 0) {
        if (!(sc = fwd_malloc(sizeof(float) * (size_t)nc))) goto out;
        const float s = 1.0f / sqrtf((float)y->ihd);
#pragma omp parallel for schedule(static) if (par_worth((double)nc * y->inh * y->ihd / 32))
        for (int e = 0; e < nc; e++) {
            float key[m * pi];
            for (int j = 0; j < m; j++)
                memcpy(key + j * pi, r->state->pos + (size_t)e * ent + j * stride + (size_t)pk * es, sizeof(float) * pi);
            float v = 0;
            for (int h = 0; h < y->inh; h++) {
                float d = 0;
                for (int i = 0; i < y->ihd; i++) d += iq[(size_t)h * y->ihd + i] * key[i];
                v += (d > 0 ? d : 0) * s * iw[h];
            }
            sc[e] = v;
        }
        k = top_k(sc, nc, y->topk, sel);
    } else
        for (int e = 0; e < nc; e++) sel[e] = e;
    memcpy(rows, win, sizeof(float) * (size_t)n_w * hd);
    for (int j = 0; j < k; j++) {
        for (int s = 0; s < m; s++)
            dequant_row(r->kv_type, r->state->pos + (size_t)sel[j] * ent + s * stride, pk, ent_f + s * pk);
        memcpy(rows + (size_t)(n_w + j) * hd, ent_f, sizeof(float) * hd);
    }
    const int chunks = (y->nh + HEADS_PER_TASK - 1) / HEADS_PER_TASK;
#pragma omp parallel for schedule(dynamic, 1) if (par_worth(2.0 * (n_w + k) * y->nh * hd / 32))
    for (int c = 0; c < chunks; c++) { /* each head's result is its own: the split changes no bit */
        const int h0 = c * HEADS_PER_TASK, g = y->nh - h0 < HEADS_PER_TASK ? y->nh - h0 : HEADS_PER_TASK;
        float *att = scratch(1, kv_attend_scratch(1, g, hd, n_w + k));
        if (att)
            kv_kernels(QT_F32)->attend(q + (size_t)h0 * hd, g, hd, rows, rows, sizeof(float) * hd, n_w + k,
                                       1.0f / sqrtf((float)hd), y->sinks + h0, att, o + (size_t)h0 * hd);
    }
out:
    free(sel);
    free(sc);
    free(rows);
    free(ent_f);
}

static void run(const void *self, const BlockRun *r, const float *x, int T, float *out) {
    const AttnDsv4 *y = self;
    const int hd = y->hd, nh = y->nh, qd = nh * hd, G = y->groups, R = y->rank, gin = qd / G;
    const int p0 = r->p0, iqd = y->inh * y->ihd;
    float *qa = fwd_malloc(sizeof(float) * (size_t)T * y->ql), *q = fwd_malloc(sizeof(float) * (size_t)T * qd);
    float *kv = fwd_malloc(sizeof(float) * (size_t)T * hd), *att = fwd_malloc(sizeof(float) * (size_t)T * qd);
    float *gx = fwd_malloc(sizeof(float) * (size_t)T * gin), *gy = fwd_malloc(sizeof(float) * (size_t)T * R);
    float *oa = fwd_malloc(sizeof(float) * (size_t)T * G * R);
    float *iq = y->indexed ? fwd_malloc(sizeof(float) * (size_t)T * iqd) : NULL;
    float *iw = y->indexed ? fwd_malloc(sizeof(float) * (size_t)T * y->inh) : NULL;
    /* the window's rows before p0 then this batch, in order (a batch must not overwrite ring rows
     * its own earlier queries still read); the ring gets the batch afterwards */
    const size_t es = y->compressed ? sizeof(float) : kv_elem_size(r->kv_type), stride = (size_t)hd * es;
    const int cap = y->compressed ? y->window : r->state->cap, base = p0 - (y->window - 1) > 0 ? p0 - (y->window - 1) : 0;
    unsigned char *view = fwd_malloc(stride * (size_t)(p0 - base + T));
    unsigned char *ring = y->compressed ? r->state->fixed : r->state->pos;
    float *cstate = y->compressed ? (float *)r->state->fixed + (size_t)y->window * hd : NULL;
    float *istate = cstate && y->indexed ? cstate + dsv4c_state_floats(&y->comp) : NULL;
    if (!qa || !q || !kv || !att || !gx || !gy || !oa || !view || (y->indexed && (!iq || !iw)))
        goto done; /* fwd_oom() tells the caller */
    matmul(qa, x, T, &y->q_a, NULL);
    for (int t = 0; t < T; t++) rmsnorm(qa + (size_t)t * y->ql, qa + (size_t)t * y->ql, y->q_a_norm, y->ql, y->eps);
    matmul(q, qa, T, &y->q_b, NULL);
    matmul(kv, x, T, &y->kv, NULL);
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < nh; h++) {
            float *qh = q + (size_t)t * qd + (size_t)h * hd;
            unit_rms(qh, hd, y->eps);
            dsv4_rope_tail(qh, hd, y->rot, y->inv_freq, y->rope_scale, p0 + t, 1.0f);
        }
        float *k = kv + (size_t)t * hd;
        rmsnorm(k, k, y->kv_norm, hd, y->eps);
        dsv4_rope_tail(k, hd, y->rot, y->inv_freq, y->rope_scale, p0 + t, 1.0f);
    }
    if (y->indexed) { /* the indexer's queries (from the same q_a latent) and head weights */
        matmul(iq, qa, T, &y->iq_b, NULL);
        matmul(iw, x, T, &y->iw, NULL);
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < y->inh; h++)
                dsv4_rope_tail(iq + (size_t)t * iqd + (size_t)h * y->ihd, y->ihd, y->rot, y->inv_freq, y->rope_scale, p0 + t,
                               1.0f);
            for (int h = 0; h < y->inh; h++) iw[(size_t)t * y->inh + h] *= 1.0f / sqrtf((float)y->inh);
        }
    }
    for (int j = base; j < p0; j++) memcpy(view + (size_t)(j - base) * stride, ring + (size_t)(j % cap) * stride, stride);
    for (int t = 0; t < T; t++) {
        unsigned char *dst = view + (size_t)(p0 + t - base) * stride;
        if (y->compressed) memcpy(dst, kv + (size_t)t * hd, stride);
        else kv_store_row(r->kv_type, kv + (size_t)t * hd, hd, dst);
    }
    for (int t = 0; t < T; t++) memcpy(ring + (size_t)((p0 + t) % cap) * stride, view + (size_t)(p0 + t - base) * stride, stride);
    if (y->compressed && compress(y, r, x, T, cstate, istate)) goto done;
    const KvKernels *kk = kv_kernels(r->kv_type);
    const float scale = 1.0f / sqrtf((float)hd);
    if (y->compressed) /* per position: its selection, then its heads in parallel */
        for (int t = 0; t < T && !fwd_oom(); t++) {
            const int end = p0 + t + 1, start = end > y->window ? end - y->window : 0;
            attend_compressed(y, r, q + (size_t)t * qd, (const float *)(view + (size_t)(start - base) * stride), end - start,
                              p0 + t, iq ? iq + (size_t)t * iqd : NULL, iw ? iw + (size_t)t * y->inh : NULL,
                              att + (size_t)t * qd);
        }
    else { /* tq consecutive positions per task share each window row read (the block kernel gives
            * every row the bits it gets alone) */
        const int chunks = (nh + HEADS_PER_TASK - 1) / HEADS_PER_TASK;
        const int tq = kv_attend_block_positions(HEADS_PER_TASK, y->window), nblk = (T + tq - 1) / tq;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (par_worth(2.0 * T * y->window * nh * hd / 32))
        for (int b = 0; b < nblk; b++)
            for (int c = 0; c < chunks; c++) { /* each head's result is its own: the split changes no bit */
                const int t = b * tq, tn = T - t < tq ? T - t : tq;
                const int end = p0 + t + 1, start = end > y->window ? end - y->window : 0, n = end - start;
                const int h0 = c * HEADS_PER_TASK, g = nh - h0 < HEADS_PER_TASK ? nh - h0 : HEADS_PER_TASK;
                float *sc = scratch(1, kv_attend_scratch(tn, g, hd, n));
                if (!sc) continue; /* out of memory: fwd_oom() fails the pass */
                kk->attend_block(q + (size_t)t * qd + (size_t)h0 * hd, (size_t)qd, tn, g, hd,
                                 view + (size_t)(start - base) * stride, view + (size_t)(start - base) * stride, stride, n,
                                 y->window, scale, y->sinks + h0, sc, att + (size_t)t * qd + (size_t)h0 * hd, (size_t)qd);
            }
    }
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++)
            dsv4_rope_tail(att + (size_t)t * qd + (size_t)h * hd, hd, y->rot, y->inv_freq, y->rope_scale, p0 + t, -1.0f);
    for (int g = 0; g < G; g++) { /* group g: heads g*nh/G.., its own R rows of o_a */
        QMat w = y->o_a;
        w.rows = R;
        w.data += (size_t)g * R * w.row_bytes;
        for (int t = 0; t < T; t++) memcpy(gx + (size_t)t * gin, att + (size_t)t * qd + (size_t)g * gin, sizeof(float) * gin);
        matmul(gy, gx, T, &w, NULL);
        for (int t = 0; t < T; t++) memcpy(oa + (size_t)t * G * R + (size_t)g * R, gy + (size_t)t * R, sizeof(float) * R);
    }
    matmul(out, oa, T, &y->o_b, NULL);
done:
    free(qa);
    free(q);
    free(kv);
    free(att);
    free(gx);
    free(gy);
    free(oa);
    free(iq);
    free(iw);
    free(view);
}

static void release(void *self) {
    AttnDsv4 *p = self;
    free(p->inv_freq);
    free((void *)p->q_a_norm);
    free((void *)p->kv_norm);
    free((void *)p->sinks);
    dsv4c_free(&p->comp);
    dsv4c_free(&p->icomp);
}

const BlockKind block_attn_dsv4 = {ROLE_ATTN, "dsv4", sizeof(AttnDsv4), load, run, state, release, NULL};
