"""A synthetic qwen3_moe checkpoint whose 4-bit routed experts are several times a small RAM
budget: random bf16 weights written straight to safetensors (no torch), converted with
`coli convert`, cached under .cache/ keyed by a checksum of the recipe."""
import hashlib
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / ".cache" / "oracles" / "qwen3_moe" / "hf"  # tokenizer files (vocab 320)

# 10 MoE layers x 64 experts x 3 x 512 x 512 at 4 bits ~ 314 MB of experts; trunk ~ 4 MB.
RECIPE = dict(vocab_size=320, hidden_size=512, intermediate_size=512, num_hidden_layers=10, num_attention_heads=4,
              num_key_value_heads=2, head_dim=64, num_experts=64, num_experts_per_tok=4, moe_intermediate_size=512,
              seed=7, version=1)


def _bf16(rng, shape, exp_lo):
    """Random bf16 bit patterns with magnitudes 2^(exp_lo-127) .. 2^(exp_lo-123): no NaN, no inf."""
    r = rng.integers(0, 1 << 16, size=int(np.prod(shape)), dtype=np.uint16)
    return ((r & 0x807F) | ((((r >> 7) & 3) + exp_lo) << 7).astype(np.uint16)).astype(np.uint16)


def _tensors(c):
    H, I, E, hd = c["hidden_size"], c["moe_intermediate_size"], c["num_experts"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    yield "model.embed_tokens.weight", [c["vocab_size"], H], 122
    yield "lm_head.weight", [c["vocab_size"], H], 120
    yield "model.norm.weight", [H], None
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        yield f"{p}.input_layernorm.weight", [H], None
        yield f"{p}.post_attention_layernorm.weight", [H], None
        yield f"{p}.self_attn.q_norm.weight", [hd], None
        yield f"{p}.self_attn.k_norm.weight", [hd], None
        yield f"{p}.self_attn.q_proj.weight", [q, H], 119
        yield f"{p}.self_attn.k_proj.weight", [kv, H], 119
        yield f"{p}.self_attn.v_proj.weight", [kv, H], 119
        yield f"{p}.self_attn.o_proj.weight", [H, q], 118
        yield f"{p}.mlp.gate.weight", [E, H], 122
        for e in range(E):
            yield f"{p}.mlp.experts.{e}.gate_proj.weight", [I, H], 119
            yield f"{p}.mlp.experts.{e}.up_proj.weight", [I, H], 119
            yield f"{p}.mlp.experts.{e}.down_proj.weight", [H, I], 118


def write_checkpoint(out, c):
    out.mkdir(parents=True)
    rng = np.random.default_rng(c["seed"])
    items = list(_tensors(c))
    header, off = {}, 0
    for name, shape, _ in items:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    with open(out / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb)
        for name, shape, exp in items:
            a = np.full(int(np.prod(shape)), 0x3F80, np.uint16) if exp is None else _bf16(rng, shape, exp)
            f.write(a.tobytes())
    cfg = json.loads((TINY / "config.json").read_text())
    cfg.update({k: v for k, v in c.items() if k not in ("seed", "version")})
    cfg.update(num_local_experts=c["num_experts"], mlp_only_layers=[], decoder_sparse_step=1, norm_topk_prob=True)
    (out / "config.json").write_text(json.dumps(cfg))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(TINY / name, out / name)


def cached_container(kind, recipe, write_hf, convert_args=("--experts", "q4")):
    """.cache/<kind>/<checksum of recipe>/container: write_hf(dir) writes the checkpoint once,
    `coli convert` turns it into the container and the checkpoint goes (the container is what
    the tests read); reused while the recipe is unchanged."""
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]
    root = ROOT / ".cache" / kind / key
    if (root / "container" / "colibri.json").exists():
        return root / "container"
    if root.exists():
        shutil.rmtree(root)
    write_hf(root / "hf")
    subprocess.run([sys.executable, str(ROOT / "coli"), "convert", str(root / "hf"), str(root / "container"),
                    *convert_args], check=True, capture_output=True)
    shutil.rmtree(root / "hf")
    return root / "container"


def random_hf_model(model_class, config_class, config, seed, tokenizer_dir):
    """A write_hf for cached_container: transformers' own random init of model_class, bf16, with
    the tokenizer files of tokenizer_dir."""
    def write(out):
        import torch
        import transformers as tf
        torch.manual_seed(seed)
        model = getattr(tf, model_class)(getattr(tf, config_class)(**config)).eval()
        model.to(torch.bfloat16).save_pretrained(out)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(Path(tokenizer_dir) / name, out / name)
    return write


def container():
    """The converted container (built once, then reused while the recipe is unchanged)."""
    return cached_container("streaming", RECIPE, lambda out: write_checkpoint(out, RECIPE))


if __name__ == "__main__":
    print(container())
