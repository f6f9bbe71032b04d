/* --draft mtp in the engine (engine_mtp.h). */
#include "engine/engine_mtp.h"

#include <stdio.h>

#include "engine/draft.h"
#include "model/layers.h"
#include "model/mtp.h"

MtpTrack *engine_mtp_track(Engine *e, const KvCache *kv) {
    if (!e->model.mtp || kv < e->slots || kv >= e->slots + e->n_slots) return NULL;
    MtpTrack *t = &e->mtp[kv - e->slots];
    if (!t->kv.tokens && mtp_track_init(t, &e->model, e->ctx, e->draft_max + 1)) return NULL;
    return t;
}

/* forward_hidden: the main model's states of a pass over a slot go to its tracker. */
static void slot_states(void *ctx, KvCache *kv, const float *x, int T, const int32_t *tokens) {
    Engine *e = ctx;
    MtpTrack *t = engine_mtp_track(e, kv);
    if (t) mtp_track_hidden(&e->model, t, kv, x, T, tokens);
}

int engine_mtp_open(Engine *e, char *err, size_t errlen) {
    if (mtp_load(&e->model, err, errlen)) return -1;
    const StateDesc *s = &e->model.mtp->state;
    if (!s->truncatable || (s->window > 0 && s->window < e->ctx)) {
        snprintf(err, errlen, "--draft mtp: the MTP layer's state cannot be cut back to any position; use --draft lookup");
        return -1;
    }
    forward_hidden = (ForwardHidden){slot_states, e};
    return 0;
}

void engine_mtp_close(Engine *e) {
    for (int i = 0; i < MAX_KV_SLOTS; i++) mtp_track_free(&e->mtp[i]);
    if (forward_hidden.ctx == e) forward_hidden = (ForwardHidden){NULL, NULL};
}
