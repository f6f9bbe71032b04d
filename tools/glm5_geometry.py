"""A synthetic checkpoint with GLM-5's per-layer geometry, written as block-FP8 like the release
(`stream_bench.py gen DIR --geometry glm5 --layers N`).

GLM-5 (glm_moe_dsa): hidden 6144, MLA attention (64 heads, q_lora 2048, kv_lora 512, nope 192 +
rope 64, v 256) with the DSA lightning indexer (32 heads x 128, top 2048 keys), 256 routed
experts of width 2048, top-8, one shared expert, a 154,880-token vocabulary. Every linear weight
of a layer is F8_E4M3 with an F32 `_scale_inv` per 128 x 128 block (the release's
quantization_config); norms, the router and the indexer's head weights stay bf16, the embeddings
and the head bf16. One dense layer leads, as in the release (it has three), then N - 1 MoE layers
of about 10 GB each: the shards are written one tensor at a time, so RAM holds one expert.
"""
import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
H, HEADS, Q_LORA, KV_LORA, NOPE, ROPE, V_DIM = 6144, 64, 2048, 512, 192, 64, 256
IDX_HEADS, IDX_DIM, EXPERTS, WIDTH, DENSE_WIDTH, VOCAB = 32, 128, 256, 2048, 12288, 154880
BLOCK = 128

