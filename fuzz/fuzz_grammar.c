/* grammar_parse on arbitrary bytes (the `grammar=` text of a SUBMIT); a grammar that parses is
 * then driven: the bytes after the first NUL are fed through the matcher, and token masks over
 * a small byte-level vocabulary are taken along the way, checked against token-by-token checks. */
#include "grammar/grammar.h"
#include "harness.h"

static const char *pieces[] = {"\"", "{\"", "\":", "true", "null", ", ", "ab", "\xc3\xa9", "\xce", "\xce\xb1"};
enum { NP = sizeof pieces / sizeof *pieces, V = 256 + NP + 2 };

static GrammarVocab *vocab(void) {
    static char single[256];
    const char *bytes[V];
    size_t len[V];
    uint8_t kind[V];
    for (int i = 0; i < 256; i++) {
        single[i] = (char)i;
        bytes[i] = single + i;
        len[i] = 1;
        kind[i] = GV_TEXT;
    }
    for (int i = 0; i < NP; i++) {
        bytes[256 + i] = pieces[i];
        len[256 + i] = strlen(pieces[i]);
        kind[256 + i] = GV_TEXT;
    }
    bytes[V - 2] = "<tool_call>";
    len[V - 2] = 11;
    kind[V - 2] = GV_ADDED;
    bytes[V - 1] = "";
    len[V - 1] = 0;
    kind[V - 1] = GV_EOS;
    return grammar_vocab_new(V, bytes, len, kind);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static GrammarVocab *v;
    if (!v && !(v = vocab())) abort();
    const uint8_t *nul = memchr(data, 0, size);
    size_t glen = nul ? (size_t)(nul - data) : size;
    char err[256];
    err[0] = 0;
    Grammar *g = grammar_parse((const char *)data, glen, err, sizeof err);
    if (!g) {
        if (!memchr(err, 0, sizeof err) || strncmp(err, "grammar: at byte ", 17)) abort(); /* a refusal says where */
        return 0;
    }
    GrammarRun *r = grammar_run_new(g, v);
    if (r) grammar_run_set_work_limit(r, 300000); /* an ambiguous grammar fails fast, as the engine's would slowly */
    const uint8_t *drive = nul ? nul + 1 : data + size;
    size_t dn = (size_t)(data + size - drive);
    for (size_t i = 0; r && i <= dn && i < 64; i++) {
        const uint32_t *bits;
        int budget = i < dn ? drive[i] % 8 - 1 : -1, count = grammar_mask(r, budget, &bits), seen = 0;
        if (count < 0) break; /* out of memory: the caller's error path */
        for (int t = 0; t < V; t++) {
            int a = grammar_allows(r, t, budget);
            if (a != (int)((bits[t >> 5] >> (t & 31)) & 1)) abort(); /* the mask and the check disagree */
            seen += a;
        }
        if (seen != count || (count == 0 && !grammar_complete(r) && budget < 0)) abort(); /* a dead end */
        if (i == dn) break;
        int pick = drive[i] < 256 - NP - 2 ? drive[i] : 256 + drive[i] % (NP + 2);
        (void)grammar_accept(r, pick);
    }
    grammar_run_free(r);
    grammar_free(g);
    return 0;
}
