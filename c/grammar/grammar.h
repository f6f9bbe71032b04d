/* Constrained decoding: a GBNF grammar (docs/protocol.md) restricts each generated token to those
 * that keep the output a valid prefix of the grammar's language.
 *
 * Three layers: Grammar (the parsed, checked rules; immutable), GrammarVocab (the tokenizer's
 * byte strings as a preorder trie, built once per engine) and GrammarRun (one generation's
 * matcher: a lazily built DFA over sets of pushdown stacks, with a cached token mask per DFA
 * state, so a state the output revisits costs nothing the second time). */
#ifndef COLI_GRAMMAR_H
#define COLI_GRAMMAR_H
#include <stddef.h>
#include <stdint.h>

/* ---- grammar (grammar_parse.c) ---- */
enum { GE_END, GE_ALT, GE_REF, GE_CHAR, GE_CHAR_NOT };
typedef struct {
    uint8_t type;
    uint32_t a, b; /* REF: a = rule; CHAR/CHAR_NOT: ranges[a .. a+b) */
} GElem;

typedef struct Grammar {
    GElem *el; /* every rule's alternatives, each ended by ALT (another follows) or END */
    size_t n_el;
    uint32_t *rule_start; /* first element of rule r */
    uint32_t *ranges;     /* code point pairs lo, hi */
    size_t n_ranges, n_rules;
    uint32_t root;
    uint32_t *minrest; /* bytes the rest of the alternative needs at least, from each element */
    char *literals;    /* the grammar's string literals, each NUL-ended, as UTF-8 */
    size_t literals_len;
} Grammar;

#define GRAMMAR_MAX_REPEAT 10000
#define GRAMMAR_MAX_ELEMENTS (4u << 20)

/* Parses and checks GBNF text (n bytes, any content). NULL with err "grammar: at byte N: ..." */
Grammar *grammar_parse(const char *text, size_t n, char *err, size_t errlen);
void grammar_free(Grammar *g);
/* 1 when literal bytes s[0..n) occur inside one of the grammar's string literals. */
int grammar_has_literal(const Grammar *g, const char *s, size_t n);

/* ---- vocabulary (grammar_mask.c) ---- */
enum { GV_NONE, GV_TEXT, GV_ADDED, GV_EOS }; /* token kinds */
typedef struct GrammarVocab GrammarVocab;
/* bytes[i]/len[i]: token i's output bytes; kind[i]: GV_TEXT (ordinary, in the trie), GV_ADDED
 * (an added token: allowed only where the grammar spells its text as a literal), GV_EOS (ends
 * the output) or GV_NONE (never generated). NULL on out of memory. */
GrammarVocab *grammar_vocab_new(int n, const char *const *bytes, const size_t *len, const uint8_t *kind);
void grammar_vocab_free(GrammarVocab *v);
size_t grammar_vocab_nodes(const GrammarVocab *v); /* trie size, for the benchmark */

/* ---- one generation (grammar_match.c, grammar_mask.c) ---- */
typedef struct GrammarRun GrammarRun;
GrammarRun *grammar_run_new(const Grammar *g, const GrammarVocab *v);
void grammar_run_free(GrammarRun *r);
const Grammar *grammar_run_grammar(const GrammarRun *r);
void grammar_run_reset(GrammarRun *r);       /* back to the start of the output; caches are kept */
int grammar_run_failed(const GrammarRun *r); /* an allocation failed, or the work limit was reached */
/* Expansion steps allowed between resets (default 20M, a few seconds: only a grammar that is
 * ambiguous at every step gets near it). */
void grammar_run_set_work_limit(GrammarRun *r, uint64_t steps);
/* Bytes the run's cached token masks may take (default GRAMMAR_MASK_CACHE_DEFAULT; the engine
 * sizes it from the RAM budget); past it they are dropped and rebuilt on use. */
#define GRAMMAR_MASK_CACHE_DEFAULT ((size_t)64 << 20)
void grammar_run_set_mask_cache(GrammarRun *r, size_t bytes);
/* Bytes the engine sets aside for the vocabulary trie of a vocab-token vocabulary, and for each
 * run's scratch (grammar_mask.c; measured in docs/architecture.md, "RAM budget"). */
uint64_t grammar_reserve_bytes(int vocab, int runs);

/* The current state: complete (the output so far is a whole sentence: EOS allowed) and
 * finished (complete and nothing can follow). */
int grammar_complete(const GrammarRun *r);
int grammar_finished(const GrammarRun *r);
/* Bytes any completion of the output needs at least (0 when complete). */
int grammar_min_bytes(const GrammarRun *r);
/* 1 when token tok may come next and its state then needs at most budget bytes to complete
 * (budget < 0: no limit). */
int grammar_allows(GrammarRun *r, int tok, int budget);
/* Advances over token tok; -1 when it is not allowed (state unchanged). */
int grammar_accept(GrammarRun *r, int tok);
/* Advances over raw bytes (tests, the CLI check): -1 at the first byte that cannot follow,
 * with *at set to its offset. */
int grammar_accept_bytes(GrammarRun *r, const char *s, size_t n, size_t *at);
/* The allowed-token bitset (1 bit per id, n words of 32 bits) for the current state; EOS bits
 * follow grammar_complete. budget >= 0 also drops tokens whose state would need more bytes than
 * budget to complete. Returns how many tokens are allowed (-1 out of memory). The bits stay valid
 * until the next call on r. */
int grammar_mask(GrammarRun *r, int budget, const uint32_t **bits);

/* After grammar_mask: the most bytes a state an allowed token leads to needs (a budget at least
 * this large filters nothing). */
int grammar_mask_max_next(const GrammarRun *r);

/* Stats for the benchmark and the END line. */
typedef struct {
    uint64_t masks_built, mask_hits, dfa_states, nodes;
} GrammarStats;
void grammar_stats(const GrammarRun *r, GrammarStats *s);

#endif
