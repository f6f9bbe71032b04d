#!/usr/bin/env python3
"""Expert streaming, side by side with llama.cpp, with memory made equally scarce for both.

  PYTHONPATH=. .venv/bin/python tools/stream_bench.py gen   DIR [--layers 48]    synthetic Qwen3-30B-A3B-like checkpoint
  PYTHONPATH=. .venv/bin/python tools/stream_bench.py prep  DIR --llama-cpp SRC  colibri container + llama.cpp Q4_0 GGUF
  PYTHONPATH=. .venv/bin/python tools/stream_bench.py prep  DIR --llama-cpp SRC --quant IQ2_XXS   one low-bit GGUF for both
  PYTHONPATH=. .venv/bin/python tools/stream_bench.py run   DIR --llama-cpp SRC --limit-gb G [--ram G]
  PYTHONPATH=. .venv/bin/python tools/stream_bench.py ttft  DIR --llama-cpp SRC --limit-gb G --prompts 512,4096

`gen` writes random bf16 weights with the per-token geometry of Qwen3-30B-A3B (hidden 2048, 128
experts, top-8, expert width 768, 32/4 heads x 128) and the real Qwen3 tokenizer, one shard per
layer (bounded RAM). `prep` converts them with `coli convert` (q4 experts, q8 dense) and with
llama.cpp's converter + quantizer (Q8_0, requantized to Q4_0); with `--quant Q` llama.cpp writes
the bf16 GGUF, an importance matrix where Q needs one, and the Q file, and colibri converts that
same file (its low-bit blocks kept as they are), so both engines read the same bytes. `run` alternates the two engines
inside one memory cgroup (v1 or v2) whose limit counts page cache too, so the mmap peer and the
streaming engine get the same RAM; the page cache is dropped before each run. It measures the
machine's O_DIRECT read bandwidth the same day and prints one table: decode tok/s, TTFT of a
512-token prompt, expert hit rate, bytes read per token, achieved read GB/s, the disk-bound limit.
`ttft` times prompts alone, one length after another, in the same cgroup: colibri streaming,
llama.cpp mmap, and colibri with every expert resident (outside the cgroup, experts warmed), and
prints each against the bound max(resident prefill time, every expert's bytes / O_DIRECT rate).

Dev tool only: needs root (cgroup, drop_caches), numpy, and a llama.cpp build outside the repo.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import glm5_geometry  # tools/, beside this file

ROOT = Path(__file__).resolve().parents[1]
GEOMETRY = dict(hidden_size=2048, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, intermediate_size=6144)


# ---------------------------------------------------------------- gen

def random_bf16(rng, shape, np, exponent=0x3C00):
    """Random bf16 bit patterns of magnitude 2^-7..2^-6 (the default exponent) with random
    signs: cheap to draw at disk speed, small enough that activations stay finite."""
    bits = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)
    return (bits & np.uint16(0x807F)) | np.uint16(exponent)


def gen(args):
    if args.geometry == "glm5":
        return glm5_geometry.gen(Path(args.dir) / "hf", args.layers, args.seed)
    import numpy as np
    out = Path(args.dir) / "hf"
    glm5_geometry.copy_tokenizer(out)
    V = 151936
    H, nh, nkv, hd = (GEOMETRY[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim"))
    E, I, L = GEOMETRY["num_experts"], GEOMETRY["moe_intermediate_size"], args.layers
    cfg = dict(GEOMETRY, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", vocab_size=V,
               num_hidden_layers=L, max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
               tie_word_embeddings=False, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
               torch_dtype="bfloat16", bos_token_id=151643, eos_token_id=151645, attention_bias=False)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    rng = np.random.default_rng(args.seed)
    ones = lambda n: np.full(n, 0x3F80, dtype=np.uint16)  # noqa: E731  bf16 1.0
    # Embeddings of magnitude 0.5..1 dominate the residual stream, so routing follows the token
    # (as in a trained model) instead of the context average that uniform random weights give.
    shards = [("trunk", lambda: {"model.embed_tokens.weight": random_bf16(rng, (V, H), np, 0x3F00),
                                 "lm_head.weight": random_bf16(rng, (V, H), np), "model.norm.weight": ones(H)})]

    def layer(l):
        p = f"model.layers.{l}"
        t = {f"{p}.input_layernorm.weight": ones(H), f"{p}.post_attention_layernorm.weight": ones(H),
             f"{p}.self_attn.q_proj.weight": random_bf16(rng, (nh * hd, H), np),
             f"{p}.self_attn.k_proj.weight": random_bf16(rng, (nkv * hd, H), np),
             f"{p}.self_attn.v_proj.weight": random_bf16(rng, (nkv * hd, H), np),
             f"{p}.self_attn.o_proj.weight": random_bf16(rng, (H, nh * hd), np),
             f"{p}.self_attn.q_norm.weight": ones(hd), f"{p}.self_attn.k_norm.weight": ones(hd),
             f"{p}.mlp.gate.weight": random_bf16(rng, (E, H), np)}
        for e in range(E):
            for proj, shape in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
                t[f"{p}.mlp.experts.{e}.{proj}.weight"] = random_bf16(rng, shape, np)
        return t
    shards += [(f"layer{l}", lambda l=l: layer(l)) for l in range(L)]
    index = {"metadata": {}, "weight_map": {}}
    for k, (tag, make) in enumerate(shards):
        name = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        path = out / name
        tensors = None
        if not path.is_file():  # resumable: a shard already written is kept
            tensors = make()
            save_bf16(tensors, str(path) + ".tmp")
            os.replace(str(path) + ".tmp", path)
            print(f"gen: {name} ({tag}) {path.stat().st_size / 1e9:.2f} GB", flush=True)
        keys = tensors.keys() if tensors is not None else shard_keys(path)
        index["weight_map"].update({n: name for n in keys})
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))


def save_bf16(tensors, path):
    """Writes uint16 arrays as a BF16 safetensors file (safetensors.numpy has no bf16 dtype)."""
    header, off = {}, 0
    for name, a in tensors.items():
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for a in tensors.values():
            f.write(a.tobytes())


def shard_keys(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return [k for k in json.loads(f.read(n)) if k != "__metadata__"]


# ---------------------------------------------------------------- prep

LOW_BIT_NEEDS_IMATRIX = ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S")  # llama-quantize refuses these without one


def paths(d, quant):
    """(colibri container, llama.cpp GGUF) of one setting: the default pair (colibri's own q4
    conversion of the checkpoint, llama.cpp Q4_0), or with --quant Q the GGUF llama-quantize
    wrote as Q and colibri's conversion of that very file."""
    if not quant:
        return d / "colibri", d / "model-q4_0.gguf"
    return d / f"colibri-{quant.lower()}", d / f"model-{quant.lower()}.gguf"


