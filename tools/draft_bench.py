#!/usr/bin/env python3
"""Speculative decoding benchmark: decode tok/s with prompt-lookup drafts (--draft lookup) or the
checkpoint's MTP head (--draft mtp) against plain decoding (--draft off), on prompts with much to
copy and on prompts with nothing to copy.

    PYTHONPATH=. tools/draft_bench.py --model smollm2 [--draft lookup|mtp] [--rounds 3] [--threads N]
        [--max-tokens 160] [--adapt on|off] [--temp T --seed S] [--raw] [--json]

Each prompt is a chat request through `coli run` (the model's template, greedy or --temp), run with and
without drafts in turn, the order alternating between rounds: on a shared machine a swing in load
then falls on both sides. Both sides must print the same text (drafts never change greedy
output); the script fails if they do not. Per prompt: median decode tok/s of each side, the median
of the per-round ratios, and the drafted and kept tokens. decode_tok_s is the engine's (tokens
after the first over the time after the first), so the prompt's prefill is not in it."""
import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PASSAGE = ("The expert cache keeps the experts a workload uses most in memory and reads the rest from disk. "
           "Each token routes to a few experts per layer, so a model far larger than RAM decodes at the speed of "
           "the bytes it must read. The dense trunk, the attention and the shared experts stay resident; only "
           "the routed experts stream. A cache that learns the workload turns most reads into hits.")
CODE = '''def load_rows(path):
    rows = []
    with open(path) as f:
        for line in f:
            fields = line.rstrip("\\n").split(",")
            rows.append({"name": fields[0], "size": int(fields[1]), "owner": fields[2]})
    return rows


def total_size(rows):
    total = 0
    for row in rows:
        total += row["size"]
    return total
'''
PROMPTS = {
    "quote": ("copy", f"Repeat this passage exactly, word for word:\n\n{PASSAGE}"),
    "edit-code": ("copy", f"Rename the variable `rows` to `records` everywhere in this code and print the whole "
                          f"code again:\n\n{CODE}"),
    "story": ("none", "Write a short original story about a lighthouse keeper who finds a strange map."),
    "list": ("none", "List ten creative names for a bakery, each with a one-line reason."),
}


def run_once(args, prompt, draft):
    cmd = [sys.executable, str(ROOT / "coli"), "run", "--model", args.model, "--temp", str(args.temp), "--seed",
           str(args.seed), "--max-tokens", str(args.max_tokens), "--stats", "--draft", draft, prompt]
    if draft != "off":
        cmd += ["--draft-adapt", args.adapt]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.raw:
        cmd.append("--raw")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise SystemExit(f"coli run failed ({r.returncode}):\n{r.stderr[-2000:]}")
    stats = dict(re.findall(r"(\w+)=(\S+)", r.stderr.strip().splitlines()[-1]))
    return r.stdout, stats


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="model name or container directory")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--draft", choices=("lookup", "mtp"), default="lookup",
                    help="the drafter compared with plain decoding (mtp: models whose container runs an MTP head)")
    ap.add_argument("--adapt", choices=("on", "off"), default="on", help="--draft-adapt of the drafted side")
    ap.add_argument("--temp", type=float, default=0.0, help="sampling temperature (default 0: greedy); with a seed "
                    "both sides still print the same text")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--raw", action="store_true", help="send the prompts without the chat template")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    results = {}
    for name, (kind, prompt) in PROMPTS.items():
        plain, drafted, ratios, drafts = [], [], [], []
        for rnd in range(args.rounds):
            order = ("off", args.draft) if rnd % 2 == 0 else (args.draft, "off")
            got = {d: run_once(args, prompt, d) for d in order}
            if got["off"][0] != got[args.draft][0]:
                raise SystemExit(f"{name}: the drafted output differs from plain decoding")
            p, d = float(got["off"][1]["decode_tok_s"]), float(got[args.draft][1]["decode_tok_s"])
            plain.append(p)
            drafted.append(d)
            ratios.append(d / p if p else 0.0)
            st = got[args.draft][1]
            drafts.append((int(st.get("draft_tokens", 0)), int(st.get("draft_accepted", 0)), int(st["completion_tokens"])))
        results[name] = {"kind": kind, "plain_tok_s": statistics.median(plain), "draft_tok_s": statistics.median(drafted),
                         "ratio": statistics.median(ratios), "draft_tokens": drafts[-1][0],
                         "draft_accepted": drafts[-1][1], "completion_tokens": drafts[-1][2]}
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'prompt':10s} {'kind':5s} {'plain tok/s':>11s} {args.draft + ' tok/s':>12s} {'ratio':>6s} {'kept/drafted':>13s}")
    for name, r in results.items():
        print(f"{name:10s} {r['kind']:5s} {r['plain_tok_s']:11.1f} {r['draft_tok_s']:12.1f} {r['ratio']:6.2f} "
              f"{r['draft_accepted']:6d}/{r['draft_tokens']:<6d} ({r['completion_tokens']} tokens)")


if __name__ == "__main__":
    main()
