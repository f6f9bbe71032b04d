/* Backtracking regex subset for pre-tokenizer Split patterns (see tok_regex.h).
 *
 * Matching is continuation-passing: a node matches, then calls the rest of its sequence, then
 * the enclosing sequences through a linked list of continuations on the C stack. Quantified
 * single-character atoms backtrack in a loop, so recursion depth is bounded by the pattern,
 * never by the input length; a step budget turns pathological backtracking into an error. */
#include "tokenizer/tok_regex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "tokenizer/unicode_tables.h"
#include "util/grow.h"

#define MAX_PATTERN_DEPTH 64
#define REPEAT_INF 0x7fffffff

enum { IT_RANGE, IT_CATS, IT_SPACE, IT_WORD, IT_ANY };
typedef struct {
    uint8_t type, neg;
    uint32_t lo, hi;
} Item; /* IT_CATS: lo = category mask */
typedef struct {
    Item *items;
    int n;
    size_t cap;
    int negated, ci;
    uint32_t ascii[4]; /* final answer for code points < 128 */
} Class;

enum { N_CLASS, N_GROUP, N_LOOK, N_BOL, N_EOL, N_BOS, N_EOS, N_EOSNL };
typedef struct Alt Alt;
typedef struct {
    int kind;
    int min, max;
    uint8_t lazy, poss, neg;
    Class *cls;
    Alt *alt;
} Node;
typedef struct {
    Node *v;
    int n;
    size_t cap;
} Seq;
struct Alt {
    Seq *v;
    int n;
    size_t cap;
};
struct TokRegex {
    Alt *root;
};

/* ------------------------------------------------------------------ classes */

#define CAT(x) (1u << UNI_##x)
#define M_L (CAT(Lu) | CAT(Ll) | CAT(Lt) | CAT(Lm) | CAT(Lo))
#define M_M (CAT(Mn) | CAT(Mc) | CAT(Me))
#define M_N (CAT(Nd) | CAT(Nl) | CAT(No))
#define M_P (CAT(Pc) | CAT(Pd) | CAT(Ps) | CAT(Pe) | CAT(Pi) | CAT(Pf) | CAT(Po))
#define M_S (CAT(Sm) | CAT(Sc) | CAT(Sk) | CAT(So))
#define M_Z (CAT(Zs) | CAT(Zl) | CAT(Zp))
#define M_C (CAT(Cc) | CAT(Cf) | CAT(Cs) | CAT(Co) | CAT(Cn))

static int items_match(const Class *c, uint32_t cp) {
    uint8_t props = uni_props(cp);
    int cat = props & UNI_CAT_MASK;
    for (int i = 0; i < c->n; i++) {
        const Item *it = &c->items[i];
        int m;
        switch (it->type) {
        case IT_RANGE: m = cp >= it->lo && cp <= it->hi; break;
        case IT_CATS: m = (it->lo >> cat) & 1; break;
        case IT_SPACE: m = (props & UNI_F_SPACE) != 0; break;
        case IT_WORD: m = ((M_L | M_M | CAT(Nd) | CAT(Pc)) >> cat) & 1; break;
        default: m = cp != '\n'; break;
        }
        if (m ^ it->neg) return 1;
    }
    return 0;
}

static uint32_t swap_ascii_case(uint32_t c) {
    if (c >= 'a' && c <= 'z') return c - 32;
    if (c >= 'A' && c <= 'Z') return c + 32;
    return c;
}

/* Oniguruma case folding restricted to ASCII plus the two non-ASCII code points that fold
 * onto ASCII letters (U+017F long s, U+212A Kelvin sign). */
static int class_match_slow(const Class *c, uint32_t cp) {
    int m = items_match(c, cp);
    if (!m && c->ci) {
        if (cp == 0x17F) m = items_match(c, 's') || items_match(c, 'S');
        else if (cp == 0x212A) m = items_match(c, 'k') || items_match(c, 'K');
    }
    return m ^ c->negated;
}

