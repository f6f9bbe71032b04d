/* Token sampling: greedy at temperature 0, otherwise temperature -> top-k -> top-p -> min-p
 * (the order transformers applies them), with a seeded generator for reproducible runs. */
#ifndef COLI_SAMPLER_H
#define COLI_SAMPLER_H
#include <stdint.h>

typedef struct {
    float temperature, top_p, min_p;
    int top_k;
    uint64_t seed;
} SamplerParams;

typedef struct {
    SamplerParams p;
    uint64_t state;
    int n;
    float *prob;
    int *idx;
    float *tmp;  /* scratch for the top-k selection */
    uint32_t *key; /* radix sort scratch: 2 x n sort keys */
    int *idx2;     /* and n ids */
    float pmax;  /* the largest of prob */
} Sampler;

int sampler_init(Sampler *s, const SamplerParams *p, int vocab);
void sampler_free(Sampler *s);
int sampler_sample(Sampler *s, const float *logits);
/* The candidates sampler_sample draws from (temperature > 0): s->idx[0..keep) holds the
 * surviving token ids by probability, highest first (equal probabilities: lower id first),
 * s->prob the softmax probabilities by id; returns keep, how many survive top-k, then top-p,
 * then min-p. Only the head of the vocabulary the filters can keep is sorted (no filter: all),
 * so s->idx past keep is unspecified. */
int sampler_candidates(Sampler *s, const float *logits);
/* A seed for a request that names none: from the kernel's entropy source, so two identical
 * unseeded requests differ even when they arrive in the same second. */
uint64_t sampler_entropy_seed(void);
int argmax(const float *x, int n);

#endif
