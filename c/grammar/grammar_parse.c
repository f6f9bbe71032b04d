/* GBNF text -> Grammar: a recursive-descent parse into a small syntax tree, then compiled to flat
 * alternatives (groups and repetitions become generated rules, as llama.cpp does), then checked:
 * every rule defined, a root, no rule that reaches itself without consuming input (the matcher
 * would expand it forever) and none that can never finish. The input is untrusted. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "util/grow.h"

#define INF_LEN (1u << 30)
#define REP_INF UINT32_MAX

enum { N_SEQ, N_ALT, N_CLASS, N_REF, N_RID, N_REP };
typedef struct Node {
    uint8_t kind, neg;
    size_t pos;        /* byte offset in the text, for messages */
    struct Node **kid; /* SEQ/ALT children; REP: kid[0] */
    size_t n, cap;
    uint32_t *rg; /* CLASS: code point pairs */
    size_t nr, rcap;
    uint32_t id, lo, hi;     /* REF: rule id; RID: rule id; REP: bounds */
    struct Node *next_alloc; /* every node, for freeing */
} Node;

typedef struct {
    char *name;
    size_t pos; /* definition (or first reference) */
    int defined;
    Node *body; /* to compile; NULL once compiled or for direct rules */
    GElem *el;
    size_t n, cap;
} Rule;

typedef struct {
    const unsigned char *s;
    size_t n, i;
    char *err;
    size_t errlen;
    int failed;
    Node *nodes;
    Rule *rules;
    size_t n_rules, rules_cap;
    uint32_t *hash; /* rule name -> id + 1 */
    size_t hash_cap;
    uint32_t *ranges;
    size_t n_ranges, ranges_cap;
    char *lit;
    size_t lit_len, lit_cap;
    size_t total_el;
    int depth;
} P;

static int fail(P *p, size_t pos, const char *fmt, ...) {
    if (p->failed) return -1;
    p->failed = 1;
    int k = snprintf(p->err, p->errlen, "grammar: at byte %zu: ", pos);
    va_list ap;
    va_start(ap, fmt);
    if (k >= 0 && (size_t)k < p->errlen) vsnprintf(p->err + k, p->errlen - (size_t)k, fmt, ap);
    va_end(ap);
    return -1;
}

static int oom(P *p) { return fail(p, p->i, "out of memory"); }

static Node *node_new(P *p, int kind, size_t pos) {
    Node *x = calloc(1, sizeof *x);
    if (!x) {
        oom(p);
        return NULL;
    }
    x->kind = (uint8_t)kind;
    x->pos = pos;
    x->next_alloc = p->nodes;
    p->nodes = x;
    return x;
}

static int node_add(P *p, Node *parent, Node *kid) {
    Node **kids = grow_array(parent->kid, &parent->cap, parent->n + 1, sizeof *kids, 8);
    if (!kids) return oom(p);
    parent->kid = kids;
    parent->kid[parent->n++] = kid;
    return 0;
}

static int class_add(P *p, Node *c, uint32_t lo, uint32_t hi) {
    uint32_t *rg = grow_array(c->rg, &c->rcap, c->nr + 2, sizeof *rg, 8);
    if (!rg) return oom(p);
    c->rg = rg;
    c->rg[c->nr++] = lo;
    c->rg[c->nr++] = hi;
    return 0;
}

