/* The small UTF-8 and buffer helpers every tokenizer file shares (tok_internal.h). */
#include "tokenizer/tok_internal.h"
#include "util/grow.h"

/* ---- UTF-8 validation with Rust's rules (the reference library takes a Rust &str) ---- */

size_t tok_u8_valid_len(const unsigned char *s, size_t n) {
    if (n == 0) return 0;
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;      /* overlong */
        else if (c == 0xED) hi = 0x9F; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;      /* overlong */
        else if (c == 0xF4) hi = 0x8F; /* > U+10FFFF */
    } else return 0;
    if (n < need) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < need; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return need;
}

size_t tok_u8_first_invalid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t l = tok_u8_valid_len(s + i, n - i);
        if (!l) return i;
        i += l;
    }
    return n;
}

int tok_buf_reserve(TokBuf *b, size_t extra) {
    if (b->oom) return -1;
    if (b->cap - b->n >= extra) return 0;
    unsigned char *p = extra > SIZE_MAX - b->n ? NULL : grow_array(b->p, &b->cap, b->n + extra, 1, 64);
    if (!p) {
        b->oom = 1;
        return -1;
    }
    b->p = p;
    return 0;
}

int tok_ids_push(TokIds *a, int32_t id) {
    if (a->oom) return -1;
    int32_t *v = grow_array(a->v, &a->cap, a->n + 1, sizeof *v, 64);
    if (!v) {
        a->oom = 1;
        return -1;
    }
    a->v = v;
    a->v[a->n++] = id;
    return 0;
}
