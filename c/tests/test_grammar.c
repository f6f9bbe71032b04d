/* GBNF parsing (errors name the byte), the matcher (UTF-8 inside classes, completion), token
 * masks against a token-by-token check, added tokens, EOS and the completion budget. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "grammar/grammar.h"

static Grammar *parse(const char *s, char *err) { return grammar_parse(s, strlen(s), err, 256); }

static int accepts(const char *gram, const char *text, int *complete) {
    char err[256];
    Grammar *g = parse(gram, err);
    if (!g) {
        fprintf(stderr, "%s\n", err);
        return -2;
    }
    GrammarRun *r = grammar_run_new(g, NULL);
    size_t at;
    int rc = r ? grammar_accept_bytes(r, text, strlen(text), &at) : -3;
    if (complete) *complete = r && rc == 0 ? grammar_complete(r) : 0;
    grammar_run_free(r);
    grammar_free(g);
    return rc;
}

static void test_errors(void) {
    struct {
        const char *text, *needle;
    } bad[] = {
        {"root ::= foo", "at byte 9: rule 'foo' is used but never defined"},
        {"a ::= \"x\"", "no 'root' rule"},
        {"root ::= root \"a\" | \"b\"", "rule 'root' can reach itself without consuming input"},
        {"root ::= x\nx ::= \"a\"? x \"b\" | \"c\"", "rule 'x' can reach itself"},
        {"root ::= (\"a\"?)*", "can match nothing, forever"},
        {"root ::= \"abc", "at byte 9: unterminated string literal"},
        {"root ::= \"\\q\"", "unknown escape"},
        {"root ::= []", "empty character class"},
        {"root ::= \"a\" root", "rule 'root' can never finish"},
        {"root ::= \"a\"{3,2}", "maximum below its minimum"},
        {"root ::= \"a\"{99999}", "above the limit"},
        {"root ::= \"a\"\nroot ::= \"b\"", "at byte 13: rule 'root' is defined twice"},
        {"root ::= (\"a\" ", "unclosed '('"},
        {"root ::= \"a\" )", "unmatched ')'"},
        {"root ::= \"\xff\"", "invalid UTF-8"},
        {"root ::= [z-a]", "backwards"},
        {"root ::= \"a\" @", "unexpected '@'"},
        {"root \"a\"", "expected '::='"},
        {"root ::= [\\uD800-\\uDFFF]", "can never finish"},
        {"root ::= [^\\x00-\\U0010FFFF]", "can never finish"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char err[256];
        Grammar *g = parse(bad[i].text, err);
        CHECK(!g && strstr(err, bad[i].needle) && !strncmp(err, "grammar: at byte ", 17), "'%s' -> '%s'", bad[i].text,
              g ? "ok" : err);
        grammar_free(g);
    }
}

static void test_matching(void) {
    int c;
    const char *json_list = "root ::= \"[\" ws (item (\",\" ws item)*)? \"]\"\nitem ::= [0-9]+ ws\nws ::= [ ]*\n";
    CHECK(accepts(json_list, "[1, 22,3 ]", &c) == 0 && c, "list");
    CHECK(accepts(json_list, "[1,", &c) == 0 && !c, "prefix is not complete");
    CHECK(accepts(json_list, "[1,]", &c) == -1, "bad list");
    /* rules continue on the next line; comments; alternatives after a newline */
    const char *multi = "root ::= \"a\"\n   \"b\" # comment\n  | \"c\"\nother ::= \"z\"\n";
    CHECK(accepts(multi, "ab", &c) == 0 && c, "continued sequence");
    CHECK(accepts(multi, "c", &c) == 0 && c, "continued alternation");
    CHECK(accepts("root ::= [^\"\\\\]{2,3} \"!\"", "xy!", &c) == 0 && c, "negated class, bounded repeat");
    CHECK(accepts("root ::= [^\"\\\\]{2,3} \"!\"", "x!", &c) == 0 && !c, "below the minimum");
    CHECK(accepts("root ::= [^\"\\\\]{2,3} \"!\"", "wxyz", &c) == -1, "above the maximum");
    CHECK(accepts("root ::= \"\" | \"a\"", "", &c) == 0 && c, "empty literal");
    /* UTF-8: classes are over code points; a sequence may stop half-way if it can still match */
    const char *greek = "root ::= [α-ω]+ \"!\"";
    CHECK(accepts(greek, "αβγ!", &c) == 0 && c, "greek");
    CHECK(accepts(greek, "\xce", &c) == 0 && !c, "a lead byte that can become a Greek letter");
    CHECK(accepts(greek, "\xc3\xa9", &c) == -1, "é is outside the class");
    CHECK(accepts(greek, "\xc3", &c) == -1, "a lead byte that cannot become a Greek letter");
    CHECK(accepts("root ::= .", "\xed\xa0\x80", &c) == -1, "an encoded surrogate is not a character");
    CHECK(accepts("root ::= .", "\xe0\x80\xaf", &c) == -1, "overlong encodings are refused");
    CHECK(accepts("root ::= \"\\u00e9\\U0001F600\"", "é😀", &c) == 0 && c, "escapes");
    CHECK(accepts("root ::= x*\nx ::= \"ab\" | \"a\"", "aababa", &c) == 0 && c, "ambiguous alternatives");
}

