/* GQA attention block: grouped K/V heads, optional q/k/v/o biases, optional per-head q/k
 * RMSNorm (per head, or over the whole projection as OLMoE does), optional clip_qkv (q/k/v
 * clamped to [-c, c] after the norms, OLMoE), an optional sliding window (each query sees its
 * last `window` positions), optional learned attention sinks (one extra logit per head in the
 * softmax, gpt-oss), NeoX-style (rotate-half) RoPE over the first rope.dim dims of each head,
 * from the model's table or the block's own (rope.inv_freq + rope.scale, for layers whose RoPE
 * differs), an optional output gate (attention output times sigmoid(gate . x), Qwen3.5/3.6;
 * q/k norm weights then carry qk_norm_offset).
 * State: per position, K then V for every KV head, in the cache's element type. With "ring"
 * (a window set) the slot keeps only the last `window` positions, position j in slot j % cap
 * (Mixtral keeps every position; gpt-oss's sliding layers keep the ring).
 * Optional v_head_dim (v heads narrower than q/k, MiMo-V2-Flash; o reads heads x v_head_dim,
 * attention through kv_attend_split) and v_scale (values multiplied by it before caching). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/fwd_alloc.h"
#include "model/blocks.h"
#include "model/kv_attend_split.h"
#include "kernels/kv_kernels.h"
#include "kernels/ops.h"

typedef struct {
    int nh, nkv, hd, rot, qk_full; /* qk_full: q/k norms span all heads */
    int vd;                        /* v head size (hd unless v_head_dim says otherwise) */
    float v_scale;                 /* values times this before caching (1: none) */
    int window;                    /* positions each query attends to, 0 = all */
    int ring;                      /* the state keeps only the window */
    float qk_eps, clip;            /* clip: 0 = none */
    QMat wq, wk, wv, wo, wg;       /* wg: output gate, or rows 0 */
    const float *bq, *bk, *bv, *bo, *q_norm, *k_norm;
    const float *sinks;          /* [nh] or NULL */
    float *inv_freq, rope_scale; /* the block's own RoPE table, or NULL: the model's */
} AttnGqa;

/* rope.inv_freq (rot/2 numbers) and rope.scale: a RoPE of this layer's own. */
static int load_rope_table(AttnGqa *p, const JsonValue *rope, BlockLoader *L) {
    const JsonValue *inv = json_get(rope, "inv_freq");
    if (!inv) return 0;
    if (inv->type != JSON_ARR || (int)inv->len != p->rot / 2)
        return bl_fail(L, "gqa: rope.inv_freq must list rope.dim/2 = %d numbers", p->rot / 2);
    if (!(p->inv_freq = malloc(sizeof(float) * (inv->len + 1)))) return bl_fail(L, "out of memory");
    for (size_t i = 0; i < inv->len; i++) {
        if (inv->items[i].type != JSON_NUM) return bl_fail(L, "gqa: rope.inv_freq[%zu] is not a number", i);
        p->inv_freq[i] = (float)inv->items[i].num;
    }
    p->rope_scale = json_get(rope, "scale") ? (float)bl_num(L, rope, "scale", 1e-6, 1e6) : 1.0f;
    return L->failed ? -1 : 0;
}

