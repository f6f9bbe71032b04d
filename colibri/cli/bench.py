"""`coli bench`: prefill and decode speed, achieved bandwidth, and ratios against a peer.

colibri and its peers (llama-bench of llama.cpp, ik_llama.cpp, ..., when given) run alternately
in the same process tree, several times each, the peers' order turning every round; medians are
compared, never single runs, because shared machines are noisy. Achieved bandwidth is the weight
bytes one decoded token reads (from colibri's container and from the peers' GGUF file) divided by
its time, reported against the machine's measured memory read rate. `--depth N` puts N positions in the
KV cache first (llama-bench -d N) for long-context points; a sampled-decode leg next to the
greedy one shows what the sampler costs per token.
"""
import json
import os
import shlex
import shutil
import statistics
import subprocess
from pathlib import Path

from colibri.errors import UserError
from colibri.model.paths import model_arg, require_model
from colibri import engine_client
from colibri import launch_opts
from colibri.limits import DEFAULT_SPIN
from colibri.machine import probe as machine_probe
from colibri.model import container_scan
from colibri.model import store as model_store

ENGINE_DEFAULT_CTX = 4096  # the engine's --ctx when none is given (c/engine/engine.c)
HELP = "prefill/decode speed and achieved bandwidth, side by side with llama.cpp when given"
DESCRIPTION = __doc__


def add_arguments(p):
    model_arg(p)
    p.add_argument("--prompt-tokens", type=int, default=64, help="prefill length (default 64)")
    p.add_argument("--gen-tokens", type=int, default=64, help="decoded tokens per run (default 64)")
    p.add_argument("--repeat", type=int, default=3, help="runs of each side, alternating (default 3)")
    p.add_argument("--depth", type=int, default=0,
                   help="positions already in the KV cache before the measured prefill and decode, for long-context "
                        "points (llama-bench -d; default 0)")
    p.add_argument("--temp", type=float, default=1.0,
                   help="temperature of the sampled-decode leg (top-p 0.95), which shows the sampler's cost next to "
                        "greedy decode; 0 leaves the leg out (default 1.0)")
    launch_opts.add_engine_flags(p, ("threads", "batch", "spin") + launch_opts.STREAM_FLAGS + launch_opts.DRAFT_FLAGS + ("kernels",),
                                 group=None, threads={
        "help": "threads for both sides (default: the engine's choice, physical cores; the peer gets the same number)"},
        spin={"help": f"{launch_opts.SPIN_HELP} (default {DEFAULT_SPIN}; the tuned profile is not applied here)"},
        kernels={"help": "colibri's kernel set (default: the best this CPU runs), to compare sets in one alternating run"})
    p.add_argument("--llama-bench", action="append", metavar="'PATH [FLAGS]'",
                   help="a llama-bench to run as a peer, with flags of its own if any (e.g. 'ik_llama.cpp/build/bin/"
                        "llama-bench -rtr 1'); repeat it for several peers (default $COLI_LLAMA_BENCH)")
    p.add_argument("--gguf", help="GGUF file the peers run (default: the file a pulled model came from)")
    p.add_argument("--mem-bw", type=float, help="memory read rate in GB/s instead of measuring it")
    p.add_argument("--profile", action="store_true",
                   help="the engine's per-op decode profile (--profile): each op's time, weight bytes and GB/s per "
                        "decoded token of the greedy leg, medians over the runs")
    p.add_argument("--json", action="store_true", help="print the results as JSON")


def bytes_per_decoded_token(scan):
    """Weight bytes one decoded token reads: the dense trunk without the embedding table (one
    row of it), plus top-k of each MoE layer's experts."""
    classes = scan["classes"]
    dense = scan["dense_bytes"] - (0 if scan["arch"]["tied_embeddings"] else classes.get("embed", 0))
    a = scan["arch"]
    experts = 0
    if a["experts"] and scan["expert_bytes"]:
        experts = scan["expert_bytes"] * a["top_k"] / a["experts"]
    return dense + experts


