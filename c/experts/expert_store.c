/* The expert store's set-up: the MoE layers' experts and their byte ranges, the caches, the
 * unmapped expert pages, pinning, statistics. The forward pass is in expert_run.c. */
#include "experts/expert_store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "io/container.h"
#include "kernels/act_stats.h"
#include "experts/expert_cache.h"
#include "util/huge_alloc.h"

#define MAX_GAP 4096 /* bytes between an expert's tensors that one read may still span */

static int file_of(const Container *ct, const unsigned char *p) {
    for (size_t i = 0; i < ct->n_shards; i++)
        if (p >= ct->shards[i].map && p < ct->shards[i].map + ct->shards[i].size) return (int)i;
    return -1;
}

static uint64_t mat_bytes(const QMat *q) { return (uint64_t)q->rows * q->row_bytes; }

/* An expert's byte ranges: one when gate, up and down sit together in one file (what coli
 * convert writes), else one per tensor. */
static int expert_geom(const Container *ct, const Mlp *m, ExpertGeom *g) {
    const QMat *q[3] = {&m->gate, &m->up, &m->down};
    uint64_t lo = UINT64_MAX, hi = 0, sum = 0;
    int f0 = -1, same = 1;
    memset(g, 0, sizeof *g);
    for (int i = 0; i < 3; i++) {
        int f = file_of(ct, q[i]->data);
        if (f < 0) return -1;
        g->file[i] = f;
        g->toff[i] = (uint64_t)(q[i]->data - ct->shards[f].map);
        if (i == 0) f0 = f;
        same &= f == f0;
        uint64_t n = mat_bytes(q[i]);
        sum += n;
        if (g->toff[i] < lo) lo = g->toff[i];
        if (g->toff[i] + n > hi) hi = g->toff[i] + n;
    }
    if (same && hi - lo <= sum + MAX_GAP) {
        g->nseg = 1;
        g->file[0] = f0;
        g->off[0] = lo;
        g->len[0] = hi - lo;
        for (int i = 0; i < 3; i++) g->tseg[i] = 0;
        return 0;
    }
    g->nseg = 3;
    for (int i = 0; i < 3; i++) {
        g->off[i] = g->toff[i];
        g->len[i] = mat_bytes(q[i]);
        g->tseg[i] = i;
    }
    return 1;
}

/* Room for a segment read as its enclosing aligned range. */
static uint64_t seg_room(uint64_t len) { return ALIGN_UP(len) + PAGE; }

int expert_store_init(ExpertStore *s, const Container *ct, ExpertLayer *const *layers, int n, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    s->ct = ct;
    s->n = s->n_trunk = n;
    if (!s->n) return 0;
    s->layers = calloc((size_t)s->n, sizeof *s->layers);
    if (!s->layers) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int k = 0; k < n; k++) {
        ExpertLayer *xl = layers[k];
        xl->store = s;
        xl->index = k;
        xl->next = NULL;
        if (k) s->layers[k - 1]->next = xl;
        s->layers[k] = xl;
        if (xl->E > s->experts) s->experts = xl->E;
        for (int e = 0; e < xl->E; e++) {
            ExpertGeom g;
            int r = expert_geom(ct, &xl->experts[e], &g);
            if (r < 0) {
                snprintf(err, errlen, "layer %d expert %d: a tensor lies outside the shards", xl->layer, e);
                return -1;
            }
            s->split_reason |= r;
            uint64_t room = 0;
            for (int i = 0; i < g.nseg; i++) room += seg_room(g.len[i]);
            const Mlp *x = &xl->experts[e];
            uint64_t eb = mat_bytes(&x->gate) + mat_bytes(&x->up) + mat_bytes(&x->down);
            s->expert_total += eb;
            if (eb > s->expert_bytes) s->expert_bytes = eb;
            if (room > s->slot_bytes) s->slot_bytes = room;
        }
    }
    s->cap = s->experts;
    s->turn_counts = calloc((size_t)s->n * s->experts, sizeof(uint32_t));
    if (!s->turn_counts) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

