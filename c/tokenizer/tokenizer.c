/* tokenizer.json loading, the encode pipeline (added tokens -> normalizer -> pre-tokenizer ->
 * BPE -> post-processor) and decoding, mirroring HF tokenizers' TokenizerImpl. */
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/unicode_tables.h"
#include "util/grow.h"

#define MAX_JSON_BYTES ((size_t)256 << 20) /* real files are < 40 MB */
#define MAX_TOKEN_ID ((int64_t)1 << 22)    /* real vocabularies are < 300k; bounds the id tables */

enum { TF_PRESENT = 1, TF_SPECIAL = 2, TF_ADDED = 4, TF_BYTE = 8 }; /* TF_BYTE: a <0xNN> byte-fallback token */

typedef struct {
    int32_t id;
    uint8_t special, lstrip, rstrip, single_word, normalized;
    uint32_t off, len;   /* matched form (normalized content for normalized tokens) in added_pool */
    uint32_t coff, clen; /* original content in added_pool (what decoding shows) */
} Added;

typedef struct {
    int32_t child, sibling, tok;
    unsigned char byte;
} TrieNode;
typedef struct {
    TrieNode *v;
    size_t n, cap;
    uint32_t first[8];
} Trie;

struct Tokenizer {
    TokBpe *bpe;
    TokPreTok *pt;
    TokNorm norm[8];
    int nnorm;
    int32_t n_ids;
    uint8_t *flags;
    uint32_t *dec_off, *dec_len;
    TokBuf dec_pool;
    size_t max_tok_bytes;
    TokStrMap vocab_content, added_content;
    Added *added;
    size_t nadded;
    TokBuf added_pool;
    Trie trie_raw, trie_norm;
    int32_t *pp_pre, *pp_post;
    size_t npre, npost;
    /* SentencePiece-style decoders (Replace, ByteFallback, Fuse, Strip): what each token's text
     * becomes, and how many leading spaces the whole decoded text loses */
    TokNorm dec_replace[4];
    int ndec_replace, dec_byte_fallback, dec_strip_start;
};

/* ------------------------------------------------------------------ helpers */

static int set_err(char *err, size_t errlen, const char *msg) {
    snprintf(err, errlen, "%s", msg);
    return -1;
}

const char *tok_unicode_version(void) { return uni_version; }
const char *tok_unicode_norm_version(void) { return uni_norm_version; }

static int trie_node(Trie *t) {
    TrieNode *v = grow_array(t->v, &t->cap, t->n + 1, sizeof *v, 256);
    if (!v) return -1;
    t->v = v;
    t->v[t->n] = (TrieNode){-1, -1, -1, 0};
    return (int)t->n++;
}

static int trie_insert(Trie *t, const unsigned char *s, size_t n, int32_t tok) {
    if (!t->n && trie_node(t) < 0) return -1;
    int32_t cur = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t c = t->v[cur].child;
        while (c >= 0 && t->v[c].byte != s[i]) c = t->v[c].sibling;
        if (c < 0) {
            int nn = trie_node(t);
            if (nn < 0) return -1;
            t->v[nn].byte = s[i];
            t->v[nn].sibling = t->v[cur].child;
            t->v[cur].child = nn;
            c = nn;
        }
        cur = c;
    }
    t->v[cur].tok = tok;
    if (n) t->first[s[0] >> 5] |= 1u << (s[0] & 31);
    return 0;
}

/* Longest token starting at s[0..n): index into added[], length in *len; -1 if none. */
static int32_t trie_longest(const Trie *t, const unsigned char *s, size_t n, size_t *len) {
    if (!t->n || !((t->first[s[0] >> 5] >> (s[0] & 31)) & 1)) return -1;
    int32_t cur = 0, best = -1;
    for (size_t i = 0; i < n; i++) {
        int32_t c = t->v[cur].child;
        while (c >= 0 && t->v[c].byte != s[i]) c = t->v[c].sibling;
        if (c < 0) break;
        cur = c;
        if (t->v[cur].tok >= 0) {
            best = t->v[cur].tok;
            *len = i + 1;
        }
    }
    return best;
}

/* ------------------------------------------------------------------ loading */

