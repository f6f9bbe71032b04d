#include "engine/draft.h"

#include <string.h>

int draft_lookup(const int32_t *hist, int n, int max, int32_t *out) {
    if (max <= 0) return 0;
    for (int g = DRAFT_NGRAM_MAX; g >= DRAFT_NGRAM_MIN; g--) {
        if (n < g + 1) continue;
        const int32_t *suffix = hist + n - g;
        /* latest first: recent text predicts the next tokens best */
        for (int start = n - g - 1; start >= 0; start--) {
            if (hist[start] != suffix[0] || memcmp(hist + start, suffix, sizeof(int32_t) * (size_t)g)) continue;
            int from = start + g, k = n - from < max ? n - from : max;
            memcpy(out, hist + from, sizeof(int32_t) * (size_t)k);
            return k;
        }
    }
    return 0;
}

#define PAUSE_FIRST 8
#define PAUSE_MAX 512
#define EMA 0.25 /* weight of the newest measurement */

void draft_ctl_init(DraftCtl *c, int max, int fixed) {
    memset(c, 0, sizeof *c);
    c->max = max;
    c->fixed = fixed;
    c->len = max < 2 ? max : 2; /* short first: a rejected probe costs little */
    c->backoff = PAUSE_FIRST;
    c->ms_plain = c->ms_draft = -1;
}

static void ema(double *avg, double v) { *avg = *avg < 0 ? v : *avg + EMA * (v - *avg); }

int draft_ctl_want(DraftCtl *c, int room) {
    if (c->max <= 0 || room <= 0) return 0;
    if (c->fixed) return c->max < room ? c->max : room;
    if (c->pause > 0) {
        c->pause--;
        return 0;
    }
    if (c->ms_plain < 0) return 0; /* measure a plain step first: the yardstick */
    return c->len < room ? c->len : room;
}

void draft_ctl_plain(DraftCtl *c, double ms) { ema(&c->ms_plain, ms); }

void draft_ctl_verified(DraftCtl *c, int k, int accepted, int emitted, double ms) {
    c->tokens += k;
    c->accepted += accepted;
    /* all kept: ask for more next time; otherwise one past what was kept */
    c->len = accepted == k ? (k + 2 < c->max ? k + 2 : c->max) : (accepted + 1 < c->max ? accepted + 1 : c->max);
    if (c->len < 1) c->len = 1;
    ema(&c->ms_draft, ms / (emitted > 0 ? emitted : 1));
    if (c->ms_plain > 0 && c->ms_draft > c->ms_plain) { /* it costs more than it saves: rest, then probe */
        c->pause = c->backoff;
        c->backoff = c->backoff * 2 < PAUSE_MAX ? c->backoff * 2 : PAUSE_MAX;
        c->ms_draft = -1; /* the next probe is judged on its own */
    } else if (c->ms_plain > 0) c->backoff = PAUSE_FIRST;
}
