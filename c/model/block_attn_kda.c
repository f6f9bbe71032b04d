/* Kimi delta attention block (Kimi-Linear's linear layers): q, k, v projections (heads of one
 * size), a short causal depthwise conv (kernel K, then SiLU) over q|k|v with a rolling state,
 * q and k L2-normalised per head; a decay per key channel from the low-rank forget gate,
 * g = -exp(A_log[head]) softplus(f_b(f_a(x)) + dt_bias), beta = sigmoid(b . x), the delta rule
 * with that decay (kda_* in delta_rule.h: chunked for prefill, recurrent for one token); then
 * per head an RMSNorm gated by the low-rank sigmoid gate, w * norm(o) * sigmoid(g_b(g_a(x))),
 * and the output projection.
 * State (fixed per slot, f32, not truncatable): the conv window [K-1][3 heads hd], then S
 * [heads][hd][hd]. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/blocks.h"
#include "kernels/delta_rule.h"
#include "util/fwd_alloc.h"
#include "kernels/ops.h"

typedef struct {
    int nh, hd, K, qd; /* qd = nh hd */
    float eps;
    QMat wq, wk, wv, wo;
    const float *conv, *fa, *fb, *dt_bias, *A_log, *wb, *ga, *gb, *norm;
} AttnKda;

static int load(void *self, const JsonValue *spec, BlockLoader *L) {
    AttnKda *p = self;
    const int H = L->a->hidden;
    p->nh = bl_int(L, spec, "heads", 1, 4096);
    p->hd = bl_int(L, spec, "head_dim", 1, 1024);
    p->K = bl_int(L, spec, "conv_kernel", 1, 64);
    p->eps = (float)bl_num(L, spec, "norm_eps", 1e-30, 1.0);
    if (L->failed) return -1;
    const int qd = p->qd = p->nh * p->hd, hd = p->hd;
    const JsonValue *t = json_get(spec, "tensors");
    p->wq = bl_mat(L, t, "q", qd, H);
    p->wk = bl_mat(L, t, "k", qd, H);
    p->wv = bl_mat(L, t, "v", qd, H);
    p->wo = bl_mat(L, t, "o", H, qd);
    p->conv = bl_vec(L, t, "conv", 3 * qd, p->K, 0);
    p->fa = bl_vec(L, t, "f_a", hd, H, 0);
    p->fb = bl_vec(L, t, "f_b", qd, hd, 0);
    p->dt_bias = bl_vec(L, t, "dt_bias", 1, qd, 0);
    p->A_log = bl_vec(L, t, "A_log", 1, p->nh, 0);
    p->wb = bl_vec(L, t, "b", p->nh, H, 0);
    p->ga = bl_vec(L, t, "g_a", hd, H, 0);
    p->gb = bl_vec(L, t, "g_b", qd, hd, 0);
    p->norm = bl_vec(L, t, "norm", 1, hd, 0);
    return L->failed ? -1 : 0;
}

static size_t conv_floats(const AttnKda *p) { return (size_t)(p->K - 1) * 3 * p->qd; }

static StateDesc state(const void *self, QType kv_type) {
    const AttnKda *p = self;
    (void)kv_type;
    StateDesc s = {.fixed = sizeof(float) * (conv_floats(p) + (size_t)p->qd * p->hd), .truncatable = 0};
    return s;
}

static float softplus(float x) { return x > 20.0f ? x : logf(1.0f + expf(x)); } /* as the reference writes it */

/* y[T][rows] = (x[T][cols] . A^T) . B^T for the low-rank gates: A [mid][cols], B [rows][mid] */
static void low_rank(const float *x, int T, int cols, const float *A, int mid, const float *B, int rows, float *tmp, float *y) {
    matmul_f32(tmp, x, T, A, mid, cols);
    matmul_f32(y, tmp, T, B, rows, mid);
}

