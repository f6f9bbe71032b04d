/* The forward pass of a MoE layer's experts: batch-union, waves through the cache, read-ahead. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/clock.h"
#include "experts/expert_cache.h"
#include "util/fwd_alloc.h"
#include "experts/moe_exec.h"


typedef struct {
    const ExpertLayer *xl;
    const float *x;
    int T, H;
    const int *start, *rows; /* rows of expert e: rows[start[e] .. start[e + 1]) (t * K + j) */
    float *xin, *y;          /* y: one output row per (position, choice), in rows[] order */
} Work;

static void compute(const Work *w, const Mlp *m, int e) {
    int n = w->start[e + 1] - w->start[e];
    const int *r = w->rows + w->start[e];
    const int K = w->xl->K;
    for (int i = 0; i < n; i++) memcpy(w->xin + (size_t)i * w->H, w->x + (size_t)(r[i] / K) * w->H, sizeof(float) * w->H);
    mlp_swiglu(m, w->xin, n, w->xl->width, w->y + (size_t)w->start[e] * w->H);
}

/* Read-ahead: the next MoE layer's router, applied to this layer's input, names the experts it
 * will probably want; they load into that layer's cache at read-ahead priority, evicting only
 * experts it is not predicted to want. */
static void read_ahead(ExpertStore *s, const ExpertLayer *nx, const float *x, int T) {
    ExpertCache *c = nx->cache;
    int *sel = fwd_malloc(sizeof(int) * (size_t)T * nx->K);
    float *wts = fwd_malloc(sizeof(float) * (size_t)T * nx->K);
    unsigned char *want = fwd_calloc((size_t)nx->E, 1);
    if (sel && wts && want) {
        nx->predict(nx->predict_self, x, T, sel, wts);
        if (!fwd_oom()) {
            for (int i = 0; i < T * nx->K; i++) want[sel[i]] = 1;
            for (int e = 0; e < nx->E; e++) {
                if (!want[e] || c->slot_of[e] >= 0) continue;
                int si = victim(c, want);
                if (si < 0) break;
                slot_assign(s, c, nx, si, e);
                io_submit(&s->pool, &c->slots[si].req, 1);
            }
        }
    }
    free(sel);
    free(wts);
    free(want);
}

/* A prefill pass (more rows than a batch) routes to nearly every expert of every layer, before
 * the next layer's routing is known: when the next layer's cache holds all its experts, the
 * ones not in RAM load at read-ahead priority while this layer computes. A smaller cache would
 * only evict what that layer's waves are about to use, so it reads on demand. */
static void read_ahead_pass(ExpertStore *s, const ExpertLayer *nx) {
    ExpertCache *c = nx->cache;
    if (c->cap < nx->E) return;
    for (int e = 0; e < nx->E; e++) {
        if (c->slot_of[e] >= 0) continue;
        int si = victim(c, NULL); /* an empty slot: cap >= E */
        if (si < 0) break;
        slot_assign(s, c, nx, si, e);
        io_submit(&s->pool, &c->slots[si].req, 1);
    }
}

static void wait_slot(ExpertStore *s, const ExpertLayer *xl, Slot *sl) {
    if (sl->state != SLOT_LOADING) return;
    io_promote(&s->pool, &sl->req);
    double t0 = now_ms();
    int err = io_wait(&s->pool, &sl->req);
    s->st.io_wait_ms += now_ms() - t0;
    if (err) read_failed(s, xl, sl->expert, err);
    sl->state = SLOT_READY;
}

/* Waves of at most cap experts: the ones in RAM (or already loading) join at once; each miss
 * takes a slot no expert of the wave uses, its read goes to the pool, and the hits are
 * computed while the misses load. An expert leaves the cache only after its wave is done. */
static void run_streaming(const Work *w, const int *need, int n_need) {
    const ExpertLayer *xl = w->xl;
    ExpertStore *s = xl->store;
    ExpertCache *c = xl->cache;
    int *pend = fwd_malloc(sizeof(int) * (size_t)n_need), *wave = fwd_malloc(sizeof(int) * (size_t)n_need);
    if (!pend || !wave) {
        free(pend);
        free(wave);
        return;
    }
    memcpy(pend, need, sizeof(int) * (size_t)n_need);
    int n_pend = n_need, first = 1;
    while (n_pend && !fwd_oom()) {
        int nw = 0;
        for (int i = 0; i < n_pend; i++) {
            int si = c->slot_of[pend[i]];
            if (si < 0) continue;
            c->slots[si].busy = 1;
            if (c->slots[si].state == SLOT_LOADING) io_promote(&s->pool, &c->slots[si].req);
            wave[nw++] = pend[i];
            s->st.hits++;
        }
        for (int i = 0; i < n_pend; i++) {
            int e = pend[i];
            if (c->slot_of[e] >= 0) continue;
            int si = victim(c, NULL);
            for (int j = 0; si < 0 && j < c->cap; j++) /* a read-ahead in flight: let it land, then reuse it */
                if (c->slots[j].state == SLOT_LOADING && !c->slots[j].busy) {
                    wait_slot(s, xl, &c->slots[j]);
                    si = j;
                }
            if (si < 0) break;
            slot_assign(s, c, xl, si, e);
            c->slots[si].busy = 1;
            io_submit(&s->pool, &c->slots[si].req, 0);
            wave[nw++] = e;
            s->st.misses++;
        }
        if (first && xl->next && xl->next->cache) {
            if (s->readahead) read_ahead(s, xl->next, w->x, w->T);
            if (s->batch > 0 && w->T > s->batch) read_ahead_pass(s, xl->next);
        }
        first = 0;
        /* what is in RAM first, then each read as it is waited for */
        for (int pass = 0; pass < 2; pass++)
            for (int i = 0; i < nw; i++) {
                Slot *sl = &c->slots[c->slot_of[wave[i]]];
                if ((sl->state == SLOT_READY) != (pass == 0) || sl->busy != 1) continue;
                wait_slot(s, xl, sl);
                compute(w, &sl->mlp, wave[i]);
                sl->busy = 2; /* computed */
            }
        for (int i = 0; i < nw; i++) {
            Slot *sl = &c->slots[c->slot_of[wave[i]]];
            sl->busy = 0;
            sl->last = ++c->tick;
        }
        /* the wave's experts are done; the rest wait for the next wave */
        int m = 0;
        for (int i = 0; i < n_pend; i++) {
            int done = 0;
            for (int j = 0; j < nw && !done; j++) done = wave[j] == pend[i];
            if (!done) pend[m++] = pend[i];
        }
        if (!nw) {
            fprintf(stderr, "colibri: expert cache of layer %d has no free slot (internal error)\n", xl->layer);
            exit(1);
        }
        n_pend = m;
    }
    free(pend);
    free(wave);
}

