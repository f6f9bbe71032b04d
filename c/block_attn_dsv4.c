/* DeepSeek-V4 attention: low-rank queries (q_a, RMSNorm, q_b, then each head RMS-normalized
 * without a weight), one shared K=V head (kv, RMSNorm), interleaved RoPE on the trailing rope.dim
 * dims of every head (pairs (v0, v1), (v2, v3)... rotated in place), a sliding window with
 * learned sinks, the rotation undone on the attention output (so each value contributes by
 * relative position), then the grouped low-rank output projection: o_groups groups of heads,
 * each projected by its own o_lora_rank rows of o_a, mixed by o_b.
 * State: per position the one K=V row (head_dim values); the slot keeps only the window (a ring,
 * position j in slot j % cap). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "fwd_alloc.h"
#include "kv_kernels.h"
#include "ops.h"

typedef struct {
    int nh, hd, ql, rot, groups, rank, window;
    float eps, rope_scale;
    float *inv_freq; /* [rot / 2] */
    QMat q_a, q_b, kv, o_a, o_b;
    const float *q_a_norm, *kv_norm, *sinks;
} AttnDsv4;

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
    if (strcmp(style, "interleaved_tail")) return bl_fail(L, "dsv4: rope style '%s' is not implemented (interleaved_tail)", style);
    if (p->rot % 2 || !inv || inv->type != JSON_ARR || (int)inv->len != p->rot / 2)
        return bl_fail(L, "dsv4: rope.dim must be even and rope.inv_freq list rope.dim/2 = %d numbers", p->rot / 2);
    if (json_get(spec, "compress") && json_get(spec, "compress")->type != JSON_NULL)
        return bl_fail(L, "dsv4: compressed attention layers are not implemented by this engine yet");
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
    return L->failed ? -1 : 0;
}

static StateDesc state(const void *self, QType kv_type) {
    const AttnDsv4 *p = self;
    return (StateDesc){.per_pos = (size_t)p->hd * kv_elem_size(kv_type), .truncatable = 1, .window = p->window};
}

/* Rotates the trailing rot dims of v[hd] for position pos, pairs in place; sign -1 undoes it. */
static void rope_tail(const AttnDsv4 *p, float *v, int pos, float sign) {
    float *r = v + p->hd - p->rot;
    for (int i = 0; i < p->rot / 2; i++) {
        float ang = p->inv_freq[i] * (float)pos; /* float product, as transformers computes it */
        float c = (float)cos((double)ang) * p->rope_scale, s = sign * (float)sin((double)ang) * p->rope_scale;
        float x0 = r[2 * i], x1 = r[2 * i + 1];
        r[2 * i] = x0 * c - x1 * s;
        r[2 * i + 1] = x1 * c + x0 * s;
    }
}

static void unit_rms(float *v, int n, float eps) {
    float ss = 0;
    for (int i = 0; i < n; i++) ss += v[i] * v[i];
    const float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) v[i] *= r;
}

static void run(const void *self, const BlockRun *r, const float *x, int T, float *out) {
    const AttnDsv4 *y = self;
    const int hd = y->hd, nh = y->nh, qd = nh * hd, G = y->groups, R = y->rank, gin = qd / G;
    const int p0 = r->p0;
    float *qa = fwd_malloc(sizeof(float) * (size_t)T * y->ql), *q = fwd_malloc(sizeof(float) * (size_t)T * qd);
    float *kv = fwd_malloc(sizeof(float) * (size_t)T * hd), *att = fwd_malloc(sizeof(float) * (size_t)T * qd);
    float *gx = fwd_malloc(sizeof(float) * (size_t)T * gin), *gy = fwd_malloc(sizeof(float) * (size_t)T * R);
    float *oa = fwd_malloc(sizeof(float) * (size_t)T * G * R);
    const size_t es = kv_elem_size(r->kv_type), stride = (size_t)hd * es;
    const int cap = r->state->cap, base = p0 - (y->window - 1) > 0 ? p0 - (y->window - 1) : 0;
    /* the window before p0 then this batch, in order (a batch must not overwrite ring rows its own
     * earlier queries still read); the ring gets the batch afterwards */
    unsigned char *view = fwd_malloc(stride * (size_t)(p0 - base + T)), *cache = r->state->pos;
    if (!qa || !q || !kv || !att || !gx || !gy || !oa || !view) goto done; /* fwd_oom() tells the caller */
    matmul(qa, x, T, &y->q_a, NULL);
    for (int t = 0; t < T; t++) rmsnorm(qa + (size_t)t * y->ql, qa + (size_t)t * y->ql, y->q_a_norm, y->ql, y->eps);
    matmul(q, qa, T, &y->q_b, NULL);
    matmul(kv, x, T, &y->kv, NULL);
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < nh; h++) {
            float *qh = q + (size_t)t * qd + (size_t)h * hd;
            unit_rms(qh, hd, y->eps);
            rope_tail(y, qh, p0 + t, 1.0f);
        }
        float *k = kv + (size_t)t * hd;
        rmsnorm(k, k, y->kv_norm, hd, y->eps);
        rope_tail(y, k, p0 + t, 1.0f);
    }
    for (int j = base; j < p0; j++) memcpy(view + (size_t)(j - base) * stride, cache + (size_t)(j % cap) * stride, stride);
    for (int t = 0; t < T; t++) kv_store_row(r->kv_type, kv + (size_t)t * hd, hd, view + (size_t)(p0 + t - base) * stride);
    for (int t = 0; t < T; t++)
        memcpy(cache + (size_t)((p0 + t) % cap) * stride, view + (size_t)(p0 + t - base) * stride, stride);
    const KvKernels *kk = kv_kernels(r->kv_type);
    const float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel for schedule(dynamic, 1) if (par_worth(2.0 * T * y->window * nh * hd / 32))
    for (int t = 0; t < T; t++) {
        const int end = p0 + t + 1, start = end > y->window ? end - y->window : 0, n = end - start;
        float *sc = scratch(1, (size_t)n * nh);
        if (!sc) continue; /* out of memory: fwd_oom() fails the pass */
        const unsigned char *kc = view + (size_t)(start - base) * stride;
        kk->attend(q + (size_t)t * qd, nh, hd, kc, kc, stride, n, scale, y->sinks, sc, att + (size_t)t * qd);
        for (int h = 0; h < nh; h++) rope_tail(y, att + (size_t)t * qd + (size_t)h * hd, p0 + t, -1.0f);
    }
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
    free(qa); free(q); free(kv); free(att); free(gx); free(gy); free(oa); free(view);
}

static void release(void *self) {
    AttnDsv4 *p = self;
    free(p->inv_freq);
    free((void *)p->q_a_norm); free((void *)p->kv_norm); free((void *)p->sinks);
}

const BlockKind block_attn_dsv4 = {ROLE_ATTN, "dsv4", sizeof(AttnDsv4), load, run, state, release, NULL};
