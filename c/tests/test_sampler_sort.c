/* The sampler sorts only the head of the vocabulary its filters can keep. Against the full-sort
 * sampler it replaced (written out below as the reference), the same seed and request give the
 * same tokens for top-k, top-p and min-p alone and combined, and with no filter at all; on peaked,
 * flat and tied distributions. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/sampler.h"

/* ---- the reference: softmax, sort every token, then top-k -> top-p -> min-p ---- */
typedef struct {
    SamplerParams p;
    uint64_t state;
    int n;
    float *prob;
    int *idx;
} RefSampler;

static uint64_t ref_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float *ref_key;
static int ref_desc(const void *a, const void *b) {
    float x = ref_key[*(const int *)a], y = ref_key[*(const int *)b];
    if (x != y) return x > y ? -1 : 1;
    return *(const int *)a - *(const int *)b;
}

static int ref_sample(RefSampler *s, const float *logits) {
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
    ref_key = s->prob;
    qsort(s->idx, (size_t)n, sizeof(int), ref_desc);
    int keep = n;
    if (s->p.top_k > 0 && s->p.top_k < keep) keep = s->p.top_k;
    if (s->p.top_p > 0 && s->p.top_p < 1) {
        double mass = 0, kept = 0;
        for (int i = 0; i < keep; i++) mass += s->prob[s->idx[i]];
        for (int i = 0; i < keep; i++) {
            kept += s->prob[s->idx[i]];
            if (kept >= s->p.top_p * mass) {
                keep = i + 1;
                break;
            }
        }
    }
    if (s->p.min_p > 0) {
        float floor = s->p.min_p * s->prob[s->idx[0]];
        int i = 1;
        while (i < keep && s->prob[s->idx[i]] >= floor) i++;
        keep = i;
    }
    double total = 0;
    for (int i = 0; i < keep; i++) total += s->prob[s->idx[i]];
    double r = (double)(ref_next(&s->state) >> 11) * (1.0 / 9007199254740992.0) * total, acc = 0;
    for (int i = 0; i < keep; i++) {
        acc += s->prob[s->idx[i]];
        if (r < acc) return s->idx[i];
    }
    return s->idx[keep - 1];
}

static float rnd(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return ((*s >> 8) / 16777216.0f) * 2 - 1;
}

void test_sampler_sort(void) {
    enum { N = 3000, DRAWS = 60 };
    const SamplerParams reqs[] = {
        {1.0f, 1.0f, 0, 0, 1},     {0.7f, 1.0f, 0, 40, 2},    {1.0f, 0.9f, 0, 0, 3},  {1.3f, 0.95f, 0, 0, 4},
        {1.0f, 1.0f, 0.05f, 0, 5}, {0.8f, 0.9f, 0.1f, 0, 6},  {1.0f, 0.8f, 0, 50, 7}, {1.0f, 0.95f, 0.02f, 20, 8},
        {2.0f, 1.0f, 0, 1, 9},     {1.0f, 0.5f, 0.5f, 0, 10}, {1.0f, 1.0f, 0, N, 11}, {5.0f, 0.99f, 0, 0, 12},
    };
    float *logits = malloc(sizeof(float) * N);
    RefSampler ref = {.n = N, .prob = malloc(sizeof(float) * N), .idx = malloc(sizeof(int) * N)};
    unsigned seed = 17;
    int same = 1, draws = 0;
    for (int shape = 0; shape < 3; shape++) {
        for (int i = 0; i < N; i++) {
            float u = rnd(&seed);
            /* 0: peaked (a language model's usual), 1: flat, 2: coarse values with many ties */
            logits[i] = shape == 0 ? 12 * u * u * u + (i % 97 == 0 ? 6 : 0) : (shape == 1 ? 0.5f * u : (float)(int)(4 * u));
        }
        for (size_t q = 0; q < sizeof reqs / sizeof *reqs; q++) {
            Sampler s;
            CHECK(sampler_init(&s, &reqs[q], N) == 0, "sampler_init");
            ref.p = reqs[q];
            ref.state = reqs[q].seed;
            for (int d = 0; d < DRAWS; d++, draws++) {
                int a = sampler_sample(&s, logits), b = ref_sample(&ref, logits);
                if (a != b) {
                    same = 0;
                    CHECK(0, "shape %d request %zu draw %d: token %d, the full sort gives %d", shape, q, d, a, b);
                    break;
                }
            }
            sampler_free(&s);
        }
    }
    CHECK(same && draws == 3 * DRAWS * (int)(sizeof reqs / sizeof *reqs), "head-sorted sampling equals the full sort");
    free(logits);
    free(ref.prob);
    free(ref.idx);
}