static int load_normalizer(Tokenizer *t, const JsonValue *v, int depth, char *err, size_t errlen) {
    if (!v || v->type == JSON_NULL) return 0;
    const char *type = json_get_str(v, "type");
    if (!type) return set_err(err, errlen, "normalizer: missing \"type\"");
    if (!strcmp(type, "Sequence")) {
        const JsonValue *list = json_get(v, "normalizers");
        if (!list || list->type != JSON_ARR) return set_err(err, errlen, "normalizer Sequence: missing \"normalizers\" list");
        if (depth > 8) return set_err(err, errlen, "normalizer: Sequence nested too deeply");
        for (size_t i = 0; i < list->len; i++)
            if (load_normalizer(t, &list->items[i], depth + 1, err, errlen)) return -1;
        return 0;
    }
    int kind = !strcmp(type, "NFC")       ? TOK_NORM_NFC
               : !strcmp(type, "NFD")     ? TOK_NORM_NFD
               : !strcmp(type, "Prepend") ? TOK_NORM_PREPEND
               : !strcmp(type, "Replace") ? TOK_NORM_REPLACE
                                          : 0;
    if (!kind) {
        snprintf(err, errlen, "unsupported normalizer type '%s' (supported: NFC, NFD, Prepend, Replace, Sequence)", type);
        return -1;
    }
    if (t->nnorm == 8) return set_err(err, errlen, "normalizer: too many steps");
    TokNorm st = {kind, NULL, NULL, 0, 0};
    const JsonValue *a = NULL, *b = NULL;
    if (kind == TOK_NORM_PREPEND) {
        a = json_get(v, "prepend");
        if (!a || a->type != JSON_STR) return set_err(err, errlen, "normalizer Prepend: missing \"prepend\" string");
    } else if (kind == TOK_NORM_REPLACE) { /* SentencePiece's " " -> "▁"; regex patterns are not supported */
        const JsonValue *pat = json_get(v, "pattern");
        a = pat ? json_get(pat, "String") : NULL;
        b = json_get(v, "content");
        if (!a || a->type != JSON_STR || !b || b->type != JSON_STR)
            return set_err(err, errlen,
                           "normalizer Replace: only a {\"String\": ...} pattern with a \"content\" string "
                           "is supported");
    }
    if (a && (!(st.a = malloc(a->len + 1)) || !memcpy(st.a, a->str, a->len))) return set_err(err, errlen, "out of memory");
    if (b && (!(st.b = malloc(b->len + 1)) || !memcpy(st.b, b->str, b->len))) {
        free(st.a);
        return set_err(err, errlen, "out of memory");
    }
    st.an = a ? a->len : 0;
    st.bn = b ? b->len : 0;
    t->norm[t->nnorm++] = st;
    return 0;
}

/* Flattens a post-processor into ids before and after the sequence (single-sequence case). */
static int pp_wrap(Tokenizer *t, const int32_t *pre, size_t npre, const int32_t *post, size_t npost) {
    int32_t *p = malloc((t->npre + npre + 1) * sizeof *p), *q = malloc((t->npost + npost + 1) * sizeof *q);
    if (!p || !q) {
        free(p);
        free(q);
        return -1;
    }
    if (npre) memcpy(p, pre, npre * sizeof *p);
    if (t->npre) memcpy(p + npre, t->pp_pre, t->npre * sizeof *p);
    if (t->npost) memcpy(q, t->pp_post, t->npost * sizeof *q);
    if (npost) memcpy(q + t->npost, post, npost * sizeof *q);
    free(t->pp_pre);
    free(t->pp_post);
    t->pp_pre = p;
    t->pp_post = q;
    t->npre += npre;
    t->npost += npost;
    return 0;
}

static int id_of_pair(const JsonValue *v, int32_t *id) { /* ["<s>", 0] */
    if (!v || v->type != JSON_ARR || v->len != 2 || v->items[1].type != JSON_NUM || !v->items[1].is_int) return -1;
    if (v->items[1].i < 0 || v->items[1].i >= MAX_TOKEN_ID) return -1;
    *id = (int32_t)v->items[1].i;
    return 0;
}

static int load_post(Tokenizer *t, const JsonValue *v, int depth, char *err, size_t errlen) {
    if (!v || v->type == JSON_NULL) return 0;
    const char *type = json_get_str(v, "type");
    if (!type) return set_err(err, errlen, "post_processor: missing \"type\"");
    if (!strcmp(type, "ByteLevel")) return 0; /* offsets only */
    if (!strcmp(type, "Sequence")) {
        const JsonValue *list = json_get(v, "processors");
        if (!list || list->type != JSON_ARR) return set_err(err, errlen, "post_processor Sequence: missing \"processors\" list");
        if (depth > 8) return set_err(err, errlen, "post_processor: Sequence nested too deeply");
        for (size_t i = 0; i < list->len; i++)
            if (load_post(t, &list->items[i], depth + 1, err, errlen)) return -1;
        return 0;
    }
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        int32_t cls, sep;
        if (id_of_pair(json_get(v, "cls"), &cls) || id_of_pair(json_get(v, "sep"), &sep))
            return set_err(err, errlen, "post_processor: bad cls/sep");
        return pp_wrap(t, &cls, 1, &sep, 1) ? set_err(err, errlen, "out of memory") : 0;
    }
    if (strcmp(type, "TemplateProcessing")) {
        snprintf(err, errlen,
                 "unsupported post_processor type '%s' (supported: TemplateProcessing, ByteLevel, "
                 "RobertaProcessing, BertProcessing, Sequence)",
                 type);
        return -1;
    }
    const JsonValue *single = json_get(v, "single"), *specials = json_get(v, "special_tokens");
    if (!single || single->type != JSON_ARR)
        return set_err(err, errlen, "post_processor TemplateProcessing: \"single\" must be a list of pieces");
    TokIds pre = {0}, post = {0};
    int seen_a = 0, rc = -1;
    for (size_t i = 0; i < single->len; i++) {
        const JsonValue *piece = &single->items[i];
        const JsonValue *sp = json_get(piece, "SpecialToken"), *sq = json_get(piece, "Sequence");
        if (sq) {
            const char *which = json_get_str(sq, "id");
            if (which && !strcmp(which, "A")) {
                if (seen_a++) {
                    set_err(err, errlen, "post_processor TemplateProcessing: $A used twice");
                    goto out;
                }
            }
            continue; /* $B only occurs in pair templates */
        }
        const char *name = json_get_str(sp, "id");
        const JsonValue *st = name ? json_get(specials, name) : NULL;
        const JsonValue *ids = json_get(st, "ids");
        if (!ids || ids->type != JSON_ARR) {
            snprintf(err, errlen, "post_processor TemplateProcessing: special token '%s' not in special_tokens",
                     name ? name : "?");
            goto out;
        }
        for (size_t k = 0; k < ids->len; k++) {
            const JsonValue *x = &ids->items[k];
            if (x->type != JSON_NUM || !x->is_int || x->i < 0 || x->i >= MAX_TOKEN_ID) {
                set_err(err, errlen, "post_processor TemplateProcessing: bad token id");
                goto out;
            }
            if (tok_ids_push(seen_a ? &post : &pre, (int32_t)x->i)) {
                set_err(err, errlen, "out of memory");
                goto out;
            }
        }
    }
    if (!seen_a) {
        set_err(err, errlen, "post_processor TemplateProcessing: single template lacks $A");
        goto out;
    }
    if (pp_wrap(t, pre.v, pre.n, post.v, post.n)) {
        set_err(err, errlen, "out of memory");
        goto out;
    }
    rc = 0;
