/* Builds the Model from a container: architecture from the manifest, then every tensor the
 * architecture needs, each checked for presence, storage type and shape. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "container.h"
#include "model.h"

typedef struct {
    const Container *ct;
    char *err;
    size_t errlen;
    int failed;
} Loader;

static const CtTensor *need(Loader *L, const char *name, long long rows, long long cols) {
    if (L->failed) return NULL;
    const CtTensor *t = ct_find(L->ct, name);
    if (!t) { snprintf(L->err, L->errlen, "container lacks tensor '%s'; re-run coli convert", name); L->failed = 1; return NULL; }
    if (t->rows != rows || t->cols != cols) {
        snprintf(L->err, L->errlen, "tensor '%s' is [%lld, %lld], the architecture needs [%lld, %lld]", name, t->rows,
                 t->cols, rows, cols);
        L->failed = 1;
        return NULL;
    }
    return t;
}

static QMat mat(Loader *L, const char *name, int rows, int cols) {
    QMat q = {0};
    const CtTensor *t = need(L, name, rows, cols);
    if (!t) return q;
    q.qt = t->qt;
    q.rows = rows;
    q.cols = cols;
    q.row_bytes = qtype_row_bytes(t->qt, cols);
    q.data = t->st->data;
    return q;
}

/* Small f32 vectors (norms, biases, router) are copied so they are aligned and owned. */
static const float *vec(Loader *L, const char *name, int rows, int cols) {
    const CtTensor *t = need(L, name, rows, cols);
    if (!t) return NULL;
    if (t->qt != QT_F32) {
        snprintf(L->err, L->errlen, "tensor '%s' must be stored as f32, found %s", name, qtype_name(t->qt));
        L->failed = 1;
        return NULL;
    }
    float *p = malloc((size_t)rows * cols * sizeof(float));
    if (!p) { snprintf(L->err, L->errlen, "out of memory"); L->failed = 1; return NULL; }
    memcpy(p, t->st->data, (size_t)rows * cols * sizeof(float));
    return p;
}

static int get_int(Loader *L, const JsonValue *o, const char *key, int lo, int hi) {
    const JsonValue *v = json_get(o, key);
    if (L->failed) return 0;
    if (!v || v->type != JSON_NUM || !v->is_int || v->i < lo || v->i > hi) {
        snprintf(L->err, L->errlen, "colibri.json: arch.%s missing or outside [%d, %d]", key, lo, hi);
        L->failed = 1;
        return 0;
    }
    return (int)v->i;
}

/* Families whose architecture descriptors this engine implements (family_registry.py must agree). */
const char *const ENGINE_FAMILIES[] = {"llama", "qwen2", "qwen3", "qwen3_moe", NULL};

