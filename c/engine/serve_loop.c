/* Continuous batching. Each iteration of the loop reads the frames that arrived, admits queued
 * requests (oldest first; one whose KV slot is taken by a running request waits, later ones may
 * pass it), runs ONE prefill chunk (--batch positions) of one request still prefilling (they
 * take turns),
 * then one decode step for every generating request in a single forward pass (forward_rows).
 * So a long prompt holds a running stream back by one chunk per token at most, a short
 * request's first token does not wait for a long prompt's whole prefill, and each row of the
 * step computes what it would alone: a request's tokens do not depend on its company. */
#include "util/clock.h"
#include "util/grow.h"
#include "engine/serve_loop.h"
#include "engine/turn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine_grammar.h"
#include "engine/draft.h"
#include "engine/engine_mtp.h"
#include "engine/engine_stream.h"
#include "engine/sampler.h"
#include "tokenizer/tokenizer.h"
#include "util/op_prof.h"


typedef struct {
    Frame f;
    char *payload;
} Pending;

/* One running request. */
typedef struct {
    int on;            /* 0: this entry is free */
    unsigned long seq; /* admission order: prefill and frame order follow it */
    Frame f;
    int32_t *ids;
    int n, reuse, done;       /* prompt tokens, reused from the slot, in the cache so far */
    int decoding;             /* prefill finished: logits hold the next token's distribution */
    unsigned long chunked_at; /* when its last prefill chunk ran (Loop.chunks), 0: none yet */
    KvCache *kv;
    Sampler smp;
    float *logits; /* [vocab] */
    char *piece;
    size_t piece_cap;
    TokStream ts;
    int produced, verdict, oom; /* verdict: 1 STOP, 2 CANCEL */
    int32_t tok;                /* the token this step feeds back */
    const char *finish;
    double t0, t_prefill, t_first;
    ExpertStats prefill_io; /* the expert reads up to the end of the prompt */
    TurnMark mark;
    ProfStats prof0; /* the decode profile when decoding began (--profile) */
    GrammarRun *gr;  /* constrained decoding (SUBMIT grammar=), or NULL */
    uint64_t masks_before;
    double t_grammar;
    int dead_end; /* the grammar allowed no token while incomplete */
    int pending;  /* tok was sampled (and sent) by a verified draft: feed it without sampling again */
    DraftCtl dc;
    float *vlog;          /* [draft_max + 1][vocab]: a verify pass's logits, or NULL when drafting is off */
    int32_t *vin;         /* [draft_max + 1]: the fed token and its draft */
    unsigned char *vsnap; /* the recurrent state before a verify pass (kv_ck_bytes), or NULL: every state cuts back */
} Stream;

typedef struct {
    Engine *e;
    FrameReader *in;
    Pending *q;
    int nq;
    size_t capq;
    Stream *st; /* [parallel] */
    int n_active;
    unsigned long seq;
    unsigned long chunks; /* prefill chunks run so far */
    int period;           /* a busy period is open: the store's turn counters run */
    KvCache **rows;       /* [parallel] decode-step scratch */
    int32_t *next;
    int *who;
    float *row_logits; /* [parallel][vocab] */
} Loop;

static Stream *find_active(Loop *L, const char *id) {
    for (int i = 0; i < L->e->parallel; i++)
        if (L->st[i].on && !strcmp(L->st[i].f.id, id)) return &L->st[i];
    return NULL;
}

static void queue_push(Loop *L, const Frame *f, char *payload) {
    Pending *q = grow_array(L->q, &L->capq, (size_t)L->nq + 1, sizeof *q, 8);
    if (!q) { /* refuse this one request; the running ones and the queue go on */
        emit_error(f->id, "out_of_memory", "no memory to queue the request");
        free(payload);
        return;
    }
    L->q = q;
    L->q[L->nq++] = (Pending){*f, payload};
}

static void admit_all(Loop *L);

/* Takes every complete frame the reader holds. A SUBMIT joins the queue and is admitted at once
 * when there is room, so a STOP right behind it finds it running; STOP/CANCEL reach the running
 * request they name, or mark a queued one, which then ends with ERROR cancelled when its turn
 * comes (the order of frames stays the order of requests). */
