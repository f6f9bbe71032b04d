/* BPE model: vocab/merge hash maps and the merge loop.
 *
 * Merging follows HF tokenizers' Word::merge_all exactly: repeatedly apply the adjacent pair
 * with the lowest (rank, position). Short pieces use a direct scan (cheaper than a heap for a
 * handful of symbols); long ones a binary heap over a linked list, O(n log n), so a 1 MB
 * "word" is not quadratic. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "util/grow.h"

/* ------------------------------------------------------------------ string map */

static uint64_t hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ ((uint64_t)n * 0xC2B2AE3D27D4EB4Full);
    while (n >= 8) {
        uint64_t x;
        memcpy(&x, p, 8);
        h = (h ^ x) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) x |= (uint64_t)p[i] << (8 * i);
    h = (h ^ x) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 29;
    h *= 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 32;
    return h;
}

static int strmap_rehash(TokStrMap *m, size_t cap) {
    uint32_t *slots = calloc(cap, sizeof *slots);
    if (!slots) return -1;
    for (size_t i = 0; i < m->n; i++) {
        size_t j = (size_t)m->ents[i].hash & (cap - 1);
        while (slots[j]) j = (j + 1) & (cap - 1);
        slots[j] = (uint32_t)(i + 1);
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return 0;
}

static int strmap_grow(TokStrMap *m) { return strmap_rehash(m, m->cap ? m->cap * 2 : 1024); }

int tok_strmap_reserve(TokStrMap *m, size_t n) {
    size_t cap = 1024;
    while (cap < 2 * n) cap *= 2;
    if (cap > m->cap && strmap_rehash(m, cap)) return -1;
    if (n > m->ents_cap) {
        void *v = realloc(m->ents, n * sizeof *m->ents);
        if (!v) return -1;
        m->ents = v;
        m->ents_cap = n;
    }
    return 0;
}

int32_t tok_strmap_get(const TokStrMap *m, const void *key, size_t len) {
    if (!m->cap) return -1;
    uint64_t h = hash_bytes(key, len);
    size_t j = (size_t)h & (m->cap - 1);
    for (;;) {
        uint32_t s = m->slots[j];
        if (!s) return -1;
        const struct TokStrEnt *e = &m->ents[s - 1];
        if (e->hash == h && e->len == len && !memcmp(m->pool.p + e->off, key, len)) return e->id;
        j = (j + 1) & (m->cap - 1);
    }
}

int tok_strmap_put(TokStrMap *m, const void *key, size_t len, int32_t id) {
    if (len > 0xFFFFFFFFu || m->pool.n + len > 0xFFFFFFFFu || m->n >= 0x7FFFFFFF) return -1;
    if ((m->n + 1) * 2 > m->cap && strmap_grow(m)) return -1;
    uint64_t h = hash_bytes(key, len);
    size_t j = (size_t)h & (m->cap - 1);
    for (;;) {
        uint32_t s = m->slots[j];
        if (!s) break;
        struct TokStrEnt *e = &m->ents[s - 1];
        if (e->hash == h && e->len == len && !memcmp(m->pool.p + e->off, key, len)) {
            e->id = id;
            return 0;
        }
        j = (j + 1) & (m->cap - 1);
    }
    struct TokStrEnt *ents = grow_array(m->ents, &m->ents_cap, m->n + 1, sizeof *ents, 1024);
    if (!ents) return -1;
    m->ents = ents;
    uint32_t off = (uint32_t)m->pool.n;
    if (tok_buf_put(&m->pool, key, len)) return -1;
    m->ents[m->n] = (struct TokStrEnt){h, off, (uint32_t)len, id};
    m->slots[j] = (uint32_t)(++m->n);
    return 0;
}

void tok_strmap_free(TokStrMap *m) {
    free(m->slots);
    free(m->ents);
    free(m->pool.p);
    memset(m, 0, sizeof *m);
}

/* ------------------------------------------------------------------ pair map */

typedef struct {
    uint64_t key;
    uint32_t rank;
    int32_t new_id;
} PairEnt;
#define PAIR_EMPTY UINT64_MAX

struct TokBpe {
    TokBpeOpts o;
    TokStrMap vocab;      /* model-domain key -> id */
    int32_t byte_id[256]; /* byte_units: id of each single-byte token, -1 if none */
    PairEnt *pairs;
    size_t pairs_cap, pairs_n;
    /* rank_mode needs each id's key to concatenate pairs */
    uint32_t *key_off, *key_len;
    size_t keys_cap;
    TokBuf keys;
    size_t max_key;
};

struct TokBpeScratch {
    struct Sym {
        int32_t id;
        int32_t prev, next;
        uint32_t len;
    } *sym;
    size_t sym_cap;
    struct HeapEnt {
        uint32_t rank;
        uint32_t pos;
        int32_t new_id;
    } *heap;
    size_t heap_cap;
    TokBuf cat; /* rank_mode concatenation */
};

static inline uint64_t pair_hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xFF51AFD7ED558CCDull;
    k ^= k >> 33;
    return k;
}

