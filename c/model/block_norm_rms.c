/* RMSNorm block: y = x / rms(x) * (w + weight_offset), per row. Qwen3.5/3.6 store w - 1 (their
 * norms compute x * (1 + w)): the spec's weight_offset 1 adds it back once, at load. */
#include <stdlib.h>

#include "model/blocks.h"
#include "kernels/ops.h"

typedef struct {
    const float *w;
    int n;
    float eps;
} NormRms;

static int load(void *self, const JsonValue *spec, BlockLoader *L) {
    NormRms *p = self;
    p->n = L->a->hidden;
    p->eps = (float)bl_num(L, spec, "eps", 1e-30, 1.0);
    p->w = bl_vec(L, json_get(spec, "tensors"), "weight", 1, p->n, 0);
    if (!L->failed && json_get(spec, "weight_offset")) {
        float off = (float)bl_num(L, spec, "weight_offset", -16.0, 16.0);
        for (int i = 0; i < p->n && !L->failed; i++) ((float *)p->w)[i] += off;
    }
    return L->failed ? -1 : 0;
}

static void run(const void *self, const BlockRun *r, const float *x, int T, float *out) {
    const NormRms *p = self;
    (void)r;
    for (int t = 0; t < T; t++) rmsnorm(out + (size_t)t * p->n, x + (size_t)t * p->n, p->w, p->n, p->eps);
}

static void release(void *self) { free((void *)((NormRms *)self)->w); }

const BlockKind block_norm_rms = {ROLE_NORM, "rmsnorm", sizeof(NormRms), load, run, NULL, release, NULL};
