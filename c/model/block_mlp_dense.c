/* Dense SwiGLU MLP block, and loading the SwiGLU MLP every routed expert reuses. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/fwd_alloc.h"
#include "model/layers.h"
#include "kernels/ops.h"

/* A "{e}" in a template becomes the expert index. */
static const char *expand(const JsonValue *tensors, const char *key, int e, char *buf, size_t n) {
    const char *t = json_get_str(tensors, key);
    if (!t || e < 0) return t;
    const char *at = strstr(t, "{e}");
    if (!at) return NULL;
    snprintf(buf, n, "%.*s%d%s", (int)(at - t), t, e, at + 3);
    return buf;
}

void mlp_load(BlockLoader *L, Mlp *m, const JsonValue *tensors, int e, int hidden, int inter, int bias) {
    static const char *const keys[3] = {"gate", "up", "down"};
    static const char *const bias_keys[3] = {"gate_bias", "up_bias", "down_bias"};
    QMat *mats[3] = {&m->gate, &m->up, &m->down};
    const float **biases[3] = {&m->gate_b, &m->up_b, &m->down_b};
    for (int i = 0; i < 3 && !L->failed; i++) {
        char buf[512];
        const char *name = expand(tensors, keys[i], e, buf, sizeof buf);
        int rows = i == 2 ? hidden : inter, cols = i == 2 ? inter : hidden;
        if (!name) {
            bl_fail(L, "MLP names no usable '%s' tensor%s", keys[i], e >= 0 ? " template ({e})" : "");
            return;
        }
        *mats[i] = bl_mat_named(L, name, rows, cols);
        const char *bname = bias ? expand(tensors, bias_keys[i], e, buf, sizeof buf) : NULL;
        if (bname) *biases[i] = bl_vec_named(L, bname, 1, rows);
    }
}

int mlp_act_load(BlockLoader *L, const JsonValue *spec, Mlp *m) {
    const char *act = bl_str(L, spec, "act");
    if (L->failed) return -1;
    if (!strcmp(act, "silu")) {
        m->act = ACT_SILU;
        return 0;
    }
    if (!strcmp(act, "silu_clamp")) {
        m->act = ACT_SILU_CLAMP;
        m->limit = (float)bl_num(L, spec, "swiglu_limit", 1e-6, 1e30);
        return L->failed ? -1 : 0;
    }
    if (strcmp(act, "swiglu_clamp"))
        return bl_fail(L, "MLP activation '%s' is not implemented (silu, swiglu_clamp, silu_clamp)", act);
    m->act = ACT_SWIGLU_CLAMP;
    m->alpha = (float)bl_num(L, spec, "swiglu_alpha", 1e-6, 1e6);
    m->limit = (float)bl_num(L, spec, "swiglu_limit", 1e-6, 1e30);
    return L->failed ? -1 : 0;
}

void mlp_release(Mlp *m) {
    free((void *)m->gate_b);
    free((void *)m->up_b);
    free((void *)m->down_b);
}

typedef struct {
    Mlp mlp;
    int width;
} MlpDense;

static int load(void *self, const JsonValue *spec, BlockLoader *L) {
    MlpDense *p = self;
    p->width = bl_int(L, spec, "width", 1, 1 << 20);
    if (L->failed || mlp_act_load(L, spec, &p->mlp)) return -1;
    mlp_load(L, &p->mlp, json_get(spec, "tensors"), -1, L->a->hidden, p->width, 1);
    return L->failed ? -1 : 0;
}

static void run(const void *self, const BlockRun *r, const float *x, int T, float *out) {
    const MlpDense *p = self;
    (void)r;
    mlp_swiglu(&p->mlp, x, T, p->width, out);
}

static void release(void *self) { mlp_release(&((MlpDense *)self)->mlp); }

const BlockKind block_mlp_dense = {ROLE_MLP, "dense", sizeof(MlpDense), load, run, NULL, release, NULL};
