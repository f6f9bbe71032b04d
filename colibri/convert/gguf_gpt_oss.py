"""GGUF import of llama.cpp's `gpt-oss` files: their metadata as the HF config the gpt_oss family
reads, and their tensor names as HF names (stdlib only).

What llama.cpp's converter (GptOssModel) does, and how it is read back:
- the fused gate_up_proj is split into ffn_gate_exps / ffn_up_exps ([E, I, H], output rows first,
  gate = the even rows), down_proj is ffn_down_exps [E, H, I]; their biases are ffn_*_exps.bias
  [E, rows]; each expert's rows are read as the per-expert tensors the container holds;
- MXFP4 experts are GGUF type 39, whose block (e8m0 byte + 16 nibble bytes, element j low, j+16
  high) is colibri's mxfp4 block: kept as they are by default, else dequantized exactly;
- sliding layers are the even ones (llama.cpp's swa pattern 2) with attention.sliding_window;
- the SwiGLU clamp is llama.cpp's fixed 7 (alpha 1.702) unless the file carries swiglu_clamp_exp;
- YaRN: rope.scaling.factor / original_context_length, beta_fast/slow 32/1 unless written, and
  no truncation of the correction range (the gpt-oss reference's `truncate: false`).
"""
from colibri.errors import ConvertError

ARCH = "gpt-oss"

PER_LAYER = {
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "attn_sinks.weight": "self_attn.sinks",
    "ffn_gate_inp.weight": "mlp.router.weight",
    "ffn_gate_inp.bias": "mlp.router.bias",
}
# [E, rows] GGUF tensors -> per-expert HF names (rows = one vector per expert)
EXPERT_BIASES = {"ffn_gate_exps.bias": "gate_proj", "ffn_up_exps.bias": "up_proj", "ffn_down_exps.bias": "down_proj"}


def build_config(g, tensors, m, uniform, base):
    """gpt-oss metadata -> ("gpt_oss", HF config). base: the keys every family shares."""
    L = m.need("block_count", int)
    heads = uniform(m, "attention.head_count", L)
    kv = uniform(m, "attention.head_count_kv", L)
    hd = m.get("attention.key_length", kind=int) or base["hidden_size"] // heads
    if (m.get("attention.value_length", kind=int) or hd) != hd:
        raise ConvertError(f"{g.path}: gpt-oss key and value lengths differ")
    window = m.need("attention.sliding_window", int)
    limit = m.get("swiglu_clamp_exp")
    if isinstance(limit, list):
        if len(set(limit)) != 1:
            raise ConvertError(f"{g.path}: {ARCH}.swiglu_clamp_exp varies by layer ({limit[:8]}); not supported")
        limit = limit[0]
    rope = {"rope_type": "default", "rope_theta": float(m.get("rope.freq_base", 150000.0, kind=float))}
    kind = m.get("rope.scaling.type")
    if kind == "yarn":
        rope.update(rope_type="yarn", factor=float(m.need("rope.scaling.factor", float)),
                    original_max_position_embeddings=m.need("rope.scaling.original_context_length", int),
                    beta_fast=float(m.get("rope.scaling.yarn_beta_fast", 32.0, kind=float)),
                    beta_slow=float(m.get("rope.scaling.yarn_beta_slow", 1.0, kind=float)), truncate=False)
    elif kind not in (None, "none"):
        raise ConvertError(f"{g.path}: rope scaling '{kind}' is not supported for {ARCH}")
    cfg = dict(base, architectures=["GptOssForCausalLM"], model_type="gpt_oss", num_hidden_layers=L,
               num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd,
               intermediate_size=m.need("expert_feed_forward_length", int),
               num_local_experts=m.need("expert_count", int), num_experts_per_tok=m.need("expert_used_count", int),
               sliding_window=window, attention_bias="blk.0.attn_q.bias" in tensors,
               layer_types=["sliding_attention" if l % 2 == 0 else "full_attention" for l in range(L)],
               swiglu_alpha=1.702, swiglu_limit=float(limit if limit is not None else 7.0), rope_parameters=rope)
    return "gpt_oss", cfg


def expert_bias_rows(name, shape, pre, path, table, sources, info):
    """ffn_*_exps.bias [E, rows] -> one f32 vector per expert; False if name is not one."""
    proj = EXPERT_BIASES.get(name)
    if proj is None:
        return False
    if len(shape) != 2:
        raise ConvertError(f"expert bias '{name}' is not 2-D ({shape})")
    E, n = shape
    for e in range(E):
        hn = f"{pre}.mlp.experts.{e}.{proj}.bias"
        table[hn] = dict(file=path, dtype="F32", shape=[n], offset=0)
        sources[hn] = (info, e, None)
    return True
