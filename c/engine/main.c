/* colibri engine entry point: the protocol loop by default, plus one-shot tools the launcher
 * calls (logits, convert-jobs, tokenize, detokenize). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/draft.h"
#include "engine/engine.h"
#include "engine/engine_stream.h"
#include "model/model.h"
#include "model/mtp.h"
#include "kernels/lowbit.h"
#include "kernels/quant.h"
#ifndef COLI_VERSION
#define COLI_VERSION "unknown"
#endif

int convert_jobs_main(int argc, char **argv);
int tokenize_cli_main(int argc, char **argv);
int detokenize_cli_main(int argc, char **argv);
int grammar_cli_main(int argc, char **argv);
int membw_main(int argc, char **argv);
int calibrate_main(int argc, char **argv);

static const char *USAGE =
    "usage: colibri [serve] --model DIR [--ctx N] [--kv-slots N] [--threads N] [--batch N] [--kv f16|bf16|f32] [--portable]\n"
    "                       [--kernels portable|avx2|avx512|vnni|amx|neon] [--ram GB] [--cap N] [--no-direct] [--readahead on|off]\n"
    "                       [--pin auto|off] [--io-threads N] [--profile] [--draft lookup|mtp|off] [--draft-max K]\n"
    "                       [--draft-adapt on|off] [--prefill-pass N]   (N: positions per prefill pass when experts\n"
    "                       stream, a multiple of --batch; 0 or absent: the whole prompt, as the budget allows)\n"
    "       colibri logits --model DIR --ids 1,2,3 --out FILE [--mtp-out FILE] [engine options]\n"
    "       colibri calibrate --model DIR --ids-file FILE --out STATS [--chunk N] [engine options]   (activation\n"
    "                       statistics for coli convert --calibrate; N positions a chunk, default 512)\n"
    "       colibri convert-jobs JOBFILE\n"
    "       colibri tokenize --model DIR [--ids-only] TEXT\n"
    "       colibri detokenize --model DIR 1,2,3\n"
    "       colibri grammar-check GRAMMAR_FILE < NUL-separated texts   (complete, prefix MIN_BYTES_LEFT or reject BYTE, one a line)\n"
    "       colibri grammar-bench --tokenizer tokenizer.json --grammar FILE [--steps N] [--runs N] [--seed S]\n"
    "       colibri families   (the model families this engine implements)\n"
    "       colibri limits     (KV slots, quantized block sizes, default --batch, runtime base bytes; one `name value` a line)\n"
    "       colibri version\n";

static int mtp_logits(Engine *e, const int32_t *ids, int n, const char *path);

static int logits_main(int argc, char **argv) {
    EngineOptions o = {0};
    o.skip_tokenizer = 1;
    const char *ids_arg = NULL, *out = NULL, *mtp_out = NULL;
    char err[1024];
    for (int i = 2; i < argc;) {
        if (engine_take_arg(argc, argv, &i, "--ids", &ids_arg) || engine_take_arg(argc, argv, &i, "--out", &out) ||
            engine_take_arg(argc, argv, &i, "--mtp-out", &mtp_out))
            continue;
        if ((i = engine_command_option(argc, argv, i, &o, "logits", USAGE)) < 0) return 2;
    }
    if (!ids_arg || !out) {
        fprintf(stderr, "colibri logits: --ids and --out are required\n");
        return 2;
    }
    if (!o.kv_set) { /* a reference check wants K/V as computed: f16 rounding moves logits by ~1e-3 */
        o.kv_set = 1;
        o.kv_type = QT_F32;
    }
    if (mtp_out) o.draft = DRAFT_MTP + 1; /* loads the head; the states come from this pass, not a slot */
    o.logits_rows = 1;                    /* the budget holds this pass's KV and one chunk of its logits */
    for (const char *c = ids_arg; *c; c++) o.logits_rows += *c == ',';
    Engine e;
    if (engine_open(&e, &o, err, sizeof err)) {
        fprintf(stderr, "colibri: %s\n", err);
        return 1;
    }
    /* a hybrid's recurrent layers turn drafting off, but the head still answers for itself here */
    if (mtp_out && !e.model.mtp && mtp_load(&e.model, err, sizeof err)) {
        fprintf(stderr, "colibri logits: %s\n", err);
        engine_close(&e);
        return 1;
    }
    int32_t *ids = NULL;
    int n = 0, bad = parse_ids(ids_arg, e.model.a.vocab, &ids, &n, err, sizeof err);
    if (bad || n == 0) { /* an id out of range names itself, not an "empty" list */
        fprintf(stderr, "colibri logits: %s\n", bad ? err : "--ids is empty");
        free(ids);
        engine_close(&e);
        return 2;
    }
    if (n > e.model.a.max_pos) /* RoPE extends past it, as transformers does; quality may suffer */
        fprintf(stderr, "colibri logits: warning: %d ids exceed the model's max_position_embeddings %d\n", n, e.model.a.max_pos);
    /* Pass by pass, as forward() would split the prompt anyway: only one pass's logits are
     * held (the budget counts them), so the RAM budget need not hold [n][vocab]. */
    KvCache kv = {0};
    const int V = e.model.a.vocab, step = forward_pass_step();
    float *logits = malloc(sizeof(float) * (size_t)(n < step ? n : step) * V);
    FILE *f = NULL;
    int rc = 1;
    if (!logits || kv_init(&kv, &e.model.a, n)) fprintf(stderr, "colibri logits: out of memory for %d positions\n", n);
    else if (!(f = fopen(out, "wb"))) fprintf(stderr, "colibri logits: cannot write %s\n", out);
    else {
        rc = 0;
        for (int s = 0; s < n && !rc; s += step) {
            int m = n - s < step ? n - s : step;
            if (forward(&e.model, &kv, ids + s, m, logits, 1)) {
                fprintf(stderr, "colibri logits: out of memory for %d positions\n", n);
                rc = 1;
            } else if (fwrite(logits, sizeof(float) * V, (size_t)m, f) != (size_t)m) {
                fprintf(stderr, "colibri logits: cannot write %s\n", out);
                rc = 1;
            }
        }
    }
    if (f && fclose(f) && !rc) {
        fprintf(stderr, "colibri logits: cannot write %s\n", out);
        rc = 1;
    }
    if (f && rc) unlink(out); /* no partial logits file */
    if (!rc && mtp_out) rc = mtp_logits(&e, ids, n, mtp_out);
    kv_free(&kv);
    free(logits);
    free(ids);
    engine_close(&e);
    return rc;
}

