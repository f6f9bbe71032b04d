/* Streaming detokenization with the output of HF decode over the whole token stream. Byte-level
 * decoders: Rust's String::from_utf8_lossy of the token bytes (complete characters go out as
 * soon as they are complete, an incomplete tail is held back, at most 3 bytes, and every maximal
 * invalid subsequence becomes one U+FFFD). ByteFallback decoders: a run of <0xNN> tokens is held
 * until a text token ends it, then goes out as its text when valid UTF-8, else as one U+FFFD
 * per byte (HF's rule); a Strip decoder's leading spaces are dropped from the start. */
#include <string.h>

#include "tokenizer/tokenizer.h"

void tok_stream_init(TokStream *s) { memset(s, 0, sizeof *s); }

/* Each input byte yields at most one U+FFFD (3 bytes), plus one for a held-back prefix. */
size_t tok_stream_cap(const Tokenizer *t) { return 3 * (tok_max_token_bytes(t) + TOK_STREAM_GROUP + 8); }

static size_t seq_need(unsigned char lead) { return lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2; }

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

typedef struct {
    char *out;
    size_t cap, n;
} Out;

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
                if (s->npending == seq_need(s->pending[0])) {
                    emit(o, s->pending, s->npending);
                    s->npending = 0;
                }
                continue;
            }
            emit_fffd(o); /* one U+FFFD per maximal invalid prefix, then b starts afresh */
            s->npending = 0;
        }
        if (b < 0x80) emit(o, &b, 1);
        else if (b >= 0xC2 && b <= 0xF4) {
            s->pending[0] = b;
            s->npending = 1;
        } else emit_fffd(o);
    }
}

/* Whether g[0..n) is complete, valid UTF-8 (Rust's String::from_utf8 accepting it). */
static int valid_utf8(const unsigned char *g, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char b = g[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        if (b < 0xC2 || b > 0xF4) return 0;
        size_t need = seq_need(b);
        if (i + need > n) return 0;
        for (size_t k = 1; k < need; k++)
            if (!cont_ok(g + i, k, g[i + k])) return 0;
        i += need;
    }
    return 1;
}

/* The held run of byte tokens, resolved as HF's ByteFallback decoder resolves it. */
static void flush_group(TokStream *s, Out *o) {
    if (!s->ngroup) return;
    if (valid_utf8(s->group, s->ngroup)) emit(o, s->group, s->ngroup);
    else
        for (size_t i = 0; i < s->ngroup; i++) emit_fffd(o);
    s->ngroup = 0;
}

/* Drops the Strip decoder's leading spaces from the output written since `from`. */
static void strip_start(TokStream *s, Out *o, size_t from) {
    size_t k = from;
    while (s->strip_left > 0 && k < o->n) {
        if (o->out[k] != ' ') {
            s->strip_left = 0;
            break;
        }
        k++;
        s->strip_left--;
    }
    if (k > from) {
        memmove(o->out + from, o->out + k, o->n - k);
        o->n -= k - from;
    }
}

size_t tok_stream_push(const Tokenizer *t, TokStream *s, int32_t id, int render_special, char *out, size_t cap) {
    size_t n;
    const char *p = tok_token_bytes(t, id, &n);
    if (!s->started) {
        s->started = 1;
        s->strip_left = tok_strip_start(t);
    }
    if (!p || (tok_is_special(t, id) && !render_special)) return 0;
    Out o = {out, cap, 0};
    if (tok_is_byte(t, id)) {
        if (s->ngroup == TOK_STREAM_GROUP) flush_group(s, &o);
        s->group[s->ngroup++] = (unsigned char)p[0];
    } else {
        flush_group(s, &o);
        stream_bytes(s, (const unsigned char *)p, n, &o);
    }
    strip_start(s, &o, 0);
    return o.n;
}

size_t tok_stream_flush(TokStream *s, char *out, size_t cap) {
    Out o = {out, cap, 0};
    flush_group(s, &o);
    if (s->npending) emit_fffd(&o);
    s->npending = 0;
    strip_start(s, &o, 0);
    return o.n;
}
