/* `colibri grammar-check GRAMMAR` (does each NUL-separated text on stdin match?) and
 * `colibri grammar-bench` (what a token mask costs at a tokenizer's vocabulary size). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/clock.h"
#include "util/grow.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

static char *slurp(FILE *f, size_t *n) {
    size_t cap = 1 << 16, len = 0;
    char *b = malloc(cap);
    for (size_t got; b && (got = fread(b + len, 1, cap - len, f)) > 0;) {
        len += got;
        if (len == cap) {
            char *nb = grow_array(b, &cap, len + 1, 1, 1 << 16);
            if (!nb) {
                free(b);
                return NULL;
            }
            b = nb;
        }
    }
    if (b) b[len] = 0;
    *n = len;
    return b;
}

static Grammar *load_grammar(const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot read %s", path);
        return NULL;
    }
    size_t n;
    char *text = slurp(f, &n);
    fclose(f);
    if (!text) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    Grammar *g = grammar_parse(text, n, err, errlen);
    free(text);
    return g;
}

/* One line per text: `complete`, `prefix N` (valid so far; N more bytes at least complete it)
 * or `reject N` (byte N cannot follow). */
static int check_main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: colibri grammar-check GRAMMAR_FILE < texts (NUL-separated)\n");
        return 2;
    }
    char err[512];
    Grammar *g = load_grammar(argv[2], err, sizeof err);
    if (!g) {
        fprintf(stderr, "colibri grammar-check: %s\n", err);
        return 1;
    }
    GrammarRun *r = grammar_run_new(g, NULL);
    size_t n;
    char *in = slurp(stdin, &n);
    if (!r || !in) {
        fprintf(stderr, "colibri grammar-check: out of memory\n");
        return 1;
    }
    for (size_t at = 0; at <= n;) {
        size_t len = strnlen(in + at, n - at), bad;
        grammar_run_reset(r);
        if (grammar_accept_bytes(r, in + at, len, &bad)) printf("reject %zu\n", bad);
        else if (grammar_complete(r)) printf("complete\n");
        else printf("prefix %d\n", grammar_min_bytes(r));
        at += len + 1;
        if (at == n) break; /* a trailing separator ends the list */
    }
    free(in);
    grammar_run_free(r);
    grammar_free(g);
    return 0;
}


static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A random walk through the grammar, one uniformly chosen allowed token a step: the mask cost
 * of a state seen for the first time (cold) and again (cached), and of one token check. */
static int bench_main(int argc, char **argv) {
    const char *tok_path = NULL, *gram_path = NULL;
    int steps = 200, runs = 3;
    uint64_t seed = 1;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--tokenizer")) tok_path = argv[i + 1];
        else if (!strcmp(argv[i], "--grammar")) gram_path = argv[i + 1];
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--runs")) runs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 10);
    }
    if (!tok_path || !gram_path || steps < 1 || runs < 1) {
        fprintf(stderr,
                "usage: colibri grammar-bench --tokenizer tokenizer.json --grammar FILE [--steps N] [--runs N] [--seed S]\n");
        return 2;
    }
    char err[512];
    Tokenizer *t = tok_load(tok_path, err, sizeof err);
    Grammar *g = t ? load_grammar(gram_path, err, sizeof err) : NULL;
    if (!g) {
        fprintf(stderr, "colibri grammar-bench: %s\n", err);
        return 1;
    }
    int V = tok_vocab_size(t);
    const char **bytes = calloc((size_t)V, sizeof *bytes);
    size_t *len = calloc((size_t)V, sizeof *len);
    uint8_t *kind = calloc((size_t)V, 1);
    int eos = tok_find(t, "<|im_end|>");
    for (int i = 0; bytes && len && kind && i < V; i++) {
        bytes[i] = tok_token_bytes(t, i, &len[i]);
        kind[i] = i == eos ? GV_EOS : !bytes[i] ? GV_NONE : tok_is_added(t, i) ? GV_ADDED : GV_TEXT;
        if (!bytes[i]) bytes[i] = "";
    }
    double t0 = now_ms();
    GrammarVocab *v = kind ? grammar_vocab_new(V, bytes, len, kind) : NULL;
    double trie_ms = now_ms() - t0;
    GrammarRun *r = v ? grammar_run_new(g, v) : NULL;
    if (!r) {
        fprintf(stderr, "colibri grammar-bench: out of memory\n");
        return 1;
    }
    double cold_ms = 0, warm_ms = 0, check_ms = 0;
    long cold = 0, warm = 0, checks = 0, allowed_sum = 0, toks = 0;
    int *allowed = malloc(sizeof(int) * (size_t)V);
    for (int run = 0; run < runs; run++) {
        grammar_run_reset(r);
        uint64_t s = seed + (uint64_t)run;
        for (int step = 0; step < steps && !grammar_finished(r); step++) {
            GrammarStats before, after;
            grammar_stats(r, &before);
            const uint32_t *bits;
            double a = now_ms();
            int count = grammar_mask(r, -1, &bits);
            double ms = now_ms() - a;
            grammar_stats(r, &after);
            if (count <= 0) {
                fprintf(stderr, "colibri grammar-bench: dead end at step %d\n", step);
                return 1;
            }
            if (after.masks_built > before.masks_built) {
                cold_ms += ms;
                cold++;
            } else {
                warm_ms += ms;
                warm++;
            }
            int k = 0;
            for (int i = 0; i < V; i++)
                if ((bits[i >> 5] >> (i & 31)) & 1) allowed[k++] = i;
            allowed_sum += k;
            int pick = allowed[rng_next(&s) % (uint64_t)k];
            if (kind[pick] == GV_EOS) break;
            a = now_ms();
            int ok = grammar_allows(r, pick, -1); /* what the engine pays when the model's own pick fits */
            check_ms += now_ms() - a;
            checks++;
            if (!ok || grammar_accept(r, pick)) {
                fprintf(stderr, "colibri grammar-bench: mask and check disagree\n");
                return 1;
            }
            toks++;
        }
    }
    GrammarStats st;
    grammar_stats(r, &st);
    printf("vocab %d trie_nodes %zu trie_build_ms %.1f tokens %ld mean_allowed %.0f\n", V, grammar_vocab_nodes(v), trie_ms, toks,
           toks ? (double)allowed_sum / toks : 0.0);
    printf("mask_cold_ms %.3f (n=%ld) mask_cached_ms %.4f (n=%ld) token_check_ms %.5f (n=%ld) dfa_states %llu\n",
           cold ? cold_ms / cold : 0.0, cold, warm ? warm_ms / warm : 0.0, warm, checks ? check_ms / checks : 0.0, checks,
           (unsigned long long)st.dfa_states);
    free(allowed);
    free(bytes);
    free(len);
    free(kind);
    grammar_run_free(r);
    grammar_vocab_free(v);
    grammar_free(g);
    tok_free(t);
    return 0;
}

int grammar_cli_main(int argc, char **argv) {
    if (!strcmp(argv[1], "grammar-check")) return check_main(argc, argv);
    return bench_main(argc, argv);
}
