"""The DeepSeek-V3 / GLM-4.5 line's own parts: the GGUF import of llama.cpp's glm4moe and deepseek2
files. Its attention and MoE are the shared builders of colibri/family/mla.py and
colibri/family/sigmoid_moe.py, which family_registry's flags pick."""
from colibri.errors import ConvertError


# ---------------------------------------------------------------- GGUF
# GGUF import of llama.cpp's `glm4moe` (GLM-4.5/4.6/4.7) and `deepseek2` (DeepSeek-V3/R1, Kimi-K2)
# files: their metadata as the HF config the glm4_moe / deepseek_v3 families read, and their
# tensor names as HF names.
#
# What llama.cpp's converter does to these checkpoints, and how it is undone:
# - glm4moe counts the MTP (nextn) layers in block_count; they are layer index num_hidden_layers
#   and up, kept in the container but not run, as from safetensors.
# - deepseek2 drops the MTP layers, and (recent versions) splits kv_b_proj per head into attn_k_b
#   (the key half, transposed) and attn_v_b, put back together by colibri/convert/gguf_kv_b.py.
#   Older files keep attn_kv_b as HF has it.
# - YaRN's mscale_all_dim is stored as yarn_log_multiplier = 0.1 * mscale_all_dim; llama.cpp
#   applies it as mscale = mscale_all_dim (the RoPE-side attention factor is then 1).

