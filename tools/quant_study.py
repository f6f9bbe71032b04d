#!/usr/bin/env python3
"""Which tensor class is worth its bytes: KL against the unquantized model for a base setting
and for each change of one class's type, with the bytes one decoded token reads, and the Pareto
front of bytes per token against KL.

  PYTHONPATH=. .venv/bin/python tools/quant_study.py --src HF_DIR_OR_GGUF --ref BF16_CONTAINER \\
      --file TEXT --work DIR --base "--experts q4_k --dense q4_k" \\
      --vary attention=q6_k,q8 --vary experts=q3_k --vary lm_head=q6_k [--setting LABEL="FLAGS"] \\
      [--calibrate CALIB_TEXT] [--ctx 512] [--chunks 4] [--threads 2]

--vary CLASS=T1,T2 adds one conversion per type: `experts` and `dense` replace the base's
--experts/--dense, any other class (attention, attn_v, down, embed, lm_head, shared_expert,
dense_mlp) is a --tensor-type over the base. --setting adds a conversion with flags of its own
(after the base's). Each conversion goes to WORK/<its flags> and is kept, so a rerun scores only
what is new. --calibrate passes the text to every conversion (coli convert --calibrate, through
--ref as the calibration model). KL is `coli perplexity --ref-logits` against --ref's logits on
the same chunks (saved once in WORK). A row is on the front when no other row is at least as good
in bytes and in KL and better in one.

Dev tool: stdlib plus the repo's own modules; every conversion and score runs `coli`.
"""
import argparse
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
import kl_pareto  # noqa: E402 (beside this file: its byte count and its perplexity runner)


class Fail(Exception):
    pass


def variants(base, vary, settings):
    """[(label, flags)]: the base, then one per --vary type, then the --setting ones."""
    out = [("base", list(base))]
    for v in vary or ():
        cls, sep, types = v.partition("=")
        if not sep or not cls or not types:
            raise Fail(f"--vary {v!r}: give CLASS=TYPE[,TYPE...], e.g. attention=q6_k,q8")
        for t in types.split(","):
            if cls in ("experts", "dense"):
                flags = replace_flag(base, f"--{cls}", t)
            else:
                flags = list(base) + ["--tensor-type", f"{cls}={t}"]
            out.append((f"{cls}={t}", flags))
    for s in settings or ():
        label, sep, flags = s.partition("=")
        if not sep or not label:
            raise Fail(f"--setting {s!r}: give LABEL=FLAGS")
        out.append((label, list(base) + shlex.split(flags)))
    return out


def replace_flag(flags, name, value):
    flags = list(flags)
    if name in flags:
        flags[flags.index(name) + 1] = value
    else:
        flags += [name, value]
    return flags


def slug(flags):
    s = re.sub(r"[^A-Za-z0-9_.=]+", "-", " ".join(flags).replace("--tensor-type", "tt").replace("--", "")).strip("-")
    return s or "defaults"


def pareto(rows):
    """Marks each row dict (bytes, kl_mean) 'front' when no other row is as good on both and better on one."""
    def beats(o, r):
        return o["bytes"] <= r["bytes"] and o["kl_mean"] <= r["kl_mean"] and (o["bytes"], o["kl_mean"]) != (r["bytes"], r["kl_mean"])
    for r in rows:
        r["front"] = not any(beats(o, r) for o in rows)
    return rows


def convert(src, out, flags, calibrate, ref):
    extra = ["--calibrate", str(calibrate), "--calibrate-model", str(ref)] if calibrate else []
    cmd = [sys.executable, str(ROOT / "coli"), "convert", str(src), str(out)] + flags + extra
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise Fail(f"coli convert failed (exit {r.returncode}) for {' '.join(flags)}:\n{r.stderr.strip()[-800:]}")


def table(rows, base_kl, base_bytes):
    out = ["| setting | MB read per decoded token | mean KL | top-1 agreement | KL vs base | MB vs base | front |",
           "|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["bytes"], r["kl_mean"])):
        out.append(f"| {r['label']} | {r['bytes'] / 1e6:.1f} | {r['kl_mean']:.3e} | {100 * r['top1']:.1f} % | "
                   f"{r['kl_mean'] / base_kl:.2f}x | {(r['bytes'] - base_bytes) / 1e6:+.1f} | {'*' if r['front'] else ''} |")
    return "\n".join(out)


def run(args):
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if not (Path(args.ref) / "colibri.json").is_file():
        raise Fail(f"--ref {args.ref}: no colibri.json (convert the source with --experts bf16 --dense bf16)")
    ref_logits = work / f"ref-{args.ctx}x{args.chunks}.f32"
    if not ref_logits.exists():
        kl_pareto.coli_perplexity(args.ref, args, ["--save-logits", str(ref_logits)])
    rows = []
    for label, flags in variants(shlex.split(args.base), args.vary, args.setting):
        out = work / slug(flags + (["calibrated"] if args.calibrate else []))
        if not (out / "colibri.json").is_file():
            convert(args.src, out, flags, args.calibrate, args.ref)
        res = kl_pareto.coli_perplexity(out, args, ["--ref-logits", str(ref_logits)])
        row = {"label": label, "flags": " ".join(flags), "container": str(out), "bytes": kl_pareto.colibri_bytes_per_token(out),
               "kl_mean": res["kl_mean"], "top1": res["top1"]}
        print("row: " + json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    pareto(rows)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(table(rows, rows[0]["kl_mean"], rows[0]["bytes"]))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", required=True, help="the checkpoint every setting converts (HF directory or .gguf)")
    p.add_argument("--ref", required=True, help="its unquantized container (--experts bf16 --dense bf16)")
    p.add_argument("--file", type=Path, required=True, help="UTF-8 text the KL is measured on")
    p.add_argument("--work", required=True, help="folder for the conversions and the reference logits")
    p.add_argument("--base", default="", help="coli convert flags every setting starts from (one string)")
    p.add_argument("--vary", action="append", metavar="CLASS=T1,T2", help="one setting per type of one class")
    p.add_argument("--setting", action="append", metavar="LABEL=FLAGS", help="a setting of its own, after the base")
    p.add_argument("--calibrate", type=Path, help="calibration text for every conversion (coli convert --calibrate)")
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = p.parse_args(argv)
    try:
        run(args)
    except (Fail, kl_pareto.Fail) as e:
        print(f"quant_study: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
