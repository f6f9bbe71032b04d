/* Pre-tokenizers from tokenizer.json: Sequence, Split (regex or literal, every split
 * behaviour, invert), ByteLevel (add_prefix_space, use_regex) and Digits, with the splitting
 * rules of HF tokenizers (NormalizedString::split, onig find_iter, empty pieces dropped).
 *
 * The model works on raw bytes after ByteLevel, so the byte->char mapping is only
 * materialized when a later step has to see the mapped characters. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tok_regex.h"
#include "tokenizer/unicode_tables.h"
#include "util/grow.h"

enum { PT_SPLIT, PT_BYTELEVEL, PT_DIGITS };
enum { SB_REMOVED, SB_ISOLATED, SB_MERGED_PREV, SB_MERGED_NEXT, SB_CONTIGUOUS };

typedef struct {
    int type;
    TokRegex *re;           /* Split with a regex, ByteLevel with use_regex */
    unsigned char *literal; /* Split with a String pattern */
    size_t lit_len;
    int behavior, invert;
    int add_prefix_space;
    int individual_digits;
} Step;

struct TokPreTok {
    Step *v;
    int n;
    size_t cap;
    int byte_level;
};

struct TokArena {
    struct TokArena *next;
    unsigned char data[];
};

static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

void tok_arena_free(TokArena *a) {
    while (a) {
        TokArena *n = a->next;
        free(a);
        a = n;
    }
}

static unsigned char *arena_new(TokArena **a, size_t n) {
    TokArena *b = malloc(sizeof(TokArena) + (n ? n : 1));
    if (!b) return NULL;
    b->next = *a;
    *a = b;
    return b->data;
}

void tok_pretok_free(TokPreTok *pt) {
    if (!pt) return;
    for (int i = 0; i < pt->n; i++) {
        tok_regex_free(pt->v[i].re);
        free(pt->v[i].literal);
    }
    free(pt->v);
    free(pt);
}

int tok_pretok_has_byte_level(const TokPreTok *pt) { return pt->byte_level; }

static int add_step(TokPreTok *pt, Step st) {
    Step *v = grow_array(pt->v, &pt->cap, (size_t)pt->n + 1, sizeof *v, 4);
    if (!v) return -1;
    pt->v = v;
    pt->v[pt->n++] = st;
    return 0;
}

