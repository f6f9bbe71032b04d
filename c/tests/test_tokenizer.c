/* Tokenizer unit tests on small synthetic tokenizer.json documents: BPE merges (string and
 * pair forms), rank-BPE, ignore_merges, added tokens, templates, NFC, the regex subset,
 * streaming decode, and hostile inputs (every one must fail cleanly, never crash). The
 * comparison against HF tokenizers on real checkpoints lives in tests/test_tokenizer.py. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tok_regex.h"
#include "tokenizer/tokenizer.h"

/* A byte-level vocab: ids 0..255 are the single bytes, then the given multi-char tokens
 * (written in byte-level form, e.g. "Ġ" for a space). */
static char *make_json(const char **extra, int nextra, const char *merges, const char *more) {
    size_t cap = 1 << 16, n = 0;
    char *s = malloc(cap);
    n += (size_t)snprintf(s + n, cap - n, "{\"version\":\"1.0\",%s\"model\":{\"type\":\"BPE\",\"vocab\":{", more ? more : "");
    for (int b = 0; b < 256; b++) {
        unsigned char u[4];
        uint32_t cp = tok_byte_char((unsigned)b);
        size_t k = u8_encode(u, cp);
        n += (size_t)snprintf(s + n, cap - n, "%s\"", b ? "," : "");
        if (cp == '"' || cp == '\\') s[n++] = '\\';
        memcpy(s + n, u, k);
        n += k;
        n += (size_t)snprintf(s + n, cap - n, "\":%d", b);
    }
    for (int i = 0; i < nextra; i++) n += (size_t)snprintf(s + n, cap - n, ",\"%s\":%d", extra[i], 256 + i);
    n += (size_t)snprintf(s + n, cap - n, "}%s%s}}", merges ? ",\"merges\":" : "", merges ? merges : "");
    return s;
}

static Tokenizer *load_str(const char *json, char *err) { return tok_load_buffer(json, strlen(json), err, 256); }

