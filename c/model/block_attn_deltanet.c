/* Gated DeltaNet attention block (Qwen3.5/3.6 linear-attention layers): one projection gives
 * q|k|v, a short causal depthwise conv (kernel K, then SiLU) runs over it with a rolling state
 * of the last K-1 inputs; q and k are L2-normalised per key head, each key head serves
 * v_heads / k_heads consecutive value heads (key dim may differ from value dim); the decay
 * g = -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b) drive the delta rule
 * (delta_rule.h): chunked for prefill, recurrent for one token; then a gated RMSNorm per value
 * head, w * norm(o) * silu(z), and the output projection.
 * State (fixed per slot, f32 whatever --kv, not truncatable): the conv window [K-1][conv_dim],
 * oldest first, then S [v_heads][dk][dv]. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/blocks.h"
#include "kernels/delta_rule.h"
#include "util/fwd_alloc.h"
#include "kernels/ops.h"

typedef struct {
    int nk, nv, dk, dv, K, cd; /* cd: conv channels, 2 nk dk + nv dv */
    float eps;
    QMat wqkv, wz, wo;
    const float *wb, *wa, *conv, *A_log, *dt_bias, *norm; /* wb/wa [nv][H], conv [cd][K] */
} AttnGdn;

static int load(void *self, const JsonValue *spec, BlockLoader *L) {
    AttnGdn *p = self;
    const int H = L->a->hidden;
    p->nk = bl_int(L, spec, "k_heads", 1, 1024);
    p->nv = bl_int(L, spec, "v_heads", 1, 4096);
    p->dk = bl_int(L, spec, "k_head_dim", 1, 1024);
    p->dv = bl_int(L, spec, "v_head_dim", 1, 1024);
    p->K = bl_int(L, spec, "conv_kernel", 1, 64);
    p->eps = (float)bl_num(L, spec, "norm_eps", 1e-30, 1.0);
    if (L->failed) return -1;
    if (p->nv % p->nk) return bl_fail(L, "gated_deltanet: %d value heads are not a multiple of %d key heads", p->nv, p->nk);
    p->cd = 2 * p->nk * p->dk + p->nv * p->dv;
    const JsonValue *t = json_get(spec, "tensors");
    p->wqkv = bl_mat(L, t, "qkv", p->cd, H);
    p->wz = bl_mat(L, t, "z", p->nv * p->dv, H);
    p->wo = bl_mat(L, t, "out", H, p->nv * p->dv);
    p->wb = bl_vec(L, t, "b", p->nv, H, 0);
    p->wa = bl_vec(L, t, "a", p->nv, H, 0);
    p->conv = bl_vec(L, t, "conv", p->cd, p->K, 0);
    p->A_log = bl_vec(L, t, "A_log", 1, p->nv, 0);
    p->dt_bias = bl_vec(L, t, "dt_bias", 1, p->nv, 0);
    p->norm = bl_vec(L, t, "norm", 1, p->dv, 0);
    return L->failed ? -1 : 0;
}

static size_t conv_floats(const AttnGdn *p) { return (size_t)(p->K - 1) * p->cd; }
static size_t s_floats(const AttnGdn *p) { return (size_t)p->nv * p->dk * p->dv; }

static StateDesc state(const void *self, QType kv_type) {
    const AttnGdn *p = self;
    (void)kv_type;
    StateDesc s = {.fixed = sizeof(float) * (conv_floats(p) + s_floats(p)), .truncatable = 0};
    return s;
}

/* torch's softplus (beta 1, threshold 20) */
static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

static void l2norm(float *x, int n) {
    float s = 0;
    for (int i = 0; i < n; i++) s += x[i] * x[i];
    const float inv = 1.0f / sqrtf(s + 1e-6f);
    for (int i = 0; i < n; i++) x[i] *= inv;
}

