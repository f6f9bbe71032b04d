"""`coli perplexity`: how well a model predicts a text file, measured by the engine.

The text is tokenized by the engine's tokenizer (`colibri tokenize`, with the model's
post-processor, e.g. BOS, and special-token text kept as text), cut into chunks of --ctx
tokens, and each chunk is run teacher-forced through the engine (protocol `logits=1`). As in
llama.cpp's perplexity, only the second half of each chunk is scored, so every scored token
sees at least ctx/2 tokens of context. With --ref-logits FILE (float32 [chunks*ctx, vocab],
as --save-logits writes them, e.g. from an f32 conversion or from transformers) it also reports
the KL-divergence KL(ref || model) and the top-1 agreement at the scored positions.
"""
import json
import math
import sys
from array import array
from itertools import repeat
from operator import mul, sub
from pathlib import Path

from colibri.errors import UserError
from colibri.model.paths import model_arg, require_model
from colibri import engine_client
from colibri import launch_opts
from colibri.cli.common import tokenize_file as tokenize  # noqa: F401 (tools/kl_pareto.py calls it here too)

HELP = "perplexity of a text file (and KL-divergence / top-1 agreement against reference logits)"
DESCRIPTION = __doc__
DEFAULT_CTX = 512


def add_arguments(p):
    model_arg(p)
    p.add_argument("--file", required=True, help="UTF-8 text file to score")
    p.add_argument("--chunks", type=int, default=None, help="score at most N chunks")
    p.add_argument("--ref-logits", dest="ref_logits", help="reference logits, float32 [chunks*ctx, vocab]")
    p.add_argument("--save-logits", dest="save_logits", help="write this model's logits in the --ref-logits layout")
    launch_opts.add_engine_flags(p, ("ctx", "threads", "kv") + launch_opts.STREAM_FLAGS + ("kernels",), group=None,
                                 ctx={"help": f"tokens per chunk (default {DEFAULT_CTX}, at most the model's)"},
                                 threads={"help": "compute threads (default: all cores)"})
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def _floats(raw):
    a = array("f")
    a.frombytes(raw)
    if sys.byteorder != "little":
        a.byteswap()
    return a


def logsumexp(row):
    m = max(row)
    return m + math.log(sum(map(math.exp, map(sub, row, repeat(m)))))


def kl_row(ref, lse_ref, got, lse_got):
    """KL(p_ref || p_got) of one row of logits."""
    p = map(math.exp, map(sub, ref, repeat(lse_ref)))  # map/operator keep the loops in C
    return math.fsum(map(mul, p, map(sub, ref, got))) - lse_ref + lse_got


def argmax(row):
    return row.index(max(row))