static int pairs_rehash(TokBpe *b, size_t cap) {
    PairEnt *v = malloc(cap * sizeof *v);
    if (!v) return -1;
    for (size_t i = 0; i < cap; i++) v[i].key = PAIR_EMPTY;
    for (size_t i = 0; i < b->pairs_cap; i++) {
        if (b->pairs[i].key == PAIR_EMPTY) continue;
        size_t j = (size_t)pair_hash(b->pairs[i].key) & (cap - 1);
        while (v[j].key != PAIR_EMPTY) j = (j + 1) & (cap - 1);
        v[j] = b->pairs[i];
    }
    free(b->pairs);
    b->pairs = v;
    b->pairs_cap = cap;
    return 0;
}

static int pairs_grow(TokBpe *b) { return pairs_rehash(b, b->pairs_cap ? b->pairs_cap * 2 : 4096); }

int tok_bpe_reserve(TokBpe *b, size_t ntokens, size_t nmerges) {
    size_t cap = 4096;
    while (cap < 2 * nmerges) cap *= 2;
    if (cap > b->pairs_cap && pairs_rehash(b, cap)) return -1;
    return tok_strmap_reserve(&b->vocab, ntokens);
}

static inline const PairEnt *pair_get(const TokBpe *b, int32_t x, int32_t y) {
    if (!b->pairs_cap) return NULL;
    uint64_t k = ((uint64_t)(uint32_t)x << 32) | (uint32_t)y;
    size_t j = (size_t)pair_hash(k) & (b->pairs_cap - 1);
    for (;;) {
        const PairEnt *e = &b->pairs[j];
        if (e->key == k) return e;
        if (e->key == PAIR_EMPTY) return NULL;
        j = (j + 1) & (b->pairs_cap - 1);
    }
}

int tok_bpe_add_merge(TokBpe *b, int32_t x, int32_t y, int32_t new_id, uint32_t rank) {
    if ((b->pairs_n + 1) * 2 > b->pairs_cap && pairs_grow(b)) return -1;
    uint64_t k = ((uint64_t)(uint32_t)x << 32) | (uint32_t)y;
    size_t j = (size_t)pair_hash(k) & (b->pairs_cap - 1);
    while (b->pairs[j].key != PAIR_EMPTY && b->pairs[j].key != k) j = (j + 1) & (b->pairs_cap - 1);
    if (b->pairs[j].key == PAIR_EMPTY) b->pairs_n++;
    b->pairs[j] = (PairEnt){k, rank, new_id};
    return 0;
}

/* ------------------------------------------------------------------ model */

TokBpe *tok_bpe_new(void) {
    TokBpe *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->o.unk_id = -1;
    for (int i = 0; i < 256; i++) b->byte_id[i] = -1;
    return b;
}

void tok_bpe_free(TokBpe *b) {
    if (!b) return;
    tok_strmap_free(&b->vocab);
    free(b->pairs);
    free(b->key_off);
    free(b->key_len);
    free(b->keys.p);
    free(b);
}

TokBpeOpts *tok_bpe_opts(TokBpe *b) { return &b->o; }

int tok_bpe_add_token(TokBpe *b, const unsigned char *key, size_t len, int32_t id) {
    if (id < 0) return -1;
    if ((size_t)id >= b->keys_cap) { /* two arrays, one capacity: each grows from a copy of it */
        size_t cap = b->keys_cap, lcap = b->keys_cap;
        uint32_t *o = grow_array(b->key_off, &cap, (size_t)id + 1, sizeof *o, 1024);
        if (!o) return -1;
        b->key_off = o;
        uint32_t *l = grow_array(b->key_len, &lcap, (size_t)id + 1, sizeof *l, 1024);
        if (!l) return -1;
        b->key_len = l;
        for (size_t i = b->keys_cap; i < cap; i++) b->key_len[i] = UINT32_MAX;
        b->keys_cap = cap;
    }
    if (tok_strmap_put(&b->vocab, key, len, id)) return -1;
    if (b->keys.n + len > 0xFFFFFFFFu) return -1;
    b->key_off[id] = (uint32_t)b->keys.n;
    b->key_len[id] = (uint32_t)len;
    if (tok_buf_put(&b->keys, key, len)) return -1;
    if (len > b->max_key) b->max_key = len;
    if (len == 1) b->byte_id[key[0]] = id;
    return 0;
}

