/* The LOGPROB line stays inside its buffer whatever the logits (the ASan build catches a
 * write past it), and extreme values still format as numbers a client can parse. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/logprob.h"

/* Parses every logprob field of a line; returns how many parsed, -1 on a malformed field. */
static int parse_fields(const char *line) {
    char *copy = strdup(line), *save, *w;
    int n = 0, field = 0;
    for (w = strtok_r(copy, " ", &save); w; w = strtok_r(NULL, " ", &save), field++) {
        char *lp = NULL, *end;
        if (field == 3) lp = w;                       /* LOGPROB id token LP hex count */
        else if (field >= 6) lp = strchr(w, ':') + 1; /* tok:LP:hex */
        if (!lp) continue;
        strtod(lp, &end);
        if (end == lp || (*end != 0 && *end != ':')) {
            n = -1;
            break;
        }
        n++;
    }
    free(copy);
    return n;
}

void test_logprob(void) {
    const float inf = INFINITY, nan = NAN;
    const float sets[][8] = {
        {0, 1, 2, 3, 4, 5, 6, 7},
        {-1e38f, -1e38f, -1e38f, -1e38f, -1e38f, -1e38f, -1e38f, FLT_MAX},
        {-FLT_MAX, FLT_MAX, -FLT_MAX, FLT_MAX, -FLT_MAX, FLT_MAX, -FLT_MAX, FLT_MAX},
        {-inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf},
        {inf, -inf, 0, 1, -1e38f, 2, 3, 4},
        {nan, 0, 1, nan, -inf, inf, FLT_MAX, -FLT_MAX},
    };
    const char *id = "a-request-id-that-is-sixty-four-bytes-long-0123456789abcdefghij";
    for (size_t s = 0; s < sizeof sets / sizeof *sets; s++) {
        for (int k = 0; k <= LOGPROB_MAX_TOP; k += 4) {
            size_t cap = logprob_line_cap(strlen(id), k, 0);
            char *line = malloc(cap); /* exactly the promised size: an overrun is an ASan error */
            long n = logprob_format(line, cap, id, sets[s], 8, 7, k, NULL);
            CHECK(n > 0 && (size_t)n < cap && strlen(line) == (size_t)n, "set %zu k %d: %ld of %zu", s, k, n, cap);
            CHECK(!strncmp(line, "LOGPROB ", 8), "set %zu: '%s'", s, line);
            int want = 1 + (k < 8 ? k : 8);
            CHECK(parse_fields(line) == want, "set %zu k %d: fields of '%s'", s, k, line);
            free(line);
        }
    }
    char line[256];
    CHECK(logprob_format(line, sizeof line, "r1", sets[0], 8, 7, 2, NULL) > 0, "plain");
    CHECK(!strcmp(line, "LOGPROB r1 7 -0.458340 - 2 7:-0.458340:- 6:-1.458340:-"), "plain format: '%s'", line);
    CHECK(logprob_format(line, sizeof line, "r1", sets[1], 8, 0, 1, NULL) > 0 && strstr(line, " 0 -4.402823e+38 "),
          "huge difference in exponent form: '%s'", line);
    char small[20];
    CHECK(logprob_format(small, sizeof small, "r1", sets[2], 8, 0, 20, NULL) == -1 && strlen(small) < sizeof small,
          "too small a buffer is reported, not overrun");
}
