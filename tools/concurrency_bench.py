#!/usr/bin/env python3
"""Continuous-batching benchmark: aggregate tok/s and per-stream TTFT at each concurrency,
colibri side by side with llama.cpp on the same GGUF weights in the same run.

    PYTHONPATH=. tools/concurrency_bench.py --model CONTAINER [--concurrency 1,2,4,8] [--prompt-tokens 64]
        [--gen-tokens 64] [--threads N] [--repeat 3] [--engine-args "--cap 16"]
        [--http] [--llama-server BIN --gguf FILE] [--llama-batched-bench BIN --gguf FILE]

Every stream gets its own prompt of --prompt-tokens ids and generates exactly --gen-tokens
(ignore_eos), greedy. Each token's arrival is timed, which gives per round:
  decode   = tokens that arrived while all P streams were decoding (after the last stream's
             first token, up to the first stream's last) / that time: the steady P-stream
             decode rate, prefill excluded (llama-batched-bench's S_TG measures the same);
  +prefill = all streams' tokens / the wall time from the requests to the last token;
  tok/CPU-s = all streams' tokens / the CPU time the server (with its child processes) used in
             the round, prefill included: on a shared machine, where other jobs stretch the
             wall clock, what the work itself cost.
TTFT = request to the stream's first token. Medians over --repeat rounds.

Without --http the engine is driven over its stdin protocol (no HTTP). --http runs `coli serve`
instead, and --llama-server runs llama-server (--cont-batching) on --gguf; both get the same
concurrent streamed /v1/completions, so both sides include the HTTP layer. Each side is started
once with max(concurrency) slots (--kv-slots/--parallel, -np) and every round runs each
concurrency on each side in turn, the sides' order alternating: on a shared machine the load's
swings then fall on both sides and on every concurrency alike. --llama-batched-bench adds that
tool's S_TG (no HTTP) as a further column.

With streamed experts (--engine-args "--cap N" or "--ram G") the engine mode also reports the
expert bytes read per generated token: the batch-union reads each expert once per step for all
streams. Numbers on a shared machine move; compare the ratios measured in one run."""
import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time

import bench_http  # tools/, next to this file (a script's folder is on sys.path)
from colibri import engine_client  # run as PYTHONPATH=. tools/concurrency_bench.py
from colibri.cli.bench import default_gguf
from colibri.errors import UserError
from colibri.model.paths import require_model


def prompts_for(p, prompt_tokens, vocab, round_no):
    """Stream i's prompt in round round_no; the first id is (round, stream)'s own, so no prompt
    shares a prefix with any other of the run and neither server reuses a cached prefill."""
    return [[1 + (16 * round_no + i) % (vocab - 1)] + [1 + (97 * i + 31 * j + round_no) % (vocab - 1)
                                                       for j in range(1, prompt_tokens)] for i in range(p)]


def pct(xs, q):
    """The q-quantile of xs by nearest rank: the smallest value with at least q of the values at
    or below it (p50 of an even count is the lower middle value, p95 of 20 values the 19th)."""
    xs = sorted(xs)
    if not xs:
        raise ValueError("pct of no values")
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs) - 1e-9) - 1))]


def round_rates(times, wall, counts=None):
    """Per-stream arrival times (seconds since the requests) and the round's wall time ->
    (decode tok/s, tok/s including prefill, TTFTs). times[i] has one entry per token, or per
    streamed chunk when counts[i] (the stream's completion tokens) says how many tokens they
    carried: a chunk then stands for counts[i] / len(times[i]) tokens (a server holds back an
    incomplete UTF-8 piece and sends it with the next token). The decode window runs from the
    moment every stream had its first token to the moment the first stream had its last; with
    one stream it is first to last token. Streams that never overlapped (a tiny model, a run
    with fewer slots than streams) are rated as one after another: their tokens after the
    first over the sum of their decode times."""
    if not times or any(not t for t in times):
        raise ValueError("every stream must have produced a token")
    per = [(counts[i] if counts and counts[i] else len(t)) / len(t) for i, t in enumerate(times)]
    start, end = max(t[0] for t in times), min(t[-1] for t in times)
    inside = sum(w * sum(1 for x in t if start < x <= end) for w, t in zip(per, times))
    if end > start and inside:
        decode = inside / (end - start)
    else:
        busy = sum(t[-1] - t[0] for t in times)
        decode = sum(w * (len(t) - 1) for w, t in zip(per, times)) / busy if busy > 0 else float("nan")
    return decode, sum(w * len(t) for w, t in zip(per, times)) / wall, [t[0] for t in times]


