/* Builds the Model from a container: global facts from the manifest's arch, then the trunk and
 * one Layer per entry of the manifest's "layers", each block found in the block table by its
 * kind and loaded from the tensor names its spec gives. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/blocks.h"
#include "io/container.h"
#include "model/hyper_conn.h"
#include "model/model.h"
#include "model/mtp.h"
#include "model/spec_legacy.h"

static int get_int(BlockLoader *L, const JsonValue *o, const char *key, int lo, int hi) {
    const JsonValue *v = json_get(o, key);
    if (L->failed) return 0;
    if (!v || v->type != JSON_NUM || !v->is_int || v->i < lo || v->i > hi) {
        snprintf(L->err, L->errlen, "colibri.json: arch.%s missing or outside [%d, %d]", key, lo, hi);
        L->failed = 1;
        return 0;
    }
    return (int)v->i;
}

/* Families whose layer specs this engine has blocks for (family_registry.py must agree). */
const char *const ENGINE_FAMILIES[] = {
    "llama",         "qwen2",        "qwen3",       "qwen3_moe",   "glm4_moe", "glm4_moe_lite", "deepseek_v3",
    "glm_moe_dsa",   "deepseek_v32", "olmoe",       "qwen2_moe",   "mixtral",  "gpt_oss",       "minimax_m2",
    "mimo_v2_flash", "qwen3_5_moe",  "kimi_linear", "deepseek_v4", NULL};

/* The facts that hold for every layer. */
static int parse_globals(BlockLoader *L, Arch *a, const JsonValue *man) {
    const JsonValue *o = json_get(man, "arch");
    if (!o || o->type != JSON_OBJ) {
        snprintf(L->err, L->errlen, "colibri.json: no arch object");
        return -1;
    }
    const char *fam = json_get_str(man, "family");
    int known = 0;
    for (int i = 0; fam && ENGINE_FAMILIES[i]; i++) known |= !strcmp(fam, ENGINE_FAMILIES[i]);
    if (!known) {
        snprintf(L->err, L->errlen, "colibri.json: family '%s' is not implemented by this engine", fam ? fam : "?");
        return -1;
    }
    snprintf(a->family, sizeof a->family, "%s", fam);
    a->vocab = get_int(L, o, "vocab_size", 1, 1 << 24);
    a->hidden = get_int(L, o, "hidden_size", 1, 1 << 16);
    a->n_layers = get_int(L, o, "num_layers", 1, 1024);
    a->rotary_dim = get_int(L, o, "rotary_dim", 0, 4096);
    a->max_pos = get_int(L, o, "max_position_embeddings", 1, 1 << 30);
    if (L->failed) return -1;
    if (a->rotary_dim % 2) {
        snprintf(L->err, L->errlen, "colibri.json: arch.rotary_dim must be even");
        return -1;
    }
    a->tie_embeddings = json_get_bool(o, "tie_word_embeddings", 0);
    a->rope_scale = (float)json_get_num(o, "rope_attention_scaling", 1.0);
    const JsonValue *inv = json_get(o, "rope_inv_freq");
    if (!inv || inv->type != JSON_ARR || (int)inv->len != a->rotary_dim / 2) {
        snprintf(L->err, L->errlen, "colibri.json: arch.rope_inv_freq must list rotary_dim/2 = %d values", a->rotary_dim / 2);
        return -1;
    }
    a->inv_freq = malloc(sizeof(float) * (inv->len + 1));
    if (!a->inv_freq) {
        snprintf(L->err, L->errlen, "out of memory loading the architecture");
        return -1;
    }
    for (size_t i = 0; i < inv->len; i++) a->inv_freq[i] = (float)inv->items[i].num;
    a->bos = (int)json_get_int(man, "bos_token_id", -1);
    const JsonValue *eos = json_get(man, "eos_token_ids");
    if (eos && eos->type == JSON_ARR)
        for (size_t i = 0; i < eos->len && a->n_eos < MAX_EOS; i++)
            if (eos->items[i].is_int) a->eos[a->n_eos++] = (int)eos->items[i].i;
    a->kv_type = QT_F16;
    return 0;
}