def measure(model_dir, ids, ctx, chunks, threads=None, ref_path=None, save_path=None, progress=None, kv=None,
            extra=()):
    """Returns a dict of results; see run() for the fields."""
    n_chunks = len(ids) // ctx
    if chunks is not None:
        n_chunks = min(n_chunks, chunks)
    first = ctx // 2
    ref_f = save_f = None
    nll, kls, agree, ref_nll = [], [], 0, []
    per_chunk = []
    try:
        # one position more than a chunk: the engine keeps a slot free for output even for logits=1
        with engine_client.Engine(model_dir, ctx=ctx + 1, threads=threads, kv=kv, extra=extra) as eng:
            vocab = int(eng.info.get("vocab", 0))
            if ref_path:
                size = Path(ref_path).stat().st_size
                want = n_chunks * ctx * vocab * 4
                if size != want:
                    raise UserError(f"--ref-logits {ref_path}: {size} bytes, expected {want} = float32 "
                                    f"[{n_chunks * ctx}, {vocab}] ({n_chunks} chunks of {ctx} tokens); make it with the "
                                    "same --file, --ctx and --chunks (e.g. with --save-logits)")
                ref_f = open(ref_path, "rb")
            if save_path:
                save_f = open(save_path, "wb")
            for c in range(n_chunks):
                chunk = ids[c * ctx:(c + 1) * ctx]
                body = None
                for ev in eng.generate(chunk, logits=1):
                    if ev[0] == "logits":
                        body = ev[2]
                if body is None or len(body) != ctx * vocab * 4:
                    raise UserError("the engine returned no logits (or a wrong amount) for a chunk")
                if save_f:
                    save_f.write(body)
                logits = _floats(body)
                ref = _floats(ref_f.read(ctx * vocab * 4)) if ref_f else None
                c_nll = []
                for j in range(first, ctx - 1):
                    row = logits[j * vocab:(j + 1) * vocab]
                    lse = logsumexp(row)
                    c_nll.append(lse - row[chunk[j + 1]])
                    if ref is not None:
                        rrow = ref[j * vocab:(j + 1) * vocab]
                        rlse = logsumexp(rrow)
                        kls.append(kl_row(rrow, rlse, row, lse))
                        agree += argmax(rrow) == argmax(row)
                        ref_nll.append(rlse - rrow[chunk[j + 1]])
                nll += c_nll
                per_chunk.append(math.exp(sum(c_nll) / len(c_nll)))
                if progress:
                    progress(c + 1, n_chunks, math.exp(sum(nll) / len(nll)))
    except engine_client.EngineError as e:
        raise UserError(e.message if e.kind != "engine_died" else str(e)) from None
    finally:
        if ref_f:
            ref_f.close()
        if save_f:
            save_f.close()
    n = len(nll)
    mean = sum(nll) / n
    std = math.sqrt(max(sum((x - mean) ** 2 for x in nll) / max(n - 1, 1), 0.0))
    out = {"tokens": len(ids), "ctx": ctx, "chunks": n_chunks, "scored": n, "ppl": math.exp(mean),
           "ppl_err": math.exp(mean) * std / math.sqrt(n), "nll_mean": mean, "chunk_ppl": per_chunk}
    if ref_path:
        out.update({"kl_mean": sum(kls) / n, "kl_max": max(kls), "top1": agree / n,
                    "ref_ppl": math.exp(sum(ref_nll) / n)})
    return out


def run(args):
    d = require_model(args)
    path = Path(args.file)
    if not path.is_file():
        raise UserError(f"--file {path}: " + ("a directory, not a text file" if path.is_dir() else "no such file"))
    man = json.loads((d / "colibri.json").read_text())
    max_pos = int(man["arch"]["max_position_embeddings"])
    launch_opts.check_ctx(args.ctx, man["arch"])  # the range every command takes
    ctx = min(DEFAULT_CTX, max_pos - 1) if args.ctx is None else args.ctx
    if ctx < 4 or ctx >= max_pos:  # what a chunk needs on top of that
        raise UserError(f"--ctx {ctx}: a perplexity chunk needs 4 to {max_pos - 1} tokens (a second half to score, "
                        "and one engine position beyond the chunk); give a --ctx in that range")
    if args.chunks is not None and args.chunks < 1:
        raise UserError("--chunks must be at least 1")
    if args.ref_logits and not Path(args.ref_logits).is_file():
        raise UserError(f"--ref-logits {args.ref_logits}: " + ("a directory, not a logits file"
                                                                if Path(args.ref_logits).is_dir() else "no such file"))
    launch_opts.check_cap(args.cap, man["arch"])
    extra = launch_opts.stream_args(args)
    ids = tokenize(d, path)
    if len(ids) < ctx:
        raise UserError(f"{path} has {len(ids)} tokens, fewer than one chunk of --ctx {ctx}; use a smaller --ctx "
                        "or a longer text")

    def progress(done, total, ppl):
        if not args.json:
            print(f"\r[{done}/{total}] ppl {ppl:.4f}", end="" if done < total else "\n", file=sys.stderr, flush=True)

    r = measure(d, ids, ctx, args.chunks, threads=args.threads, kv=args.kv, ref_path=args.ref_logits,
                save_path=args.save_logits, progress=progress, extra=extra)
    if args.json:
        print(json.dumps(r))
        return 0
    print(f"model {d}, file {path}: {r['tokens']} tokens, {r['chunks']} chunk(s) of {ctx}, "
          f"{r['scored']} scored (second half of each chunk)")
    print(f"perplexity {r['ppl']:.4f} +/- {r['ppl_err']:.4f}")
    if args.ref_logits:
        print(f"against {args.ref_logits}: mean KL {r['kl_mean']:.3e}, max KL {r['kl_max']:.3e}, "
              f"top-1 agreement {100 * r['top1']:.2f}%, reference perplexity {r['ref_ppl']:.4f}")
    return 0
