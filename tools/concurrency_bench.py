#!/usr/bin/env python3
"""Continuous-batching benchmark: aggregate decode tok/s and per-stream TTFT at each
concurrency, colibri's engine (--parallel P, P requests submitted at once) side by side with
llama.cpp's llama-batched-bench on the same GGUF weights in the same run.

    PYTHONPATH=. tools/concurrency_bench.py --model CONTAINER [--concurrency 1,2,4,8] [--prompt-tokens 64]
        [--gen-tokens 64] [--threads N] [--repeat 3] [--engine-args "--cap 16"]
        [--llama-batched-bench BIN --gguf FILE]

Every stream gets its own prompt of --prompt-tokens ids and generates exactly --gen-tokens
(ignore_eos). Aggregate tok/s = all streams' generated tokens / the wall time from the SUBMITs
to the last END; TTFT = SUBMIT to the stream's first DATA frame. Medians over --repeat rounds.
With streamed experts (--engine-args "--cap N" or "--ram G") it also reports the expert bytes
read per generated token: the batch-union reads each expert once per step for all streams.
Numbers on a shared machine move; compare the ratios measured in one run."""
import argparse
import json
import re
import statistics
import subprocess
import time

from colibri import engine_client  # run as PYTHONPATH=. tools/concurrency_bench.py


def one_round(eng, p, prompt_tokens, gen_tokens, vocab, round_no):
    rids = [f"b{round_no}_{i}" for i in range(p)]
    prompts = [[1 + (97 * i + 31 * j + round_no) % (vocab - 1) for j in range(prompt_tokens)] for i in range(p)]
    t0 = time.perf_counter()
    eng.write(b"".join(engine_client.submit_frame(r, ids, slot=i, max_tokens=gen_tokens, temp=0, ignore_eos=1)
                       for i, (r, ids) in enumerate(zip(rids, prompts))))
    first, ends, tokens, read = {}, 0, 0, 0
    while ends < p:
        verb, f, _ = eng.read_frame()
        if verb == "DATA" and int(f[1]) >= 0:
            tokens += 1
            first.setdefault(f[0], time.perf_counter() - t0)
        elif verb in ("END", "ERROR"):
            if verb == "ERROR":
                raise SystemExit(f"request {f[0]} failed: {f}")
            ends += 1
            # every stream was admitted before the first pass, so each END counts the round so far
            stats = dict(kv.split("=", 1) for kv in f[1:] if "=" in kv)
            read = max(read, int(stats.get("bytes_read", 0)))
    wall = time.perf_counter() - t0
    return tokens / wall, sorted(first.values()), read / max(tokens, 1)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def bench_colibri(args, conc):
    rows = {}
    for p in conc:
        extra = ["--parallel", str(p)] + (["--threads", str(args.threads)] if args.threads else []) + args.engine_args.split()
        with engine_client.Engine(args.model, ctx=args.prompt_tokens + args.gen_tokens + 8, kv_slots=p,
                                  extra=extra) as eng:
            vocab = int(eng.info["vocab"])
            one_round(eng, p, 8, 4, vocab, 999)  # warm-up: page in the weights
            agg, ttft, per_tok = [], [], []
            for r in range(args.repeat):
                a, t, b = one_round(eng, p, args.prompt_tokens, args.gen_tokens, vocab, r)
                agg.append(a)
                ttft += t
                per_tok.append(b)
        rows[p] = {"agg_tok_s": statistics.median(agg), "ttft_p50_ms": 1e3 * pct(ttft, 0.5),
                   "ttft_p95_ms": 1e3 * pct(ttft, 0.95), "read_mb_per_token": statistics.median(per_tok) / 1e6}
    return rows


def bench_peer(args, conc):
    """llama-batched-bench: S_TG (aggregate generation t/s) and T_PP (prompt time) per concurrency."""
    cmd = [args.llama_batched_bench, "-m", args.gguf, "-c", str((args.prompt_tokens + args.gen_tokens) * max(conc) + 64),
           "-b", "2048", "-ub", "512", "-npp", str(args.prompt_tokens), "-ntg", str(args.gen_tokens),
           "-npl", ",".join(map(str, conc)), "-t", str(args.threads or 0) if args.threads else "-t"]
    if not args.threads:
        cmd.pop()
    rows = {}
    for _ in range(args.repeat):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800).stdout
        for line in out.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 10 and re.fullmatch(r"\d+", cells[0]) and cells[2].isdigit():
                p = int(cells[2])  # PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s
                rows.setdefault(p, {"agg": [], "pp": []})
                rows[p]["agg"].append(float(cells[7]))
                rows[p]["pp"].append(float(cells[4]))
    return {p: {"agg_tok_s": statistics.median(v["agg"]), "prefill_all_ms": 1e3 * statistics.median(v["pp"])}
            for p, v in rows.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="colibri container")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--engine-args", default="", help="more engine flags, e.g. \"--cap 16\" to stream experts")
    ap.add_argument("--llama-batched-bench", help="llama.cpp's llama-batched-bench binary (the peer)")
    ap.add_argument("--gguf", help="the GGUF the container was converted from (for the peer)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    conc = [int(c) for c in args.concurrency.split(",")]
    if max(conc) > 16:
        ap.error("--concurrency: the engine has at most 16 KV slots")
    ours = bench_colibri(args, conc)
    peer = bench_peer(args, conc) if args.llama_batched_bench and args.gguf else {}
    if args.json:
        print(json.dumps({"colibri": ours, "peer": peer}, indent=1))
        return
    base = ours[conc[0]]["agg_tok_s"]
    print(f"{'streams':>7} {'agg tok/s':>10} {'x1 stream':>9} {'TTFT p50':>9} {'TTFT p95':>9} {'MB read/tok':>11}"
          + (f" {'peer tok/s':>10} {'ours/peer':>9}" if peer else ""))
    for p in conc:
        o = ours[p]
        line = (f"{p:>7} {o['agg_tok_s']:>10.1f} {o['agg_tok_s'] / base:>9.2f} {o['ttft_p50_ms']:>7.1f}ms "
                f"{o['ttft_p95_ms']:>7.1f}ms {o['read_mb_per_token']:>11.2f}")
        if p in peer:
            line += f" {peer[p]['agg_tok_s']:>10.1f} {o['agg_tok_s'] / peer[p]['agg_tok_s']:>9.2f}"
        print(line)


if __name__ == "__main__":
    main()
