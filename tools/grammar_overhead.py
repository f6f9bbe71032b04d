#!/usr/bin/env python3
"""What constrained decoding costs per token at Qwen3's 151,936-entry vocabulary.

Two measurements, both printed, nothing asserted (a benchmark, not a test):

1. `colibri grammar-bench` on the real Qwen3 tokenizer: a random walk through each grammar, the
   mask cost of a DFA state seen for the first time (a trie walk over the whole vocabulary), of
   a cached state, and of checking one token.
2. A tiny random-weight Qwen3-MoE with the real tokenizer and full vocabulary (built once under
   .cache/grammar_overhead/, converted by `coli convert`), served by the engine: the same
   requests unconstrained and constrained by a JSON schema, per-token grammar time (END's
   grammar_ms) against the decode step. A real model's decode step is tens to hundreds of times
   longer than this tiny one's, so the fraction printed is an upper bound.

usage: PYTHONPATH=. .venv/bin/python tools/grammar_overhead.py [--requests N] [--tokens N]"""
import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from colibri import engine_client  # noqa: E402
from colibri.grammar import gbnf, json_object_gbnf, schema_grammar, schema_to_gbnf  # noqa: E402

TOKENIZER = ROOT / ".cache" / "tokenizers" / "qwen3"
WORK = ROOT / ".cache" / "grammar_overhead"
VOCAB = 151936

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags", "home"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                         "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
                         "home": {"type": "object", "additionalProperties": False, "required": ["city"],
                                  "properties": {"city": {"type": "string", "maxLength": 40}}}}}


def grammars():
    rules, name = json_object_gbnf()
    tool = gbnf.wrap(*schema_to_gbnf(PERSON), "<tool_call>\n", "\n</tool_call>")
    return {"json_object": gbnf.grammar(rules, name), "schema (bounded strings)": schema_grammar(PERSON),
            "tool call <tool_call>..</tool_call>": tool}


def bench_masks():
    print("1. mask cost on the Qwen3 tokenizer (colibri grammar-bench, random walks of 300 tokens x 3)")
    for label, g in grammars().items():
        path = WORK / "g.gbnf"
        path.write_text(g)
        r = subprocess.run([str(ROOT / "build" / "colibri"), "grammar-bench", "--tokenizer",
                            str(TOKENIZER / "tokenizer.json"), "--grammar", str(path), "--steps", "300", "--runs", "3"],
                           capture_output=True, text=True, check=True)
        print(f"   {label}:")
        for line in r.stdout.splitlines():
            print("     " + line)


def build_model():
    out = WORK / "model"
    if (out / "colibri.json").exists():
        return out
    import torch
    import transformers as tf
    hf = WORK / "hf"
    cfg = tf.Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=8,
                            num_experts_per_tok=2, moe_intermediate_size=64, max_position_embeddings=2048,
                            eos_token_id=151645, bos_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = tf.Qwen3MoeForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape) / p.shape[-1] ** 0.5 if p.dim() > 1 else 1.0 + 0.1 * torch.randn(p.shape))
    model.save_pretrained(hf)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER / f, hf / f)
    subprocess.run([sys.executable, str(ROOT / "coli"), "convert", str(hf), str(out)], check=True, capture_output=True)
    return out


def run(eng, grammar, seeds, tokens, temp):
    per = []
    for seed in seeds:
        end = None
        for ev in eng.generate("Describe a person.", grammar=grammar, temp=temp, seed=seed, max_tokens=tokens):
            if ev[0] == "end":
                end = ev[1]
        n = int(end["completion_tokens"])
        step = 1000.0 / float(end["decode_tok_s"]) if float(end["decode_tok_s"]) else 0.0
        per.append((n, step, float(end.get("grammar_ms", 0)) / max(n, 1), int(end.get("grammar_masks", 0))))
    return per


def bench_engine(requests, tokens):
    model = build_model()
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    print(f"\n2. engine, tiny Qwen3-MoE with the full {VOCAB}-token vocabulary ({requests} requests x <= {tokens} "
          "tokens; grammar time is the matcher and masks, not the sampler)")
    g = schema_grammar(PERSON)
    with engine_client.Engine(model, ctx=2048) as eng:
        cold = run(eng, g, [100], tokens, 1.0)  # first use: trie build, DFA and masks from nothing
        for temp in (1.0, 0.0):
            seeds = list(range(requests))
            free, warm = run(eng, None, seeds, tokens, temp), run(eng, g, seeds, tokens, temp)
            step_free, step_gram = mean([s for _, s, _, _ in free]), mean([s for _, s, _, _ in warm])
            gms = mean([x for _, _, x, _ in warm])
            print(f"   temp {temp:g}: decode step {step_free:7.2f} ms/token unconstrained, {step_gram:7.2f} constrained; "
                  f"grammar {gms:.3f} ms/token = {100 * gms / step_free:.1f}% of the step; "
                  f"{mean([m for *_, m in warm]):.1f} masks built per request")
    print(f"   first request (trie built on first use): grammar {cold[0][2]:.3f} ms/token over {cold[0][0]} tokens, "
          f"{cold[0][3]} masks built")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=150)
    a = ap.parse_args()
    if not (TOKENIZER / "tokenizer.json").exists():
        sys.exit(f"{TOKENIZER}/tokenizer.json is missing: run tools/fetch_tokenizers.py (or `make test` once)")
    subprocess.run(["make", "-s", "-C", str(ROOT), "build/colibri"], check=True)
    WORK.mkdir(parents=True, exist_ok=True)
    bench_masks()
    bench_engine(a.requests, a.tokens)


if __name__ == "__main__":
    main()