uint64_t expert_store_dense_bytes(const ExpertStore *s) {
    const Container *ct = s->ct;
    uint64_t total = 0, f32 = 0, expert_f32 = 0;
    for (size_t i = 0; i < ct->n_shards; i++)
        for (size_t k = 0; k < ct->shards[i].n; k++) {
            const StTensor *t = &ct->shards[i].tensors[k];
            total += t->nbytes;
            if (!strcmp(t->dtype, "F32")) f32 += t->nbytes;
        }
    for (int k = 0; k < s->n; k++)
        for (int e = 0; e < s->layers[k]->E; e++) {
            const Mlp *x = &s->layers[k]->experts[e];
            if (x->gate.qt == QT_F32) expert_f32 += mat_bytes(&x->gate) + mat_bytes(&x->up) + mat_bytes(&x->down);
        }
    return total - s->expert_total + (f32 - expert_f32);
}

typedef struct {
    int file;
    uint64_t lo, hi;
} Range;

static int by_range(const void *a, const void *b) {
    const Range *x = a, *y = b;
    if (x->file != y->file) return x->file - y->file;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* The experts' byte ranges, merged, by file and offset; NULL when out of memory. */
static Range *expert_ranges(const ExpertStore *s, size_t *n_out) {
    size_t n = 0, cap = 1;
    for (int k = 0; k < s->n; k++) cap += (size_t)s->layers[k]->E * 3;
    Range *r = malloc(cap * sizeof *r);
    if (!r) return NULL;
    for (int k = 0; k < s->n; k++)
        for (int e = 0; e < s->layers[k]->E; e++) {
            const ExpertGeom *g = &s->layers[k]->cache->geom[e];
            for (int i = 0; i < g->nseg; i++) r[n++] = (Range){g->file[i], g->off[i], g->off[i] + g->len[i]};
        }
    qsort(r, n, sizeof *r, by_range);
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        Range u = r[i++];
        while (i < n && r[i].file == u.file && r[i].lo <= u.hi) {
            if (r[i].hi > u.hi) u.hi = r[i].hi;
            i++;
        }
        r[m++] = u;
    }
    *n_out = m;
    return r;
}

/* The pages between the unmapped experts (the dense weights) move from the file mapping into
 * anonymous huge pages at the same addresses: they are read every token, and the budget counts
 * them as RAM already. Pieces under a huge page stay mapped from the file. */
static void hold_dense(const ExpertStore *s, const Range *holes, size_t n_holes) {
    const Container *ct = s->ct;
    size_t h = 0;
    for (size_t f = 0; f < ct->n_shards; f++) {
        const StFile *sf = &ct->shards[f];
        uint64_t at = 0;
        for (;; h++) {
            const int more = h < n_holes && holes[h].file == (int)f;
            uint64_t lo = more ? ALIGN_UP(holes[h].lo) : ALIGN_UP(sf->size), hi = more ? ALIGN_DOWN(holes[h].hi) : lo;
            if (more && hi <= lo) continue; /* within a page: not unmapped */
            if (lo > at && lo - at >= HUGE_PAGE) huge_take_over(sf->map + at, lo - at);
            if (!more) break;
            at = hi;
        }
    }
}

/* The experts' pages are unmapped (an inaccessible reservation takes their place, so st_close
 * still unmaps the whole file): streaming never faults them in, and a stray access would crash
 * rather than silently grow the resident set past the budget. The rest moves to huge pages. */
static int unmap_experts(ExpertStore *s, char *err, size_t errlen) {
    size_t n = 0;
    Range *r = expert_ranges(s, &n);
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    const Container *ct = s->ct;
    for (size_t i = 0; i < n; i++) {
        uint64_t a = ALIGN_UP(r[i].lo), b = ALIGN_DOWN(r[i].hi);
        if (b <= a) continue;
        void *p =
            mmap(ct->shards[r[i].file].map + a, b - a, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            snprintf(err, errlen, "cannot unmap the expert ranges: %s", strerror(errno));
            free(r);
            return -1;
        }
    }
    hold_dense(s, r, n);
    free(r);
    return 0;
}