def summarize(rounds):
    """Rounds of (decode, +prefill, ttfts[, tokens per CPU-second]) -> the medians and TTFT
    percentiles over all streams."""
    ttft = [x for r in rounds for x in r[2]]
    out = {"decode_tok_s": statistics.median(r[0] for r in rounds), "agg_tok_s": statistics.median(r[1] for r in rounds),
           "ttft_p50_ms": 1e3 * pct(ttft, 0.5), "ttft_p95_ms": 1e3 * pct(ttft, 0.95)}
    if all(len(r) > 3 for r in rounds):
        out["tok_per_cpu_s"] = statistics.median(r[3] for r in rounds)
    return out


def with_cpu(rates, tokens, cpu):
    """rates plus tokens per CPU-second of the server (prefill included): what the round's work
    cost, whatever else the machine ran meanwhile."""
    return rates + (tokens / cpu if cpu > 0 else float("nan"),)


def engine_round(eng, p, prompt_tokens, gen_tokens, vocab, round_no):
    rids = [f"b{round_no}_{i}" for i in range(p)]
    cpu0, t0 = bench_http.cpu_seconds(eng.proc.pid), time.perf_counter()
    eng.write(b"".join(engine_client.submit_frame(r, ids, slot=i, max_tokens=gen_tokens, temp=0, ignore_eos=1)
                       for i, (r, ids) in enumerate(zip(rids, prompts_for(p, prompt_tokens, vocab, round_no)))))
    times, ends, read = {r: [] for r in rids}, 0, 0
    while ends < p:
        verb, f, _ = eng.read_frame()
        if verb == "DATA" and int(f[1]) >= 0:
            times[f[0]].append(time.perf_counter() - t0)
        elif verb in ("END", "ERROR"):
            if verb == "ERROR":
                raise SystemExit(f"request {f[0]} failed: {f}")
            ends += 1
            # every stream was admitted before the first pass, so each END counts the round so far
            stats = dict(kv.split("=", 1) for kv in f[1:] if "=" in kv)
            read = max(read, int(stats.get("bytes_read", 0)))
    wall, n = time.perf_counter() - t0, sum(map(len, times.values()))
    return with_cpu(round_rates(list(times.values()), wall), n, bench_http.cpu_seconds(eng.proc.pid) - cpu0), read / max(n, 1)


def bench_colibri(args, conc):
    """One engine with max(conc) slots; each round runs every concurrency in turn, so a loaded
    machine's swings fall on all of them alike (the x1-stream ratios compare like with like)."""
    top = max(conc)
    extra = ["--parallel", str(top)] + (["--threads", str(args.threads)] if args.threads else []) + args.engine_args.split()
    rounds, per_tok = {p: [] for p in conc}, {p: [] for p in conc}
    with engine_client.Engine(args.model, ctx=args.prompt_tokens + args.gen_tokens + 8, kv_slots=top, extra=extra) as eng:
        vocab = int(eng.info["vocab"])
        engine_round(eng, top, 8, 4, vocab, 999)  # warm-up (page in the weights), ids no measured round uses
        for r in range(args.repeat):
            for i, p in enumerate(conc):
                rates, b = engine_round(eng, p, args.prompt_tokens, args.gen_tokens, vocab, r * len(conc) + i)
                rounds[p].append(rates)
                per_tok[p].append(b)
    return {p: dict(summarize(rounds[p]), read_mb_per_token=statistics.median(per_tok[p]) / 1e6) for p in conc}


