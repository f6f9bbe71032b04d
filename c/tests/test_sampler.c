#include <stdlib.h>

#include "check.h"
#include "sampler.h"

void test_sampler(void) {
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
    CHECK(!seen[0] && !seen[3] && !seen[5] && seen[1] && seen[2] && seen[4], "min_p=0.5 keeps only tokens within half of the best");
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