def prep_quant(args, d, src):
    """llama.cpp's bf16 GGUF, its importance matrix over this repository's docs (where the type
    needs one), llama-quantize to --quant, and `coli convert` of that GGUF (blocks kept as they are)."""
    col, gq = paths(d, args.quant)
    gbf, imat, text = d / "model-bf16.gguf", d / "imatrix.gguf", d / "imatrix.txt"
    py = str(ROOT / ".venv" / "bin" / "python")
    bin_ = src / "build" / "bin"
    if not gq.is_file():
        if not gbf.is_file():
            t = time.time()
            env = dict(os.environ, PYTHONPATH=str(src / "gguf-py"))
            subprocess.run([py, str(src / "convert_hf_to_gguf.py"), str(d / "hf"), "--outtype", "bf16", "--outfile", str(gbf)],
                           check=True, env=env)
            print(f"prep: llama.cpp convert (bf16) {time.time() - t:.0f} s", flush=True)
        cmd = [str(bin_ / "llama-quantize")]
        if args.quant.upper() in LOW_BIT_NEEDS_IMATRIX or args.imatrix:
            if not imat.is_file():
                text.write_text("\n\n".join(f.read_text() for f in sorted((ROOT / "docs").glob("*.md"))))
                t = time.time()
                subprocess.run([str(bin_ / "llama-imatrix"), "-m", str(gbf), "-f", str(text), "-o", str(imat), "-c", "512",
                                "--chunks", "8", "-t", str(os.cpu_count() or 2)], check=True)
                print(f"prep: llama-imatrix {time.time() - t:.0f} s", flush=True)
            cmd += ["--imatrix", str(imat)]
        t = time.time()
        subprocess.run(cmd + [str(gbf), str(gq), args.quant.upper()], check=True)
        print(f"prep: llama-quantize {args.quant.upper()} {time.time() - t:.0f} s", flush=True)
    if not (col / "colibri.json").is_file():
        t = time.time()
        subprocess.run([str(ROOT / "coli"), "convert", str(gq), str(col)], check=True)
        print(f"prep: coli convert of the {args.quant.upper()} GGUF {time.time() - t:.0f} s", flush=True)


