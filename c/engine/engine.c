#include "engine/engine.h"
#include "engine/draft.h"
#include "engine/engine_mtp.h"

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

#include "io/container.h"
#include "engine/engine_grammar.h"
#include "engine/engine_stream.h"
#include "kernels/kv_kernels.h"
#include "kv/kv_dir.h"
#include "util/op_prof.h"
#include "kv/kv_persist.h"
#include "kv/kv_writer.h"
#include "engine/logprob.h"
#include "engine/protocol.h"
#include "engine/sampler.h"
#include "engine/serve_loop.h"
#include "tokenizer/tokenizer.h"


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
        if ((f = fopen(path, "r"))) {
            if (fscanf(f, "%ld", &pkg) != 1) pkg = 0;
            fclose(f);
        }
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

int engine_take_arg(int argc, char **argv, int *i, const char *flag, const char **dst) {
    if (strcmp(argv[*i], flag) || *i + 1 >= argc) return 0;
    *dst = argv[*i + 1];
    *i += 2;
    return 1;
}

int engine_command_option(int argc, char **argv, int i, EngineOptions *o, const char *cmd, const char *usage) {
    char err[1024];
    int next = engine_parse_options(argc, argv, i, o, err, sizeof err);
    if (next < 0) fprintf(stderr, "colibri %s: %s\n", cmd, err);
    else if (next == i) fprintf(stderr, "colibri %s: unknown argument '%s'\n%s", cmd, argv[i], usage ? usage : "");
    return next > i ? next : -1;
}

int engine_parse_options(int argc, char **argv, int i, EngineOptions *o, char *err, size_t errlen) {
    for (; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(a, "--model")) {
            if (!v) {
                snprintf(err, errlen, "--model needs a directory");
                return -1;
            }
            o->model_dir = v;
            i++;
        } else if (!strcmp(a, "--ctx")) {
            rc = opt_int(a, v, 1, 1 << 24, &o->ctx, err, errlen);
            i++;
        } else if (!strcmp(a, "--kv-slots")) {
            rc = opt_int(a, v, 1, MAX_KV_SLOTS, &o->kv_slots, err, errlen);
            i++;
        } else if (!strcmp(a, "--parallel")) {
            rc = opt_int(a, v, 1, MAX_KV_SLOTS, &o->parallel, err, errlen);
            i++;
        } else if (!strcmp(a, "--threads")) {
            rc = opt_int(a, v, 1, 1024, &o->threads, err, errlen);
            i++;
        } else if (!strcmp(a, "--batch")) {
            rc = opt_int(a, v, 1, 1 << 16, &o->batch, err, errlen);
            i++;
        } else if (!strcmp(a, "--prefill-pass")) {
            rc = opt_int(a, v, 0, 1 << 20, &o->prefill_pass, err, errlen);
            i++;
        } else if (!strcmp(a, "--portable")) o->portable = 1;
        else if (!strcmp(a, "--profile")) o->profile = 1;
        else if (!strcmp(a, "--kernels")) {
            KernIsa isa;
            if (!v || kernels_isa_from_name(v, &isa)) {
                snprintf(err, errlen, "--kernels needs one of %s", kernels_all_names());
                return -1;
            }
            o->kernels = (int)isa + 1;
            i++;
        } else if (!strcmp(a, "--kv")) {
            if (!v || kv_type_from_name(v, &o->kv_type)) {
                snprintf(err, errlen, "--kv needs f16, bf16 or f32");
                return -1;
            }
            o->kv_set = 1;
            i++;
        } else if (!strcmp(a, "--ram")) {
            char *end;
            double g = v ? strtod(v, &end) : 0;
            if (!v || end == v || *end || !(g > 0 && g < 1e6)) {
                snprintf(err, errlen, "--ram needs a positive number of GB (e.g. 0.5)");
                return -1;
            }
            o->ram_gb = g;
            i++;
        } else if (!strcmp(a, "--cap")) {
            rc = opt_int(a, v, 1, 1 << 20, &o->cap, err, errlen);
            i++;
        } else if (!strcmp(a, "--io-threads")) {
            rc = opt_int(a, v, 1, 64, &o->io_threads, err, errlen);
            i++;
        } else if (!strcmp(a, "--no-direct")) o->no_direct = 1;
        else if (!strcmp(a, "--readahead") || !strcmp(a, "--pin")) {
            const char *on = a[2] == 'r' ? "on" : "auto";
            if (!v || (strcmp(v, on) && strcmp(v, "off"))) {
                snprintf(err, errlen, "%s needs %s or off", a, on);
                return -1;
            }
            if (a[2] == 'r') o->readahead = !strcmp(v, "on") ? 1 : 2;
            else o->pin_off = !strcmp(v, "off");
            i++;
        } else if (!strcmp(a, "--draft")) {
            if (!v || (strcmp(v, "lookup") && strcmp(v, "mtp") && strcmp(v, "off"))) {
                snprintf(err, errlen, "--draft needs lookup, mtp or off");
                return -1;
            }
            o->draft = 1 + (!strcmp(v, "lookup") ? DRAFT_LOOKUP : !strcmp(v, "mtp") ? DRAFT_MTP : DRAFT_OFF);
            i++;
        } else if (!strcmp(a, "--draft-adapt")) {
            if (!v || (strcmp(v, "on") && strcmp(v, "off"))) {
                snprintf(err, errlen, "--draft-adapt needs on or off");
                return -1;
            }
            o->draft_fixed = !strcmp(v, "off");
            i++;
        } else if (!strcmp(a, "--draft-max")) {
            rc = opt_int(a, v, 1, DRAFT_LIMIT, &o->draft_max, err, errlen);
            i++;
        } else if (!strcmp(a, "--kv-dir")) {
            if (!v) {
                snprintf(err, errlen, "--kv-dir needs a directory");
                return -1;
            }
            o->kv_dir = v;
            i++;
        } else return i;
        if (rc) return -1;
    }
    return i;
}

