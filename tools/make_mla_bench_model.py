#!/usr/bin/env python3
"""A random-weight checkpoint with a frontier model's latent-attention geometry and a narrow
trunk, for timing attention at depth (docs/benchmarks.md): two layers, dense MLPs, hidden 1024,
vocab 2048, and the attention of DeepSeek-V3 (128 heads, kv_lora 512, rope 64, nope 128, v 128)
or GLM-5 (64 heads, q_lora 2048, nope 192, v 256, a DSA indexer of 32 heads x 128 keeping 2048).

    .venv/bin/python tools/make_mla_bench_model.py deepseek_v3 OUT_HF   # then: coli convert OUT_HF OUT
"""
import argparse
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRUNK = dict(vocab_size=2048, hidden_size=1024, intermediate_size=512, moe_intermediate_size=256, num_hidden_layers=2,
             first_k_dense_replace=2, n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1,
             max_position_embeddings=32768, tie_word_embeddings=False)
GEOMETRY = {
    "deepseek_v3": ("DeepseekV3", "deepseek_v3", dict(
        num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, rope_scaling=None)),
    "glm5": ("GlmMoeDsa", "glm_moe_dsa", dict(
        mlp_layer_types=["dense", "dense"], num_attention_heads=64, num_key_value_heads=64, q_lora_rank=2048,
        kv_lora_rank=512, qk_nope_head_dim=192, qk_rope_head_dim=64, qk_head_dim=256, head_dim=64, v_head_dim=256,
        index_topk=2048, index_n_heads=32, index_head_dim=128, indexer_types=["full", "full"],
        layer_types=["indexed_attention", "indexed_attention"], n_shared_experts=1, eos_token_id=0,
        bos_token_id=None, pad_token_id=None)),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("geometry", choices=sorted(GEOMETRY))
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    import torch
    import transformers
    cls, tok_from, attn = GEOMETRY[args.geometry]
    torch.manual_seed(0)
    cfg = getattr(transformers, cls + "Config")(**TRUNK, **attn)
    model = getattr(transformers, cls + "ForCausalLM")(cfg).to(torch.bfloat16)
    model.save_pretrained(args.out)
    # the tiny oracle's tokenizer (make_oracles): the benchmark sends token ids
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ROOT / ".cache" / "oracles" / tok_from / "hf" / name, args.out / name)
    print(f"{args.out}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters")


if __name__ == "__main__":
    main()