static int parse_arch(Loader *L, Arch *a, const JsonValue *man) {
    const JsonValue *o = json_get(man, "arch");
    if (!o || o->type != JSON_OBJ) { snprintf(L->err, L->errlen, "colibri.json: no arch object"); return -1; }
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
    a->n_heads = get_int(L, o, "num_heads", 1, 1024);
    a->n_kv_heads = get_int(L, o, "num_kv_heads", 1, 1024);
    a->head_dim = get_int(L, o, "head_dim", 2, 4096);
    a->rotary_dim = get_int(L, o, "rotary_dim", 0, 4096);
    a->intermediate = get_int(L, o, "intermediate_size", 0, 1 << 20);
    a->n_experts = get_int(L, o, "num_experts", 0, 4096);
    a->top_k = get_int(L, o, "num_experts_per_tok", 0, 4096);
    a->moe_intermediate = get_int(L, o, "moe_intermediate_size", 0, 1 << 20);
    a->max_pos = get_int(L, o, "max_position_embeddings", 1, 1 << 30);
    if (L->failed) return -1;
    if (a->n_heads % a->n_kv_heads || a->rotary_dim > a->head_dim || a->rotary_dim % 2 ||
        (a->n_experts && (a->top_k < 1 || a->top_k > a->n_experts))) {
        snprintf(L->err, L->errlen, "colibri.json: inconsistent head or expert counts");
        return -1;
    }
    a->norm_topk_prob = json_get_bool(o, "norm_topk_prob", 0);
    a->qk_norm = json_get_bool(o, "qk_norm", 0);
    a->q_bias = json_get_bool(o, "q_bias", 0);
    a->k_bias = json_get_bool(o, "k_bias", 0);
    a->v_bias = json_get_bool(o, "v_bias", 0);
    a->o_bias = json_get_bool(o, "o_bias", 0);
    a->mlp_bias = json_get_bool(o, "mlp_bias", 0);
    a->tie_embeddings = json_get_bool(o, "tie_word_embeddings", 0);
    a->rms_eps = (float)json_get_num(o, "rms_norm_eps", -1);
    a->rope_scale = (float)json_get_num(o, "rope_attention_scaling", 1.0);
    const char *act = json_get_str(o, "hidden_act");
    if (a->rms_eps <= 0) { snprintf(L->err, L->errlen, "colibri.json: arch.rms_norm_eps missing"); return -1; }
    if (!act || strcmp(act, "silu") != 0) {
        snprintf(L->err, L->errlen, "colibri.json: hidden_act '%s' is not supported (only silu)", act ? act : "?");
        return -1;
    }
    const JsonValue *inv = json_get(o, "rope_inv_freq");
    if (!inv || inv->type != JSON_ARR || (int)inv->len != a->rotary_dim / 2) {
        snprintf(L->err, L->errlen, "colibri.json: arch.rope_inv_freq must list rotary_dim/2 = %d values", a->rotary_dim / 2);
        return -1;
    }
    a->inv_freq = malloc(sizeof(float) * (inv->len + 1));
    if (!a->inv_freq) { snprintf(L->err, L->errlen, "out of memory loading the architecture"); return -1; }
    for (size_t i = 0; i < inv->len; i++) a->inv_freq[i] = (float)inv->items[i].num;
    const JsonValue *kinds = json_get(o, "layer_mlp");
    if (!kinds || kinds->type != JSON_ARR || (int)kinds->len != a->n_layers) {
        snprintf(L->err, L->errlen, "colibri.json: arch.layer_mlp must list one entry per layer");
        return -1;
    }
    a->layer_is_moe = calloc((size_t)a->n_layers, 1);
    if (!a->layer_is_moe) { snprintf(L->err, L->errlen, "out of memory loading the architecture"); return -1; }
    for (int l = 0; l < a->n_layers; l++) {
        const JsonValue *k = &kinds->items[l];
        int moe = k->type == JSON_STR && strcmp(k->str, "moe") == 0;
        int dense = k->type == JSON_STR && strcmp(k->str, "dense") == 0;
        if ((!moe && !dense) || (moe && !a->n_experts) || (dense && !a->intermediate)) {
            snprintf(L->err, L->errlen, "colibri.json: arch.layer_mlp[%d] is not a usable 'moe' or 'dense'", l);
            return -1;
        }
        a->layer_is_moe[l] = (unsigned char)moe;
    }
    a->bos = (int)json_get_int(man, "bos_token_id", -1);
    const JsonValue *eos = json_get(man, "eos_token_ids");
    if (eos && eos->type == JSON_ARR)
        for (size_t i = 0; i < eos->len && a->n_eos < MAX_EOS; i++)
            if (eos->items[i].is_int) a->eos[a->n_eos++] = (int)eos->items[i].i;
    return 0;
}

static void load_mlp(Loader *L, Mlp *m, const char *prefix, int hidden, int inter, int bias) {
    char n[256];
    snprintf(n, sizeof n, "%s.gate_proj.weight", prefix); m->gate = mat(L, n, inter, hidden);
    snprintf(n, sizeof n, "%s.up_proj.weight", prefix); m->up = mat(L, n, inter, hidden);
    snprintf(n, sizeof n, "%s.down_proj.weight", prefix); m->down = mat(L, n, hidden, inter);
    if (bias) {
        snprintf(n, sizeof n, "%s.gate_proj.bias", prefix); m->gate_b = vec(L, n, 1, inter);
        snprintf(n, sizeof n, "%s.up_proj.bias", prefix); m->up_b = vec(L, n, 1, inter);
        snprintf(n, sizeof n, "%s.down_proj.bias", prefix); m->down_b = vec(L, n, 1, hidden);
    }
}

