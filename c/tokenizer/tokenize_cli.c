/* `colibri tokenize` and `colibri detokenize`: the tokenizer for users and tests.
 *
 *   tokenize --model DIR [--ids-only] [--no-special] [--add-special] (TEXT | - | --file PATH)
 *     default output: one line per token, "id<TAB>piece" with the piece's bytes escaped;
 *     --ids-only: one comma-separated line. --no-special: special tokens in TEXT are plain
 *     text. --add-special: apply the post-processor (BOS etc.) like add_special_tokens=True.
 *   tokenize --model DIR --batch [--no-special] [--add-special]   (for tests and tools)
 *     stdin holds records "<byte length>[ <K>]\n<bytes>"; with K, the first K bytes are literal
 *     spans (tokenizer.h, the grammar of SUBMIT's literal= in docs/protocol.md) over the text
 *     after them. Prints one line per record: the
 *     comma-separated ids, or "ERR <message>", flushed per record (the tokenizer is loaded
 *     once, so a server keeps one running). --timing adds
 *     a final stderr line "encode_seconds=S bytes=N" (time inside tok_encode only).
 *   detokenize --model DIR IDS...   (ids separated by commas/spaces, or - for stdin)
 *     prints the decoded text exactly (no newline added), special tokens rendered.
 *   detokenize --model DIR --batch   (for tests and tools)
 *     stdin holds one line of comma-separated ids per record; prints "<byte length>\n<text>"
 *     per record, or "ERR <message>\n".
 *
 * DIR is a model directory holding tokenizer.json (or the tokenizer.json path itself);
 * COLI_MODEL replaces --model. Errors: message on stderr, exit code 2. */
#ifndef _GNU_SOURCE
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */
#endif
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "tokenizer/tokenizer.h"
#include "util/grow.h"

#define MAX_INPUT ((size_t)1 << 30)

static int fail(const char *cmd, const char *msg) {
    fprintf(stderr, "colibri %s: %s\n", cmd, msg);
    return 2;
}

