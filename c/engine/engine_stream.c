#include "engine/engine_stream.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/draft.h"
#include "io/container.h"
#include "model/layers.h"
#include "model/mtp.h"
#include "kernels/dsa_score.h"
#include "grammar/grammar.h"
#include "kernels/kv_kernels.h"
#include "kv/kv_writer.h"
#include "engine/protocol.h"
#include "model/hyper_conn.h"
#include "model/layers.h"

#define READAHEAD_DEFAULT 0 /* measured: see docs/architecture.md */
#define IO_THREADS_DEFAULT 4

/* The largest value of key over the layer specs' block (attn or mlp). */
static long long spec_max(const JsonValue *layers, const char *block, const char *key) {
    long long m = 0;
    for (size_t l = 0; layers && layers->type == JSON_ARR && l < layers->len; l++) {
        const JsonValue *b = json_get(&layers->items[l], block);
        long long v = b ? json_get_int(b, key, 0) : 0;
        if (v > m) m = v;
    }
    return m;
}

uint64_t attend_scratch_floats(uint64_t heads, uint64_t hd, uint64_t ctx) {
    const uint64_t R = heads > 64 ? heads : 64;
    const uint64_t full = (R + 15) * (ctx + R + KV_ATT_KT);
    const uint64_t capped = (4ull << 20) + 15 * ctx + (R + 15) * (R + KV_ATT_KT);
    const uint64_t by_group = (heads + 15) * (ctx + heads + KV_ATT_KT);
    const uint64_t bound = capped > by_group ? capped : by_group;
    return (full < bound ? full : bound) + hd * (R + 15 + KV_ATT_KT + KV_ATT_PT) + 4 * (R + 15);
}

/* The largest value of key in the layers' DSA indexer objects (attn.indexer; 0: none). */
static long long indexer_max(const JsonValue *layers, const char *key) {
    long long m = 0;
    for (size_t l = 0; layers && layers->type == JSON_ARR && l < layers->len; l++) {
        const JsonValue *a = json_get(&layers->items[l], "attn"), *ix = a ? json_get(a, "indexer") : NULL;
        long long v = ix && ix->type == JSON_OBJ ? json_get_int(ix, key, 0) : 0;
        if (v > m) m = v;
    }
    return m;
}

/* Latent attention's (c/model/block_attn_mla.c) working memory, which the per-position terms (heads x
 * head_dim) miss: a chunk's queries, latents, q_a rows and attention outputs (and the outputs
 * quantized for o); a prompt's first chunks expand every position's keys and values (at most two
 * chunks of positions; 128 positions' latents at a time; queries or outputs zero-padded to the
 * expanded rows), later chunks and decode hold ~1M floats of absorbed queries and outputs; the
 * indexer's selection is a byte per query and position. The per-thread share (the block kernel's
 * scratch over kl + dr dimensions, a selection's gathered rows, a head's dequantized W_uk rows)
 * is added with the other threads' terms. */
static uint64_t mla_chunk_bytes(const JsonValue *layers, uint64_t batch, uint64_t ctx) {
    const uint64_t nh = (uint64_t)spec_max(layers, "attn", "heads"), kl = (uint64_t)spec_max(layers, "attn", "kv_lora_rank");
    if (!kl) return 0;
    const uint64_t dn = (uint64_t)spec_max(layers, "attn", "qk_nope_head_dim"),
                   dr = (uint64_t)spec_max(layers, "attn", "qk_rope_head_dim");
    const uint64_t dv = (uint64_t)spec_max(layers, "attn", "v_head_dim"), hd = kl + dr, n_all = 2 * batch;
    const uint64_t xd = dn + dr > dv ? dn + dr : dv; /* an expanded head's K and V rows, zero-padded */
    const uint64_t expanded = n_all * nh * 2 * xd + 128 * (2 * kl + dr + nh * (dn + dv)) + batch * nh * xd + batch / 4 + 1;
    const uint64_t absorbed_rows = nh * hd > (1u << 20) ? nh * hd : (1u << 20);
    const uint64_t absorbed = 2 * absorbed_rows + batch * (kl + dv);
    const uint64_t ql = (uint64_t)spec_max(layers, "attn", "q_lora_rank");
    const uint64_t chunk = 4 * batch * (nh * (dn + dr) + nh * dv + hd + ql) + 2 * batch * nh * dv;
    const uint64_t ih = (uint64_t)indexer_max(layers, "heads"), ihd = (uint64_t)indexer_max(layers, "head_dim");
    /* the selection, the indexer's queries, weights and keys of a chunk, a decode query's scores */
    const uint64_t keep = indexer_max(layers, "topk") ? batch * ctx + 4 * (batch * (ih * ihd + ih + ihd) + ctx) : 0;
    return chunk + 4 * (expanded > absorbed ? expanded : absorbed) + keep;
}