/* ---- rule names ---- */
static uint64_t hash_str(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static int rule_new(P *p, const char *name, size_t len, size_t pos, uint32_t *id) {
    *id = UINT32_MAX; /* set on failure too: gcc cannot see that every failure returns nonzero */
    Rule *rules = grow_array(p->rules, &p->rules_cap, p->n_rules + 1, sizeof *rules, 8);
    if (!rules) return oom(p);
    p->rules = rules;
    Rule *r = &p->rules[p->n_rules];
    memset(r, 0, sizeof *r);
    r->pos = pos;
    if (name) {
        if (!(r->name = malloc(len + 1))) return oom(p);
        memcpy(r->name, name, len);
        r->name[len] = 0;
    }
    *id = (uint32_t)p->n_rules++;
    if (p->n_rules > GRAMMAR_MAX_ELEMENTS / 4) return fail(p, pos, "too many rules (the limit is %u)", GRAMMAR_MAX_ELEMENTS / 4);
    if (!name) return 0;
    if (p->n_rules * 2 > p->hash_cap) { /* rehash the named rules */
        size_t cap = p->hash_cap ? p->hash_cap * 2 : 64;
        uint32_t *h = calloc(cap, sizeof *h);
        if (!h) return oom(p);
        for (size_t k = 0; k < p->n_rules; k++) {
            if (!p->rules[k].name) continue;
            size_t at = hash_str(p->rules[k].name, strlen(p->rules[k].name)) & (cap - 1);
            while (h[at]) at = (at + 1) & (cap - 1);
            h[at] = (uint32_t)k + 1;
        }
        free(p->hash);
        p->hash = h;
        p->hash_cap = cap;
    } else {
        size_t at = hash_str(name, len) & (p->hash_cap - 1);
        while (p->hash[at]) at = (at + 1) & (p->hash_cap - 1);
        p->hash[at] = *id + 1;
    }
    return 0;
}

/* The id of rule `name`, created (undefined) on first sight. */
static int rule_id(P *p, const char *name, size_t len, size_t pos, uint32_t *id) {
    if (p->hash_cap) {
        size_t at = hash_str(name, len) & (p->hash_cap - 1);
        for (; p->hash[at]; at = (at + 1) & (p->hash_cap - 1)) {
            const Rule *r = &p->rules[p->hash[at] - 1];
            if (strlen(r->name) == len && !memcmp(r->name, name, len)) {
                *id = p->hash[at] - 1;
                return 0;
            }
        }
    }
    return rule_new(p, name, len, pos, id);
}

/* ---- lexing ---- */
static int is_name(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static size_t skip_blank(const P *p, size_t i, int newlines) {
    while (i < p->n) {
        unsigned char c = p->s[i];
        if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) i++;
        else if (c == '#') {
            while (i < p->n && p->s[i] != '\n') i++;
        } else break;
    }
    return i;
}

/* At i: `name ::=`? */
static int rule_starts(const P *p, size_t i) {
    size_t j = i;
    while (j < p->n && is_name(p->s[j])) j++;
    if (j == i) return 0;
    j = skip_blank(p, j, 0);
    return j + 3 <= p->n && !memcmp(p->s + j, "::=", 3);
}

/* Skips blanks; at depth 0 a newline ends the rule unless what follows continues it: a `|`,
 * or anything that is not the next rule's definition. Returns 1 when the rule ended. */
static int space(P *p, int nested) {
    p->i = skip_blank(p, p->i, nested);
    if (nested || p->i >= p->n || (p->s[p->i] != '\n' && p->s[p->i] != '\r')) return p->i >= p->n;
    size_t j = skip_blank(p, p->i, 1);
    if (j >= p->n || rule_starts(p, j)) {
        p->i = j;
        return 1;
    }
    p->i = j;
    return 0;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One character of a literal or class: an escape or a UTF-8 sequence. */
static int read_char(P *p, uint32_t *cp) {
    size_t at = p->i;
    if (p->i >= p->n) return fail(p, at, "the text ends inside a literal or character class");
    unsigned c = p->s[p->i++];
    if (c == '\\') {
        if (p->i >= p->n) return fail(p, at, "the text ends inside an escape");
        unsigned e = p->s[p->i++];
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (digits) {
            uint32_t v = 0;
            for (int k = 0; k < digits; k++) {
                int h = p->i < p->n ? hexval(p->s[p->i]) : -1;
                if (h < 0) return fail(p, at, "\\%c needs %d hex digits", e, digits);
                v = v * 16 + (uint32_t)h;
                p->i++;
            }
            if (v > 0x10FFFF) return fail(p, at, "\\%c escape U+%X is beyond U+10FFFF", e, v);
            *cp = v;
            return 0;
        }
        switch (e) {
        case 'n': *cp = '\n'; return 0;
        case 'r': *cp = '\r'; return 0;
        case 't': *cp = '\t'; return 0;
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/':
        case '\'': *cp = e; return 0;
        default:
            return fail(p, at, "unknown escape '\\%c' (use \\n \\r \\t \\\\ \\\" \\[ \\] \\- \\^ \\xHH \\uHHHH \\UHHHHHHHH)",
                        e >= 0x21 && e < 0x7F ? (int)e : '?');
        }
    }
    if (c < 0x80) {
        *cp = c;
        return 0;
    }
    int need = c >= 0xF0 && c <= 0xF4 ? 3 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xC2 && c <= 0xDF ? 1 : -1;
    if (need < 0 || p->i + (size_t)need > p->n) return fail(p, at, "invalid UTF-8");
    uint32_t v = c & (need == 1 ? 0x1F : need == 2 ? 0x0F : 0x07);
    for (int k = 0; k < need; k++) {
        unsigned b = p->s[p->i++];
        if ((b & 0xC0) != 0x80) return fail(p, at, "invalid UTF-8");
        v = v << 6 | (b & 0x3F);
    }
    if ((need == 2 && v < 0x800) || (need == 3 && (v < 0x10000 || v > 0x10FFFF)) || (v >= 0xD800 && v <= 0xDFFF))
        return fail(p, at, "invalid UTF-8");
    *cp = v;
    return 0;
}

static int lit_put(P *p, const void *b, size_t n) {
    char *lit = grow_array(p->lit, &p->lit_cap, p->lit_len + n, 1, 8);
    if (!lit) return oom(p);
    p->lit = lit;
    memcpy(p->lit + p->lit_len, b, n);
    p->lit_len += n;
    return 0;
}

static size_t utf8_put(unsigned char *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | cp >> 6);
        o[1] = (unsigned char)(0x80 | (cp & 63));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12);
        o[1] = (unsigned char)(0x80 | (cp >> 6 & 63));
        o[2] = (unsigned char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18);
    o[1] = (unsigned char)(0x80 | (cp >> 12 & 63));
    o[2] = (unsigned char)(0x80 | (cp >> 6 & 63));
    o[3] = (unsigned char)(0x80 | (cp & 63));
    return 4;
}