out:
    free(pre.v);
    free(post.v);
    return rc;
}

/* Model-domain key of a vocab string: raw bytes when every char is in the byte map. */
static int byte_key(const char *s, size_t n, TokBuf *out) {
    out->n = 0;
    size_t adv;
    if (tok_buf_reserve(out, n)) return -1;
    for (size_t i = 0; i < n; i += adv) {
        int b = tok_char_byte(u8_decode((const unsigned char *)s + i, &adv));
        if (b < 0) return 1;
        out->p[out->n++] = (unsigned char)b;
    }
    return 0;
}

static int add_merge(Tokenizer *t, const char *a, size_t la, const char *b, size_t lb, uint32_t rank, TokBuf *tmp, char *err,
                     size_t errlen) {
    int32_t ia = tok_strmap_get(&t->vocab_content, a, la), ib = tok_strmap_get(&t->vocab_content, b, lb);
    tmp->n = 0;
    if (tok_buf_put(tmp, a, la) || tok_buf_put(tmp, b, lb)) return set_err(err, errlen, "out of memory");
    int32_t in = tok_strmap_get(&t->vocab_content, tmp->p, tmp->n);
    if (ia < 0 || ib < 0 || in < 0) {
        snprintf(err, errlen, "merge %u ('%.60s' '%.60s'): token not in vocab", rank, a, b);
        return -1;
    }
    return tok_bpe_add_merge(t->bpe, ia, ib, in, rank) ? set_err(err, errlen, "out of memory") : 0;
}