static void restore_slots(Engine *e, const char *dir);

/* --draft: a drafter the model cannot use is refused, one its state cannot undo is turned off
 * with the reason (READY draft_off=). A fixed recurrent state (gated DeltaNet, KDA) is undone
 * by saving it before each verify pass; a window's ring or a per-position state that cannot be
 * cut back is not. */
static int engine_draft_open(Engine *e, const EngineOptions *o, char *err, size_t errlen) {
    const Arch *a = &e->model.a;
    e->draft_mode = o->draft ? o->draft - 1 : DRAFT_OFF;
    e->draft_max = o->draft_max ? o->draft_max : DRAFT_DEFAULT_MAX;
    e->draft_fixed = o->draft_fixed;
    if (!e->draft_mode) return 0;
    for (int l = 0; l < a->n_layers; l++) {
        const StateDesc *s = &a->state[l];
        if ((!s->truncatable && s->per_pos) || (s->window > 0 && s->window < e->ctx)) {
            e->draft_off = s->truncatable ? "sliding_window" : "recurrent_state";
            e->draft_mode = DRAFT_OFF;
            return 0;
        }
    }
    return e->draft_mode == DRAFT_MTP ? engine_mtp_open(e, err, errlen) : 0;
}

int engine_open(Engine *e, const EngineOptions *o, char *err, size_t errlen) {
    memset(e, 0, sizeof(*e));
    e->kv_lock_fd = -1;
    if (!o->model_dir) {
        snprintf(err, errlen, "no model directory given (--model DIR)");
        return -1;
    }
    /* Before the (long) model load: a second engine on the directory is refused at once. */
    if (o->kv_dir) {
        int fd = kv_dir_lock(o->kv_dir, err, errlen);
        if (fd < 0) return fd == KV_DIR_BUSY ? ENGINE_BUSY : -1;
        e->kv_lock_fd = fd;
    }
    kernels_init(o->portable);
    if (o->kernels && kernels_use((KernIsa)(o->kernels - 1))) {
        snprintf(err, errlen, "--kernels %s: this CPU (or build) cannot run them; `colibri version` lists the ones it can",
                 kernels_isa_name((KernIsa)(o->kernels - 1)));
        engine_close(e);
        return -1;
    }
    prof_enabled = o->profile;
    if (o->threads) omp_set_num_threads(o->threads);
    else if (!getenv("OMP_NUM_THREADS") && physical_cores() > 0) omp_set_num_threads(physical_cores());
    forward_max_batch = o->batch ? o->batch : forward_default_batch(kern.isa);
    if (model_load(&e->model, o->model_dir, err, errlen)) {
        engine_close(e);
        return -1;
    }
    if (o->kv_set && model_set_kv_type(&e->model, o->kv_type, err, errlen)) {
        engine_close(e);
        return -1;
    }
    const Arch *a = &e->model.a;
    e->ctx = o->ctx ? o->ctx : (a->max_pos < 4096 ? a->max_pos : 4096);
    if (e->ctx > a->max_pos) {
        snprintf(err, errlen, "--ctx %d exceeds the model's max_position_embeddings %d", e->ctx, a->max_pos);
        engine_close(e);
        return -1;
    }
    e->n_slots = o->kv_slots ? o->kv_slots : 1;
    e->parallel = o->parallel ? o->parallel : e->n_slots;
    if (e->parallel > e->n_slots) {
        snprintf(err, errlen,
                 "--parallel %d exceeds --kv-slots %d: each running request needs a KV slot of its own; "
                 "raise --kv-slots or lower --parallel",
                 e->parallel, e->n_slots);
        engine_close(e);
        return -1;
    }
    if (engine_draft_open(e, o, err, errlen)) {
        engine_close(e);
        return -1;
    }
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/tokenizer.json", o->model_dir);
    if (!o->skip_tokenizer && stat(path, &st) == 0) {
        e->tok = tok_load(path, err, errlen);
        if (!e->tok) {
            engine_close(e);
            return -1;
        }
    }
    if (engine_stream_open(e, o, omp_get_max_threads(), err, errlen)) {
        engine_close(e);
        return -1;
    }
    if (o->kv_dir) restore_slots(e, o->kv_dir);
    return 0;
}

