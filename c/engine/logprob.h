/* The LOGPROB line (docs/protocol.md): log-softmax of the raw logits for the chosen token and
 * the top k alternatives. Any logits, however extreme (±FLT_MAX, inf, nan), format within
 * logprob_line_cap bytes. */
#ifndef COLI_LOGPROB_H
#define COLI_LOGPROB_H
#include <stddef.h>

#define LOGPROB_MAX_TOP 20

typedef struct Tokenizer Tokenizer;

/* Bytes (with the NUL) a line needs at most: k alternatives, tokens up to max_token_bytes long. */
size_t logprob_line_cap(size_t id_len, int k, size_t max_token_bytes);
/* "LOGPROB <id> <token> <logprob> <hex> <k> <tok>:<lp>:<hex>..." into out (NUL-terminated);
 * tok may be NULL (every token's bytes are then "-"). Returns the length, or -1 when cap was
 * too small (out then holds a truncated, NUL-terminated line). */
long logprob_format(char *out, size_t cap, const char *id, const float *logits, int vocab, int token, int k,
                    const Tokenizer *tok);

#endif
