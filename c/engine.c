#include "engine.h"

#include <errno.h>
#include <sched.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "container.h"
#include "engine_stream.h"
#include "kv_kernels.h"
#include "kv_dir.h"
#include "kv_persist.h"
#include "logprob.h"
#include "protocol.h"
#include "sampler.h"
#include "tokenizer.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Physical cores among the CPUs this process may run on: SMT siblings share one core's
 * SIMD units, so more threads than cores only adds contention. 0 when unknown. */
static int physical_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set)) return 0;
    long seen[1024];
    int n = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE && n < 1024; cpu++) {
        if (!CPU_ISSET(cpu, &set)) continue;
        char path[128];
        long core = -1, pkg = 0;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/core_id", cpu);
        FILE *f = fopen(path, "r");
        if (!f) return 0;
        if (fscanf(f, "%ld", &core) != 1) core = -1;
        fclose(f);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", cpu);
        if ((f = fopen(path, "r"))) { if (fscanf(f, "%ld", &pkg) != 1) pkg = 0; fclose(f); }
        if (core < 0) return 0;
        long key = pkg * 100000 + core;
        int dup = 0;
        for (int i = 0; i < n; i++) dup |= seen[i] == key;
        if (!dup) seen[n++] = key;
    }
    return n;
}

static int opt_int(const char *flag, const char *v, int lo, int hi, int *out, char *err, size_t errlen) {
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || errno || end == v || *end || x < lo || x > hi) {
        snprintf(err, errlen, "%s needs an integer between %d and %d", flag, lo, hi);
        return -1;
    }
    *out = (int)x;
    return 0;
}

int engine_parse_options(int argc, char **argv, int i, EngineOptions *o, char *err, size_t errlen) {
    for (; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(a, "--model")) { if (!v) { snprintf(err, errlen, "--model needs a directory"); return -1; } o->model_dir = v; i++; }
        else if (!strcmp(a, "--ctx")) { rc = opt_int(a, v, 1, 1 << 24, &o->ctx, err, errlen); i++; }
        else if (!strcmp(a, "--kv-slots")) { rc = opt_int(a, v, 1, MAX_KV_SLOTS, &o->kv_slots, err, errlen); i++; }
        else if (!strcmp(a, "--threads")) { rc = opt_int(a, v, 1, 1024, &o->threads, err, errlen); i++; }
        else if (!strcmp(a, "--batch")) { rc = opt_int(a, v, 1, 1 << 16, &o->batch, err, errlen); i++; }
        else if (!strcmp(a, "--portable")) o->portable = 1;
        else if (!strcmp(a, "--kernels")) {
            KernIsa isa;
            if (!v || kernels_isa_from_name(v, &isa)) { snprintf(err, errlen, "--kernels needs portable, avx2, avx512, amx or neon"); return -1; }
            o->kernels = (int)isa + 1;
            i++;
        }
        else if (!strcmp(a, "--kv")) {
            if (!v || kv_type_from_name(v, &o->kv_type)) { snprintf(err, errlen, "--kv needs f16, bf16 or f32"); return -1; }
            o->kv_set = 1;
            i++;
        }
        else if (!strcmp(a, "--ram")) {
            char *end;
            double g = v ? strtod(v, &end) : 0;
            if (!v || end == v || *end || !(g > 0 && g < 1e6)) { snprintf(err, errlen, "--ram needs a positive number of GB (e.g. 0.5)"); return -1; }
            o->ram_gb = g;
            i++;
        }
        else if (!strcmp(a, "--cap")) { rc = opt_int(a, v, 1, 1 << 20, &o->cap, err, errlen); i++; }
        else if (!strcmp(a, "--io-threads")) { rc = opt_int(a, v, 1, 64, &o->io_threads, err, errlen); i++; }
        else if (!strcmp(a, "--no-direct")) o->no_direct = 1;
        else if (!strcmp(a, "--readahead") || !strcmp(a, "--pin")) {
            const char *on = a[2] == 'r' ? "on" : "auto";
            if (!v || (strcmp(v, on) && strcmp(v, "off"))) { snprintf(err, errlen, "%s needs %s or off", a, on); return -1; }
            if (a[2] == 'r') o->readahead = !strcmp(v, "on") ? 1 : 2;
            else o->pin_off = !strcmp(v, "off");
            i++;
        }
        else if (!strcmp(a, "--kv-dir")) { if (!v) { snprintf(err, errlen, "--kv-dir needs a directory"); return -1; } o->kv_dir = v; i++; }
        else return i;
        if (rc) return -1;
    }
    return i;
}