static int load_model(Tokenizer *t, const JsonValue *m, char *err, size_t errlen) {
    if (!m || m->type != JSON_OBJ) return set_err(err, errlen, "tokenizer.json: missing \"model\" object");
    const char *type = json_get_str(m, "type");
    if (type && strcmp(type, "BPE")) {
        snprintf(err, errlen, "unsupported model type '%s' (only BPE)", type);
        return -1;
    }
    const JsonValue *vocab = json_get(m, "vocab"), *merges = json_get(m, "merges");
    if (!vocab || vocab->type != JSON_OBJ) return set_err(err, errlen, "model: \"vocab\" must be an object");
    if (merges && merges->type != JSON_ARR) return set_err(err, errlen, "model: \"merges\" must be a list");
    const JsonValue *dropout = json_get(m, "dropout");
    if (dropout && dropout->type == JSON_NUM && dropout->num != 0.0)
        return set_err(err, errlen, "model: BPE dropout is not supported (encoding would be random)");
    const char *pfx = json_get_str(m, "continuing_subword_prefix"), *sfx = json_get_str(m, "end_of_word_suffix");
    if ((pfx && *pfx) || (sfx && *sfx))
        return set_err(err, errlen, "model: continuing_subword_prefix / end_of_word_suffix are not supported");

    t->bpe = tok_bpe_new();
    if (!t->bpe) return set_err(err, errlen, "out of memory");
    TokBpeOpts *o = tok_bpe_opts(t->bpe);
    o->byte_units = tok_pretok_has_byte_level(t->pt);
    o->ignore_merges = json_get_bool(m, "ignore_merges", 0);
    o->byte_fallback = json_get_bool(m, "byte_fallback", 0);
    o->fuse_unk = json_get_bool(m, "fuse_unk", 0);
    o->rank_mode = merges == NULL;

    TokBuf key = {0};
    int rc = -1;
    if (tok_strmap_reserve(&t->vocab_content, vocab->len) || tok_bpe_reserve(t->bpe, vocab->len, merges ? merges->len : 0)) {
        set_err(err, errlen, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < vocab->len; i++) {
        const JsonValue *idv = &vocab->items[i];
        const char *s = vocab->keys[i];
        size_t n = vocab->key_lens[i];
        if (idv->type != JSON_NUM || !idv->is_int || idv->i < 0 || idv->i >= MAX_TOKEN_ID) {
            snprintf(err, errlen, "model.vocab: token '%.80s' has a bad id (need an integer in [0, %lld))", s,
                     (long long)MAX_TOKEN_ID);
            goto out;
        }
        if (tok_u8_first_invalid((const unsigned char *)s, n) != n) {
            set_err(err, errlen, "model.vocab: token is not valid UTF-8");
            goto out;
        }
        int32_t id = (int32_t)idv->i;
        if (tok_strmap_put(&t->vocab_content, s, n, id)) {
            set_err(err, errlen, "out of memory");
            goto out;
        }
        int kr = 0;
        const unsigned char *k = (const unsigned char *)s;
        size_t kn = n;
        if (o->byte_units) {
            kr = byte_key(s, n, &key);
            if (kr < 0) {
                set_err(err, errlen, "out of memory");
                goto out;
            }
            k = key.p;
            kn = key.n;
        }
        if (kr == 0 && tok_bpe_add_token(t->bpe, k, kn, id)) {
            set_err(err, errlen, "out of memory");
            goto out;
        }
    }
    const char *unk = json_get_str(m, "unk_token");
    if (unk) {
        int32_t u = tok_strmap_get(&t->vocab_content, unk, strlen(unk));
        o->unk_id = u >= 0 ? u : -2;
    }
    if (merges) {
        uint32_t rank = 0;
        for (size_t i = 0; i < merges->len; i++) {
            const JsonValue *mg = &merges->items[i];
            if (mg->type == JSON_STR) {
                if (mg->len >= 8 && !memcmp(mg->str, "#version", 8)) continue;
                const char *sp = memchr(mg->str, ' ', mg->len);
                if (!sp || memchr(sp + 1, ' ', mg->len - (size_t)(sp + 1 - mg->str))) {
                    snprintf(err, errlen, "model.merges: entry %zu is not \"a b\"", i);
                    goto out;
                }
                if (add_merge(t, mg->str, (size_t)(sp - mg->str), sp + 1, mg->len - (size_t)(sp + 1 - mg->str), rank++, &key, err,
                              errlen))
                    goto out;
            } else if (mg->type == JSON_ARR && mg->len == 2 && mg->items[0].type == JSON_STR && mg->items[1].type == JSON_STR) {
                if (add_merge(t, mg->items[0].str, mg->items[0].len, mg->items[1].str, mg->items[1].len, rank++, &key, err,
                              errlen))
                    goto out;
            } else {
                snprintf(err, errlen, "model.merges: entry %zu must be \"a b\" or [\"a\", \"b\"]", i);
                goto out;
            }
        }
    }
    rc = tok_bpe_finish(t->bpe, err, errlen);
out:
    free(key.p);
    return rc;
}

static int load_added(Tokenizer *t, const JsonValue *list, int32_t next_id, char *err, size_t errlen) {
    if (!list || list->type == JSON_NULL) return 0;
    if (list->type != JSON_ARR) return set_err(err, errlen, "tokenizer.json: \"added_tokens\" must be a list");
    t->added = calloc(list->len + 1, sizeof *t->added);
    if (!t->added) return set_err(err, errlen, "out of memory");
    TokBuf norm = {0};
    int rc = -1;
    for (size_t i = 0; i < list->len; i++) {
        const JsonValue *a = &list->items[i];
        const JsonValue *c = json_get(a, "content");
        if (!c || c->type != JSON_STR) {
            snprintf(err, errlen, "added_tokens[%zu]: missing \"content\"", i);
            goto out;
        }
        if (tok_u8_first_invalid((const unsigned char *)c->str, c->len) != c->len) {
            snprintf(err, errlen, "added_tokens[%zu]: content is not valid UTF-8", i);
            goto out;
        }
        if (!c->len) continue; /* HF ignores empty added tokens */
        Added ad = {0};
        ad.special = (uint8_t)json_get_bool(a, "special", 0);
        ad.lstrip = (uint8_t)json_get_bool(a, "lstrip", 0);
        ad.rstrip = (uint8_t)json_get_bool(a, "rstrip", 0);
        ad.single_word = (uint8_t)json_get_bool(a, "single_word", 0);
        ad.normalized = (uint8_t)json_get_bool(a, "normalized", !ad.special);
        /* HF ignores the "id" field: an existing token keeps its id, new ones count up from
         * the vocab size (AddedVocabulary::add_tokens). */
        int32_t id = tok_strmap_get(&t->added_content, c->str, c->len);
        size_t slot = t->nadded;
        if (id >= 0) {
            for (size_t k = 0; k < t->nadded; k++)
                if (t->added[k].id == id) slot = k;
        } else {
            id = tok_strmap_get(&t->vocab_content, c->str, c->len);
            if (id < 0) {
                if (next_id >= MAX_TOKEN_ID) {
                    set_err(err, errlen, "added_tokens: too many tokens");
                    goto out;
                }
                id = next_id++;
            }
            if (tok_strmap_put(&t->added_content, c->str, c->len, id)) {
                set_err(err, errlen, "out of memory");
                goto out;
            }
        }
        ad.id = id;
        const unsigned char *form = (const unsigned char *)c->str;
        size_t form_n = c->len;
        if (ad.normalized && t->nnorm && tok_normalize(t->norm, t->nnorm, 1, form, form_n, &norm, &form, &form_n)) {
            set_err(err, errlen, "out of memory");
            goto out;
        }
        if (t->added_pool.n + form_n + c->len > 0xFFFFFFFFu) {
            set_err(err, errlen, "added_tokens too large");
            goto out;
        }
        ad.off = (uint32_t)t->added_pool.n;
        ad.len = (uint32_t)form_n;
        if (tok_buf_put(&t->added_pool, form, form_n)) {
            set_err(err, errlen, "out of memory");
            goto out;
        }
        ad.coff = (uint32_t)t->added_pool.n;
        ad.clen = (uint32_t)c->len;
        if (tok_buf_put(&t->added_pool, c->str, c->len)) {
            set_err(err, errlen, "out of memory");
            goto out;
        }
        t->added[slot] = ad;
        if (slot == t->nadded) t->nadded++;
    }
    for (size_t k = 0; k < t->nadded; k++) {
        Added *ad = &t->added[k];
        Trie *tr = ad->normalized ? &t->trie_norm : &t->trie_raw;
        if (trie_insert(tr, t->added_pool.p + ad->off, ad->len, (int32_t)k)) {
            set_err(err, errlen, "out of memory");
            goto out;
        }
    }
    rc = 0;
out:
    free(norm.p);
    return rc;
}

/* Reads the decoders colibri implements besides ByteLevel: Replace (String pattern), ByteFallback,
 * Fuse (a no-op for a byte stream) and Strip of leading spaces (HF's Llama/Mistral chain). */
static int load_decoder(Tokenizer *t, const JsonValue *d, int depth, char *err, size_t errlen) {
    const char *type = d && d->type == JSON_OBJ ? json_get_str(d, "type") : NULL;
    if (!type) return 0;
    if (!strcmp(type, "Sequence")) {
        const JsonValue *list = json_get(d, "decoders");
        if (depth > 8) return set_err(err, errlen, "decoder: Sequence nested too deeply");
        for (size_t i = 0; list && list->type == JSON_ARR && i < list->len; i++)
            if (load_decoder(t, &list->items[i], depth + 1, err, errlen)) return -1;
        return 0;
    }
    if (!strcmp(type, "ByteFallback")) t->dec_byte_fallback = 1;
    else if (!strcmp(type, "Replace")) {
        const JsonValue *pat = json_get(d, "pattern"), *c = json_get(d, "content");
        const JsonValue *a = pat ? json_get(pat, "String") : NULL;
        if (!a || a->type != JSON_STR || !c || c->type != JSON_STR || !a->len)
            return set_err(err, errlen, "decoder Replace: only a non-empty {\"String\": ...} pattern is supported");
        if (t->ndec_replace == 4) return set_err(err, errlen, "decoder: too many Replace steps");
        TokNorm *r = &t->dec_replace[t->ndec_replace];
        if (!(r->a = malloc(a->len + 1)) || !(r->b = malloc(c->len + 1))) {
            free(r->a);
            r->a = NULL;
            return set_err(err, errlen, "out of memory");
        }
        memcpy(r->a, a->str, a->len);
        memcpy(r->b, c->str, c->len);
        r->an = a->len;
        r->bn = c->len;
        r->kind = TOK_NORM_REPLACE;
        t->ndec_replace++;
    } else if (!strcmp(type, "Strip")) {
        const char *c = json_get_str(d, "content");
        const JsonValue *st = json_get(d, "start"), *sp = json_get(d, "stop");
        if (!c || strcmp(c, " ") || (sp && sp->is_int && sp->i) || !st || !st->is_int || st->i < 0 || st->i > 8)
            return set_err(err, errlen, "decoder Strip: only stripping up to 8 leading spaces is supported");
        t->dec_strip_start = (int)st->i;
    }
    return 0; /* Fuse, ByteLevel (handled by the byte map) and the rest: no effect on the bytes */
}

/* HF ByteFallback's test for a byte token: exactly "<0xHH>". Returns the byte or -1. */
static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

static int decoder_is_byte_level(const JsonValue *d) {
    const char *type = json_get_str(d, "type");
    if (!type) return 0;
    if (!strcmp(type, "ByteLevel")) return 1;
    if (!strcmp(type, "Sequence")) {
        const JsonValue *list = json_get(d, "decoders");
        for (size_t i = 0; list && list->type == JSON_ARR && i < list->len; i++)
            if (decoder_is_byte_level(&list->items[i])) return 1;
    }
    return 0;
}

/* Per-id decoded bytes: HF's ByteLevel decoder maps each char back to its byte, falling back
 * to the raw UTF-8 of a token that has any char outside the map. */
static int build_decode_table(Tokenizer *t, const JsonValue *vocab, int byte_level, char *err, size_t errlen) {
    size_t n = (size_t)t->n_ids;
    t->flags = calloc(n ? n : 1, 1);
    t->dec_off = calloc(n ? n : 1, sizeof *t->dec_off);
    t->dec_len = calloc(n ? n : 1, sizeof *t->dec_len);
    if (!t->flags || !t->dec_off || !t->dec_len) return set_err(err, errlen, "out of memory");
    TokBuf key = {0};
    for (int pass = 0; pass < 2; pass++) {
        size_t cnt = pass ? t->nadded : vocab->len;
        for (size_t i = 0; i < cnt; i++) {
            const char *s;
            size_t sn;
            int32_t id;
            if (pass) {
                Added *ad = &t->added[i];
                id = ad->id;
                s = (const char *)t->added_pool.p + ad->coff; /* original content, not the normalized form */
                sn = ad->clen;
                t->flags[id] |= TF_ADDED | (ad->special ? TF_SPECIAL : 0);
            } else {
                id = (int32_t)vocab->items[i].i;
                s = vocab->keys[i];
                sn = vocab->key_lens[i];
            }
            const unsigned char *bytes = (const unsigned char *)s;
            size_t bn = sn;
            unsigned char one;
            int bv = t->dec_byte_fallback && !byte_level ? byte_token(s, sn) : -1;
            if (byte_level) {
                int r = byte_key(s, sn, &key);
                if (r < 0) {
                    free(key.p);
                    return set_err(err, errlen, "out of memory");
                }
                if (r == 0) {
                    bytes = key.p;
                    bn = key.n;
                }
            } else if (bv >= 0) {
                one = (unsigned char)bv;
                bytes = &one;
                bn = 1;
                t->flags[id] |= TF_BYTE;
            } else if (t->ndec_replace) {
                const unsigned char *o;
                size_t on;
                if (tok_normalize(t->dec_replace, t->ndec_replace, 0, bytes, bn, &key, &o, &on)) {
                    free(key.p);
                    return set_err(err, errlen, "out of memory");
                }
                bytes = o;
                bn = on;
            }
            if (t->dec_pool.n + bn > 0xFFFFFFFFu) {
                free(key.p);
                return set_err(err, errlen, "tokenizer.json: vocabulary too large");
            }
            t->dec_off[id] = (uint32_t)t->dec_pool.n;
            t->dec_len[id] = (uint32_t)bn;
            t->flags[id] |= TF_PRESENT;
            if (bn > t->max_tok_bytes) t->max_tok_bytes = bn;
            if (tok_buf_put(&t->dec_pool, bytes, bn)) {
                free(key.p);
                return set_err(err, errlen, "out of memory");
            }
        }
    }
    free(key.p);
    return 0;
}

Tokenizer *tok_load_buffer(const char *json, size_t len, char *err, size_t errlen) {
    if (len > MAX_JSON_BYTES) {
        snprintf(err, errlen, "tokenizer.json is %zu bytes, more than the %zu byte limit", len, MAX_JSON_BYTES);
        return NULL;
    }
    char jerr[200];
    JsonDoc *doc = json_parse(json, len, jerr, sizeof jerr);
    if (!doc) {
        snprintf(err, errlen, "tokenizer.json: %s", jerr);
        return NULL;
    }
    Tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        json_free(doc);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    const JsonValue *root = json_root(doc);
    if (root->type != JSON_OBJ) {
        set_err(err, errlen, "tokenizer.json: top level must be an object");
        goto fail;
    }
    const char *ver = json_get_str(root, "version");
    if (ver && strcmp(ver, "1.0")) {
        snprintf(err, errlen, "tokenizer.json: unknown version '%.20s'", ver);
        goto fail;
    }
    if (load_normalizer(t, json_get(root, "normalizer"), 0, err, errlen)) goto fail;
    if (!(t->pt = tok_pretok_load(json_get(root, "pre_tokenizer"), err, errlen))) goto fail;
    const JsonValue *model = json_get(root, "model");
    if (load_model(t, model, err, errlen)) goto fail;
    const JsonValue *vocab = json_get(model, "vocab");
    int64_t max_id = -1;
    for (size_t i = 0; i < vocab->len; i++)
        if (vocab->items[i].i > max_id) max_id = vocab->items[i].i;
    if (load_added(t, json_get(root, "added_tokens"), (int32_t)t->vocab_content.n, err, errlen)) goto fail;
    for (size_t i = 0; i < t->nadded; i++)
        if (t->added[i].id > max_id) max_id = t->added[i].id;
    t->n_ids = (int32_t)(max_id + 1);
    if (load_post(t, json_get(root, "post_processor"), 0, err, errlen)) goto fail;
    if (load_decoder(t, json_get(root, "decoder"), 0, err, errlen)) goto fail;
    if (build_decode_table(t, vocab, decoder_is_byte_level(json_get(root, "decoder")), err, errlen)) goto fail;
    /* after the table: an id below the largest one can still be a gap no token fills */
    for (size_t i = 0; i < t->npre + t->npost; i++) {
        int32_t id = i < t->npre ? t->pp_pre[i] : t->pp_post[i - t->npre];
        if (id >= t->n_ids || !(t->flags[id] & TF_PRESENT)) {
            snprintf(err, errlen, "post_processor: token id %d is not in the vocabulary", id);
            goto fail;
        }
    }
    json_free(doc);
    return t;
fail:
    json_free(doc);
    tok_free(t);
    return NULL;
}

Tokenizer *tok_load(const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open %s", path);
        return NULL;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            if (cap >= MAX_JSON_BYTES) {
                fclose(f);
                free(buf);
                snprintf(err, errlen, "%s is larger than the %zu byte limit for tokenizer.json", path, MAX_JSON_BYTES);
                return NULL;
            }
            cap = cap ? cap * 2 : (1 << 20);
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                fclose(f);
                free(buf);
                snprintf(err, errlen, "out of memory reading %s", path);
                return NULL;
            }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        snprintf(err, errlen, "read error on %s", path);
        return NULL;
    }
    char lerr[400];
    Tokenizer *t = tok_load_buffer(buf, n, lerr, sizeof lerr);
    free(buf);
    if (!t) snprintf(err, errlen, "%s: %s", path, lerr);
    return t;
}

