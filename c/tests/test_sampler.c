#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "engine/sampler.h"

/* Penalties as llama.cpp applies them, against values worked out by hand; the window slides. */
static void test_penalties(void) {
    const float logits[4] = {2.0f, 1.0f, -1.0f, 0.5f};
    Sampler s;
    SamplerParams greedy = {0, 1, 0, 0, 1};
    sampler_init(&s, &greedy, 4);
    SamplerPenalties off = {1.0f, 0, 0, 64};
    CHECK(sampler_set_penalties(&s, &off) == 0, "no penalty");
    sampler_accept(&s, 0);
    CHECK(sampler_penalize(&s, logits) == logits && !s.recent, "no penalty: the logits themselves, no window");
    SamplerPenalties rep = {2.5f, 0, 0, 3};
    CHECK(sampler_set_penalties(&s, &rep) == 0 && s.recent, "a window");
    CHECK(sampler_penalize(&s, logits) == logits, "an empty window changes nothing");
    CHECK(sampler_sample(&s, logits) == 0, "greedy picks token 0 unpenalized");
    sampler_accept(&s, 0);
    sampler_accept(&s, 2);
    sampler_accept(&s, 2);
    const float *x = sampler_penalize(&s, logits);
    CHECK(x != logits && x[0] == 2.0f / 2.5f && x[1] == 1.0f && x[2] == -1.0f * 2.5f && x[3] == 0.5f,
          "repeat: positive logits divided, negative multiplied, once per distinct token (%g %g %g %g)", x[0], x[1], x[2], x[3]);
    CHECK(sampler_sample(&s, x) == 1 && logits[0] == 2.0f, "greedy on the penalized copy; the input untouched");
    sampler_accept(&s, 3); /* the window holds 3: token 0 slides out */
    x = sampler_penalize(&s, logits);
    CHECK(x[0] == 2.0f && x[3] == 0.5f / 2.5f && x[2] == -2.5f, "the window slides (%g %g %g)", x[0], x[2], x[3]);
    SamplerPenalties fp = {1.0f, 0.25f, 0.5f, 8};
    sampler_set_penalties(&s, &fp);
    sampler_accept(&s, 0);
    sampler_accept(&s, 0);
    sampler_accept(&s, 0);
    sampler_accept(&s, 1);
    sampler_accept(&s, 9);
    x = sampler_penalize(&s, logits);
    CHECK(x[0] == 2.0f - (3 * 0.25f + 0.5f) && x[1] == 1.0f - (0.25f + 0.5f) && x[2] == -1.0f && x[3] == 0.5f,
          "frequency (count x f) and presence (once); an id outside the vocabulary is not kept (%g %g)", x[0], x[1]);
    sampler_free(&s);
}

void test_sampler(void) {
    test_penalties();
    float logits[6] = {0.1f, 2.0f, 1.9f, -1.0f, 2.0f, 0.0f};
    CHECK(argmax(logits, 6) == 1, "argmax takes the first of equal maxima");
    Sampler s;
    SamplerParams greedy = {0, 1, 0, 0, 1};
    sampler_init(&s, &greedy, 6);
    CHECK(sampler_sample(&s, logits) == 1, "temperature 0 is greedy");
    sampler_free(&s);
    SamplerParams topk1 = {1.0f, 1.0f, 0, 1, 42};
    sampler_init(&s, &topk1, 6);
    int ok = 1;
    for (int i = 0; i < 50; i++) ok &= sampler_sample(&s, logits) == 1;
    CHECK(ok, "top_k=1 always picks the best token");
    sampler_free(&s);
    SamplerParams minp = {1.0f, 1.0f, 0.5f, 0, 3};
    sampler_init(&s, &minp, 6);
    int seen[6] = {0};
    for (int i = 0; i < 300; i++) seen[sampler_sample(&s, logits)]++;
    CHECK(!seen[0] && !seen[3] && !seen[5] && seen[1] && seen[2] && seen[4],
          "min_p=0.5 keeps only tokens within half of the best");
    sampler_free(&s);
    int a[20], b[20];
    SamplerParams seeded = {0.8f, 0.95f, 0, 0, 1234};
    sampler_init(&s, &seeded, 6);
    for (int i = 0; i < 20; i++) a[i] = sampler_sample(&s, logits);
    sampler_free(&s);
    sampler_init(&s, &seeded, 6);
    for (int i = 0; i < 20; i++) b[i] = sampler_sample(&s, logits);
    sampler_free(&s);
    int same = 1;
    for (int i = 0; i < 20; i++) same &= a[i] == b[i];
    CHECK(same, "the same seed gives the same samples");
}