static void restore_slots(Engine *e, const char *dir);

int engine_open(Engine *e, const EngineOptions *o, char *err, size_t errlen) {
    memset(e, 0, sizeof(*e));
    e->kv_lock_fd = -1;
    if (!o->model_dir) { snprintf(err, errlen, "no model directory given (--model DIR)"); return -1; }
    /* Before the (long) model load: a second engine on the directory is refused at once. */
    if (o->kv_dir && (e->kv_lock_fd = kv_dir_lock(o->kv_dir, err, errlen)) < 0) return -1;
    kernels_init(o->portable);
    if (o->kernels && kernels_use((KernIsa)(o->kernels - 1))) {
        snprintf(err, errlen, "--kernels %s: this CPU (or build) cannot run them; `colibri version` lists the ones it can",
                 kernels_isa_name((KernIsa)(o->kernels - 1)));
        engine_close(e);
        return -1;
    }
    if (o->threads) omp_set_num_threads(o->threads);
    else if (!getenv("OMP_NUM_THREADS") && physical_cores() > 0) omp_set_num_threads(physical_cores());
    if (o->batch) forward_max_batch = o->batch;
    if (model_load(&e->model, o->model_dir, err, errlen)) { engine_close(e); return -1; }
    if (o->kv_set && model_set_kv_type(&e->model, o->kv_type, err, errlen)) { engine_close(e); return -1; }
    const Arch *a = &e->model.a;
    e->ctx = o->ctx ? o->ctx : (a->max_pos < 4096 ? a->max_pos : 4096);
    if (e->ctx > a->max_pos) {
        snprintf(err, errlen, "--ctx %d exceeds the model's max_position_embeddings %d", e->ctx, a->max_pos);
        engine_close(e);
        return -1;
    }
    e->n_slots = o->kv_slots ? o->kv_slots : 1;
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/tokenizer.json", o->model_dir);
    if (!o->skip_tokenizer && stat(path, &st) == 0) {
        e->tok = tok_load(path, err, errlen);
        if (!e->tok) { engine_close(e); return -1; }
    }
    if (engine_stream_open(e, o, omp_get_max_threads(), err, errlen)) { engine_close(e); return -1; }
    if (o->kv_dir) restore_slots(e, o->kv_dir);
    return 0;
}

static void slot_path(const Engine *e, int slot, char *out, size_t n) {
    if (slot == 0) snprintf(out, n, "%s/.coli_kv", e->kv_dir);
    else snprintf(out, n, "%s/.coli_kv.%d", e->kv_dir, slot);
}

/* Warm start: every slot saved by an earlier run of this model comes back; a file that cannot
 * be trusted is refused (the reason goes to stderr) and only its slot starts cold. */
static void restore_slots(Engine *e, const char *dir) {
    e->kv_dir = dir;
    e->fingerprint = kv_fingerprint(e->model.ct->dir);
    kv_dir_clean(dir); /* we hold the lock: any temporary is a dead save's */
    for (int i = 0; i < e->n_slots; i++) {
        char path[4200], err[512];
        slot_path(e, i, path, sizeof path);
        if (access(path, R_OK) != 0) continue;
        if (kv_init(&e->slots[i], &e->model.a, e->ctx)) { fprintf(stderr, "colibri: no memory to restore %s\n", path); continue; }
        if (kv_restore(&e->slots[i], &e->model.a, e->fingerprint, path, err, sizeof err) < 0) fprintf(stderr, "colibri: %s\n", err);
        else fprintf(stderr, "colibri: restored KV slot %d (%d positions) from %s\n", i, e->slots[i].n, path);
    }
}

static void persist_slot(Engine *e, int slot) {
    if (!e->kv_dir) return;
    char path[4200], err[512];
    slot_path(e, slot, path, sizeof path);
    if (kv_save(&e->slots[slot], &e->model.a, e->fingerprint, path, err, sizeof err)) fprintf(stderr, "colibri: %s\n", err);
}