def engine_read_rate(threads, mib=1024):
    """GB/s that `colibri membw` reads with `threads` threads (decode's own count), over a buffer of
    at most mib MiB and an eighth of the memory available; None when it cannot run."""
    usable = machine_probe.memory_info().get("usable") or 0
    mib = max(16, min(mib, usable // 8 >> 20)) if usable else 64
    try:
        exe = engine_client.release_engine()
        out = subprocess.run([str(exe), "membw", "--threads", str(threads or 1), "--mib", str(mib)],
                             capture_output=True, text=True, timeout=120).stdout
    except (engine_client.EngineError, OSError, subprocess.TimeoutExpired):
        return None
    fields = dict(f.split("=", 1) for f in out.split()[1:] if "=" in f)
    try:
        return float(fields["gb_s"])
    except (KeyError, ValueError):
        return None


def colibri_run(model, args, first_token, vocab):
    """One engine, one KV slot, four requests: the depth fills the slot (without one a prompt of
    other ids warms the experts); the prefill leg adds the prompt behind it (the depth is reused,
    so only the prompt's positions are timed); the decode legs reuse the depth and decode from
    there, greedy and then sampled, as llama-bench's tg runs decode behind -d positions."""
    span = max(min(vocab, 1001) - 1, 1)  # ids 1..1000, inside the vocabulary of a small model too
    ids = lambda start, n: [(start + i * 7) % span + 1 for i in range(n)]  # noqa: E731
    depth, prompt = ids(first_token + 500, args.depth), ids(first_token, args.prompt_tokens)
    needed = args.depth + args.prompt_tokens + args.gen_tokens + 1
    ctx = needed if needed > ENGINE_DEFAULT_CTX else None  # a model's own smaller limit still applies

    def request(eng, payload, gen, **opts):
        stats = None
        for ev in eng.generate(payload, max_tokens=gen, ignore_eos=1, **opts):
            if ev[0] == "end":
                stats = ev[1]
        return stats

    try:
        extra = args.stream_args + (["--profile"] if args.profile else [])  # --kernels among them
        with engine_client.Engine(model, threads=args.threads, ctx=ctx, batch=args.batch, kv_slots=1, extra=extra,
                                  spin=args.spin) as eng:
            # Warm: where the cache holds fewer than all experts they reach RAM on first use
            # (O_DIRECT reads, no page cache kept between engine runs), so the depth, or without
            # one a prompt of other ids, routes the timed legs' experts in first, as llama-bench
            # warms up over its page-cached weights. (With a slot for each, all load at start.)
            request(eng, depth or ids(first_token + 250, args.prompt_tokens), 1, temp=0)
            pp = request(eng, depth + prompt, 1, temp=0)
            if int(pp["reused_tokens"]) < len(depth) - 1:
                raise UserError(f"the engine reused {pp['reused_tokens']} of the {len(depth)} depth positions; "
                                "the prefill figure would include the depth")
            after = [prompt[0] % span + 1]  # one new id behind the depth: decode starts there
            tg = request(eng, depth + after, args.gen_tokens, temp=0)
            sampled = request(eng, depth + after, args.gen_tokens, temp=args.temp, top_p=0.95,
                              seed=first_token + 1) if args.temp > 0 else None
            threads = eng.info.get("threads")
            args.kernels_used = eng.info.get("kernels")
            args.batch_used = int(eng.info["batch"]) if eng.info.get("batch", "").isdigit() else None
    except engine_client.EngineError as e:
        raise UserError(f"the engine refused the benchmark run ({e.kind}: {e.message})") from None
    if int(tg["completion_tokens"]) < args.gen_tokens:
        raise UserError(f"the model ended after {tg['completion_tokens']} tokens; lower --gen-tokens")
    return (float(pp["prefill_tok_s"]), float(tg["decode_tok_s"]),
            float(sampled["decode_tok_s"]) if sampled else None, int(threads), profile_of(tg))


PROFILE_OPS = ("attn_proj", "attn_kv", "router", "experts", "mlp", "head", "sampler", "norm", "sync", "loop")
PROFILE_LABELS = {"attn_proj": "attention projections", "attn_kv": "attention over the KV", "router": "router",
                  "experts": "routed experts", "mlp": "dense/shared MLP", "head": "output head (+ final norm)",
                  "sampler": "sampler", "norm": "norms, residuals, embed", "sync": "waits in parallel regions",
                  "loop": "protocol loop"}


def profile_of(end):
    """{op: (ms, bytes)} per decoded token from an END frame's prof_ fields; None without them."""
    if "prof_token_ms" not in end:
        return None
    return {op: (float(end[f"prof_{op}_ms"]), float(end[f"prof_{op}_bytes"])) for op in PROFILE_OPS} | {
        "token": (float(end["prof_token_ms"]), 0.0)}


def profile_medians(runs):
    """Per op: median ms, bytes, GB/s (bytes over the median time) over the runs' profiles."""
    runs = [r for r in runs if r]
    if not runs:
        return None
    out = {}
    for op in PROFILE_OPS + ("token",):
        ms = statistics.median(r[op][0] for r in runs)
        b = statistics.median(r[op][1] for r in runs)
        out[op] = {"ms": ms, "bytes": b, "gb_s": b / ms / 1e6 if ms > 0 and b else None}
    return out


def print_profile(prof, mem_bw):
    tok = prof["token"]["ms"]
    print(f"per-op decode profile, per token ({tok:.3f} ms):")
    print(f"  {'op':28s}{'ms':>9s}{'share':>8s}{'MB':>9s}{'GB/s':>8s}" + (f"{'of membw':>10s}" if mem_bw else ""))
    for op in PROFILE_OPS:
        p = prof[op]
        share = 100 * p["ms"] / tok if tok > 0 else 0
        rate = f"{p['gb_s']:8.2f}" if p["gb_s"] else f"{'-':>8s}"
        of = (f"{100 * p['gb_s'] / mem_bw:9.0f}%" if p["gb_s"] else f"{'-':>10s}") if mem_bw else ""
        print(f"  {PROFILE_LABELS[op]:28s}{p['ms']:9.4f}{share:7.1f}%{p['bytes'] / 1e6:9.2f}{rate}{of}")


def gguf_bytes_per_decoded_token(gguf):
    """The same count for a GGUF file: every tensor but the token embedding table (one row of it;
    a tied model reads it whole as its head), plus top-k of the *_exps expert tensors. None when
    the file cannot be read."""
    from colibri.convert.gguf_reader import GGUFError, read_gguf
    try:
        g = read_gguf(gguf)
    except GGUFError:
        return None
    arch = g.metadata.get("general.architecture")
    experts, top_k = g.metadata.get(f"{arch}.expert_count") or 0, g.metadata.get(f"{arch}.expert_used_count") or 0
    tied = "output.weight" not in g.tensors
    total = 0.0
    for name, t in g.tensors.items():
        if name == "token_embd.weight" and not tied:
            continue
        total += t.nbytes * (top_k / experts if experts and "_exps." in name else 1)
    return total


def peer_label(exe):
    """What a peer is called in the report: the project directory its binary was built in
    (llama.cpp, ik_llama.cpp), else the binary's name."""
    for d in Path(exe).resolve().parents:
        if d.name and d.name not in ("bin", "Release", "Debug") and not d.name.startswith("build"):
            return d.name
    return Path(exe).name


def parse_peers(values):
    """--llama-bench values -> [{label, exe, flags}], or UserError for one that is not a program.
    Two peers built in directories of the same name get their flags added to tell them apart."""
    peers = []
    for v in values:
        words = shlex.split(v)
        exe = shutil.which(words[0]) if words else None
        exe = exe or (words[0] if words else "")
        if not words or not os.path.isfile(exe) or not os.access(exe, os.X_OK):
            raise UserError(f"--llama-bench {v}: not an executable")
        peers.append({"label": peer_label(exe), "exe": exe, "flags": words[1:]})
    for p in peers:
        if sum(q["label"] == p["label"] for q in peers) > 1 and p["flags"]:
            p["label"] += " " + " ".join(p["flags"])
    return peers


def peer_run(peer, gguf, args, threads):
    exe = peer["exe"]
    depth = ["-d", str(args.depth)] if args.depth else []  # ik_llama.cpp's llama-bench has no -d
    r = subprocess.run([exe, "-m", str(gguf), "-p", str(args.prompt_tokens), "-n", str(args.gen_tokens), *depth,
                        "-t", str(threads), "-r", "1", "-o", "json", *peer["flags"]],
                       capture_output=True, text=True, timeout=3600)
    if r.returncode:
        raise UserError(f"{exe} failed (exit {r.returncode}): {r.stderr.strip()[-400:]}")
    pp = tg = None
    for row in json.loads(r.stdout):
        if row.get("n_prompt") and not row.get("n_gen"):
            pp = row["avg_ts"]
        elif row.get("n_gen") and not row.get("n_prompt"):
            tg = row["avg_ts"]
    return pp, tg


def default_gguf(model):
    try:
        man = json.loads((Path(model) / "colibri.json").read_text())
    except (OSError, ValueError):
        return None
    src = man.get("source", {}).get("gguf_path") or ""
    if src and Path(src).is_file():
        return Path(src)
    downloads = model_store.store_root() / "downloads"
    name = Path(model).name
    hits = sorted(downloads.glob(f"*{name}*/*.gguf")) if downloads.is_dir() else []
    return hits[0] if hits else None


def run(args):
    model = require_model(args)
    for flag in ("prompt_tokens", "gen_tokens", "repeat"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag.replace('_', '-')} must be at least 1")
    if args.depth < 0:
        raise UserError("--depth must be 0 or more")
    if args.temp < 0:
        raise UserError("--temp must be 0 (no sampled leg) or more")
    launch_opts.check_spin(args.spin)
    scan = container_scan.scan(model)
    launch_opts.check_cap(args.cap, {"num_experts": scan["arch"]["experts"]})
    args.stream_args = launch_opts.stream_args(args)
    per_token = bytes_per_decoded_token(scan)
    peers = parse_peers(args.llama_bench or ([os.environ["COLI_LLAMA_BENCH"]] if os.environ.get("COLI_LLAMA_BENCH") else []))
    gguf = None
    if peers:
        gguf = Path(args.gguf) if args.gguf else default_gguf(model)
        if not gguf or not gguf.is_file():
            raise UserError("the peers need the GGUF file of this model: pass --gguf FILE")
    ours, profiles, threads = [], [], args.threads
    theirs = [[] for _ in peers]
    for i in range(args.repeat):
        pp, tg, sampled, used, prof = colibri_run(model, args, first_token=i * 101, vocab=scan["arch"]["vocab"] or 1)
        threads = threads or used
        ours.append((pp, tg, sampled))
        profiles.append(prof)
        for k in range(len(peers)):  # the peers' order turns each round, so no one always runs right after colibri
            j = (k + i) % len(peers)
            theirs[j].append(peer_run(peers[j], gguf, args, threads))
    all_threads = None if args.mem_bw else engine_read_rate(threads)
    # one thread's rate from the engine's scan; Python's memchr only where the engine cannot run
    # (on a Zen 4 VM memchr read 1.2-1.7x what membw read on one thread, moving run to run)
    one_thread, one_thread_source = None, None
    if not args.mem_bw:
        one_thread, one_thread_source = (all_threads if threads == 1 else engine_read_rate(1)), "colibri membw"
        if not one_thread:
            one_thread, one_thread_source = machine_probe.measure_memory_bw(), "memchr"
    mem_bw = args.mem_bw or all_threads or one_thread
    source = ("given" if args.mem_bw else f"measured ({threads} threads)" if all_threads
              else "measured (one thread, a floor: the engine's read loop did not run)")
    med = lambda rows, k: statistics.median(r[k] for r in rows if r[k]) if any(r[k] for r in rows) else None  # noqa: E731
    result = {
        "model": str(model), "threads": threads, "repeat": args.repeat,
        "prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens, "depth": args.depth,
        "colibri": {"prefill_tok_s": med(ours, 0), "decode_tok_s": med(ours, 1), "kernels": args.kernels_used,
                    "batch": args.batch_used, "wait": engine_client.wait_policy(engine_client.engine_env(args.spin)),
                    "sampled_decode_tok_s": med(ours, 2), "sampled_temp": args.temp or None},
        "bytes_per_decoded_token": per_token,
        "memory_read_gb_s": mem_bw,
        "memory_read_source": source,
    }
    if one_thread:
        result["memory_read_one_thread_gb_s"] = one_thread
        result["memory_read_one_thread_source"] = one_thread_source
    if args.profile:
        result["colibri"]["profile"] = profile_medians(profiles)
    result["colibri"]["decode_gb_s"] = per_token * result["colibri"]["decode_tok_s"] / 1e9
    if result["colibri"]["sampled_decode_tok_s"]:  # what sampling adds to a decode step
        result["colibri"]["sampler_ms_per_token"] = 1e3 * (1 / result["colibri"]["sampled_decode_tok_s"]
                                                           - 1 / result["colibri"]["decode_tok_s"])
    peer_bytes = gguf_bytes_per_decoded_token(gguf) if peers else None
    result["peers"] = []
    for peer, runs in zip(peers, theirs):
        row = {"name": peer["label"], "exe": peer["exe"], "flags": peer["flags"], "gguf": str(gguf),
               "prefill_tok_s": med(runs, 0), "decode_tok_s": med(runs, 1), "bytes_per_decoded_token": peer_bytes}
        row["decode_gb_s"] = peer_bytes * row["decode_tok_s"] / 1e9 if peer_bytes and row["decode_tok_s"] else None
        for k in ("prefill_tok_s", "decode_tok_s", "decode_gb_s"):
            if row[k]:
                row[f"ratio_{k}"] = result["colibri"][k] / row[k]  # colibri over this peer
        result["peers"].append(row)
    if peers:  # the first peer keeps the fields a single-peer report always had
        result["peer"] = result["peers"][0]
        for k in ("prefill_tok_s", "decode_tok_s"):
            if result["peer"].get(f"ratio_{k}"):
                result[f"ratio_{k}"] = result["peer"][f"ratio_{k}"]
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    c = result["colibri"]
    at = f"  depth {args.depth}" if args.depth else ""
    print(f"model {model}  threads {threads}  {c['kernels']} kernels  batch {c['batch']}  {c['wait']}{at}  "
          f"medians of {args.repeat} alternating runs")
    width = max([12] + [len(p["name"]) + 2 for p in result["peers"]])
    print(f"{'':24s}{'colibri':>12s}" + "".join(f"{p['name']:>{width}s}{'ratio':>9s}" for p in result["peers"]))
    for label, k, fmt in ((f"prefill tok/s (pp{args.prompt_tokens})", "prefill_tok_s", ".1f"),
                          (f"decode tok/s (tg{args.gen_tokens})", "decode_tok_s", ".1f"),
                          ("decode GB/s", "decode_gb_s", ".2f")):
        line = f"{label:24s}{c[k]:12{fmt}}"
        for p in result["peers"]:
            line += f"{p[k]:{width}{fmt}}{p[f'ratio_{k}']:8.2f}x" if p.get(k) else f"{'-':>{width}s}{'':9s}"
        print(line)
    if c["sampled_decode_tok_s"]:
        print(f"{'decode tok/s, sampled':24s}{c['sampled_decode_tok_s']:12.1f}" + "".join(f"{'-':>{width}s}{'':9s}" for _ in peers)
              + f"   (temperature {args.temp:g}, top-p 0.95: {c['sampler_ms_per_token']:+.2f} ms per token vs greedy)")
    if peer_bytes:
        print(f"the peers' GGUF reads {peer_bytes / 1e6:.1f} MB of weights per token ({gguf})"
              + "".join(f"; {p['name']} {p['decode_gb_s']:.2f} GB/s" + (f" = {100 * p['decode_gb_s'] / mem_bw:.0f}%" if mem_bw else "")
                        for p in result["peers"] if p.get("decode_gb_s")))
    share = f" = {100 * c['decode_gb_s'] / mem_bw:.0f}% of {mem_bw:.1f} GB/s {result['memory_read_source']}" if mem_bw else ""
    floor = f"; one thread reads {one_thread:.1f} GB/s" if one_thread and all_threads and threads != 1 else ""
    print(f"decode reads {per_token / 1e6:.1f} MB of weights per token: {c['decode_gb_s']:.2f} GB/s{share}{floor}")
    if c.get("profile"):
        print_profile(c["profile"], mem_bw)
    return 0
