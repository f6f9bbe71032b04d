/* Dense SwiGLU MLP block, and the SwiGLU MLP every routed expert reuses. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fwd_alloc.h"
#include "layers.h"
#include "ops.h"

void mlp_swiglu(const Mlp *p, const float *x, int T, int inter, float *out) {
    float *g = fwd_malloc(sizeof(float) * (size_t)T * inter), *u = fwd_malloc(sizeof(float) * (size_t)T * inter);
    if (!g || !u) { free(g); free(u); return; } /* fwd_oom() tells the caller */
    matmul(g, x, T, &p->gate, p->gate_b);
    matmul(u, x, T, &p->up, p->up_b);
    for (size_t i = 0; i < (size_t)T * inter; i++) g[i] = silu(g[i]) * u[i];
    matmul(out, g, T, &p->down, p->down_b);
    free(g);
    free(u);
}

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
        if (!name) { bl_fail(L, "MLP names no usable '%s' tensor%s", keys[i], e >= 0 ? " template ({e})" : ""); return; }
        *mats[i] = bl_mat_named(L, name, rows, cols);
        if (bias && e < 0) *biases[i] = bl_vec(L, tensors, bias_keys[i], 1, rows, 1);
    }
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
    const char *act = bl_str(L, spec, "act");
    if (L->failed) return -1;
    if (strcmp(act, "silu")) return bl_fail(L, "dense MLP: activation '%s' is not implemented (silu)", act);
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