static void drain(Loop *L) {
    for (;;) {
        Frame f;
        char *payload, err[256];
        int rc = reader_next(L->in, &f, &payload, err, sizeof err);
        if (rc == 0) return;
        if (rc < 0) {
            emit_error(f.id, rc == -2 ? "out_of_memory" : "bad_request", err);
            continue;
        }
        if (f.kind == FR_SUBMIT) {
            queue_push(L, &f, payload);
            admit_all(L);
            continue;
        }
        free(payload);
        Stream *s = find_active(L, f.id);
        if (s) {
            s->verdict = f.kind == FR_STOP ? 1 : 2;
            continue;
        }
        for (int i = 0; i < L->nq; i++)
            if (!strcmp(L->q[i].f.id, f.id)) L->q[i].f.max_tokens = -2; /* cancelled before it started */
        /* otherwise it already ended: nothing to stop */
    }
}

static void period_begin(Loop *L) {
    if (L->period) return;
    engine_stream_turn_begin(L->e);
    L->period = 1;
}

/* The engine is idle again: the busy period's routing is learned once (.coli_usage). */
static void period_end(Loop *L) {
    if (!L->period || L->n_active) return;
    engine_stream_learn(L->e);
    L->period = 0;
}

static void stream_release(Loop *L, Stream *s) {
    engine_grammar_end(L->e, s->gr);
    sampler_free(&s->smp);
    engine_stream_mark_free(&s->mark);
    free(s->piece);
    free(s->logits);
    free(s->vlog);
    free(s->vin);
    free(s->vsnap);
    free(s->ids);
    memset(s, 0, sizeof *s);
    L->n_active--;
}

/* Ends a request: held-back bytes, then END (or ERROR), then the slot goes to disk. */
static void stream_finish(Loop *L, Stream *s) {
    Engine *e = L->e;
    const Frame *f = &s->f;
    size_t rest = e->tok ? tok_stream_flush(&s->ts, s->piece, s->piece_cap) : 0;
    if (rest) emit_data(f->id, -1, s->piece, rest);
    if (s->dead_end)
        emit_error(f->id, "bad_request",
                   "grammar: no token of the vocabulary can continue the output here while the "
                   "grammar is incomplete; check that the model's tokens can spell what the grammar asks for");
    else if (s->oom && s->gr && grammar_run_failed(s->gr))
        emit_error(f->id, "out_of_memory",
                   "grammar: the matcher ran out of memory or past its work limit (a highly "
                   "ambiguous grammar, e.g. nested repetitions of the same thing); simplify the grammar");
    else if (s->oom)
        emit_error(f->id, "out_of_memory", "ran out of memory in the forward pass; try a shorter prompt or a smaller --batch");
    else if (s->verdict == 2) emit_error(f->id, "cancelled", "cancelled by the client");
    else {
        const char *finish = s->verdict == 1 ? "stop" : s->finish;
        double total = now_ms() - s->t0, decode = total - s->t_first;
        if (!s->decoding) { /* stopped during prefill */
            s->t_prefill = total;
            s->prefill_io = engine_stream_since(e, &s->mark);
        }
        char stats[2048];
        engine_stream_end_since(e, &s->mark, total, stats, sizeof stats);
        if (s->gr) {
            GrammarStats gs;
            grammar_stats(s->gr, &gs);
            size_t k = strlen(stats);
            snprintf(stats + k, sizeof stats - k, " grammar_ms=%.2f grammar_masks=%llu", s->t_grammar,
                     (unsigned long long)(gs.masks_built - s->masks_before));
        }
        engine_stream_prefill_fields(&s->prefill_io, stats, sizeof stats);
        engine_persist_fields(e, stats, sizeof stats);
        if (e->draft_mode) {
            size_t k = strlen(stats);
            snprintf(stats + k, sizeof stats - k, " draft_tokens=%ld draft_accepted=%ld", s->dc.tokens, s->dc.accepted);
        }
        if (prof_enabled && s->decoding) {
            ProfStats now;
            prof_snapshot(&now);
            prof_fields(&s->prof0, &now, stats, sizeof stats);
        }
        if (f->routing) engine_stream_routing_since(e, &s->mark, f->id);
        emit_line("END %s prompt_tokens=%d completion_tokens=%d reused_tokens=%d ttft_ms=%.1f prefill_tok_s=%.1f "
                  "decode_tok_s=%.1f finish=%s%s",
                  f->id, s->n, s->produced, s->reuse, s->t_first, (s->done - s->reuse) / (s->t_prefill / 1e3 + 1e-9),
                  s->produced > 1 ? (s->produced - 1) / (decode / 1e3 + 1e-9) : 0.0, finish, stats);
    }
    kv_checkpoint(s->kv);
    engine_persist_slot(e, f->slot); /* after END: the client never waits for the disk */
    stream_release(L, s);
}

