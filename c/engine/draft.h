/* Draft tokens for speculative decoding, and when to ask for them.
 *
 * Prompt lookup: the last few tokens of the history (prompt and output so far) are matched
 * against earlier text; the tokens that followed the most recent match are the draft. The main
 * model verifies a draft in one batched forward pass and keeps the longest prefix it would have
 * produced itself (serve_loop.c), so the output is exactly what decoding without drafts gives.
 *
 * The controller measures what drafting pays: milliseconds per emitted token with and without
 * drafts. Where a verified draft costs more per token than plain steps (few accepted tokens, or
 * streamed experts whose union a batch must read), it pauses drafting and probes again later,
 * each failed probe waiting twice as long. */
#ifndef COLI_DRAFT_H
#define COLI_DRAFT_H
#include <stdint.h>

enum { DRAFT_OFF = 0, DRAFT_LOOKUP = 1, DRAFT_MTP = 2 };
#define DRAFT_DEFAULT_MAX 8
#define DRAFT_LIMIT 64    /* --draft-max at most */
#define DRAFT_NGRAM_MAX 4 /* longest suffix matched; the longest match wins */
#define DRAFT_NGRAM_MIN 2 /* a single repeated token predicts too little to pay for a verify */

/* Up to max tokens that followed the latest earlier occurrence of the longest suffix of
 * hist[0..n) (between DRAFT_NGRAM_MAX and DRAFT_NGRAM_MIN tokens long); returns how many. */
int draft_lookup(const int32_t *hist, int n, int max, int32_t *out);

typedef struct {
    int len;               /* draft length to ask for next (adaptive, 1..max) */
    int max;               /* --draft-max */
    long pause;            /* plain steps left before drafting is tried again */
    long backoff;          /* the next pause after a probe that did not pay */
    double ms_plain;       /* moving averages: ms per emitted token without drafts, */
    double ms_draft;       /* and with (verify time / tokens it emitted); < 0: none yet */
    long tokens, accepted; /* drafted tokens and the ones verification kept */
    int fixed;             /* --draft-adapt off: always max tokens, never paused */
} DraftCtl;

void draft_ctl_init(DraftCtl *c, int max, int fixed);
/* The draft length to use now, at most room (tokens that still fit the request): 0 for a
 * plain step. */
int draft_ctl_want(DraftCtl *c, int room);
/* After a plain step of ms (one token). */
void draft_ctl_plain(DraftCtl *c, double ms);
/* After verifying k drafted tokens of which accepted were kept, in ms, emitting emitted tokens. */
void draft_ctl_verified(DraftCtl *c, int k, int accepted, int emitted, double ms);

#endif