void tok_free(Tokenizer *t) {
    if (!t) return;
    tok_bpe_free(t->bpe);
    tok_pretok_free(t->pt);
    for (int i = 0; i < t->nnorm; i++) {
        free(t->norm[i].a);
        free(t->norm[i].b);
    }
    for (int i = 0; i < t->ndec_replace; i++) {
        free(t->dec_replace[i].a);
        free(t->dec_replace[i].b);
    }
    free(t->flags);
    free(t->dec_off);
    free(t->dec_len);
    free(t->dec_pool.p);
    tok_strmap_free(&t->vocab_content);
    tok_strmap_free(&t->added_content);
    free(t->added);
    free(t->added_pool.p);
    free(t->trie_raw.v);
    free(t->trie_norm.v);
    free(t->pp_pre);
    free(t->pp_post);
    free(t);
}

int tok_vocab_size(const Tokenizer *t) { return t->n_ids; }

const char *tok_token_bytes(const Tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_ids || !(t->flags[id] & TF_PRESENT)) return NULL;
    *len = t->dec_len[id];
    return (const char *)t->dec_pool.p + t->dec_off[id];
}

int tok_is_byte(const Tokenizer *t, int32_t id) { return id >= 0 && id < t->n_ids && (t->flags[id] & TF_BYTE); }
int tok_strip_start(const Tokenizer *t) { return t->dec_strip_start; }

