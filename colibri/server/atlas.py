"""The expert atlas: every routed expert placed in 3-D so that experts which fire in the same
turns sit together. The input is the per-turn routing the server keeps (telemetry.py; GET
/v1/colibri/experts?history=1). Each expert becomes a vector of its log counts over the turns,
centred and scaled to unit length, so the dot product of two experts is their co-activation
correlation; the three principal components of those vectors are the coordinates (power
iteration on the turns x turns Gram matrix, which stays small). Experts that never fired sit on
an outer shell. The dashboard's /v1/colibri/atlas builds it live from the server's turns when the
model directory has no experts.json; tools/expert_atlas.py writes that file. Stdlib only."""
import math
from operator import mul

MAX_TURNS = 128   # the most recent turns used: the Gram matrix costs experts x turns^2
LIVE_BUDGET = 8_000_000  # multiply-adds the server spends on a live atlas (about a second of Python)


def profiles(doc, max_turns):
    """Per expert (layer-major) its log counts over the turns -> (rows, totals)."""
    layers, experts = doc["layers"], doc["experts"]
    turns = [t for t in (doc.get("history") or []) if t][-max_turns:]
    n = layers * experts
    rows = [[0.0] * len(turns) for _ in range(n)]
    totals = [0] * n
    for t, routing in enumerate(turns):
        for layer, flat in enumerate(routing[:layers]):
            for j in range(0, len(flat) - 1, 2):
                i = layer * experts + int(flat[j])
                rows[i][t] = math.log1p(flat[j + 1])
                totals[i] += flat[j + 1]
    return rows, totals, len(turns)


def normalise(row):
    """Centred, unit length: dot products become correlations. None for a constant row."""
    m = sum(row) / len(row)
    c = [x - m for x in row]
    norm = math.sqrt(sum(x * x for x in c))
    return [x / norm for x in c] if norm > 1e-12 else None


def top_eigenvectors(gram, k, iters=200):
    """The k leading eigenvectors of a symmetric matrix, by power iteration with deflation."""
    t = len(gram)
    out = []
    for comp in range(k):
        v = [math.cos(1.7 * (i + 1) * (comp + 1)) for i in range(t)]  # deterministic start
        for _ in range(iters):
            w = [sum(map(mul, gram[r], v)) for r in range(t)]
            for u in out:  # stay orthogonal to the components found already
                d = sum(map(mul, w, u))
                w = [a - d * b for a, b in zip(w, u)]
            norm = math.sqrt(sum(x * x for x in w))
            if norm < 1e-12:
                break
            v = [x / norm for x in w]
        out.append(v)
    return out


def shell(i, n, radius=1.3):
    """Point i of n spread evenly over a sphere (the golden-angle spiral)."""
    y = 1 - 2 * (i + 0.5) / n
    r = math.sqrt(max(0.0, 1 - y * y))
    a = i * math.pi * (3 - math.sqrt(5))
    return radius * r * math.cos(a), radius * y, radius * r * math.sin(a)


class NoRouting(ValueError):
    """No turn with routing to place experts by."""


def turns_within(layers, experts, budget=LIVE_BUDGET, most=MAX_TURNS):
    """The most recent turns a layout can use within `budget` multiply-adds (experts x turns^2)."""
    return max(2, min(most, math.isqrt(budget // max(1, layers * experts))))


def layout(doc, max_turns=MAX_TURNS, method="co-activation PCA"):
    layers, experts = doc["layers"], doc["experts"]
    rows, totals, n_turns = profiles(doc, max_turns)
    if not n_turns:
        raise NoRouting("no per-turn routing yet: the server has not finished a turn with an engine that reports "
                        "routing (ROUTING frames); chat a few turns, then run this again")
    unit = [normalise(r) if n_turns > 1 else None for r in rows]
    fired = [i for i, u in enumerate(unit) if u is not None]
    coords = {}
    if fired:
        gram = [[0.0] * n_turns for _ in range(n_turns)]
        cols = list(zip(*(unit[i] for i in fired)))  # one vector per turn over the fired experts
        for a in range(n_turns):
            for b in range(a, n_turns):
                gram[a][b] = gram[b][a] = sum(map(mul, cols[a], cols[b]))
        vecs = top_eigenvectors(gram, min(3, n_turns))
        for i in fired:
            coords[i] = [sum(map(mul, unit[i], v)) for v in vecs] + [0.0] * (3 - len(vecs))
        span = max(max(abs(c) for c in xyz) for xyz in coords.values()) or 1.0
        for i in fired:  # experts with the same profile would coincide: a tiny deterministic spread
            j = [0.02 * math.sin(i * 12.9898 + k * 78.233) for k in range(3)]
            coords[i] = [c / span + d for c, d in zip(coords[i], j)]
    rest = [i for i in range(layers * experts) if i not in coords]
    for k, i in enumerate(rest):
        coords[i] = list(shell(k, len(rest), 1.3 if totals[i] == 0 else 1.1))
    points = [[i // experts, i % experts, *(round(c, 4) for c in coords[i]), totals[i]]
              for i in range(layers * experts)]
    return {"version": 1, "layers": layers, "experts": experts, "layer_index": doc.get("layer_index"),
            "turns": n_turns, "method": method, "fields": ["layer", "expert", "x", "y", "z", "count"],
            "points": points}