void engine_close(Engine *e) {
    engine_stream_close(e); /* stops the I/O threads before the model goes */
    for (int i = 0; i < MAX_KV_SLOTS; i++) if (e->slots[i].tokens) kv_free(&e->slots[i]);
    if (e->tok) tok_free(e->tok);
    e->tok = NULL;
    model_free(&e->model);
    if (e->kv_lock_fd >= 0) close(e->kv_lock_fd); /* releases the KV directory */
    e->kv_lock_fd = -1;
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
        if (cnt == cap) { snprintf(err, errlen, "token id list: more ids than separators (internal error)"); free(out); return -1; }
        out[cnt++] = (int32_t)v;
        p = end;
        if (*p == ',') p++;
        else if (*p && *p != '\n') { snprintf(err, errlen, "token id list: expected ',' at '%.20s'", p); free(out); return -1; }
        else if (*p) p++;
    }
    if (!out) { snprintf(err, errlen, "out of memory"); return -1; }
    *ids = out;
    *n = (int)cnt;
    return 0;
}

/* Pending control frames that arrive while a generation runs. */
typedef struct {
    FrameReader *in;
    Frame *queue;
    char **payloads;
    int n, cap;
} Inbox;

static void inbox_push(Inbox *b, const Frame *f, char *payload) {
    if (b->n == b->cap) {
        int cap = b->cap ? b->cap * 2 : 8;
        Frame *q = realloc(b->queue, sizeof(Frame) * (size_t)cap);
        if (q) b->queue = q;
        char **p = q ? realloc(b->payloads, sizeof(char *) * (size_t)cap) : NULL;
        if (p) b->payloads = p;
        if (!q || !p) { /* refuse this one request; the running one and the queue go on */
            emit_error(f->id, "out_of_memory", "no memory to queue the request");
            free(payload);
            return;
        }
        b->cap = cap;
    }
    b->queue[b->n] = *f;
    b->payloads[b->n++] = payload;
}

/* Drains available input; returns 1 if STOP, 2 if CANCEL arrived for id. */
static int poll_control(Inbox *b, const char *id) {
    int verdict = 0;
    reader_fill(b->in, 0);
    for (;;) {
        Frame f;
        char *payload, err[256];
        int rc = reader_next(b->in, &f, &payload, err, sizeof err);
        if (rc == 0) break;
        if (rc < 0) { emit_error(f.id, rc == -2 ? "out_of_memory" : "bad_request", err); continue; }
        if (f.kind == FR_SUBMIT) { inbox_push(b, &f, payload); continue; }
        free(payload);
        if (strcmp(f.id, id) == 0) verdict = f.kind == FR_STOP ? 1 : 2;
        /* STOP/CANCEL for an id not running: it already ended or is queued; handled when dequeued */
        else for (int i = 0; i < b->n; i++)
            if (strcmp(b->queue[i].id, f.id) == 0) b->queue[i].max_tokens = -2; /* mark cancelled */
    }
    return verdict;
}

/* A teacher-forced pass runs in a cache of its own: it must not disturb any slot's conversation. */
static void run_logits(Engine *e, const Frame *f, const int32_t *ids, int n) {
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
    engine_stream_turn_begin(e);
    double t0 = now_ms();
    if (forward(&e->model, kv, ids, n, logits, 1)) {
        emit_error(f->id, "out_of_memory", "ran out of memory in the forward pass; try fewer positions");
        kv_free(&own);
        free(logits);
        return;
    }
    char head[128];
    snprintf(head, sizeof head, "LOGITS %s %d %d %zu\n", f->id, n, V, sizeof(float) * (size_t)n * V);
    emit_blob(head, logits, sizeof(float) * (size_t)n * V);
    double ms = now_ms() - t0;
    char stats[600];
    engine_stream_end_fields(e, ms, stats, sizeof stats);
    if (f->routing) engine_stream_routing(e, f->id);
    emit_line("END %s prompt_tokens=%d completion_tokens=0 reused_tokens=0 ttft_ms=%.1f prefill_tok_s=%.1f "
              "decode_tok_s=0.0 finish=logits%s", f->id, n, ms, n / (ms / 1e3 + 1e-9), stats);
    engine_stream_learn(e);
    kv_free(&own);
    free(logits);
}

/* 0, or -1 when no memory was left for the line. */
static int emit_logprob(const Engine *e, const char *id, const float *logits, int tok, int k) {
    size_t cap = logprob_line_cap(strlen(id), k, e->tok ? tok_max_token_bytes(e->tok) : 0);
    char *line = malloc(cap);
    if (!line) return -1;
    if (logprob_format(line, cap, id, logits, e->model.a.vocab, tok, k, e->tok) >= 0) emit_line("%s", line);
    else emit_line("LOGPROB %s %d nan - 0", id, tok); /* cannot happen: cap is the worst case */
    free(line);
    return 0;
}