/* Floats of working memory per prefill position: residual, norm, block output; q, k, v,
 * attention output; MLP gate and up; MoE gathered input, per-choice outputs, router
 * probabilities; quantized activations. */
static uint64_t pos_floats(const Model *m) {
    const JsonValue *layers = json_get(ct_manifest(m->ct), "layers");
    const uint64_t H = (uint64_t)m->a.hidden;
    uint64_t qd = (uint64_t)(spec_max(layers, "attn", "heads") * spec_max(layers, "attn", "head_dim"));
    uint64_t W = (uint64_t)spec_max(layers, "mlp", "width"), K = (uint64_t)spec_max(layers, "mlp", "top_k");
    uint64_t E = (uint64_t)spec_max(layers, "mlp", "experts");
    if (qd < H) qd = H;
    if (W < H) W = H;
    return 3 * H + 4 * qd + 2 * W + H + (K + 1) * H + E + 16 * K + qd + W;
}

/* The largest shared-expert width (mlp.shared.width; 0: none). */
static long long shared_width_max(const JsonValue *layers) {
    long long m = 0;
    for (size_t l = 0; layers && layers->type == JSON_ARR && l < layers->len; l++) {
        const JsonValue *b = json_get(&layers->items[l], "mlp"), *sh = b ? json_get(b, "shared") : NULL;
        long long v = sh && sh->type == JSON_OBJ ? json_get_int(sh, "width", 0) : 0;
        if (v > m) m = v;
    }
    return m;
}

/* What one more position of a prefill pass holds (attention runs a batch at a time, in the
 * runtime share): the residual, normed and block-output rows of forward_chunk (a residual row per
 * hyper-connection stream, and their collapse and mix weights), an MoE layer's gathered input, K
 * outputs, router scores and choices, and the gate and up rows of the widest MLP over every
 * position (a dense layer, a shared expert, or an expert that every position routes to). */
static uint64_t pass_floats(const Model *m) {
    const JsonValue *layers = json_get(ct_manifest(m->ct), "layers");
    const uint64_t H = (uint64_t)m->a.hidden, S = m->hc_head ? (uint64_t)m->hc_head->n : 1;
    const uint64_t K = (uint64_t)spec_max(layers, "mlp", "top_k"), E = (uint64_t)spec_max(layers, "mlp", "experts");
    uint64_t W = (uint64_t)spec_max(layers, "mlp", "width");
    const uint64_t shared = (uint64_t)shared_width_max(layers);
    if (shared > W) W = shared;
    const uint64_t hc = m->hc_head ? H + S + S * S : 0;
    return (S + 2) * H + hc + (K + 1) * H + E + 4 * K + 2 * W;
}

uint64_t engine_pass_pos_bytes(const Model *m, int ctx, int logits_rows) {
    const JsonValue *layers = json_get(ct_manifest(m->ct), "layers");
    /* a DSA indexer's selection (a byte per key) of every chunk of the pass stays for the shared
     * layers (c/model/block_attn_mla.c) */
    const uint64_t keep = indexer_max(layers, "topk") ? (uint64_t)ctx : 0;
    return 4 * pass_floats(m) + keep + (logits_rows ? 4 * (uint64_t)m->a.vocab : 0);
}