static int slot_busy(const Loop *L, int slot) {
    for (int i = 0; i < L->e->parallel; i++)
        if (L->st[i].on && L->st[i].f.slot == slot) return 1;
    return 0;
}

/* Whether requests in slot kv may draft: drafting is on and every layer's state can be cut back
 * to any position, or saved and replayed (a fixed recurrent state): no sliding-window ring. */
static int can_draft(const Engine *e, const KvCache *kv) {
    return (e->draft_mode == DRAFT_LOOKUP || e->draft_mode == DRAFT_MTP) && !kv->ring_total;
}

/* Starts queued request p in a free entry: validation, ACCEPT (before any prefill), sampler. A
 * request that ends here (refused, or logits=1, answered at once) leaves the entry free. */
static void admit(Loop *L, Pending *p) {
    Engine *e = L->e;
    const Arch *a = &e->model.a;
    Frame *f = &p->f;
    int32_t *ids;
    int n;
    if (f->max_tokens == -2) {
        emit_error(f->id, "cancelled", "cancelled before it started");
        return;
    }
    if (engine_prompt(e, f, p->payload, &ids, &n)) return;
    if (f->logits) {
        period_begin(L);
        engine_run_logits(e, f, ids, n);
        free(ids);
        return;
    }
    char err[512];
    GrammarRun *gr = NULL;
    if (f->grammar && !(gr = engine_grammar_begin(e, p->payload, f->grammar, err, sizeof err))) {
        emit_error(f->id, strstr(err, "out of memory") ? "out_of_memory" : "bad_request", err);
        free(ids);
        return;
    }
    KvCache *kv = &e->slots[f->slot];
    if (!kv->tokens && kv_init(kv, a, e->ctx)) {
        emit_error(f->id, "out_of_memory", "cannot allocate the KV cache");
        engine_grammar_end(e, gr);
        free(ids);
        return;
    }
    Stream *s = NULL;
    for (int i = 0; i < e->parallel && !s; i++)
        if (!L->st[i].on) s = &L->st[i];
    /* Reuse the common prefix (as far as every layer's state allows, see kv_reuse); at least
     * one prompt token is recomputed to get fresh logits. */
    int reuse = kv_reuse(kv, ids, n);
    MtpTrack *mt = engine_mtp_track(e, kv);
    if (mt) mtp_track_reuse(mt, reuse);
    if (reuse < e->low_water[f->slot]) e->low_water[f->slot] = reuse; /* the next record starts there */
    if (reuse < kv->last_common) /* the state cannot be cut back there: say why the prefix is recomputed */
        fprintf(stderr,
                "colibri: slot %d: reusing %d of %d common positions: a recurrent (or wrapped sliding-window) "
                "state cannot be cut back to any prefix; %s\n",
                f->slot, reuse, kv->last_common,
                reuse ? "resumed from the turn-boundary checkpoint there" : "no checkpoint within it, full recompute");
    emit_line("ACCEPT %s %d %d", f->id, n, reuse);
    SamplerParams sp = f->sp;
    if (!f->has_seed) sp.seed = sampler_entropy_seed();
    SamplerPenalties pen = f->pen;
    if (pen.last_n < 0 || pen.last_n > e->ctx) pen.last_n = e->ctx; /* -1: the context; more holds nothing more */
    memset(s, 0, sizeof *s);
    s->logits = malloc(sizeof(float) * (size_t)a->vocab);
    s->piece_cap = e->tok ? tok_stream_cap(e->tok) : 16;
    s->piece = malloc(s->piece_cap);
    if (!s->logits || !s->piece || sampler_init(&s->smp, &sp, a->vocab) || sampler_set_penalties(&s->smp, &pen)) {
        emit_error(f->id, "out_of_memory", "no memory for the sampler");
        engine_grammar_end(e, gr);
        sampler_free(&s->smp);
        free(s->logits);
        free(s->piece);
        free(ids);
        memset(s, 0, sizeof *s);
        return;
    }
    draft_ctl_init(&s->dc, can_draft(e, kv) ? e->draft_max : 0, e->draft_fixed);
    if (s->dc.max) { /* no memory for drafts only costs speed */
        s->vlog = malloc(sizeof(float) * (size_t)(s->dc.max + 1) * a->vocab);
        s->vin = malloc(sizeof(int32_t) * (size_t)(s->dc.max + 1));
        if (!kv->truncatable) s->vsnap = malloc(kv_ck_bytes(kv));
        if (!s->vlog || !s->vin || (!kv->truncatable && !s->vsnap)) draft_ctl_init(&s->dc, 0, 0);
    }
    for (int i = 0; i < n; i++) sampler_accept(&s->smp, ids[i]); /* the prompt is in the window, as in llama-server */
    period_begin(L);
    s->on = 1;
    s->seq = L->seq++;
    s->f = *f;
    s->ids = ids;
    s->n = n;
    s->reuse = s->done = reuse;
    s->kv = kv;
    s->finish = "length";
    s->gr = gr;
    if (gr) {
        GrammarStats gs;
        grammar_stats(gr, &gs);
        s->masks_before = gs.masks_built;
    }
    tok_stream_init(&s->ts);
    engine_stream_mark(e, &s->mark);
    s->t0 = now_ms();
    L->n_active++;
}