static int load_one(TokPreTok *pt, const JsonValue *v, int depth, char *err, size_t errlen) {
    if (!v || v->type == JSON_NULL) return 0;
    if (v->type != JSON_OBJ) {
        snprintf(err, errlen, "pre_tokenizer: expected an object");
        return -1;
    }
    if (depth > 8) {
        snprintf(err, errlen, "pre_tokenizer: Sequence nested too deeply");
        return -1;
    }
    const char *type = json_get_str(v, "type");
    if (!type) {
        snprintf(err, errlen, "pre_tokenizer: missing \"type\"");
        return -1;
    }
    Step st = {0};
    if (!strcmp(type, "Sequence")) {
        const JsonValue *list = json_get(v, "pretokenizers");
        if (!list || list->type != JSON_ARR) {
            snprintf(err, errlen, "pre_tokenizer Sequence: missing \"pretokenizers\" list");
            return -1;
        }
        for (size_t i = 0; i < list->len; i++)
            if (load_one(pt, &list->items[i], depth + 1, err, errlen)) return -1;
        return 0;
    }
    if (!strcmp(type, "Split")) {
        st.type = PT_SPLIT;
        const JsonValue *pat = json_get(v, "pattern");
        const JsonValue *rx = json_get(pat, "Regex"), *lit = json_get(pat, "String");
        const char *beh = json_get_str(v, "behavior");
        static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        st.behavior = -1;
        for (int i = 0; beh && i < 5; i++)
            if (!strcmp(beh, names[i])) st.behavior = i;
        if (st.behavior < 0) {
            snprintf(err, errlen, "pre_tokenizer Split: unknown behavior '%s'", beh ? beh : "(missing)");
            return -1;
        }
        st.invert = json_get_bool(v, "invert", 0);
        if (rx && rx->type == JSON_STR) {
            char rerr[160];
            st.re = tok_regex_compile(rx->str, rx->len, rerr, sizeof rerr);
            if (!st.re) {
                snprintf(err, errlen, "pre_tokenizer Split pattern \"%.300s\"%s is not supported: %s", rx->str,
                         rx->len > 300 ? "..." : "", rerr);
                return -1;
            }
        } else if (lit && lit->type == JSON_STR) {
            if (tok_u8_first_invalid((const unsigned char *)lit->str, lit->len) != lit->len) {
                snprintf(err, errlen, "pre_tokenizer Split: String pattern is not valid UTF-8");
                return -1;
            }
            st.literal = malloc(lit->len + 1);
            if (!st.literal) {
                snprintf(err, errlen, "out of memory");
                return -1;
            }
            memcpy(st.literal, lit->str, lit->len);
            st.lit_len = lit->len;
        } else {
            snprintf(err, errlen, "pre_tokenizer Split: pattern must be {\"Regex\": ...} or {\"String\": ...}");
            return -1;
        }
    } else if (!strcmp(type, "ByteLevel")) {
        if (pt->byte_level) {
            snprintf(err, errlen, "pre_tokenizer: more than one ByteLevel step is not supported");
            return -1;
        }
        st.type = PT_BYTELEVEL;
        st.add_prefix_space = json_get_bool(v, "add_prefix_space", 1);
        if (json_get_bool(v, "use_regex", 1)) {
            char rerr[160];
            st.re = tok_regex_compile(GPT2_PATTERN, sizeof GPT2_PATTERN - 1, rerr, sizeof rerr);
            if (!st.re) {
                snprintf(err, errlen, "internal: GPT-2 pattern: %s", rerr);
                return -1;
            }
        }
        pt->byte_level = 1;
    } else if (!strcmp(type, "Digits")) {
        st.type = PT_DIGITS;
        st.individual_digits = json_get_bool(v, "individual_digits", 0);
    } else {
        snprintf(err, errlen, "unsupported pre_tokenizer type '%s' (supported: Sequence, Split, ByteLevel, Digits)", type);
        return -1;
    }
    if (add_step(pt, st)) {
        tok_regex_free(st.re);
        free(st.literal);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

TokPreTok *tok_pretok_load(const JsonValue *v, char *err, size_t errlen) {
    TokPreTok *pt = calloc(1, sizeof *pt);
    if (!pt) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (load_one(pt, v, 0, err, errlen)) {
        tok_pretok_free(pt);
        return NULL;
    }
    return pt;
}

/* ------------------------------------------------------------------ running */

typedef struct {
    size_t s, e;
    int m;
} Span;
typedef struct {
    Span *v;
    size_t n, cap;
} Spans;

static int span_push(Spans *a, size_t s, size_t e, int m) {
    Span *v = grow_array(a->v, &a->cap, a->n + 1, sizeof *v, 64);
    if (!v) return -1;
    a->v = v;
    a->v[a->n++] = (Span){s, e, m};
    return 0;
}

static int piece_push(TokPieces *a, const unsigned char *p, size_t n) {
    if (!n) return 0; /* HF drops empty splits */
    TokPiece *v = grow_array(a->v, &a->cap, a->n + 1, sizeof *v, 64);
    if (!v) {
        a->oom = 1;
        return -1;
    }
    a->v = v;
    a->v[a->n++] = (TokPiece){p, n};
    return 0;
}

/* Match spans covering s[0..n) like HF find_matches (regex via onig's find_iter rules). */
static int find_spans(const Step *st, const TokRegex *re, const unsigned char *s, size_t n, Spans *out, uint64_t *steps,
                      char *err, size_t errlen) {
    out->n = 0;
    size_t prev = 0;
    if (st && st->type == PT_DIGITS) {
        size_t adv;
        for (size_t i = 0; i < n; i += adv) {
            uint32_t cp = u8_decode(s + i, &adv);
            int cat = uni_cat(cp);
            if (cat == UNI_Nd || cat == UNI_Nl || cat == UNI_No) {
                if (prev < i && span_push(out, prev, i, 0)) return -1;
                if (span_push(out, i, i + adv, 1)) return -1;
                prev = i + adv;
            }
        }
    } else if (st && st->literal) {
        for (size_t i = 0; st->lit_len && i + st->lit_len <= n;) {
            if (!memcmp(s + i, st->literal, st->lit_len)) {
                if (prev < i && span_push(out, prev, i, 0)) return -1;
                if (span_push(out, i, i + st->lit_len, 1)) return -1;
                i += st->lit_len;
                prev = i;
            } else i++;
        }
    } else {
        size_t last_end = 0, ms, me, adv;
        int have_last = 0;
        size_t last_match_end = 0;
        while (last_end <= n) {
            int r = tok_regex_search(re, s, n, last_end, &ms, &me, steps);
            if (r < 0) {
                snprintf(err, errlen, "pre-tokenizer regex exceeded its backtracking budget");
                return -2;
            }
            if (!r) break;
            if (ms == me && have_last && last_match_end == me) {
                /* onig's find_iter: no empty match right after the previous match */
                if (last_end >= n) break;
                u8_decode(s + last_end, &adv);
                last_end += adv;
                continue;
            }
            last_end = me;
            last_match_end = me;
            have_last = 1;
            if (prev != ms && span_push(out, prev, ms, 0)) return -1;
            if (span_push(out, ms, me, 1)) return -1;
            prev = me;
        }
    }
    if (prev < n && span_push(out, prev, n, 0)) return -1;
    if (st && st->invert)
        for (size_t i = 0; i < out->n; i++) out->v[i].m = !out->v[i].m;
    return 0;
}

/* Applies a split behaviour (HF NormalizedString::split) and appends the pieces. */
static int apply_behavior(int behavior, const unsigned char *s, Spans *sp, TokPieces *out) {
    Span *v = sp->v;
    size_t n = sp->n, k = 0;
    switch (behavior) {
    case SB_ISOLATED: break;
    case SB_REMOVED:
        for (size_t i = 0; i < n; i++)
            if (!v[i].m) v[k++] = v[i];
        n = k;
        break;
    case SB_CONTIGUOUS: {
        int prev = 0;
        for (size_t i = 0; i < n; i++) {
            if (v[i].m == prev && k) v[k - 1].e = v[i].e;
            else v[k++] = v[i];
            prev = v[i].m;
        }
        n = k;
        break;
    }
    case SB_MERGED_PREV: {
        int prev = 0;
        for (size_t i = 0; i < n; i++) {
            if (v[i].m && !prev && k) v[k - 1].e = v[i].e;
            else v[k++] = v[i];
            prev = v[i].m;
        }
        n = k;
        break;
    }
    default: { /* MergedWithNext: the same fold, right to left */
        int prev = 0;
        size_t w = n;
        for (size_t i = n; i-- > 0;) {
            if (v[i].m && !prev && w < n) v[w].s = v[i].s;
            else v[--w] = v[i];
            prev = v[i].m;
        }
        memmove(v, v + w, (n - w) * sizeof *v);
        n -= w;
        break;
    }
    }
    for (size_t i = 0; i < n; i++)
        if (piece_push(out, s + v[i].s, v[i].e - v[i].s)) return -1;
    return 0;
}

static void swap_pieces(TokPieces *a, TokPieces *b) {
    TokPieces t = *a;
    *a = *b;
    *b = t;
}

/* Re-encodes every piece through the byte map (map=1) or back to raw bytes (map=0). */
static int remap(TokPieces *cur, TokPieces *nxt, TokArena **arena, int map) {
    size_t total = 0;
    for (size_t i = 0; i < cur->n; i++) total += cur->v[i].n * (map ? 2 : 1);
    unsigned char *buf = arena_new(arena, total);
    if (!buf) return -1;
    nxt->n = 0;
    for (size_t i = 0; i < cur->n; i++) {
        const unsigned char *p = cur->v[i].p;
        unsigned char *start = buf;
        if (map) {
            for (size_t j = 0; j < cur->v[i].n; j++) buf += u8_encode(buf, tok_byte_char(p[j]));
        } else {
            size_t adv;
            for (size_t j = 0; j < cur->v[i].n; j += adv) {
                int b = tok_char_byte(u8_decode(p + j, &adv));
                *buf++ = (unsigned char)(b < 0 ? 0 : b); /* every char here came from the map */
            }
        }
        if (piece_push(nxt, start, (size_t)(buf - start))) return -1;
    }
    swap_pieces(cur, nxt);
    return 0;
}

int tok_pretok_run(const TokPreTok *pt, const unsigned char *s, size_t n, TokPieces *out, TokArena **arena, uint64_t *steps,
                   char *err, size_t errlen) {
    TokPieces cur = {0}, nxt = {0};
    Spans sp = {0};
    int rc = -1, mapped = 0, pending_map = 0;
    if (piece_push(&cur, s, n)) goto oom;
    for (int k = 0; k < pt->n; k++) {
        const Step *st = &pt->v[k];
        if (pending_map) {
            if (remap(&cur, &nxt, arena, 1)) goto oom;
            pending_map = 0;
            mapped = 1;
        }
        if (st->type == PT_BYTELEVEL && st->add_prefix_space) {
            size_t total = 0;
            for (size_t i = 0; i < cur.n; i++) total += cur.v[i].n + 1;
            unsigned char *buf = arena_new(arena, total);
            if (!buf) goto oom;
            nxt.n = 0;
            for (size_t i = 0; i < cur.n; i++) {
                unsigned char *start = buf;
                if (cur.v[i].p[0] != ' ') *buf++ = ' ';
                memcpy(buf, cur.v[i].p, cur.v[i].n);
                buf += cur.v[i].n;
                if (piece_push(&nxt, start, (size_t)(buf - start))) goto oom;
            }
            swap_pieces(&cur, &nxt);
        }
        if (st->type != PT_BYTELEVEL || st->re) {
            nxt.n = 0;
            for (size_t i = 0; i < cur.n; i++) {
                int r = find_spans(st, st->re, cur.v[i].p, cur.v[i].n, &sp, steps, err, errlen);
                if (r == -2) goto fail;
                if (r || apply_behavior(st->type == PT_BYTELEVEL ? SB_ISOLATED
                                        : st->type == PT_DIGITS  ? (st->individual_digits ? SB_ISOLATED : SB_CONTIGUOUS)
                                                                 : st->behavior,
                                        cur.v[i].p, &sp, &nxt))
                    goto oom;
            }
            swap_pieces(&cur, &nxt);
        }
        if (st->type == PT_BYTELEVEL) pending_map = 1;
    }
    if (mapped && remap(&cur, &nxt, arena, 0)) goto oom;
    for (size_t i = 0; i < cur.n; i++)
        if (piece_push(out, cur.v[i].p, cur.v[i].n)) goto oom;
    rc = 0;
    goto fail;
oom:
    snprintf(err, errlen, "out of memory");
fail:
    free(cur.v);
    free(nxt.v);
    free(sp.v);
    return rc;
}