GGUF_ARCHS = {"glm4moe": "glm4_moe", "deepseek2": "deepseek_v3"}
GGUF_HF_CLASS = {"glm4_moe": "Glm4MoeForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}
GATING_SIGMOID = 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID

# per-layer GGUF tensor -> HF name under model.layers.N (besides gguf.py's llama-style table)
GGUF_PER_LAYER = {
    "post_attention_norm.weight": "post_attention_layernorm.weight",   # glm4moe's name for it
    "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
    "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
    "attn_q_a.weight": "self_attn.q_a_proj.weight", "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
    "attn_q_b.weight": "self_attn.q_b_proj.weight",
    "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight",
    "attn_kv_b.weight": "self_attn.kv_b_proj.weight",
    # the MTP layer's own pieces (glm4moe)
    "nextn.eh_proj.weight": "eh_proj.weight", "nextn.embed_tokens.weight": "embed_tokens.weight",
    "nextn.enorm.weight": "enorm.weight", "nextn.hnorm.weight": "hnorm.weight",
    "nextn.shared_head_head.weight": "shared_head.head.weight",
    "nextn.shared_head_norm.weight": "shared_head.norm.weight",
}


def _gguf_moe_keys(m, cfg, tensors, L):
    """Routing keys both architectures write (llama.cpp's set_gguf_parameters)."""
    gating = m.get("expert_gating_func", kind=int)
    if gating is not None and gating != GATING_SIGMOID:
        raise ConvertError(f"{m.g.path}: {m.arch}.expert_gating_func = {gating} (softmax routing, e.g. DeepSeek-V2); "
                           "only sigmoid routing (DeepSeek-V3/R1, GLM-4.5) is supported")
    cfg["n_routed_experts"] = m.need("expert_count", int)
    cfg["num_experts_per_tok"] = m.need("expert_used_count", int)
    cfg["moe_intermediate_size"] = m.need("expert_feed_forward_length", int)
    cfg["n_shared_experts"] = m.get("expert_shared_count", 0, kind=int)
    cfg["first_k_dense_replace"] = m.get("leading_dense_block_count", 0, kind=int)
    cfg["routed_scaling_factor"] = float(m.get("expert_weights_scale", 1.0, kind=float))
    cfg["norm_topk_prob"] = bool(m.get("expert_weights_norm", False))
    cfg["n_group"] = m.get("expert_group_count", 1, kind=int) or 1
    cfg["topk_group"] = m.get("expert_group_used_count", 1, kind=int) or 1
    dense = [l for l in range(L) if f"blk.{l}.ffn_gate_inp.weight" not in tensors]
    if dense != list(range(cfg["first_k_dense_replace"])):
        raise ConvertError(f"{m.g.path}: dense layers {dense} are not the leading {cfg['first_k_dense_replace']} "
                           f"({m.arch}.leading_dense_block_count)")
    shexp = f"blk.{cfg['first_k_dense_replace']}.ffn_up_shexp.weight"
    if cfg["n_shared_experts"] and shexp in tensors:
        width = tensors[shexp].shape[1]
        if width != cfg["n_shared_experts"] * cfg["moe_intermediate_size"]:
            raise ConvertError(f"{m.g.path}: shared expert width {width} != expert_shared_count x "
                               "expert_feed_forward_length")


def _gguf_rope(m, cfg):
    kind = m.get("rope.scaling.type")
    theta = float(m.get("rope.freq_base", 10000.0, kind=float))
    if kind in (None, "none"):
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    elif kind == "yarn":
        log_mul = float(m.get("rope.scaling.yarn_log_multiplier", 0.0, kind=float))
        mscale = round(log_mul / 0.1, 6)  # float32 0.1 * mscale_all_dim back to the config's value
        p = {"rope_type": "yarn", "rope_theta": theta, "factor": float(m.need("rope.scaling.factor", float)),
             "original_max_position_embeddings": m.need("rope.scaling.original_context_length", int),
             "beta_fast": float(m.get("rope.scaling.yarn_beta_fast", 32.0, kind=float)),
             "beta_slow": float(m.get("rope.scaling.yarn_beta_slow", 1.0, kind=float))}
        if mscale:
            p.update(mscale=mscale, mscale_all_dim=mscale)
        cfg["rope_parameters"] = p
    else:
        raise ConvertError(f"{m.g.path}: rope scaling '{kind}' is not supported for {m.arch}")


def gguf_config(g, tensors, m, uniform, base):
    """glm4moe / deepseek2 metadata -> (family, HF config). base: the keys every family shares."""
    arch = m.arch
    blocks = m.need("block_count", int)
    nextn = m.get("nextn_predict_layers", 0, kind=int)
    L = blocks - nextn if arch == "glm4moe" else blocks  # deepseek2 files carry no MTP layer
    heads = uniform(m, "attention.head_count", blocks)
    cfg = dict(base, num_hidden_layers=L, num_attention_heads=heads, num_nextn_predict_layers=nextn)
    has_ff = f"{arch}.feed_forward_length" in g.metadata
    cfg["intermediate_size"] = uniform(m, "feed_forward_length", blocks) if has_ff else 0
    _gguf_rope(m, cfg)
    if arch == "glm4moe":
        family = "glm4_moe"
        kv = uniform(m, "attention.head_count_kv", blocks)
        hd = m.get("attention.key_length", kind=int) or base["hidden_size"] // heads
        if (m.get("attention.value_length", kind=int) or hd) != hd:
            raise ConvertError(f"{g.path}: glm4moe key and value lengths differ")
        rot = m.get("rope.dimension_count", kind=int) or hd // 2
        if rot > hd or rot % 2:
            raise ConvertError(f"{g.path}: rope.dimension_count {rot} does not fit head length {hd}")
        cfg.update(num_key_value_heads=kv, head_dim=hd, partial_rotary_factor=rot / hd,
                   attention_bias="blk.0.attn_q.bias" in tensors, use_qk_norm="blk.0.attn_q_norm.weight" in tensors)
    else:
        family = "deepseek_v3"
        kl = m.need("attention.kv_lora_rank", int)
        dr = m.need("rope.dimension_count", int)
        if m.get("attention.key_length_mla") is not None:  # MLA-mode file: key_length is the latent's
            dk, dv = m.need("attention.key_length_mla", int), m.need("attention.value_length_mla", int)
        else:
            dk, dv = m.need("attention.key_length", int), m.need("attention.value_length", int)
        if dk <= dr:
            raise ConvertError(f"{g.path}: key length {dk} leaves no non-rotary part beside rope dims {dr}")
        cfg.update(num_key_value_heads=heads, q_lora_rank=m.get("attention.q_lora_rank", kind=int) or None,
                   kv_lora_rank=kl, qk_rope_head_dim=dr, qk_nope_head_dim=dk - dr, qk_head_dim=dk, v_head_dim=dv,
                   head_dim=dr, rope_interleave=True,  # llama.cpp runs deepseek2's RoPE interleaved (NORM)
                   attention_bias="blk.0.attn_kv_a_mqa.bias" in tensors)
    cfg["architectures"] = [GGUF_HF_CLASS[family]]
    cfg["model_type"] = family
    _gguf_moe_keys(m, cfg, tensors, L)
    return family, cfg

GGUF_SPLIT_KV_B = True  # attn_k_b / attn_v_b are read back into kv_b_proj (colibri/convert/gguf_kv_b.py)


def gguf_blocks(cfg):
    """The blk.N layers the file holds: glm4moe's count its MTP layers, deepseek2's have none."""
    return cfg["num_hidden_layers"] + (int(cfg.get("num_nextn_predict_layers") or 0) if cfg["model_type"] == "glm4_moe" else 0)


def gguf_key_halves(cfg):
    """Whether kv_b_proj's key halves may come from a per-head split attn_k_b (deepseek2 files)."""
    return cfg["model_type"] == "deepseek_v3"