/* Admits queued requests in order while entries are free; one whose slot is busy waits. */
static void admit_all(Loop *L) {
    for (int i = 0; i < L->nq;) {
        Pending *p = &L->q[i];
        int ready = p->f.logits || p->f.slot >= L->e->n_slots || !slot_busy(L, p->f.slot);
        if (!ready || (L->n_active >= L->e->parallel && !p->f.logits)) {
            i++;
            continue;
        }
        Pending taken = *p;
        memmove(L->q + i, L->q + i + 1, sizeof(Pending) * (size_t)(L->nq - i - 1));
        L->nq--;
        admit(L, &taken);
        free(taken.payload);
    }
}

/* The prefilling request whose last chunk ran longest ago (never: the oldest first), so
 * prompts take turns and a short one is not held behind a long one's whole prefill. */
static Stream *next_prefill(Loop *L) {
    Stream *best = NULL;
    for (int i = 0; i < L->e->parallel; i++) {
        Stream *s = &L->st[i];
        if (!s->on || s->decoding) continue;
        if (!best || s->chunked_at < best->chunked_at || (s->chunked_at == best->chunked_at && s->seq < best->seq)) best = s;
    }
    return best;
}

/* PROGRESS inside a pass of m positions: the share of its layers done, in positions, strictly
 * below the pass's end (the frame after forward() reports that). */
typedef struct {
    Stream *s;
    int m, sent;
} PassProgress;

static void pass_progress(void *ctx, int layers_done, int layers) {
    PassProgress *p = ctx;
    const int done = p->s->done + (int)((long)p->m * layers_done / layers);
    if (layers_done >= layers || done <= p->sent) return;
    p->sent = done;
    emit_line("PROGRESS %s %d %d %d %.1f", p->s->f.id, done, p->s->n, p->s->reuse, now_ms() - p->s->t0);
}

/* Whether a request other than s is running (decoding or prefilling). */
static int others_on(const Loop *L, const Stream *s) {
    for (int i = 0; i < L->e->parallel; i++)
        if (L->st[i].on && &L->st[i] != s) return 1;
    return 0;
}

