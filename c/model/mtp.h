/* The multi-token-prediction head a DeepSeek-V3 or GLM checkpoint ships (DeepSeek-V3 report,
 * section 2.2). From the main model's last hidden state h_i at position i (before the final norm)
 * and the embedding of the token after it, t_{i+1}, it predicts t_{i+2}:
 *   x = eh_proj([enorm(embed(t_{i+1})); hnorm(h_i)]),   x = layer(x) at position i,
 *   logits = head(head_norm(x)).
 * The layer keeps its own one-layer KV slot, one position behind the main model's (the entry of
 * position i needs t_{i+1}). A chained draft feeds the head's own x back as the next h. */
#ifndef COLI_MTP_H
#define COLI_MTP_H
#include "model/model.h"

struct MtpHead {
    int layer;       /* the layer's index in the checkpoint (messages) */
    Arch a;          /* the model's facts, with one layer: this one's state */
    StateDesc state; /* for a.kv_type */
    Layer y;
    Block enorm, hnorm, head_norm;
    QMat eh_proj; /* [hidden][2 hidden] */
    QMat embed, head;
};

/* Loads the manifest's first "mtp" entry into m->mtp (for the KV type m->a holds now). 0, or -1
 * with err: no runnable MTP layer, or a tensor the entry names is missing or misshapen. */
int mtp_load(Model *m, char *err, size_t errlen);
void mtp_free(Model *m);

/* Runs the head over T positions at mkv->n.. and appends them: h[T][hidden] the main model's
 * states (NULL: zeros, for positions whose state is gone), next[T] the tokens after them. out:
 * NULL or [T][hidden], the head's states (a chained draft's next h); logits: NULL, [T][vocab]
 * (all_logits) or [vocab] for the last row. 0, or -1 when memory ran out (mkv unchanged). */
int mtp_run(const Model *m, KvCache *mkv, const float *h, const int32_t *next, int T, float *out, float *logits, int all_logits);

#endif