/* ---- syntax ---- */
static Node *alternates(P *p, int nested);

static Node *literal(P *p) {
    Node *seq = node_new(p, N_SEQ, p->i);
    p->i++; /* the opening quote */
    size_t head = p->lit_len;
    uint32_t len = 0;
    if (!seq || lit_put(p, &len, 4)) return NULL;
    for (;;) {
        if (p->i >= p->n) {
            fail(p, seq->pos, "unterminated string literal");
            return NULL;
        }
        if (p->s[p->i] == '"') {
            p->i++;
            break;
        }
        uint32_t cp;
        if (read_char(p, &cp)) return NULL;
        if (cp >= 0xD800 && cp <= 0xDFFF) {
            fail(p, p->i, "U+%X is a surrogate, not a character", cp);
            return NULL;
        }
        Node *c = node_new(p, N_CLASS, p->i);
        unsigned char u[4];
        size_t k = utf8_put(u, cp);
        if (!c || class_add(p, c, cp, cp) || node_add(p, seq, c) || lit_put(p, u, k)) return NULL;
        len += (uint32_t)k;
    }
    memcpy(p->lit + head, &len, 4);
    return seq;
}

static Node *char_class(P *p) {
    Node *c = node_new(p, N_CLASS, p->i);
    if (!c) return NULL;
    p->i++;
    if (p->i < p->n && p->s[p->i] == '^') {
        c->neg = 1;
        p->i++;
    }
    for (;;) {
        if (p->i >= p->n) {
            fail(p, c->pos, "unterminated character class");
            return NULL;
        }
        if (p->s[p->i] == ']') {
            p->i++;
            break;
        }
        uint32_t lo, hi;
        if (read_char(p, &lo)) return NULL;
        hi = lo;
        if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
            p->i++;
            size_t at = p->i;
            if (read_char(p, &hi)) return NULL;
            if (hi < lo) {
                fail(p, at, "character range U+%X-U+%X is backwards", lo, hi);
                return NULL;
            }
        }
        if (class_add(p, c, lo, hi)) return NULL;
    }
    if (!c->nr && !c->neg) {
        fail(p, c->pos, "empty character class [] matches nothing");
        return NULL;
    }
    return c;
}

static int read_count(P *p, uint32_t *v) {
    size_t at = p->i;
    uint64_t x = 0;
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return fail(p, at, "a repetition {m,n} needs numbers");
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        x = x * 10 + (uint64_t)(p->s[p->i++] - '0');
        if (x > GRAMMAR_MAX_REPEAT) return fail(p, at, "repetition count above the limit of %d", GRAMMAR_MAX_REPEAT);
    }
    *v = (uint32_t)x;
    return 0;
}