/* One prefill chunk of one request still prefilling. */
static void prefill_one(Loop *L) {
    Stream *s = next_prefill(L);
    if (!s) return;
    s->chunked_at = ++L->chunks;
    /* a whole pass while experts stream (one read per expert), but one batch while others run:
     * a pass would hold their tokens and prompts back for the whole of it */
    const int step = others_on(L, s) ? (forward_max_batch > 0 ? forward_max_batch : 1) : forward_pass_step();
    const int m = s->n - s->done < step ? s->n - s->done : step;
    const int last = s->done + m == s->n;
    PassProgress pp = {s, m, s->done};
    if (s->f.progress) forward_progress = (ForwardProgress){pass_progress, &pp};
    s->oom = forward(&L->e->model, s->kv, s->ids + s->done, m, last ? s->logits : NULL, 0) != 0;
    forward_progress = (ForwardProgress){NULL, NULL};
    if (s->oom) {
        stream_finish(L, s);
        return;
    }
    s->done += m;
    if (s->f.progress) /* prompt positions in the cache now (reused ones included), of the prompt's */
        emit_line("PROGRESS %s %d %d %d %.1f", s->f.id, s->done, s->n, s->reuse, now_ms() - s->t0);
    if (!last) {
        if (s->verdict) stream_finish(L, s); /* read between chunks: ends within one chunk */
        return;
    }
    kv_checkpoint(s->kv); /* a turn boundary: the next turn may resume here */
    s->t_prefill = now_ms() - s->t0;
    s->decoding = 1;
    s->prefill_io = engine_stream_since(L->e, &s->mark);
    if (prof_enabled) prof_snapshot(&s->prof0);
}

/* Samples s's next token and sends it; 1 when the token is to be fed back, 0 when the request
 * ends here (the caller finishes it). */
static int stream_sample(Loop *L, Stream *s) {
    Engine *e = L->e;
    const Frame *f = &s->f;
    if (s->verdict && s->produced) return 0; /* the first token follows prefill unchecked, as STOP is read after it */
    if (f->max_tokens >= 0 && s->produced >= f->max_tokens) return 0;
    if (s->kv->n >= e->ctx) return 0; /* prompt + output never exceed the context */
    int tok;
    if (s->gr && grammar_finished(s->gr)) {
        s->finish = "stop";
        return 0;
    } /* e.g. a grammar of the empty string */
    const ProfOp was = prof_enter(PROF_SAMPLER);
    const float *lg = sampler_penalize(&s->smp, s->logits); /* s->logits itself without penalties */
    if (s->gr) { /* budget: bytes the grammar may still need after this token, one per token left */
        int left = e->ctx - s->kv->n;
        if (f->max_tokens >= 0 && f->max_tokens - s->produced < left) left = f->max_tokens - s->produced;
        tok = engine_grammar_pick(e, s->gr, &s->smp, lg, left - 1, &s->t_grammar);
        double tg = now_ms();
        if (tok >= 0 && grammar_accept(s->gr, tok)) tok = -2;
        s->t_grammar += now_ms() - tg;
        if (tok < 0) prof_leave(was);
        if (tok == -1) {
            s->dead_end = 1;
            return 0;
        }
        if (tok < 0) {
            s->oom = 1;
            return 0;
        }
    } else tok = sampler_sample(&s->smp, lg);
    sampler_accept(&s->smp, tok);
    prof_leave(was);
    if (!s->produced) s->t_first = now_ms() - s->t0;
    if (!f->ignore_eos && engine_is_eos(&e->model.a, tok)) {
        s->finish = "stop";
        return 0;
    }
    /* a grammar lets an added token through only where it spells the grammar's text */
    size_t len = e->tok ? tok_stream_push(e->tok, &s->ts, tok, f->render_special || s->gr, s->piece, s->piece_cap) : 0;
    emit_data(f->id, tok, s->piece, len);
    if (f->logprobs && engine_emit_logprob(e, f->id, s->logits, tok, f->top_logprobs)) {
        s->oom = 1;
        return 0;
    }
    s->produced++;
    if (s->gr && grammar_finished(s->gr)) {
        s->finish = "stop";
        return 0;
    } /* nothing may follow */
    if (f->max_tokens >= 0 && s->produced >= f->max_tokens) return 0;
    s->tok = tok;
    return 1;
}