void expert_store_hold_dense(const ExpertStore *s) { hold_dense(s, NULL, 0); }

/* Points the slot's QMats at the expert's bytes inside buf and fills its read request. */
void slot_assign(ExpertStore *s, ExpertCache *c, const ExpertLayer *xl, int si, int e) {
    Slot *sl = &c->slots[si];
    const ExpertGeom *g = &c->geom[e];
    if (sl->expert >= 0) c->slot_of[sl->expert] = -1;
    sl->expert = e;
    c->slot_of[e] = si;
    sl->mlp = xl->experts[e];
    QMat *q[3] = {&sl->mlp.gate, &sl->mlp.up, &sl->mlp.down};
    for (int i = 0; i < 3; i++) {
        int j = g->tseg[i];
        q[i]->data = sl->buf + c->seg_dst[j] + (g->toff[i] - ALIGN_DOWN(g->off[j]));
    }
    act_stats_alias(sl->mlp.gate.data, xl->experts[e].gate.data);
    act_stats_alias(sl->mlp.up.data, xl->experts[e].up.data);
    act_stats_alias(sl->mlp.down.data, xl->experts[e].down.data);
    memset(&sl->req, 0, sizeof sl->req);
    sl->req.nseg = g->nseg;
    for (int j = 0; j < g->nseg; j++) {
        uint64_t a = ALIGN_DOWN(g->off[j]), b = ALIGN_UP(g->off[j] + g->len[j]);
        IoSeg *sg = &sl->req.seg[j];
        sg->fd_direct = s->direct ? s->fd_direct[g->file[j]] : -1;
        sg->fd_buf = s->fd_buf[g->file[j]];
        sg->off = a;
        sg->len = b - a;
        sg->need = g->off[j] + g->len[j] - a;
        sg->dst = sl->buf + c->seg_dst[j];
    }
    sl->state = SLOT_LOADING;
}

void read_failed(const ExpertStore *s, const ExpertLayer *xl, int e, int err) {
    const ExpertGeom *g = &xl->cache->geom[e];
    fprintf(stderr,
            "colibri: reading expert %d of layer %d from %s failed: %s; the model files are unreadable or "
            "truncated (check the disk, or re-run coli convert)\n",
            e, xl->layer, s->ct->shards[g->file[0]].path, strerror(err));
    exit(1);
}

/* A slot that may take a new expert: an empty one, else the least recently used ready one that
 * is neither pinned, in use by this layer's wave, nor (avoid != NULL) wanted. -1: none. */
int victim(const ExpertCache *c, const unsigned char *avoid) {
    int best = -1;
    for (int i = 0; i < c->cap; i++) {
        const Slot *sl = &c->slots[i];
        if (sl->state == SLOT_EMPTY) return i;
        if (sl->state != SLOT_READY || sl->busy || sl->pinned || (avoid && avoid[sl->expert])) continue;
        if (best < 0 || sl->last < c->slots[best].last) best = i;
    }
    return best;
}

/* Waits for the start-up reads in flight (load_start), every layer's. */
static void wait_start_reads(ExpertStore *s) {
    for (int k = 0; k < s->n; k++) {
        ExpertLayer *xl = s->layers[k];
        ExpertCache *c = xl->cache;
        for (int si = 0; si < c->cap; si++) {
            Slot *sl = &c->slots[si];
            if (sl->state != SLOT_LOADING) continue;
            int err = io_wait(&s->pool, &sl->req);
            if (err) read_failed(s, xl, sl->expert, err);
            sl->state = SLOT_READY;
        }
    }
}

/* Expert e of layer k into a free slot, its read submitted. */
static Slot *load_start(ExpertStore *s, ExpertLayer *xl, int e) {
    ExpertCache *c = xl->cache;
    int si = victim(c, NULL);
    slot_assign(s, c, xl, si, e);
    io_submit(&s->pool, &c->slots[si].req, 0);
    return &c->slots[si];
}

