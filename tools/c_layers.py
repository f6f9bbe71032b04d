#!/usr/bin/env python3
"""The engine's import map: which file of c/ uses which, from its #include lines and from the
symbols its object file takes from other objects (nm), folded into the bands of
docs/architecture.md. Fails (exit 1) on a file that uses a band above its own (so no circle
between bands can exist), on a file in no band, and on a circle of files by symbol. `make` first (it reads build/obj/rel).

    tools/c_layers.py [--obj DIR] [--print]
"""
import argparse
import collections
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Bottom to top: a band may use the bands before it, never one after it.
BANDS = ("util", "kernels", "io", "tokenizer", "grammar", "experts", "model", "kv", "engine")


def include_edges(c_dir):
    edges = collections.defaultdict(set)
    for f in sorted(c_dir.glob("*/*.[ch]")):
        rel = f.relative_to(c_dir).as_posix()
        if rel.startswith("tests/"):
            continue
        for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', f.read_text(), re.M):
            target = inc if (c_dir / inc).exists() else (f.parent / inc).relative_to(c_dir).as_posix()
            if target != rel and (c_dir / target).exists():
                edges[rel].add(target)
    return edges


def symbol_edges(obj_dir, c_dir):
    """file.c -> file.c for every symbol one object takes from another."""
    defs, uses = {}, {}
    for o in sorted(obj_dir.glob("*/*.o")):
        src = o.relative_to(obj_dir).with_suffix(".c").as_posix()
        if src.startswith("tests/") or not (c_dir / src).exists():
            continue
        out = subprocess.run(["nm", str(o)], capture_output=True, text=True, check=True).stdout
        d, u = set(), set()
        for line in out.splitlines():
            p = line.split()
            if len(p) == 3 and p[1] in "TDBRGSVW":
                d.add(p[2])
            elif len(p) == 2 and p[0] == "U":
                u.add(p[1])
        defs[src], uses[src] = d, u
    owner = {s: f for f, d in defs.items() for s in d}
    edges = collections.defaultdict(set)
    for f, u in uses.items():
        for s in u:
            if s in owner and owner[s] != f:
                edges[f].add(owner[s])
    return edges


def cycles(edges):
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    nodes = set(edges) | {t for ts in edges.values() for t in ts}
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter[0]; counter[0] += 1; stack.append(root); on.add(root)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]; counter[0] += 1; stack.append(nxt); on.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on.discard(w); comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def unit(path):
    """A file by its name without .c or .h."""
    return path[:-2]


def check(c_dir, obj_dir):
    """The problems found, one line each."""
    problems = []
    files = include_edges(c_dir)
    calls = symbol_edges(obj_dir, c_dir)
    for f, ts in calls.items():
        files[f] |= ts
    every = {p.relative_to(c_dir).as_posix() for p in c_dir.glob("*/*.[ch]")}
    for f in sorted(x for x in every if not x.startswith("tests/")):
        if f.split("/")[0] not in BANDS:
            problems.append(f"c/{f}: in no band of {BANDS} (tools/c_layers.py)")
    for f, ts in sorted(files.items()):
        for t in sorted(ts):
            a, b = f.split("/")[0], t.split("/")[0]
            if a in BANDS and b in BANDS and BANDS.index(b) > BANDS.index(a):
                problems.append(f"c/{f} ({a}) uses c/{t} ({b}), a band above it")
    # Circles by symbol: a file that calls (or reads) another that, through others, needs it back.
    # Headers are left out here: a table's header names the types of the families it holds.
    units = collections.defaultdict(set)
    for f, ts in calls.items():
        for t in ts:
            units[unit(f)].add(unit(t))
    for comp in cycles(units):
        problems.append("circle between files: " + " -> ".join(f"c/{u}" for u in comp))
    return problems, files


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--c", default=str(ROOT / "c"))
    ap.add_argument("--obj", default=str(ROOT / "build" / "obj" / "rel"))
    ap.add_argument("--print", action="store_true", help="print the band map")
    args = ap.parse_args()
    problems, files = check(Path(args.c), Path(args.obj))
    if args.print:
        bands = collections.defaultdict(set)
        for f, ts in files.items():
            for t in ts:
                if f.split("/")[0] != t.split("/")[0]:
                    bands[f.split("/")[0]].add(t.split("/")[0])
        for b in BANDS:
            print(f"{b:10s} -> {', '.join(x for x in BANDS if x in bands[b])}")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
