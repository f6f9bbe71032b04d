#include "io/json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/grow.h"

#define JSON_MAX_DEPTH 128

typedef struct ArenaBlock {
    struct ArenaBlock *next;
    size_t used, cap;
    unsigned char data[];
} ArenaBlock;

struct JsonDoc {
    ArenaBlock *blocks;
    JsonValue root;
};

typedef struct {
    const char *s;
    size_t len, pos;
    JsonDoc *doc;
    char *err;
    size_t errlen;
    int failed;
} Parser;

static void *arena_alloc(JsonDoc *doc, size_t n) {
    n = (n + 15) & ~(size_t)15;
    ArenaBlock *b = doc->blocks;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > (1u << 20) ? n : (1u << 20);
        b = malloc(sizeof(ArenaBlock) + cap);
        if (!b) return NULL;
        b->used = 0;
        b->cap = cap;
        b->next = doc->blocks;
        doc->blocks = b;
    }
    void *p = b->data + b->used;
    b->used += n;
    return p;
}

static int fail(Parser *p, const char *msg) {
    if (!p->failed) {
        p->failed = 1;
        snprintf(p->err, p->errlen, "JSON error at byte %zu: %s", p->pos, msg);
    }
    return -1;
}

static void skip_ws(Parser *p) {
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') p->pos++;
        else break;
    }
}

static int hex4(Parser *p, unsigned *out) {
    if (p->len - p->pos < 4) return fail(p, "truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p->s[p->pos++];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return fail(p, "bad hex digit in \\u escape");
    }
    *out = v;
    return 0;
}

static size_t put_utf8(unsigned char *o, unsigned cp) {
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = 0xC0 | (cp >> 6);
        o[1] = 0x80 | (cp & 0x3F);
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = 0xE0 | (cp >> 12);
        o[1] = 0x80 | ((cp >> 6) & 0x3F);
        o[2] = 0x80 | (cp & 0x3F);
        return 3;
    }
    o[0] = 0xF0 | (cp >> 18);
    o[1] = 0x80 | ((cp >> 12) & 0x3F);
    o[2] = 0x80 | ((cp >> 6) & 0x3F);
    o[3] = 0x80 | (cp & 0x3F);
    return 4;
}

/* Parses a string starting after the opening quote; decoded bytes never exceed the raw span. */
static int parse_string(Parser *p, const char **out, size_t *out_len) {
    size_t start = p->pos, end = start;
    int has_escape = 0;
    while (end < p->len && p->s[end] != '"') {
        if (p->s[end] == '\\') {
            has_escape = 1;
            end++;
        } else if ((unsigned char)p->s[end] < 0x20) {
            p->pos = end;
            return fail(p, "control character in string");
        }
        end++;
    }
    if (end >= p->len) return fail(p, "unterminated string");
    unsigned char *o = arena_alloc(p->doc, end - start + 1);
    if (!o) return fail(p, "out of memory");
    if (!has_escape) {
        memcpy(o, p->s + start, end - start);
        o[end - start] = 0;
        *out = (const char *)o;
        *out_len = end - start;
        p->pos = end + 1;
        return 0;
    }
    size_t n = 0;
    while (p->pos < end) {
        char c = p->s[p->pos++];
        if (c != '\\') {
            o[n++] = (unsigned char)c;
            continue;
        }
        char e = p->s[p->pos++];
        switch (e) {
        case '"': o[n++] = '"'; break;
        case '\\': o[n++] = '\\'; break;
        case '/': o[n++] = '/'; break;
        case 'b': o[n++] = '\b'; break;
        case 'f': o[n++] = '\f'; break;
        case 'n': o[n++] = '\n'; break;
        case 'r': o[n++] = '\r'; break;
        case 't': o[n++] = '\t'; break;
        case 'u': {
            unsigned cp;
            if (hex4(p, &cp)) return -1;
            if (cp >= 0xD800 && cp < 0xDC00) {
                unsigned lo;
                if (p->pos + 2 <= end && p->s[p->pos] == '\\' && p->s[p->pos + 1] == 'u') {
                    p->pos += 2;
                    if (hex4(p, &lo)) return -1;
                    if (lo >= 0xDC00 && lo < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    else return fail(p, "unpaired surrogate in \\u escape");
                } else return fail(p, "unpaired surrogate in \\u escape");
            } else if (cp >= 0xDC00 && cp < 0xE000) return fail(p, "unpaired surrogate in \\u escape");
            n += put_utf8(o + n, cp);
            break;
        }
        default: return fail(p, "bad escape");
        }
    }
    o[n] = 0;
    *out = (const char *)o;
    *out_len = n;
    p->pos = end + 1;
    return 0;
}

static int parse_number(Parser *p, JsonValue *v) {
    size_t start = p->pos;
    int integral = 1;
    if (p->pos < p->len && p->s[p->pos] == '-') p->pos++;
    if (p->pos >= p->len || p->s[p->pos] < '0' || p->s[p->pos] > '9') return fail(p, "bad number");
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c >= '0' && c <= '9') p->pos++;
        else if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
            integral = 0;
            p->pos++;
        } else break;
    }
    size_t n = p->pos - start;
    if (n > 63) return fail(p, "number too long");
    char buf[64];
    memcpy(buf, p->s + start, n);
    buf[n] = 0;
    char *endp;
    v->type = JSON_NUM;
    v->num = strtod(buf, &endp);
    if (*endp) return fail(p, "bad number");
    if (integral) {
        errno = 0;
        long long ll = strtoll(buf, &endp, 10);
        v->is_int = (*endp == 0 && errno == 0);
        v->i = ll;
    }
    return 0;
}