static int load(void *self, const JsonValue *spec, BlockLoader *L) {
    AttnGqa *p = self;
    const int H = L->a->hidden;
    p->nh = bl_int(L, spec, "heads", 1, 1024);
    p->nkv = bl_int(L, spec, "kv_heads", 1, 1024);
    p->hd = bl_int(L, spec, "head_dim", 2, 4096);
    const JsonValue *rope = bl_obj(L, spec, "rope");
    if (L->failed) return -1;
    const char *style = bl_str(L, rope, "style");
    p->rot = bl_int(L, rope, "dim", 0, p->hd);
    if (L->failed) return -1;
    if (p->nh % p->nkv) return bl_fail(L, "gqa: %d heads are not a multiple of %d KV heads", p->nh, p->nkv);
    if (strcmp(style, "neox")) return bl_fail(L, "gqa: rope style '%s' is not implemented (neox)", style);
    if (load_rope_table(p, rope, L)) return -1;
    if (!p->inv_freq && p->rot != L->a->rotary_dim)
        return bl_fail(L, "gqa: rope.dim %d differs from the model's RoPE table (%d) and the block has no rope.inv_freq", p->rot,
                       L->a->rotary_dim);
    if (json_get(spec, "window")) p->window = bl_int(L, spec, "window", 0, 1 << 30);
    p->ring = json_get_bool(spec, "ring", 0);
    if (p->ring && !p->window) return bl_fail(L, "gqa: ring (a state of window size) needs a window");
    const char *qkn = json_get_str(spec, "qk_norm");
    if (qkn && strcmp(qkn, "none") && strcmp(qkn, "per_head") && strcmp(qkn, "full"))
        return bl_fail(L, "gqa: qk_norm '%s' is not implemented", qkn);
    p->vd = json_get(spec, "v_head_dim") ? bl_int(L, spec, "v_head_dim", 1, 4096) : p->hd;
    p->v_scale = json_get(spec, "v_scale") ? (float)bl_num(L, spec, "v_scale", 1e-6, 1e6) : 1.0f;
    const int qd = p->nh * p->hd, kvd = p->nkv * p->hd, vd = p->nkv * p->vd;
    const JsonValue *t = json_get(spec, "tensors");
    p->wq = bl_mat(L, t, "q", qd, H);
    p->wk = bl_mat(L, t, "k", kvd, H);
    p->wv = bl_mat(L, t, "v", vd, H);
    p->wo = bl_mat(L, t, "o", H, p->nh * p->vd);
    p->bq = bl_vec(L, t, "q_bias", 1, qd, 1);
    p->bk = bl_vec(L, t, "k_bias", 1, kvd, 1);
    p->bv = bl_vec(L, t, "v_bias", 1, vd, 1);
    p->bo = bl_vec(L, t, "o_bias", 1, H, 1);
    if (json_get_bool(spec, "sinks", 0)) p->sinks = bl_vec(L, t, "sinks", 1, p->nh, 0);
    if (qkn && !strcmp(qkn, "per_head")) {
        p->qk_eps = (float)bl_num(L, spec, "qk_norm_eps", 1e-30, 1.0);
        p->q_norm = bl_vec(L, t, "q_norm", 1, p->hd, 0);
        p->k_norm = bl_vec(L, t, "k_norm", 1, p->hd, 0);
        if (!L->failed && json_get(spec, "qk_norm_offset")) { /* (1 + w) norms, as block_norm_rms */
            float off = (float)bl_num(L, spec, "qk_norm_offset", -16.0, 16.0);
            for (int i = 0; i < p->hd && !L->failed; i++) {
                ((float *)p->q_norm)[i] += off;
                ((float *)p->k_norm)[i] += off;
            }
        }
    } else if (qkn && !strcmp(qkn, "full")) {
        p->qk_full = 1;
        p->qk_eps = (float)bl_num(L, spec, "qk_norm_eps", 1e-30, 1.0);
        p->q_norm = bl_vec(L, t, "q_norm", 1, qd, 0);
        p->k_norm = bl_vec(L, t, "k_norm", 1, kvd, 0);
    }
    if (t && json_get_str(t, "gate")) p->wg = bl_mat(L, t, "gate", qd, H);
    if (json_get(spec, "clip_qkv")) p->clip = (float)bl_num(L, spec, "clip_qkv", 0.0, 1e30);
    return L->failed ? -1 : 0;
}

static StateDesc state(const void *self, QType kv_type) {
    const AttnGqa *p = self;
    StateDesc s = {
        .per_pos = (size_t)p->nkv * (p->hd + p->vd) * kv_elem_size(kv_type), .truncatable = 1, .window = p->ring ? p->window : 0};
    return s;
}

/* One position's rotation factors for rot dims: c[i], s[i] for i < rot/2. */
static void rope_factors(float *c, float *s, const float *inv_freq, float scale, int rot, int pos) {
    for (int i = 0; i < rot / 2; i++) {
        float ang = inv_freq[i] * (float)pos; /* float product, as transformers computes it */
        c[i] = (float)cos((double)ang) * scale, s[i] = (float)sin((double)ang) * scale;
    }
}

