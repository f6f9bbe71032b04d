/* The matcher: pushdown stacks as shared, hash-consed frames (a frame is the element to match
 * next plus the frame to return to), sets of stacks interned as DFA states, and transitions
 * between states computed on first use, byte by byte (UTF-8 sequences are assembled in the
 * state, so a token may end inside a character). A rule reference in tail position reuses its
 * caller's frame, so `x*` loops back to the same state instead of growing the stack. */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_internal.h"
#include "util/grow.h"

/* ---- maps ---- */
static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

int gmap_get(const GMap *m, uint64_t key, int32_t *val) {
    if (!m->cap) return 0;
    for (size_t at = mix(key) & (m->cap - 1);; at = (at + 1) & (m->cap - 1)) {
        if (m->vals[at] < 0) return 0;
        if (m->keys[at] == key) {
            *val = m->vals[at];
            return 1;
        }
    }
}

int gmap_put(GMap *m, uint64_t key, int32_t val) {
    if ((m->n + 1) * 2 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 256;
        uint64_t *k = malloc(cap * sizeof *k);
        int32_t *v = malloc(cap * sizeof *v);
        if (!k || !v) {
            free(k);
            free(v);
            return -1;
        }
        memset(v, 0xFF, cap * sizeof *v);
        for (size_t i = 0; i < m->cap; i++) {
            if (m->vals[i] < 0) continue;
            size_t at = mix(m->keys[i]) & (cap - 1);
            while (v[at] >= 0) at = (at + 1) & (cap - 1);
            k[at] = m->keys[i];
            v[at] = m->vals[i];
        }
        free(m->keys);
        free(m->vals);
        m->keys = k;
        m->vals = v;
        m->cap = cap;
    }
    size_t at = mix(key) & (m->cap - 1);
    while (m->vals[at] >= 0 && m->keys[at] != key) at = (at + 1) & (m->cap - 1);
    if (m->vals[at] < 0) m->n++;
    m->keys[at] = key;
    m->vals[at] = val;
    return 0;
}

