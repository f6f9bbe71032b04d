#!/usr/bin/env python3
"""Measure candidate weight formats by KL-divergence against the unquantized model.

Fake-quantizes every Linear weight of a transformers checkpoint (experts and dense trunk
separately, norms and router untouched, as the converter does), runs the model on a fixed
token sequence and prints mean KL(ref || quantized) and top-1 agreement per format. This is how
the container's q4/q8 block size and scale types were chosen (docs/container.md).

Usage: python tools/format_study.py [CHECKPOINT_DIR ...]   (default: the oracle checkpoints)
"""
import argparse
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]


def q_asym(w, bits, group, search=False):
    """Per-group min/max affine quantization (x = d*q + m); search tries shrunken ranges."""
    rows, cols = w.shape
    pad = (-cols) % group
    x = torch.nn.functional.pad(w, (0, pad)).reshape(rows, -1, group)
    lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    levels = 2 ** bits - 1
    best, best_err = None, None
    for shrink in ((1.0, 0.97, 0.94, 0.9, 0.85) if search else (1.0,)):
        mid = (hi + lo) / 2
        l2, h2 = mid - (mid - lo) * shrink, mid + (hi - mid) * shrink
        d = ((h2 - l2) / levels).half().float()
        m = l2.half().float()
        q = torch.clamp(torch.round((x - m) / torch.where(d == 0, torch.ones_like(d), d)), 0, levels)
        y = q * d + m
        err = ((y - x) ** 2).sum(-1, keepdim=True)
        if best is None:
            best, best_err = y, err
        else:
            take = err < best_err
            best, best_err = torch.where(take, y, best), torch.where(take, err, best_err)
    return best.reshape(rows, -1)[:, :cols]


def q_sym(w, bits, group):
    """Per-group absmax symmetric quantization (x = d*q)."""
    rows, cols = w.shape
    pad = (-cols) % group
    x = torch.nn.functional.pad(w, (0, pad)).reshape(rows, -1, group)
    qmax = 2 ** (bits - 1) - 1
    d = (x.abs().amax(-1, keepdim=True) / qmax).half().float()
    q = torch.clamp(torch.round(x / torch.where(d == 0, torch.ones_like(d), d)), -qmax, qmax)
    return (q * d).reshape(rows, -1)[:, :cols]


FORMATS = {
    "q4 asym g32 (colibri q4)": lambda w: q_asym(w, 4, 32),
    "q4 asym g32 + range search": lambda w: q_asym(w, 4, 32, search=True),
    "q4 sym g32 (Q4_0-like)": lambda w: q_sym(w, 4, 32),
    "q4 asym g64": lambda w: q_asym(w, 4, 64),
    "q4 asym g128": lambda w: q_asym(w, 4, 128),
    "q8 sym g32 (colibri q8)": lambda w: q_sym(w, 8, 32),
    "q8 sym g128": lambda w: q_sym(w, 8, 128),
}


def weight_params(model):
    for name, p in model.named_parameters():
        if p.dim() == 2 and "norm" not in name and not name.endswith("mlp.gate.weight"):
            yield name, p, "expert" if ".experts." in name else "dense"
        elif p.dim() == 3:  # fused experts [E, out, in]
            yield name, p, "expert"


def kl_top1(ref, got):
    lp, lq = torch.log_softmax(ref.double(), -1), torch.log_softmax(got.double(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1).mean().item()
    return kl, (ref.argmax(-1) == got.argmax(-1)).float().mean().item()


def study(path, which):
    from transformers import AutoModelForCausalLM
    kw = {"dtype": torch.float32, "attn_implementation": "eager"}
    try:
        model = AutoModelForCausalLM.from_pretrained(path, experts_implementation="eager", **kw)
    except (TypeError, ValueError):
        model = AutoModelForCausalLM.from_pretrained(path, **kw)
    model.eval()
    vocab = model.config.vocab_size
    ids = torch.tensor([np.random.default_rng(0).integers(0, vocab, 96).tolist()])
    with torch.no_grad():
        ref = model(ids).logits[0]
    originals = {n: p.detach().clone() for n, p, _ in weight_params(model)}
    rows = []
    for fmt, fn in FORMATS.items():
        with torch.no_grad():
            for n, p, kind in weight_params(model):
                if kind not in which:
                    continue
                w = originals[n]
                p.copy_(torch.stack([fn(m) for m in w]) if w.dim() == 3 else fn(w))
            kl, top1 = kl_top1(ref, model(ids).logits[0])
            for n, p, _ in weight_params(model):
                p.copy_(originals[n])
        rows.append((fmt, kl, top1))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoints", nargs="*")
    ap.add_argument("--tensors", choices=["expert", "dense", "all"], default="all")
    args = ap.parse_args()
    torch.set_num_threads(1)
    paths = args.checkpoints or [str(p / "hf") for p in sorted((ROOT / ".cache" / "oracles").glob("*"))
                                 if (p / "hf").is_dir() and p.name in ("llama", "qwen2", "qwen3_moe", "qwen3_moe_nonorm")]
    if not paths:
        sys.exit("no checkpoints: pass directories or run tools/make_oracles.py first")
    which = {"expert", "dense"} if args.tensors == "all" else {args.tensors}
    for path in paths:
        print(f"\n{path}  (quantized: {', '.join(sorted(which))})")
        print(f"  {'format':32s} {'mean KL':>10s} {'top-1':>7s}")
        for fmt, kl, top1 in study(path, which):
            print(f"  {fmt:32s} {kl:10.2e} {100 * top1:6.1f}%")


if __name__ == "__main__":
    main()