int expert_store_stream(ExpertStore *s, const StoreOptions *o, char *err, size_t errlen) {
    if (!s->n) return 0;
    const Container *ct = s->ct;
    s->streaming = 1;
    s->cap = o->cap;
    s->readahead = o->readahead;
    s->n_files = (int)ct->n_shards;
    s->fd_direct = malloc(sizeof(int) * (size_t)s->n_files);
    s->fd_buf = malloc(sizeof(int) * (size_t)s->n_files);
    if (!s->fd_direct || !s->fd_buf) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int i = 0; i < s->n_files; i++) s->fd_direct[i] = s->fd_buf[i] = -1;
    s->direct = o->direct;
    for (int i = 0; i < s->n_files; i++) {
        s->fd_buf[i] = open(ct->shards[i].path, O_RDONLY | O_CLOEXEC);
        if (s->fd_buf[i] < 0) {
            snprintf(err, errlen, "%s: cannot open: %s", ct->shards[i].path, strerror(errno));
            return -1;
        }
        if (s->direct && (s->fd_direct[i] = open(ct->shards[i].path, O_RDONLY | O_CLOEXEC | O_DIRECT)) < 0) s->direct = 0;
    }
    if (o->direct && !s->direct) fprintf(stderr, "colibri: this filesystem refuses O_DIRECT; expert reads are buffered\n");
    if (io_pool_start(&s->pool, o->io_threads)) {
        snprintf(err, errlen, "cannot start the I/O threads");
        return -1;
    }
    s->pool_started = 1;
    if (s->split_reason)
        fprintf(stderr, "colibri: some experts' gate/up/down are not one byte range in the container; they are read "
                        "tensor by tensor (re-run coli convert for one read per expert)\n");
    for (int k = 0; k < s->n; k++) {
        ExpertLayer *xl = s->layers[k];
        ExpertCache *c = calloc(1, sizeof *c);
        if (!c) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        xl->cache = c;
        c->cap = o->cap < xl->E ? o->cap : xl->E;
        c->slot_of = malloc(sizeof(int) * (size_t)xl->E);
        c->slots = calloc((size_t)c->cap, sizeof(Slot));
        c->geom = calloc((size_t)xl->E, sizeof(ExpertGeom));
        if (!c->slot_of || !c->slots || !c->geom) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        uint64_t room[3] = {0, 0, 0};
        for (int e = 0; e < xl->E; e++) {
            c->slot_of[e] = -1;
            expert_geom(ct, &xl->experts[e], &c->geom[e]);
            for (int j = 0; j < c->geom[e].nseg; j++)
                if (seg_room(c->geom[e].len[j]) > room[j]) room[j] = seg_room(c->geom[e].len[j]);
        }
        c->seg_dst[0] = 0;
        c->seg_dst[1] = room[0];
        c->seg_dst[2] = room[0] + room[1];
        size_t bytes = room[0] + room[1] + room[2];
        c->bufs_bytes = (size_t)c->cap * bytes; /* bytes is whole pages: every slot page-aligned */
        if (!(c->bufs = huge_alloc(c->bufs_bytes))) {
            snprintf(err, errlen, "out of memory for the expert cache");
            return -1;
        }
        for (int i = 0; i < c->cap; i++) {
            c->slots[i].expert = -1;
            c->slots[i].buf = c->bufs + (size_t)i * bytes;
        }
    }
    if (unmap_experts(s, err, errlen)) return -1;
    /* Every expert has a slot: buffered reads leave them in the page cache as well, so the next
     * engine on this model (a one-shot run, a restart) reads them from memory, not the disk.
     * The copies there are reclaimable, and the budget counts only the slots. */
    int all_fit = 1;
    for (int k = 0; k < s->n; k++) all_fit &= s->layers[k]->cache->cap >= s->layers[k]->E;
    if (all_fit) s->direct = 0;
    /* Pinned experts load now, all reads in flight at once. With a slot for every expert, every
     * expert does, as a resident model's weights are in RAM before the first token: left to load
     * on first use, a short prompt's decode read them one miss at a time (a 24-layer MoE decoded
     * its first 64 tokens at 8.7 tok/s instead of 19.4). */
    for (int k = 0; k < s->n; k++) {
        ExpertLayer *xl = s->layers[k];
        ExpertCache *c = xl->cache;
        const uint64_t *cnt = o->pin_counts && k < s->n_trunk ? o->pin_counts + (size_t)k * s->experts : NULL;
        int want = cnt ? c->cap / 2 : 0;
        for (int p = 0; p < want; p++) {
            int best = -1;
            for (int e = 0; e < xl->E; e++)
                if (cnt[e] && c->slot_of[e] < 0 && (best < 0 || cnt[e] > cnt[best])) best = e;
            if (best < 0) break;
            load_start(s, xl, best)->pinned = 1;
            s->pinned++;
        }
        if (all_fit)
            for (int e = 0; e < xl->E; e++)
                if (c->slot_of[e] < 0) load_start(s, xl, e);
    }
    wait_start_reads(s);
    if (s->direct) { /* probe: one aligned read through the O_DIRECT descriptor */
        ExpertLayer *xl = s->layers[0];
        ExpertCache *c = xl->cache;
        int si = victim(c, NULL);
        if (si >= 0 && !c->slots[si].pinned) {
            slot_assign(s, c, xl, si, 0);
            io_read_now(&s->pool, &c->slots[si].req);
            if (c->slots[si].req.err) read_failed(s, xl, 0, c->slots[si].req.err);
            c->slots[si].state = SLOT_READY;
        }
        if (s->pool.direct_failed) {
            s->direct = 0;
            fprintf(stderr, "colibri: O_DIRECT reads fail here (EINVAL); expert reads are buffered\n");
        }
    }
    s->pool.bytes = 0; /* start-up reads are not a turn's */
    s->pool.busy_s = 0;
    return 0;
}

