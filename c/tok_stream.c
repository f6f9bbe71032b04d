/* Streaming detokenization with the output of Rust's String::from_utf8_lossy over the whole
 * token stream (what HF decode returns): complete characters go out as soon as they are
 * complete, an incomplete tail is held back (at most 3 bytes), and every maximal invalid
 * subsequence becomes one U+FFFD. */
#include <string.h>

#include "tokenizer.h"

void tok_stream_init(TokStream *s) { memset(s, 0, sizeof *s); }

/* Each input byte yields at most one U+FFFD (3 bytes), plus one for a held-back prefix. */
size_t tok_stream_cap(const Tokenizer *t) { return 3 * (tok_max_token_bytes(t) + 8); }

static size_t seq_need(unsigned char lead) {
    return lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
}

/* Whether b may follow pending[0..k) (k >= 1) in a valid sequence (Rust/Unicode rules). */
static int cont_ok(const unsigned char *pending, size_t k, unsigned char b) {
    unsigned lo = 0x80, hi = 0xBF;
    if (k == 1) {
        if (pending[0] == 0xE0) lo = 0xA0;
        else if (pending[0] == 0xED) hi = 0x9F;
        else if (pending[0] == 0xF0) lo = 0x90;
        else if (pending[0] == 0xF4) hi = 0x8F;
    }
    return b >= lo && b <= hi;
}

typedef struct { char *out; size_t cap, n; } Out;

static void emit(Out *o, const void *p, size_t n) {
    if (o->cap - o->n < n) return; /* cut at a character boundary */
    memcpy(o->out + o->n, p, n);
    o->n += n;
}

static void emit_fffd(Out *o) { emit(o, "\xEF\xBF\xBD", 3); }

static void stream_bytes(TokStream *s, const unsigned char *p, size_t n, Out *o) {
    for (size_t i = 0; i < n; i++) {
        unsigned char b = p[i];
        if (s->npending) {
            if (cont_ok(s->pending, s->npending, b)) {
                s->pending[s->npending++] = b;
                if (s->npending == seq_need(s->pending[0])) { emit(o, s->pending, s->npending); s->npending = 0; }
                continue;
            }
            emit_fffd(o); /* one U+FFFD per maximal invalid prefix, then b starts afresh */
            s->npending = 0;
        }
        if (b < 0x80) emit(o, &b, 1);
        else if (b >= 0xC2 && b <= 0xF4) { s->pending[0] = b; s->npending = 1; }
        else emit_fffd(o);
    }
}

size_t tok_stream_push(const Tokenizer *t, TokStream *s, int32_t id, int render_special, char *out, size_t cap) {
    size_t n;
    const char *p = tok_token_bytes(t, id, &n);
    if (!p || (tok_is_special(t, id) && !render_special)) return 0;
    Out o = {out, cap, 0};
    stream_bytes(s, (const unsigned char *)p, n, &o);
    return o.n;
}

size_t tok_stream_flush(TokStream *s, char *out, size_t cap) {
    Out o = {out, cap, 0};
    if (s->npending) emit_fffd(&o);
    s->npending = 0;
    return o.n;
}