def prep(args):
    d = Path(args.dir)
    if args.quant:
        return prep_quant(args, d, Path(args.llama_cpp))
    hf, col, gq8, gq4 = d / "hf", d / "colibri", d / "model-q8_0.gguf", d / "model-q4_0.gguf"
    py = str(ROOT / ".venv" / "bin" / "python")
    if not (col / "colibri.json").is_file():
        t = time.time()
        subprocess.run([str(ROOT / "coli"), "convert", str(hf), str(col)], check=True)
        print(f"prep: coli convert {time.time() - t:.0f} s", flush=True)
    src = Path(args.llama_cpp)
    if not gq4.is_file():
        if not gq8.is_file():
            t = time.time()
            env = dict(os.environ, PYTHONPATH=str(src / "gguf-py"))
            subprocess.run([py, str(src / "convert_hf_to_gguf.py"), str(hf), "--outtype", "q8_0",
                            "--outfile", str(gq8)], check=True, env=env)
            print(f"prep: llama.cpp convert (Q8_0) {time.time() - t:.0f} s", flush=True)
        t = time.time()
        subprocess.run([str(src / "build" / "bin" / "llama-quantize"), "--allow-requantize", str(gq8), str(gq4),
                        "Q4_0", "2"], check=True)
        gq8.unlink()
        print(f"prep: llama-quantize Q4_0 {time.time() - t:.0f} s", flush=True)


# ---------------------------------------------------------------- run