static int is_eos(const Arch *a, int tok) {
    for (int i = 0; i < a->n_eos; i++)
        if (a->eos[i] == tok) return 1;
    return 0;
}

static void run_request(Engine *e, Inbox *box, Frame *f, char *payload) {
    const Arch *a = &e->model.a;
    char err[512];
    int32_t *ids = NULL;
    int n = 0;
    if (f->max_tokens == -2) { emit_error(f->id, "cancelled", "cancelled before it started"); return; }
    if (f->slot >= e->n_slots) {
        snprintf(err, sizeof err, "slot %d out of range: the engine has %d KV slots", f->slot, e->n_slots);
        emit_error(f->id, "bad_request", err);
        return;
    }
    if (f->ids) {
        if (parse_ids(payload, a->vocab, &ids, &n, err, sizeof err)) { emit_error(f->id, "bad_request", err); return; }
    } else {
        if (!e->tok) { emit_error(f->id, "bad_request", "this model has no tokenizer.json; send token ids (ids=1)"); return; }
        size_t nn = 0, *lit = NULL, nlit = 0;
        int bad = f->literal && tok_literal_parse(payload, f->literal, &lit, &nlit, err, sizeof err);
        if (!bad)
            bad = tok_encode_literal(e->tok, payload + f->literal, f->payload_len - f->literal, f->parse_special,
                                     f->add_special, lit, nlit, &ids, &nn, err, sizeof err);
        free(lit);
        if (bad) { emit_error(f->id, "bad_request", err); return; }
        n = (int)nn;
        /* tokenizer.json comes with the model folder and is not trusted to match the embedding:
         * an id past its rows would read outside the table. */
        for (int i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= a->vocab) {
                snprintf(err, sizeof err, "tokenizer.json gave token id %d, outside the model's vocabulary of %d; "
                         "the model folder's tokenizer does not belong to its weights", ids[i], a->vocab);
                emit_error(f->id, "bad_request", err);
                free(ids);
                return;
            }
    }
    if (n == 0) { emit_error(f->id, "bad_request", "empty prompt"); free(ids); return; }
    if (n >= e->ctx) {
        snprintf(err, sizeof err, "prompt has %d tokens; the context holds %d (one must stay free for output)", n, e->ctx);
        emit_error(f->id, "context_exceeded", err);
        free(ids);
        return;
    }
    if (f->logits) { run_logits(e, f, ids, n); free(ids); return; }
    KvCache *kv = &e->slots[f->slot];
    if (!kv->tokens && kv_init(kv, a, e->ctx)) { emit_error(f->id, "out_of_memory", "cannot allocate the KV cache"); free(ids); return; }
    /* Reuse the common prefix (as far as every layer's state allows, see kv_reuse); at least
     * one prompt token is recomputed to get fresh logits. */
    int reuse = kv_reuse(kv, ids, n);
    emit_line("ACCEPT %s %d %d", f->id, n, reuse);
    SamplerParams sp = f->sp;
    if (!f->has_seed) sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    Sampler smp = {0};
    float *logits = malloc(sizeof(float) * (size_t)a->vocab);
    size_t piece_cap = e->tok ? tok_stream_cap(e->tok) : 16;
    char *piece = malloc(piece_cap);
    if (!logits || !piece || sampler_init(&smp, &sp, a->vocab)) {
        emit_error(f->id, "out_of_memory", "no memory for the sampler");
        sampler_free(&smp);
        free(ids); free(logits); free(piece);
        return;
    }
    engine_stream_turn_begin(e);
    double t0 = now_ms();
    int verdict = 0, oom = 0; /* oom: the forward pass ran out of memory; the slot keeps what completed */
    /* Prefill in batches, reading control frames between them so a cancel need not wait. */
    for (int done = reuse, step = forward_max_batch > 0 ? forward_max_batch : 1; done < n && !verdict && !oom; done += step) {
        int m = n - done < step ? n - done : step;
        oom = forward(&e->model, kv, ids + done, m, done + m == n ? logits : NULL, 0) != 0;
        if (done + m < n && !oom) verdict = poll_control(box, f->id);
    }
    if (!verdict) kv_checkpoint(kv); /* a turn boundary: the next turn may resume here */
    double t_prefill = now_ms() - t0, t_first = 0;
    TokStream ts;
    tok_stream_init(&ts);
    int produced = 0;
    const char *finish = "length";
    for (; !verdict && !oom;) {
        if (f->max_tokens >= 0 && produced >= f->max_tokens) { finish = "length"; break; }
        if (kv->n >= e->ctx) { finish = "length"; break; } /* prompt + output never exceed the context */
        int tok = sampler_sample(&smp, logits);
        if (!produced) t_first = now_ms() - t0;
        if (is_eos(a, tok)) { finish = "stop"; break; }
        size_t len = e->tok ? tok_stream_push(e->tok, &ts, tok, f->render_special, piece, piece_cap) : 0;
        emit_data(f->id, tok, piece, len);
        if (f->logprobs && emit_logprob(e, f->id, logits, tok, f->top_logprobs)) { oom = 1; break; }
        produced++;
        verdict = poll_control(box, f->id);
        if (verdict) break;
        if (f->max_tokens >= 0 && produced >= f->max_tokens) { finish = "length"; break; }
        int32_t next = tok;
        oom = forward(&e->model, kv, &next, 1, logits, 0) != 0;
    }
    size_t rest = e->tok ? tok_stream_flush(&ts, piece, piece_cap) : 0;
    if (rest) emit_data(f->id, -1, piece, rest);
    if (oom) emit_error(f->id, "out_of_memory", "ran out of memory in the forward pass; try a shorter prompt or a smaller --batch");
    else if (verdict == 2) emit_error(f->id, "cancelled", "cancelled by the client");
    else {
        if (verdict == 1) finish = "stop";
        double total = now_ms() - t0, decode = total - t_first;
        char stats[600];
        engine_stream_end_fields(e, total, stats, sizeof stats);
        if (f->routing) engine_stream_routing(e, f->id);
        emit_line("END %s prompt_tokens=%d completion_tokens=%d reused_tokens=%d ttft_ms=%.1f prefill_tok_s=%.1f "
                  "decode_tok_s=%.1f finish=%s%s",
                  f->id, n, produced, reuse, t_first, (n - reuse) / (t_prefill / 1e3 + 1e-9),
                  produced > 1 ? (produced - 1) / (decode / 1e3 + 1e-9) : 0.0, finish, stats);
    }
    kv_checkpoint(kv);
    persist_slot(e, f->slot); /* after END: the client never waits for the disk */
    if (!oom && verdict != 2) engine_stream_learn(e);
    sampler_free(&smp);
    free(piece);
    free(logits);
    free(ids);
}

