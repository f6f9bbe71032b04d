#include "engine_grammar.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

struct EngineGrammar {
    GrammarVocab *vocab;
    char *text;      /* the grammar `run` was compiled from */
    size_t len;
    Grammar *g;
    GrammarRun *run;
    float *masked;   /* logits with the disallowed tokens at -inf */
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
            if (!bytes[i]) { bytes[i] = ""; len[i] = 0; }
        }
        v = grammar_vocab_new(V, bytes, len, kind);
    }
    free(bytes); free(len); free(kind);
    return v;
}

GrammarRun *engine_grammar_begin(Engine *e, const char *text, size_t n, char *err, size_t errlen) {
    if (!e->tok) { snprintf(err, errlen, "grammar: needs the model's tokenizer.json, which this model has none of"); return NULL; }
    EngineGrammar *eg = e->grammar;
    if (!eg && !(eg = e->grammar = calloc(1, sizeof *eg))) goto oom;
    if (!eg->vocab && !(eg->vocab = build_vocab(e))) goto oom;
    if (!eg->masked && !(eg->masked = malloc(sizeof(float) * (size_t)e->model.a.vocab))) goto oom;
    if (eg->run && eg->len == n && !memcmp(eg->text, text, n) && !grammar_run_failed(eg->run)) {
        grammar_run_reset(eg->run);
        return eg->run;
    }
    grammar_run_free(eg->run); grammar_free(eg->g); free(eg->text);
    eg->run = NULL; eg->g = NULL; eg->text = NULL;
    if (!(eg->g = grammar_parse(text, n, err, errlen))) return NULL;
    if (!(eg->text = malloc(n + 1)) || !(eg->run = grammar_run_new(eg->g, eg->vocab))) goto oom;
    memcpy(eg->text, text, n);
    eg->len = n;
    return eg->run;
oom:
    snprintf(err, errlen, "grammar: out of memory");
    return NULL;
}

static int bit(const uint32_t *m, int t) { return (m[t >> 5] >> (t & 31)) & 1; }

int engine_grammar_pick(Engine *e, GrammarRun *r, Sampler *s, const float *logits, int budget) {
    /* Most tokens a model picks fit; only a misfit pays for the mask (llama.cpp does the same). */
    int tok = sampler_sample(s, logits);
    if (grammar_allows(r, tok, budget)) return tok;
    if (grammar_run_failed(r)) return -2;
    const uint32_t *bits;
    int count = grammar_mask(r, budget, &bits);
    if (count == 0 && budget >= 0) count = grammar_mask(r, -1, &bits);
    if (count < 0) return -2;
    if (count == 0) return -1;
    const int V = e->model.a.vocab;
    float *x = e->grammar->masked;
    for (int t = 0; t < V; t++) x[t] = bit(bits, t) ? logits[t] : -INFINITY;
    tok = sampler_sample(s, x);
    if (tok >= 0 && tok < V && bit(bits, tok)) return tok;
    int best = -1; /* every allowed logit is -inf or NaN: the first allowed token */
    for (int t = 0; t < V; t++)
        if (bit(bits, t) && (best < 0 || x[t] > x[best])) best = t;
    return best;
}

void engine_grammar_free(Engine *e) {
    EngineGrammar *eg = e->grammar;
    if (!eg) return;
    grammar_run_free(eg->run); grammar_free(eg->g); grammar_vocab_free(eg->vocab);
    free(eg->text); free(eg->masked); free(eg);
    e->grammar = NULL;
}