/* A small byte-level vocabulary: every single byte plus some longer pieces. */
static const char *extra[] = {"true", "false", "\"", "ab", "{\"", "\":", "tr", "\xc3\xa9", "\xce\xb1\xce", "null", ", "};
enum { NEXTRA = sizeof extra / sizeof *extra, ADDED = 256 + NEXTRA, ADDED2, EOS, NONE, VOCAB };

static GrammarVocab *vocab(void) {
    const char *bytes[VOCAB];
    size_t len[VOCAB];
    uint8_t kind[VOCAB];
    static char single[256];
    for (int i = 0; i < 256; i++) {
        single[i] = (char)i;
        bytes[i] = &single[i];
        len[i] = 1;
        kind[i] = GV_TEXT;
    }
    for (int i = 0; i < NEXTRA; i++) {
        bytes[256 + i] = extra[i];
        len[256 + i] = strlen(extra[i]);
        kind[256 + i] = GV_TEXT;
    }
    bytes[ADDED] = "<tool_call>";
    len[ADDED] = 11;
    kind[ADDED] = GV_ADDED;
    bytes[ADDED2] = "<|im_end|>";
    len[ADDED2] = 10;
    kind[ADDED2] = GV_ADDED;
    bytes[EOS] = "</s>";
    len[EOS] = 4;
    kind[EOS] = GV_EOS;
    bytes[NONE] = "";
    len[NONE] = 0;
    kind[NONE] = GV_NONE;
    return grammar_vocab_new(VOCAB, bytes, len, kind);
}

static int bit(const uint32_t *m, int t) { return (m[t >> 5] >> (t & 31)) & 1; }

/* The mask equals grammar_allows token by token, at every step of a path through the grammar. */
static void mask_agrees(GrammarVocab *v, const char *gram, const int *path, int n) {
    char err[256];
    Grammar *g = parse(gram, err);
    CHECK(g, "%s", err);
    if (!g) return;
    GrammarRun *r = grammar_run_new(g, v);
    for (int step = 0; r && step <= n; step++) {
        for (int budget = -1; budget <= 3; budget += 4) {
            const uint32_t *m;
            int count = grammar_mask(r, budget, &m), same = 1, seen = 0;
            for (int t = 0; t < VOCAB; t++) {
                int a = grammar_allows(r, t, budget);
                seen += a;
                if (a != bit(m, t)) {
                    same = 0;
                    fprintf(stderr, "token %d: allows %d, mask %d\n", t, a, bit(m, t));
                }
            }
            CHECK(same && count == seen, "mask of step %d (budget %d) of '%s': count %d vs %d", step, budget, gram, count, seen);
        }
        if (step < n) CHECK(grammar_accept(r, path[step]) == 0, "step %d token %d", step, path[step]);
    }
    grammar_run_free(r);
    grammar_free(g);
}

static void test_masks(void) {
    GrammarVocab *v = vocab();
    CHECK(v && grammar_vocab_nodes(v) > 256, "vocab");
    if (!v) return;
    const char *obj = "root ::= \"{\" ws \"\\\"a\\\":\" ws val ws \"}\"\nval ::= \"true\" | \"false\" | \"null\" | str\n"
                      "str ::= \"\\\"\" [^\"]{0,4} \"\\\"\"\nws ::= \" \"?\n";
    int path[] = {256 + 4, 'a', 256 + 5, ' ', 256 + 2, 256 + 7, 256 + 3, '"', '}'};
    mask_agrees(v, obj, path, sizeof path / sizeof *path);
    const char *greek = "root ::= [α-γ]+";
    int gpath[] = {256 + 8, 0xb2};
    mask_agrees(v, greek, gpath, 2);

    char err[256];
    Grammar *g = parse("root ::= \"<tool_call>\" [a-z]+", err);
    GrammarRun *r = grammar_run_new(g, v);
    CHECK(r && grammar_allows(r, ADDED, -1) && !grammar_allows(r, ADDED2, -1), "added token spelled by a literal");
    CHECK(r && grammar_allows(r, '<', -1), "or its text byte by byte");
    CHECK(r && !grammar_allows(r, EOS, -1) && !grammar_allows(r, NONE, -1), "no EOS before complete");
    CHECK(r && grammar_accept(r, ADDED) == 0 && grammar_accept(r, 'x') == 0 && grammar_complete(r) && !grammar_finished(r),
          "accept");
    CHECK(r && grammar_allows(r, EOS, -1), "EOS once complete");
    grammar_run_free(r);
    grammar_free(g);

    g = parse("root ::= [a-z]+ \"<tool_call>\"", err);
    r = grammar_run_new(g, v);
    CHECK(r && !grammar_allows(r, ADDED, -1), "an added token only where its text fits");
    grammar_run_free(r);
    grammar_free(g);

    /* finished: complete and nothing may follow */
    g = parse("root ::= \"ab\"", err);
    r = grammar_run_new(g, v);
    CHECK(r && grammar_min_bytes(r) == 2 && grammar_accept(r, 256 + 3) == 0 && grammar_finished(r), "finished");
    grammar_run_free(r);
    grammar_free(g);

    /* the budget: with 2 bytes left, a list may not open another item it cannot close */
    g = parse("root ::= \"[\" (\"xy\" (\",\" \"xy\")*)? \"]\"", err);
    r = grammar_run_new(g, v);
    CHECK(r && grammar_accept_bytes(r, "[xy", 3, NULL) == 0, "list start");
    CHECK(r && grammar_allows(r, ',', 3) && !grammar_allows(r, ',', 2) && grammar_allows(r, ']', 0), "budget");
    const uint32_t *m;
    CHECK(r && grammar_mask(r, 2, &m) == 1 && bit(m, ']'), "budget mask keeps only the close");
    grammar_run_free(r);
    grammar_free(g);

    /* inside a character the budget counts only the bytes still missing */
    g = parse("root ::= [a-z] | \"\u03a9x\"", err);
    r = grammar_run_new(g, v);
    CHECK(r && grammar_min_bytes(r) == 1 && grammar_allows(r, 0xCE, 2) && !grammar_allows(r, 0xCE, 1), "budget mid-character");
    CHECK(r && grammar_accept(r, 0xCE) == 0 && grammar_min_bytes(r) == 2, "min bytes mid-character: %d",
          r ? grammar_min_bytes(r) : -1);
    grammar_run_free(r);
    grammar_free(g);
    grammar_vocab_free(v);
}