static char *read_stream(FILE *f, size_t *n_out) {
    size_t n = 0, cap = 1 << 16;
    char *buf = malloc(cap + 1);
    if (!buf) return NULL;
    for (;;) {
        if (n == cap) {
            if (cap >= MAX_INPUT) {
                free(buf);
                errno = EFBIG;
                return NULL;
            }
            cap *= 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    if (ferror(f)) {
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *n_out = n;
    return buf;
}

static Tokenizer *open_model(const char *cmd, const char *model) {
    if (!model) model = getenv("COLI_MODEL");
    if (!model || !*model) {
        fail(cmd, "no model: pass --model DIR (a directory with tokenizer.json) or set COLI_MODEL");
        return NULL;
    }
    struct stat st;
    char *path;
    size_t ml = strlen(model);
    if (stat(model, &st) == 0 && S_ISDIR(st.st_mode)) {
        path = malloc(ml + 16);
        if (!path) return NULL;
        snprintf(path, ml + 16, "%s/tokenizer.json", model);
    } else {
        path = malloc(ml + 1);
        if (!path) return NULL;
        memcpy(path, model, ml + 1);
    }
    char err[512];
    Tokenizer *t = tok_load(path, err, sizeof err);
    free(path);
    if (!t) fail(cmd, err);
    return t;
}

/* Escapes a token's bytes for the one-token-per-line listing. */
static void print_piece(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = p[i];
        if (c == '\\') {
            fputs("\\\\", stdout);
            i++;
            continue;
        }
        if (c == '\n') {
            fputs("\\n", stdout);
            i++;
            continue;
        }
        if (c == '\t') {
            fputs("\\t", stdout);
            i++;
            continue;
        }
        if (c == '\r') {
            fputs("\\r", stdout);
            i++;
            continue;
        }
        if (c < 0x20 || c == 0x7F) {
            printf("\\x%02X", c);
            i++;
            continue;
        }
        if (c < 0x80) {
            putchar(c);
            i++;
            continue;
        }
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0, k = 1;
        while (need && k < need && i + k < n && (p[i + k] & 0xC0) == 0x80) k++;
        if (need && k == need && c <= 0xF4) {
            fwrite(p + i, 1, k, stdout);
            i += k;
        } else {
            printf("\\x%02X", c);
            i++;
        }
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int run_batch(Tokenizer *t, int parse_special, int add_special, int timing) {
    double secs = 0;
    unsigned long long total = 0;
    size_t cap = 0;
    char *buf = NULL;
    unsigned long long len;
    int rc = 0;
    while (scanf("%llu", &len) == 1) {
        unsigned long long lit_len = 0; /* "<len> <K>": the record's first K bytes are literal spans */
        int c = getchar();
        if (c == ' ' && (scanf("%llu", &lit_len) != 1 || (c = getchar()) != '\n')) c = 0;
        if (c != '\n' || len > MAX_INPUT || lit_len > len) {
            rc = fail("tokenize", "--batch: bad record header");
            break;
        }
        if (len + 1 > cap) {
            char *nb = realloc(buf, (size_t)len + 1);
            if (!nb) {
                rc = fail("tokenize", "out of memory");
                break;
            }
            buf = nb;
            cap = (size_t)len + 1;
        }
        if (fread(buf, 1, (size_t)len, stdin) != len) {
            rc = fail("tokenize", "--batch: truncated record");
            break;
        }
        int32_t *ids;
        size_t n;
        char err[300];
        double t0 = now_s();
        size_t *lit = NULL, nlit = 0;
        int erc = lit_len ? tok_literal_parse(buf, (size_t)lit_len, &lit, &nlit, err, sizeof err) : 0;
        if (!erc)
            erc = tok_encode_literal(t, buf + lit_len, (size_t)(len - lit_len), parse_special, add_special, lit, nlit, &ids, &n,
                                     err, sizeof err);
        free(lit);
        secs += now_s() - t0;
        total += len;
        if (erc) {
            printf("ERR %s\n", err);
        } else {
            for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
            putchar('\n');
            free(ids);
        }
        fflush(stdout); /* one answer per record: a long-lived caller waits for each line */
    }
    free(buf);
    tok_free(t);
    if (fflush(stdout)) rc = fail("tokenize", "write error");
    if (timing) fprintf(stderr, "encode_seconds=%.6f bytes=%llu\n", secs, total);
    return rc;
}

int tokenize_cli_main(int argc, char **argv) {
    const char *cmd = "tokenize", *model = NULL, *file = NULL, *text = NULL;
    int ids_only = 0, parse_special = 1, add_special = 0, ntext = 0, batch = 0, timing = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(a, "--file") && i + 1 < argc) file = argv[++i];
        else if (!strcmp(a, "--ids-only")) ids_only = 1;
        else if (!strcmp(a, "--no-special")) parse_special = 0;
        else if (!strcmp(a, "--add-special")) add_special = 1;
        else if (!strcmp(a, "--batch")) batch = 1;
        else if (!strcmp(a, "--timing")) timing = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: colibri tokenize --model DIR [--ids-only] [--no-special] [--add-special] (TEXT | - | --file PATH)\n");
            return 0;
        } else if (!strcmp(a, "--")) {
            if (i + 1 < argc) {
                text = argv[++i];
                ntext++;
            }
        } else if (a[0] == '-' && a[1] == '-') {
            char msg[300];
            snprintf(msg, sizeof msg, "unknown option '%.200s' (see --help)", a);
            return fail(cmd, msg);
        } else {
            text = a;
            ntext++;
        }
    }
    if (batch) {
        if (ntext || file) return fail(cmd, "--batch reads records from stdin only");
        Tokenizer *t = open_model(cmd, model);
        return t ? run_batch(t, parse_special, add_special, timing) : 2;
    }
    if (ntext + (file != NULL) != 1) return fail(cmd, "give exactly one input: TEXT, - (stdin) or --file PATH");
    char *buf = NULL;
    size_t len;
    if (file || !strcmp(text, "-")) {
        FILE *f = (!file || !strcmp(file, "-")) ? stdin : fopen(file, "rb");
        if (!f) {
            char msg[600];
            snprintf(msg, sizeof msg, "cannot open %.500s: %s", file, strerror(errno));
            return fail(cmd, msg);
        }
        buf = read_stream(f, &len);
        if (f != stdin) fclose(f);
        if (!buf) return fail(cmd, errno == EFBIG ? "input larger than 1 GiB" : "cannot read input");
    } else len = strlen(text);
    Tokenizer *t = open_model(cmd, model);
    if (!t) {
        free(buf);
        return 2;
    }
    int32_t *ids;
    size_t n;
    char err[300];
    int rc = tok_encode(t, buf ? buf : text, len, parse_special, add_special, &ids, &n, err, sizeof err);
    free(buf);
    if (rc) {
        tok_free(t);
        return fail(cmd, err);
    }
    if (ids_only) {
        for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
        putchar('\n');
    } else {
        for (size_t i = 0; i < n; i++) {
            size_t bl = 0;
            const char *b = tok_token_bytes(t, ids[i], &bl);
            printf("%d\t", ids[i]);
            if (b) print_piece((const unsigned char *)b, bl);
            putchar('\n');
        }
    }
    free(ids);
    tok_free(t);
    return fflush(stdout) ? fail(cmd, "write error") : 0;
}

/* Decodes ids[0..n) through a stream into buf (grown as needed); -1 and msg on a bad id. */
static int decode_all(const Tokenizer *t, const int32_t *ids, size_t n, char **buf, size_t *len, char *msg, size_t msglen) {
    size_t cap = tok_stream_cap(t), used = 0, bl;
    for (size_t i = 0; i < n; i++)
        if (!tok_token_bytes(t, ids[i], &bl)) {
            snprintf(msg, msglen, "token id %d is not in the vocabulary (size %d)", ids[i], tok_vocab_size(t));
            return -1;
        }
    size_t size = 4 * cap;
    char *out = malloc(size);
    if (!out) {
        snprintf(msg, msglen, "out of memory");
        return -1;
    }
    TokStream st;
    tok_stream_init(&st);
    for (size_t i = 0; i <= n; i++) {
        if (size - used < cap) { /* keep room for one worst-case push */
            char *nb = grow_array(out, &size, used + cap, 1, 4 * cap);
            if (!nb) {
                free(out);
                snprintf(msg, msglen, "out of memory");
                return -1;
            }
            out = nb;
        }
        used += i < n ? tok_stream_push(t, &st, ids[i], 1, out + used, cap) : tok_stream_flush(&st, out + used, cap);
    }
    *buf = out;
    *len = used;
    return 0;
}

/* Parses ids separated by commas/whitespace; -1 and msg on garbage. */
static int parse_ids(const char *p, int32_t **ids, size_t *n, size_t *cap, char *msg, size_t msglen) {
    while (*p) {
        if (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') {
            p++;
            continue;
        }
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > 0x7fffffffL ||
            (*end && *end != ',' && *end != ' ' && *end != '\t' && *end != '\n' && *end != '\r')) {
            snprintf(msg, msglen, "bad token id near '%.40s' (expected ids like 1,2,3)", p);
            return -1;
        }
        int32_t *nv = grow_array(*ids, cap, *n + 1, sizeof *nv, 256);
        if (!nv) {
            snprintf(msg, msglen, "out of memory");
            return -1;
        }
        *ids = nv;
        (*ids)[(*n)++] = (int32_t)v;
        p = end;
    }
    return 0;
}

