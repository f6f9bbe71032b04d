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

/* Rows enough that nearly every expert of a layer is routed (each expert's chance of none is
 * about e^-4): a prefill pass, or a long prompt's batch. */
static int routes_nearly_all(const ExpertLayer *xl, int T) { return (long long)T * xl->K >= 4LL * xl->E; }

/* Such rows route to nearly every expert of the next layer too, before its routing is known: its
 * experts not in RAM load at read-ahead priority while this layer computes, in the order its
 * sweep takes them (by id), as many as its cache has slots for. In a cache smaller than the layer
 * this evicts experts that layer wants too, for others it wants as much: the bytes stay the same
 * and the reads start earlier. */
static void read_ahead_sweep(ExpertStore *s, const ExpertLayer *nx) {
    ExpertCache *c = nx->cache;
    for (int e = 0; e < nx->E; e++) {
        if (c->slot_of[e] >= 0) continue;
        int si = victim(c, NULL);
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

/* The needed experts through the cache, as a sliding window: the ones in RAM (or already
 * loading) join at once; each miss takes a slot no needed expert holds, and its read goes to the
 * pool; whatever has landed is computed first, and each computed expert frees its slot for the
 * next miss, so reads stay in flight while the math runs. */
static void run_streaming(const Work *w, const int *need, int n_need) {
    const ExpertLayer *xl = w->xl;
    ExpertStore *s = xl->store;
    ExpertCache *c = xl->cache;
    int *miss = fwd_malloc(sizeof(int) * (size_t)n_need), *held = fwd_malloc(sizeof(int) * (size_t)n_need);
    if (!miss || !held) {
        free(miss);
        free(held);
        return;
    }
    int n_miss = 0, n_held = 0, next = 0;
    for (int i = 0; i < n_need; i++) {
        int si = c->slot_of[need[i]];
        if (si < 0) {
            miss[n_miss++] = need[i];
            continue;
        }
        c->slots[si].busy = 1;
        if (c->slots[si].state == SLOT_LOADING) io_promote(&s->pool, &c->slots[si].req);
        held[n_held++] = need[i];
        s->st.hits++;
    }
    if (xl->next && xl->next->cache) {
        if (s->readahead) read_ahead(s, xl->next, w->x, w->T);
        if (routes_nearly_all(xl, w->T)) read_ahead_sweep(s, xl->next);
    }
    while ((next < n_miss || n_held) && !fwd_oom()) {
        for (; next < n_miss; next++) {
            int si = victim(c, NULL);
            for (int j = 0; si < 0 && j < c->cap; j++) /* a read-ahead in flight: let it land, then reuse it */
                if (c->slots[j].state == SLOT_LOADING && !c->slots[j].busy) {
                    wait_slot(s, xl, &c->slots[j]);
                    si = j;
                }
            if (si < 0) break;
            slot_assign(s, c, xl, si, miss[next]);
            c->slots[si].busy = 1;
            io_submit(&s->pool, &c->slots[si].req, 0);
            held[n_held++] = miss[next];
            s->st.misses++;
        }
        if (!n_held) {
            fprintf(stderr, "colibri: expert cache of layer %d has no free slot (internal error)\n", xl->layer);
            exit(1);
        }
        int k = 0; /* what is in RAM first, else the oldest read */
        for (int i = 0; i < n_held; i++)
            if (c->slots[c->slot_of[held[i]]].state == SLOT_READY) {
                k = i;
                break;
            }
        Slot *sl = &c->slots[c->slot_of[held[k]]];
        wait_slot(s, xl, sl);
        compute(w, &sl->mlp, held[k]);
        sl->busy = 0;
        sl->last = ++c->tick;
        memmove(held + k, held + k + 1, sizeof(int) * (size_t)(n_held - k - 1));
        n_held--;
    }
    free(miss);
    free(held);
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