uint64_t engine_runtime_bytes(const Model *m, int batch, int ctx, int threads, int logits_rows, uint64_t tokenizer_bytes,
                              int streams) {
    const JsonValue *layers = json_get(ct_manifest(m->ct), "layers");
    const uint64_t V = (uint64_t)m->a.vocab;
    uint64_t qd = (uint64_t)(spec_max(layers, "attn", "heads") * spec_max(layers, "attn", "head_dim"));
    uint64_t W = (uint64_t)spec_max(layers, "mlp", "width");
    if (qd < (uint64_t)m->a.hidden) qd = (uint64_t)m->a.hidden;
    if (W < (uint64_t)m->a.hidden) W = (uint64_t)m->a.hidden;
    uint64_t b = (uint64_t)(batch > 0 ? batch : 1);
    uint64_t r = RUNTIME_BASE_BYTES + 4 * b * pos_floats(m);
    const uint64_t heads = (uint64_t)spec_max(layers, "attn", "heads");
    const uint64_t mla_hd = (uint64_t)(spec_max(layers, "attn", "kv_lora_rank") + spec_max(layers, "attn", "qk_rope_head_dim"));
    uint64_t hd = (uint64_t)spec_max(layers, "attn", "head_dim");
    if (hd < mla_hd) hd = mla_hd; /* MLA attends with one shared head of kl + dr dimensions */
    /* a DSA selection's gathered rows, and the copy its top-k selects on */
    const uint64_t topk = (uint64_t)indexer_max(layers, "topk");
    const uint64_t gathered = topk ? 4 * mla_hd * (topk < (uint64_t)ctx ? topk : (uint64_t)ctx) + 4 * (uint64_t)ctx : 0;
    /* scratch slot 4: MLA's absorption (a head's W_uk rows, dequantized) or the DSA indexer's
     * transposed query */
    uint64_t absorb = 4 * (uint64_t)spec_max(layers, "attn", "qk_nope_head_dim") *
                      (((uint64_t)spec_max(layers, "attn", "kv_lora_rank") + 31) / 32 * 32);
    const uint64_t idx_q =
        4 * (uint64_t)dsa_score_scratch((int)indexer_max(layers, "heads"), (int)indexer_max(layers, "head_dim"));
    if (absorb < idx_q) absorb = idx_q;
    r += (uint64_t)threads * (4 * attend_scratch_floats(heads, hd, (uint64_t)ctx) + 4ull * 8 * (qd > W ? qd : W) + gathered +
                              absorb); /* per-thread scores, rows */
    r += mla_chunk_bytes(layers, b, (uint64_t)ctx);
    const uint64_t st = (uint64_t)(streams > 1 ? streams : 1);
    r += st * 7 * V * 4;         /* each stream's logits and sampler buffers (sampler.h) */
    if (st > 1) r += st * 4 * V; /* one batched decode step's logits */
    if (logits_rows) r += 4 * V * (uint64_t)(logits_rows < batch ? logits_rows : batch); /* one chunk of logits */
    r += tokenizer_bytes * 8; /* parsing peaks at ~8.6x the file (measured: 11.4 MB of tokenizer.json, 98 MB) */
    return r;
}

static void usage_path(const Engine *e, char *out, size_t n) { snprintf(out, n, "%s/.coli_usage", e->model.ct->dir); }

/* Temporaries of writers that died before their rename. */
static void usage_clean(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *de;
    if (!d) return;
    while ((de = readdir(d))) {
        long pid;
        if (sscanf(de->d_name, ".coli_usage.tmp.%ld", &pid) != 1 || pid <= 0) continue;
        if (kill((pid_t)pid, 0) == 0 || pid == getpid()) continue;
        char p[4200];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        unlink(p);
    }
    closedir(d);
}

/* The prefill pass (forward_prefill_pass). Streaming experts: a whole prompt (up to
 * PREFILL_PASS_MAX positions, or --prefill-pass), so each routed expert is read once per pass,
 * not once per batch; its activations past one batch join the budget, and a budget that cannot
 * spare them takes a shorter pass (ram_budget_pass). Resident experts keep one batch. */
static int prefill_pass_open(Engine *e, const EngineOptions *o, int kv_ctx, char *err, size_t errlen) {
    BudgetIn *in = &e->budget_in;
    const int b = forward_max_batch > 0 ? forward_max_batch : 1;
    if (o->prefill_pass % b) {
        snprintf(err, errlen, "--prefill-pass %d must be a multiple of the prefill batch %d (--batch)", o->prefill_pass, b);
        return -1;
    }
    forward_prefill_pass = b;
    e->pass_why = "resident";
    if (!e->budget.streaming || !e->store.n) return 0;
    const int lim = kv_ctx < PREFILL_PASS_MAX ? kv_ctx : PREFILL_PASS_MAX;
    int want = o->prefill_pass ? o->prefill_pass : (lim + b - 1) / b * b, limited = 0;
    e->pass_why = o->prefill_pass ? "flag" : kv_ctx <= PREFILL_PASS_MAX ? "prompt" : "cap";
    const uint64_t per = engine_pass_pos_bytes(&e->model, kv_ctx, o->logits_rows);
    if (!o->prefill_pass) want = ram_budget_pass(in, &e->budget, want, b, per, &limited);
    if (limited) e->pass_why = "budget";
    in->pass = (uint64_t)(want - b) * per;
    in->pass_auto = !o->prefill_pass;
    if (ram_budget_split(in, &e->budget, err, errlen)) return -1;
    forward_prefill_pass = want;
    return 0;
}