int32_t tok_bpe_lookup(const TokBpe *b, const unsigned char *key, size_t len) { return tok_strmap_get(&b->vocab, key, len); }

int tok_bpe_finish(TokBpe *b, char *err, size_t errlen) {
    (void)b;
    (void)err;
    (void)errlen;
    return 0;
}

void tok_bpe_scratch_free(TokBpeScratch *s) {
    if (!s) return;
    free(s->sym);
    free(s->heap);
    free(s->cat.p);
    free(s);
}

/* Merge lookup for the pair (x, y): HF merges map, or the concatenation's id in rank mode. */
static inline int find_merge(const TokBpe *b, TokBpeScratch *s, int32_t x, int32_t y, uint32_t *rank, int32_t *nid) {
    if (!b->o.rank_mode) {
        const PairEnt *e = pair_get(b, x, y);
        if (!e) return 0;
        *rank = e->rank;
        *nid = e->new_id;
        return 1;
    }
    if ((size_t)x >= b->keys_cap || (size_t)y >= b->keys_cap || b->key_len[x] == UINT32_MAX || b->key_len[y] == UINT32_MAX)
        return 0;
    size_t lx = b->key_len[x], ly = b->key_len[y];
    if (lx + ly > b->max_key) return 0;
    s->cat.n = 0;
    if (tok_buf_put(&s->cat, b->keys.p + b->key_off[x], lx) || tok_buf_put(&s->cat, b->keys.p + b->key_off[y], ly)) return 0;
    int32_t id = tok_strmap_get(&b->vocab, s->cat.p, lx + ly);
    if (id < 0) return 0;
    *rank = (uint32_t)id;
    *nid = id;
    return 1;
}

static inline int heap_less(const struct HeapEnt *a, const struct HeapEnt *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static int heap_push(TokBpeScratch *s, size_t *n, struct HeapEnt e) {
    struct HeapEnt *heap = grow_array(s->heap, &s->heap_cap, *n + 1, sizeof *heap, 256);
    if (!heap) return -1;
    s->heap = heap;
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&e, &s->heap[p])) break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = e;
    return 0;
}

static struct HeapEnt heap_pop(TokBpeScratch *s, size_t *n) {
    struct HeapEnt top = s->heap[0], last = s->heap[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&s->heap[c + 1], &s->heap[c])) c++;
        if (!heap_less(&s->heap[c], &last)) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (*n) s->heap[i] = last;
    return top;
}

static int add_sym(TokBpeScratch *s, size_t *n, int32_t id, uint32_t len) {
    struct Sym *sym = grow_array(s->sym, &s->sym_cap, *n + 1, sizeof *sym, 256);
    if (!sym) return -1;
    s->sym = sym;
    s->sym[*n] = (struct Sym){id, (int32_t)*n - 1, (int32_t)*n + 1, len};
    (*n)++;
    return 0;
}

#define SCAN_MAX 48 /* below this many symbols, a direct scan beats the heap */

