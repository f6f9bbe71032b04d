/* Drafting with the checkpoint's MTP head (--draft mtp, model/mtp.h). Each KV slot has a tracker
 * that keeps the head's one-layer slot in step with the main slot: after every forward pass over
 * the slot (forward_hidden), the positions whose next token is known run through the head, and
 * the last one's state waits for the token sampled after it. A draft runs that pending position
 * with the fed token, then chains the head on its own output for the rest; the chained positions
 * are cut off again, and once verification has kept `accepted` drafts their positions run with
 * the main model's states from the verify pass. Positions whose main state is gone (a slot
 * restored from disk, a pass that ran out of memory) run with a zero state: weaker drafts, never
 * a different output, since the main model verifies every draft. */
#ifndef COLI_MTP_DRAFT_H
#define COLI_MTP_DRAFT_H
#include <stdint.h>

#include "model/model.h"

typedef struct {
    KvCache kv;        /* the head's slot: its entry at position i needs the main token i+1 */
    float *pending;    /* [hidden]: the main state of position pending_pos, its next token not fed yet */
    int pending_pos;   /* -1: none */
    float *rows;       /* [cap][hidden]: the states of a verify pass (capture) */
    int cap, n_rows;   /* rows held, and how many the last captured pass gave */
    int capture;       /* the next pass over the slot is a verify pass: keep its states */
    float *h, *logits; /* a chained draft's state [hidden] and logits [vocab] */
} MtpTrack;

/* 0, or -1 out of memory. cap: the most positions a verify pass feeds. */
int mtp_track_init(MtpTrack *t, const Model *m, int ctx, int cap);
void mtp_track_free(MtpTrack *t);
/* A forward pass over the main slot kv gave x[T][hidden] for positions kv->n.. (tokens[T]). */
void mtp_track_hidden(const Model *m, MtpTrack *t, const KvCache *kv, const float *x, int T, const int32_t *tokens);
/* The main slot was cut back to its first kept positions (kv_reuse). */
void mtp_track_reuse(MtpTrack *t, int kept);
/* Up to k greedy drafts after the token fed now (fed, at position kv->n) into out; how many. */
int mtp_draft(const Model *m, MtpTrack *t, const KvCache *kv, int32_t fed, int k, int32_t *out);
/* After a verify pass of vin[0..] at positions n0.. (captured) kept `accepted` drafts. */
void mtp_track_verified(const Model *m, MtpTrack *t, int n0, const int32_t *vin, int accepted);

#endif