int tok_is_special(const Tokenizer *t, int32_t id) { return id >= 0 && id < t->n_ids && (t->flags[id] & TF_SPECIAL) != 0; }

int tok_is_added(const Tokenizer *t, int32_t id) { return id >= 0 && id < t->n_ids && (t->flags[id] & TF_ADDED) != 0; }

int32_t tok_find(const Tokenizer *t, const char *content) {
    size_t n = strlen(content);
    int32_t id = tok_strmap_get(&t->added_content, content, n);
    return id >= 0 ? id : tok_strmap_get(&t->vocab_content, content, n);
}

size_t tok_max_token_bytes(const Tokenizer *t) { return t->max_tok_bytes; }

/* ------------------------------------------------------------------ encoding */

typedef struct {
    size_t s, e;
    int32_t added;
} Seg; /* added: index into t->added or -1 */
typedef struct {
    Seg *v;
    size_t n, cap;
} Segs;

static int seg_push(Segs *a, size_t s, size_t e, int32_t added) {
    Seg *v = grow_array(a->v, &a->cap, a->n + 1, sizeof *v, 16);
    if (!v) return -1;
    a->v = v;
    a->v[a->n++] = (Seg){s, e, added};
    return 0;
}

static int is_word_cp(uint32_t cp) { /* Rust regex \w: alphanumeric, marks, connector punctuation */
    int c = uni_cat(cp);
    return (c >= UNI_Lu && c <= UNI_Nd) || c == UNI_Nl || c == UNI_Pc || cp == 0x200C || cp == 0x200D;
}

