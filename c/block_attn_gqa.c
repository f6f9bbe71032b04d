/* GQA attention block: grouped K/V heads, optional q/k/v/o biases, optional per-head q/k
 * RMSNorm (per head, or over the whole projection as OLMoE does), optional clip_qkv (q/k/v
 * clamped to [-c, c] after the norms, OLMoE), an optional sliding window (each query sees its
 * last `window` positions, Mixtral; the cache still keeps every position), NeoX-style (rotate-half) RoPE over the first rope.dim dims of each head.
 * State: per position, K then V for every KV head, in the cache's element type. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fwd_alloc.h"
#include "blocks.h"
#include "kv_kernels.h"
#include "ops.h"

typedef struct {
    int nh, nkv, hd, rot, qk_full; /* qk_full: q/k norms span all heads */
    int window;                     /* positions each query attends to, 0 = all */
    float qk_eps, clip;             /* clip: 0 = none */
    QMat wq, wk, wv, wo;
    const float *bq, *bk, *bv, *bo, *q_norm, *k_norm;
} AttnGqa;

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
    if (p->rot != L->a->rotary_dim) return bl_fail(L, "gqa: rope.dim %d differs from the model's RoPE table (%d)", p->rot, L->a->rotary_dim);
    if (json_get(spec, "window")) p->window = bl_int(L, spec, "window", 0, 1 << 30);
    if (json_get_bool(spec, "sinks", 0)) return bl_fail(L, "gqa: attention sinks are not implemented yet");
    const char *qkn = json_get_str(spec, "qk_norm");
    if (qkn && strcmp(qkn, "none") && strcmp(qkn, "per_head") && strcmp(qkn, "full")) return bl_fail(L, "gqa: qk_norm '%s' is not implemented", qkn);
    const int qd = p->nh * p->hd, kvd = p->nkv * p->hd;
    const JsonValue *t = json_get(spec, "tensors");
    p->wq = bl_mat(L, t, "q", qd, H);
    p->wk = bl_mat(L, t, "k", kvd, H);
    p->wv = bl_mat(L, t, "v", kvd, H);
    p->wo = bl_mat(L, t, "o", H, qd);
    p->bq = bl_vec(L, t, "q_bias", 1, qd, 1);
    p->bk = bl_vec(L, t, "k_bias", 1, kvd, 1);
    p->bv = bl_vec(L, t, "v_bias", 1, kvd, 1);
    p->bo = bl_vec(L, t, "o_bias", 1, H, 1);
    if (qkn && !strcmp(qkn, "per_head")) {
        p->qk_eps = (float)bl_num(L, spec, "qk_norm_eps", 1e-30, 1.0);
        p->q_norm = bl_vec(L, t, "q_norm", 1, p->hd, 0);
        p->k_norm = bl_vec(L, t, "k_norm", 1, p->hd, 0);
    } else if (qkn && !strcmp(qkn, "full")) {
        p->qk_full = 1;
        p->qk_eps = (float)bl_num(L, spec, "qk_norm_eps", 1e-30, 1.0);
        p->q_norm = bl_vec(L, t, "q_norm", 1, qd, 0);
        p->k_norm = bl_vec(L, t, "k_norm", 1, kvd, 0);
    }
    if (json_get(spec, "clip_qkv")) p->clip = (float)bl_num(L, spec, "clip_qkv", 0.0, 1e30);
    return L->failed ? -1 : 0;
}

static StateDesc state(const void *self, QType kv_type) {
    const AttnGqa *p = self;
    StateDesc s = {.per_pos = 2 * (size_t)p->nkv * p->hd * kv_elem_size(kv_type), .truncatable = 1};
    return s;
}

/* Rotates the first rot dims of one head in place, HF rotate_half layout. */
static void rope(float *v, const Arch *a, int rot, int pos) {
    int half = rot / 2;
    for (int i = 0; i < half; i++) {
        float ang = a->inv_freq[i] * (float)pos; /* float product, as transformers computes it */
        float c = (float)cos((double)ang) * a->rope_scale, s = (float)sin((double)ang) * a->rope_scale;
        float x1 = v[i], x2 = v[i + half];
        v[i] = x1 * c - x2 * s;
        v[i + half] = x2 * c + x1 * s;
    }
}

