/* NFC / NFD normalizers (Unicode UAX #15) over the generated tables. */
#include "tokenizer/tok_internal.h"
#include "tokenizer/unicode_tables.h"
#include "util/grow.h"

/* ---- NFC / NFD ---- */

enum {
    SBASE = 0xAC00,
    LBASE = 0x1100,
    VBASE = 0x1161,
    TBASE = 0x11A7,
    LCOUNT = 19,
    VCOUNT = 21,
    TCOUNT = 28,
    NCOUNT = VCOUNT * TCOUNT,
    SCOUNT = LCOUNT * NCOUNT
};

typedef struct {
    uint32_t *v;
    size_t n, cap;
} CpVec;

static int cp_push(CpVec *a, uint32_t cp) {
    uint32_t *v = grow_array(a->v, &a->cap, a->n + 1, sizeof *v, 64);
    if (!v) return -1;
    a->v = v;
    a->v[a->n++] = cp;
    return 0;
}

static int decompose_into(CpVec *d, uint32_t cp) {
    if (cp >= SBASE && cp < SBASE + SCOUNT) {
        uint32_t s = cp - SBASE;
        if (cp_push(d, LBASE + s / NCOUNT) || cp_push(d, VBASE + (s % NCOUNT) / TCOUNT)) return -1;
        if (s % TCOUNT && cp_push(d, TBASE + s % TCOUNT)) return -1;
        return 0;
    }
    size_t n;
    const uint32_t *seq = uni_decomp(cp, &n);
    if (!seq) return cp_push(d, cp);
    for (size_t i = 0; i < n; i++)
        if (cp_push(d, seq[i])) return -1;
    return 0;
}

/* Stable sort of each run of non-starters by combining class (runs are short). */
static void canonical_order(uint32_t *v, size_t n) {
    for (size_t i = 1; i < n; i++) {
        int c = uni_ccc(v[i]);
        if (!c) continue;
        size_t j = i;
        uint32_t x = v[i];
        while (j > 0) {
            int pc = uni_ccc(v[j - 1]);
            if (pc <= c) break;
            v[j] = v[j - 1];
            j--;
        }
        v[j] = x;
    }
}

static uint32_t compose_pair(uint32_t a, uint32_t b) {
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE && b < TBASE + TCOUNT) return a + (b - TBASE);
    return uni_compose(a, b);
}

static size_t compose(uint32_t *v, size_t n) {
    if (!n) return 0;
    size_t starter = 0, out = 1;
    int last = uni_ccc(v[0]);
    int have_starter = last == 0;
    if (last) last = 256;
    for (size_t i = 1; i < n; i++) {
        uint32_t ch = v[i];
        int cc = uni_ccc(ch);
        if (have_starter && (last < cc || last == 0)) {
            uint32_t c = compose_pair(v[starter], ch);
            if (c) {
                v[starter] = c;
                continue;
            }
        }
        if (cc == 0) {
            starter = out;
            have_starter = 1;
        }
        last = cc;
        v[out++] = ch;
    }
    return out;
}

/* One normalization form over valid UTF-8; returns 1 if the text is already normalized. */
static int norm_one(int kind, const unsigned char *s, size_t n, TokBuf *out, int *err) {
    size_t i = 0, adv;
    int needed = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp = u8_decode(s + i, &adv);
        size_t dn;
        /* NFD must also act on characters that merely have a decomposition. */
        if ((uni_props(cp) & UNI_F_NFC_UNSAFE) ||
            (kind == TOK_NORM_NFD && (uni_decomp(cp, &dn) || (cp >= SBASE && cp < SBASE + SCOUNT)))) {
            needed = 1;
            break;
        }
        i += adv;
    }
    if (!needed) return 1;
    CpVec d = {0};
    for (i = 0; i < n; i += adv) {
        uint32_t cp = u8_decode(s + i, &adv);
        if (decompose_into(&d, cp)) {
            *err = 1;
            free(d.v);
            return 0;
        }
    }
    canonical_order(d.v, d.n);
    size_t m = kind == TOK_NORM_NFC ? compose(d.v, d.n) : d.n;
    out->n = 0;
    if (tok_buf_reserve(out, m * 4)) {
        *err = 1;
        free(d.v);
        return 0;
    }
    for (size_t k = 0; k < m; k++) out->n += u8_encode(out->p + out->n, d.v[k]);
    free(d.v);
    return 0;
}

static const unsigned char *find_bytes(const unsigned char *s, size_t n, const char *pat, size_t pn) {
    for (size_t i = 0; pn && i + pn <= n; i++)
        if (s[i] == (unsigned char)pat[0] && !memcmp(s + i, pat, pn)) return s + i;
    return NULL;
}

/* HF's Prepend and Replace (String pattern); returns 1 when the text is unchanged. */
static int norm_string(const TokNorm *st, int at_start, const unsigned char *s, size_t n, TokBuf *out, int *err) {
    if (st->kind == TOK_NORM_PREPEND) {
        if (!at_start || !n || !st->an) return 1;
        out->n = 0;
        if (tok_buf_put(out, st->a, st->an) || tok_buf_put(out, s, n)) {
            *err = 1;
            return 0;
        }
        return 0;
    }
    if (!st->an || n < st->an) return 1;
    const unsigned char *hit = find_bytes(s, n, st->a, st->an);
    if (!hit) return 1;
    out->n = 0;
    size_t i = 0;
    while (hit) {
        size_t at = (size_t)(hit - s);
        if (tok_buf_put(out, s + i, at - i) || tok_buf_put(out, st->b, st->bn)) {
            *err = 1;
            return 0;
        }
        i = at + st->an;
        hit = find_bytes(s + i, n - i, st->a, st->an);
    }
    if (tok_buf_put(out, s + i, n - i)) {
        *err = 1;
        return 0;
    }
    return 0;
}

int tok_normalize(const TokNorm *steps, int nsteps, int at_start, const unsigned char *s, size_t n, TokBuf *buf,
                  const unsigned char **out, size_t *out_len) {
    const unsigned char *cur = s;
    size_t cur_n = n;
    TokBuf tmp = {0};
    for (int k = 0; k < nsteps; k++) {
        int err = 0;
        TokBuf *dst = (cur == buf->p && buf->p) ? &tmp : buf;
        int kind = steps[k].kind;
        int same = kind == TOK_NORM_PREPEND || kind == TOK_NORM_REPLACE ? norm_string(&steps[k], at_start, cur, cur_n, dst, &err)
                                                                        : norm_one(kind, cur, cur_n, dst, &err);
        if (same) continue;
        if (err) {
            free(tmp.p);
            return -1;
        }
        if (dst == &tmp) { /* swap so the result always lives in buf */
            TokBuf t = *buf;
            *buf = tmp;
            tmp = t;
        }
        cur = buf->p;
        cur_n = buf->n;
    }
    free(tmp.p);
    *out = cur;
    *out_len = cur_n;
    return 0;
}