static inline int class_match(const Class *c, uint32_t cp) {
    if (cp < 128) return (c->ascii[cp >> 5] >> (cp & 31)) & 1;
    return class_match_slow(c, cp);
}

static void class_finish(Class *c) {
    memset(c->ascii, 0, sizeof c->ascii);
    for (uint32_t ch = 0; ch < 128; ch++) {
        int m = items_match(c, ch);
        if (c->ci) {
            m = m || items_match(c, swap_ascii_case(ch));
            if (ch == 's' || ch == 'S') m = m || items_match(c, 0x17F);
            if (ch == 'k' || ch == 'K') m = m || items_match(c, 0x212A);
        }
        if (m ^ c->negated) c->ascii[ch >> 5] |= 1u << (ch & 31);
    }
}

/* ------------------------------------------------------------------ parser */

typedef struct {
    const unsigned char *p;
    size_t len, pos;
    int ci;
    char *err;
    size_t errlen;
    int failed;
} Parser;

static int perr(Parser *ps, const char *msg) {
    if (!ps->failed) {
        ps->failed = 1;
        snprintf(ps->err, ps->errlen, "%s at offset %zu", msg, ps->pos);
    }
    return -1;
}

static void class_free(Class *c) {
    if (!c) return;
    free(c->items);
    free(c);
}

static void alt_free(Alt *a);
static void seq_free_nodes(Seq *s) {
    for (int i = 0; i < s->n; i++) {
        class_free(s->v[i].cls);
        alt_free(s->v[i].alt);
    }
    free(s->v);
}
static void alt_free(Alt *a) {
    if (!a) return;
    for (int i = 0; i < a->n; i++) seq_free_nodes(&a->v[i]);
    free(a->v);
    free(a);
}

static int class_add(Parser *ps, Class *c, int type, int neg, uint32_t lo, uint32_t hi) {
    Item *v = grow_array(c->items, &c->cap, (size_t)c->n + 1, sizeof *v, 8);
    if (!v) return perr(ps, "out of memory");
    c->items = v;
    c->items[c->n++] = (Item){(uint8_t)type, (uint8_t)neg, lo, hi};
    return 0;
}

static int has_cased(uint32_t lo, uint32_t hi) {
    if (lo < 128) lo = 128;
    for (uint32_t cp = lo; cp <= hi && cp < 0x110000; cp++) {
        int cat = uni_cat(cp);
        if (cat == UNI_Lu || cat == UNI_Ll || cat == UNI_Lt) return 1;
    }
    return 0;
}

static int class_add_range(Parser *ps, Class *c, uint32_t lo, uint32_t hi) {
    if (lo > hi) return perr(ps, "regex: empty range in character class");
    if (ps->ci && hi >= 128 && has_cased(lo, hi))
        return perr(ps, "regex: case-insensitive matching of non-ASCII letters is not supported");
    return class_add(ps, c, IT_RANGE, 0, lo, hi);
}

static uint32_t next_cp(Parser *ps) {
    size_t adv;
    uint32_t cp = u8_decode(ps->p + ps->pos, &adv);
    ps->pos += adv;
    return cp;
}

