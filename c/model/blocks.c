/* The block table: every block kind by role and name, and loading a block from its spec. */
#include "model/blocks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const BlockKind block_norm_rms, block_attn_gqa, block_mlp_dense, block_moe;
extern const BlockKind block_moe_shared, block_attn_mla, block_attn_deltanet, block_attn_kda;
extern const BlockKind block_attn_dsv4;

#define MAX_KINDS 32
/* One row per block kind. */
static const BlockKind *kinds[MAX_KINDS] = {
    &block_norm_rms, &block_attn_gqa,      &block_mlp_dense, &block_moe,       &block_moe_shared,
    &block_attn_mla, &block_attn_deltanet, &block_attn_kda,  &block_attn_dsv4,
};

const char *block_role_name(BlockRole role) { return role == ROLE_NORM ? "norm" : role == ROLE_ATTN ? "attention" : "mlp"; }

const BlockKind *block_find(BlockRole role, const char *name) {
    for (int i = 0; i < MAX_KINDS && kinds[i]; i++)
        if (kinds[i]->role == role && !strcmp(kinds[i]->name, name)) return kinds[i];
    return NULL;
}

int blocks_register(const BlockKind *k) {
    if (block_find(k->role, k->name)) return -1;
    for (int i = 0; i < MAX_KINDS; i++)
        if (!kinds[i]) {
            kinds[i] = k;
            return 0;
        }
    return -1;
}


int block_load(Block *b, BlockRole role, const JsonValue *spec, BlockLoader *L) {
    memset(b, 0, sizeof(*b));
    if (!spec || spec->type == JSON_NULL || L->failed) return L->failed ? -1 : 0;
    const char *name = json_get_str(spec, "kind");
    const BlockKind *k = name ? block_find(role, name) : NULL;
    if (!k) {
        char known[256] = "";
        for (int i = 0; i < MAX_KINDS && kinds[i]; i++)
            if (kinds[i]->role == role) {
                strncat(known, known[0] ? ", " : "", sizeof known - strlen(known) - 1);
                strncat(known, kinds[i]->name, sizeof known - strlen(known) - 1);
            }
        return bl_fail(L,
                       "%s kind '%s' is not implemented by this engine (it has: %s); update colibri or re-run "
                       "coli convert",
                       block_role_name(role), name ? name : "?", known);
    }
    b->self = calloc(1, k->size);
    if (!b->self) return bl_fail(L, "out of memory");
    b->kind = k;
    if (k->load(b->self, spec, L)) {
        L->failed = 1;
        return -1;
    }
    return 0;
}