static void clamp_all(float *v, size_t n, float c) {
    for (size_t i = 0; i < n; i++) v[i] = v[i] > c ? c : v[i] < -c ? -c : v[i];
}

static void run(const void *self, const BlockRun *r, const float *x, int T, float *out) {
    const AttnGqa *y = self;
    const Arch *a = r->a;
    const int hd = y->hd, nh = y->nh, nkv = y->nkv, qd = nh * hd, kvd = nkv * hd;
    const int p0 = r->p0, group = nh / nkv;
    float *q = fwd_malloc(sizeof(float) * (size_t)T * qd);
    float *k = fwd_malloc(sizeof(float) * (size_t)T * kvd);
    float *v = fwd_malloc(sizeof(float) * (size_t)T * kvd);
    float *att = fwd_malloc(sizeof(float) * (size_t)T * qd);
    if (!q || !k || !v || !att) { free(q); free(k); free(v); free(att); return; } /* fwd_oom() tells the caller */
    matmul(q, x, T, &y->wq, y->bq);
    matmul(k, x, T, &y->wk, y->bk);
    matmul(v, x, T, &y->wv, y->bv);
    if (y->qk_full)
        for (int t = 0; t < T; t++) {
            rmsnorm(q + (size_t)t * qd, q + (size_t)t * qd, y->q_norm, qd, y->qk_eps);
            rmsnorm(k + (size_t)t * kvd, k + (size_t)t * kvd, y->k_norm, kvd, y->qk_eps);
        }
    if (y->clip > 0) {
        clamp_all(q, (size_t)T * qd, y->clip);
        clamp_all(k, (size_t)T * kvd, y->clip);
        clamp_all(v, (size_t)T * kvd, y->clip);
    }
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < nh; h++) {
            float *qh = q + (size_t)t * qd + h * hd;
            if (y->q_norm && !y->qk_full) rmsnorm(qh, qh, y->q_norm, hd, y->qk_eps);
            rope(qh, a, y->rot, p0 + t);
        }
        for (int h = 0; h < nkv; h++) {
            float *kh = k + (size_t)t * kvd + h * hd;
            if (y->k_norm && !y->qk_full) rmsnorm(kh, kh, y->k_norm, hd, y->qk_eps);
            rope(kh, a, y->rot, p0 + t);
        }
    }
    /* position j holds K_j [kvd] then V_j [kvd] */
    const size_t es = kv_elem_size(r->kv_type), stride = 2 * (size_t)kvd * es;
    unsigned char *cache = r->state->pos;
    for (int t = 0; t < T; t++) {
        unsigned char *dst = cache + (size_t)(p0 + t) * stride;
        kv_store_row(r->kv_type, k + (size_t)t * kvd, kvd, dst);
        kv_store_row(r->kv_type, v + (size_t)t * kvd, kvd, dst + (size_t)kvd * es);
    }
    /* One task per (position, KV head): the group's query heads read each K/V row once. */
    const KvKernels *kk = kv_kernels(r->kv_type);
    const float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (par_worth(2.0 * T * (p0 + T) * nkv * group * hd / 32))
    for (int t = 0; t < T; t++) {
        for (int kh = 0; kh < nkv; kh++) {
            const int end = p0 + t + 1, start = y->window && end > y->window ? end - y->window : 0;
            const int n = end - start;
            float *sc = scratch(1, (size_t)n * group);
            if (!sc) continue; /* out of memory: fwd_oom() fails the pass */
            const size_t off = (size_t)t * qd + (size_t)kh * group * hd;
            const unsigned char *kc = cache + (size_t)start * stride + (size_t)kh * hd * es;
            const unsigned char *vc = cache + (size_t)start * stride + ((size_t)kvd + kh * hd) * es;
            kk->attend(q + off, group, hd, kc, vc, stride, n, scale, sc, att + off);
        }
    }
    matmul(out, att, T, &y->wo, y->bo);
    free(q); free(k); free(v); free(att);
}

static void release(void *self) {
    AttnGqa *p = self;
    free((void *)p->bq); free((void *)p->bk); free((void *)p->bv); free((void *)p->bo);
    free((void *)p->q_norm); free((void *)p->k_norm);
}

const BlockKind block_attn_gqa = {ROLE_ATTN, "gqa", sizeof(AttnGqa), load, run, state, release, NULL};
