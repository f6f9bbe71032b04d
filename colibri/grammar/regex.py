"""A regular-expression subset (JSON Schema `pattern`) compiled to a GBNF expression over the
*escaped* text of a JSON string: a pattern character `"` becomes `\\"` in the output, a newline
`\\n`, so what the grammar lets through decodes to a string the pattern matches.

Supported: literals and escapes (\\d \\w \\s and their negations, \\t \\n \\r \\f \\v \\xHH \\uHHHH, escaped
punctuation), `.`, classes `[...]` with ranges and negation, groups `(...)` `(?:...)`
`(?P<name>...)` `(?<name>...)`, alternation, `* + ? {m} {m,} {m,n}` (lazy `?` accepted),
`^`/`$` at the ends of a top-level alternative. Anything else (lookaround, backreferences,
word boundaries) raises PatternError."""
from colibri.grammar import gbnf

MAX_CP = 0x10FFFF
MAX_REPEAT = 10000


class PatternError(ValueError):
    pass


def _norm(ranges):
    out = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _negate(ranges):
    out, at = [], 0
    for lo, hi in _norm(ranges):
        if lo > at:
            out.append((at, lo - 1))
        at = hi + 1
    if at <= MAX_CP:
        out.append((at, MAX_CP))
    return out


DIGIT = [(0x30, 0x39)]
WORD = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
SPACE = [(0x09, 0x0D), (0x20, 0x20)]
SHORTHAND = {"d": DIGIT, "w": WORD, "s": SPACE}
SIMPLE_ESC = {"t": 9, "n": 10, "r": 13, "f": 12, "v": 11, "0": 0}
_JSON_ESC = {0x22: '\\"', 0x5C: "\\\\", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t", 0x08: "\\b", 0x0C: "\\f"}


def json_chars(ranges):
    """GBNF for one JSON-string character from the code point ranges, written escaped where
    JSON needs it (quote, backslash, control characters); surrogates cannot occur."""
    special = [(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0xD800, 0xDFFF)]
    raw = _norm(ranges)
    for s_lo, s_hi in special:
        cut = []
        for lo, hi in raw:
            if hi < s_lo or lo > s_hi:
                cut.append((lo, hi))
                continue
            if lo < s_lo:
                cut.append((lo, s_lo - 1))
            if hi > s_hi:
                cut.append((s_hi + 1, hi))
        raw = cut
    alts = [gbnf.char_class(raw)] if raw else []
    for cp in [c for c in list(range(0x20)) + [0x22, 0x5C] if any(lo <= c <= hi for lo, hi in ranges)]:
        alts.append(gbnf.literal(_JSON_ESC.get(cp, f"\\u{cp:04x}")))
    if not alts:
        raise PatternError("a character class that matches no character")
    return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"


ANY_NO_NL = _negate([(0x0A, 0x0A)])


class _Parser:
    def __init__(self, src):
        self.s, self.i = src, 0

    def peek(self):
        return self.s[self.i] if self.i < len(self.s) else None

    def take(self):
        c = self.peek()
        if c is None:
            raise PatternError(f"pattern ends early at character {self.i}")
        self.i += 1
        return c

    def fail(self, what):
        raise PatternError(f"{what} at character {self.i} of the pattern is not supported")

    def top(self, any_char):
        """The whole pattern: top-level alternatives with their own anchors."""
        alts = []
        while True:
            start = self.peek() == "^"
            if start:
                self.i += 1
            seq = self.sequence(top=True)
            end = self.peek() == "$"
            if end:
                self.i += 1
            parts = ([] if start else [any_char + "*"]) + ([seq] if seq else []) + ([] if end else [any_char + "*"])
            alts.append(" ".join(parts) if parts else '""')
            if self.peek() == "|":
                self.i += 1
                continue
            if self.peek() is not None:
                self.fail(f"'{self.peek()}'")
            break
        return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"

    def alternation(self):
        alts = [self.sequence()]
        while self.peek() == "|":
            self.i += 1
            alts.append(self.sequence())
        alts = [a if a else '""' for a in alts]
        return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"

    def sequence(self, top=False):
        items = []
        while True:
            c = self.peek()
            if c is None or c in "|)" or (top and c == "$" and self.i == len(self.s) - 1):
                break
            if c == "$" and self._dollar_ends_alt():
                break
            atom = self.atom()
            items.append(self.quantified(atom))
        return " ".join(items)

    def _dollar_ends_alt(self):
        nxt = self.s[self.i + 1] if self.i + 1 < len(self.s) else None
        return nxt in (None, "|")

    def atom(self):
        c = self.take()
        if c == "(":
            if self.peek() == "?":
                self.i += 1
                k = self.take()
                if k == ":":
                    pass
                elif k == "P" and self.peek() == "<" or k == "<" and self.peek() not in ("=", "!"):
                    if k == "P":
                        self.i += 1
                    while self.take() != ">":
                        pass
                else:
                    self.i -= 2
                    self.fail("a lookaround or inline flag '(?'")
            inner = self.alternation()
            if self.take() != ")":
                self.fail("an unclosed group")
            return "(" + (inner or '""') + ")"
        if c == "[":
            return json_chars(self.char_class())
        if c == ".":
            return json_chars(ANY_NO_NL)
        if c == "\\":
            return json_chars(self.escape(in_class=False))
        if c in "^$":
            self.i -= 1
            self.fail(f"an anchor '{c}' inside the pattern")
        if c in "*+?{":
            self.i -= 1
            self.fail(f"a quantifier '{c}' with nothing to repeat")
        return json_chars([(ord(c), ord(c))])

    def escape(self, in_class):
        c = self.take()
        if c in SHORTHAND:
            return SHORTHAND[c]
        if c.lower() in SHORTHAND:
            return _negate(SHORTHAND[c.lower()])
        if c in SIMPLE_ESC:
            cp = SIMPLE_ESC[c]
            return [(cp, cp)]
        if c in "xu":
            n = 2 if c == "x" else 4
            h = self.s[self.i:self.i + n]
            if len(h) != n or any(d not in "0123456789abcdefABCDEF" for d in h):
                self.fail(f"a malformed \\{c} escape")
            self.i += n
            cp = int(h, 16)
            return [(cp, cp)]
        if c == "b" and in_class:
            return [(8, 8)]
        if c.isalnum():
            self.i -= 2
            self.fail(f"the escape '\\{c}'")
        return [(ord(c), ord(c))]

    def char_class(self):
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        ranges, first = [], True
        while True:
            c = self.take()
            if c == "]" and not first:
                break
            first = False
            if c == "\\":
                r = self.escape(in_class=True)
            else:
                r = [(ord(c), ord(c))]
            if self.peek() == "-" and self.i + 1 < len(self.s) and self.s[self.i + 1] != "]" and len(r) == 1 \
                    and r[0][0] == r[0][1]:
                self.i += 1
                c2 = self.take()
                r2 = self.escape(in_class=True) if c2 == "\\" else [(ord(c2), ord(c2))]
                if len(r2) != 1 or r2[0][0] != r2[0][1] or r2[0][0] < r[0][0]:
                    self.fail("a bad character range")
                r = [(r[0][0], r2[0][0])]
            ranges += r
        return _negate(ranges) if negate else _norm(ranges)

    def quantified(self, atom):
        c = self.peek()
        if c is None or c not in "*+?{":
            return atom
        if c == "{":
            j = self.s.find("}", self.i)
            body = self.s[self.i + 1:j] if j > 0 else ""
            lo, sep, hi = body.partition(",")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                return atom  # a literal '{' as Python's re reads it
            self.i = j + 1
            lo = int(lo)
            hi = lo if not sep else (int(hi) if hi else None)
            if (hi is not None and hi < lo) or lo > MAX_REPEAT or (hi or 0) > MAX_REPEAT:
                self.fail(f"the repetition {{{body}}}")
            q = f"{{{lo}}}" if not sep else (f"{{{lo},}}" if hi is None else f"{{{lo},{hi}}}")
        else:
            self.i += 1
            q = c
        if self.peek() == "?":
            self.i += 1  # lazy: the same language
        elif self.peek() == "+":
            self.fail("a possessive quantifier")
        return f"({atom}){q}" if not atom.startswith("(") else atom + q


def pattern_to_gbnf(pattern, any_char):
    """GBNF for the escaped content of a JSON string matching `pattern` (search semantics: an
    unanchored side may have any characters, `any_char` being the GBNF of one)."""
    return _Parser(pattern).top(any_char)
