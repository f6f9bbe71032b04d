"""Integer ranges as GBNF over decimal text (no leading zeros, "-0" never written): the integer
keywords minimum / maximum / exclusiveMinimum / exclusiveMaximum of a JSON Schema."""
from colibri.grammar import gbnf

MAX_DIGITS = 16  # integers are written with at most this many digits, bounds or not


def _same_length(a, b):
    """Decimal strings a <= b of one length: the numbers between them, as a GBNF expression."""
    if a == b:
        return gbnf.literal(a)
    if len(a) == 1:
        return f"[{a}-{b}]"
    if a[0] == b[0]:
        return f'"{a[0]}" {_same_length(a[1:], b[1:])}'
    n = len(a) - 1
    if a[1:] == "0" * n and b[1:] == "9" * n:
        return f"[{a[0]}-{b[0]}] [0-9]{{{n}}}"
    alts = [f'"{a[0]}" {_same_length(a[1:], "9" * n)}']
    if int(a[0]) + 1 <= int(b[0]) - 1:
        alts.append(f"[{int(a[0]) + 1}-{int(b[0]) - 1}] [0-9]{{{n}}}")
    alts.append(f'"{b[0]}" {_same_length("0" * n, b[1:])}')
    return "(" + " | ".join(alts) + ")"


def _naturals(lo, hi):
    """0 <= lo <= hi (hi None: unbounded, up to MAX_DIGITS digits)."""
    top = 10 ** MAX_DIGITS - 1 if hi is None else hi
    alts = []
    for length in range(len(str(lo)), len(str(top)) + 1):
        a = max(lo, 10 ** (length - 1) if length > 1 else 0)
        b = min(top, 10 ** length - 1)
        if a <= b:
            alts.append(_same_length(str(a), str(b)))
    return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"


def int_range(lo, hi):
    """GBNF for the integers in [lo, hi]; either bound may be None (unbounded). None when empty."""
    if lo is not None and hi is not None and lo > hi:
        return None
    cap = 10 ** MAX_DIGITS - 1
    lo = -cap if lo is None else max(lo, -cap)
    hi = cap if hi is None else min(hi, cap)
    alts = []
    if lo < 0:  # "-" then the magnitudes max(1, -hi) .. -lo
        alts.append('"-" ' + _naturals(max(1, -hi), -lo))
    if hi >= 0:
        alts.append(_naturals(max(0, lo), hi if hi < cap else None))
    return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"