int tok_bpe_encode(const TokBpe *b, const unsigned char *w, size_t n, TokIds *out, TokBpeScratch **scratch, char *err,
                   size_t errlen) {
    if (!n) return 0;
    if (n > 0x7FFFFFF0u) {
        snprintf(err, errlen, "piece too long");
        return -1;
    }
    if (b->o.ignore_merges) {
        int32_t id = tok_strmap_get(&b->vocab, w, n);
        if (id >= 0) return tok_ids_push(out, id) ? (snprintf(err, errlen, "out of memory"), -1) : 0;
    }
    if (!*scratch && !(*scratch = calloc(1, sizeof **scratch))) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    TokBpeScratch *s = *scratch;
    size_t ns = 0;
    int32_t unk = -1;
    uint32_t unk_len = 0;
    /* Initial symbols (HF BPE::merge_word: unknown units go to byte fallback, unk or nowhere). */
    for (size_t i = 0; i < n;) {
        size_t ul = 1;
        int32_t id;
        if (b->o.byte_units) id = b->byte_id[w[i]];
        else {
            ul = tok_u8_valid_len(w + i, n - i);
            if (!ul) ul = 1;
            id = tok_strmap_get(&b->vocab, w + i, ul);
        }
        if (id >= 0) {
            if (unk >= 0) {
                if (add_sym(s, &ns, unk, unk_len)) goto oom;
                unk = -1;
            }
            if (add_sym(s, &ns, id, (uint32_t)ul)) goto oom;
            i += ul;
            continue;
        }
        if (b->o.byte_fallback) {
            int32_t bids[4];
            size_t k = 0;
            for (; k < ul; k++) {
                char code[8];
                snprintf(code, sizeof code, "<0x%02X>", w[i + k]);
                if ((bids[k] = tok_strmap_get(&b->vocab, code, 6)) < 0) break;
            }
            if (k == ul) {
                for (k = 0; k < ul; k++)
                    if (add_sym(s, &ns, bids[k], 1)) goto oom;
                i += ul;
                continue;
            }
        }
        if (b->o.unk_id != -1) {
            if (b->o.unk_id == -2) {
                snprintf(err, errlen, "unk_token is not in the vocabulary");
                return -1;
            }
            if (unk >= 0 && b->o.fuse_unk) unk_len += (uint32_t)ul;
            else {
                if (unk >= 0 && add_sym(s, &ns, unk, unk_len)) goto oom;
                unk = b->o.unk_id;
                unk_len = (uint32_t)ul;
            }
        }
        i += ul;
    }
    if (unk >= 0 && add_sym(s, &ns, unk, unk_len)) goto oom;
    if (!ns) return 0;
    s->sym[ns - 1].next = -1;
    struct Sym *sym = s->sym;

    if (ns <= SCAN_MAX) {
        /* Direct scan: the symbols stay packed in an array. */
        int32_t ids[SCAN_MAX];
        for (size_t i = 0; i < ns; i++) ids[i] = sym[i].id;
        size_t m = ns;
        uint32_t rk[SCAN_MAX];
        int32_t nid[SCAN_MAX];
        for (size_t i = 0; i + 1 < m; i++)
            if (!find_merge(b, s, ids[i], ids[i + 1], &rk[i], &nid[i])) rk[i] = UINT32_MAX;
        while (m > 1) {
            size_t best = 0;
            for (size_t i = 1; i + 1 < m; i++)
                if (rk[i] < rk[best]) best = i;
            if (rk[best] == UINT32_MAX) break;
            ids[best] = nid[best];
            for (size_t i = best + 1; i + 1 < m; i++) ids[i] = ids[i + 1];
            for (size_t i = best + 1; i + 2 < m; i++) {
                rk[i] = rk[i + 1];
                nid[i] = nid[i + 1];
            }
            m--;
            if (best > 0 && !find_merge(b, s, ids[best - 1], ids[best], &rk[best - 1], &nid[best - 1])) rk[best - 1] = UINT32_MAX;
            if (best + 1 < m && !find_merge(b, s, ids[best], ids[best + 1], &rk[best], &nid[best])) rk[best] = UINT32_MAX;
        }
        for (size_t i = 0; i < m; i++)
            if (tok_ids_push(out, ids[i])) goto oom;
        return 0;
    }

    size_t nh = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        uint32_t r;
        int32_t id;
        if (find_merge(b, s, sym[i].id, sym[i + 1].id, &r, &id) && heap_push(s, &nh, (struct HeapEnt){r, (uint32_t)i, id}))
            goto oom;
    }
    while (nh) {
        struct HeapEnt top = heap_pop(s, &nh);
        struct Sym *cur = &sym[top.pos];
        if (!cur->len || cur->next < 0) continue;
        struct Sym *right = &sym[cur->next];
        uint32_t r;
        int32_t id;
        /* Stale entry: the pair at this position changed since it was queued. */
        if (!find_merge(b, s, cur->id, right->id, &r, &id) || id != top.new_id) continue;
        cur->id = top.new_id;
        cur->len += right->len;
        cur->next = right->next;
        right->len = 0;
        if (cur->next >= 0) sym[cur->next].prev = (int32_t)top.pos;
        if (cur->prev >= 0 && find_merge(b, s, sym[cur->prev].id, cur->id, &r, &id) &&
            heap_push(s, &nh, (struct HeapEnt){r, (uint32_t)cur->prev, id}))
            goto oom;
        if (cur->next >= 0 && find_merge(b, s, cur->id, sym[cur->next].id, &r, &id) &&
            heap_push(s, &nh, (struct HeapEnt){r, top.pos, id}))
            goto oom;
    }
    for (int32_t i = 0; i >= 0; i = sym[i].next)
        if (tok_ids_push(out, sym[i].id)) goto oom;
    return 0;
oom:
    snprintf(err, errlen, "out of memory");
    return -1;
}
