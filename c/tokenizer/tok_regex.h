/* A small backtracking regex engine for the pre-tokenizer Split patterns of real checkpoints,
 * following Oniguruma (Ruby syntax) semantics, which is what HF tokenizers uses.
 *
 * Supported: alternation; groups (capturing, (?:), (?i:), (?-i:), (?i)); lookahead (?=) (?!);
 * classes [...] with ranges, negation, \p{..}/\P{..}/\p{^..} general categories, \s \S \d \D
 * \w \W; '.'; anchors ^ $ \A \z \Z; quantifiers ? * + {n} {n,} {n,m} (greedy, lazy ?,
 * possessive +) on single-character atoms, and ? / ?? on groups. Everything else (repeated
 * groups, lookbehind, backreferences, scripts such as \p{Han}, non-ASCII case folding) is
 * refused at compile time with a message naming the construct. Inputs must be valid UTF-8. */
#ifndef COLI_TOK_REGEX_H
#define COLI_TOK_REGEX_H
#include <stddef.h>
#include <stdint.h>

typedef struct TokRegex TokRegex;

TokRegex *tok_regex_compile(const char *pat, size_t len, char *err, size_t errlen);
void tok_regex_free(TokRegex *re);

/* Leftmost match starting at or after `from`: returns 1 and sets [*ms, *me), 0 when there is
 * none, -1 when the backtracking budget *steps ran out (pathological pattern/input). */
int tok_regex_search(const TokRegex *re, const unsigned char *s, size_t n, size_t from, size_t *ms, size_t *me, uint64_t *steps);

#endif