int model_set_kv_type(Model *m, QType kv_type, char *err, size_t errlen) {
    if (kv_type != QT_F16 && kv_type != QT_BF16 && kv_type != QT_F32) {
        snprintf(err, errlen, "KV cache type %s is not offered (f16, bf16, f32)", qtype_name(kv_type));
        return -1;
    }
    m->a.kv_type = kv_type;
    for (int l = 0; l < m->a.n_layers; l++) m->state[l] = layer_state(&m->layers[l], kv_type);
    if (m->mtp) {
        m->mtp->a.kv_type = kv_type;
        m->mtp->state = layer_state(&m->mtp->y, kv_type);
    }
    return 0;
}

int model_load(Model *m, const char *dir, char *err, size_t errlen) {
    memset(m, 0, sizeof(*m));
    m->ct = ct_open(dir, err, errlen);
    if (!m->ct) return -1;
    BlockLoader L = {m->ct, &m->a, -1, err, errlen, 0};
    Arch *a = &m->a;
    const JsonValue *man = ct_manifest(m->ct);
    if (parse_globals(&L, a, man)) {
        model_free(m);
        return -1;
    }
    JsonDoc *legacy = NULL;
    const JsonValue *trunk = json_get(man, "trunk"), *layers = json_get(man, "layers");
    if (!layers) { /* an older manifest: map its arch (spec_legacy.c) */
        if (!(legacy = legacy_specs(json_get(man, "arch"), err, errlen))) {
            model_free(m);
            return -1;
        }
        trunk = json_get(json_root(legacy), "trunk");
        layers = json_get(json_root(legacy), "layers");
    }
    if (!trunk || trunk->type != JSON_OBJ || layers->type != JSON_ARR || (int)layers->len != a->n_layers) {
        snprintf(err, errlen, "colibri.json: needs a trunk object and one layers entry per layer (%d); re-run coli convert",
                 a->n_layers);
        json_free(legacy);
        model_free(m);
        return -1;
    }
    const int H = a->hidden;
    const char *embed = bl_str(&L, trunk, "embed"), *head = bl_str(&L, trunk, "lm_head");
    if (!L.failed) {
        m->embed = bl_mat_named(&L, embed, a->vocab, H);
        m->lm_head = !strcmp(head, embed) ? m->embed : bl_mat_named(&L, head, a->vocab, H);
    }
    block_load(&m->final_norm, ROLE_NORM, bl_obj(&L, trunk, "final_norm"), &L);
    const JsonValue *hc_head = json_get(trunk, "hc_head");
    if (!L.failed && hc_head) m->hc_head = hc_load(&L, hc_head, 1);
    m->layers = calloc((size_t)a->n_layers, sizeof(Layer));
    m->state = calloc((size_t)a->n_layers, sizeof(StateDesc));
    if (!m->layers || !m->state) bl_fail(&L, "out of memory");
    for (int l = 0; l < a->n_layers && !L.failed; l++) {
        L.layer = l;
        layer_load(&L, &m->layers[l], &layers->items[l], m->hc_head != NULL);
        if (!L.failed && m->hc_head)
            for (int h = 0; h < 2; h++)
                if (m->layers[l].hc[h]->n != m->hc_head->n)
                    bl_fail(&L, "hyper-connections of %d streams, the head collapses %d", m->layers[l].hc[h]->n, m->hc_head->n);
    }
    json_free(legacy);
    if (L.failed) {
        model_free(m);
        return -1;
    }
    a->state = m->state;
    model_set_kv_type(m, a->kv_type, err, errlen);
    return 0;
}

void model_free(Model *m) {
    mtp_free(m);
    if (m->layers) {
        for (int l = 0; l < m->a.n_layers; l++) layer_free(&m->layers[l]);
        free(m->layers);
    }
    block_free(&m->final_norm);
    hc_free(m->hc_head);
    free(m->state);
    free(m->a.inv_freq);
    ct_close(m->ct);
    memset(m, 0, sizeof(*m));
}