void gmap_free(GMap *m) {
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

/* 1 if key was already in the set, 0 if added now, -1 out of memory. */
static int seen_add(GSeen *m, uint64_t key) {
    if (!m->gen) m->gen = 1;
    if ((m->n + 1) * 2 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 256;
        uint64_t *k = malloc(cap * sizeof *k);
        uint32_t *st = calloc(cap, sizeof *st);
        if (!k || !st) {
            free(k);
            free(st);
            return -1;
        }
        for (size_t i = 0; i < m->cap; i++) {
            if (m->stamp[i] != m->gen) continue;
            size_t at = mix(m->keys[i]) & (cap - 1);
            while (st[at] == m->gen) at = (at + 1) & (cap - 1);
            k[at] = m->keys[i];
            st[at] = m->gen;
        }
        free(m->keys);
        free(m->stamp);
        m->keys = k;
        m->stamp = st;
        m->cap = cap;
    }
    size_t at = mix(key) & (m->cap - 1);
    for (; m->stamp[at] == m->gen; at = (at + 1) & (m->cap - 1))
        if (m->keys[at] == key) return 1;
    m->keys[at] = key;
    m->stamp[at] = m->gen;
    m->n++;
    return 0;
}

static void seen_clear(GSeen *m) {
    m->n = 0;
    if (++m->gen == 0) { /* wrapped: stamps of 2^32 generations ago would look current */
        if (m->cap) memset(m->stamp, 0, m->cap * sizeof *m->stamp);
        m->gen = 1;
    }
}

/* ---- frames ---- */
static int32_t node_get(GrammarRun *r, uint32_t pos, int32_t parent) {
    uint64_t key = (uint64_t)pos << 32 | (uint32_t)parent;
    int32_t id;
    if (gmap_get(&r->node_map, key, &id)) return id;
    GNode *nodes = r->n_nodes >= 0x7FFFFFF0 ? NULL : grow_array(r->nodes, &r->nodes_cap, r->n_nodes + 1, sizeof *nodes, 64);
    if (!nodes) {
        r->failed = 1;
        return -1;
    }
    r->nodes = nodes;
    id = (int32_t)r->n_nodes;
    uint32_t mb = r->g->minrest[pos] + (parent > G_EMPTY ? r->nodes[parent].minb : 0);
    r->nodes[r->n_nodes++] = (GNode){pos, parent, mb > G_INF_BYTES ? G_INF_BYTES : mb};
    if (gmap_put(&r->node_map, key, id)) {
        r->failed = 1;
        return -1;
    }
    return id;
}

static int work_push(GrammarRun *r, uint32_t pos, int32_t parent) {
    uint64_t key = (uint64_t)pos << 32 | (uint32_t)parent;
    int had = seen_add(&r->seen, key);
    if (had > 0) return 0; /* this (element, continuation) was expanded already */
    if (++r->work_total > r->work_limit || r->n_nodes > GRAMMAR_MAX_NODES) {
        r->failed = 1;
        return -1;
    }
    uint64_t *work = had < 0 ? NULL : grow_array(r->work, &r->work_cap, r->work_n + 1, sizeof *work, 64);
    if (!work) {
        r->failed = 1;
        return -1;
    }
    r->work = work;
    r->work[r->work_n++] = key;
    return 0;
}

static int out_push(GrammarRun *r, uint32_t id) {
    uint32_t *out = grow_array(r->out, &r->out_cap, r->out_n + 1, sizeof *out, 64);
    if (!out) {
        r->failed = 1;
        return -1;
    }
    r->out = out;
    r->out[r->out_n++] = id;
    return 0;
}

/* Runs the pending work to frames topped by a character (or the empty stack) into r->out. */
static int expand(GrammarRun *r) {
    const GElem *el = r->g->el;
    while (r->work_n) {
        uint64_t key = r->work[--r->work_n];
        uint32_t pos = (uint32_t)(key >> 32);
        int32_t parent = (int32_t)(uint32_t)key;
        const GElem *e = &el[pos];
        if (e->type == GE_END || e->type == GE_ALT) {
            if (parent == G_EMPTY) {
                if (out_push(r, G_EMPTY)) return -1;
            } else if (work_push(r, r->nodes[parent].pos, r->nodes[parent].parent)) return -1;
        } else if (e->type == GE_REF) {
            int32_t cont = parent;
            if (el[pos + 1].type != GE_END && el[pos + 1].type != GE_ALT && (cont = node_get(r, pos + 1, parent)) < 0) return -1;
            for (uint32_t i = r->g->rule_start[e->a];;) {
                if (work_push(r, i, cont)) return -1;
                while (el[i].type != GE_ALT && el[i].type != GE_END) i++;
                if (el[i].type == GE_END) break;
                i++;
            }
        } else {
            int32_t id = node_get(r, pos, parent);
            if (id < 0 || out_push(r, (uint32_t)id)) return -1;
        }
    }
    return 0;
}

/* ---- characters ---- */
static int class_hits(const Grammar *g, const GElem *e, uint32_t lo, uint32_t hi) {
    const uint32_t *rg = g->ranges + 2 * e->a;
    if (e->type == GE_CHAR) {
        for (uint32_t k = 0; k < e->b; k++)
            if (rg[2 * k] <= hi && rg[2 * k + 1] >= lo) return 1;
        return 0;
    }
    for (uint32_t cp = lo, moved = 1; moved;) { /* a code point in [lo, hi] no range covers? */
        moved = 0;
        for (uint32_t k = 0; k < e->b; k++)
            if (cp >= rg[2 * k] && cp <= rg[2 * k + 1]) {
                if (rg[2 * k + 1] >= hi) return 0;
                cp = rg[2 * k + 1] + 1;
                moved = 1;
            }
    }
    return 1;
}

/* The code points a UTF-8 sequence of need bytes starting with pend[0..npend) can still become. */
static void pending_range(const uint8_t *pend, int npend, int need, uint32_t *plo, uint32_t *phi) {
    uint32_t lo = pend[0] & (need == 2 ? 0x1F : need == 3 ? 0x0F : 0x07), hi;
    for (int k = 1; k < npend; k++) lo = lo << 6 | (pend[k] & 0x3F);
    hi = lo;
    for (int k = npend; k < need; k++) {
        lo = lo << 6;
        hi = hi << 6 | 0x3F;
    }
    uint32_t floor = need == 2 ? 0x80 : need == 3 ? 0x800 : 0x10000;
    *plo = lo < floor ? floor : lo;
    *phi = hi > 0x10FFFF ? 0x10FFFF : hi;
}

/* Does the stack topped by nd accept some character in [lo, hi] (surrogates excluded)? */
static int stack_can_take(const Grammar *g, const GNode *nd, uint32_t lo, uint32_t hi) {
    const GElem *e = &g->el[nd->pos];
    if (lo > hi) return 0;
    return (lo < 0xD800 && class_hits(g, e, lo, hi < 0xD7FF ? hi : 0xD7FF)) ||
           (hi > 0xDFFF && class_hits(g, e, lo > 0xE000 ? lo : 0xE000, hi));
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t state_hash(const uint32_t *ids, size_t n, const uint8_t *pend, int npend) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    for (size_t i = 0; i < n; i++) h = mix(h ^ ids[i]);
    for (int i = 0; i < npend; i++) h = mix(h ^ (0x100u + pend[i]));
    return h;
}

/* The state for node set ids (sorted, unique) with pending bytes; -1 on out of memory. */
static int32_t state_get(GrammarRun *r, const uint32_t *ids, size_t n, const uint8_t *pend, int npend, int need) {
    static const uint8_t none[4];
    if (!pend) pend = none;
    uint64_t h = state_hash(ids, n, pend, npend);
    for (int32_t id; gmap_get(&r->st_map, h, &id); h = mix(h + 1)) { /* a hash collision probes on */
        const GState *s = &r->st[id];
        if (s->set_n == n && s->npend == npend && !memcmp(r->pool + s->set_off, ids, n * sizeof *ids) &&
            !memcmp(s->pend, pend, (size_t)npend))
            return id;
    }
    uint32_t *pool = grow_array(r->pool, &r->pool_cap, r->pool_n + n, sizeof *pool, 64);
    if (pool) r->pool = pool;
    GState *sts = pool ? grow_array(r->st, &r->st_cap, r->n_st + 1, sizeof *sts, 64) : NULL;
    if (sts) r->st = sts;
    if (!sts || r->n_st >= 0x7FFFFFF0) {
        r->failed = 1;
        return -1;
    }
    int32_t id = (int32_t)r->n_st++;
    GState *s = &r->st[id];
    memset(s, 0, sizeof *s);
    s->set_off = (uint32_t)r->pool_n;
    s->set_n = (uint32_t)n;
    memcpy(r->pool + r->pool_n, ids, n * sizeof *ids);
    r->pool_n += n;
    memcpy(s->pend, pend, (size_t)npend);
    s->npend = (uint8_t)npend;
    s->need = (uint8_t)need;
    s->complete = n && ids[0] == G_EMPTY && !npend;
    s->finished = s->complete && n == 1;
    uint32_t mb = G_INF_BYTES;
    for (size_t i = 0; i < n; i++) {
        uint32_t m = ids[i] == G_EMPTY ? 0 : r->nodes[ids[i]].minb;
        if (m < mb) mb = m;
    }
    if (npend) { /* the rest of this character, then the rest of a stack that can take it */
        const Grammar *g = r->g;
        uint32_t lo, hi;
        pending_range(pend, npend, need, &lo, &hi);
        mb = G_INF_BYTES;
        for (size_t i = 0; i < n; i++) {
            if (ids[i] == G_EMPTY) continue;
            const GNode *nd = &r->nodes[ids[i]];
            if (!stack_can_take(g, nd, lo, hi)) continue;
            uint32_t m = nd->minb - (g->minrest[nd->pos] - g->minrest[nd->pos + 1]) + (uint32_t)(need - npend);
            if (m < mb) mb = m;
        }
    }
    s->minb = mb;
    s->mask_count = -1;
    if (gmap_put(&r->st_map, h, id)) {
        r->failed = 1;
        return -1;
    }
    return id;
}

/* r->out (unsorted, maybe with repeats) as a state. */
static int32_t state_from_out(GrammarRun *r, const uint8_t *pend, int npend, int need) {
    if (!r->out_n) return G_DEAD;
    qsort(r->out, r->out_n, sizeof *r->out, cmp_u32);
    size_t k = 0;
    for (size_t i = 0; i < r->out_n; i++)
        if (!k || r->out[i] != r->out[k - 1]) r->out[k++] = r->out[i];
    r->out_n = k;
    return state_get(r, r->out, k, pend, npend, need);
}

/* Does some stack of state s accept some character in [lo, hi]? */
static int set_can_take(const GrammarRun *r, const GState *s, uint32_t lo, uint32_t hi) {
    for (uint32_t i = 0; i < s->set_n; i++) {
        uint32_t id = r->pool[s->set_off + i];
        if (id != G_EMPTY && stack_can_take(r->g, &r->nodes[id], lo, hi)) return 1;
    }
    return 0;
}

/* The state after code point cp from state s's stacks. */
static int32_t advance_cp(GrammarRun *r, int32_t s, uint32_t cp) {
    r->out_n = 0;
    r->work_n = 0;
    seen_clear(&r->seen);
    const GState *st = &r->st[s];
    for (uint32_t i = 0; i < st->set_n; i++) {
        uint32_t id = r->pool[st->set_off + i];
        if (id == G_EMPTY) continue;
        const GNode *nd = &r->nodes[id];
        if (!class_hits(r->g, &r->g->el[nd->pos], cp, cp)) continue;
        if (work_push(r, nd->pos + 1, nd->parent)) return G_DEAD;
        st = &r->st[s];
    }
    if (expand(r)) return G_DEAD;
    return state_from_out(r, NULL, 0, 0);
}

static int32_t compute_next(GrammarRun *r, int32_t s, unsigned b) {
    GState st = r->st[s]; /* a copy: r->st may move */
    if (!st.npend) {
        if (b < 0x80) return advance_cp(r, s, b);
        int need = b >= 0xF0 && b <= 0xF4 ? 4 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xC2 && b <= 0xDF ? 2 : 0;
        if (!need) return G_DEAD;
        st.pend[0] = (uint8_t)b;
        st.npend = 1;
        st.need = (uint8_t)need;
    } else {
        if ((b & 0xC0) != 0x80) return G_DEAD;
        st.pend[st.npend++] = (uint8_t)b;
    }
    uint32_t lo, hi;
    pending_range(st.pend, st.npend, st.need, &lo, &hi);
    if (lo > hi || !set_can_take(r, &st, lo, hi)) return G_DEAD;
    if (st.npend == st.need) return advance_cp(r, s, lo);
    /* the same stacks with a longer partial character; copied out, as the pool may move */
    uint32_t *out = grow_array(r->out, &r->out_cap, st.set_n, sizeof *out, 64);
    if (!out) {
        r->failed = 1;
        return G_DEAD;
    }
    r->out = out;
    memcpy(r->out, r->pool + st.set_off, st.set_n * sizeof(uint32_t));
    return state_get(r, r->out, st.set_n, st.pend, st.npend, st.need);
}

int32_t gstate_next(GrammarRun *r, int32_t s, unsigned byte) {
    GState *st = &r->st[s];
    if (!st->next) {
        if (!(st->next = malloc(256 * sizeof(int32_t)))) {
            r->failed = 1;
            return G_DEAD;
        }
        for (int i = 0; i < 256; i++) st->next[i] = G_UNKNOWN;
    }
    int32_t n = st->next[byte];
    if (n != G_UNKNOWN) return n;
    n = compute_next(r, s, byte);
    if (r->failed) return G_DEAD; /* not cached: out of memory is not an answer */
    r->st[s].next[byte] = n;
    return n;
}

/* ---- the run ---- */
GrammarRun *grammar_run_new(const Grammar *g, const GrammarVocab *v) {
    GrammarRun *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->g = g;
    r->v = v;
    r->work_limit = GRAMMAR_MAX_WORK;
    r->mask_cache_bytes = GRAMMAR_MASK_CACHE_DEFAULT;
    if (v && v->n_added && !(r->added_ok = calloc((size_t)v->n_added, 1))) {
        grammar_run_free(r);
        return NULL;
    }
    for (int32_t i = 0; v && i < v->n_added; i++) {
        int32_t t = v->added[i];
        r->added_ok[i] = (uint8_t)grammar_has_literal(g, v->bytes[t], v->len[t]);
    }
    GNode empty = {UINT32_MAX, -1, 0};
    GNode *nodes = grow_array(r->nodes, &r->nodes_cap, 1, sizeof *nodes, 64);
    if (!nodes) {
        grammar_run_free(r);
        return NULL;
    }
    r->nodes = nodes;
    r->nodes[r->n_nodes++] = empty;
    for (uint32_t i = g->rule_start[g->root];;) { /* root's alternatives, returning to the empty stack */
        if (work_push(r, i, G_EMPTY)) break;
        while (g->el[i].type != GE_ALT && g->el[i].type != GE_END) i++;
        if (g->el[i].type == GE_END) break;
        i++;
    }
    if (!r->failed && !expand(r)) r->start = state_from_out(r, NULL, 0, 0);
    if (r->failed || r->start < 0) {
        grammar_run_free(r);
        return NULL;
    }
    r->cur = r->start;
    return r;
}

void grammar_run_free(GrammarRun *r) {
    if (!r) return;
    for (size_t i = 0; i < r->n_st; i++) {
        free(r->st[i].next);
        free(r->st[i].mask);
    }
    free(r->st);
    free(r->nodes);
    free(r->pool);
    free(r->out);
    free(r->work);
    free(r->added_ok);
    free(r->scratch_mask);
    free(r->walk_state);
    gmap_free(&r->node_map);
    gmap_free(&r->st_map);
    free(r->seen.keys);
    free(r->seen.stamp);
    free(r);
}

void grammar_run_reset(GrammarRun *r) {
    r->cur = r->start;
    r->work_total = 0;
}
void grammar_run_set_work_limit(GrammarRun *r, uint64_t steps) { r->work_limit = steps; }
void grammar_run_set_mask_cache(GrammarRun *r, size_t bytes) { r->mask_cache_bytes = bytes; }
const Grammar *grammar_run_grammar(const GrammarRun *r) { return r->g; }
int grammar_run_failed(const GrammarRun *r) { return r->failed; }
int grammar_complete(const GrammarRun *r) { return r->st[r->cur].complete; }
int grammar_finished(const GrammarRun *r) { return r->st[r->cur].finished; }
int grammar_min_bytes(const GrammarRun *r) { return (int)r->st[r->cur].minb; }

int grammar_accept_bytes(GrammarRun *r, const char *s, size_t n, size_t *at) {
    int32_t st = r->cur;
    for (size_t i = 0; i < n; i++) {
        st = gstate_next(r, st, (unsigned char)s[i]);
        if (st < 0) {
            if (at) *at = i;
            return -1;
        }
    }
    r->cur = st;
    return 0;
}

void grammar_stats(const GrammarRun *r, GrammarStats *s) {
    s->masks_built = r->masks_built;
    s->mask_hits = r->mask_hits;
    s->dfa_states = r->n_st;
    s->nodes = r->n_nodes;
}
