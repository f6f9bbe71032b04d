#include "util/clock.h"
#include "engine/engine_grammar.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer/tokenizer.h"

#define KEEP_STATES_MAX 200000 /* about 200 MB of transition tables */

struct EngineGrammar {
    GrammarVocab *vocab;
    char *text; /* the grammar `run` was compiled from */
    size_t len;
    Grammar *g;
    GrammarRun *run;
    float *masked; /* logits with the disallowed tokens at -inf (picks run one at a time) */
    int busy;      /* `run` serves a request now */
};

static int is_eos(const Arch *a, int tok) {
    for (int i = 0; i < a->n_eos; i++)
        if (a->eos[i] == tok) return 1;
    return 0;
}

static GrammarVocab *build_vocab(const Engine *e) {
    int V = e->model.a.vocab;
    const char **bytes = calloc((size_t)V, sizeof *bytes);
    size_t *len = calloc((size_t)V, sizeof *len);
    uint8_t *kind = calloc((size_t)V, 1);
    GrammarVocab *v = NULL;
    if (bytes && len && kind) {
        for (int i = 0; i < V; i++) {
            bytes[i] = tok_token_bytes(e->tok, i, &len[i]);
            kind[i] = is_eos(&e->model.a, i) ? GV_EOS : !bytes[i] ? GV_NONE : tok_is_added(e->tok, i) ? GV_ADDED : GV_TEXT;
            if (!bytes[i]) {
                bytes[i] = "";
                len[i] = 0;
            }
        }
        v = grammar_vocab_new(V, bytes, len, kind);
    }
    free(bytes);
    free(len);
    free(kind);
    return v;
}

/* Each run that may be in flight at once gets an equal share of the budget's mask cache. */
static size_t mask_share(const Engine *e) {
    return (size_t)(e->budget.mask_cache / (uint64_t)(e->parallel > 0 ? e->parallel : 1));
}

GrammarRun *engine_grammar_begin(Engine *e, const char *text, size_t n, char *err, size_t errlen) {
    if (!e->tok) {
        snprintf(err, errlen, "grammar: needs the model's tokenizer.json, which this model has none of");
        return NULL;
    }
    EngineGrammar *eg = e->grammar;
    if (!eg && !(eg = e->grammar = calloc(1, sizeof *eg))) goto oom;
    if (!eg->vocab && !(eg->vocab = build_vocab(e))) goto oom;
    if (!eg->masked && !(eg->masked = malloc(sizeof(float) * (size_t)e->model.a.vocab))) goto oom;
    GrammarStats gs = {0};
    if (eg->run) grammar_stats(eg->run, &gs);
    /* the same grammar again starts warm, unless its DFA has grown past a bound on its memory */
    if (eg->run && !eg->busy && eg->len == n && !memcmp(eg->text, text, n) && !grammar_run_failed(eg->run) &&
        gs.dfa_states < KEEP_STATES_MAX) {
        grammar_run_reset(eg->run);
        eg->busy = 1;
        return eg->run;
    }
    if (eg->busy) { /* the kept run serves another request: this one gets a run of its own */
        Grammar *g = grammar_parse(text, n, err, errlen);
        GrammarRun *r = g ? grammar_run_new(g, eg->vocab) : NULL;
        if (!r && g) {
            grammar_free(g);
            goto oom;
        }
        if (r) grammar_run_set_mask_cache(r, mask_share(e));
        return r;
    }
    grammar_run_free(eg->run);
    grammar_free(eg->g);
    free(eg->text);
    eg->run = NULL;
    eg->g = NULL;
    eg->text = NULL;
    if (!(eg->g = grammar_parse(text, n, err, errlen))) return NULL;
    if (!(eg->text = malloc(n + 1)) || !(eg->run = grammar_run_new(eg->g, eg->vocab))) goto oom;
    grammar_run_set_mask_cache(eg->run, mask_share(e));
    memcpy(eg->text, text, n);
    eg->len = n;
    eg->busy = 1;
    return eg->run;
oom:
    snprintf(err, errlen, "grammar: out of memory");
    return NULL;
}