void expert_store_free(ExpertStore *s) {
    if (s->pool_started) io_pool_stop(&s->pool); /* no read is left writing into a slot */
    for (int k = 0; k < s->n; k++) {
        ExpertCache *c = s->layers[k]->cache;
        if (!c) continue;
        huge_free(c->bufs, c->bufs_bytes);
        free(c->slots);
        free(c->slot_of);
        free(c->geom);
        free(c);
        s->layers[k]->cache = NULL;
        s->layers[k]->store = NULL;
    }
    for (int i = 0; i < s->n_files; i++) {
        if (s->fd_direct && s->fd_direct[i] >= 0) close(s->fd_direct[i]);
        if (s->fd_buf && s->fd_buf[i] >= 0) close(s->fd_buf[i]);
    }
    free(s->fd_direct);
    free(s->fd_buf);
    free(s->layers);
    free(s->turn_counts);
    memset(s, 0, sizeof *s);
}

void expert_store_turn_begin(ExpertStore *s) {
    memset(&s->st, 0, sizeof s->st);
    if (s->turn_counts) memset(s->turn_counts, 0, sizeof(uint32_t) * (size_t)s->n * s->experts);
    if (s->pool_started) {
        pthread_mutex_lock(&s->pool.mu);
        s->pool_bytes0 = s->pool.bytes;
        s->pool_busy0 = s->pool.busy_s;
        pthread_mutex_unlock(&s->pool.mu);
    }
}

void expert_store_turn_end(ExpertStore *s) {
    if (!s->pool_started) return;
    pthread_mutex_lock(&s->pool.mu);
    s->st.bytes_read = s->pool.bytes - s->pool_bytes0;
    s->st.read_busy_s = s->pool.busy_s - s->pool_busy0;
    pthread_mutex_unlock(&s->pool.mu);
}

uint64_t expert_store_cached(const ExpertStore *s) {
    uint64_t n = 0;
    for (int k = 0; k < s->n; k++) {
        const ExpertCache *c = s->layers[k]->cache;
        if (!c) {
            n += (uint64_t)s->layers[k]->E;
            continue;
        }
        for (int i = 0; i < c->cap; i++) n += c->slots[i].state == SLOT_READY;
    }
    return n;
}