static size_t prev_cp_start(const unsigned char *s, size_t p) {
    do p--;
    while (p > 0 && (s[p] & 0xC0) == 0x80);
    return p;
}

/* HF AddedVocabulary::find_matches: leftmost-longest matches; skipped special tokens when
 * !parse_special, single_word/lstrip/rstrip rules with Unicode \w and \s. lit: literal spans
 * (pairs, see tok_encode_literal): no match inside one or across its edges, no strip into one. */
static int split_added(const Tokenizer *t, const Trie *tr, const unsigned char *s, size_t n, int parse_special, const size_t *lit,
                       size_t nlit, Segs *out) {
    out->n = 0;
    size_t start_off = 0, i = 0, adv, li = 0, floor = 0;
    while (i < n) {
        while (li < nlit && lit[2 * li + 1] <= i) floor = lit[2 * li++ + 1];
        size_t lim = n;
        if (li < nlit) {
            if (lit[2 * li] <= i) {
                i = lit[2 * li + 1];
                continue;
            } /* inside a literal span: text */
            lim = lit[2 * li];
        }
        size_t mlen = 0;
        int32_t k = trie_longest(tr, s + i, lim - i, &mlen);
        if (k < 0) {
            i++;
            continue;
        }
        const Added *ad = &t->added[k];
        size_t start = i, stop = i + mlen;
        i = stop;
        if (ad->special && !parse_special) continue;
        if (ad->single_word) {
            int left_ok = start == 0 || !is_word_cp(u8_decode(s + prev_cp_start(s, start), &adv));
            int right_ok = stop == n || !is_word_cp(u8_decode(s + stop, &adv));
            if (!left_ok || !right_ok) continue;
        }
        if (ad->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t p = prev_cp_start(s, ns);
                if (!(uni_props(u8_decode(s + p, &adv)) & UNI_F_SPACE)) break;
                ns = p;
            }
            if (ns < floor) ns = floor;
            start = ns > start_off ? ns : start_off;
        }
        if (ad->rstrip) {
            while (stop < lim) {
                uint32_t cp = u8_decode(s + stop, &adv);
                if (!(uni_props(cp) & UNI_F_SPACE)) break;
                stop += adv;
            }
            i = stop;
        }
        if (start_off < start && seg_push(out, start_off, start, -1)) return -1;
        if (seg_push(out, start, stop, k)) return -1;
        start_off = stop;
    }
    if (start_off < n && seg_push(out, start_off, n, -1)) return -1;
    return 0;
}

/* The literal spans of raw segment [rs, re) in the coordinates of its normalized text, which
 * goes to *ns, *nn. Identity normalizers map offsets 1:1; otherwise the pieces between span
 * edges are normalized one by one (only when normalized added tokens exist, so that HF's
 * whole-segment normalization is kept everywhere else). */
