/* What both tokenizer harnesses do with a loaded tokenizer: encode, then stream-decode the ids,
 * checking the output bounds the API promises. */
#ifndef COLI_FUZZ_TOK_COMMON_H
#define COLI_FUZZ_TOK_COMMON_H
#include "harness.h"
#include "tokenizer/tokenizer.h"

/* Encodes text and decodes it back; returns the decoded bytes (malloc'd, *out_len) or NULL when
 * the encoder refused the text. */
static char *fuzz_roundtrip(const Tokenizer *t, const char *text, size_t len, int parse_special, int add_special,
                            int render_special, size_t *out_len) {
    int32_t *ids = NULL;
    size_t n = 0;
    char err[512] = "";
    if (tok_encode(t, text, len, parse_special, add_special, &ids, &n, err, sizeof err)) {
        if (!err[0]) abort();
        return NULL;
    }
    size_t cap = tok_stream_cap(t), total = 0, room = (n + 1) * cap + 64;
    char *out = malloc(room);
    if (!out) abort();
    TokStream s;
    tok_stream_init(&s);
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= tok_vocab_size(t)) abort(); /* every id must be decodable */
        size_t blen;
        if (!tok_token_bytes(t, ids[i], &blen)) abort();
        size_t w = tok_stream_push(t, &s, ids[i], render_special, out + total, cap);
        if (w > cap) abort();
        total += w;
    }
    total += tok_stream_flush(&s, out + total, room - total);
    if (total > room) abort();
    free(ids);
    *out_len = total;
    return out;
}

#endif
