/* The engine's side of constrained decoding (docs/protocol.md, "Grammar"): the vocabulary trie
 * built on first use, the last grammar kept compiled (an agent sends the same one again and
 * again, and its DFA and masks stay warm), and the pick of a token the grammar allows. */
#ifndef COLI_ENGINE_GRAMMAR_H
#define COLI_ENGINE_GRAMMAR_H
#include "engine/engine.h"
#include "grammar/grammar.h"
#include "engine/sampler.h"

/* The run for grammar text[0..n), at the start of the output. NULL with err filled (a bad
 * grammar, or no tokenizer). Hand it back with engine_grammar_end when the request ends; requests
 * in flight together each get their own. */
GrammarRun *engine_grammar_begin(Engine *e, const char *text, size_t n, char *err, size_t errlen);
void engine_grammar_end(Engine *e, GrammarRun *r);
/* A token sampled from the logits among those the grammar allows whose state can still be
 * completed within budget bytes (budget < 0: no limit; when no token fits the budget, the limit
 * is dropped). -1: no token can continue the output (a dead end); -2: out of memory. The time
 * spent on the grammar (not on sampling) is added to *ms. */
int engine_grammar_pick(Engine *e, GrammarRun *r, Sampler *s, const float *logits, int budget, double *ms);
void engine_grammar_free(Engine *e);

#endif
