#!/usr/bin/env python3
"""Quality per byte, side by side: KL-divergence against the unquantized model for colibri's
containers and llama.cpp's GGUF quantizations of the same checkpoint, on the same token ids.

  PYTHONPATH=. .venv/bin/python tools/kl_pareto.py --file TEXT --work DIR \\
      --colibri-ref BF16_CONTAINER --colibri q4/q8=CONTAINER --colibri q4/q4=CONTAINER \\
      --llama-perplexity LLAMA_BUILD/bin/llama-perplexity --gguf-ref BF16.gguf \\
      --gguf Q4_0=Q4_0.gguf --gguf Q4_K_M=Q4_K_M.gguf [--ctx 512] [--chunks 4] [--threads 2]

Each engine is measured against its own unquantized run, llama.cpp's standard KLD method:
llama-perplexity writes the base file from the bf16 GGUF (--kl-divergence-base) and scores each
quantization against it (--kl-divergence); `coli perplexity` saves the bf16 container's logits
(--save-logits) and scores each container against them (--ref-logits). Both score the second
half of each chunk of --ctx tokens. The token ids llama.cpp stored in its base file are compared
with colibri's tokenization of the same text before anything is scored, so both sides see the
same ids. Bytes per decoded token: the weights one decoded token reads (the trunk without the
embedding table, plus top-k of each MoE layer's experts), from the container's or GGUF's headers.

Dev tool only: the llama.cpp build lives outside this repository and its paths come from the
arguments. Stdlib plus the repo's own modules.
"""
import argparse
import json
import struct
import subprocess
import sys
from array import array
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

class Fail(Exception):
    pass


def gguf_bytes_per_token(path):
    """Weight bytes one decoded token reads from a GGUF: every tensor but the embedding table
    (one row of it), with each merged expert tensor (*_exps) counted at top_k / experts."""
    from colibri.convert import gguf_reader  # the converter's header parser and ggml size table
    try:
        g = gguf_reader.read_gguf(path)
    except gguf_reader.GGUFError as e:
        raise Fail(str(e)) from None
    arch = g.get("general.architecture", "")
    experts, top_k = g.get(f"{arch}.expert_count", 0), g.get(f"{arch}.expert_used_count", 0)
    total = 0.0
    for t in g.tensors.values():
        if t.name == "token_embd.weight":
            continue
        b = t.nbytes
        if "_exps." in t.name:
            if not experts or not top_k:
                raise Fail(f"{path}: {t.name} is an expert tensor but {arch}.expert_count/expert_used_count are missing")
            b = b * top_k / experts
        total += b
    return total


def colibri_bytes_per_token(container):
    from colibri.cli import bench
    from colibri.model import container_scan
    return bench.bytes_per_decoded_token(container_scan.scan(container))


# ---------------------------------------------------------------- llama.cpp side

def read_kld_base_tokens(path):
    """(n_ctx, n_vocab, n_chunk, token ids) from the header of llama-perplexity's
    --kl-divergence-base file."""
    with open(path, "rb") as f:
        if f.read(8) != b"_logits_":
            raise Fail(f"{path}: not a llama-perplexity --kl-divergence-base file (no _logits_ magic)")
        n_ctx, n_vocab, n_chunk = struct.unpack("<Iii", f.read(12))
        ids = array("i")
        ids.frombytes(f.read(4 * n_ctx * n_chunk))
    if sys.byteorder != "little":
        ids.byteswap()
    if len(ids) != n_ctx * n_chunk:
        raise Fail(f"{path}: truncated token list ({len(ids)} of {n_ctx * n_chunk} ids)")
    return n_ctx, n_vocab, n_chunk, list(ids)


def _number(text, label):
    for line in text.splitlines():
        if line.startswith(label):
            return float(line[len(label):].split()[0])
    return None


def parse_llama_kld(text):
    """Mean KL, its uncertainty, same-top-token rate and PPL(Q) from llama-perplexity
    --kl-divergence output."""
    kl = _number(text, "Mean    KLD:")
    top = _number(text, "Same top p:")
    if kl is None or top is None:
        tail = "\n".join(text.splitlines()[-8:])
        raise Fail(f"llama-perplexity printed no final KL statistics (needs >= 100 scored tokens); its output "
                   f"ended with:\n{tail}")
    err = None
    for line in text.splitlines():
        if line.startswith("Mean    KLD:") and "±" in line:
            err = float(line.split("±")[1].split()[0])
    return {"kl_mean": kl, "kl_err": err, "top1": top / 100.0, "ppl": _number(text, "Mean PPL(Q)                   :")}


def llama_run(exe, gguf, args, extra):
    cmd = [exe, "-m", str(gguf), "-f", str(args.file), "-c", str(args.ctx), "--chunks", str(args.chunks),
           "-t", str(args.threads)] + extra
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise Fail(f"{exe} failed (exit {r.returncode}) on {gguf}:\n{r.stderr.strip()[-800:]}")
    return r.stdout + r.stderr


# ---------------------------------------------------------------- colibri side

def colibri_ids(container, text):
    from colibri.cli import perplexity
    return perplexity.tokenize(Path(container), Path(text))