/* How many tokens to draft after s->tok (0: a plain step), and the draft itself in s->vin[1..]. */
static int draft_size(Loop *L, Stream *s) {
    if (!s->dc.max) return 0;
    KvCache *kv = s->kv;
    int room = L->e->ctx - kv->n - 1; /* the fed token and its draft must fit the context */
    if (s->f.max_tokens >= 0 && s->f.max_tokens - s->produced - 1 < room) room = s->f.max_tokens - s->produced - 1;
    if (forward_max_batch - 1 < room) room = forward_max_batch - 1; /* one pass, within the working memory planned */
    int k = draft_ctl_want(&s->dc, room);
    if (k <= 0) return 0;
    s->vin[0] = s->tok;
    if (L->e->draft_mode == DRAFT_MTP) {
        MtpTrack *t = engine_mtp_track(L->e, kv);
        return t ? mtp_draft(&L->e->model, t, kv, s->tok, k, s->vin + 1) : 0;
    }
    kv->tokens[kv->n] = s->tok; /* the history to match ends with the token fed now (room >= 1: it fits) */
    return draft_lookup(kv->tokens, kv->n + 1, k, s->vin + 1);
}

/* A recurrent state went through all the verify pass's positions: back to the state saved before
 * it, then the kept positions once more, in their one-token form as the pass ran them (the KV
 * rows they rewrite get the same values). 0, or -1 out of memory (forward restarted the slot). */
static int replay_kept(Engine *e, Stream *s, MtpTrack *mt, int n0) {
    KvCache *kv = s->kv;
    const int kept = kv->n - n0;
    kv_fixed_load(kv, s->vsnap);
    kv->n = n0;
    if (mt) mt->capture = 1; /* the head already took these positions from the verify pass */
    forward_stepwise = 1;
    const int failed = forward(&e->model, kv, s->vin, kept, NULL, 0);
    forward_stepwise = 0;
    if (mt) mt->capture = 0, mt->n_rows = 0;
    return failed;
}

/* Feeds s->tok and its k drafted tokens in one pass, then samples from each position's logits in
 * turn, exactly as plain steps would, while the sampled token is the drafted one: those positions
 * are kept, the rest are cut off (a recurrent state by replay_kept). The last sampled token is
 * fed by the next step. */
static void verify_draft(Loop *L, Stream *s, int k) {
    Engine *e = L->e;
    const int V = e->model.a.vocab;
    KvCache *kv = s->kv;
    const int n0 = kv->n;
    double t = now_ms();
    MtpTrack *mt = engine_mtp_track(e, kv);
    if (s->vsnap) kv_fixed_save(kv, s->vsnap);
    if (mt) mt->capture = 1, mt->n_rows = 0; /* the head runs the kept positions once they are known */
    forward_stepwise = 1;
    const int failed = forward(&e->model, kv, s->vin, k + 1, s->vlog, 1);
    forward_stepwise = 0;
    if (mt) mt->capture = 0;
    if (failed) {
        s->oom = 1;
        stream_finish(L, s);
        return;
    }
    double ms = now_ms() - t;
    int accepted = 0, emitted = 0, go_on = 1;
    for (int j = 0; j <= k; j++) {
        kv->n = n0 + j + 1; /* the positions row j has seen */
        memcpy(s->logits, s->vlog + (size_t)j * V, sizeof(float) * (size_t)V);
        if (!stream_sample(L, s)) {
            go_on = 0;
            break;
        }
        emitted++;
        if (j == k || s->tok != s->vin[j + 1]) break;
        accepted++;
    }
    if (kv->n < e->low_water[s->f.slot]) e->low_water[s->f.slot] = kv->n;
    if (mt) mtp_track_verified(&e->model, mt, n0, s->vin, accepted);
    if (s->vsnap && kv->n < n0 + k + 1) { /* the replay is part of the draft's cost */
        const double t1 = now_ms();
        if (replay_kept(e, s, mt, n0)) {
            s->oom = 1;
            stream_finish(L, s);
            return;
        }
        ms += now_ms() - t1;
    }
    draft_ctl_verified(&s->dc, k, accepted, emitted, ms);
    if (go_on) s->pending = 1;
    else stream_finish(L, s);
}

