/* The per-request pieces of a turn that the protocol loop (serve_loop.c) calls: prompt
 * validation and tokenizing, teacher-forced logits, logprob lines, end of sequence, and handing
 * a slot to the KV writer. */
#include "engine/turn.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine_grammar.h"
#include "engine/logprob.h"
#include "engine/protocol.h"
#include "kernels/kv_kernels.h"
#include "kv/kv_persist.h"
#include "kv/kv_writer.h"
#include "tokenizer/tokenizer.h"
#include "engine/engine_stream.h"
#include "util/clock.h"

/* Hands the slot's turn to the writer: only the positions since the last record (or since the
 * lowest point the slot was cut back to), copied, so the loop never waits for the disk while the
 * writer keeps within its bound (kv_writer.h); the whole slot when the writer says the files need it. */
void engine_persist_slot(Engine *e, int slot) {
    if (!e->kv_writer) return;
    KvCache *kv = &e->slots[slot];
    int n0 = e->low_water[slot] < e->disk_n[slot] ? e->low_water[slot] : e->disk_n[slot];
    if (n0 > kv->n) n0 = 0;
    size_t len = kv_record_size(kv, n0);
    if (n0 && kv_writer_next_full(e->kv_writer, slot, len)) len = kv_record_size(kv, n0 = 0);
    KvRecord r;
    if (len) kv_writer_admit(e->kv_writer, slot, n0 == 0, len);
    if (!len || kv_record_build(kv, n0, &r)) {
        if (len) kv_writer_release(e->kv_writer, len);
        fprintf(stderr, "colibri: no memory to save KV slot %d\n", slot);
        return;
    }
    kv_writer_submit(e->kv_writer, slot, r, kv_save_size(kv)); /* used when the record is whole */
    e->disk_n[slot] = e->low_water[slot] = kv->n;
}

void engine_persist_fields(Engine *e, char *buf, size_t n) {
    if (!e->kv_writer || !n) return;
    size_t peak;
    unsigned long waits;
    kv_writer_stats(e->kv_writer, &peak, &waits);
    size_t k = strlen(buf);
    snprintf(buf + k, n - k, " kv_queue_peak_bytes=%zu kv_writer_waits=%lu", peak, waits);
}

int parse_ids(const char *s, int vocab, int32_t **ids, int *n, char *err, size_t errlen) {
    size_t cap = 1, cnt = 0;
    for (const char *c = s; *c; c++) cap += *c == ',' || *c == '\n'; /* one allocation: no growth can fail half-way */
    int32_t *out = malloc(cap * sizeof(int32_t));
    const char *p = s;
    while (out && *p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v >= vocab) {
            snprintf(err, errlen, "token id list: '%.20s' is not an id in [0, %d)", p, vocab);
            free(out);
            return -1;
        }
        if (cnt == cap) {
            snprintf(err, errlen, "token id list: more ids than separators (internal error)");
            free(out);
            return -1;
        }
        out[cnt++] = (int32_t)v;
        p = end;
        if (*p == ',') p++;
        else if (*p && *p != '\n') {
            snprintf(err, errlen, "token id list: expected ',' at '%.20s'", p);
            free(out);
            return -1;
        } else if (*p) p++;
    }
    if (!out) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    *ids = out;
    *n = (int)cnt;
    return 0;
}

/* A teacher-forced pass runs in a cache of its own: it must not disturb any slot's conversation. */
void engine_run_logits(Engine *e, const Frame *f, const int32_t *ids, int n) {
    const int V = e->model.a.vocab;
    float *logits = malloc(sizeof(float) * (size_t)n * V);
    KvCache own;
    if (!logits || kv_init(&own, &e->model.a, n)) {
        free(logits);
        emit_error(f->id, "out_of_memory", "cannot hold the requested logits");
        return;
    }
    KvCache *kv = &own;
    emit_line("ACCEPT %s %d 0", f->id, n);
    TurnMark mark;
    engine_stream_mark(e, &mark);
    double t0 = now_ms();
    if (forward(&e->model, kv, ids, n, logits, 1)) {
        emit_error(f->id, "out_of_memory", "ran out of memory in the forward pass; try fewer positions");
        engine_stream_mark_free(&mark);
        kv_free(&own);
        free(logits);
        return;
    }
    char head[128];
    snprintf(head, sizeof head, "LOGITS %s %d %d %zu\n", f->id, n, V, sizeof(float) * (size_t)n * V);
    emit_blob(head, logits, sizeof(float) * (size_t)n * V);
    double ms = now_ms() - t0;
    char stats[600];
    engine_stream_end_since(e, &mark, ms, stats, sizeof stats);
    ExpertStats whole = engine_stream_since(e, &mark); /* the turn is all prompt */
    engine_stream_prefill_fields(&whole, stats, sizeof stats);
    if (f->routing) engine_stream_routing_since(e, &mark, f->id);
    emit_line("END %s prompt_tokens=%d completion_tokens=0 reused_tokens=0 ttft_ms=%.1f prefill_tok_s=%.1f "
              "decode_tok_s=0.0 finish=logits%s",
              f->id, n, ms, n / (ms / 1e3 + 1e-9), stats);
    engine_stream_mark_free(&mark);
    kv_free(&own);
    free(logits);
}