int engine_serve(Engine *e) {
    FrameReader in;
    reader_init(&in, 0);
    Inbox box = {&in, NULL, NULL, 0, 0};
    const Arch *a = &e->model.a;
    char stream[600];
    engine_stream_ready(e, stream, sizeof stream);
    emit_line("READY family=%s vocab=%d ctx=%d slots=%d layers=%d kernels=%s threads=%d tokenizer=%d kv=%s "
              "kv_bytes_per_token=%zu kv_slot_bytes=%zu batch=%d%s", a->family, a->vocab, e->ctx, e->n_slots,
              a->n_layers, kern.name, omp_get_max_threads(), e->tok != NULL, qtype_name(a->kv_type),
              kv_bytes_per_token(a), kv_bytes(a, e->ctx), forward_max_batch, stream);
    for (;;) {
        Frame f;
        char *payload = NULL, err[256];
        if (box.n) {
            f = box.queue[0];
            payload = box.payloads[0];
            memmove(box.queue, box.queue + 1, sizeof(Frame) * (size_t)(box.n - 1));
            memmove(box.payloads, box.payloads + 1, sizeof(char *) * (size_t)(box.n - 1));
            box.n--;
        } else {
            int rc = reader_next(&in, &f, &payload, err, sizeof err);
            if (rc == 0) {
                if (in.eof) break;
                reader_fill(&in, -1);
                continue;
            }
            if (rc < 0) { emit_error(f.id, rc == -2 ? "out_of_memory" : "bad_request", err); continue; }
        }
        if (f.kind == FR_SUBMIT) run_request(e, &box, &f, payload);
        /* a STOP/CANCEL with nothing running has nothing to stop */
        free(payload);
    }
    free(box.queue);
    free(box.payloads);
    reader_free(&in);
    return 0;
}