class MemoryCgroup:
    """A memory cgroup (v2 if mounted, else v1) whose limit includes page cache."""

    def __init__(self, limit_bytes):
        v2 = Path("/sys/fs/cgroup/cgroup.controllers")
        self.v2 = v2.is_file() and "memory" in v2.read_text()
        base = Path("/sys/fs/cgroup") if self.v2 else Path("/sys/fs/cgroup/memory")
        self.path = base / f"colibri-bench-{os.getpid()}"
        self.path.mkdir()
        (self.path / ("memory.max" if self.v2 else "memory.limit_in_bytes")).write_text(str(limit_bytes))
        if not self.v2:
            try:
                (self.path / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
            except OSError:
                pass  # no swap accounting: there is no swap on these machines either

    def peak(self):
        f = "memory.peak" if self.v2 else "memory.max_usage_in_bytes"
        try:
            return int((self.path / f).read_text())
        except OSError:
            return None

    def reset_peak(self):
        if not self.v2:
            (self.path / "memory.max_usage_in_bytes").write_text("0")

    def preexec(self):
        procs = self.path / "cgroup.procs"
        return lambda: procs.write_text(str(os.getpid()))

    def close(self):
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def drop_caches():
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def direct_read_gbps(files, seconds=8.0, block=4 << 20, threads=4):
    """O_DIRECT read rate of the model's shards with `threads` readers at once (the expert
    store's default queue depth), page cache bypassed: the limit the engine's reads can reach."""
    import mmap
    import threading
    files = sorted(files, key=lambda p: -p.stat().st_size)[:threads] * threads
    done, t0 = [0] * threads, time.perf_counter()

    def reader(k):
        buf = mmap.mmap(-1, block)
        fd = os.open(files[k], os.O_RDONLY | os.O_DIRECT)
        try:
            os.lseek(fd, (k * files[k].stat().st_size // threads) // block * block, os.SEEK_SET)
            while time.perf_counter() - t0 < seconds:
                n = os.readv(fd, [buf])
                if n <= 0:
                    os.lseek(fd, 0, os.SEEK_SET)
                    continue
                done[k] += n
        finally:
            os.close(fd)
    pool = [threading.Thread(target=reader, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(done) / (time.perf_counter() - t0) / 1e9


def prompt_ids(n, seed):
    return [1000 + (seed * 7919 + i * 104729) % 140000 for i in range(n)]


def start_engine(col, args, ctx, extra, cg=None):
    try:
        from colibri import engine_client
    except ImportError:
        sys.exit("run this tool from the checkout with PYTHONPATH=. (it drives the engine through colibri)")
    command = None
    if cg is not None:  # the engine joins the cgroup before it execs, so every page it touches is charged there
        command = ["sh", "-c", f'echo $$ > {cg.path / "cgroup.procs"} && exec "$@"', "sh",
                   str(engine_client.ensure_built()), "serve"]
    try:
        return engine_client.Engine(col, ctx=ctx, threads=args.threads, extra=extra, command=command)
    except engine_client.EngineError as e:
        sys.exit(f"colibri did not start: {e.message}")


def streaming_flags(args):
    budget = ["--cap", str(args.cap)] if getattr(args, "cap", None) else ["--ram", f"{args.ram:g}"]
    return budget + (["--readahead", args.readahead] if args.readahead else [])


def colibri_turn(cg, col, args, seed):
    eng = start_engine(col, args, 1024, streaming_flags(args), cg)
    # turn 1: the prompt alone (TTFT); turn 2 continues it from the KV cache, so its stats are
    # the decode's own: hit rate, bytes read per token, read rate
    ids = prompt_ids(args.prompt, seed)
    first = turn(eng, ids, 1)
    ids.append(first["token"])
    dec = turn(eng, ids, args.gen)
    eng.close()
    n = int(dec["completion_tokens"])
    f = lambda k: float(dec[k])  # noqa: E731
    return {"ttft_s": float(first["ttft_ms"]) / 1000, "decode_tok_s": f("decode_tok_s"), "hit_rate": f("hit_rate"),
            "bytes_per_token": f("bytes_read") / n, "read_gbps": f("read_gbps"), "peak_rss_mb": f("peak_rss_mb"),
            "reused": int(dec["reused_tokens"]), "tokens": n, "info": eng.info}


def turn(eng, ids, n):
    """One turn; decoding samples at temperature 1 (seeded) so that, like llama-batched-bench's
    random tokens, each step routes differently (a random model's greedy output repeats)."""
    out = {}
    for ev in eng.generate(ids, max_tokens=n, temp=1.0, seed=1234):
        if ev[0] == "data" and ev[1] >= 0 and "token" not in out:
            out["token"] = ev[1]
        elif ev[0] == "end":
            out.update(ev[1])
    return out


def llama_turn(cg, src, gguf, args):
    exe = Path(src) / "build" / "bin" / "llama-batched-bench"
    cmd = [str(exe), "-m", str(gguf), "-c", "1024", "-b", "512", "-ub", "512", "-npp", str(args.prompt),
           "-ntg", str(args.gen), "-npl", "1", "-t", str(args.threads), "-nr"]
    r = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=cg.preexec(), timeout=3600)
    if r.returncode:
        sys.exit(f"llama-batched-bench failed ({r.returncode}): {r.stderr[-800:]}")
    for line in r.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 10 and cells[0] == str(args.prompt):
            # PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s
            return {"ttft_s": float(cells[4]), "decode_tok_s": float(cells[7])}
    sys.exit(f"cannot parse llama-batched-bench output:\n{r.stdout[-800:]}")


def run(args):
    d = Path(args.dir)
    col, gguf = paths(d, args.quant)
    man = json.loads((col / "colibri.json").read_text())
    expert_files = [col / s for s in man["shards"]]
    cg = MemoryCgroup(int(args.limit_gb * 1e9))
    try:
        drop_caches()
        disk = direct_read_gbps(expert_files)
        ours, theirs = [], []
        for i in range(args.repeat):
            drop_caches()
            cg.reset_peak()
            ours.append(colibri_turn(cg, col, args, seed=i))
            ours[-1]["cgroup_peak"] = cg.peak()
            print("colibri", json.dumps({k: v for k, v in ours[-1].items() if k != "info"}), flush=True)
            drop_caches()
            cg.reset_peak()
            theirs.append(llama_turn(cg, args.llama_cpp, gguf, args))
            theirs[-1]["cgroup_peak"] = cg.peak()
            print("llama.cpp", json.dumps(theirs[-1]), flush=True)
    finally:
        cg.close()
    med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731
    info = ours[0]["info"]
    expert_bytes = int(info.get("expert_bytes", 0))
    top_k, moe_layers = GEOMETRY["num_experts_per_tok"], int(info.get("moe_layers", 0))
    miss_bytes = (1 - med(ours, "hit_rate")) * top_k * moe_layers * expert_bytes
    limit = disk * 1e9 / miss_bytes if miss_bytes else None
    res = {"limit_gb": args.limit_gb, "ram_gb": args.ram, "threads": args.threads, "repeat": args.repeat,
           "o_direct_read_gbps": disk, "prompt": args.prompt, "gen": args.gen,
           "colibri": {k: med(ours, k) for k in ("decode_tok_s", "ttft_s", "hit_rate", "bytes_per_token",
                                                 "read_gbps", "peak_rss_mb")},
           "llama_cpp": {k: med(theirs, k) for k in ("decode_tok_s", "ttft_s")},
           "disk_bound_tok_s": limit, "cgroup_peak_bytes": {"colibri": max(r["cgroup_peak"] or 0 for r in ours),
                                                          "llama_cpp": max(r["cgroup_peak"] or 0 for r in theirs)}}
    c, l = res["colibri"], res["llama_cpp"]
    print(json.dumps(res, indent=1))
    print(f"\n| | colibri | llama.cpp (mmap, no repack) | ratio |\n|---|---|---|---|")
    print(f"| decode tok/s | {c['decode_tok_s']:.2f} | {l['decode_tok_s']:.2f} | {c['decode_tok_s'] / l['decode_tok_s']:.2f}x |")
    print(f"| TTFT, {args.prompt}-token prompt | {c['ttft_s']:.1f} s | {l['ttft_s']:.1f} s | "
          f"{l['ttft_s'] / c['ttft_s']:.2f}x faster |")
    print(f"| expert hit rate | {c['hit_rate']:.3f} | - | |")
    print(f"| bytes read per token | {c['bytes_per_token'] / 1e6:.0f} MB | - | |")
    print(f"| achieved read GB/s | {c['read_gbps']:.2f} of {disk:.2f} O_DIRECT | - | |")
    if limit:
        print(f"| disk-bound limit | {limit:.2f} tok/s; colibri at {100 * c['decode_tok_s'] / limit:.0f}% | | |")


# ---------------------------------------------------------------- ttft

def prompt_turn(eng, n, seed):
    """One prompt of n ids, one token out: the END frame's fields (ttft_ms, bytes_read, io_wait_ms)."""
    ids = prompt_ids(n, seed)
    out = turn(eng, ids, 1)
    if int(out.get("reused_tokens", 0)):
        sys.exit("the timed prompt reused a cached prefix: the prompts must differ from their first id")
    return ids + [out["token"]], out


def decode_leg(eng, ids, gen):
    """gen tokens more after the prompt (its KV reused): decode tok/s and the reads per token."""
    if not gen:
        return {}
    end = turn(eng, ids, gen)
    n = int(end["completion_tokens"])
    return {"decode_tok_s": float(end["decode_tok_s"]), "decode_bytes_per_token": float(end["bytes_read"]) / n,
            "decode_hit_rate": float(end["hit_rate"])}


def colibri_ttft(cg, col, args, n, seed):
    eng = start_engine(col, args, n + args.gen + 16, streaming_flags(args), cg)
    ids, end = prompt_turn(eng, n, seed)
    dec = decode_leg(eng, ids, args.gen)
    eng.close()
    f = lambda k: float(end.get(k, 0))  # noqa: E731
    return {"ttft_s": f("ttft_ms") / 1000, "bytes_read": f("prefill_bytes_read"), "read_gbps": f("read_gbps"),
            "io_wait_s": f("prefill_io_wait_ms") / 1000, "misses": f("misses"), "peak_rss_mb": f("peak_rss_mb"),
            "prefill_pass": int(eng.info.get("prefill_pass", 0)), "pass_why": eng.info.get("prefill_pass_why", ""),
            **dec, "info": eng.info}


def resident_ttft(col, args, n, seed):
    """The prompt with every expert in RAM: a 512-id prompt of other ids first routes every
    expert in (they are read on first use), then the timed prompt, which shares no prefix."""
    eng = start_engine(col, args, max(n, 512) + args.gen + 16, [])
    prompt_turn(eng, 512, 10_000 + seed)
    ids, end = prompt_turn(eng, n, seed)
    dec = decode_leg(eng, ids, args.gen)
    eng.close()
    return {"ttft_s": float(end["ttft_ms"]) / 1000, **dec}


def llama_ttft(cg, args, gguf, n):
    exe = Path(args.llama_bin or Path(args.llama_cpp) / "build" / "bin") / "llama-batched-bench"
    cmd = [str(exe), "-m", str(gguf), "-c", str(n + 16), "-b", "512", "-ub", "512", "-npp", str(n), "-ntg", "1",
           "-npl", "1", "-t", str(args.threads), "-nr"]
    r = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=cg.preexec(), timeout=7200)
    if r.returncode:
        sys.exit(f"llama-batched-bench failed ({r.returncode}): {r.stderr[-800:]}")
    for line in r.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 10 and cells[0] == str(n):
            return {"ttft_s": float(cells[4])}  # PP | TG | B | N_KV | T_PP s | ...
    sys.exit(f"cannot parse llama-batched-bench output:\n{r.stdout[-800:]}")


def ttft(args):
    d = Path(args.dir)
    col, gguf = paths(d, args.quant)
    man = json.loads((col / "colibri.json").read_text())
    lengths = [int(x) for x in args.prompts.split(",")]
    cg = MemoryCgroup(int(args.limit_gb * 1e9)) if args.limit_gb else None
    rows = []
    try:
        if cg:
            drop_caches()
        disk = direct_read_gbps([col / s for s in man["shards"]])
        print(f"O_DIRECT read rate {disk:.2f} GB/s", flush=True)
        for n in lengths:
            res = resident_ttft(col, args, n, seed=n)
            print("resident", n, json.dumps(res), flush=True)
            for i in range(args.repeat):
                if cg:  # the mmap peer reads through the page cache; colibri's experts bypass it (O_DIRECT)
                    drop_caches()
                    cg.reset_peak()
                ours = colibri_ttft(cg, col, args, n, seed=n + i)
                ours["cgroup_peak"] = cg.peak() if cg else None
                print("colibri", n, json.dumps({k: v for k, v in ours.items() if k != "info"}), flush=True)
                theirs = None
                if args.llama_cpp:
                    drop_caches()
                    cg.reset_peak()
                    theirs = llama_ttft(cg, args, gguf, n)
                    theirs["cgroup_peak"] = cg.peak()
                    print("llama.cpp", n, json.dumps(theirs), flush=True)
                rows.append((n, res, ours, theirs))
    finally:
        if cg:
            cg.close()
    table(args, rows, disk)


def table(args, rows, disk):
    info = rows[0][2]["info"]
    # at these lengths every expert is routed (512 positions x top-8 of 128 leave an expert
    # unrouted with probability (120/128)^4096 ~ 1e-115), so the prompt must read them all once
    all_experts = int(info["moe_layers"]) * int(info["experts"]) * int(info["expert_bytes"])
    reads = all_experts / disk / 1e9
    where = f"cgroup limit {args.limit_gb:g} GB, " if args.limit_gb else ""
    print(f"\n{where}{' '.join(streaming_flags(args))}, {args.threads} threads, O_DIRECT {disk:.2f} GB/s, "
          f"every expert {all_experts / 1e9:.2f} GB (reading them all: {reads:.1f} s)\n")
    peer = bool(args.llama_cpp)
    print("| prompt | colibri TTFT |" + (" llama.cpp mmap TTFT | colibri / llama.cpp |" if peer else "")
          + " bound (resident) | colibri / bound | expert GB read | read GB/s | I/O wait | pass |")
    print("|---|---|" + ("---|---|" if peer else "") + "---|---|---|---|---|---|")
    for n, res, ours, theirs in rows:
        bound = max(res["ttft_s"], reads)
        vs = f" {theirs['ttft_s']:.1f} s | {ours['ttft_s'] / theirs['ttft_s']:.2f}x |" if peer else ""
        print(f"| {n} | {ours['ttft_s']:.1f} s |{vs} {bound:.1f} s ({res['ttft_s']:.1f} s) "
              f"| {ours['ttft_s'] / bound:.2f}x | {ours['bytes_read'] / 1e9:.2f} | {ours['read_gbps']:.2f} "
              f"| {ours['io_wait_s']:.1f} s | {ours['prefill_pass']} ({ours['pass_why']}) |")
    if not args.gen:
        return
    print(f"\n| decode after the prompt ({args.gen} tokens) | tok/s | bound | colibri / bound | MB read per token "
          "| hit rate |\n|---|---|---|---|---|---|")
    for n, res, ours, _ in rows:
        per = ours["decode_bytes_per_token"]
        limit = min(res["decode_tok_s"], disk * 1e9 / per if per else float("inf"))
        print(f"| after {n} | {ours['decode_tok_s']:.2f} | {limit:.2f} (resident {res['decode_tok_s']:.2f}, "
              f"disk {disk * 1e9 / per if per else float('inf'):.2f}) | {ours['decode_tok_s'] / limit:.2f}x "
              f"| {per / 1e6:.0f} | {ours['decode_hit_rate']:.3f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("dir")
    g.add_argument("--layers", type=int, default=48)
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--geometry", choices=("qwen3", "glm5"), default="qwen3",
                   help="Qwen3-30B-A3B's (bf16) or GLM-5's (block-FP8, about 10 GB a layer)")
    p = sub.add_parser("prep")
    p.add_argument("dir")
    p.add_argument("--llama-cpp", required=True, help="llama.cpp source tree with a build/ (outside this repo)")
    p.add_argument("--quant", help="a llama-quantize type (IQ2_XXS, Q2_K, ...): both engines run that GGUF file")
    p.add_argument("--imatrix", action="store_true", help="quantize with an importance matrix even where the type needs none")
    r = sub.add_parser("run")
    r.add_argument("dir")
    r.add_argument("--llama-cpp", required=True)
    r.add_argument("--limit-gb", type=float, required=True, help="memory cgroup limit for both engines")
    r.add_argument("--quant", help="the setting prep --quant made (default: colibri q4 vs llama.cpp Q4_0)")
    r.add_argument("--ram", type=float, help="colibri's --ram (default: 90%% of the limit)")
    r.add_argument("--readahead", choices=("on", "off"))
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--prompt", type=int, default=512)
    r.add_argument("--gen", type=int, default=32)
    r.add_argument("--repeat", type=int, default=2)
    t = sub.add_parser("ttft")
    t.add_argument("dir")
    t.add_argument("--llama-cpp", help="llama.cpp source tree with a build/ (outside this repo); without it, colibri alone")
    t.add_argument("--llama-bin", help="the folder of llama-batched-bench (default: SRC/build/bin)")
    t.add_argument("--limit-gb", type=float, help="memory cgroup limit for both engines (needed with --llama-cpp)")
    t.add_argument("--quant", help="the setting prep --quant made (default: colibri q4 vs llama.cpp Q4_0)")
    t.add_argument("--ram", type=float, help="colibri's --ram (default: 90%% of the limit)")
    t.add_argument("--cap", type=int, help="colibri's --cap (experts cached per layer) instead of --ram")
    t.add_argument("--readahead", choices=("on", "off"))
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--prompts", default="512,4096,16384", help="prompt lengths, comma-separated")
    t.add_argument("--gen", type=int, default=0, help="tokens to decode after each prompt (decode against its bound)")
    t.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    if args.cmd == "ttft" and args.llama_cpp and not args.limit_gb:
        ap.error("ttft --llama-cpp needs --limit-gb: both engines run in one memory cgroup")
    if args.cmd == "ttft" and not (args.cap or args.limit_gb or args.ram):
        ap.error("ttft needs a budget for colibri: --limit-gb, --ram or --cap")
    if args.cmd in ("run", "ttft") and args.ram is None and args.limit_gb:
        args.ram = 0.9 * args.limit_gb
    {"gen": gen, "prep": prep, "run": run, "ttft": ttft}[args.cmd](args)


if __name__ == "__main__":
    main()
