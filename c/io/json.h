/* Minimal strict JSON reader for config.json, safetensors headers and tokenizer.json.
 * Values live in one arena freed by json_free; strings are decoded UTF-8 with a length
 * (they may contain NUL). Depth and size are bounded so hostile input fails cleanly. */
#ifndef COLI_JSON_H
#define COLI_JSON_H
#include <stddef.h>
#include <stdint.h>

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUM, JSON_STR, JSON_ARR, JSON_OBJ } JsonType;

typedef struct JsonValue JsonValue;
struct JsonValue {
    JsonType type;
    int boolean;       /* JSON_BOOL */
    int is_int;        /* JSON_NUM: written without fraction/exponent and fits int64 */
    int64_t i;         /* JSON_NUM when is_int */
    double num;        /* JSON_NUM */
    const char *str;   /* JSON_STR (NUL-terminated copy) */
    size_t len;        /* JSON_STR byte length; JSON_ARR / JSON_OBJ element count */
    JsonValue *items;  /* JSON_ARR elements, JSON_OBJ values */
    const char **keys; /* JSON_OBJ keys (NUL-terminated) */
    size_t *key_lens;  /* JSON_OBJ key byte lengths */
};

typedef struct JsonDoc JsonDoc;

/* Parses text[0..len). On failure returns NULL and writes a message with the byte offset. */
JsonDoc *json_parse(const char *text, size_t len, char *err, size_t errlen);
const JsonValue *json_root(const JsonDoc *doc);
void json_free(JsonDoc *doc);

/* Object lookup (linear; objects here are small or scanned once). NULL when absent or not an object. */
const JsonValue *json_get(const JsonValue *obj, const char *key);
/* Typed helpers: return def when absent or of another type. */
double json_get_num(const JsonValue *obj, const char *key, double def);
int64_t json_get_int(const JsonValue *obj, const char *key, int64_t def);
int json_get_bool(const JsonValue *obj, const char *key, int def);
const char *json_get_str(const JsonValue *obj, const char *key); /* NULL when absent */

#endif
