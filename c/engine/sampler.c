#include "engine/sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

int argmax(const float *x, int n) {
    int best = 0;
    float bv = x[0]; /* the best value in a register, not reloaded through best each step */
    for (int i = 1; i < n; i++)
        if (x[i] > bv) bv = x[i], best = i;
    return best;
}

static uint64_t next_u64(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t sampler_entropy_seed(void) {
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, 0) == (ssize_t)sizeof seed) return seed;
    FILE *f = fopen("/dev/urandom", "rb"); /* a kernel without getrandom */
    if (f) {
        size_t got = fread(&seed, sizeof seed, 1, f);
        fclose(f);
        if (got == 1) return seed;
    }
    /* Nothing random to read: the clock's nanoseconds and a counter still differ per request. */
    static uint64_t calls;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t mix = ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 32) ^ ++calls;
    return next_u64(&mix);
}

int sampler_init(Sampler *s, const SamplerParams *p, int vocab) {
    s->p = *p;
    s->state = p->seed;
    s->n = vocab;
    s->prob = malloc(sizeof(float) * (size_t)vocab);
    s->idx = malloc(sizeof(int) * (size_t)vocab);
    s->tmp = malloc(sizeof(float) * (size_t)vocab);
    s->key = malloc(2 * sizeof(uint32_t) * (size_t)vocab);
    s->idx2 = malloc(sizeof(int) * (size_t)vocab);
    memset(&s->pen, 0, sizeof s->pen);
    s->recent = NULL;
    s->recent_cap = s->recent_n = s->recent_at = 0;
    return s->prob && s->idx && s->tmp && s->key && s->idx2 ? 0 : -1;
}

int sampler_set_penalties(Sampler *s, const SamplerPenalties *pen) {
    free(s->recent);
    s->recent = NULL;
    s->recent_cap = s->recent_n = s->recent_at = 0;
    s->pen = *pen;
    const int any = (pen->repeat > 0 && pen->repeat != 1) || pen->frequency != 0 || pen->presence != 0;
    if (!any || pen->last_n <= 0) return 0;
    if (!(s->recent = malloc(sizeof(int) * (size_t)pen->last_n))) return -1;
    s->recent_cap = pen->last_n;
    return 0;
}

void sampler_accept(Sampler *s, int tok) {
    if (!s->recent || tok < 0 || tok >= s->n) return;
    s->recent[s->recent_at] = tok;
    s->recent_at = s->recent_at + 1 == s->recent_cap ? 0 : s->recent_at + 1;
    if (s->recent_n < s->recent_cap) s->recent_n++;
}

const float *sampler_penalize(Sampler *s, const float *logits) {
    if (!s->recent || !s->recent_n) return logits;
    float *x = s->tmp; /* the top-k scratch: free until probabilities() has read x */
    memcpy(x, logits, sizeof(float) * (size_t)s->n);
    uint32_t *count = s->key; /* the radix sort's scratch, free until the sort */
    for (int i = 0; i < s->recent_n; i++) count[s->recent[i]] = 0;
    for (int i = 0; i < s->recent_n; i++) count[s->recent[i]]++;
    const float r = s->pen.repeat > 0 ? s->pen.repeat : 1.0f;
    for (int i = 0; i < s->recent_n; i++) {
        const int t = s->recent[i];
        const uint32_t c = count[t];
        if (!c) continue; /* a repeat of a token already penalized */
        count[t] = 0;
        x[t] = x[t] <= 0 ? x[t] * r : x[t] / r;
        x[t] -= (float)c * s->pen.frequency + s->pen.presence;
    }
    return x;
}

void sampler_free(Sampler *s) {
    free(s->prob);
    free(s->idx);
    free(s->tmp);
    free(s->key);
    free(s->idx2);
    free(s->recent);
    s->recent = NULL;
    s->prob = NULL;
    s->idx = NULL;
    s->tmp = NULL;
    s->key = NULL;
    s->idx2 = NULL;
}

