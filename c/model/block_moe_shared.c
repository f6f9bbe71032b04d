/* MoE with shared experts (DeepSeek-V3, GLM-4.5): the routed-experts block ("moe", whatever it
 * streams) plus an always-on SwiGLU MLP of the dense trunk, summed: out = moe(x) + shared(x).
 * The spec is a "moe" spec with a "shared" object {width, tensors: gate/up/down}, and optionally
 * shared.gate {tensors: {weight: [1, hidden]}}: a per-position sigmoid(w . x) scaling the shared
 * output (Qwen2-MoE's shared_expert_gate). */
#include <math.h>
#include <stdlib.h>

#include "experts/expert_store.h"
#include "util/fwd_alloc.h"
#include "model/layers.h"
#include "kernels/ops.h"

typedef struct {
    Block moe;
    Mlp shared;
    int width;
    const float *gate; /* [hidden] or NULL: ungated */
} MoeShared;

extern const BlockKind block_moe;

static int load(void *self, const JsonValue *spec, BlockLoader *L) {
    MoeShared *p = self;
    const BlockKind *k = &block_moe; /* the routed half is a moe block */
    const JsonValue *sh = bl_obj(L, spec, "shared");
    if (L->failed) return -1;
    p->width = bl_int(L, sh, "width", 1, 1 << 20);
    if (L->failed) return -1;
    if (json_get(sh, "act") && mlp_act_load(L, sh, &p->shared)) return -1; /* DeepSeek-V4: clamped */
    mlp_load(L, &p->shared, json_get(sh, "tensors"), -1, L->a->hidden, p->width, 0);
    const JsonValue *g = json_get(sh, "gate");
    if (g) p->gate = bl_vec(L, json_get(g, "tensors"), "weight", 1, L->a->hidden, 0);
    if (L->failed) return -1;
    if (!(p->moe.self = calloc(1, k->size))) return bl_fail(L, "out of memory");
    p->moe.kind = k;
    return k->load(p->moe.self, spec, L);
}

static void run(const void *self, const BlockRun *r, const float *x, int T, float *out) {
    const MoeShared *p = self;
    const size_t n = (size_t)T * r->a->hidden;
    float *s = fwd_malloc(sizeof(float) * n);
    if (!s) return; /* fwd_oom() tells the caller */
    p->moe.kind->run(p->moe.self, r, x, T, out);
    mlp_swiglu(&p->shared, x, T, p->width, s);
    const int H = r->a->hidden;
    for (int t = 0; t < T; t++) {
        float g = 1.0f;
        if (p->gate) {
            float z = 0;
            for (int i = 0; i < H; i++) z += p->gate[i] * x[(size_t)t * H + i];
            g = 1.0f / (1.0f + expf(-z));
        }
        for (int i = 0; i < H; i++) out[(size_t)t * H + i] += g * s[(size_t)t * H + i];
    }
    free(s);
}

static StateDesc state(const void *self, QType kv_type) {
    const MoeShared *p = self;
    return p->moe.kind->state ? p->moe.kind->state(p->moe.self, kv_type) : (StateDesc){.truncatable = 1};
}

static void release(void *self) {
    MoeShared *p = self;
    mlp_release(&p->shared);
    free((void *)p->gate);
    block_free(&p->moe);
}

/* The routed half streams like any moe block; the shared experts are dense trunk. */
static ExpertLayer *experts(void *self) { return moe_expert_layer(&((MoeShared *)self)->moe); }

const BlockKind block_moe_shared = {ROLE_MLP, "moe_shared", sizeof(MoeShared), load, run, state, release, experts};