static int property_mask(const char *name, uint32_t *mask) {
    static const struct {
        const char *n;
        uint32_t m;
    } tab[] = {
        {"l", M_L},
        {"letter", M_L},
        {"lc", CAT(Lu) | CAT(Ll) | CAT(Lt)},
        {"l&", CAT(Lu) | CAT(Ll) | CAT(Lt)},
        {"casedletter", CAT(Lu) | CAT(Ll) | CAT(Lt)},
        {"lu", CAT(Lu)},
        {"uppercaseletter", CAT(Lu)},
        {"ll", CAT(Ll)},
        {"lowercaseletter", CAT(Ll)},
        {"lt", CAT(Lt)},
        {"titlecaseletter", CAT(Lt)},
        {"lm", CAT(Lm)},
        {"modifierletter", CAT(Lm)},
        {"lo", CAT(Lo)},
        {"otherletter", CAT(Lo)},
        {"m", M_M},
        {"mark", M_M},
        {"combiningmark", M_M},
        {"mn", CAT(Mn)},
        {"nonspacingmark", CAT(Mn)},
        {"mc", CAT(Mc)},
        {"spacingmark", CAT(Mc)},
        {"me", CAT(Me)},
        {"enclosingmark", CAT(Me)},
        {"n", M_N},
        {"number", M_N},
        {"nd", CAT(Nd)},
        {"decimalnumber", CAT(Nd)},
        {"nl", CAT(Nl)},
        {"letternumber", CAT(Nl)},
        {"no", CAT(No)},
        {"othernumber", CAT(No)},
        {"p", M_P},
        {"punctuation", M_P},
        {"pc", CAT(Pc)},
        {"connectorpunctuation", CAT(Pc)},
        {"pd", CAT(Pd)},
        {"dashpunctuation", CAT(Pd)},
        {"ps", CAT(Ps)},
        {"openpunctuation", CAT(Ps)},
        {"pe", CAT(Pe)},
        {"closepunctuation", CAT(Pe)},
        {"pi", CAT(Pi)},
        {"initialpunctuation", CAT(Pi)},
        {"pf", CAT(Pf)},
        {"finalpunctuation", CAT(Pf)},
        {"po", CAT(Po)},
        {"otherpunctuation", CAT(Po)},
        {"s", M_S},
        {"symbol", M_S},
        {"sm", CAT(Sm)},
        {"mathsymbol", CAT(Sm)},
        {"sc", CAT(Sc)},
        {"currencysymbol", CAT(Sc)},
        {"sk", CAT(Sk)},
        {"modifiersymbol", CAT(Sk)},
        {"so", CAT(So)},
        {"othersymbol", CAT(So)},
        {"z", M_Z},
        {"separator", M_Z},
        {"zs", CAT(Zs)},
        {"spaceseparator", CAT(Zs)},
        {"zl", CAT(Zl)},
        {"lineseparator", CAT(Zl)},
        {"zp", CAT(Zp)},
        {"paragraphseparator", CAT(Zp)},
        {"c", M_C},
        {"other", M_C},
        {"cc", CAT(Cc)},
        {"control", CAT(Cc)},
        {"cf", CAT(Cf)},
        {"format", CAT(Cf)},
        {"cs", CAT(Cs)},
        {"surrogate", CAT(Cs)},
        {"co", CAT(Co)},
        {"privateuse", CAT(Co)},
        {"cn", CAT(Cn)},
        {"unassigned", CAT(Cn)},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (!strcmp(tab[i].n, name)) {
            *mask = tab[i].m;
            return 0;
        }
    return -1;
}

/* After "\p" or "\P": parses {Name} / {^Name} and adds the item. */
static int parse_property(Parser *ps, Class *c, int neg) {
    if (ps->pos >= ps->len || ps->p[ps->pos] != '{') return perr(ps, "regex: expected '{' after \\p");
    ps->pos++;
    if (ps->pos < ps->len && ps->p[ps->pos] == '^') {
        neg = !neg;
        ps->pos++;
    }
    char name[40];
    size_t k = 0;
    while (ps->pos < ps->len && ps->p[ps->pos] != '}') {
        unsigned char ch = ps->p[ps->pos++];
        if (ch == '_' || ch == ' ' || ch == '-') continue; /* Oniguruma ignores these in names */
        if (k + 1 >= sizeof name) return perr(ps, "regex: property name too long");
        name[k++] = (char)(ch >= 'A' && ch <= 'Z' ? ch + 32 : ch);
    }
    if (ps->pos >= ps->len) return perr(ps, "regex: unterminated \\p{...}");
    ps->pos++;
    name[k] = 0;
    uint32_t mask;
    if (property_mask(name, &mask)) {
        char msg[96];
        snprintf(msg, sizeof msg, "regex: unsupported Unicode property \\p{%s}", name);
        return perr(ps, msg);
    }
    if (ps->ci) return perr(ps, "regex: \\p{...} inside a case-insensitive group is not supported");
    return class_add(ps, c, IT_CATS, neg, mask, 0);
}

static int hex_value(Parser *ps, int maxdigits, uint32_t *out) {
    uint32_t v = 0;
    int n = 0;
    while (n < maxdigits && ps->pos < ps->len) {
        unsigned ch = ps->p[ps->pos];
        int d = ch >= '0' && ch <= '9'   ? (int)ch - '0'
                : ch >= 'a' && ch <= 'f' ? (int)ch - 'a' + 10
                : ch >= 'A' && ch <= 'F' ? (int)ch - 'A' + 10
                                         : -1;
        if (d < 0) break;
        v = v * 16 + (uint32_t)d;
        if (v > 0x10FFFF) return perr(ps, "regex: code point out of range");
        ps->pos++;
        n++;
    }
    if (!n) return perr(ps, "regex: bad hex escape");
    *out = v;
    return 0;
}

/* Parses an escape after '\'. Either adds a class item (returns 1) or yields a literal code
 * point in *lit (returns 0). in_class: inside [...]. */
static int parse_escape(Parser *ps, Class *c, uint32_t *lit, int in_class) {
    if (ps->pos >= ps->len) return perr(ps, "regex: trailing backslash");
    unsigned char e = ps->p[ps->pos];
    if (e >= 0x80) {
        *lit = next_cp(ps);
        return 0;
    }
    ps->pos++;
    switch (e) {
    case 'p': return parse_property(ps, c, 0) ? -1 : 1;
    case 'P': return parse_property(ps, c, 1) ? -1 : 1;
    case 's': return class_add(ps, c, IT_SPACE, 0, 0, 0) ? -1 : 1;
    case 'S': return class_add(ps, c, IT_SPACE, 1, 0, 0) ? -1 : 1;
    case 'd': return class_add(ps, c, IT_CATS, 0, CAT(Nd), 0) ? -1 : 1;
    case 'D': return class_add(ps, c, IT_CATS, 1, CAT(Nd), 0) ? -1 : 1;
    case 'w': return class_add(ps, c, IT_WORD, 0, 0, 0) ? -1 : 1;
    case 'W': return class_add(ps, c, IT_WORD, 1, 0, 0) ? -1 : 1;
    case 't': *lit = '\t'; return 0;
    case 'n': *lit = '\n'; return 0;
    case 'r': *lit = '\r'; return 0;
    case 'f': *lit = '\f'; return 0;
    case 'v': *lit = '\v'; return 0;
    case 'a': *lit = 7; return 0;
    case 'e': *lit = 27; return 0;
    case 'x':
        if (ps->pos < ps->len && ps->p[ps->pos] == '{') {
            ps->pos++;
            if (hex_value(ps, 8, lit)) return -1;
            if (ps->pos >= ps->len || ps->p[ps->pos] != '}') return perr(ps, "regex: bad \\x{...}");
            ps->pos++;
            return 0;
        }
        return hex_value(ps, 2, lit) ? -1 : 0;
    case 'u': return hex_value(ps, 4, lit) ? -1 : 0;
    default:
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9')) {
            char msg[64];
            snprintf(msg, sizeof msg, "regex: unsupported escape \\%c%s", e, in_class ? " in class" : "");
            return perr(ps, msg);
        }
        *lit = e; /* escaped punctuation is literal */
        return 0;
    }
}

