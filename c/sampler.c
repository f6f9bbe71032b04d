#include "sampler.h"

#include <math.h>
#include <stdlib.h>

int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static uint64_t next_u64(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

int sampler_init(Sampler *s, const SamplerParams *p, int vocab) {
    s->p = *p;
    s->state = p->seed;
    s->n = vocab;
    s->prob = malloc(sizeof(float) * (size_t)vocab);
    s->idx = malloc(sizeof(int) * (size_t)vocab);
    return s->prob && s->idx ? 0 : -1;
}

void sampler_free(Sampler *s) {
    free(s->prob);
    free(s->idx);
    s->prob = NULL;
    s->idx = NULL;
}

static float *g_sort_key;
static int by_prob_desc(const void *a, const void *b) {
    float x = g_sort_key[*(const int *)a], y = g_sort_key[*(const int *)b];
    if (x != y) return x > y ? -1 : 1;
    return *(const int *)a - *(const int *)b;
}

int sampler_candidates(Sampler *s, const float *logits) {
    const int n = s->n;
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) mx = fmaxf(mx, logits[i]);
    double sum = 0;
    for (int i = 0; i < n; i++) {
        s->prob[i] = expf((logits[i] - mx) / s->p.temperature);
        sum += s->prob[i];
        s->idx[i] = i;
    }
    for (int i = 0; i < n; i++) s->prob[i] = (float)(s->prob[i] / sum);
    g_sort_key = s->prob;
    qsort(s->idx, (size_t)n, sizeof(int), by_prob_desc);
    int keep = n;
    if (s->p.top_k > 0 && s->p.top_k < keep) keep = s->p.top_k;
    if (s->p.top_p > 0 && s->p.top_p < 1) {
        double mass = 0, kept = 0;
        for (int i = 0; i < keep; i++) mass += s->prob[s->idx[i]];
        for (int i = 0; i < keep; i++) {
            kept += s->prob[s->idx[i]];
            if (kept >= s->p.top_p * mass) { keep = i + 1; break; }
        }
    }
    if (s->p.min_p > 0) {
        float floor = s->p.min_p * s->prob[s->idx[0]];
        int i = 1;
        while (i < keep && s->prob[s->idx[i]] >= floor) i++;
        keep = i;
    }
    return keep;
}

int sampler_sample(Sampler *s, const float *logits) {
    if (s->p.temperature <= 0) return argmax(logits, s->n);
    int keep = sampler_candidates(s, logits);
    double total = 0;
    for (int i = 0; i < keep; i++) total += s->prob[s->idx[i]];
    double r = (double)(next_u64(&s->state) >> 11) * (1.0 / 9007199254740992.0) * total, acc = 0;
    for (int i = 0; i < keep; i++) {
        acc += s->prob[s->idx[i]];
        if (r < acc) return s->idx[i];
    }
    return s->idx[keep - 1];
}