/* ---- top_p: the kept set is exactly the smallest set of tokens whose probability mass is at
 * least p (of the mass top-k left), made of the most probable tokens, ties to the lower id. */

/* The size of the smallest subset of probs[0..n) with mass >= target, by trying every subset:
 * the definition itself, independent of the sampler's sort-and-accumulate. */
static int smallest_set_reaching(const float *probs, int n, double target) {
    int best = n + 1;
    for (unsigned m = 1; m < (1u << n); m++) {
        double mass = 0;
        int size = 0;
        for (int i = 0; i < n; i++)
            if (m & (1u << i)) {
                mass += probs[i];
                size++;
            }
        if (mass >= target && size < best) best = size;
    }
    return best;
}

static int kept_contains(const Sampler *s, int keep, int id) {
    for (int i = 0; i < keep; i++)
        if (s->idx[i] == id) return 1;
    return 0;
}

/* keep is the smallest possible size, the kept tokens reach p, and no dropped token is more
 * probable than a kept one, nor equally probable with a lower id. */
static int top_p_set_is_exact(const Sampler *s, int keep, const int *pool, int n_pool, double p) {
    float probs[16];
    double pool_mass = 0, kept_mass = 0;
    for (int i = 0; i < n_pool; i++) {
        probs[i] = s->prob[pool[i]];
        pool_mass += probs[i];
    }
    for (int i = 0; i < keep; i++) kept_mass += s->prob[s->idx[i]];
    if (keep != smallest_set_reaching(probs, n_pool, p * pool_mass)) return 0;
    if (kept_mass < p * pool_mass * (1 - 1e-12)) return 0;
    for (int i = 0; i < keep; i++)
        for (int j = 0; j < n_pool; j++) {
            int k = s->idx[i], d = pool[j];
            if (kept_contains(s, keep, d)) continue;
            if (s->prob[d] > s->prob[k] || (s->prob[d] == s->prob[k] && d < k)) return 0;
        }
    return 1;
}