static float *g_sort_key;
static int by_prob_desc(const void *a, const void *b) {
    float x = g_sort_key[*(const int *)a], y = g_sort_key[*(const int *)b];
    if (x != y) return x > y ? -1 : 1;
    return *(const int *)a - *(const int *)b;
}

/* The k-th largest of v[0..n) (1 <= k <= n), reordering v: quickselect. */
static float kth_largest(float *v, int n, int k) {
    int lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        float a = v[lo], b = v[(lo + hi) / 2], c = v[hi]; /* median of three as the pivot */
        float pivot = a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
        int i = lo, j = hi;
        while (i <= j) { /* descending: >= pivot to the left */
            while (v[i] > pivot) i++;
            while (v[j] < pivot) j--;
            if (i <= j) {
                float t = v[i];
                v[i] = v[j];
                v[j] = t;
                i++;
                j--;
            }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else return v[want];
    }
    return v[want];
}

/* Softmax of logits / temperature into s->prob (the same floats the full sort used to rank);
 * returns their sum in id order. The largest is the token of the largest logit: exp(0) / sum. */
static double probabilities(Sampler *s, const float *logits) {
    const int n = s->n;
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) mx = logits[i] > mx ? logits[i] : mx; /* fmaxf is a libm call here */
    double sum = 0;
    for (int i = 0; i < n; i++) {
        s->prob[i] = expf((logits[i] - mx) / s->p.temperature);
        sum += s->prob[i];
    }
    double total = 0;
    for (int i = 0; i < n; i++) {
        s->prob[i] = (float)(s->prob[i] / sum);
        total += s->prob[i];
    }
    s->pmax = (float)(1.0 / sum);
    return total;
}

/* s->idx[0..m), ids in ascending order, sorted by probability, highest first, equal ones
 * keeping ascending ids: the comparison sort's order. A flat distribution (top-p over a
 * random or high-temperature model) keeps most of a 150k vocabulary, which qsort took tens of
 * milliseconds to order; an LSD radix sort of the probabilities' bits (non-negative floats
 * order as their bit patterns; each pass is stable, so ties keep the ids' order) takes one. */
static void sort_by_prob_desc(Sampler *s, int m) {
    enum { SMALL = 64, BITS = 11, BUCKETS = 1 << BITS };
    if (m < SMALL) {
        g_sort_key = s->prob;
        qsort(s->idx, (size_t)m, sizeof(int), by_prob_desc);
        return;
    }
    uint32_t *key = s->key, *key2 = s->key + s->n;
    int *idx = s->idx, *idx2 = s->idx2;
    for (int i = 0; i < m; i++) {
        uint32_t bits;
        memcpy(&bits, &s->prob[idx[i]], sizeof bits);
        key[i] = ~bits; /* ascending keys: descending probabilities */
    }
    static _Thread_local int count[BUCKETS];
    for (int shift = 0; shift < 32; shift += BITS) {
        memset(count, 0, sizeof count);
        for (int i = 0; i < m; i++) count[(key[i] >> shift) & (BUCKETS - 1)]++;
        if (count[(key[0] >> shift) & (BUCKETS - 1)] == m) continue; /* one digit for all: nothing moves */
        for (int d = 0, at = 0; d < BUCKETS; d++) {
            int c = count[d];
            count[d] = at;
            at += c;
        }
        for (int i = 0; i < m; i++) {
            int j = count[(key[i] >> shift) & (BUCKETS - 1)]++;
            key2[j] = key[i];
            idx2[j] = idx[i];
        }
        uint32_t *tk = key;
        key = key2;
        key2 = tk;
        int *ti = idx;
        idx = idx2;
        idx2 = ti;
    }
    if (idx != s->idx) memcpy(s->idx, idx, sizeof(int) * (size_t)m);
}

/* Puts into s->idx[0..m), by probability (ties: lower id first), every token whose probability
 * is at least th, and returns m. Every token left out is less probable than every one kept, so
 * the list is the head of the full sort: sorting only it changes nothing that is read. */
