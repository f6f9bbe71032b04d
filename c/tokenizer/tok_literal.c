/* Literal spans: byte ranges of a prompt whose text must stay text. A chat template's own
 * markup may spell special tokens; text copied from a message must not (role injection), so
 * the launcher marks where message text spelled an added token and the tokenizer does not
 * match added tokens there. Grammar (docs/protocol.md): "START-END[,START-END...]", decimal
 * byte offsets into the prompt, ascending, disjoint, non-empty, on UTF-8 character starts. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "tokenizer/tokenizer.h"

int tok_literal_check(const char *text, size_t len, const size_t *pairs, size_t npairs, char *err, size_t errlen) {
    const unsigned char *s = (const unsigned char *)text;
    size_t prev_end = 0;
    for (size_t i = 0; i < npairs; i++) {
        size_t a = pairs[2 * i], b = pairs[2 * i + 1];
        if (a >= b || b > len || (i && a < prev_end)) {
            snprintf(err, errlen,
                     "literal span %zu (%zu-%zu) must be non-empty, ascending, disjoint and inside the "
                     "%zu-byte prompt",
                     i, a, b, len);
            return -1;
        }
        if ((s[a] & 0xC0) == 0x80 || (b < len && (s[b] & 0xC0) == 0x80)) {
            snprintf(err, errlen, "literal span %zu (%zu-%zu) does not start and end on UTF-8 character boundaries", i, a, b);
            return -1;
        }
        prev_end = b;
    }
    return 0;
}

static int parse_offset(const char **p, const char *end, size_t *out) {
    const char *q = *p;
    size_t v = 0;
    if (q == end || *q < '0' || *q > '9') return -1;
    for (; q < end && *q >= '0' && *q <= '9'; q++) {
        if (v > ((size_t)1 << 40)) return -1; /* far beyond any payload */
        v = v * 10 + (size_t)(*q - '0');
    }
    *p = q;
    *out = v;
    return 0;
}

int tok_literal_parse(const char *spec, size_t n, size_t **pairs_out, size_t *npairs_out, char *err, size_t errlen) {
    *pairs_out = NULL;
    *npairs_out = 0;
    size_t cap = 1;
    for (size_t i = 0; i < n; i++) cap += spec[i] == ',';
    size_t *pairs = malloc(2 * cap * sizeof *pairs), np = 0;
    if (!pairs) {
        snprintf(err, errlen, "out of memory for literal spans");
        return -1;
    }
    const char *p = spec, *end = spec + n;
    while (p < end) {
        size_t a, b;
        if (parse_offset(&p, end, &a) || p == end || *p++ != '-' || parse_offset(&p, end, &b) || (p < end && *p++ != ',') ||
            (p == end && p[-1] == ',')) {
            snprintf(err, errlen, "literal spans must read START-END[,START-END...] (decimal byte offsets), got '%.*s'",
                     n > 80 ? 80 : (int)n, spec);
            free(pairs);
            return -1;
        }
        pairs[2 * np] = a;
        pairs[2 * np + 1] = b;
        np++;
    }
    if (!np) {
        snprintf(err, errlen, "literal span list is empty");
        free(pairs);
        return -1;
    }
    *pairs_out = pairs;
    *npairs_out = np;
    return 0;
}