static int bit(const uint32_t *m, int t) { return (m[t >> 5] >> (t & 31)) & 1; }


int engine_grammar_pick(Engine *e, GrammarRun *r, Sampler *s, const float *logits, int budget, double *ms) {
    /* Greedy: the model's own pick usually fits, and checking it costs a few trie steps; only a
     * misfit pays for the mask. (The argmax is the sampler's own work, not the grammar's.) */
    int first = s->p.temperature <= 0 ? argmax(logits, e->model.a.vocab) : -1;
    double t0 = now_ms();
    if (first >= 0 && grammar_allows(r, first, budget)) {
        *ms += now_ms() - t0;
        return first;
    }
    const uint32_t *bits;
    const int V = e->model.a.vocab;
    int count;
    if (s->p.temperature <= 0) {
        /* the best allowed token, visiting only words with allowed bits; near the end of the
         * budget only a token that beats the best so far is checked against it, instead of
         * filtering the whole mask */
        count = grammar_mask(r, -1, &bits);
        int tight = budget >= 0 && grammar_mask_max_next(r) > budget, best = -1;
        for (int pass = 0; pass < 2 && best < 0 && count > 0; pass++, tight = 0) /* pass 2: the budget cannot be met */
            for (int w = 0; w < (V + 31) / 32; w++)
                for (uint32_t m = bits[w]; m; m &= m - 1) {
                    int t = w * 32 + __builtin_ctz(m);
                    if (t < V && (best < 0 || logits[t] > logits[best]) && (!tight || grammar_allows(r, t, budget))) best = t;
                }
        *ms += now_ms() - t0;
        return count < 0 || grammar_run_failed(r) ? -2 : best < 0 ? -1 : best;
    }
    count = grammar_mask(r, budget, &bits);
    if (count == 0 && budget >= 0) count = grammar_mask(r, -1, &bits); /* the budget cannot be met: let it run */
    if (count <= 0) {
        *ms += now_ms() - t0;
        return count < 0 ? -2 : -1;
    }
    /* Sampling: one pass over the masked logits (sampling first and checking would pay for the
     * sampler twice whenever the model's pick misfits). */
    float *x = e->grammar->masked;
    for (int w = 0; w < (V + 31) / 32; w++) {
        int base = w * 32, n = V - base < 32 ? V - base : 32;
        if (bits[w] == UINT32_MAX) memcpy(x + base, logits + base, sizeof(float) * (size_t)n);
        else
            for (int k = 0; k < n; k++) x[base + k] = (bits[w] >> k) & 1 ? logits[base + k] : -INFINITY;
    }
    *ms += now_ms() - t0;
    int tok = sampler_sample(s, x);
    if (tok >= 0 && tok < V && bit(bits, tok)) return tok;
    int best = -1; /* every allowed logit is -inf or NaN: the first allowed token */
    for (int t = 0; t < V; t++)
        if (bit(bits, t) && (best < 0 || x[t] > x[best])) best = t;
    return best;
}

void engine_grammar_end(Engine *e, GrammarRun *r) {
    EngineGrammar *eg = e->grammar;
    if (!r) return;
    if (eg && r == eg->run) {
        eg->busy = 0;
        return;
    }
    const Grammar *g = grammar_run_grammar(r);
    grammar_run_free(r);
    grammar_free((Grammar *)g);
}

void engine_grammar_free(Engine *e) {
    EngineGrammar *eg = e->grammar;
    if (!eg) return;
    grammar_run_free(eg->run);
    grammar_free(eg->g);
    grammar_vocab_free(eg->vocab);
    free(eg->text);
    free(eg->masked);
    free(eg);
    e->grammar = NULL;
}