static Node *postfix(P *p, Node *x) {
    while (p->i < p->n) {
        unsigned c = p->s[p->i];
        uint32_t lo, hi;
        size_t at = p->i;
        if (c == '*') {
            lo = 0;
            hi = REP_INF;
            p->i++;
        } else if (c == '+') {
            lo = 1;
            hi = REP_INF;
            p->i++;
        } else if (c == '?') {
            lo = 0;
            hi = 1;
            p->i++;
        } else if (c == '{') {
            p->i++;
            p->i = skip_blank(p, p->i, 0);
            if (read_count(p, &lo)) return NULL;
            p->i = skip_blank(p, p->i, 0);
            hi = lo;
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i = skip_blank(p, p->i + 1, 0);
                hi = REP_INF;
                if (p->i < p->n && p->s[p->i] != '}' && read_count(p, &hi)) return NULL;
                p->i = skip_blank(p, p->i, 0);
            }
            if (p->i >= p->n || p->s[p->i] != '}') {
                fail(p, at, "a repetition {m,n} needs its closing }");
                return NULL;
            }
            p->i++;
            if (hi < lo) {
                fail(p, at, "repetition {%u,%u} has its maximum below its minimum", lo, hi);
                return NULL;
            }
        } else break;
        Node *r = node_new(p, N_REP, at);
        if (!r || node_add(p, r, x)) return NULL;
        r->lo = lo;
        r->hi = hi;
        x = r;
    }
    return x;
}

static Node *sequence(P *p, int nested) {
    Node *seq = node_new(p, N_SEQ, p->i);
    if (!seq) return NULL;
    for (;;) {
        if (space(p, nested)) break;
        unsigned c = p->s[p->i];
        if (c == '|' || c == ')') break;
        Node *x = NULL;
        size_t at = p->i;
        if (c == '"') x = literal(p);
        else if (c == '[') x = char_class(p);
        else if (c == '.') {
            p->i++;
            x = node_new(p, N_CLASS, at);
            if (x) x->neg = 1;
        } else if (c == '(') {
            if (++p->depth > 200) {
                fail(p, at, "groups nested more than 200 deep");
                return NULL;
            }
            p->i++;
            x = alternates(p, 1);
            if (!x) return NULL;
            space(p, 1);
            if (p->i >= p->n || p->s[p->i] != ')') {
                fail(p, at, "unclosed '('");
                return NULL;
            }
            p->i++;
            p->depth--;
        } else if (is_name(c)) {
            size_t j = p->i;
            while (j < p->n && is_name(p->s[j])) j++;
            x = node_new(p, N_REF, at);
            if (!x || rule_id(p, (const char *)p->s + at, j - at, at, &x->id)) return NULL;
            p->i = j;
        } else {
            fail(p, at, c >= 0x21 && c < 0x7F ? "unexpected '%c'" : "unexpected byte 0x%02X", c);
            return NULL;
        }
        if (!x || !(x = postfix(p, x)) || node_add(p, seq, x)) return NULL;
    }
    return seq;
}

static Node *alternates(P *p, int nested) {
    Node *alt = node_new(p, N_ALT, p->i);
    if (!alt) return NULL;
    for (;;) {
        Node *s = sequence(p, nested);
        if (!s || node_add(p, alt, s)) return NULL;
        if (p->i < p->n && p->s[p->i] == '|') {
            p->i = skip_blank(p, p->i + 1, 1);
            continue;
        }
        return alt;
    }
}

static int parse_rules(P *p) {
    for (;;) {
        p->i = skip_blank(p, p->i, 1);
        if (p->i >= p->n) return 0;
        size_t at = p->i, j = p->i;
        while (j < p->n && is_name(p->s[j])) j++;
        if (j == at) return fail(p, at, "expected a rule name");
        uint32_t id;
        if (rule_id(p, (const char *)p->s + at, j - at, at, &id)) return -1;
        Rule *r = &p->rules[id];
        if (r->defined) return fail(p, at, "rule '%s' is defined twice", r->name);
        p->i = skip_blank(p, j, 0);
        if (p->i + 3 > p->n || memcmp(p->s + p->i, "::=", 3))
            return fail(p, p->i, "expected '::=' after rule name '%s'", r->name);
        p->i = skip_blank(p, p->i + 3, 0);
        Node *body = alternates(p, 0);
        if (!body) return -1;
        r = &p->rules[id]; /* the table may have moved */
        r->defined = 1;
        r->pos = at;
        r->body = body;
        if (p->i < p->n && p->s[p->i] == ')') return fail(p, p->i, "unmatched ')'");
    }
}