int engine_stream_open(Engine *e, const EngineOptions *o, int threads, char *err, size_t errlen) {
    ExpertStore *s = &e->store;
    ExpertLayer **moe = calloc((size_t)e->model.a.n_layers + 1, sizeof *moe);
    if (!moe) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    const int n_trunk = model_expert_layers(&e->model, moe);
    /* a drafting MTP head's experts stream like the trunk's, through cache slots in the budget;
     * they come last, so the trunk's usage, pins and routing keep their layout */
    ExpertLayer *head = e->draft_mode == DRAFT_MTP && e->model.mtp ? moe_expert_layer(&e->model.mtp->y.mlp) : NULL;
    if (head) moe[n_trunk] = head;
    const int bad = expert_store_init(s, e->model.ct, moe, n_trunk + (head != NULL), err, errlen);
    s->n_trunk = n_trunk;
    free(moe);
    if (bad) return -1;
    char path[4200];
    struct stat st;
    snprintf(path, sizeof path, "%s/tokenizer.json", o->model_dir);
    uint64_t tok_bytes = !o->skip_tokenizer && stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
    int slots = o->logits_rows ? 1 : e->n_slots, kv_ctx = o->logits_rows ? o->logits_rows : e->ctx;
    int streams = o->logits_rows ? 1 : e->parallel; /* requests decoding at once */
    /* each stream's verify-pass logits (serve_loop.c), when it may draft, and the recurrent state
     * it saves before each verify pass (kv_checkpoint_bytes: 0 where every state cuts back) */
    uint64_t draft_bytes = e->draft_mode
                               ? (uint64_t)streams * ((uint64_t)(e->draft_max + 1) * (uint64_t)e->model.a.vocab * sizeof(float) +
                                                      kv_checkpoint_bytes(&e->model.a, kv_ctx))
                               : 0;
    if (e->model.mtp) /* each slot's MTP head: its one-layer KV, a verify pass's states, its logits */
        draft_bytes += (uint64_t)slots * (kv_bytes(&e->model.mtp->a, kv_ctx) +
                                          ((uint64_t)(e->draft_max + 3) * e->model.a.hidden + e->model.a.vocab) * sizeof(float));
    BudgetIn *in = &e->budget_in;
    *in = (BudgetIn){.ram = (uint64_t)(o->ram_gb * 1e9),
                     .dense = expert_store_dense_bytes(s),
                     .kv = (uint64_t)slots * kv_bytes(&e->model.a, kv_ctx),
                     .runtime =
                         engine_runtime_bytes(&e->model, forward_max_batch, kv_ctx, threads, o->logits_rows, tok_bytes, streams),
                     .moe_layers = s->n,
                     .experts = s->experts,
                     .slot_bytes = s->slot_bytes,
                     .cap = o->cap};
    in->runtime += draft_bytes;
    if (!o->logits_rows) { /* a server's turn boundaries keep checkpoints; a tokenizer allows grammars */
        in->checkpoints = (uint64_t)slots * KV_MAX_CHECKPOINTS * kv_checkpoint_bytes(&e->model.a, kv_ctx);
        in->grammar = tok_bytes ? grammar_reserve_bytes(e->model.a.vocab, streams) : 0;
        in->persist = o->kv_dir ? kv_writer_reserve(&e->model.a, kv_ctx) : 0; /* its records and image */
    }
    /* A tight budget takes a smaller prefill batch before it refuses (unless --batch was given):
     * scratch and a chunk of logits grow with it, results do not depend on it. */
    int lowered = 0;
    while (ram_budget_split(in, &e->budget, err, errlen)) {
        if (!in->ram || o->batch || forward_max_batch <= 1) return -1;
        BudgetIn at1 = *in;
        at1.runtime = engine_runtime_bytes(&e->model, 1, kv_ctx, threads, o->logits_rows, tok_bytes, streams) + draft_bytes;
        BudgetOut probe;
        if (ram_budget_split(&at1, &probe, err, errlen)) return -1; /* not even batch 1 fits: its numbers */
        forward_max_batch /= 2;
        in->runtime =
            engine_runtime_bytes(&e->model, forward_max_batch, kv_ctx, threads, o->logits_rows, tok_bytes, streams) + draft_bytes;
        lowered = 1;
    }
    if (lowered)
        fprintf(stderr, "colibri: --ram %g: prefill batch lowered to %d to fit the budget\n", o->ram_gb, forward_max_batch);
    if (prefill_pass_open(e, o, kv_ctx, err, errlen)) return -1;
    if (s->n_trunk && s->experts && usage_init(&e->usage, s->n_trunk, s->experts)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (e->usage.counts) {
        char warn[600];
        usage_path(e, path, sizeof path);
        usage_clean(e->model.ct->dir);
        if (usage_load(&e->usage, path, warn, sizeof warn) < 0) fprintf(stderr, "colibri: %s\n", warn);
    }
    if (e->budget.streaming && s->n) {
        int pin = !o->pin_off && e->usage.turns > 0;
        StoreOptions so = {.cap = e->budget.cap,
                           .direct = !o->no_direct,
                           .readahead = o->readahead ? o->readahead == 1 : READAHEAD_DEFAULT,
                           .io_threads = o->io_threads > 0 ? o->io_threads : IO_THREADS_DEFAULT,
                           .pin_counts = pin ? e->usage.counts : NULL};
        if (expert_store_stream(s, &so, err, errlen)) return -1;
    } else if (e->budget.streaming) expert_store_hold_dense(s);
    else ct_populate(e->model.ct);
    const BudgetOut *b = &e->budget;
    char total[32] = "none";
    if (in->ram) snprintf(total, sizeof total, "%.3f GB", in->ram / 1e9);
    if (b->streaming || in->ram)
        fprintf(stderr,
                "colibri: ram budget %s = dense %.1f MB + kv %.1f MB + runtime %.1f MB + checkpoints %.1f MB + "
                "grammar %.1f MB + kv writer %.1f MB + mask cache %.1f MB + expert cache %.1f MB (cap %d of %d per layer%s, "
                "%d pinned)\n",
                total, in->dense / 1e6, in->kv / 1e6, in->runtime / 1e6, in->checkpoints / 1e6, in->grammar / 1e6,
                in->persist / 1e6, b->mask_cache / 1e6, b->cache / 1e6, b->cap, in->experts,
                s->n > s->n_trunk ? ", the MTP layer's included" : "", s->pinned);
    return 0;
}

void engine_stream_close(Engine *e) {
    expert_store_free(&e->store);
    usage_free(&e->usage);
}

void engine_stream_ready(const Engine *e, char *buf, size_t n) {
    const BudgetIn *in = &e->budget_in;
    const ExpertStore *s = &e->store;
    snprintf(buf, n,
             " ram_budget=%llu dense_bytes=%llu kv_bytes=%llu runtime_bytes=%llu checkpoint_bytes=%llu "
             "grammar_bytes=%llu kv_writer_bytes=%llu mask_cache_bytes=%llu expert_cache_bytes=%llu cap=%d "
             "experts=%d moe_layers=%d expert_bytes=%llu pinned=%d direct=%d readahead=%d prefill_pass=%d "
             "prefill_pass_why=%s prefill_pass_bytes=%llu",
             (unsigned long long)in->ram, (unsigned long long)in->dense, (unsigned long long)in->kv,
             (unsigned long long)in->runtime, (unsigned long long)in->checkpoints, (unsigned long long)in->grammar,
             (unsigned long long)in->persist, (unsigned long long)e->budget.mask_cache, (unsigned long long)e->budget.cache,
             e->budget.cap, in->experts, in->moe_layers, (unsigned long long)s->expert_bytes, s->pinned,
             s->streaming && s->direct, s->streaming && s->readahead, forward_pass_step(), e->pass_why ? e->pass_why : "resident",
             (unsigned long long)in->pass);
}

void engine_stream_turn_begin(Engine *e) { expert_store_turn_begin(&e->store); }

/* VmHWM and VmRSS of this process, in MB. */
static void rss_now(long *peak, long *rss) {
    char line[256];
    *peak = *rss = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        long v;
        if (sscanf(line, "VmHWM: %ld kB", &v) == 1) *peak = v / 1024;
        else if (sscanf(line, "VmRSS: %ld kB", &v) == 1) *rss = v / 1024;
    }
    fclose(f);
}