static int norm_segment(const Tokenizer *t, const unsigned char *s, size_t rs, size_t re, const size_t *lit, size_t nlit,
                        TokBuf *nbuf, TokBuf *pbuf, const unsigned char **ns, size_t *nn, size_t **sub, size_t *nsub,
                        size_t *subcap) {
    size_t first = 0, cnt = 0;
    while (first < nlit && lit[2 * first + 1] <= rs) first++;
    while (first + cnt < nlit && lit[2 * (first + cnt)] < re) cnt++;
    *nsub = 0;
    if (!cnt || !t->trie_norm.n) return tok_normalize(t->norm, t->nnorm, 1, s + rs, re - rs, nbuf, ns, nn);
    if (cnt > *subcap) {
        size_t *v = realloc(*sub, 2 * cnt * sizeof *v);
        if (!v) return -1;
        *sub = v;
        *subcap = cnt;
    }
    if (!t->nnorm) {
        for (size_t k = 0; k < cnt; k++) {
            size_t a = lit[2 * (first + k)], b = lit[2 * (first + k) + 1];
            (*sub)[2 * k] = (a > rs ? a : rs) - rs;
            (*sub)[2 * k + 1] = (b < re ? b : re) - rs;
        }
        *nsub = cnt;
        *ns = s + rs;
        *nn = re - rs;
        return 0;
    }
    pbuf->n = 0;
    size_t pos = rs;
    int at_start = 1; /* the segment's first non-empty piece is its start (Prepend acts there) */
    for (size_t k = 0; k <= cnt; k++) {
        size_t a = k < cnt ? lit[2 * (first + k)] : re, b = k < cnt ? lit[2 * (first + k) + 1] : re;
        if (a < rs) a = rs;
        if (b > re) b = re;
        for (int part = 0; part < 2; part++) { /* the text before the span, then the span */
            size_t from = part ? a : pos, to = part ? b : a;
            const unsigned char *o;
            size_t on;
            if (part && k < cnt) (*sub)[2 * k] = pbuf->n;
            if (to > from) {
                if (tok_normalize(t->norm, t->nnorm, at_start, s + from, to - from, nbuf, &o, &on) || tok_buf_put(pbuf, o, on))
                    return -1;
                at_start = 0;
            }
            if (part && k < cnt) (*sub)[2 * k + 1] = pbuf->n;
        }
        pos = b;
    }
    *nsub = cnt;
    *ns = pbuf->p;
    *nn = pbuf->n;
    return 0;
}

int tok_encode(const Tokenizer *t, const char *text, size_t len, int parse_special, int add_special, int32_t **ids_out,
               size_t *n_out, char *err, size_t errlen) {
    return tok_encode_literal(t, text, len, parse_special, add_special, NULL, 0, ids_out, n_out, err, errlen);
}

int tok_encode_literal(const Tokenizer *t, const char *text, size_t len, int parse_special, int add_special, const size_t *lit,
                       size_t nlit, int32_t **ids_out, size_t *n_out, char *err, size_t errlen) {
    *ids_out = NULL;
    *n_out = 0;
    const unsigned char *s = (const unsigned char *)text;
    if (!s && len) return set_err(err, errlen, "NULL text");
    size_t bad = tok_u8_first_invalid(s, len);
    if (bad != len) {
        snprintf(err, errlen, "input is not valid UTF-8 (invalid byte 0x%02X at offset %zu)", s[bad], bad);
        return -1;
    }
    if (nlit && !lit) return set_err(err, errlen, "NULL literal spans");
    if (nlit && tok_literal_check(text, len, lit, nlit, err, errlen)) return -1;
    TokIds ids = {0};
    Segs raw = {0}, nrm = {0};
    TokBuf nbuf = {0}, pbuf = {0};
    TokPieces pieces = {0};
    TokArena *arena = NULL;
    TokBpeScratch *scratch = NULL;
    size_t *sub = NULL, nsub = 0, subcap = 0;
    uint64_t steps = 2000 * (uint64_t)len + 1000000; /* ~30 per byte in practice */
    int rc = -1;
    for (size_t i = 0; i < t->npre && add_special; i++)
        if (tok_ids_push(&ids, t->pp_pre[i])) goto oom;
    if (split_added(t, &t->trie_raw, s, len, parse_special, lit, nlit, &raw)) goto oom;
    for (size_t a = 0; a < raw.n; a++) {
        if (raw.v[a].added >= 0) {
            if (tok_ids_push(&ids, t->added[raw.v[a].added].id)) goto oom;
            continue;
        }
        const unsigned char *ns;
        size_t nn;
        if (norm_segment(t, s, raw.v[a].s, raw.v[a].e, lit, nlit, &nbuf, &pbuf, &ns, &nn, &sub, &nsub, &subcap)) goto oom;
        if (split_added(t, &t->trie_norm, ns, nn, parse_special, sub, nsub, &nrm)) goto oom;
        for (size_t b = 0; b < nrm.n; b++) {
            if (nrm.v[b].added >= 0) {
                if (tok_ids_push(&ids, t->added[nrm.v[b].added].id)) goto oom;
                continue;
            }
            pieces.n = 0;
            if (tok_pretok_run(t->pt, ns + nrm.v[b].s, nrm.v[b].e - nrm.v[b].s, &pieces, &arena, &steps, err, errlen)) goto done;
            for (size_t p = 0; p < pieces.n; p++)
                if (tok_bpe_encode(t->bpe, pieces.v[p].p, pieces.v[p].n, &ids, &scratch, err, errlen)) goto done;
            tok_arena_free(arena);
            arena = NULL;
        }
    }
    for (size_t i = 0; i < t->npost && add_special; i++)
        if (tok_ids_push(&ids, t->pp_post[i])) goto oom;
    if (ids.oom) goto oom;
    if (!ids.v && !(ids.v = malloc(sizeof(int32_t)))) goto oom; /* non-NULL even when empty */
    *ids_out = ids.v;
    *n_out = ids.n;
    ids.v = NULL;
    rc = 0;
    goto done;
oom:
    set_err(err, errlen, "out of memory");
done:
    free(ids.v);
    free(raw.v);
    free(nrm.v);
    free(nbuf.p);
    free(pbuf.p);
    free(sub);
    free(pieces.v);
    tok_arena_free(arena);
    tok_bpe_scratch_free(scratch);
    return rc;
}