/* Rotates the first rot dims of one head in place, HF rotate_half layout. */
static void rope(float *v, const float *c, const float *s, int rot) {
    int half = rot / 2;
    for (int i = 0; i < half; i++) {
        float x1 = v[i], x2 = v[i + half];
        v[i] = x1 * c[i] - x2 * s[i];
        v[i + half] = x2 * c[i] + x1 * s[i];
    }
}

static void clamp_all(float *v, size_t n, float c) {
    for (size_t i = 0; i < n; i++) v[i] = v[i] > c ? c : v[i] < -c ? -c : v[i];
}

static void run(const void *self, const BlockRun *r, const float *x, int T, float *out) {
    const AttnGqa *y = self;
    const Arch *a = r->a;
    const int hd = y->hd, nh = y->nh, nkv = y->nkv, qd = nh * hd, kvd = nkv * hd;
    const int vh = y->vd, vd = nkv * vh, od = nh * vh; /* v head, v row and attention output sizes */
    const int p0 = r->p0, group = nh / nkv;
    float *q = fwd_malloc(sizeof(float) * (size_t)T * qd);
    float *k = fwd_malloc(sizeof(float) * (size_t)T * kvd);
    float *v = fwd_malloc(sizeof(float) * (size_t)T * vd);
    float *att = fwd_malloc(sizeof(float) * (size_t)T * od);
    if (!q || !k || !v || !att) {
        free(q);
        free(k);
        free(v);
        free(att);
        return;
    } /* fwd_oom() tells the caller */
    matmul_fused(3, (float *const[]){q, k, v}, x, T, (const QMat *const[]){&y->wq, &y->wk, &y->wv},
                 (const float *const[]){y->bq, y->bk, y->bv});
    if (y->qk_full)
        for (int t = 0; t < T; t++) {
            rmsnorm(q + (size_t)t * qd, q + (size_t)t * qd, y->q_norm, qd, y->qk_eps);
            rmsnorm(k + (size_t)t * kvd, k + (size_t)t * kvd, y->k_norm, kvd, y->qk_eps);
        }
    if (y->clip > 0) {
        clamp_all(q, (size_t)T * qd, y->clip);
        clamp_all(k, (size_t)T * kvd, y->clip);
        clamp_all(v, (size_t)T * vd, y->clip);
    }
    if (y->v_scale != 1.0f)
        for (size_t i = 0; i < (size_t)T * vd; i++) v[i] *= y->v_scale;
    const float *inv_freq = y->inv_freq ? y->inv_freq : a->inv_freq;
    const float rscale = y->inv_freq ? y->rope_scale : a->rope_scale;
    float rc[y->rot / 2 + 1], rs[y->rot / 2 + 1]; /* once per position, not per head */
    for (int t = 0; t < T; t++) {
        rope_factors(rc, rs, inv_freq, rscale, y->rot, p0 + t);
        for (int h = 0; h < nh; h++) {
            float *qh = q + (size_t)t * qd + h * hd;
            if (y->q_norm && !y->qk_full) rmsnorm(qh, qh, y->q_norm, hd, y->qk_eps);
            rope(qh, rc, rs, y->rot);
        }
        for (int h = 0; h < nkv; h++) {
            float *kh = k + (size_t)t * kvd + h * hd;
            if (y->k_norm && !y->qk_full) rmsnorm(kh, kh, y->k_norm, hd, y->qk_eps);
            rope(kh, rc, rs, y->rot);
        }
    }
    /* position j holds K_j [kvd] then V_j [vd] */
    const size_t es = kv_elem_size(r->kv_type), stride = ((size_t)kvd + vd) * es;
    /* view: the rows of positions base.. in order, contiguous; the cache itself, or for a ring
     * a copy of the window before p0 followed by this batch (a ring's batch would overwrite
     * rows its own earlier queries still read). Same rows in the same order either way, so a
     * ring gives the same bits as the whole cache. */
    unsigned char *cache = r->state->pos, *view = cache, *lin = NULL;
    int base = 0;
    if (y->ring) {
        const int cap = r->state->cap;
        base = p0 - (y->window - 1) > 0 ? p0 - (y->window - 1) : 0;
        lin = fwd_malloc(stride * (size_t)(p0 - base + T));
        if (!lin) {
            free(q);
            free(k);
            free(v);
            free(att);
            return;
        }
        for (int j = base; j < p0; j++) memcpy(lin + (size_t)(j - base) * stride, cache + (size_t)(j % cap) * stride, stride);
        view = lin;
    }
    for (int t = 0; t < T; t++) {
        unsigned char *dst = view + (size_t)(p0 + t - base) * stride;
        kv_store_row(r->kv_type, k + (size_t)t * kvd, kvd, dst);
        kv_store_row(r->kv_type, v + (size_t)t * vd, vd, dst + (size_t)kvd * es);
    }
    if (y->ring) /* later positions overwrite earlier ones: the ring ends holding the last cap */
        for (int t = 0; t < T; t++)
            memcpy(cache + (size_t)((p0 + t) % r->state->cap) * stride, view + (size_t)(p0 + t - base) * stride, stride);
    const KvKernels *kk = kv_kernels(r->kv_type);
    const float scale = 1.0f / sqrtf((float)hd);
    if (vh == hd) {
        /* One task per (block of tq positions, KV head): each K/V row read serves the group's
         * query heads of all tq positions. Rows get the same bits in any block (kv_kernels.h).
         * ~64 query rows a block, fewer where their scores (rows x positions) would pass 16 MB. */
        const int span = y->window && y->window < p0 + T ? y->window : p0 + T;
        const int tq = kv_attend_block_positions(group, span);
        const int nb = (T + tq - 1) / tq;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (par_worth(2.0 * T * span * nkv * group * hd / 32))
        for (int b = 0; b < nb; b++) {
            for (int kh = 0; kh < nkv; kh++) {
                const int t0 = b * tq, tc = T - t0 < tq ? T - t0 : tq;
                const int end = p0 + t0 + 1, start = y->window && end > y->window ? end - y->window : 0, n = end - start;
                float *sc = scratch(1, kv_attend_scratch(tc, group, hd, n));
                if (!sc) continue; /* out of memory: fwd_oom() fails the pass */
                const unsigned char *row = view + (size_t)(start - base) * stride;
                kk->attend_block(q + (size_t)t0 * qd + (size_t)kh * group * hd, qd, tc, group, hd, row + (size_t)kh * hd * es,
                                 row + ((size_t)kvd + kh * vh) * es, stride, n, y->window, scale,
                                 y->sinks ? y->sinks + kh * group : NULL, sc, att + (size_t)t0 * od + (size_t)kh * group * vh,
                                 od);
            }
        }
    } else {
        /* v heads narrower than q/k: one task per (position, KV head) through the row kernels */
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (par_worth(2.0 * T * (p0 + T) * nkv * group * hd / 32))
        for (int t = 0; t < T; t++) {
            for (int kh = 0; kh < nkv; kh++) {
                const int end = p0 + t + 1, start = y->window && end > y->window ? end - y->window : 0;
                const int n = end - start;
                float *sc = scratch(1, (size_t)n * group);
                if (!sc) continue; /* out of memory: fwd_oom() fails the pass */
                const size_t off = (size_t)t * qd + (size_t)kh * group * hd, ooff = (size_t)t * od + (size_t)kh * group * vh;
                const unsigned char *kc = view + (size_t)(start - base) * stride + (size_t)kh * hd * es;
                const unsigned char *vc = view + (size_t)(start - base) * stride + ((size_t)kvd + kh * vh) * es;
                kv_attend_split(kk, q + off, group, hd, vh, kc, vc, stride, n, scale, y->sinks ? y->sinks + kh * group : NULL, sc,
                                att + ooff);
            }
        }
    }
    free(lin);
    if (y->wg.rows) { /* the sigmoid output gate, computed into q (spent) */
        matmul(q, x, T, &y->wg, NULL);
        for (size_t i = 0; i < (size_t)T * qd; i++) att[i] *= 1.0f / (1.0f + expf(-q[i]));
    }
    matmul(out, att, T, &y->wo, y->bo);
    free(q);
    free(k);
    free(v);
    free(att);
}

static void release(void *self) {
    AttnGqa *p = self;
    free((void *)p->bq);
    free((void *)p->bk);
    free((void *)p->bv);
    free((void *)p->bo);
    free((void *)p->q_norm);
    free((void *)p->k_norm);
    free((void *)p->sinks);
    free(p->inv_freq);
}

const BlockKind block_attn_gqa = {ROLE_ATTN, "gqa", sizeof(AttnGqa), load, run, state, release, NULL};