static int parse_class(Parser *ps, Class *c) {
    /* ps->pos is just after '[' */
    if (ps->pos < ps->len && ps->p[ps->pos] == '^') {
        c->negated = 1;
        ps->pos++;
    }
    int first = 1;
    for (;;) {
        if (ps->pos >= ps->len) return perr(ps, "regex: unterminated character class");
        unsigned char ch = ps->p[ps->pos];
        if (ch == ']' && !first) {
            ps->pos++;
            break;
        }
        first = 0;
        if (ch == '[') return perr(ps, "regex: nested character classes / POSIX brackets are not supported");
        if (ch == '&' && ps->pos + 1 < ps->len && ps->p[ps->pos + 1] == '&')
            return perr(ps, "regex: class intersection && is not supported");
        uint32_t lo;
        if (ch == '\\') {
            ps->pos++;
            int r = parse_escape(ps, c, &lo, 1);
            if (r < 0) return -1;
            if (r == 1) continue;
        } else lo = next_cp(ps);
        uint32_t hi = lo;
        if (ps->pos + 1 < ps->len && ps->p[ps->pos] == '-' && ps->p[ps->pos + 1] != ']') {
            ps->pos++;
            if (ps->p[ps->pos] == '\\') {
                ps->pos++;
                Class tmp = {0};
                int r = parse_escape(ps, &tmp, &hi, 1);
                free(tmp.items);
                if (r < 0) return -1;
                if (r == 1) return perr(ps, "regex: class escape as range end");
            } else hi = next_cp(ps);
        }
        if (class_add_range(ps, c, lo, hi)) return -1;
    }
    return 0;
}