static void end_fields(Engine *e, const ExpertStats *st, double turn_ms, char *buf, size_t n) {
    ExpertStore *s = &e->store;
    uint64_t look = st->hits + st->misses;
    long peak, rss;
    rss_now(&peak, &rss);
    double compute = turn_ms - st->io_wait_ms;
    snprintf(buf, n,
             " hits=%llu misses=%llu hit_rate=%.3f bytes_read=%llu read_gbps=%.2f io_wait_ms=%.1f "
             "compute_ms=%.1f peak_rss_mb=%ld rss_mb=%ld experts_pinned=%d experts_cached=%llu experts_total=%llu",
             (unsigned long long)st->hits, (unsigned long long)st->misses, look ? (double)st->hits / look : 1.0,
             (unsigned long long)st->bytes_read, st->read_busy_s > 0 ? st->bytes_read / st->read_busy_s / 1e9 : 0.0,
             st->io_wait_ms, compute > 0 ? compute : 0.0, peak, rss, s->pinned, (unsigned long long)expert_store_cached(s),
             (unsigned long long)s->n * s->experts);
}

void engine_stream_end_fields(Engine *e, double turn_ms, char *buf, size_t n) {
    expert_store_turn_end(&e->store);
    end_fields(e, &e->store.st, turn_ms, buf, n);
}

