/* Manifests written before per-layer block specs (no "layers" key) are mapped at load time: the
 * arch booleans become the specs family_registry.layer_specs() writes today, with the HF
 * tensor names those converters used. This is the only place in the engine that spells a
 * tensor name, and it only serves old containers. */
#include "model/spec_legacy.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *buf;
    size_t len, cap;
} Str;

static void put(Str *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(Str *s, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(s->buf ? s->buf + s->len : NULL, s->buf ? s->cap - s->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if (s->buf && s->len + (size_t)n < s->cap) {
            s->len += (size_t)n;
            return;
        }
        size_t cap = (s->cap + (size_t)n + 1) * 2;
        char *nb = realloc(s->buf, cap);
        if (!nb) return;
        s->buf = nb;
        s->cap = cap;
    }
}

static int num(const JsonValue *o, const char *k) { return (int)json_get_int(o, k, 0); }

JsonDoc *legacy_specs(const JsonValue *arch, char *err, size_t errlen) {
    const int L = num(arch, "num_layers"), nh = num(arch, "num_heads"), nkv = num(arch, "num_kv_heads");
    const int hd = num(arch, "head_dim"), rot = num(arch, "rotary_dim");
    const double eps = json_get_num(arch, "rms_norm_eps", -1);
    const int qkn = json_get_bool(arch, "qk_norm", 0), mlp_bias = json_get_bool(arch, "mlp_bias", 0);
    const JsonValue *kinds = json_get(arch, "layer_mlp");
    if (L < 1 || !kinds || kinds->type != JSON_ARR || (int)kinds->len != L || eps <= 0) {
        snprintf(err, errlen, "colibri.json: no layer specs and arch.layer_mlp / rms_norm_eps unusable; re-run coli convert");
        return NULL;
    }
    Str s = {0};
    put(&s,
        "{\"trunk\":{\"embed\":\"model.embed_tokens.weight\",\"lm_head\":\"%s\",\"final_norm\":{\"kind\":\"rmsnorm\","
        "\"eps\":%.17g,\"tensors\":{\"weight\":\"model.norm.weight\"}}},\"layers\":[",
        json_get_bool(arch, "tie_word_embeddings", 0) ? "model.embed_tokens.weight" : "lm_head.weight", eps);
    for (int l = 0; l < L; l++) {
        const char *p = "model.layers";
        const JsonValue *k = &kinds->items[l];
        int moe = k->type == JSON_STR && !strcmp(k->str, "moe");
        int dense = k->type == JSON_STR && !strcmp(k->str, "dense");
        if (!moe && !dense) {
            free(s.buf);
            snprintf(err, errlen, "colibri.json: arch.layer_mlp[%d] is not a usable 'moe' or 'dense'", l);
            return NULL;
        }
        put(&s,
            "%s{\"attn_norm\":{\"kind\":\"rmsnorm\",\"eps\":%.17g,\"tensors\":{\"weight\":\"%s.%d.input_layernorm.weight\"}},",
            l ? "," : "", eps, p, l);
        put(&s,
            "\"attn\":{\"kind\":\"gqa\",\"heads\":%d,\"kv_heads\":%d,\"head_dim\":%d,\"qk_norm\":\"%s\",\"qk_norm_eps\":%.17g,"
            "\"rope\":{\"style\":\"neox\",\"dim\":%d},\"tensors\":{",
            nh, nkv, hd, qkn ? "per_head" : "none", eps, rot);
        static const char *const proj[4] = {"q", "k", "v", "o"};
        for (int i = 0; i < 4; i++) {
            put(&s, "%s\"%s\":\"%s.%d.self_attn.%s_proj.weight\"", i ? "," : "", proj[i], p, l, proj[i]);
            char key[16];
            snprintf(key, sizeof key, "%s_bias", proj[i]);
            if (json_get_bool(arch, key, 0)) put(&s, ",\"%s\":\"%s.%d.self_attn.%s_proj.bias\"", key, p, l, proj[i]);
        }
        if (qkn)
            put(&s, ",\"q_norm\":\"%s.%d.self_attn.q_norm.weight\",\"k_norm\":\"%s.%d.self_attn.k_norm.weight\"", p, l, p, l);
        put(&s,
            "}},\"mlp_norm\":{\"kind\":\"rmsnorm\",\"eps\":%.17g,\"tensors\":{\"weight\":\"%s.%d.post_attention_layernorm.weight\"}},",
            eps, p, l);
        if (moe) {
            put(&s,
                "\"mlp\":{\"kind\":\"moe\",\"act\":\"silu\",\"experts\":%d,\"top_k\":%d,\"width\":%d,"
                "\"router\":{\"kind\":\"softmax_topk\",\"renorm\":%s,\"tensors\":{\"weight\":\"%s.%d.mlp.gate.weight\"}},"
                "\"expert_tensors\":{\"gate\":\"%s.%d.mlp.experts.{e}.gate_proj.weight\",\"up\":\"%s.%d.mlp.experts.{e}.up_proj.weight\","
                "\"down\":\"%s.%d.mlp.experts.{e}.down_proj.weight\"}}}",
                num(arch, "num_experts"), num(arch, "num_experts_per_tok"), num(arch, "moe_intermediate_size"),
                json_get_bool(arch, "norm_topk_prob", 0) ? "true" : "false", p, l, p, l, p, l, p, l);
        } else {
            put(&s, "\"mlp\":{\"kind\":\"dense\",\"act\":\"silu\",\"width\":%d,\"tensors\":{", num(arch, "intermediate_size"));
            static const char *const mp[3] = {"gate", "up", "down"};
            for (int i = 0; i < 3; i++) {
                put(&s, "%s\"%s\":\"%s.%d.mlp.%s_proj.weight\"", i ? "," : "", mp[i], p, l, mp[i]);
                if (mlp_bias) put(&s, ",\"%s_bias\":\"%s.%d.mlp.%s_proj.bias\"", mp[i], p, l, mp[i]);
            }
            put(&s, "}}}");
        }
    }
    put(&s, "]}");
    if (!s.buf) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    JsonDoc *d = json_parse(s.buf, s.len, err, errlen);
    free(s.buf);
    return d;
}