/* ---- compilation to flat alternatives ---- */
static int emit(P *p, uint32_t rule, int type, uint32_t a, uint32_t b) {
    Rule *r = &p->rules[rule];
    if (++p->total_el > GRAMMAR_MAX_ELEMENTS)
        return fail(p, r->pos, "the grammar expands to more than %u elements", GRAMMAR_MAX_ELEMENTS);
    GElem *el = grow_array(r->el, &r->cap, r->n + 1, sizeof *el, 8);
    if (!el) return oom(p);
    r->el = el;
    r->el[r->n++] = (GElem){(uint8_t)type, a, b};
    return 0;
}

static int emit_class(P *p, uint32_t rule, const Node *c) {
    uint32_t *ranges = grow_array(p->ranges, &p->ranges_cap, p->n_ranges + c->nr, sizeof *ranges, 8);
    if (!ranges) return oom(p);
    p->ranges = ranges;
    if (c->nr) memcpy(p->ranges + p->n_ranges, c->rg, c->nr * sizeof(uint32_t));
    uint32_t at = (uint32_t)p->n_ranges / 2;
    p->n_ranges += c->nr;
    return emit(p, rule, c->neg ? GE_CHAR_NOT : GE_CHAR, at, (uint32_t)c->nr / 2);
}

/* A generated rule (its elements filled by the caller). */
static int gen_rule(P *p, size_t pos, uint32_t *id) { return rule_new(p, NULL, 0, pos, id); }

static int item(P *p, uint32_t rule, const Node *x);

/* x as one element: a class or a reference, wrapping anything longer in a rule of its own. */
static int single(P *p, const Node *x, GElem *out) {
    if (x->kind == N_REF || x->kind == N_RID) {
        *out = (GElem){GE_REF, x->id, 0};
        return 0;
    }
    uint32_t r;
    if (gen_rule(p, x->pos, &r)) return -1;
    if (x->kind == N_ALT) p->rules[r].body = (Node *)x;
    else if (item(p, r, x) || emit(p, r, GE_END, 0, 0)) return -1;
    *out = (GElem){GE_REF, r, 0};
    return 0;
}

static int repeat(P *p, uint32_t rule, const Node *rep) {
    const Node *x = rep->kid[0];
    GElem one;
    if (x->kind == N_CLASS) {
        if (emit_class(p, rule, x)) return -1; /* reuse its ranges for every copy */
        one = p->rules[rule].el[--p->rules[rule].n];
        p->total_el--;
    } else if (single(p, x, &one)) return -1;
    for (uint32_t k = 0; k < rep->lo; k++)
        if (emit(p, rule, one.type, one.a, one.b)) return -1;
    if (rep->hi == REP_INF) { /* S ::= x S | (empty) */
        uint32_t s;
        if (gen_rule(p, rep->pos, &s) || emit(p, s, one.type, one.a, one.b) || emit(p, s, GE_REF, s, 0) ||
            emit(p, s, GE_ALT, 0, 0) || emit(p, s, GE_END, 0, 0))
            return -1;
        return emit(p, rule, GE_REF, s, 0);
    }
    /* O_1 ::= x | (empty); O_k ::= x O_{k-1} | (empty) */
    uint32_t prev = UINT32_MAX;
    for (uint32_t k = rep->lo; k < rep->hi; k++) {
        uint32_t o;
        if (gen_rule(p, rep->pos, &o) || emit(p, o, one.type, one.a, one.b) ||
            (prev != UINT32_MAX && emit(p, o, GE_REF, prev, 0)) || emit(p, o, GE_ALT, 0, 0) || emit(p, o, GE_END, 0, 0))
            return -1;
        prev = o;
    }
    return prev == UINT32_MAX ? 0 : emit(p, rule, GE_REF, prev, 0);
}