CONFIG = dict(architectures=["GlmMoeDsaForCausalLM"], model_type="glm_moe_dsa", hidden_size=H,
              num_attention_heads=HEADS, num_key_value_heads=HEADS, q_lora_rank=Q_LORA, kv_lora_rank=KV_LORA,
              qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE, qk_head_dim=NOPE + ROPE, head_dim=ROPE, v_head_dim=V_DIM,
              index_n_heads=IDX_HEADS, index_head_dim=IDX_DIM, index_topk=2048, n_routed_experts=EXPERTS,
              num_experts_per_tok=8, moe_intermediate_size=WIDTH, n_shared_experts=1, intermediate_size=DENSE_WIDTH,
              n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5, vocab_size=VOCAB,
              max_position_embeddings=202752, rms_norm_eps=1e-5, rope_theta=1000000.0, attention_bias=False,
              tie_word_embeddings=False, num_nextn_predict_layers=0, hidden_act="silu", torch_dtype="bfloat16",
              bos_token_id=151643, eos_token_id=151645,
              quantization_config={"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                   "weight_block_size": [BLOCK, BLOCK]})


def fp8(rng, shape, np):
    """Random e4m3 bytes with exponent 6 (magnitude 0.5..0.94) and random signs: never NaN."""
    return (rng.integers(0, 256, size=shape, dtype=np.uint8) & np.uint8(0x87)) | np.uint8(0x30)


def bf16(rng, shape, np, exponent=0x3C00):
    bits = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)
    return (bits & np.uint16(0x807F)) | np.uint16(exponent)


def layer_tensors(l, moe):
    """(name, dtype, shape) of layer l in the release's order and spelling; each FP8 weight is
    followed by its block scale."""
    p = f"model.layers.{l}"
    out = [(f"{p}.input_layernorm.weight", "BF16", (H,)), (f"{p}.post_attention_layernorm.weight", "BF16", (H,))]

    def linear(name, rows, cols):
        out.append((name, "F8_E4M3", (rows, cols)))
        out.append((name + "_scale_inv", "F32", (-(-rows // BLOCK), -(-cols // BLOCK))))
    a = f"{p}.self_attn"
    linear(f"{a}.q_a_proj.weight", Q_LORA, H)
    out.append((f"{a}.q_a_layernorm.weight", "BF16", (Q_LORA,)))
    linear(f"{a}.q_b_proj.weight", HEADS * (NOPE + ROPE), Q_LORA)
    linear(f"{a}.kv_a_proj_with_mqa.weight", KV_LORA + ROPE, H)
    out.append((f"{a}.kv_a_layernorm.weight", "BF16", (KV_LORA,)))
    linear(f"{a}.kv_b_proj.weight", HEADS * (NOPE + V_DIM), KV_LORA)
    linear(f"{a}.o_proj.weight", H, HEADS * V_DIM)
    linear(f"{a}.indexer.wq_b.weight", IDX_HEADS * IDX_DIM, Q_LORA)
    linear(f"{a}.indexer.wk.weight", IDX_DIM, H)
    out += [(f"{a}.indexer.k_norm.weight", "BF16", (IDX_DIM,)), (f"{a}.indexer.k_norm.bias", "BF16", (IDX_DIM,)),
            (f"{a}.indexer.weights_proj.weight", "BF16", (IDX_HEADS, H))]
    if not moe:
        for proj, shape in (("gate_proj", (DENSE_WIDTH, H)), ("up_proj", (DENSE_WIDTH, H)), ("down_proj", (H, DENSE_WIDTH))):
            linear(f"{p}.mlp.{proj}.weight", *shape)
        return out
    out += [(f"{p}.mlp.gate.weight", "BF16", (EXPERTS, H)), (f"{p}.mlp.gate.e_score_correction_bias", "F32", (EXPERTS,))]
    for who in ["shared_experts"] + [f"experts.{e}" for e in range(EXPERTS)]:
        for proj, shape in (("gate_proj", (WIDTH, H)), ("up_proj", (WIDTH, H)), ("down_proj", (H, WIDTH))):
            linear(f"{p}.mlp.{who}.{proj}.weight", *shape)
    return out


def values(rng, name, dtype, shape, np):
    if dtype == "F8_E4M3":
        return fp8(rng, shape, np)
    if dtype == "F32":  # block scales (weights of magnitude 0.006..0.012) and the router's bias
        return np.full(shape, 0.0 if name.endswith("correction_bias") else 1 / 80, dtype=np.float32)
    if name.endswith("norm.weight"):
        return np.full(shape, 0x3F80, dtype=np.uint16)  # 1.0
    if name.endswith("norm.bias"):
        return np.zeros(shape, dtype=np.uint16)
    # embeddings of magnitude 0.5..1 dominate the residual stream, so routing follows the token
    return bf16(rng, shape, np, 0x3F00 if name.startswith("model.embed_tokens") else 0x3C00)


def write_shard(path, specs, rng, np):
    """A safetensors file written tensor by tensor (the header first, from the shapes alone)."""
    size = {"F8_E4M3": 1, "BF16": 2, "F32": 4}
    header, off = {}, 0
    for name, dtype, shape in specs:
        n = size[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = str(path) + ".tmp"
    with open(tmp, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for name, dtype, shape in specs:
            f.write(values(rng, name, dtype, shape, np).tobytes())
    os.replace(tmp, path)


def copy_tokenizer(out):
    """The real Qwen3 tokenizer into out (created), as both synthetic checkpoints carry it."""
    out.mkdir(parents=True, exist_ok=True)
    tok = ROOT / ".cache" / "tokenizers" / "qwen3"
    if not (tok / "tokenizer.json").is_file():
        sys.exit("the Qwen3 tokenizer is missing: run `make test` once (it fetches .cache/tokenizers)")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok / f, out / f)


def gen(out, layers, seed):
    import numpy as np
    if layers < 2:
        sys.exit("--layers must be at least 2 (the dense layer and one MoE layer)")
    copy_tokenizer(out)
    (out / "config.json").write_text(json.dumps(dict(CONFIG, num_hidden_layers=layers, first_k_dense_replace=1), indent=1))
    rng = np.random.default_rng(seed)
    shards = [("trunk", [("model.embed_tokens.weight", "BF16", (VOCAB, H)), ("lm_head.weight", "BF16", (VOCAB, H)),
                         ("model.norm.weight", "BF16", (H,))])]
    shards += [(f"layer{l}", layer_tensors(l, l > 0)) for l in range(layers)]
    index = {"metadata": {}, "weight_map": {}}
    for k, (tag, specs) in enumerate(shards):
        name = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        path = out / name
        if not path.is_file():  # resumable: a shard already written is kept
            write_shard(path, specs, rng, np)
            print(f"gen: {name} ({tag}) {path.stat().st_size / 1e9:.2f} GB", flush=True)
        index["weight_map"].update({n: name for n, _, _ in specs})
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