static int sorted_head(Sampler *s, float th) {
    int m = 0;
    for (int i = 0; i < s->n; i++)
        if (s->prob[i] >= th) s->idx[m++] = i;
    sort_by_prob_desc(s, m);
    return m;
}

/* A threshold that keeps a head of mass above `need` out of `total`: what is left out is under
 * n * th = half the remainder. 0 (everything) when need is not below the total. */
static float mass_threshold(const Sampler *s, double need, double total) {
    return need < total ? (float)((total - need) / s->n * 0.5) : 0.0f;
}

/* top-k, then top-p, then min-p over the sorted head; *head is how many of s->idx are sorted. */
static int filter(Sampler *s, double total, int *head) {
    const int n = s->n;
    const int top_k = s->p.top_k > 0 && s->p.top_k < n ? s->p.top_k : 0;
    const int top_p = s->p.top_p > 0 && s->p.top_p < 1, min_p = s->p.min_p > 0;
    int keep = n, m;
    double mass = total;
    if (top_k) { /* the k most probable (and any tied with the k-th), sorted; keep exactly k */
        for (int i = 0; i < n; i++) s->tmp[i] = s->prob[i];
        m = sorted_head(s, kth_largest(s->tmp, n, top_k));
        keep = top_k;
        mass = 0;
        for (int i = 0; i < keep; i++) mass += s->prob[s->idx[i]];
    } else {
        const float pmax = s->pmax;
        const float by_mass = top_p ? mass_threshold(s, s->p.top_p * mass, total) : 0.0f;
        /* With min-p too, a higher floor is enough: the head then holds every token min-p can
         * keep, whether or not it reaches the top-p cut. */
        const float th = min_p && s->p.min_p * pmax > by_mass ? s->p.min_p * pmax : by_mass;
        m = sorted_head(s, th);
        if (top_p && th == by_mass && m < n) { /* the head reaches the cut (rounding aside) */
            double kept = 0;
            for (int i = 0; i < m; i++) kept += s->prob[s->idx[i]];
            if (kept < s->p.top_p * mass) m = sorted_head(s, 0);
        }
        keep = m;
    }
    if (top_p) {
        double kept = 0;
        for (int i = 0; i < keep; i++) {
            kept += s->prob[s->idx[i]];
            if (kept >= s->p.top_p * mass) {
                keep = i + 1;
                break;
            }
        }
    }
    if (min_p) {
        float floor = s->p.min_p * s->prob[s->idx[0]];
        int i = 1;
        while (i < keep && s->prob[s->idx[i]] >= floor) i++;
        keep = i;
    }
    *head = m;
    return keep;
}

int sampler_candidates(Sampler *s, const float *logits) {
    int head;
    return filter(s, probabilities(s, logits), &head);
}

int sampler_sample(Sampler *s, const float *logits) {
    if (s->p.temperature <= 0) return argmax(logits, s->n);
    const double total_all = probabilities(s, logits);
    const int unfiltered = !(s->p.top_k > 0 && s->p.top_k < s->n) && !(s->p.top_p > 0 && s->p.top_p < 1) && !(s->p.min_p > 0);
    const double u = (double)(next_u64(&s->state) >> 11) * (1.0 / 9007199254740992.0);
    int keep;
    double total = 0;
    if (unfiltered) { /* every token: sort only the head that the draw lands in */
        keep = sorted_head(s, mass_threshold(s, u * total_all, total_all));
        total = total_all;
    } else {
        int head;
        keep = filter(s, total_all, &head);
        for (int i = 0; i < keep; i++) total += s->prob[s->idx[i]];
    }
    for (int pass = 0; pass < 2; pass++) {
        double r = u * total, acc = 0;
        for (int i = 0; i < keep; i++) {
            acc += s->prob[s->idx[i]];
            if (r < acc) return s->idx[i];
        }
        if (!unfiltered || keep == s->n) break;
        keep = sorted_head(s, 0); /* rounding left the draw past the head: the whole sort */
    }
    return s->idx[keep - 1];
}