static int seq_push(Parser *ps, Seq *s, Node nd) {
    Node *v = grow_array(s->v, &s->cap, (size_t)s->n + 1, sizeof *v, 8);
    if (!v) return perr(ps, "out of memory");
    s->v = v;
    s->v[s->n++] = nd;
    return 0;
}

static int parse_int(Parser *ps, int *out) {
    int v = 0, n = 0;
    while (ps->pos < ps->len && ps->p[ps->pos] >= '0' && ps->p[ps->pos] <= '9') {
        v = v * 10 + (ps->p[ps->pos++] - '0');
        if (v > 100000) return -1;
        n++;
    }
    *out = v;
    return n;
}

/* Tries to read {n}, {n,}, {n,m}, {,m}; restores pos and returns 0 when it is not one. */
static int parse_braces(Parser *ps, int *mn, int *mx) {
    size_t save = ps->pos;
    ps->pos++;
    int a = 0, b, na = parse_int(ps, &a);
    if (na < 0) goto no;
    if (ps->pos < ps->len && ps->p[ps->pos] == '}') {
        if (!na) goto no;
        ps->pos++;
        *mn = *mx = a;
        return 1;
    }
    if (ps->pos >= ps->len || ps->p[ps->pos] != ',') goto no;
    ps->pos++;
    int nb = parse_int(ps, &b);
    if (nb < 0 || ps->pos >= ps->len || ps->p[ps->pos] != '}' || (!na && !nb)) goto no;
    ps->pos++;
    *mn = a;
    *mx = nb ? b : REPEAT_INF;
    return 1;
no:
    ps->pos = save;
    return 0;
}

static Alt *parse_alt(Parser *ps, int depth);