static void run(const void *self, const BlockRun *r, const float *x, int T, float *out) {
    const AttnKda *p = self;
    const int H = r->a->hidden, nh = p->nh, hd = p->hd, qd = p->qd, cd = 3 * qd;
    float *win = (float *)r->state->fixed, *S = win + conv_floats(p);
    float *qkv = fwd_malloc(sizeof(float) * (size_t)T * cd), *g = fwd_malloc(sizeof(float) * (size_t)T * qd);
    float *gate = fwd_malloc(sizeof(float) * (size_t)T * qd), *tmp = fwd_malloc(sizeof(float) * (size_t)T * hd);
    float *beta = fwd_malloc(sizeof(float) * (size_t)T * nh), *o = fwd_malloc(sizeof(float) * (size_t)T * qd);
    float *bt = fwd_malloc(sizeof(float) * (size_t)T * nh), *q = fwd_malloc(sizeof(float) * (size_t)T * qd);
    /* every buffer before the state moves: a failed allocation leaves the state as it was */
    const size_t wf = delta_rule_work_floats(hd, hd);
    float *work = T > 1 ? fwd_malloc(sizeof(float) * wf * (size_t)nh) : NULL;
    if (!qkv || !g || !gate || !tmp || !beta || !o || !bt || !q || (T > 1 && !work)) goto done; /* fwd_oom() tells the caller */
    matmul(q, x, T, &p->wq, NULL); /* q|k|v side by side per position, the conv's channel order */
    for (int t = 0; t < T; t++) memcpy(qkv + (size_t)t * cd, q + (size_t)t * qd, sizeof(float) * qd);
    matmul(q, x, T, &p->wk, NULL);
    for (int t = 0; t < T; t++) memcpy(qkv + (size_t)t * cd + qd, q + (size_t)t * qd, sizeof(float) * qd);
    matmul(q, x, T, &p->wv, NULL);
    for (int t = 0; t < T; t++) memcpy(qkv + (size_t)t * cd + 2 * qd, q + (size_t)t * qd, sizeof(float) * qd);
    low_rank(x, T, H, p->fa, hd, p->fb, qd, tmp, g);
    low_rank(x, T, H, p->ga, hd, p->gb, qd, tmp, gate);
    matmul_f32(beta, x, T, p->wb, nh, H);
    for (int t = 0; t < T; t++) {
        for (int c = 0; c < qd; c++) {
            float *gc = g + (size_t)t * qd + c;
            *gc = -expf(p->A_log[c / hd]) * softplus(*gc + p->dt_bias[c]);
        }
        for (int h = 0; h < nh; h++) bt[(size_t)h * T + t] = 1.0f / (1.0f + expf(-beta[(size_t)t * nh + h])); /* [nh][T] */
    }
    if (short_conv_silu(p->conv, p->K, cd, win, qkv, T)) goto done;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < 2 * nh; h++) { /* q heads, then k heads: x / sqrt(|x|^2 + 1e-6) */
            float *v = qkv + (size_t)t * cd + (size_t)h * hd, s = 0;
            for (int i = 0; i < hd; i++) s += v[i] * v[i];
            const float n = sqrtf(s + 1e-6f), f = h < nh ? scale : 1.0f;
            for (int i = 0; i < hd; i++) v[i] = v[i] / n * f;
        }
#pragma omp parallel for schedule(dynamic, 1)
    for (int h = 0; h < nh; h++) {
        DeltaIn in = {qkv + (size_t)h * hd,
                      qkv + (size_t)(nh + h) * hd,
                      qkv + (size_t)(2 * nh + h) * hd,
                      cd,
                      cd,
                      cd,
                      qd,
                      g + (size_t)h * hd,
                      bt + (size_t)h * T,
                      T,
                      hd,
                      hd,
                      qd};
        float *Sh = S + (size_t)h * hd * hd, *oh = o + (size_t)h * hd;
        if (T == 1 || forward_stepwise) kda_recurrent(&in, Sh, oh);
        else kda_chunked(&in, Sh, oh, work + (size_t)h * wf);
    }
    for (int t = 0; t < T; t++) /* gated RMSNorm per head */
        for (int h = 0; h < nh; h++) {
            float *ov = o + (size_t)t * qd + (size_t)h * hd;
            const float *gv = gate + (size_t)t * qd + (size_t)h * hd;
            float ss = 0;
            for (int i = 0; i < hd; i++) ss += ov[i] * ov[i];
            const float inv = 1.0f / sqrtf(ss / (float)hd + p->eps);
            for (int i = 0; i < hd; i++) ov[i] = p->norm[i] * (ov[i] * inv) * (1.0f / (1.0f + expf(-gv[i])));
        }
    if (!fwd_oom()) matmul(out, o, T, &p->wo, NULL);
done:
    free(qkv);
    free(g);
    free(gate);
    free(tmp);
    free(beta);
    free(o);
    free(bt);
    free(q);
    free(work);
}

static void release(void *self) {
    AttnKda *p = self;
    free((void *)p->conv);
    free((void *)p->fa);
    free((void *)p->fb);
    free((void *)p->dt_bias);
    free((void *)p->A_log);
    free((void *)p->wb);
    free((void *)p->ga);
    free((void *)p->gb);
    free((void *)p->norm);
}

const BlockKind block_attn_kda = {ROLE_ATTN, "kda", sizeof(AttnKda), load, run, state, release, NULL};