static void run(const void *self, const BlockRun *r, const float *x, int T, float *out) {
    const AttnGdn *p = self;
    const int H = r->a->hidden, nk = p->nk, nv = p->nv, dk = p->dk, dv = p->dv, cd = p->cd;
    const int vd = nv * dv, rep = nv / nk;
    float *win = (float *)r->state->fixed, *S = win + conv_floats(p);
    float *qkv = fwd_malloc(sizeof(float) * (size_t)T * cd), *z = fwd_malloc(sizeof(float) * (size_t)T * vd);
    float *gb = fwd_malloc(sizeof(float) * (size_t)T * nv * 4), *o = fwd_malloc(sizeof(float) * (size_t)T * vd);
    /* every buffer before the state moves: a failed allocation leaves the state as it was */
    const size_t wf = delta_rule_work_floats(dk, dv);
    float *work = T > 1 ? fwd_malloc(sizeof(float) * wf * (size_t)nv) : NULL;
    if (!qkv || !z || !gb || !o || (T > 1 && !work)) goto done; /* fwd_oom() tells the caller */
    matmul(qkv, x, T, &p->wqkv, NULL);
    matmul(z, x, T, &p->wz, NULL);
    /* g, beta: [nv][T] each (one head's positions adjacent), from a.x, b.x: [T][nv] each */
    float *g = gb, *beta = gb + (size_t)T * nv, *ax = beta + (size_t)T * nv, *bx = ax + (size_t)T * nv;
    matmul_f32(ax, x, T, p->wa, nv, H);
    matmul_f32(bx, x, T, p->wb, nv, H);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nv; h++) {
            g[(size_t)h * T + t] = -expf(p->A_log[h]) * softplus(ax[(size_t)t * nv + h] + p->dt_bias[h]);
            beta[(size_t)h * T + t] = 1.0f / (1.0f + expf(-bx[(size_t)t * nv + h]));
        }
    if (short_conv_silu(p->conv, p->K, cd, win, qkv, T)) goto done;
    const float scale = 1.0f / sqrtf((float)dk);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < 2 * nk; h++) { /* q heads, then k heads */
            float *v = qkv + (size_t)t * cd + (size_t)h * dk;
            l2norm(v, dk);
            if (h < nk)
                for (int i = 0; i < dk; i++) v[i] *= scale;
        }
#pragma omp parallel for schedule(dynamic, 1)
    for (int h = 0; h < nv; h++) {
        const int kh = h / rep;
        DeltaIn in = {qkv + (size_t)kh * dk,
                      qkv + (size_t)(nk + kh) * dk,
                      qkv + (size_t)2 * nk * dk + (size_t)h * dv,
                      cd,
                      cd,
                      cd,
                      vd,
                      g + (size_t)h * T,
                      beta + (size_t)h * T,
                      T,
                      dk,
                      dv,
                      0};
        float *Sh = S + (size_t)h * dk * dv, *oh = o + (size_t)h * dv;
        if (T == 1 || forward_stepwise) delta_rule_recurrent(&in, Sh, oh);
        else delta_rule_chunked(&in, Sh, oh, work + (size_t)h * wf);
    }
    for (int t = 0; t < T; t++) /* gated RMSNorm per value head */
        for (int h = 0; h < nv; h++) {
            float *ov = o + (size_t)t * vd + (size_t)h * dv;
            const float *zv = z + (size_t)t * vd + (size_t)h * dv;
            float ss = 0;
            for (int i = 0; i < dv; i++) ss += ov[i] * ov[i];
            const float inv = 1.0f / sqrtf(ss / (float)dv + p->eps);
            for (int i = 0; i < dv; i++) ov[i] = p->norm[i] * (ov[i] * inv) * silu(zv[i]);
        }
    if (!fwd_oom()) matmul(out, o, T, &p->wo, NULL);
done:
    free(qkv);
    free(z);
    free(gb);
    free(o);
    free(work);
}

static void release(void *self) {
    AttnGdn *p = self;
    free((void *)p->wb);
    free((void *)p->wa);
    free((void *)p->conv);
    free((void *)p->A_log);
    free((void *)p->dt_bias);
    free((void *)p->norm);
}

const BlockKind block_attn_deltanet = {ROLE_ATTN, "gated_deltanet", sizeof(AttnGdn), load, run, state, release, NULL};