static int item(P *p, uint32_t rule, const Node *x) {
    switch (x->kind) {
    case N_CLASS: return emit_class(p, rule, x);
    case N_REF:
    case N_RID: return emit(p, rule, GE_REF, x->id, 0);
    case N_SEQ:
        for (size_t k = 0; k < x->n; k++)
            if (item(p, rule, x->kid[k])) return -1;
        return 0;
    case N_ALT: {
        if (x->n == 1) return item(p, rule, x->kid[0]);
        GElem e;
        if (single(p, x, &e)) return -1;
        return emit(p, rule, e.type, e.a, e.b);
    }
    default: return repeat(p, rule, x);
    }
}

static int compile_rule(P *p, uint32_t r) {
    Node *body = p->rules[r].body;
    p->rules[r].body = NULL;
    if (body->kind != N_ALT) return item(p, r, body) || emit(p, r, GE_END, 0, 0) ? -1 : 0;
    for (size_t k = 0; k < body->n; k++)
        if (item(p, r, body->kid[k]) || emit(p, r, k + 1 < body->n ? GE_ALT : GE_END, 0, 0)) return -1;
    return 0;
}

/* ---- checks ---- */
static uint32_t char_min_bytes(const Grammar *g, const GElem *e) {
    const uint32_t *rg = g->ranges + 2 * e->a;
    uint32_t best = UINT32_MAX;
    if (e->type == GE_CHAR) { /* the smallest code point of a range that is a character (no surrogate) */
        for (uint32_t k = 0; k < e->b; k++) {
            uint32_t lo = rg[2 * k], hi = rg[2 * k + 1] > 0x10FFFF ? 0x10FFFF : rg[2 * k + 1];
            if (lo >= 0xD800 && lo <= 0xDFFF) lo = 0xE000;
            if (lo <= hi && lo < best) best = lo;
        }
    } else { /* the smallest character no range excludes */
        uint32_t cp = 0;
        for (int moved = 1; moved && cp <= 0x10FFFF;) {
            moved = 0;
            if (cp >= 0xD800 && cp <= 0xDFFF) {
                cp = 0xE000;
                moved = 1;
            }
            for (uint32_t k = 0; k < e->b; k++)
                if (cp >= rg[2 * k] && cp <= rg[2 * k + 1]) {
                    cp = rg[2 * k + 1] + 1;
                    moved = 1;
                }
        }
        best = cp;
    }
    if (best > 0x10FFFF) return INF_LEN; /* matches nothing */
    return best < 0x80 ? 1 : best < 0x800 ? 2 : best < 0x10000 ? 3 : 4;
}

static uint32_t sat_add(uint32_t a, uint32_t b) { return a + b >= INF_LEN ? INF_LEN : a + b; }

/* minlen[r]: the fewest bytes rule r derives (INF_LEN: it never finishes); a worklist fixpoint
 * over the rules that use each rule. */
static int rule_min_lengths(const Grammar *g, uint32_t *minlen) {
    size_t R = g->n_rules;
    uint32_t *cnt = calloc(R + 1, sizeof *cnt), *users = NULL, *queue = malloc((R + 1) * sizeof *queue);
    uint8_t *queued = calloc(R + 1, 1);
    int rc = -1;
    if (!cnt || !queue || !queued) goto out;
    for (size_t i = 0; i < g->n_el; i++)
        if (g->el[i].type == GE_REF) cnt[g->el[i].a + 1]++;
    for (size_t r = 0; r < R; r++) cnt[r + 1] += cnt[r];
    if (!(users = malloc((cnt[R] + 1) * sizeof *users))) goto out;
    {
        uint32_t *fill = malloc((R + 1) * sizeof *fill);
        if (!fill) goto out;
        memcpy(fill, cnt, (R + 1) * sizeof *fill);
        for (size_t r = 0; r < R; r++)
            for (uint32_t i = g->rule_start[r]; g->el[i].type != GE_END; i++)
                if (g->el[i].type == GE_REF) users[fill[g->el[i].a]++] = (uint32_t)r;
        free(fill);
    }
    size_t qh = 0, qt = 0;
    for (size_t r = 0; r < R; r++) {
        minlen[r] = INF_LEN;
        queue[qt++] = (uint32_t)r;
        queued[r] = 1;
    }
    while (qh != qt) {
        uint32_t r = queue[qh];
        qh = (qh + 1) % (R + 1);
        queued[r] = 0;
        uint32_t best = INF_LEN, sum = 0;
        for (uint32_t i = g->rule_start[r];; i++) {
            const GElem *e = &g->el[i];
            if (e->type == GE_ALT || e->type == GE_END) {
                if (sum < best) best = sum;
                sum = 0;
                if (e->type == GE_END) break;
                continue;
            }
            sum = sat_add(sum, e->type == GE_REF ? minlen[e->a] : char_min_bytes(g, e));
        }
        if (best >= minlen[r]) continue;
        minlen[r] = best;
        for (uint32_t k = cnt[r]; k < cnt[r + 1]; k++) {
            uint32_t u = users[k];
            if (!queued[u]) {
                queued[u] = 1;
                queue[qt] = u;
                qt = (qt + 1) % (R + 1);
            }
        }
    }
    rc = 0;
out:
    free(cnt);
    free(users);
    free(queue);
    free(queued);
    return rc;
}