static int parse_quant(Parser *ps, Node *nd) {
    if (ps->pos >= ps->len) return 0;
    unsigned char ch = ps->p[ps->pos];
    int mn, mx;
    if (ch == '?') {
        mn = 0;
        mx = 1;
        ps->pos++;
    } else if (ch == '*') {
        mn = 0;
        mx = REPEAT_INF;
        ps->pos++;
    } else if (ch == '+') {
        mn = 1;
        mx = REPEAT_INF;
        ps->pos++;
    } else if (ch == '{') {
        if (!parse_braces(ps, &mn, &mx)) return 0;
    } else return 0;
    if (mn > mx) return perr(ps, "regex: bad repeat range");
    if (ps->pos < ps->len && ps->p[ps->pos] == '?') {
        nd->lazy = 1;
        ps->pos++;
    } else if (ps->pos < ps->len && ps->p[ps->pos] == '+' && ch != '{') {
        nd->poss = 1;
        ps->pos++;
    }
    if (nd->kind == N_GROUP) {
        if (mx > 1) return perr(ps, "regex: repeated groups are not supported (only ? on a group)");
        if (nd->poss) return perr(ps, "regex: possessive group quantifier is not supported");
    } else if (nd->kind != N_CLASS) return perr(ps, "regex: quantifier on an anchor or lookaround");
    nd->min = mn;
    nd->max = mx;
    if (ps->pos < ps->len) {
        unsigned char nx = ps->p[ps->pos];
        if (nx == '?' || nx == '*' || nx == '+' || (nx == '{' && parse_braces(ps, &mn, &mx)))
            return perr(ps, "regex: nested quantifiers are not supported");
    }
    return 0;
}

static int parse_seq(Parser *ps, Seq *s, int depth) {
    while (ps->pos < ps->len) {
        unsigned char ch = ps->p[ps->pos];
        if (ch == '|' || ch == ')') break;
        Node nd = {0};
        nd.min = nd.max = 1;
        if (ch == '(') {
            ps->pos++;
            int kind = N_GROUP, neg = 0, saved_ci = ps->ci;
            if (ps->pos < ps->len && ps->p[ps->pos] == '?') {
                ps->pos++;
                unsigned char g = ps->pos < ps->len ? ps->p[ps->pos] : 0;
                if (g == ':') ps->pos++;
                else if (g == '=' || g == '!') {
                    kind = N_LOOK;
                    neg = g == '!';
                    ps->pos++;
                } else if (g == 'i' || g == '-') {
                    int on = g == 'i';
                    ps->pos++;
                    if (!on) {
                        if (ps->pos >= ps->len || ps->p[ps->pos] != 'i') return perr(ps, "regex: unsupported inline option");
                        ps->pos++;
                    }
                    if (ps->pos < ps->len && ps->p[ps->pos] == ')') { /* (?i) for the rest of the group */
                        ps->pos++;
                        ps->ci = on;
                        continue;
                    }
                    if (ps->pos >= ps->len || ps->p[ps->pos] != ':') return perr(ps, "regex: unsupported inline option");
                    ps->pos++;
                    ps->ci = on;
                } else return perr(ps, "regex: unsupported group type (lookbehind, atomic, named or option group)");
            }
            if (depth >= MAX_PATTERN_DEPTH) return perr(ps, "regex: groups nested too deeply");
            nd.kind = kind;
            nd.neg = (uint8_t)neg;
            nd.alt = parse_alt(ps, depth + 1);
            ps->ci = saved_ci;
            if (!nd.alt) return -1;
            if (ps->pos >= ps->len || ps->p[ps->pos] != ')') {
                alt_free(nd.alt);
                return perr(ps, "regex: missing ')'");
            }
            ps->pos++;
        } else if (ch == '^' || ch == '$') {
            ps->pos++;
            nd.kind = ch == '^' ? N_BOL : N_EOL;
        } else {
            nd.kind = N_CLASS;
            nd.cls = calloc(1, sizeof(Class));
            if (!nd.cls) return perr(ps, "out of memory");
            nd.cls->ci = ps->ci;
            int r = 0;
            uint32_t lit = 0;
            if (ch == '[') {
                ps->pos++;
                r = parse_class(ps, nd.cls) ? -1 : 1;
            } else if (ch == '.') {
                ps->pos++;
                r = class_add(ps, nd.cls, IT_ANY, 0, 0, 0) ? -1 : 1;
            } else if (ch == '\\') {
                unsigned char e = ps->pos + 1 < ps->len ? ps->p[ps->pos + 1] : 0;
                if (e == 'A' || e == 'z' || e == 'Z') {
                    ps->pos += 2;
                    class_free(nd.cls);
                    nd.cls = NULL;
                    nd.kind = e == 'A' ? N_BOS : e == 'z' ? N_EOS : N_EOSNL;
                    r = 2;
                } else if (e == 'b' || e == 'B' || e == 'G' || e == 'K' || e == 'R' || e == 'X' || (e >= '1' && e <= '9')) {
                    ps->pos++;
                    class_free(nd.cls);
                    char msg[64];
                    snprintf(msg, sizeof msg, "regex: unsupported escape \\%c", e);
                    return perr(ps, msg);
                } else {
                    ps->pos++;
                    r = parse_escape(ps, nd.cls, &lit, 0);
                }
            } else if (ch == '*' || ch == '+' || ch == '?') {
                class_free(nd.cls);
                return perr(ps, "regex: quantifier without a target");
            } else lit = next_cp(ps);
            if (r < 0) {
                class_free(nd.cls);
                return -1;
            }
            if (r == 0 && class_add_range(ps, nd.cls, lit, lit)) {
                class_free(nd.cls);
                return -1;
            }
            if (nd.cls) class_finish(nd.cls);
        }
        if (parse_quant(ps, &nd) || seq_push(ps, s, nd)) {
            class_free(nd.cls);
            alt_free(nd.alt);
            return -1;
        }
    }
    return 0;
}