/* One token for every generating request, then one forward pass over all of them. */
static void decode_step_run(Loop *L);
static void decode_step(Loop *L) {
    prof_step_begin();
    decode_step_run(L);
    prof_step_end();
}

static void decode_step_run(Loop *L) {
    Engine *e = L->e;
    const int V = e->model.a.vocab;
    int R = 0;
    for (;;) { /* in admission order, so frames come out in a fixed order */
        Stream *s = NULL;
        for (int i = 0; i < e->parallel; i++) {
            Stream *c = &L->st[i];
            int taken = 0;
            for (int r = 0; r < R; r++) taken |= L->who[r] == i;
            if (c->on && c->decoding && !taken && (!s || c->seq < s->seq)) s = c;
        }
        if (!s) break;
        int i = (int)(s - L->st);
        if (s->pending || stream_sample(L, s)) L->who[R++] = i;
        else { stream_finish(L, s); }
        s->pending = 0;
    }
    if (!R) return;
    drain(L); /* a STOP or CANCEL that came with this token: it is not fed back */
    int kept = 0;
    for (int r = 0; r < R; r++) {
        Stream *s = &L->st[L->who[r]];
        if (s->verdict) {
            stream_finish(L, s);
            continue;
        }
        L->who[kept] = L->who[r];
        L->rows[kept] = s->kv;
        L->next[kept++] = s->tok;
    }
    R = kept;
    if (!R) return;
    int oom;
    prof_step_forward();
    if (R == 1) { /* a lone stream may draft: nobody else waits for its longer pass */
        Stream *s = &L->st[L->who[0]];
        int k = draft_size(L, s);
        if (k > 0) {
            verify_draft(L, s, k);
            return;
        }
        double t = now_ms();
        oom = forward(&e->model, L->rows[0], L->next, 1, s->logits, 0) != 0;
        draft_ctl_plain(&s->dc, now_ms() - t);
    } else {
        oom = forward_rows(&e->model, L->rows, L->next, R, L->row_logits) != 0;
        for (int r = 0; r < R && !oom; r++)
            memcpy(L->st[L->who[r]].logits, L->row_logits + (size_t)r * V, sizeof(float) * (size_t)V);
    }
    if (oom)
        for (int r = 0; r < R; r++) {
            Stream *s = &L->st[L->who[r]];
            s->oom = 1;
            stream_finish(L, s);
        }
}

int serve_loop(Engine *e, FrameReader *in) {
    const int P = e->parallel;
    Loop L = {.e = e, .in = in};
    L.st = calloc((size_t)P, sizeof(Stream));
    L.rows = calloc((size_t)P, sizeof(KvCache *));
    L.next = calloc((size_t)P, sizeof(int32_t));
    L.who = calloc((size_t)P, sizeof(int));
    L.row_logits = P > 1 ? malloc(sizeof(float) * (size_t)P * e->model.a.vocab) : NULL;
    int rc = 0;
    if (!L.st || !L.rows || !L.next || !L.who || (P > 1 && !L.row_logits)) {
        fprintf(stderr, "colibri: no memory for %d parallel requests; lower --parallel\n", P);
        rc = -1;
        goto out;
    }
    for (;;) {
        if (!L.n_active && !L.nq) {
            if (in->eof) break;
            reader_fill(in, -1); /* idle: wait for input */
        } else reader_fill(in, 0);
        drain(&L);
        admit_all(&L);
        if (L.n_active) {
            prefill_one(&L);
            drain(&L);
            decode_step(&L);
        }
        period_end(&L);
    }
out:
    for (int i = 0; i < P && L.st; i++)
        if (L.st[i].on) stream_release(&L, &L.st[i]);
    for (int i = 0; i < L.nq; i++) free(L.q[i].payload);
    free(L.q);
    free(L.st);
    free(L.rows);
    free(L.next);
    free(L.who);
    free(L.row_logits);
    return rc;
}