def container_vocab(model):
    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    return int(cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size"))


def bench_http_pair(args, conc):
    """coli serve (--http) and/or llama-server (--llama-server), each started once with
    max(conc) slots; every round runs each concurrency on each side, the sides' order
    alternating, so both sides and all concurrencies share the machine's load alike."""
    top, ctx = max(conc), args.prompt_tokens + args.gen_tokens + 16
    vocab = container_vocab(args.model)
    sides = (["colibri"] if args.http else []) + (["llama-server"] if args.llama_server else [])
    rounds = {s: {p: [] for p in conc} for s in sides}
    servers = {}
    try:
        for s in sides:
            port = bench_http.free_port()
            cmd = (bench_http.coli_serve_cmd(args.model, port, top, ctx, args.threads, args.engine_args.split())
                   if s == "colibri" else bench_http.llama_server_cmd(args.llama_server, args.gguf, port, top, ctx, args.threads))
            servers[s] = bench_http.Server(cmd, port, s).__enter__()
        for s in sides:  # warm-up
            bench_http.http_round(servers[s].port, prompts_for(top, 8, vocab, 999), 4)
        for r in range(args.repeat):
            for i, p in enumerate(conc):
                for s in (sides if (r + i) % 2 == 0 else sides[::-1]):
                    cpu0 = bench_http.cpu_seconds(servers[s].proc.pid)
                    times, counts, wall = bench_http.http_round(
                        servers[s].port, prompts_for(p, args.prompt_tokens, vocab, r * len(conc) + i), args.gen_tokens)
                    cpu = bench_http.cpu_seconds(servers[s].proc.pid) - cpu0
                    rounds[s][p].append(with_cpu(round_rates(times, wall, counts), sum(counts), cpu))
    finally:
        for srv in servers.values():
            srv.stop()
    return {s: {p: summarize(rounds[s][p]) for p in conc} for s in sides}


def parse_batched_bench(out, rows):
    """llama-batched-bench's table rows (| PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s |
    S_TG t/s | T s | S t/s |) into rows[B]: lists of S_TG and T_PP."""
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 10 and re.fullmatch(r"\d+", cells[0]) and cells[2].isdigit():
            r = rows.setdefault(int(cells[2]), {"agg": [], "pp": []})
            r["agg"].append(float(cells[7]))
            r["pp"].append(float(cells[4]))
    return rows


def bench_peer(args, conc):
    """llama-batched-bench: S_TG (aggregate generation t/s, prefill excluded) and T_PP per concurrency."""
    cmd = [args.llama_batched_bench, "-m", args.gguf, "-c", str((args.prompt_tokens + args.gen_tokens) * max(conc) + 64),
           "-b", "2048", "-ub", "512", "-npp", str(args.prompt_tokens), "-ntg", str(args.gen_tokens),
           "-npl", ",".join(map(str, conc))] + (["-t", str(args.threads)] if args.threads else [])
    rows = {}
    for _ in range(args.repeat):
        parse_batched_bench(subprocess.run(cmd, capture_output=True, text=True, timeout=1800).stdout, rows)
    return {p: {"agg_tok_s": statistics.median(v["agg"]), "prefill_all_ms": 1e3 * statistics.median(v["pp"])}
            for p, v in rows.items()}


def table(conc, ours, peer, peer_name, bb):
    """The printed table: colibri's rates, then the peer's, then the ratios (decode over decode)."""
    head = f"{'streams':>7} {'decode':>8} {'+prefill':>8} {'x1 dec':>6} {'tok/CPU-s':>9} {'TTFT p50':>9} {'TTFT p95':>9}"
    if any(o.get("read_mb_per_token") for o in ours.values()):
        head += f" {'MB/tok':>7}"
    if peer:
        head += (f" | {peer_name + ' dec':>14} {'+prefill':>8} {'tok/CPU-s':>9} {'TTFT p50':>9} {'TTFT p95':>9}"
                 f" {'ours/peer dec':>13} {'+prefill':>8} {'CPU':>5}")
    if bb:
        head += f" | {'batched-bench S_TG':>18}"
    lines = [head]
    base = ours[conc[0]]["decode_tok_s"]
    for p in conc:
        o = ours[p]
        line = (f"{p:>7} {o['decode_tok_s']:>8.1f} {o['agg_tok_s']:>8.1f} {o['decode_tok_s'] / base:>6.2f} "
                f"{o.get('tok_per_cpu_s', float('nan')):>9.1f} {o['ttft_p50_ms']:>7.0f}ms {o['ttft_p95_ms']:>7.0f}ms")
        if "MB/tok" in head:
            line += f" {o.get('read_mb_per_token', 0):>7.2f}"
        if peer:
            q = peer[p]
            nan = float("nan")
            line += (f" | {q['decode_tok_s']:>14.1f} {q['agg_tok_s']:>8.1f} {q.get('tok_per_cpu_s', nan):>9.1f}"
                     f" {q['ttft_p50_ms']:>7.0f}ms {q['ttft_p95_ms']:>7.0f}ms"
                     f" {o['decode_tok_s'] / q['decode_tok_s']:>13.2f} {o['agg_tok_s'] / q['agg_tok_s']:>8.2f}"
                     f" {o.get('tok_per_cpu_s', nan) / q.get('tok_per_cpu_s', nan):>5.2f}")
        if bb:
            line += f" | {bb[p]['agg_tok_s'] if p in bb else float('nan'):>18.1f}"
        lines.append(line)
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="colibri container: a directory or a pulled name such as smollm2")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--engine-args", default="", help="more engine flags, e.g. \"--cap 16\" to stream experts")
    ap.add_argument("--http", action="store_true", help="drive colibri through `coli serve` over HTTP")
    ap.add_argument("--llama-server", help="llama.cpp's llama-server binary (the peer, over HTTP)")
    ap.add_argument("--llama-batched-bench", help="llama.cpp's llama-batched-bench binary (a peer without HTTP)")
    ap.add_argument("--gguf", help="the GGUF the container was converted from, for the llama.cpp peers (default: the file "
                    "a pulled model came from, as coli bench finds it)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    try:  # a pulled name (smollm2) as every coli command takes it, checked as they check it
        args.model = str(require_model(args, fetch=False))
    except UserError as e:
        ap.error(str(e))
    conc = [int(c) for c in args.concurrency.split(",")]
    if max(conc) > 16:
        ap.error("--concurrency: the engine has at most 16 KV slots")
    if (args.llama_server or args.llama_batched_bench) and not args.gguf:
        found = default_gguf(args.model)
        if not found:
            ap.error("--llama-server and --llama-batched-bench need --gguf (the GGUF the container was converted from)")
        args.gguf = str(found)
    if args.http or args.llama_server:
        res = bench_http_pair(args, conc)
        if not args.http:  # the peer alone still needs our side: the engine protocol
            res["colibri"] = bench_colibri(args, conc)
        ours, peer = res["colibri"], res.get("llama-server", {})
    else:
        ours, peer = bench_colibri(args, conc), {}
    bb = bench_peer(args, conc) if args.llama_batched_bench else {}
    if args.json:
        print(json.dumps({"colibri": ours, "llama-server": peer, "llama-batched-bench": bb}, indent=1))
        return
    print(f"colibri via {'coli serve (HTTP)' if args.http else 'the engine protocol (no HTTP)'}; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(table(conc, ours, peer, "llama-server", bb))


if __name__ == "__main__":
    main()
