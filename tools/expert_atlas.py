#!/usr/bin/env python3
"""Expert atlas: places every routed expert in 3-D so that experts which fire in the same turns
sit together, and writes experts.json for the dashboard's Atlas (served from the model
directory at /v1/colibri/atlas).

    PYTHONPATH=. python tools/expert_atlas.py --server http://127.0.0.1:8000 --out MODEL/experts.json
    PYTHONPATH=. python tools/expert_atlas.py --history saved.json --out experts.json

The input is the per-turn routing a running server keeps (GET /v1/colibri/experts?history=1,
or that document saved to a file). Each expert becomes a vector of its log counts over the
turns, centred and scaled to unit length, so the dot product of two experts is their
co-activation correlation; the three principal components of those vectors are the
coordinates (power iteration on the turns x turns Gram matrix, which stays small). Experts
that never fired sit on an outer shell. Stdlib only.
"""
import argparse
import json
import sys
import urllib.request
from pathlib import Path

from colibri.server.atlas import MAX_TURNS, NoRouting, layout  # noqa: F401 (layout: the tests use it); run as PYTHONPATH=.


def load(args):
    if args.history:
        with open(args.history, encoding="utf-8") as f:
            return json.load(f)
    req = urllib.request.Request(args.server.rstrip("/") + "/v1/colibri/experts?history=1")
    if args.api_key:
        req.add_header("Authorization", f"Bearer {args.api_key}")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--server", help="base URL of a running coli serve / coli web")
    src.add_argument("--history", help="a saved GET /v1/colibri/experts?history=1 document")
    p.add_argument("--api-key", help="the server's API key, when it has one")
    p.add_argument("--out", required=True, help="where to write experts.json (the model directory serves it)")
    p.add_argument("--turns", type=int, default=MAX_TURNS, help=f"most recent turns to use (default {MAX_TURNS})")
    args = p.parse_args(argv)
    if args.turns < 1:
        p.error("--turns must be at least 1")
    try:
        atlas = layout(load(args), args.turns)
    except NoRouting as e:
        raise SystemExit(f"expert_atlas: {e}") from None
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(atlas, f, separators=(",", ":"))
    print(f"expert_atlas: {len(atlas['points'])} experts from {atlas['turns']} turns -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
