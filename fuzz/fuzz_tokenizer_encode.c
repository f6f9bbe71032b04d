/* tok_encode on arbitrary text with real tokenizer configurations (fuzz/assets/tokenizers/: the
 * fixture's GPT-2 style one and cut-down copies of Qwen3, DeepSeek-V3 and gpt-oss, each with
 * its own normalizer, split regexes, added tokens and post-processor). Byte 0 of the input picks
 * the tokenizer and the flags; the rest is the text. Tokenizers without a normalizer must
 * give the text back exactly (ByteLevel BPE is lossless). */
#include "tok_common.h"

static const struct {
    const char *file;
    int lossless;
} TOKS[] = {
    {FUZZ_ASSETS "/tokenizer.json", 1},
    {FUZZ_ASSETS "/../tokenizers/qwen3.json", 0},       /* NFC changes text */
    {FUZZ_ASSETS "/../tokenizers/deepseek_v3.json", 0}, /* lstrip/rstrip added tokens eat spaces */
    {FUZZ_ASSETS "/../tokenizers/gptoss.json", 1},
};
#define NTOK (sizeof TOKS / sizeof TOKS[0])
static Tokenizer *tok[NTOK];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    for (size_t i = 0; i < NTOK; i++) {
        char err[512];
        if (!(tok[i] = tok_load(TOKS[i].file, err, sizeof err))) {
            fprintf(stderr, "fuzz: %s\n", err);
            abort();
        }
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    unsigned sel = data[0];
    size_t which = (sel & 7) % NTOK;
    int parse_special = (sel >> 3) & 1, add_special = (sel >> 4) & 1;
    const char *text = (const char *)data + 1;
    size_t len = size - 1, n;
    char *out = fuzz_roundtrip(tok[which], text, len, parse_special, add_special, 1, &n);
    if (out && TOKS[which].lossless && !add_special && (n != len || memcmp(out, text, len))) {
        fprintf(stderr, "fuzz: tokenizer %s does not give the text back (%zu bytes in, %zu out)\n", TOKS[which].file, len, n);
        abort();
    }
    free(out);
    return 0;
}