static int parse_value(Parser *p, JsonValue *v, int depth);

static int parse_container(Parser *p, JsonValue *v, int depth, int is_obj) {
    size_t cap = 8, n = 0;
    JsonValue *vals = malloc(cap * sizeof(JsonValue));
    const char **keys = is_obj ? malloc(cap * sizeof(char *)) : NULL;
    size_t *klens = is_obj ? malloc(cap * sizeof(size_t)) : NULL;
    int rc = 0;
    if (!vals || (is_obj && (!keys || !klens))) {
        rc = fail(p, "out of memory");
        goto done;
    }
    char close = is_obj ? '}' : ']';
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
        goto finish;
    }
    for (;;) {
        if (n == cap) { /* up to three arrays, one capacity: each grows from a copy of it */
            size_t vcap = cap, kcap = cap, lcap = cap;
            JsonValue *nv = grow_array(vals, &vcap, n + 1, sizeof(JsonValue), 8);
            if (!nv) {
                rc = fail(p, "out of memory");
                goto done;
            }
            vals = nv;
            if (is_obj) {
                const char **nk = grow_array(keys, &kcap, n + 1, sizeof(char *), 8);
                if (nk) keys = nk;
                size_t *nl = grow_array(klens, &lcap, n + 1, sizeof(size_t), 8);
                if (nl) klens = nl;
                if (!nk || !nl) {
                    rc = fail(p, "out of memory");
                    goto done;
                }
            }
            cap = vcap;
        }
        skip_ws(p);
        if (is_obj) {
            if (p->pos >= p->len || p->s[p->pos] != '"') {
                rc = fail(p, "expected object key");
                goto done;
            }
            p->pos++;
            if (parse_string(p, &keys[n], &klens[n])) {
                rc = -1;
                goto done;
            }
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':') {
                rc = fail(p, "expected ':'");
                goto done;
            }
            p->pos++;
        }
        if (parse_value(p, &vals[n], depth + 1)) {
            rc = -1;
            goto done;
        }
        n++;
        skip_ws(p);
        if (p->pos >= p->len) {
            rc = fail(p, "unterminated container");
            goto done;
        }
        char c = p->s[p->pos++];
        if (c == ',') continue;
        if (c == close) break;
        rc = fail(p, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
        goto done;
    }