/* Few rows (decode) with every needed expert in RAM (resident, or cached and loaded): one
 * expert per thread (moe_exec.c). It adds each position's experts in expert order as the paths
 * below do, so the bits are the same. 0 when it does not apply. */
static int run_parallel(const ExpertLayer *xl, const int *need, int n_need, const float *x, int T, const int *sel,
                        const float *wts, float *out) {
    ExpertStore *s = xl->store;
    ExpertCache *c = s ? xl->cache : NULL;
    const Mlp *experts = xl->experts;
    Mlp *from_cache = NULL;
    if (c) {
        for (int i = 0; i < n_need; i++) {
            int si = c->slot_of[need[i]];
            if (si < 0 || c->slots[si].state != SLOT_READY) return 0; /* a miss: the waves handle it */
        }
        if (!(from_cache = fwd_calloc((size_t)xl->E, sizeof(Mlp)))) return 1; /* fwd_oom() tells the caller */
        for (int i = 0; i < n_need; i++) {
            Slot *sl = &c->slots[c->slot_of[need[i]]];
            from_cache[need[i]] = sl->mlp;
            sl->last = ++c->tick;
        }
        experts = from_cache;
    }
    memset(out, 0, sizeof(float) * (size_t)T * xl->H);
    if (!moe_run_experts_parallel(experts, xl->E, xl->K, xl->width, xl->H, sel, wts, x, T, out) && s)
        s->st.hits += (uint64_t)n_need;
    free(from_cache);
    return 1;
}

void expert_layer_run(const ExpertLayer *xl, const float *x, int T, const int *sel, const float *wts, float *out) {
    const int E = xl->E, K = xl->K, H = xl->H;
    ExpertStore *s = xl->store;
    int *start = fwd_calloc((size_t)E + 1, sizeof(int)), *cur = fwd_malloc(sizeof(int) * (size_t)E);
    int *rows = fwd_malloc(sizeof(int) * (size_t)T * K), *at = fwd_malloc(sizeof(int) * (size_t)T * K);
    int *need = fwd_malloc(sizeof(int) * (size_t)E), *ord = fwd_malloc(sizeof(int) * (size_t)K);
    float *xin = fwd_malloc(sizeof(float) * (size_t)T * H), *y = fwd_malloc(sizeof(float) * (size_t)T * K * H);
    if (!start || !cur || !rows || !at || !need || !ord || !xin || !y) goto out;
    /* group the (position, choice) rows by expert, in row order */
    for (int i = 0; i < T * K; i++) start[sel[i] + 1]++;
    int n_need = 0;
    for (int e = 0; e < E; e++) {
        if (start[e + 1]) need[n_need++] = e;
        if (s) s->turn_counts[(size_t)xl->index * s->experts + e] += (uint32_t)start[e + 1];
        start[e + 1] += start[e];
        cur[e] = start[e];
    }
    /* gate, up and down of each (position, choice) row: 3 x width x H / 32 block dots */
    const double dots = (double)T * K * 3.0 * xl->width * ((H + QBLOCK - 1) / QBLOCK);
    if (moe_parallel_ok(T * K, dots) && run_parallel(xl, need, n_need, x, T, sel, wts, out)) goto out;
    for (int i = 0; i < T * K; i++) {
        at[i] = cur[sel[i]]++;
        rows[at[i]] = i;
    }
    Work w = {xl, x, T, H, start, rows, xin, y};
    if (s && xl->cache) run_streaming(&w, need, n_need);
    else {
        for (int i = 0; i < n_need && !fwd_oom(); i++) compute(&w, &xl->experts[need[i]], need[i]);
        if (s) s->st.hits += (uint64_t)n_need;
    }
    if (fwd_oom()) goto out;
    /* each position adds its experts' outputs in expert order, whatever order they ran in */
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < K; j++) {
            int v = t * K + j, i = j;
            while (i > 0 && sel[ord[i - 1]] > sel[v]) {
                ord[i] = ord[i - 1];
                i--;
            }
            ord[i] = v;
        }
        float *o = out + (size_t)t * H;
        memset(o, 0, sizeof(float) * H);
        for (int j = 0; j < K; j++) {
            const float *yr = y + (size_t)at[ord[j]] * H;
            float wt = wts[ord[j]];
            for (int d = 0; d < H; d++) o[d] += wt * yr[d];
        }
    }
out:
    free(start);
    free(cur);
    free(rows);
    free(at);
    free(need);
    free(ord);
    free(xin);
    free(y);
}