/* forward_hidden for `logits --mtp-out`: every position's last-layer state, in order. */
typedef struct {
    float *h;
    int n, cap, H;
} HiddenRows;

static void keep_rows(void *ctx, KvCache *kv, const float *x, int T, const int32_t *tokens) {
    (void)kv;
    (void)tokens;
    HiddenRows *r = ctx;
    int m = T < r->cap - r->n ? T : r->cap - r->n;
    memcpy(r->h + (size_t)r->n * r->H, x, sizeof(float) * (size_t)m * r->H);
    r->n += m;
}

/* The MTP head's logits for ids: row i from the main state of position i and ids[i + 1] (the
 * prediction of ids[i + 2]), [n - 1][vocab], written to path. Runs the main model again. */
static int mtp_logits(Engine *e, const int32_t *ids, int n, const char *path) {
    const Model *m = &e->model;
    const int H = m->a.hidden, V = m->a.vocab;
    HiddenRows rows = {malloc(sizeof(float) * (size_t)n * H), 0, n, H};
    float *logits = malloc(sizeof(float) * (size_t)V * (n > 1 ? n - 1 : 1));
    KvCache kv = {0}, mk = {0};
    FILE *f = NULL;
    int rc = 1;
    forward_hidden = (ForwardHidden){keep_rows, &rows};
    if (!rows.h || !logits || kv_init(&kv, &m->a, n) || kv_init(&mk, &m->mtp->a, n))
        fprintf(stderr, "colibri logits: out of memory for the MTP pass\n");
    else if (forward(m, &kv, ids, n, NULL, 0) || rows.n != n ||
             (n > 1 && mtp_run(m, &mk, rows.h, ids + 1, n - 1, NULL, logits, 1)))
        fprintf(stderr, "colibri logits: out of memory for the MTP pass\n");
    else if (!(f = fopen(path, "wb")) || fwrite(logits, sizeof(float) * V, (size_t)(n - 1), f) != (size_t)(n - 1))
        fprintf(stderr, "colibri logits: cannot write %s\n", path);
    else rc = 0;
    if (f && fclose(f) && !rc) {
        fprintf(stderr, "colibri logits: cannot write %s\n", path);
        rc = 1;
    }
    if (f && rc) unlink(path);
    forward_hidden = (ForwardHidden){NULL, NULL};
    kv_free(&kv);
    kv_free(&mk);
    free(rows.h);
    free(logits);
    return rc;
}