/* A vocabulary that cannot spell what the grammar needs: the mask is empty while the output is
 * incomplete, which the engine reports as a dead end instead of forcing a token. */
static void test_dead_end(void) {
    const char *bytes[] = {"a", "b", "</s>"};
    size_t len[] = {1, 1, 4};
    uint8_t kind[] = {GV_TEXT, GV_TEXT, GV_EOS};
    GrammarVocab *v = grammar_vocab_new(3, bytes, len, kind);
    char err[256];
    Grammar *g = parse("root ::= \"a\" \"z\"", err);
    GrammarRun *r = v && g ? grammar_run_new(g, v) : NULL;
    const uint32_t *m;
    CHECK(r && grammar_mask(r, -1, &m) == 1 && grammar_accept(r, 0) == 0, "a fits");
    CHECK(r && grammar_mask(r, -1, &m) == 0 && !grammar_complete(r), "nothing spells z: a dead end, detected");
    grammar_run_free(r);
    grammar_free(g);
    grammar_vocab_free(v);
}

/* Nested repetitions of the same thing are ambiguous at every character: the work limit ends
 * the run (reported as failed) instead of letting it run for minutes. */
static void test_work_limit(void) {
    char err[256], text[200];
    Grammar *g = parse("root ::= [a-c]+++++++++++++++++++++++++ \"!\"", err);
    GrammarRun *r = g ? grammar_run_new(g, NULL) : NULL;
    if (r) grammar_run_set_work_limit(r, 20000);
    memset(text, 'a', sizeof text);
    CHECK(r && grammar_accept_bytes(r, text, sizeof text, NULL) == -1 && grammar_run_failed(r), "work limit");
    grammar_run_free(r);
    grammar_free(g);
}

/* The mask cache keeps at most its byte bound (the engine's share of the RAM budget): past it the
 * masks are dropped and rebuilt on use, and the masks themselves stay the same. */
static int masks_built_over(GrammarVocab *v, size_t bound, int *last) {
    char err[256];
    Grammar *g = parse("root ::= (\"a\" \"b\")*", err);
    GrammarRun *r = g ? grammar_run_new(g, v) : NULL;
    if (!r) {
        grammar_free(g);
        return -1;
    }
    grammar_run_set_mask_cache(r, bound);
    const uint32_t *m;
    for (int i = 0; i < 6; i++) { /* states alternate: before an a, before a b */
        *last = grammar_mask(r, -1, &m);
        grammar_accept_bytes(r, i & 1 ? "b" : "a", 1, NULL);
    }
    GrammarStats st;
    grammar_stats(r, &st);
    grammar_run_free(r);
    grammar_free(g);
    return (int)st.masks_built;
}

static void test_mask_cache_bound(void) {
    GrammarVocab *v = vocab();
    if (!v) return;
    int last_big, last_small;
    int big = masks_built_over(v, GRAMMAR_MASK_CACHE_DEFAULT, &last_big);
    int none = masks_built_over(v, 0, &last_small);
    CHECK(big == 2, "two states, two masks under the default bound: %d", big);
    CHECK(none == 6, "a zero bound keeps none: every mask rebuilt, %d", none);
    CHECK(last_big == last_small && last_big > 0, "the same mask either way: %d vs %d", last_big, last_small);
    grammar_vocab_free(v);
}

void test_grammar(void) {
    test_mask_cache_bound();
    test_dead_end();
    test_work_limit();
    test_errors();
    test_matching();
    test_masks();
}
