/* Token sampling: greedy at temperature 0, otherwise temperature -> top-k -> top-p -> min-p
 * (the order transformers applies them), with a seeded generator for reproducible runs.
 * Repetition, frequency and presence penalties (llama.cpp's) act first, on a copy of the
 * logits, over a window of the last last_n tokens the sampler was given. */
#ifndef COLI_SAMPLER_H
#define COLI_SAMPLER_H
#include <stdint.h>

typedef struct {
    float temperature, top_p, min_p;
    int top_k;
    uint64_t seed;
} SamplerParams;

typedef struct {
    float repeat, frequency, presence; /* 0 or 1 / 0 / 0: no penalty */
    int last_n;                        /* tokens in the window; <= 0: none */
} SamplerPenalties;

typedef struct {
    SamplerParams p;
    uint64_t state;
    int n;
    float *prob;
    int *idx;
    float *tmp;    /* scratch for the top-k selection */
    uint32_t *key; /* radix sort scratch: 2 x n sort keys */
    int *idx2;     /* and n ids */
    float pmax;    /* the largest of prob */
    SamplerPenalties pen;
    int *recent; /* the penalty window, a ring of recent_cap ids (NULL: no penalties) */
    int recent_cap, recent_n, recent_at;
} Sampler;

int sampler_init(Sampler *s, const SamplerParams *p, int vocab);
void sampler_free(Sampler *s);
int sampler_sample(Sampler *s, const float *logits);
/* Penalties from now on (after sampler_init; allocates the window when one applies); -1 without memory. */
int sampler_set_penalties(Sampler *s, const SamplerPenalties *pen);
/* Adds a token (of the prompt, or one generated) to the penalty window; nothing without penalties. */
void sampler_accept(Sampler *s, int tok);
/* The logits with the penalties applied over the window: llama.cpp's rule, per distinct token
 * with count c in the window, l <= 0 ? l * repeat : l / repeat, then l -= c * frequency +
 * presence. Without penalties (or an empty window) returns logits itself; else a copy in the
 * sampler's scratch, valid until the next sampler call. */
const float *sampler_penalize(Sampler *s, const float *logits);
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
