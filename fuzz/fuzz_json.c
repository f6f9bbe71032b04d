/* json_parse on arbitrary bytes, then a walk over every value, so each length and pointer the
 * parser hands out is touched under ASan. */
#include "harness.h"
#include "io/json.h"

static size_t walk(const JsonValue *v, int depth) {
    size_t h = (size_t)v->type;
    if (v->type == JSON_STR)
        for (size_t i = 0; i < v->len; i++) h += (unsigned char)v->str[i];
    if (v->type == JSON_ARR || v->type == JSON_OBJ)
        for (size_t i = 0; i < v->len; i++) {
            if (v->type == JSON_OBJ) h += v->key_lens[i] + (unsigned char)v->keys[i][v->key_lens[i]];
            h += walk(&v->items[i], depth + 1);
        }
    return h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256];
    JsonDoc *d = json_parse((const char *)data, size, err, sizeof err);
    if (!d) {
        if (!memchr(err, 0, sizeof err) || !err[0]) abort(); /* a refusal always says why */
        return 0;
    }
    const JsonValue *r = json_root(d);
    volatile size_t h = walk(r, 0);
    (void)h;
    (void)json_get_str(r, "x");
    (void)json_get_int(r, "y", 0);
    json_free(d);
    return 0;
}