int main(int argc, char **argv) {
    const char *cmd = argc > 1 && argv[1][0] != '-' ? argv[1] : "serve";
    if (!strcmp(cmd, "logits")) return logits_main(argc, argv);
    if (!strcmp(cmd, "calibrate")) return calibrate_main(argc, argv);
    if (!strcmp(cmd, "convert-jobs")) return convert_jobs_main(argc, argv);
    if (!strcmp(cmd, "tokenize")) return tokenize_cli_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "detokenize")) return detokenize_cli_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "grammar-check") || !strcmp(cmd, "grammar-bench")) return grammar_cli_main(argc, argv);
    if (!strcmp(cmd, "membw")) return membw_main(argc, argv);
    if (!strcmp(cmd, "version")) {
        kernels_init(0);
        printf("colibri %s kernels=%s available=", COLI_VERSION, kern.name);
        for (int i = 0, n = 0; i < KI_COUNT; i++)
            if (kernels_supported((KernIsa)i)) printf("%s%s", n++ ? "," : "", kernels_isa_name((KernIsa)i));
        putchar('\n');
        /* every set this build has: complete, or the entries it takes from the portable set */
        for (int i = 0; i < KI_COUNT; i++) {
            char fb[1024];
            if (kernels_fallbacks((KernIsa)i, fb, sizeof fb) < 0) continue;
            printf("set %s%s: %s%s\n", kernels_isa_name((KernIsa)i), kernels_supported((KernIsa)i) ? "" : " (not on this CPU)",
                   fb[0] ? "portable " : "complete", fb);
        }
        return 0;
    }
    if (!strcmp(cmd, "limits")) { /* the launcher's copy (colibri/limits.py) is tested against this */
        printf("max_kv_slots %d\nqblock %d\nq8_block_bytes %zu\nq4_block_bytes %zu\nmxfp4_block_bytes %zu\nq6_block_bytes %zu\n"
               "default_batch %d\ndefault_batch_amx %d\nruntime_base %llu\n",
               MAX_KV_SLOTS, QBLOCK, qtype_row_bytes(QT_Q8, QBLOCK), qtype_row_bytes(QT_Q4, QBLOCK),
               qtype_row_bytes(QT_MXFP4, QBLOCK), qtype_row_bytes(QT_Q6, QBLOCK), FORWARD_DEFAULT_BATCH,
               FORWARD_DEFAULT_BATCH_AMX, (unsigned long long)RUNTIME_BASE_BYTES);
#define LOWBIT_LIMITS(suffix, qt) \
    printf(#suffix "_block_elems %d\n" #suffix "_block_bytes %d\n", lowbit_type(qt)->block, lowbit_type(qt)->bytes);
        LOWBIT_TYPES(LOWBIT_LIMITS)
        return 0;
    }
    if (!strcmp(cmd, "families")) {
        for (int i = 0; ENGINE_FAMILIES[i]; i++) puts(ENGINE_FAMILIES[i]);
        return 0;
    }
    if (!strcmp(cmd, "help") || (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")))) {
        fputs(USAGE, stdout);
        return 0;
    }
    if (strcmp(cmd, "serve") != 0) {
        fprintf(stderr, "colibri: unknown command '%s'\n%s", cmd, USAGE);
        return 2;
    }
    EngineOptions o = {0};
    char err[1024];
    int start = argc > 1 && !strcmp(argv[1], "serve") ? 2 : 1;
    int next = engine_parse_options(argc, argv, start, &o, err, sizeof err);
    if (next < 0) {
        fprintf(stderr, "colibri: %s\n", err);
        return 2;
    }
    if (next < argc) {
        fprintf(stderr, "colibri: unknown argument '%s'\n%s", argv[next], USAGE);
        return 2;
    }
    Engine e;
    int open_rc = engine_open(&e, &o, err, sizeof err);
    if (open_rc) { /* exit 3: busy, worth a retry (docs/protocol.md); 1: the load failed */
        fprintf(stderr, "colibri: %s\n", err);
        return open_rc == ENGINE_BUSY ? 3 : 1;
    }
    int rc = engine_serve(&e);
    engine_close(&e);
    return rc;
}
