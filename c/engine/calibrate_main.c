/* `colibri calibrate`: the activation statistics of every weight matrix over token ids
 * (kernels/act_stats.h), for `coli convert --calibrate`. The ids run in chunks of --chunk
 * positions, each from an empty context, as llama.cpp's imatrix runs its text; every position
 * computes the output head, so the head is counted too. Experts stream under --ram as in
 * serving: the cache's slots count as the experts they hold. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "kernels/act_stats.h"
#include "model/model.h"

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *s = malloc(cap);
    for (size_t got; s && (got = fread(s + n, 1, cap - n - 1, f)) > 0;) {
        n += got;
        if (n + 1 == cap) {
            char *t = realloc(s, cap *= 2);
            if (!t) free(s);
            s = t;
        }
    }
    fclose(f);
    if (s) s[n] = 0;
    return s;
}

static int run_chunks(Engine *e, const int32_t *ids, int n, int chunk) {
    const int V = e->model.a.vocab, step = forward_pass_step();
    const int rows = chunk < step ? chunk : step;
    float *logits = malloc(sizeof(float) * (size_t)rows * V);
    KvCache kv = {0};
    int rc = 0;
    if (!logits) rc = 1;
    const int chunks = (n + chunk - 1) / chunk;
    for (int c = 0; c < chunks && !rc; c++) {
        const int s0 = c * chunk, len = n - s0 < chunk ? n - s0 : chunk;
        if (kv_init(&kv, &e->model.a, len)) {
            rc = 1;
            break;
        }
        for (int s = 0; s < len && !rc; s += rows) {
            const int m = len - s < rows ? len - s : rows;
            if (forward(&e->model, &kv, ids + s0 + s, m, logits, 1)) rc = 1;
        }
        kv_free(&kv);
        fprintf(stderr, "calibrate: chunk %d of %d\n", c + 1, chunks);
    }
    if (rc) fprintf(stderr, "colibri calibrate: out of memory for a chunk of %d positions\n", chunk);
    free(logits);
    return rc;
}

int calibrate_main(int argc, char **argv) {
    EngineOptions o = {0};
    o.skip_tokenizer = 1;
    const char *ids_file = NULL, *out = NULL;
    int chunk = 512;
    char err[1024];
    for (int i = 2; i < argc;) {
        if (engine_take_arg(argc, argv, &i, "--ids-file", &ids_file) || engine_take_arg(argc, argv, &i, "--out", &out)) continue;
        if (!strcmp(argv[i], "--chunk") && i + 1 < argc) {
            char *end;
            long v = strtol(argv[i + 1], &end, 10);
            if (*end || v < 1 || v > 1 << 20) {
                fprintf(stderr, "colibri calibrate: --chunk takes a count of positions (1 to %d)\n", 1 << 20);
                return 2;
            }
            chunk = (int)v;
            i += 2;
            continue;
        }
        if ((i = engine_command_option(argc, argv, i, &o, "calibrate", NULL)) < 0) return 2;
    }
    if (!ids_file || !out) {
        fprintf(stderr, "colibri calibrate: --ids-file and --out are required\n");
        return 2;
    }
    char *text = read_text(ids_file);
    if (!text) {
        fprintf(stderr, "colibri calibrate: cannot read %s\n", ids_file);
        return 2;
    }
    o.logits_rows = chunk; /* the budget counts one chunk's KV and a pass of its logits */
    act_stats_begin();     /* before the load: the loader names the matrices */
    Engine e;
    if (engine_open(&e, &o, err, sizeof err)) {
        fprintf(stderr, "colibri: %s\n", err);
        free(text);
        act_stats_end();
        return 1;
    }
    int32_t *ids = NULL;
    int n = 0, rc = 2, bad = parse_ids(text, e.model.a.vocab, &ids, &n, err, sizeof err);
    if (bad || n == 0) fprintf(stderr, "colibri calibrate: %s: %s\n", ids_file, bad ? err : "no token ids");
    else if (!(rc = run_chunks(&e, ids, n, chunk))) {
        int named, counted;
        act_stats_counts(&named, &counted);
        if (act_stats_write(out, err, sizeof err)) {
            fprintf(stderr, "colibri calibrate: %s\n", err);
            rc = 1;
        } else fprintf(stderr, "calibrate: %d positions; %d of %d matrices reached\n", n, counted, named);
    }
    free(ids);
    free(text);
    engine_close(&e);
    act_stats_end();
    return rc;
}