/* A rule that can reach itself before consuming input: DFS over "may start with" edges. */
static int find_left_recursion(const Grammar *g, const uint32_t *minlen, uint32_t *culprit) {
    size_t R = g->n_rules;
    uint8_t *color = calloc(R, 1);
    uint32_t *stack = malloc(R * sizeof *stack), *at = malloc(R * sizeof *at);
    int found = 0;
    if (!color || !stack || !at) {
        free(color);
        free(stack);
        free(at);
        return -1;
    }
    for (size_t s = 0; s < R && !found; s++) {
        if (color[s]) continue;
        size_t sp = 0;
        stack[sp] = (uint32_t)s;
        at[sp++] = g->rule_start[s];
        color[s] = 1;
        while (sp && !found) {
            uint32_t r = stack[sp - 1], i = at[sp - 1];
            /* next "may start with" reference of r from element i: skip to the next alternative
             * after a non-nullable element */
            uint32_t next = UINT32_MAX;
            while (g->el[i].type != GE_END) {
                const GElem *e = &g->el[i];
                if (e->type == GE_ALT) {
                    i++;
                    continue;
                }
                if (e->type == GE_REF) {
                    next = e->a;
                    i++;
                    if (minlen[e->a] != 0) {
                        while (g->el[i].type != GE_ALT && g->el[i].type != GE_END) i++;
                    }
                    break;
                }
                while (g->el[i].type != GE_ALT && g->el[i].type != GE_END) i++; /* a character: this alternative is done */
            }
            at[sp - 1] = i;
            if (next == UINT32_MAX) {
                color[r] = 2;
                sp--;
                continue;
            }
            if (color[next] == 1) {
                found = 1;
                *culprit = next;
                break;
            }
            if (color[next] == 0) {
                color[next] = 1;
                stack[sp] = next;
                at[sp++] = g->rule_start[next];
            }
        }
    }
    free(color);
    free(stack);
    free(at);
    return found;
}

static int check(P *p, Grammar *g) {
    uint32_t *minlen = malloc(g->n_rules * sizeof *minlen);
    if (!minlen || rule_min_lengths(g, minlen)) {
        free(minlen);
        return oom(p);
    }
    uint32_t bad;
    int lr = find_left_recursion(g, minlen, &bad);
    if (lr < 0) {
        free(minlen);
        return oom(p);
    }
    if (lr) {
        const Rule *r = &p->rules[bad];
        free(minlen);
        if (r->name) return fail(p, r->pos, "rule '%s' can reach itself without consuming input (left recursion)", r->name);
        return fail(p, r->pos, "this repeats or recurses into something that can match nothing, forever");
    }
    /* every rule the root can reach must be able to finish */
    uint8_t *seen = calloc(g->n_rules, 1);
    uint32_t *todo = malloc(g->n_rules * sizeof *todo);
    if (!seen || !todo) {
        free(minlen);
        free(seen);
        free(todo);
        return oom(p);
    }
    size_t n = 0;
    todo[n++] = g->root;
    seen[g->root] = 1;
    int rc = 0;
    while (n && !rc) {
        uint32_t r = todo[--n];
        if (minlen[r] >= INF_LEN) {
            const Rule *ru = &p->rules[r];
            rc = ru->name ? fail(p, ru->pos,
                                 "rule '%s' can never finish: every alternative needs itself again or "
                                 "matches nothing",
                                 ru->name)
                          : fail(p, ru->pos, "this part can never finish: it needs itself again or matches nothing");
            break;
        }
        for (uint32_t i = g->rule_start[r]; g->el[i].type != GE_END; i++)
            if (g->el[i].type == GE_REF && !seen[g->el[i].a]) {
                seen[g->el[i].a] = 1;
                todo[n++] = g->el[i].a;
            }
    }
    /* minrest: backwards through each alternative */
    if (!rc && !(g->minrest = malloc((g->n_el + 1) * sizeof *g->minrest))) rc = oom(p);
    for (size_t i = g->n_el; !rc && i-- > 0;) {
        const GElem *e = &g->el[i];
        if (e->type == GE_END || e->type == GE_ALT) g->minrest[i] = 0;
        else g->minrest[i] = sat_add(e->type == GE_REF ? minlen[e->a] : char_min_bytes(g, e), g->minrest[i + 1]);
    }
    free(minlen);
    free(seen);
    free(todo);
    return rc;
}