static void test_top_p_exact_sets(void) {
    enum { N = 8 };
    const float distinct[N] = {0.3f, 2.1f, -0.7f, 1.4f, 0.9f, -2.0f, 1.8f, 0.05f};
    const int all[N] = {0, 1, 2, 3, 4, 5, 6, 7};
    Sampler s;
    int bad = 0, sizes_seen = 0, last = -1;
    for (int step = 1; step < 100; step++) {
        double p = step / 100.0;
        SamplerParams sp = {1.0f, (float)p, 0, 0, 7};
        sampler_init(&s, &sp, N);
        int keep = sampler_candidates(&s, distinct);
        if (!top_p_set_is_exact(&s, keep, all, N, (float)p)) {
            bad++;
            fprintf(stderr, "top_p=%.2f kept %d tokens\n", p, keep);
        }
        if (keep != last) sizes_seen++, last = keep;
        sampler_free(&s);
    }
    CHECK(!bad, "top_p keeps the smallest set reaching p, for every p from 0.01 to 0.99 (%d wrong)", bad);
    CHECK(sizes_seen >= 6, "the sweep crosses most set sizes (%d seen)", sizes_seen);

    /* ties: three equally likely best tokens at ids 1, 3 and 4; p=0.3 needs two of them */
    const float tied[N] = {1.0f, 2.0f, 0.0f, 2.0f, 2.0f, 1.0f, 0.0f, 0.0f};
    SamplerParams sp = {1.0f, 0.3f, 0, 0, 7};
    sampler_init(&s, &sp, N);
    int keep = sampler_candidates(&s, tied);
    CHECK(keep == 2 && kept_contains(&s, keep, 1) && kept_contains(&s, keep, 3),
          "ties at the boundary keep the lower ids (kept %d: %d %d)", keep, s.idx[0], s.idx[1]);
    CHECK(top_p_set_is_exact(&s, keep, all, N, 0.3), "the tied set is still the smallest reaching p");
    sampler_free(&s);
    /* p just above the three tied tokens' mass needs a fourth: the better of the two 1.0 logits */
    double three = 0;
    sampler_init(&s, &sp, N);
    sampler_candidates(&s, tied);
    three = (double)s.prob[1] + s.prob[3] + s.prob[4];
    sampler_free(&s);
    SamplerParams sp4 = {1.0f, (float)(three + 0.01), 0, 0, 7};
    sampler_init(&s, &sp4, N);
    keep = sampler_candidates(&s, tied);
    CHECK(keep == 4 && kept_contains(&s, keep, 0) && !kept_contains(&s, keep, 5),
          "a fourth token among equals is the lower id (kept %d)", keep);
    sampler_free(&s);

    /* p = 1 keeps everything, even a token a million times less likely than the rest */
    const float wide[N] = {3.0f, 2.0f, 1.0f, 0.0f, -1.0f, -2.0f, -10.0f, -14.0f};
    SamplerParams one = {1.0f, 1.0f, 0, 0, 7};
    sampler_init(&s, &one, N);
    CHECK(sampler_candidates(&s, wide) == N, "top_p=1 keeps all tokens");
    sampler_free(&s);

    /* top_p after top_k: p is a share of the mass the top 3 keep */
    const int top3[3] = {1, 6, 3};
    SamplerParams kp = {1.0f, 0.75f, 0, 3, 7};
    sampler_init(&s, &kp, N);
    keep = sampler_candidates(&s, distinct);
    CHECK(top_p_set_is_exact(&s, keep, top3, 3, 0.75) && keep == 2,
          "top_p=0.75 after top_k=3 keeps the smallest share of the top 3 (kept %d)", keep);
    sampler_free(&s);
}

/* With a tiny p only the most likely token is left, so any seed gives the greedy token; and at
 * any p every sample comes from the kept set. Fixed seeds, no statistics. */
static void test_top_p_sampling(void) {
    enum { N = 8 };
    const float tied[N] = {1.0f, 2.0f, 0.0f, 2.0f, 2.0f, 1.0f, 0.0f, 0.0f};
    const float distinct[N] = {0.3f, 2.1f, -0.7f, 1.4f, 0.9f, -2.0f, 1.8f, 0.05f};
    const float *cases[2] = {tied, distinct};
    for (int c = 0; c < 2; c++) {
        int greedy = argmax(cases[c], N), same = 1;
        for (uint64_t seed = 1; seed <= 200; seed++) {
            Sampler s;
            SamplerParams sp = {1.5f, 1e-6f, 0, 0, seed};
            sampler_init(&s, &sp, N);
            same &= sampler_sample(&s, cases[c]) == greedy;
            sampler_free(&s);
        }
        CHECK(same, "top_p=1e-6 samples the greedy token for every seed (case %d)", c);
    }
    Sampler s;
    SamplerParams sp = {1.0f, 0.6f, 0, 0, 99};
    sampler_init(&s, &sp, N);
    int keep = sampler_candidates(&s, distinct), kept[N], inside = 1;
    for (int i = 0; i < keep; i++) kept[i] = s.idx[i];
    for (int i = 0; i < 500; i++) {
        int t = sampler_sample(&s, distinct), hit = 0;
        for (int j = 0; j < keep; j++) hit |= t == kept[j];
        inside &= hit;
    }
    CHECK(keep < N && inside, "every top_p=0.6 sample is one of the %d kept tokens", keep);
    sampler_free(&s);
}

void test_sampler_top_p(void) {
    test_top_p_exact_sets();
    test_top_p_sampling();
}
