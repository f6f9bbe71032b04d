/* MTP drafting: the head's slot kept in step with the main one (mtp_draft.h). */
#include "engine/mtp_draft.h"

#include <stdlib.h>
#include <string.h>

#include "model/mtp.h"
#include "util/fwd_alloc.h"

int mtp_track_init(MtpTrack *t, const Model *m, int ctx, int cap) {
    memset(t, 0, sizeof *t);
    t->pending_pos = -1;
    t->cap = cap;
    const size_t H = (size_t)m->a.hidden;
    t->pending = malloc(sizeof(float) * H);
    t->rows = malloc(sizeof(float) * H * (size_t)cap);
    t->h = malloc(sizeof(float) * H);
    t->logits = malloc(sizeof(float) * (size_t)m->a.vocab);
    if (!t->pending || !t->rows || !t->h || !t->logits || kv_init(&t->kv, &m->mtp->a, ctx)) {
        mtp_track_free(t);
        return -1;
    }
    return 0;
}

void mtp_track_free(MtpTrack *t) {
    kv_free(&t->kv);
    free(t->pending);
    free(t->rows);
    free(t->h);
    free(t->logits);
    memset(t, 0, sizeof *t);
    t->pending_pos = -1;
}

/* Brings the head's slot to `target` positions: position i runs with the main token after it,
 * hist[i + 1] (last_next for the last one), and with the pending state where it is position i,
 * a zero state otherwise. 0, or -1 out of memory (the slot keeps what completed). */
static int sync_to(const Model *m, MtpTrack *t, const int32_t *hist, int target, int32_t last_next) {
    KvCache *mk = &t->kv;
    if (mk->n > target) mk->n = target;
    if (t->pending_pos >= 0 && t->pending_pos < mk->n) t->pending_pos = -1; /* its position is already filled */
    int32_t next[64];
    while (mk->n < target) {
        const int i = mk->n, own = t->pending_pos == i;
        int n = own ? 1 : target - i;
        if (!own && t->pending_pos > i && t->pending_pos - i < n) n = t->pending_pos - i; /* stop at the pending one */
        if (n > 64) n = 64;
        for (int j = 0; j < n; j++) next[j] = i + j + 1 < target ? hist[i + j + 1] : last_next;
        if (mtp_run(m, mk, own ? t->pending : NULL, next, n, NULL, NULL, 0)) return -1;
        if (own) t->pending_pos = -1;
    }
    return 0;
}

static void lose_state(MtpTrack *t) { /* a head pass ran out of memory: the main pass goes on */
    t->pending_pos = -1;
    fwd_oom_clear();
}

void mtp_track_hidden(const Model *m, MtpTrack *t, const KvCache *kv, const float *x, int T, const int32_t *tokens) {
    const size_t H = (size_t)m->a.hidden;
    if (t->capture) {
        t->n_rows = T < t->cap ? T : t->cap;
        memcpy(t->rows, x, sizeof(float) * H * (size_t)t->n_rows);
        return;
    }
    const int p0 = kv->n;
    if (sync_to(m, t, kv->tokens, p0, tokens[0]) || (T > 1 && mtp_run(m, &t->kv, x, tokens + 1, T - 1, NULL, NULL, 0))) {
        lose_state(t);
        return;
    }
    memcpy(t->pending, x + (size_t)(T - 1) * H, sizeof(float) * H);
    t->pending_pos = p0 + T - 1;
}

void mtp_track_reuse(MtpTrack *t, int kept) {
    /* the entry of position i needs token i + 1: those of the last kept position are not known */
    const int valid = kept > 0 ? kept - 1 : 0;
    if (t->kv.n > valid) t->kv.n = valid;
    if (t->pending_pos >= kept) t->pending_pos = -1;
}

static int32_t argmax(const float *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

int mtp_draft(const Model *m, MtpTrack *t, const KvCache *kv, int32_t fed, int k, int32_t *out) {
    const int n = kv->n;
    if (n < 1 || k < 1) return 0;
    KvCache *mk = &t->kv;
    if (sync_to(m, t, kv->tokens, n - 1, kv->tokens[n - 1])) {
        lose_state(t);
        return 0;
    }
    const float *h = t->pending_pos == n - 1 ? t->pending : NULL;
    int32_t tok = fed;
    int got = 0;
    for (; got < k; got++) { /* mtp_run reads h before it writes t->h */
        if (mtp_run(m, mk, h, &tok, 1, t->h, t->logits, 0)) break;
        tok = argmax(t->logits, m->a.vocab);
        out[got] = tok;
        h = t->h;
    }
    if (fwd_oom()) lose_state(t);
    if (got) { /* position n - 1 ran with the main state and the fed token: it stays */
        mk->n = n;
        t->pending_pos = -1;
    }
    return got;
}

void mtp_track_verified(const Model *m, MtpTrack *t, int n0, const int32_t *vin, int accepted) {
    const size_t H = (size_t)m->a.hidden;
    if (accepted >= t->n_rows) return; /* the pass did not complete: later passes fill the gap */
    if (t->kv.n == n0 && accepted > 0 && mtp_run(m, &t->kv, t->rows, vin + 1, accepted, NULL, NULL, 0)) {
        lose_state(t);
        return;
    }
    memcpy(t->pending, t->rows + (size_t)accepted * H, sizeof(float) * H);
    t->pending_pos = n0 + accepted;
}
