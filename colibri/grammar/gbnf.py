"""Small builders for GBNF text (the grammar dialect the engine reads, docs/protocol.md)."""

_ESC = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _char(c, specials):
    if c in _ESC and c in specials:
        return _ESC[c]
    if ord(c) < 0x20 or ord(c) == 0x7F:
        return f"\\x{ord(c):02X}"
    if c in specials:
        return "\\" + c
    return c


def literal(text):
    """A GBNF string literal matching exactly `text`."""
    return '"' + "".join(_char(c, '"\\\n\r\t') for c in text) + '"'


def class_char(cp):
    """One code point written for use inside a [...] character class."""
    c = chr(cp)
    if cp > 0xFFFF:
        return f"\\U{cp:08X}"
    if 0xD800 <= cp <= 0xDFFF:
        return f"\\u{cp:04X}"
    return _char(c, '"\\\n\r\t]-^[')


def char_class(ranges, negate=False):
    """[...] over inclusive code point ranges [(lo, hi), ...]."""
    body = "".join(class_char(lo) if lo == hi else f"{class_char(lo)}-{class_char(hi)}" for lo, hi in ranges)
    return "[" + ("^" if negate else "") + body + "]"


def grammar(rules_text, root_expr):
    """A whole grammar: `root ::= root_expr` followed by the rules it uses."""
    return f"root ::= {root_expr}\n{rules_text}"


def wrap(rules_text, rule, before="", after=""):
    """A whole grammar whose output is the literal `before`, then `rule`, then `after`
    (e.g. a tool call: "<tool_call>\\n" call "\\n</tool_call>")."""
    parts = [p for p in (literal(before) if before else "", rule, literal(after) if after else "") if p]
    return grammar(rules_text, " ".join(parts))
