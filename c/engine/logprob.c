#include "engine/logprob.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

/* Widest number: "%.6f" below 1e9 ("-999999999.999999"), else "%.6e" ("-1.797693e+308", "-inf",
 * "nan"), so no logit can widen a field. Python's float() reads every form. */
#define LP_MAX 24
#define INT_MAX_CHARS 11

static void fmt_lp(char out[LP_MAX], double lp) { snprintf(out, LP_MAX, isfinite(lp) && fabs(lp) < 1e9 ? "%.6f" : "%.6e", lp); }

size_t logprob_line_cap(size_t id_len, int k, size_t max_token_bytes) {
    if (k < 0) k = 0;
    if (k > LOGPROB_MAX_TOP) k = LOGPROB_MAX_TOP;
    /* per entry: separators, token id, logprob, hex bytes (or "-"); the first adds the count */
    size_t entry = 4 + INT_MAX_CHARS + LP_MAX + 2 * max_token_bytes + 1;
    return sizeof "LOGPROB " + id_len + (size_t)(k + 1) * entry + 1 + INT_MAX_CHARS + 1;
}

typedef struct {
    char *p;
    size_t n, cap;
    int truncated;
} Out;

static void put(Out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(Out *o, const char *fmt, ...) {
    if (o->truncated) return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(o->p + o->n, o->cap - o->n, fmt, ap);
    va_end(ap);
    if (w < 0 || (size_t)w >= o->cap - o->n) {
        o->truncated = 1;
        o->p[o->n] = 0;
        return;
    }
    o->n += (size_t)w;
}

static void put_token_bytes(Out *o, const Tokenizer *tok, int t) {
    size_t len = 0;
    const char *bytes = tok ? tok_token_bytes(tok, t, &len) : NULL;
    if (!bytes || !len) put(o, "-");
    for (size_t b = 0; bytes && b < len; b++) put(o, "%02x", (unsigned char)bytes[b]);
}

long logprob_format(char *out, size_t cap, const char *id, const float *logits, int vocab, int token, int k,
                    const Tokenizer *tok) {
    if (!cap) return -1;
    if (k < 0) k = 0;
    if (k > LOGPROB_MAX_TOP) k = LOGPROB_MAX_TOP;
    float mx = logits[0];
    for (int i = 1; i < vocab; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int i = 0; i < vocab; i++) sum += exp((double)logits[i] - mx);
    const double lse = mx + log(sum);
    int best[LOGPROB_MAX_TOP];
    int nb = 0;
    for (int i = 0; i < vocab && k > 0; i++) { /* insertion into a sorted top-k */
        int j;
        if (nb < k) j = nb++;
        else if (logits[i] > logits[best[k - 1]]) j = k - 1;
        else continue;
        while (j > 0 && logits[i] > logits[best[j - 1]]) {
            best[j] = best[j - 1];
            j--;
        }
        best[j] = i;
    }
    Out o = {out, 0, cap, 0};
    char lp[LP_MAX];
    *out = 0;
    put(&o, "LOGPROB %s", id);
    fmt_lp(lp, (double)logits[token] - lse);
    put(&o, " %d %s ", token, lp);
    put_token_bytes(&o, tok, token);
    put(&o, " %d", nb);
    for (int j = 0; j < nb; j++) {
        fmt_lp(lp, (double)logits[best[j]] - lse);
        put(&o, " %d:%s:", best[j], lp);
        put_token_bytes(&o, tok, best[j]);
    }
    return o.truncated ? -1 : (long)o.n;
}
