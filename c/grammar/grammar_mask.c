/* Token masks: the vocabulary's byte strings as one preorder trie, walked against the DFA so a
 * shared prefix is matched once and a dead prefix prunes its whole subtree; the mask of each
 * state is kept, so revisiting a state (the inside of a string, a list's separator) is free. */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_internal.h"


static const GrammarVocab *g_sort_vocab;
static int by_bytes(const void *a, const void *b) {
    const GrammarVocab *v = g_sort_vocab;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    size_t lx = v->len[x], ly = v->len[y], m = lx < ly ? lx : ly;
    int c = memcmp(v->bytes[x], v->bytes[y], m);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

GrammarVocab *grammar_vocab_new(int n, const char *const *bytes, const size_t *len, const uint8_t *kind) {
    GrammarVocab *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    v->n = n;
    size_t total = 0;
    for (int i = 0; i < n; i++) total += kind[i] == GV_NONE ? 0 : len[i];
    v->kind = malloc((size_t)n + 1);
    v->bytes = calloc((size_t)n + 1, sizeof *v->bytes);
    v->len = calloc((size_t)n + 1, sizeof *v->len);
    v->pool = malloc(total + 1);
    int32_t *order = malloc(((size_t)n + 1) * sizeof *order);
    v->added = malloc(((size_t)n + 1) * sizeof *v->added);
    v->eos = malloc(((size_t)n + 1) * sizeof *v->eos);
    if (!v->kind || !v->bytes || !v->len || !v->pool || !order || !v->added || !v->eos) goto oom;
    size_t at = 0, nt = 0, nodes_max = 1;
    for (int i = 0; i < n; i++) {
        uint8_t k = kind[i];
        if ((k == GV_TEXT || k == GV_ADDED) && (len[i] == 0 || len[i] > 65535)) k = GV_NONE; /* nothing to match */
        v->kind[i] = k;
        v->bytes[i] = v->pool + at;
        if (k != GV_NONE) {
            memcpy(v->pool + at, bytes[i], len[i]);
            v->len[i] = len[i];
            at += len[i];
        }
        if (k == GV_TEXT) {
            order[nt++] = i;
            nodes_max += len[i];
        } else if (k == GV_ADDED) v->added[v->n_added++] = i;
        else if (k == GV_EOS) v->eos[v->n_eos++] = i;
    }
    g_sort_vocab = v;
    qsort(order, nt, sizeof *order, by_bytes);
    v->byte = malloc(nodes_max);
    v->depth = malloc(nodes_max * sizeof *v->depth);
    v->skip = malloc(nodes_max * sizeof *v->skip);
    v->tok = malloc(nodes_max * sizeof *v->tok);
    v->same = malloc(((size_t)n + 1) * sizeof *v->same);
    uint32_t *path = malloc(65536 * sizeof *path);
    if (!v->byte || !v->depth || !v->skip || !v->tok || !v->same || !path) {
        free(path);
        goto oom;
    }
    size_t depth = 0; /* nodes on the path: path[0 .. depth) */
    int32_t prev = -1;
    for (size_t k = 0; k < nt; k++) {
        int32_t t = order[k];
        const unsigned char *b = (const unsigned char *)v->bytes[t];
        size_t L = v->len[t], lcp = 0;
        v->same[t] = -1;
        if (prev >= 0) {
            size_t pl = v->len[prev];
            while (lcp < L && lcp < pl && (unsigned char)v->bytes[prev][lcp] == b[lcp]) lcp++;
        }
        if (prev >= 0 && lcp == L && L == v->len[prev]) { /* the same bytes again: chain it */
            int32_t *slot = &v->tok[path[L - 1]];
            while (*slot >= 0) slot = &v->same[*slot];
            *slot = t;
            continue;
        }
        while (depth > lcp) v->skip[path[--depth]] = v->n_nodes;
        for (; depth < L; depth++) {
            uint32_t id = v->n_nodes++;
            v->byte[id] = b[depth];
            v->depth[id] = (uint16_t)(depth + 1);
            v->tok[id] = -1;
            path[depth] = id;
        }
        v->tok[path[L - 1]] = t;
        if (L > v->max_depth) v->max_depth = (uint16_t)L;
        prev = t;
    }
    while (depth) v->skip[path[--depth]] = v->n_nodes;
    free(path);
    free(order);
    return v;
oom:
    free(order);
    grammar_vocab_free(v);
    return NULL;
}

void grammar_vocab_free(GrammarVocab *v) {
    if (!v) return;
    free(v->kind);
    free(v->bytes);
    free(v->len);
    free(v->pool);
    free(v->byte);
    free(v->depth);
    free(v->skip);
    free(v->tok);
    free(v->same);
    free(v->added);
    free(v->eos);
    free(v);
}

size_t grammar_vocab_nodes(const GrammarVocab *v) { return v->n_nodes; }

static int added_index(const GrammarVocab *v, int tok) {
    int lo = 0, hi = v->n_added - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (v->added[mid] == tok) return mid;
        if (v->added[mid] < tok) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

/* The state after token tok's bytes, or G_DEAD. */
static int32_t after_token(GrammarRun *r, int tok) {
    const GrammarVocab *v = r->v;
    if (tok < 0 || tok >= v->n) return G_DEAD;
    int k = v->kind[tok];
    if (k == GV_NONE || k == GV_EOS) return G_DEAD;
    if (k == GV_ADDED) {
        int i = added_index(v, tok);
        if (i < 0 || !r->added_ok[i]) return G_DEAD;
    }
    int32_t s = r->cur;
    for (size_t i = 0; i < v->len[tok] && s >= 0; i++) s = gstate_next(r, s, (unsigned char)v->bytes[tok][i]);
    return s;
}

static int is_eos(const GrammarVocab *v, int tok) { return tok >= 0 && tok < v->n && v->kind[tok] == GV_EOS; }

int grammar_allows(GrammarRun *r, int tok, int budget) {
    if (is_eos(r->v, tok)) return grammar_complete(r);
    int32_t s = after_token(r, tok);
    return s >= 0 && (budget < 0 || r->st[s].minb <= (uint32_t)budget);
}

int grammar_accept(GrammarRun *r, int tok) {
    if (is_eos(r->v, tok)) return grammar_complete(r) ? 0 : -1;
    int32_t s = after_token(r, tok);
    if (s < 0) return -1;
    r->cur = s;
    return 0;
}

void grammar_mask_drop(GrammarRun *r) {
    for (size_t i = 0; i < r->n_st; i++) {
        free(r->st[i].mask);
        r->st[i].mask = NULL;
        r->st[i].mask_count = -1;
    }
    r->masks_cached = 0;
}

/* Fills bits (cleared first) with the tokens allowed from the current state; with budget >= 0
 * only those whose next state needs at most budget bytes. Returns the count; *maxnext gets the
 * largest minb among the allowed tokens' next states. */
static int walk(GrammarRun *r, uint32_t *bits, int budget, uint32_t *maxnext) {
    const GrammarVocab *v = r->v;
    size_t words = ((size_t)v->n + 31) / 32;
    memset(bits, 0, words * sizeof *bits);
    if (!r->walk_state && !(r->walk_state = malloc(((size_t)v->max_depth + 1) * sizeof *r->walk_state))) {
        r->failed = 1;
        return -1;
    }
    int32_t *ws = r->walk_state;
    ws[0] = r->cur;
    int count = 0;
    uint32_t mx = 0, lim = budget < 0 ? UINT32_MAX : (uint32_t)budget;
    for (uint32_t i = 0, N = v->n_nodes; i < N;) {
        int32_t s = ws[v->depth[i] - 1], ns;
        const int32_t *next = r->st[s].next;
        ns = next ? next[v->byte[i]] : G_UNKNOWN;
        if (ns == G_UNKNOWN) {
            ns = gstate_next(r, s, v->byte[i]);
            if (r->failed) return -1;
        }
        if (ns < 0) {
            i = v->skip[i];
            continue;
        }
        ws[v->depth[i]] = ns;
        if (v->tok[i] >= 0) {
            uint32_t mb = r->st[ns].minb;
            if (mb <= lim) {
                if (mb > mx) mx = mb;
                for (int32_t t = v->tok[i]; t >= 0; t = v->same[t]) {
                    bits[t >> 5] |= 1u << (t & 31);
                    count++;
                }
            }
        }
        i++;
    }
    for (int32_t k = 0; k < v->n_added; k++) {
        int32_t t = v->added[k], s = r->added_ok[k] ? after_token(r, t) : G_DEAD;
        if (r->failed) return -1;
        if (s >= 0 && r->st[s].minb <= lim) {
            if (r->st[s].minb > mx) mx = r->st[s].minb;
            bits[t >> 5] |= 1u << (t & 31);
            count++;
        }
    }
    if (grammar_complete(r))
        for (int32_t k = 0; k < v->n_eos; k++) {
            int32_t t = v->eos[k];
            bits[t >> 5] |= 1u << (t & 31);
            count++;
        }
    *maxnext = mx;
    return count;
}

int grammar_mask(GrammarRun *r, int budget, const uint32_t **bits) {
    const GrammarVocab *v = r->v;
    size_t bytes = (((size_t)v->n + 31) / 32) * sizeof(uint32_t);
    int32_t s = r->cur;
    if (!r->st[s].mask) {
        if (r->masks_cached * bytes >= r->mask_cache_bytes) grammar_mask_drop(r); /* past its bound: rebuilt on use */
        uint32_t *m = malloc(bytes), mx = 0;
        if (!m) {
            r->failed = 1;
            return -1;
        }
        int count = walk(r, m, -1, &mx);
        if (count < 0) {
            free(m);
            return -1;
        }
        r->st[s].mask = m;
        r->st[s].mask_count = count;
        r->st[s].mask_maxnext = mx;
        r->masks_cached++;
        r->masks_built++;
    } else r->mask_hits++;
    const GState *st = &r->st[s];
    if (budget < 0 || st->mask_maxnext <= (uint32_t)budget) {
        *bits = st->mask;
        return st->mask_count;
    }
    /* near the end of the budget: keep only tokens after which the grammar can still finish */
    if (!r->scratch_mask && !(r->scratch_mask = malloc(bytes))) {
        r->failed = 1;
        return -1;
    }
    uint32_t mx;
    int count = walk(r, r->scratch_mask, budget, &mx);
    *bits = r->scratch_mask;
    return count;
}

int grammar_mask_max_next(const GrammarRun *r) {
    const GState *st = &r->st[r->cur];
    return st->mask ? (int)st->mask_maxnext : -1;
}

/* Per token: kind, bytes, len, added, eos, same (29), the engine's build arrays and the sort order
 * alive with them (21), the masked logits (4), and its bytes in the pool and the trie (12 per byte,
 * 8 bytes a token: real tokenizers average 5.0 to 7.0). Per run: the current and the filtered mask
 * and 1 MiB of DFA transitions (about a thousand states). */
uint64_t grammar_reserve_bytes(int vocab, int runs) {
    const uint64_t V = vocab > 0 ? (uint64_t)vocab : 0, mask = ((V + 31) / 32) * 4;
    return V * 150 + 65536 * 4 + (uint64_t)(runs > 0 ? runs : 1) * (2 * mask + (1u << 20));
}
