#!/usr/bin/env python3
"""Byte-identity of two engine builds over the oracle models: for each oracle (tests' cache,
.cache/oracles), each container setting and each kernel set this CPU runs, `coli logits` of the
oracle's ids under engine A and engine B must give the same bytes. For refactors that promise
"behaviour unchanged". A dev tool, not part of the tests:

    tools/logits_identity.py --a build-old/colibri --b build/colibri [--only qwen3_moe,llama]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = {"default": [], "bf16": ["--experts", "bf16", "--dense", "bf16"]}


def run(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode:
        raise RuntimeError(f"{' '.join(map(str, cmd))}: {r.stderr.strip()[-400:]}")
    return r.stdout


def kernel_sets(engine):
    out = run([engine, "version"]).split()
    return next(w.split("=", 1)[1] for w in out if w.startswith("available=")).split(",")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="the engine before")
    ap.add_argument("--b", required=True, help="the engine after")
    ap.add_argument("--only", help="comma-separated oracle names (default: all)")
    ap.add_argument("--work", help="where the converted containers go (default: a temporary folder)")
    args = ap.parse_args()
    oracles = sorted(p for p in (ROOT / ".cache" / "oracles").iterdir() if (p / "ref.json").exists())
    if args.only:
        oracles = [p for p in oracles if p.name in args.only.split(",")]
    work = Path(args.work or tempfile.mkdtemp(prefix="logits_identity_"))
    sets = sorted(set(kernel_sets(args.a)) & set(kernel_sets(args.b)))
    same = differ = 0
    for o in oracles:
        ids = ",".join(map(str, json.loads((o / "ref.json").read_text())["ids"]))
        for name, flags in SETTINGS.items():
            model = work / f"{o.name}-{name}"
            if not (model / "colibri.json").exists():
                run([sys.executable, "coli", "convert", o / "hf", model, *flags])
            for ks in sets:
                got = []
                for engine in (args.a, args.b):
                    out = work / f"{o.name}-{name}-{ks}-{Path(engine).parent.name}.f32"
                    env = dict(os.environ, COLI_ENGINE=str(Path(engine).resolve()))
                    run([sys.executable, "coli", "logits", "--model", model, "--ids", ids, "--out", out, "--kernels", ks], env)
                    got.append(out.read_bytes())
                ok = got[0] == got[1]
                same, differ = same + ok, differ + (not ok)
                print(f"{'same   ' if ok else 'DIFFER '} {o.name:24s} {name:8s} {ks}", flush=True)
    print(f"{same} identical, {differ} different")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