/* Warm start: every slot saved by an earlier run of this model comes back, its base file then
 * the turns logged since; a file that cannot be trusted is refused (the reason goes to stderr)
 * and only its slot starts cold. */
static void restore_slots(Engine *e, const char *dir) {
    e->kv_dir = dir;
    e->fingerprint = kv_fingerprint(e->model.ct->dir);
    kv_dir_clean(dir); /* we hold the lock: any temporary is a dead save's */
    e->kv_writer = kv_writer_start(dir, e->n_slots, &e->model.a, e->ctx, e->fingerprint);
    if (!e->kv_writer) fprintf(stderr, "colibri: no memory for the KV writer; slots are not saved in this run\n");
    for (int i = 0; i < e->n_slots; i++) {
        char path[4200], log[4200], err[512], note[256];
        kv_slot_paths(dir, i, path, log, sizeof path);
        if (access(path, R_OK) != 0) continue;
        if (kv_init(&e->slots[i], &e->model.a, e->ctx)) {
            fprintf(stderr, "colibri: no memory to restore %s\n", path);
            continue;
        }
        if (kv_restore(&e->slots[i], &e->model.a, e->fingerprint, path, err, sizeof err) < 0) {
            fprintf(stderr, "colibri: %s\n", err);
            continue;
        }
        uint64_t sum = 0;
        off_t good = 0;
        int turns = kv_file_sum(path, &sum)
                        ? 0
                        : kv_log_replay(&e->slots[i], &e->model.a, e->fingerprint, sum, log, &good, note, sizeof note);
        if (note[0] && turns >= 0) fprintf(stderr, "colibri: %s: %s; the slot resumes from the record before\n", log, note);
        fprintf(stderr, "colibri: restored KV slot %d (%d positions) from %s%s\n", i, e->slots[i].n, path,
                turns > 0 ? " and its log" : "");
        e->disk_n[i] = e->low_water[i] = e->slots[i].n;
        if (e->kv_writer) kv_writer_known(e->kv_writer, i, turns >= 0 ? good : 0);
    }
}


void engine_close(Engine *e) {
    kv_writer_stop(e->kv_writer); /* what is queued reaches the disk first */
    e->kv_writer = NULL;
    engine_stream_close(e); /* stops the I/O threads before the model goes */
    engine_grammar_free(e);
    for (int i = 0; i < MAX_KV_SLOTS; i++)
        if (e->slots[i].tokens) kv_free(&e->slots[i]);
    engine_mtp_close(e);
    if (e->tok) tok_free(e->tok);
    e->tok = NULL;
    model_free(&e->model);
    if (e->kv_lock_fd >= 0) close(e->kv_lock_fd); /* releases the KV directory */
    e->kv_lock_fd = -1;
}


int engine_serve(Engine *e) {
    FrameReader in;
    reader_init(&in, 0);
    const Arch *a = &e->model.a;
    char stream[800];
    engine_stream_ready(e, stream, sizeof stream);
    char fallbacks[1024];
    kernels_fallbacks(kern.isa, fallbacks, sizeof fallbacks);
    emit_line(
        "READY family=%s vocab=%d ctx=%d slots=%d layers=%d kernels=%s kernel_fallbacks=%s threads=%d tokenizer=%d kv=%s "
        "kv_bytes_per_token=%zu kv_slot_bytes=%zu batch=%d parallel=%d draft=%s draft_max=%d draft_adapt=%s "
        "%s%s%s",
        a->family, a->vocab, e->ctx, e->n_slots, a->n_layers, kern.name, fallbacks[0] ? fallbacks : "none", omp_get_max_threads(),
        e->tok != NULL, qtype_name(a->kv_type), kv_bytes_per_token(a), kv_bytes(a, e->ctx), forward_max_batch, e->parallel,
        e->draft_mode == DRAFT_LOOKUP ? "lookup"
        : e->draft_mode == DRAFT_MTP  ? "mtp"
                                      : "off",
        e->draft_max, e->draft_fixed ? "off" : "on", e->draft_off ? " draft_off=" : "", e->draft_off ? e->draft_off : "", stream);
    int rc = serve_loop(e, &in);
    reader_free(&in);
    return rc;
}