/* 0, or -1 when no memory was left for the line. */
int engine_emit_logprob(const Engine *e, const char *id, const float *logits, int tok, int k) {
    size_t cap = logprob_line_cap(strlen(id), k, e->tok ? tok_max_token_bytes(e->tok) : 0);
    char *line = malloc(cap);
    if (!line) return -1;
    if (logprob_format(line, cap, id, logits, e->model.a.vocab, tok, k, e->tok) >= 0) emit_line("%s", line);
    else emit_line("LOGPROB %s %d nan - 0", id, tok); /* cannot happen: cap is the worst case */
    free(line);
    return 0;
}

int engine_is_eos(const Arch *a, int tok) {
    for (int i = 0; i < a->n_eos; i++)
        if (a->eos[i] == tok) return 1;
    return 0;
}

int engine_prompt(Engine *e, const Frame *f, const char *payload, int32_t **out, int *out_n) {
    const Arch *a = &e->model.a;
    char err[512];
    int32_t *ids = NULL;
    int n = 0;
    if (f->slot >= e->n_slots) {
        snprintf(err, sizeof err, "slot %d out of range: the engine has %d KV slots", f->slot, e->n_slots);
        emit_error(f->id, "bad_request", err);
        return -1;
    }
    const char *body = payload + f->grammar; /* the grammar leads the payload (docs/protocol.md) */
    size_t body_len = f->payload_len - f->grammar;
    if (f->ids) {
        if (parse_ids(body, a->vocab, &ids, &n, err, sizeof err)) {
            emit_error(f->id, "bad_request", err);
            return -1;
        }
    } else {
        if (!e->tok) {
            emit_error(f->id, "bad_request", "this model has no tokenizer.json; send token ids (ids=1)");
            return -1;
        }
        size_t nn = 0, *lit = NULL, nlit = 0;
        int bad = f->literal && tok_literal_parse(body, f->literal, &lit, &nlit, err, sizeof err);
        if (!bad)
            bad = tok_encode_literal(e->tok, body + f->literal, body_len - f->literal, f->parse_special, f->add_special, lit,
                                     nlit, &ids, &nn, err, sizeof err);
        free(lit);
        if (bad) {
            emit_error(f->id, "bad_request", err);
            return -1;
        }
        n = (int)nn;
        /* tokenizer.json comes with the model folder and is not trusted to match the embedding:
         * an id past its rows would read outside the table. */
        for (int i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= a->vocab) {
                snprintf(err, sizeof err,
                         "tokenizer.json gave token id %d, outside the model's vocabulary of %d; "
                         "the model folder's tokenizer does not belong to its weights",
                         ids[i], a->vocab);
                emit_error(f->id, "bad_request", err);
                free(ids);
                return -1;
            }
    }
    if (n == 0) {
        emit_error(f->id, "bad_request", "empty prompt");
        free(ids);
        return -1;
    }
    if (n >= e->ctx) {
        snprintf(err, sizeof err, "prompt has %d tokens; the context holds %d (one must stay free for output)", n, e->ctx);
        emit_error(f->id, "context_exceeded", err);
        free(ids);
        return -1;
    }
    if (f->fit && !f->logits && f->max_tokens > 0 && (long long)n + f->max_tokens > e->ctx) {
        snprintf(err, sizeof err,
                 "this model's maximum context length is %d tokens, but the request needs %lld "
                 "(%d in the prompt, max_tokens %d): lower max_tokens to %d or less, or shorten the prompt",
                 e->ctx, (long long)n + f->max_tokens, n, f->max_tokens, e->ctx - n);
        emit_error(f->id, "context_exceeded", err);
        free(ids);
        return -1;
    }
    *out = ids;
    *out_n = n;
    return 0;
}