static Alt *parse_alt(Parser *ps, int depth) {
    Alt *a = calloc(1, sizeof(Alt));
    if (!a) {
        perr(ps, "out of memory");
        return NULL;
    }
    for (;;) {
        Seq *v = grow_array(a->v, &a->cap, (size_t)a->n + 1, sizeof *v, 4);
        if (!v) {
            perr(ps, "out of memory");
            alt_free(a);
            return NULL;
        }
        a->v = v;
        Seq *s = &a->v[a->n++];
        memset(s, 0, sizeof *s);
        if (parse_seq(ps, s, depth)) {
            alt_free(a);
            return NULL;
        }
        if (ps->pos < ps->len && ps->p[ps->pos] == '|') {
            ps->pos++;
            continue;
        }
        return a;
    }
}

TokRegex *tok_regex_compile(const char *pat, size_t len, char *err, size_t errlen) {
    if (tok_u8_first_invalid((const unsigned char *)pat, len) != len) {
        snprintf(err, errlen, "regex: pattern is not valid UTF-8");
        return NULL;
    }
    Parser ps = {(const unsigned char *)pat, len, 0, 0, err, errlen, 0};
    Alt *root = parse_alt(&ps, 0);
    if (!root) return NULL;
    if (ps.pos != len) {
        perr(&ps, "regex: unbalanced ')'");
        alt_free(root);
        return NULL;
    }
    TokRegex *re = malloc(sizeof *re);
    if (!re) {
        alt_free(root);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    re->root = root;
    return re;
}

void tok_regex_free(TokRegex *re) {
    if (!re) return;
    alt_free(re->root);
    free(re);
}

/* ------------------------------------------------------------------ matcher */

typedef struct Cont {
    const Seq *seq;
    int idx;
    const struct Cont *next;
} Cont;
typedef struct {
    const unsigned char *s;
    size_t n;
    uint64_t *steps;
    int aborted;
} Ctx;

static long m_seq(Ctx *c, const Seq *q, int i, size_t pos, const Cont *k);

static long m_alt(Ctx *c, const Alt *a, size_t pos, const Cont *k) {
    for (int j = 0; j < a->n; j++) {
        long r = m_seq(c, &a->v[j], 0, pos, k);
        if (r >= 0 || c->aborted) return r;
    }
    return -1;
}

static inline int tick(Ctx *c) {
    if (*c->steps == 0) {
        c->aborted = 1;
        return 1;
    }
    (*c->steps)--;
    return 0;
}

/* Steps one UTF-8 character back (input is valid UTF-8). */
static inline size_t back1(const unsigned char *s, size_t p) {
    do p--;
    while ((s[p] & 0xC0) == 0x80);
    return p;
}

static long m_seq(Ctx *c, const Seq *q, int i, size_t pos, const Cont *k) {
    const unsigned char *s = c->s;
    size_t n = c->n, adv;
    for (;;) {
        if (i == q->n) {
            if (!k) return (long)pos;
            q = k->seq;
            i = k->idx;
            k = k->next;
            continue;
        }
        if (tick(c)) return -1;
        const Node *nd = &q->v[i];
        switch (nd->kind) {
        case N_CLASS: {
            const Class *cl = nd->cls;
            if (nd->max == 1 && nd->min == 1) {
                if (pos >= n || !class_match(cl, u8_decode(s + pos, &adv))) return -1;
                pos += adv;
                i++;
                continue;
            }
            size_t p = pos;
            int cnt = 0;
            if (nd->lazy) {
                while (cnt < nd->min) {
                    if (p >= n || !class_match(cl, u8_decode(s + p, &adv))) return -1;
                    p += adv;
                    cnt++;
                }
                for (;;) {
                    long r = m_seq(c, q, i + 1, p, k);
                    if (r >= 0 || c->aborted) return r;
                    if (cnt >= nd->max || p >= n || !class_match(cl, u8_decode(s + p, &adv))) return -1;
                    if (tick(c)) return -1;
                    p += adv;
                    cnt++;
                }
            }
            while (cnt < nd->max && p < n && class_match(cl, u8_decode(s + p, &adv))) {
                p += adv;
                cnt++;
            }
            if (cnt < nd->min) return -1;
            if (nd->poss || (i + 1 == q->n && !k)) {
                pos = p;
                i++;
                continue;
            }
            for (;;) {
                long r = m_seq(c, q, i + 1, p, k);
                if (r >= 0 || c->aborted) return r;
                if (cnt == nd->min) return -1;
                if (tick(c)) return -1;
                p = back1(s, p);
                cnt--;
            }
        }
        case N_GROUP: {
            Cont kk = {q, i + 1, k};
            if (nd->lazy && nd->min == 0) {
                long r = m_seq(c, q, i + 1, pos, k);
                if (r >= 0 || c->aborted) return r;
                return m_alt(c, nd->alt, pos, &kk);
            }
            long r = m_alt(c, nd->alt, pos, &kk);
            if (r >= 0 || c->aborted || nd->min == 1) return r;
            i++;
            continue;
        }
        case N_LOOK: {
            long r = m_alt(c, nd->alt, pos, NULL);
            if (c->aborted) return -1;
            if ((r >= 0) == (nd->neg != 0)) return -1;
            i++;
            continue;
        }
        case N_BOL:
            if (pos != 0 && s[pos - 1] != '\n') return -1;
            i++;
            continue;
        case N_EOL:
            if (pos != n && s[pos] != '\n') return -1;
            i++;
            continue;
        case N_BOS:
            if (pos != 0) return -1;
            i++;
            continue;
        case N_EOS:
            if (pos != n) return -1;
            i++;
            continue;
        default:
            if (pos != n && !(pos + 1 == n && s[pos] == '\n')) return -1;
            i++;
            continue;
        }
    }
}

int tok_regex_search(const TokRegex *re, const unsigned char *s, size_t n, size_t from, size_t *ms, size_t *me, uint64_t *steps) {
    Ctx c = {s, n, steps, 0};
    size_t adv;
    for (size_t p = from; p <= n; p += adv) {
        long r = m_alt(&c, re->root, p, NULL);
        if (c.aborted) return -1;
        if (r >= 0) {
            *ms = p;
            *me = (size_t)r;
            return 1;
        }
        if (p == n) break;
        u8_decode(s + p, &adv);
    }
    return 0;
}