void engine_stream_mark(Engine *e, TurnMark *m) {
    ExpertStore *s = &e->store;
    size_t cnt = (size_t)s->n * s->experts;
    expert_store_turn_end(s);
    m->st = s->st;
    m->counts = cnt && s->turn_counts ? malloc(cnt * sizeof(uint32_t)) : NULL;
    if (m->counts) memcpy(m->counts, s->turn_counts, cnt * sizeof(uint32_t));
}

void engine_stream_mark_free(TurnMark *m) {
    free(m->counts);
    m->counts = NULL;
}

ExpertStats engine_stream_since(Engine *e, const TurnMark *m) {
    ExpertStore *s = &e->store;
    expert_store_turn_end(s);
    return (ExpertStats){s->st.hits - m->st.hits, s->st.misses - m->st.misses, s->st.bytes_read - m->st.bytes_read,
                         s->st.io_wait_ms - m->st.io_wait_ms, s->st.read_busy_s - m->st.read_busy_s};
}

void engine_stream_prefill_fields(const ExpertStats *d, char *buf, size_t n) {
    size_t at = strlen(buf);
    if (at < n)
        snprintf(buf + at, n - at, " prefill_bytes_read=%llu prefill_io_wait_ms=%.1f", (unsigned long long)d->bytes_read,
                 d->io_wait_ms);
}

void engine_stream_end_since(Engine *e, const TurnMark *m, double turn_ms, char *buf, size_t n) {
    ExpertStats d = engine_stream_since(e, m);
    end_fields(e, &d, turn_ms, buf, n);
}

static void routing_frame(const ExpertStore *s, const uint32_t *since, const char *id);

void engine_stream_routing(const Engine *e, const char *id) { routing_frame(&e->store, NULL, id); }

void engine_stream_routing_since(const Engine *e, const TurnMark *m, const char *id) { routing_frame(&e->store, m->counts, id); }

static void routing_frame(const ExpertStore *s, const uint32_t *since, const char *id) {
    size_t cnt = (size_t)s->n_trunk * s->experts, bytes = cnt * 4; /* turn_counts' first rows */
    unsigned char *b = malloc(bytes + 1);
    char head[200];
    if (!b) {
        emit_error(id, "out_of_memory", "no memory for the ROUTING frame");
        return;
    }
    for (size_t i = 0; i < cnt; i++) {
        uint32_t v = s->turn_counts[i] - (since ? since[i] : 0);
        b[4 * i] = v & 255;
        b[4 * i + 1] = (v >> 8) & 255;
        b[4 * i + 2] = (v >> 16) & 255;
        b[4 * i + 3] = v >> 24;
    }
    snprintf(head, sizeof head, "ROUTING %s %d %d %zu\n", id, s->n_trunk, s->experts, bytes);
    emit_blob(head, b, bytes);
    free(b);
}

void engine_stream_learn(Engine *e) {
    if (!e->usage.counts) return;
    usage_add(&e->usage, e->store.turn_counts);
    char path[4200], err[600];
    usage_path(e, path, sizeof path);
    if (usage_save(&e->usage, path, err, sizeof err) && !e->usage_warned) {
        fprintf(stderr, "colibri: warning: %s; expert usage is not learned from this run\n", err);
        e->usage_warned = 1;
    }
}