def first_mismatch(a, b):
    """Index of the first differing id of two id lists (None when equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def coli_perplexity(container, args, extra):
    cmd = [sys.executable, str(ROOT / "coli"), "perplexity", "--model", str(container), "--file", str(args.file),
           "--ctx", str(args.ctx), "--chunks", str(args.chunks), "--threads", str(args.threads), "--json"] + extra
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise Fail(f"coli perplexity failed (exit {r.returncode}) on {container}:\n{r.stderr.strip()[-800:]}")
    return json.loads(r.stdout)


# ---------------------------------------------------------------- table

def table(rows):
    """Markdown table of result rows: engine, format, bytes per decoded token, mean KL, top-1, PPL."""
    out = ["| engine | format | MB read per decoded token | mean KL | top-1 agreement | PPL |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        # KLs of a random-weight model are small: scientific notation keeps their digits
        kl = "0 (reference)" if r.get("reference") else f"{r['kl_mean']:.2e}" + (
            f" ± {r['kl_err']:.0e}" if r.get("kl_err") else "")
        top = "100 % (reference)" if r.get("reference") else f"{100 * r['top1']:.2f} %"
        ppl = f"{r['ppl']:.4f}" if r.get("ppl") else "-"
        out.append(f"| {r['engine']} | {r['format']} | {r['bytes'] / 1e6:.1f} | {kl} | {top} | {ppl} |")
    return "\n".join(out)


def labelled(items, flag):
    out = []
    for s in items or ():
        label, sep, path = s.partition("=")
        if not sep or not label or not path:
            raise Fail(f"{flag} {s!r}: expected LABEL=PATH")
        if not Path(path).exists():
            raise Fail(f"{flag} {s}: {path} does not exist")
        out.append((label, Path(path)))
    return out


def run(args):
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    gguf = labelled(args.gguf, "--gguf")
    cols = labelled(args.colibri, "--colibri")
    if gguf and not (args.llama_perplexity and args.gguf_ref):
        raise Fail("--gguf needs --llama-perplexity and --gguf-ref (the unquantized GGUF the KL is measured against)")
    if cols and not args.colibri_ref:
        raise Fail("--colibri needs --colibri-ref (the unquantized bf16 container the KL is measured against)")
    rows = _Rows()
    if gguf:
        base = work / "llama-base.kld"
        out = llama_run(args.llama_perplexity, args.gguf_ref, args, ["--kl-divergence-base", str(base)])
        n_ctx, _vocab, n_chunk, ids = read_kld_base_tokens(base)
        if n_ctx != args.ctx or n_chunk != args.chunks:
            raise Fail(f"{base}: {n_chunk} chunks of {n_ctx}, asked for {args.chunks} of {args.ctx}; the text is too short")
        if args.colibri_ref:
            ours = colibri_ids(args.colibri_ref, args.file)[:len(ids)]
            i = first_mismatch(ours, ids)
            if i is not None:
                raise Fail(f"the tokenizers disagree on {args.file} at token {i}: colibri "
                           f"{ours[max(i - 2, 0):i + 3]} vs llama.cpp {ids[max(i - 2, 0):i + 3]}; pick a text both "
                           "split the same way")
            print(f"same {len(ids)} token ids on both sides", file=sys.stderr)
        rows.append({"engine": "llama.cpp", "format": f"{args.gguf_ref.name} (reference)", "reference": True,
                     "bytes": gguf_bytes_per_token(args.gguf_ref), "ppl": _ppl_from_base_run(out)})
        for label, path in gguf:
            res = parse_llama_kld(llama_run(args.llama_perplexity, path, args,
                                            ["--kl-divergence-base", str(base), "--kl-divergence"]))
            rows.append(dict(res, engine="llama.cpp", format=label, bytes=gguf_bytes_per_token(path)))
    if cols:
        ref = work / "colibri-ref.f32"
        res = coli_perplexity(args.colibri_ref, args, ["--save-logits", str(ref)])
        rows.append({"engine": "colibri", "format": f"{Path(args.colibri_ref).name} (reference)", "reference": True,
                     "bytes": colibri_bytes_per_token(args.colibri_ref), "ppl": res["ppl"]})
        for label, path in cols:
            res = coli_perplexity(path, args, ["--ref-logits", str(ref)])
            rows.append({"engine": "colibri", "format": label, "bytes": colibri_bytes_per_token(path),
                         "kl_mean": res["kl_mean"], "top1": res["top1"], "ppl": res["ppl"]})
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(table(rows))
    return rows


class _Rows(list):
    """The result rows, each also logged to stderr when measured, so a late failure keeps the earlier ones."""
    def append(self, row):
        print("row: " + json.dumps(row), file=sys.stderr, flush=True)
        super().append(row)


def _ppl_from_base_run(text):
    """Final perplexity of a plain llama-perplexity run ('Final estimate: PPL = x +/- y')."""
    for line in text.splitlines():
        if "Final estimate: PPL =" in line:
            return float(line.split("=")[1].split()[0])
    return None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--file", type=Path, required=True, help="UTF-8 text both engines score")
    p.add_argument("--work", required=True, help="folder for the reference logits (about ctx*chunks*vocab*4 bytes)")
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--colibri-ref", type=Path, help="colibri container with bf16 experts and dense trunk")
    p.add_argument("--colibri", action="append", metavar="LABEL=DIR", help="a colibri container to score")
    p.add_argument("--llama-perplexity", help="path of llama.cpp's llama-perplexity")
    p.add_argument("--gguf-ref", type=Path, help="unquantized (bf16/f16) GGUF of the same checkpoint")
    p.add_argument("--gguf", action="append", metavar="LABEL=FILE", help="a GGUF quantization to score")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = p.parse_args(argv)
    if not args.file.is_file():
        p.error(f"--file {args.file}: no such file")
    try:
        run(args)
    except Fail as e:
        print(f"kl_pareto: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