static void free_parser(P *p) {
    for (Node *x = p->nodes, *nx; x; x = nx) {
        nx = x->next_alloc;
        free(x->kid);
        free(x->rg);
        free(x);
    }
    for (size_t r = 0; r < p->n_rules; r++) {
        free(p->rules[r].name);
        free(p->rules[r].el);
    }
    free(p->rules);
    free(p->hash);
    free(p->ranges);
    free(p->lit);
}

Grammar *grammar_parse(const char *text, size_t n, char *err, size_t errlen) {
    P p = {.s = (const unsigned char *)text, .n = n, .err = err, .errlen = errlen};
    Grammar *g = NULL;
    if (errlen) err[0] = 0;
    if (parse_rules(&p)) goto fail;
    uint32_t root = UINT32_MAX;
    for (size_t r = 0; r < p.n_rules; r++) {
        if (!p.rules[r].defined) {
            fail(&p, p.rules[r].pos, "rule '%s' is used but never defined", p.rules[r].name);
            goto fail;
        }
        if (!strcmp(p.rules[r].name, "root")) root = (uint32_t)r;
    }
    if (root == UINT32_MAX) {
        fail(&p, 0, "no 'root' rule: the output must match 'root ::= ...'");
        goto fail;
    }
    for (size_t r = 0; r < p.n_rules; r++) /* n_rules grows as groups and repetitions add rules */
        if (p.rules[r].body && compile_rule(&p, (uint32_t)r)) goto fail;
    if (!(g = calloc(1, sizeof *g))) {
        oom(&p);
        goto fail;
    }
    g->n_rules = p.n_rules;
    g->root = root;
    g->rule_start = malloc((p.n_rules + 1) * sizeof *g->rule_start);
    g->el = malloc((p.total_el + 1) * sizeof *g->el);
    if (!g->rule_start || !g->el) {
        oom(&p);
        goto fail;
    }
    for (size_t r = 0; r < p.n_rules; r++) {
        g->rule_start[r] = (uint32_t)g->n_el;
        memcpy(g->el + g->n_el, p.rules[r].el, p.rules[r].n * sizeof(GElem));
        g->n_el += p.rules[r].n;
    }
    g->ranges = p.ranges;
    p.ranges = NULL;
    if (!g->ranges && !(g->ranges = calloc(2, sizeof *g->ranges))) {
        oom(&p);
        goto fail;
    } /* only `.`: no ranges */
    g->n_ranges = p.n_ranges / 2;
    g->literals = p.lit;
    p.lit = NULL;
    g->literals_len = p.lit_len;
    if (check(&p, g)) goto fail;
    free_parser(&p);
    return g;
fail:
    grammar_free(g);
    free_parser(&p);
    return NULL;
}

void grammar_free(Grammar *g) {
    if (!g) return;
    free(g->el);
    free(g->rule_start);
    free(g->ranges);
    free(g->minrest);
    free(g->literals);
    free(g);
}

int grammar_has_literal(const Grammar *g, const char *s, size_t n) {
    if (!n) return 0;
    for (size_t at = 0; at + 4 <= g->literals_len;) {
        uint32_t len;
        memcpy(&len, g->literals + at, 4);
        at += 4;
        if (len >= n && memmem(g->literals + at, len, s, n)) return 1;
        at += len;
    }
    return 0;
}