finish:
    v->type = is_obj ? JSON_OBJ : JSON_ARR;
    v->len = n;
    v->items = arena_alloc(p->doc, n * sizeof(JsonValue) + 1);
    if (!v->items) {
        rc = fail(p, "out of memory");
        goto done;
    }
    memcpy(v->items, vals, n * sizeof(JsonValue));
    if (is_obj) {
        v->keys = arena_alloc(p->doc, n * sizeof(char *) + 1);
        v->key_lens = arena_alloc(p->doc, n * sizeof(size_t) + 1);
        if (!v->keys || !v->key_lens) {
            rc = fail(p, "out of memory");
            goto done;
        }
        memcpy(v->keys, keys, n * sizeof(char *));
        memcpy(v->key_lens, klens, n * sizeof(size_t));
    }
done:
    free(vals);
    free(keys);
    free(klens);
    return rc;
}

static int parse_literal(Parser *p, const char *word) {
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0) return fail(p, "unexpected token");
    p->pos += n;
    return 0;
}

static int parse_value(Parser *p, JsonValue *v, int depth) {
    memset(v, 0, sizeof(*v));
    if (depth > JSON_MAX_DEPTH) return fail(p, "nesting too deep");
    skip_ws(p);
    if (p->pos >= p->len) return fail(p, "unexpected end of input");
    char c = p->s[p->pos];
    switch (c) {
    case '{': p->pos++; return parse_container(p, v, depth, 1);
    case '[': p->pos++; return parse_container(p, v, depth, 0);
    case '"':
        p->pos++;
        v->type = JSON_STR;
        return parse_string(p, &v->str, &v->len);
    case 't':
        v->type = JSON_BOOL;
        v->boolean = 1;
        return parse_literal(p, "true");
    case 'f':
        v->type = JSON_BOOL;
        v->boolean = 0;
        return parse_literal(p, "false");
    case 'n': v->type = JSON_NULL; return parse_literal(p, "null");
    default: return parse_number(p, v);
    }
}

JsonDoc *json_parse(const char *text, size_t len, char *err, size_t errlen) {
    JsonDoc *doc = calloc(1, sizeof(JsonDoc));
    if (!doc) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    Parser p = {text, len, 0, doc, err, errlen, 0};
    if (parse_value(&p, &doc->root, 0) == 0) {
        skip_ws(&p);
        if (p.pos != p.len) fail(&p, "trailing data after JSON value");
    }
    if (p.failed) {
        json_free(doc);
        return NULL;
    }
    return doc;
}

const JsonValue *json_root(const JsonDoc *doc) { return &doc->root; }

void json_free(JsonDoc *doc) {
    if (!doc) return;
    ArenaBlock *b = doc->blocks;
    while (b) {
        ArenaBlock *next = b->next;
        free(b);
        b = next;
    }
    free(doc);
}

const JsonValue *json_get(const JsonValue *obj, const char *key) {
    if (!obj || obj->type != JSON_OBJ) return NULL;
    size_t kl = strlen(key);
    for (size_t i = 0; i < obj->len; i++)
        if (obj->key_lens[i] == kl && memcmp(obj->keys[i], key, kl) == 0) return &obj->items[i];
    return NULL;
}

double json_get_num(const JsonValue *obj, const char *key, double def) {
    const JsonValue *v = json_get(obj, key);
    return v && v->type == JSON_NUM ? v->num : def;
}

int64_t json_get_int(const JsonValue *obj, const char *key, int64_t def) {
    const JsonValue *v = json_get(obj, key);
    return v && v->type == JSON_NUM && v->is_int ? v->i : def;
}

int json_get_bool(const JsonValue *obj, const char *key, int def) {
    const JsonValue *v = json_get(obj, key);
    return v && v->type == JSON_BOOL ? v->boolean : def;
}

const char *json_get_str(const JsonValue *obj, const char *key) {
    const JsonValue *v = json_get(obj, key);
    return v && v->type == JSON_STR ? v->str : NULL;
}