static int encode_eq(const Tokenizer *t, const char *text, int ps, int as, const int32_t *want, size_t nwant) {
    int32_t *ids;
    size_t n;
    char err[256];
    if (tok_encode(t, text, strlen(text), ps, as, &ids, &n, err, sizeof err)) {
        fprintf(stderr, "encode failed: %s\n", err);
        return 0;
    }
    int ok = n == nwant && (!n || !memcmp(ids, want, n * sizeof *ids));
    if (!ok) {
        fprintf(stderr, "encode '%s' ->", text);
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    free(ids);
    return ok;
}

#define IDS(...) (const int32_t[]){__VA_ARGS__}, sizeof((const int32_t[]){__VA_ARGS__}) / sizeof(int32_t)

static int encode_lit_eq(const Tokenizer *t, const char *text, const char *spans, const int32_t *want, size_t nwant) {
    size_t *lit = NULL, nlit = 0, n = 0;
    int32_t *ids = NULL;
    char err[256];
    if (tok_literal_parse(spans, strlen(spans), &lit, &nlit, err, sizeof err) ||
        tok_encode_literal(t, text, strlen(text), 1, 0, lit, nlit, &ids, &n, err, sizeof err)) {
        fprintf(stderr, "literal encode '%s' [%s] failed: %s\n", text, spans, err);
        free(lit);
        return 0;
    }
    int ok = n == nwant && !memcmp(ids, want, n * sizeof *ids);
    if (!ok) {
        fprintf(stderr, "literal encode '%s' [%s] ->", text, spans);
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    free(lit);
    free(ids);
    return ok;
}

/* Literal spans with what the real tokenizers lack: lstrip/rstrip next to a span, and a
 * normalized added token under NFC (offsets move when the text before the span composes). */
static void test_literal(void) {
    char err[256];
    char *j =
        make_json(NULL, 0, "[]",
                  "\"normalizer\":{\"type\":\"NFC\"},"
                  "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false},"
                  "\"added_tokens\":[{\"id\":256,\"content\":\"<a>\",\"special\":true,\"lstrip\":true,\"normalized\":false},"
                  "{\"id\":257,\"content\":\"<b>\",\"special\":false,\"normalized\":true},"
                  "{\"id\":258,\"content\":\"<c>\",\"special\":true,\"rstrip\":true,\"normalized\":false}],");
    Tokenizer *t = load_str(j, err);
    CHECK(t != NULL, "%s", err);
    if (t) {
        CHECK(encode_lit_eq(t, "x <a><a>", "5-8", IDS('x', 256, '<', 'a', '>')), "special token kept as text");
        CHECK(encode_lit_eq(t, "x  <a>", "1-2", IDS('x', ' ', 256)), "lstrip stops at a span");
        CHECK(encode_lit_eq(t, "<c> \t", "4-5", IDS(258, '\t')), "rstrip stops at a span");
        CHECK(encode_lit_eq(t, "<a>", "0-1", IDS('<', 'a', '>')), "no token across a span's edge");
        CHECK(encode_lit_eq(t, "e\xCC\x81<b><b>", "3-6", IDS(0xC3, 0xA9, '<', 'b', '>', 257)),
              "normalized token kept as text after NFC moved the offsets");
        CHECK(encode_lit_eq(t, "e\xCC\x81<b><b>", "6-9", IDS(0xC3, 0xA9, 257, '<', 'b', '>')), "second one kept");
        size_t *lit, nlit, n;
        int32_t *ids;
        size_t bad[] = {2, 1};
        CHECK(tok_encode_literal(t, "abc", 3, 1, 0, bad, 1, &ids, &n, err, sizeof err) == -1 && strstr(err, "literal span"),
              "reversed span refused: %s", err);
        CHECK(tok_literal_parse("1-2,", 4, &lit, &nlit, err, sizeof err) == -1, "trailing comma refused");
        tok_free(t);
    }
    free(j);
}

static void test_bpe(void) {
    const char *extra[] = {"he", "ll", "hell", "hello", "Ġw", "Ġwo"};
    char err[256];
    /* "hell" comes from he+ll (rank 2), so rank order matters: ll before he. */
    char *j = make_json(extra, 6, "[\"l l\",\"h e\",\"he ll\",\"hell o\",\"Ġ w\",\"Ġw o\"]",
                        "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"
                        "\"decoder\":{\"type\":\"ByteLevel\"},");
    Tokenizer *t = load_str(j, err);
    CHECK(t != NULL, "%s", err);
    if (t) {
        CHECK(encode_eq(t, "hello world", 1, 0, IDS(259, 261, 'r', 'l', 'd')), "merges");
        CHECK(encode_eq(t, "hellhello", 1, 0, IDS(258, 259)), "one piece, two words");
        CHECK(encode_eq(t, "", 1, 0, NULL, 0), "empty input");
        CHECK(tok_vocab_size(t) == 262, "vocab size %d", tok_vocab_size(t));
        CHECK(tok_find(t, "Ġwo") == 261 && tok_find(t, "nope") == -1, "tok_find");
        size_t len;
        const char *b = tok_token_bytes(t, 261, &len);
        CHECK(b && len == 3 && !memcmp(b, " wo", 3), "token bytes undo the byte map");
        CHECK(tok_token_bytes(t, 262, &len) == NULL && tok_token_bytes(t, -1, &len) == NULL, "bad ids");
        /* NUL and control bytes are ordinary text */
        int32_t *ids;
        size_t n;
        CHECK(tok_encode(t, "a\0b", 3, 1, 0, &ids, &n, err, sizeof err) == 0 && n == 3 && ids[1] == 0, "NUL byte");
        if (n) free(ids);
        CHECK(tok_encode(t, "ab\xC3(", 4, 1, 0, &ids, &n, err, sizeof err) == -1 && strstr(err, "offset 2"), "invalid UTF-8: %s",
              err);
        CHECK(tok_encode(t, "\xED\xA0\x80", 3, 1, 0, &ids, &n, err, sizeof err) == -1, "surrogate rejected");
        CHECK(tok_encode(t, "\xC0\xAF", 2, 1, 0, &ids, &n, err, sizeof err) == -1, "overlong rejected");
        tok_free(t);
    }
    free(j);
    /* pair form of merges gives the same model */
    j = make_json(extra, 6, "[[\"l\",\"l\"],[\"h\",\"e\"],[\"he\",\"ll\"],[\"hell\",\"o\"],[\"Ġ\",\"w\"],[\"Ġw\",\"o\"]]",
                  "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":true},");
    t = load_str(j, err);
    CHECK(t != NULL, "%s", err);
    if (t) {
        CHECK(encode_eq(t, "world", 1, 0, IDS(261, 'r', 'l', 'd')), "add_prefix_space + pair merges");
        tok_free(t);
    }
    free(j);
    /* rank-BPE (no merges): lowest id of a concatenation first: "ll" (257) before "he" (256)
     * would not matter here, but "hell" (258) needs he+ll, both present */
    j = make_json(extra, 6, NULL, "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},");
    t = load_str(j, err);
    CHECK(t != NULL, "%s", err);
    if (t) {
        CHECK(encode_eq(t, "hello wo", 1, 0, IDS(259, 261)), "rank mode");
        tok_free(t);
    }
    free(j);
    /* ignore_merges: a whole piece in the vocab wins even without a merge path */
    const char *extra2[] = {"xyz"};
    j = make_json(extra2, 1, "[]", "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},");
    char *k = strstr(j, "\"type\":\"BPE\"");
    char *j2 = malloc(strlen(j) + 32);
    sprintf(j2, "%.*s\"ignore_merges\":true,%s", (int)(k - j), j, k);
    t = load_str(j2, err);
    CHECK(t != NULL, "%s", err);
    if (t) {
        CHECK(encode_eq(t, "xyz xyzz", 1, 0, IDS(256, ' ', 'x', 'y', 'z', 'z')), "ignore_merges");
        tok_free(t);
    }
    free(j);
    free(j2);
}

static void test_added_and_template(void) {
    const char *extra[] = {"he"};
    char err[256];
    char *j = make_json(
        extra, 1, "[\"h e\"]",
        "\"added_tokens\":["
        "{\"id\":300,\"content\":\"<s>\",\"special\":true,\"normalized\":false},"
        "{\"id\":301,\"content\":\"<think>\",\"special\":false,\"normalized\":false},"
        "{\"id\":302,\"content\":\"<thinker>\",\"special\":true,\"normalized\":false}],"
        "\"normalizer\":{\"type\":\"NFC\"},"
        "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"
        "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
        "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[257],\"tokens\":[\"<s>\"]}}},"
        "\"decoder\":{\"type\":\"ByteLevel\"},");
    Tokenizer *t = load_str(j, err);
    CHECK(t != NULL, "%s", err);
    if (t) {
        /* HF ignores the JSON ids of added tokens: new ones count up from the vocab size */
        CHECK(tok_find(t, "<s>") == 257 && tok_find(t, "<think>") == 258 && tok_find(t, "<thinker>") == 259, "added ids");
        CHECK(encode_eq(t, "he<s>he", 1, 0, IDS(256, 257, 256)), "special parsed");
        CHECK(encode_eq(t, "<s>", 0, 0, IDS('<', 's', '>')), "special as text");
        CHECK(encode_eq(t, "<think><thinker>", 0, 0, IDS(258, '<', 't', 'h', 'i', 'n', 'k', 'e', 'r', '>')),
              "non-special always parsed");
        CHECK(encode_eq(t, "<thinker>", 1, 0, IDS(259)), "longest match first");
        CHECK(encode_eq(t, "he", 1, 1, IDS(257, 256)), "template adds BOS");
        CHECK(encode_eq(t, "e\xCC\x81", 1, 0, IDS(0xC3, 0xA9)), "NFC composes e + acute");
        CHECK(tok_is_special(t, 257) && !tok_is_special(t, 258) && !tok_is_special(t, 256), "special flags");
        /* streaming: special tokens hidden unless asked, split characters held back */
        char out[256];
        TokStream st;
        tok_stream_init(&st);
        size_t n = tok_stream_push(t, &st, 257, 0, out, sizeof out);
        CHECK(n == 0, "special hidden");
        n = tok_stream_push(t, &st, 257, 1, out, sizeof out);
        CHECK(n == 3 && !memcmp(out, "<s>", 3), "special rendered");
        n = tok_stream_push(t, &st, 0xE4, 0, out, sizeof out); /* first byte of U+4F60 */
        CHECK(n == 0 && st.npending == 1, "lead byte held");
        n = tok_stream_push(t, &st, 0xBD, 0, out, sizeof out);
        CHECK(n == 0 && st.npending == 2, "continuation held");
        n = tok_stream_push(t, &st, 257, 0, out, sizeof out); /* skipped special does not break it */
        n = tok_stream_push(t, &st, 0xA0, 0, out, sizeof out);
        CHECK(n == 3 && !memcmp(out, "\xE4\xBD\xA0", 3), "character completed");
        n = tok_stream_push(t, &st, 0xE4, 0, out, sizeof out);
        n = tok_stream_push(t, &st, 'a', 0, out, sizeof out);
        CHECK(n == 4 && !memcmp(out,
                                "\xEF\xBF\xBD"
                                "a",
                                4),
              "broken sequence -> U+FFFD then the byte");
        n = tok_stream_push(t, &st, 0xF0, 0, out, sizeof out);
        n += tok_stream_push(t, &st, 0x9F, 0, out + n, sizeof out - n);
        n += tok_stream_flush(&st, out + n, sizeof out - n);
        CHECK(n == 3 && !memcmp(out, "\xEF\xBF\xBD", 3) && st.npending == 0, "incomplete tail flushed as one U+FFFD");
        n = tok_stream_push(t, &st, 0xFF, 0, out, sizeof out);
        n += tok_stream_push(t, &st, 0x80, 0, out + n, sizeof out - n);
        n += tok_stream_push(t, &st, 0xED, 0, out + n, sizeof out - n);
        n += tok_stream_push(t, &st, 0xA0, 0, out + n, sizeof out - n);
        CHECK(n == 12, "each invalid byte is one U+FFFD (Rust from_utf8_lossy): %zu", n);
        CHECK(tok_stream_cap(t) >= 3 * tok_max_token_bytes(t), "stream cap");
        tok_free(t);
    }
    free(j);
}

typedef struct {
    const char *pat, *text, *want;
} RxCase;

static void test_regex(void) {
    /* want: the matches joined by '|' */
    static const RxCase cases[] = {
        {"\\s+(?!\\S)|\\s+", "a   b ", "  | | "},
        {"\\s*[\\r\\n]+", "x \n \ny", " \n \n"},
        {"(?i:'s|'t)", "IT'S it'T x'\xC5\xBF", "'S|'T|'\xC5\xBF"},
        {"\\p{N}{1,3}", "1234567", "123|456|7"},
        {"[^\\r\\n\\p{L}\\p{N}]?\\p{L}+", " hello,world", " hello|,world"},
        {"[\\p{Lu}]*[\\p{Ll}]+", "HTTPServer ABC xY", "HTTPServer|x"},
        {"[\xe4\xb8\x80-\xe9\xbe\xa5]+",
         "ab\xe4\xbd\xa0\xe5\xa5\xbd"
         "c",
         "\xe4\xbd\xa0\xe5\xa5\xbd"},
        {"\\d+?x|a{2,}?|b{,2}", "12x aaa bbb", "12x|aa|bb|b"},
        {"^\\w+|\\w+$", "ab cd\nef gh", "ab|cd|ef|gh"},
        {"[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+", "x.foo-bar[baz", ".foo|-bar|[baz"},
        {".", "\n", ""},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char err[160];
        TokRegex *re = tok_regex_compile(cases[c].pat, strlen(cases[c].pat), err, sizeof err);
        CHECK(re != NULL, "compile %s: %s", cases[c].pat, err);
        if (!re) continue;
        char got[256] = "";
        size_t pos = 0, ms, me, n = strlen(cases[c].text);
        uint64_t steps = 100000;
        while (pos <= n && tok_regex_search(re, (const unsigned char *)cases[c].text, n, pos, &ms, &me, &steps) == 1) {
            if (me == ms) {
                pos = me + 1;
                continue;
            }
            if (*got) strcat(got, "|");
            strncat(got, cases[c].text + ms, me - ms);
            pos = me;
        }
        CHECK(!strcmp(got, cases[c].want), "/%s/ on '%s': got '%s' want '%s'", cases[c].pat, cases[c].text, got, cases[c].want);
        tok_regex_free(re);
    }
    static const char *refused[] = {"\\p{Han}+",     "(?<=a)b", "(ab)+", "a**", "[[:alpha:]]", "\\1",
                                    "(?i:\xc3\xa9)", "(a",      "a)",    "[a-", "\\"};
    for (size_t c = 0; c < sizeof refused / sizeof *refused; c++) {
        char err[160] = "";
        TokRegex *re = tok_regex_compile(refused[c], strlen(refused[c]), err, sizeof err);
        CHECK(re == NULL && *err, "'%s' must be refused", refused[c]);
        tok_regex_free(re);
    }
    /* pathological backtracking hits the budget instead of hanging */
    char err[160];
    TokRegex *re = tok_regex_compile("\\s*\\s*\\s*\\s*x", 14, err, sizeof err);
    char spaces[3001];
    memset(spaces, ' ', 3000);
    spaces[3000] = 0;
    uint64_t steps = 1000000;
    size_t ms, me;
    CHECK(re && tok_regex_search(re, (const unsigned char *)spaces, 3000, 0, &ms, &me, &steps) == -1, "budget");
    tok_regex_free(re);
}

static void test_hostile(void) {
    static const struct {
        const char *json, *needle;
    } bad[] = {
        {"", "JSON"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]", "JSON"},
        {"[1,2]", "object"},
        {"{}", "model"},
        {"{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", "Unigram"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":[]}}", "vocab"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}}", "bad id"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":99999999999},\"merges\":[]}}", "bad id"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":1.5},\"merges\":[]}}", "bad id"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b\"]}}", "not in vocab"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a a a\"]}}", "merges"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[7]}}", "merges"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"\xff\":0},\"merges\":[]}}", "UTF-8"},
        {"{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\p{Han}+\"},\"behavior\":\"Isolated\",\"invert\":false},"
         "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
         "\\p{Han}+"},
        {"{\"pre_tokenizer\":{\"type\":\"Metaspace\"},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
         "Metaspace"},
        {"{\"normalizer\":{\"type\":\"NFKC\"},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}", "NFKC"},
        {"{\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<x>\",\"type_id\":0}},"
         "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{}},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
         "<x>"},
        /* found by fuzz_tokenizer_load: id 1 is below the largest id but no token has it, so
         * encoding with add_special emitted an id that decodes to nothing */
        {"{\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<x>\",\"type_id\":0}},"
         "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{\"<x>\":{\"id\":\"<x>\",\"ids\":[1]}}},"
         "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":2},\"merges\":[]}}",
         "token id 1 is not in the vocabulary"},
        {"{\"added_tokens\":[{\"id\":0}],\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}", "content"},
        {"{\"version\":\"2.0\",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}", "version"},
        {"{\"model\":{\"type\":\"BPE\",\"dropout\":0.1,\"vocab\":{\"a\":0},\"merges\":[]}}", "dropout"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char err[256] = "";
        Tokenizer *t = tok_load_buffer(bad[i].json, strlen(bad[i].json), err, sizeof err);
        CHECK(t == NULL && strstr(err, bad[i].needle), "case %zu: got '%s', want '%s'", i, err, bad[i].needle);
        tok_free(t);
    }
    /* deep nesting and truncations of a valid document never crash */
    char *deep = malloc(200001);
    memset(deep, '[', 200000);
    deep[200000] = 0;
    char err[256];
    CHECK(tok_load_buffer(deep, 200000, err, sizeof err) == NULL, "deep nesting");
    free(deep);
    const char *extra[] = {"he"};
    char *j = make_json(extra, 1, "[\"h e\"]", NULL);
    size_t n = strlen(j);
    int loaded = 0;
    for (size_t cut = 0; cut < n; cut += 7) {
        Tokenizer *t = tok_load_buffer(j, cut, err, sizeof err);
        loaded += t != NULL;
        tok_free(t);
    }
    CHECK(loaded == 0, "truncated documents must fail");
    free(j);
    CHECK(tok_load("/nonexistent/tokenizer.json", err, sizeof err) == NULL && strstr(err, "cannot open"), "missing file");
}

void test_tokenizer(void) {
    test_bpe();
    test_added_and_template();
    test_regex();
    test_hostile();
    test_literal();
}