static int detok_batch(const Tokenizer *t) {
    size_t cap = 0, lcap = 0;
    char *line = NULL;
    int32_t *ids = NULL;
    ssize_t got;
    while ((got = getline(&line, &lcap, stdin)) >= 0) {
        size_t n = 0, len;
        char msg[200], *text;
        if (parse_ids(line, &ids, &n, &cap, msg, sizeof msg) || decode_all(t, ids, n, &text, &len, msg, sizeof msg)) {
            printf("ERR %s\n", msg);
            continue;
        }
        printf("%zu\n", len);
        fwrite(text, 1, len, stdout);
        free(text);
    }
    free(line);
    free(ids);
    return fflush(stdout) ? fail("detokenize", "write error") : 0;
}

int detokenize_cli_main(int argc, char **argv) {
    const char *cmd = "detokenize", *model = NULL;
    char *stdin_buf = NULL, msg[200];
    size_t cap = 0, n = 0, slen;
    int32_t *ids = NULL;
    int batch = 0, rc = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--model") && i + 1 < argc) {
            model = argv[++i];
            continue;
        }
        if (!strcmp(a, "--batch")) {
            batch = 1;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: colibri detokenize --model DIR IDS...   (e.g. 1,2,3; - reads ids from stdin)\n");
            free(ids);
            return 0;
        }
        if (a[0] == '-' && a[1] == '-') {
            snprintf(msg, sizeof msg, "unknown option '%.100s' (see --help)", a);
            free(ids);
            return fail(cmd, msg);
        }
        const char *p = a;
        if (!strcmp(a, "-")) {
            if (stdin_buf) {
                free(ids);
                free(stdin_buf);
                return fail(cmd, "stdin given twice");
            }
            stdin_buf = read_stream(stdin, &slen);
            if (!stdin_buf) {
                free(ids);
                return fail(cmd, "cannot read stdin");
            }
            p = stdin_buf;
        }
        if (parse_ids(p, &ids, &n, &cap, msg, sizeof msg)) {
            free(ids);
            free(stdin_buf);
            return fail(cmd, msg);
        }
    }
    free(stdin_buf);
    Tokenizer *t = open_model(cmd, model);
    if (!t) {
        free(ids);
        return 2;
    }
    if (batch) {
        rc = n ? fail(cmd, "--batch reads ids from stdin only") : detok_batch(t);
    } else {
        char *text;
        size_t len;
        if (decode_all(t, ids, n, &text, &len, msg, sizeof msg)) rc = fail(cmd, msg);
        else {
            fwrite(text, 1, len, stdout);
            free(text);
            rc = fflush(stdout) ? fail(cmd, "write error") : 0;
        }
    }
    free(ids);
    tok_free(t);
    return rc;
}
