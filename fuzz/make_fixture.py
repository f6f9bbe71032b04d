"""Regenerates fuzz/assets/ (the fixture the harnesses load) from the test caches:
  tiny/       a random 1-layer llama (vocab 320, hidden 16) converted by `coli convert`, with the
              llama oracle's tokenizer.json;
  tokenizers/ Qwen3, DeepSeek-V3 and gpt-oss tokenizer.json cut to their first VOCAB ids, the
              merges among them and a few added tokens; normalizer, split regexes and
              post-processor are kept as shipped.
Needs the test venv (torch, transformers) and .cache/ filled by the test suite. Run from the
repository root: .venv/bin/python fuzz/make_fixture.py
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

VOCAB = 600
ADDED = 24
ASSETS = os.path.join("fuzz", "assets")


def cut_tokenizer(src, dst):
    with open(src, encoding="utf-8") as f:
        tok = json.load(f)
    model = tok["model"]
    vocab = {k: v for k, v in model["vocab"].items() if v < VOCAB}
    merges = []
    for m in model.get("merges", []):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(m)
    model["vocab"], model["merges"] = vocab, merges
    tok["added_tokens"] = tok["added_tokens"][:ADDED]
    with open(dst, "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, separators=(",", ":"))


def tiny_model(dst):
    import torch
    import transformers
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=320, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                   max_position_embeddings=64, eos_token_id=0, bos_token_id=None,
                                   tie_word_embeddings=True)
    with tempfile.TemporaryDirectory() as tmp:
        hf, out = os.path.join(tmp, "hf"), os.path.join(tmp, "out")
        transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(hf)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(".cache", "oracles", "llama", "hf", name), hf)
        subprocess.run([sys.executable, "coli", "convert", hf, out], check=True)
        os.makedirs(dst, exist_ok=True)
        for name in ("colibri.json", "model-00001-of-00001.safetensors", "tokenizer.json"):
            shutil.copy(os.path.join(out, name), dst)


def main():
    tiny_model(os.path.join(ASSETS, "tiny"))
    os.makedirs(os.path.join(ASSETS, "tokenizers"), exist_ok=True)
    for name in ("qwen3", "deepseek_v3", "gptoss"):
        cut_tokenizer(os.path.join(".cache", "tokenizers", name, "tokenizer.json"),
                      os.path.join(ASSETS, "tokenizers", name + ".json"))


if __name__ == "__main__":
    main()
