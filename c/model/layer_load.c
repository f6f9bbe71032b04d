/* One layer from its manifest spec: its four blocks (and hyper-connections), checked against the
 * state the spec declares; what the layer keeps per KV slot; freeing it. The trunk's layers and
 * the MTP head's (mtp.c) load the same way. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/blocks.h"
#include "model/hyper_conn.h"
#include "model/model.h"

int layer_load(BlockLoader *L, Layer *y, const JsonValue *spec, int hc_model) {
    if (!spec || spec->type != JSON_OBJ) return bl_fail(L, "layer spec is not an object; re-run coli convert");
    const JsonValue *attn = json_get(spec, "attn"), *mlp = json_get(spec, "mlp");
    if ((!attn || attn->type == JSON_NULL) && (!mlp || mlp->type == JSON_NULL))
        return bl_fail(L, "layer spec has neither attn nor mlp");
    block_load(&y->attn_norm, ROLE_NORM, attn && attn->type != JSON_NULL ? json_get(spec, "attn_norm") : NULL, L);
    block_load(&y->attn, ROLE_ATTN, attn, L);
    block_load(&y->mlp_norm, ROLE_NORM, mlp && mlp->type != JSON_NULL ? json_get(spec, "mlp_norm") : NULL, L);
    block_load(&y->mlp, ROLE_MLP, mlp, L);
    if (!L->failed && ((y->attn.kind && !y->attn_norm.kind) || (y->mlp.kind && !y->mlp_norm.kind)))
        return bl_fail(L, "a block has no norm before it (attn_norm / mlp_norm)");
    if (!L->failed && hc_model) /* hyper-connection streams: both halves mix them */
        for (int h = 0; h < 2 && !L->failed; h++) y->hc[h] = hc_load(L, json_get(spec, h ? "mlp_hc" : "attn_hc"), 0);
    if (!L->failed && !hc_model && (json_get(spec, "attn_hc") || json_get(spec, "mlp_hc")))
        return bl_fail(L, "layer names hyper-connections but the trunk has no hc_head; re-run coli convert");
    /* The planner sizes memory from the state the spec declares: it must be what the block keeps. */
    const JsonValue *decl = attn ? json_get(attn, "state") : NULL;
    if (!L->failed && decl && y->attn.kind) {
        StateDesc s = y->attn.kind->state ? y->attn.kind->state(y->attn.self, QT_F32) : (StateDesc){.truncatable = 1};
        long long values = json_get_int(decl, "kv_values_per_pos", -1), fixed = json_get_int(decl, "fixed_bytes", -1);
        int trunc = json_get_bool(decl, "truncatable", -1), window = (int)json_get_int(decl, "window", 0);
        /* values in the cache's type, plus any kept as f32 whatever --kv (DSA indexer keys) */
        long long f32v = json_get_int(decl, "f32_values_per_pos", 0);
        size_t half = y->attn.kind->state ? y->attn.kind->state(y->attn.self, QT_F16).per_pos : 0;
        if (values + f32v != (long long)(s.per_pos / 4) || (size_t)(2 * values + 4 * f32v) != half ||
            fixed != (long long)s.fixed || trunc != s.truncatable || window != s.window)
            return bl_fail(L,
                           "attn.state declares %lld values per position (%lld of them f32), %lld fixed bytes, "
                           "truncatable %d, window %d; the %s block keeps %zu bytes (f32 cache), %zu bytes (f16), %zu, %d, %d; "
                           "re-run coli convert",
                           values + f32v, f32v, fixed, trunc, window, y->attn.kind->name, s.per_pos, half, s.fixed, s.truncatable,
                           s.window);
    }
    return L->failed ? -1 : 0;
}

StateDesc layer_state(const Layer *y, QType kv_type) {
    StateDesc s = {.truncatable = 1};
    const Block *bs[4] = {&y->attn_norm, &y->attn, &y->mlp_norm, &y->mlp};
    for (int i = 0; i < 4; i++) {
        if (!bs[i]->kind || !bs[i]->kind->state) continue;
        StateDesc b = bs[i]->kind->state(bs[i]->self, kv_type);
        s.per_pos += b.per_pos;
        s.fixed += b.fixed;
        s.f32_tail += b.f32_tail;
        if (b.settle > s.settle) s.settle = b.settle;
        s.truncatable &= b.truncatable;
        if (b.per_pos) s.window = b.window; /* one block per layer keeps positions */
    }
    return s;
}

void layer_free(Layer *y) {
    block_free(&y->attn_norm);
    block_free(&y->attn);
    block_free(&y->mlp_norm);
    block_free(&y->mlp);
    hc_free(y->hc[0]);
    hc_free(y->hc[1]);
    memset(y, 0, sizeof *y);
}