int model_load(Model *m, const char *dir, char *err, size_t errlen) {
    memset(m, 0, sizeof(*m));
    m->ct = ct_open(dir, err, errlen);
    if (!m->ct) return -1;
    Loader L = {m->ct, err, errlen, 0};
    Arch *a = &m->a;
    if (parse_arch(&L, a, ct_manifest(m->ct))) { model_free(m); return -1; }
    int H = a->hidden, qd = a->n_heads * a->head_dim, kvd = a->n_kv_heads * a->head_dim;
    m->embed = mat(&L, "model.embed_tokens.weight", a->vocab, H);
    m->lm_head = a->tie_embeddings ? m->embed : mat(&L, "lm_head.weight", a->vocab, H);
    m->final_norm = vec(&L, "model.norm.weight", 1, H);
    m->layers = calloc((size_t)a->n_layers, sizeof(Layer));
    if (!m->layers) { snprintf(err, errlen, "out of memory for %d layers", a->n_layers); model_free(m); return -1; }
    char n[256], p[200];
    for (int l = 0; l < a->n_layers && !L.failed; l++) {
        Layer *y = &m->layers[l];
        snprintf(p, sizeof p, "model.layers.%d", l);
#define NM(fmt) (snprintf(n, sizeof n, "%s." fmt, p), n)
        y->attn_norm = vec(&L, NM("input_layernorm.weight"), 1, H);
        y->ffn_norm = vec(&L, NM("post_attention_layernorm.weight"), 1, H);
        y->wq = mat(&L, NM("self_attn.q_proj.weight"), qd, H);
        y->wk = mat(&L, NM("self_attn.k_proj.weight"), kvd, H);
        y->wv = mat(&L, NM("self_attn.v_proj.weight"), kvd, H);
        y->wo = mat(&L, NM("self_attn.o_proj.weight"), H, qd);
        if (a->q_bias) y->bq = vec(&L, NM("self_attn.q_proj.bias"), 1, qd);
        if (a->k_bias) y->bk = vec(&L, NM("self_attn.k_proj.bias"), 1, kvd);
        if (a->v_bias) y->bv = vec(&L, NM("self_attn.v_proj.bias"), 1, kvd);
        if (a->o_bias) y->bo = vec(&L, NM("self_attn.o_proj.bias"), 1, H);
        if (a->qk_norm) {
            y->q_norm = vec(&L, NM("self_attn.q_norm.weight"), 1, a->head_dim);
            y->k_norm = vec(&L, NM("self_attn.k_norm.weight"), 1, a->head_dim);
        }
        if (a->layer_is_moe[l]) {
            y->router = vec(&L, NM("mlp.gate.weight"), a->n_experts, H);
            y->experts = calloc((size_t)a->n_experts, sizeof(Mlp));
            if (!y->experts && !L.failed) { snprintf(err, errlen, "out of memory for %d experts", a->n_experts); L.failed = 1; }
            for (int e = 0; e < a->n_experts && !L.failed; e++) {
                char ep[240];
                snprintf(ep, sizeof ep, "%s.mlp.experts.%d", p, e);
                load_mlp(&L, &y->experts[e], ep, H, a->moe_intermediate, 0);
            }
        } else {
            char mp[240];
            snprintf(mp, sizeof mp, "%s.mlp", p);
            load_mlp(&L, &y->mlp, mp, H, a->intermediate, a->mlp_bias);
        }
#undef NM
    }
    if (L.failed) { model_free(m); return -1; }
    return 0;
}

static void free_mlp(Mlp *m) {
    free((void *)m->gate_b);
    free((void *)m->up_b);
    free((void *)m->down_b);
}

void model_free(Model *m) {
    if (m->layers) {
        for (int l = 0; l < m->a.n_layers; l++) {
            Layer *y = &m->layers[l];
            free((void *)y->attn_norm); free((void *)y->ffn_norm); free((void *)y->q_norm); free((void *)y->k_norm);
            free((void *)y->bq); free((void *)y->bk); free((void *)y->bv); free((void *)y->bo);
            free((void *)y->router);
            free_mlp(&y->mlp);
            free(y->experts);
        }
        free(m->layers);
    }
    free((void *)m->final_norm);
    free(m->a.inv_freq);
    free(m->a.layer_is_moe);
    ct_close(m->ct);
    memset(m, 0, sizeof(*m));
}
