/* tok_load_buffer on an arbitrary tokenizer.json; a tokenizer that loads must then encode and
 * decode without fault, and every id it reports must be decodable. */
#include "tok_common.h"

static const char *const TEXTS[] = {"Hello world! It's 2024 and 12345 cats.",
                                    "  leading\tand\ntrailing  ",
                                    "<|endoftext|>x<s></s>",
                                    "caf\xc3\xa9 na\xc3\xafve \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80",
                                    "",
                                    "a"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512] = "";
    Tokenizer *t = tok_load_buffer((const char *)data, size, err, sizeof err);
    if (!t) {
        if (!err[0]) abort();
        return 0;
    }
    int nv = tok_vocab_size(t);
    volatile size_t sum = 0;
    for (int32_t id = -1; id <= nv && id < 4096; id++) {
        size_t len;
        const char *b = tok_token_bytes(t, id, &len);
        if ((id < 0 || id >= nv) && b) abort();
        if (b && len > tok_max_token_bytes(t)) abort();
        if (b && len) sum += (unsigned char)b[len - 1];
        sum += (size_t)tok_is_special(t, id);
    }
    sum += (size_t)tok_find(t, "<|endoftext|>");
    for (size_t i = 0; i < sizeof TEXTS / sizeof TEXTS[0]; i++)
        for (int mode = 0; mode < 4; mode++) {
            size_t n;
            char *out = fuzz_roundtrip(t, TEXTS[i], strlen(TEXTS[i]), mode & 1, mode >> 1, mode & 1, &n);
            free(out);
        }
    tok_free(t);
    (void)sum;
    return 0;
}
