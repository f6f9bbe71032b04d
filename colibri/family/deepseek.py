"""The DeepSeek-V3 / GLM-4.5 line: sigmoid group-limited routing with shared experts, leading
dense layers, and multi-head latent attention (MLA). family_registry maps a config with these
helpers; they return plain dicts (the arch fields, the block specs, the tensor shapes)."""
import math

from colibri.errors import ConvertError


def _get(cfg, *names, default=None):
    """The first of several spellings a config may use (n_routed_experts / num_local_experts)."""
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return default


def moe_arch(cfg, layers):
    """Routing facts and the dense/MoE pattern: first_k_dense_replace, or mlp_layer_types."""
    experts = int(_get(cfg, "n_routed_experts", "num_local_experts", "num_experts", default=0))
    types = cfg.get("mlp_layer_types")
    if types:
        if len(types) != layers or set(types) - {"dense", "sparse"}:
            raise ValueError(f"mlp_layer_types must list 'dense' or 'sparse' for each of the {layers} layers")
        kinds = ["moe" if t == "sparse" else "dense" for t in types]
    else:
        k = int(_get(cfg, "first_k_dense_replace", default=0))
        kinds = ["dense" if l < k else "moe" for l in range(layers)]
    if not experts:
        kinds = ["dense"] * layers
    width = int(cfg.get("moe_intermediate_size") or 0)
    return {
        "num_experts": experts,
        "num_experts_per_tok": int(cfg.get("num_experts_per_tok") or 0),
        "moe_intermediate_size": width,
        "norm_topk_prob": bool(cfg.get("norm_topk_prob", True)),
        "router": "sigmoid_group",
        "n_group": int(cfg.get("n_group") or 1),
        "topk_group": int(cfg.get("topk_group") or 1),
        "routed_scaling_factor": float(cfg.get("routed_scaling_factor") or 1.0),
        "shared_width": width * int(cfg.get("n_shared_experts") or 0),
        # multi-token-prediction layers stored after the last layer: kept by the converter, not run
        "num_nextn_predict_layers": int(_get(cfg, "num_nextn_predict_layers", "num_mtp_layers", default=0)),
        "layer_mlp": kinds,
    }


def yarn_mscale_sq(params):
    """DeepSeek folds YaRN's mscale(factor, mscale_all_dim)^2 into the softmax scale."""
    if params.get("rope_type", params.get("type", "default")) == "default":
        return 1.0
    m_all = params.get("mscale_all_dim") or 0
    factor = float(params.get("factor") or 1.0)
    if not m_all or factor <= 1:
        return 1.0
    m = 0.1 * m_all * math.log(factor) + 1.0
    return m * m


def mla_arch(cfg, rope_style=None):
    """MLA geometry and its softmax scale (qk_head_dim^-1/2, YaRN mscale folded in)."""
    ql = cfg.get("q_lora_rank")
    dn, dr, dv = int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"]), int(cfg["v_head_dim"])
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    interleave = cfg.get("rope_interleave")
    return {
        "attn": "mla",
        "q_lora_rank": int(ql) if ql else 0,
        "kv_lora_rank": int(cfg["kv_lora_rank"]),
        "qk_nope_head_dim": dn,
        "qk_rope_head_dim": dr,
        "v_head_dim": dv,
        "rope_style": rope_style or ("interleaved" if interleave is None or interleave else "neox"),
        "attn_scale": (dn + dr) ** -0.5 * yarn_mscale_sq(params),
        "mla_bias": bool(cfg.get("attention_bias", False)),
    }


def dsa_arch(cfg, rope_style):
    """The DSA lightning indexer (GLM-5, DeepSeek-V3.2): its geometry, top-k and RoPE layout."""
    types = cfg.get("indexer_types") or ["full"] * int(cfg["num_hidden_layers"])
    if set(types) - {"full", "shared"} or len(types) != int(cfg["num_hidden_layers"]) or types[0] != "full":
        raise ValueError("indexer_types must name 'full' or 'shared' for every layer, the first 'full'")
    if not cfg.get("q_lora_rank"):
        raise ValueError("a DSA indexer needs q_lora_rank (its queries come from the query latent)")
    return {"index_n_heads": int(cfg["index_n_heads"]), "index_head_dim": int(cfg["index_head_dim"]),
            "index_topk": int(cfg["index_topk"]), "index_rope_style": rope_style,
            # "shared": the layer reuses the top-k of the last "full" one before it
            "indexer_types": list(types)}


def mla_attn_spec(arch, p):
    """The "mla" attention block of one layer (tensor names under prefix p)."""
    sa = f"{p}.self_attn"
    t = {"kv_a": f"{sa}.kv_a_proj_with_mqa.weight", "kv_a_norm": f"{sa}.kv_a_layernorm.weight",
         "kv_b": f"{sa}.kv_b_proj.weight", "o": f"{sa}.o_proj.weight"}
    if arch["q_lora_rank"]:
        t.update({"q_a": f"{sa}.q_a_proj.weight", "q_a_norm": f"{sa}.q_a_layernorm.weight", "q_b": f"{sa}.q_b_proj.weight"})
    else:
        t["q"] = f"{sa}.q_proj.weight"
    if arch["mla_bias"]:
        t.update({"kv_a_bias": f"{sa}.kv_a_proj_with_mqa.bias", "o_bias": f"{sa}.o_proj.bias"})
        if arch["q_lora_rank"]:
            t["q_a_bias"] = f"{sa}.q_a_proj.bias"
    kl, dr = arch["kv_lora_rank"], arch["qk_rope_head_dim"]
    spec = {"kind": "mla", "heads": arch["num_heads"], "q_lora_rank": arch["q_lora_rank"], "kv_lora_rank": kl,
            "qk_nope_head_dim": arch["qk_nope_head_dim"], "qk_rope_head_dim": dr, "v_head_dim": arch["v_head_dim"],
            "scale": arch["attn_scale"], "norm_eps": 1e-6,  # q_a / kv_a norms use the RMSNorm default
            "rope": {"style": arch["rope_style"], "dim": dr},
            "state": {"kv_values_per_pos": kl + dr, "fixed_bytes": 0, "truncatable": True},
            "tensors": t}
    if arch.get("index_topk") and arch["indexer_types"][int(p.rsplit(".", 1)[1])] == "shared":
        spec["indexer"] = {"shared": True}
    elif arch.get("index_topk"):
        ix = f"{sa}.indexer"
        # its keys follow the latent in the layer's state, as f32 whatever --kv: the top-k is a hard
        # threshold that f16 rounding of the keys would move (c/model/block_attn_mla.c)
        spec["state"]["f32_values_per_pos"] = arch["index_head_dim"]
        spec["indexer"] = {"heads": arch["index_n_heads"], "head_dim": arch["index_head_dim"],
                           "topk": arch["index_topk"], "norm_eps": 1e-6,  # nn.LayerNorm(eps=1e-6)
                           "rope": {"style": arch["index_rope_style"]},
                           "tensors": {"wq_b": f"{ix}.wq_b.weight", "wk": f"{ix}.wk.weight",
                                       "weights": f"{ix}.weights_proj.weight", "k_norm": f"{ix}.k_norm.weight",
                                       "k_norm_bias": f"{ix}.k_norm.bias"}}
    return spec


def mla_shapes(spec, hidden):
    """Source shape of every tensor an "mla" spec names."""
    nh, ql, kl = spec["heads"], spec["q_lora_rank"], spec["kv_lora_rank"]
    dn, dr, dv = spec["qk_nope_head_dim"], spec["qk_rope_head_dim"], spec["v_head_dim"]
    qd = nh * (dn + dr)
    return {"q": [qd, hidden], "q_a": [ql, hidden], "q_a_bias": [ql], "q_a_norm": [ql], "q_b": [qd, ql],
            "kv_a": [kl + dr, hidden], "kv_a_bias": [kl + dr], "kv_a_norm": [kl],
            "kv_b": [nh * (dn + dv), kl], "o": [hidden, nh * dv], "o_bias": [hidden]}


def indexer_shapes(ix, hidden, q_lora):
    """Source shape of every tensor a DSA indexer spec names."""
    nh, hd = ix["heads"], ix["head_dim"]
    return {"wq_b": [nh * hd, q_lora], "wk": [hd, hidden], "weights": [nh, hidden], "k_norm": [hd], "k_norm_bias": [hd]}


def moe_mlp_spec(arch, p):
    """Routed experts behind a sigmoid group router, plus the shared experts when there are any."""
    ex = {x: f"{p}.mlp.experts.{{e}}.{x}_proj.weight" for x in ("gate", "up", "down")}
    names = {"weight": f"{p}.mlp.gate.weight", "bias": f"{p}.mlp.gate.e_score_correction_bias"}
    if arch.get("expert_names") == "mixtral":  # MiniMax-M2: Mixtral's names, the bias on the MoE block
        b = f"{p}.block_sparse_moe"
        ex = {x: f"{b}.experts.{{e}}.{w}.weight" for x, w in (("gate", "w1"), ("up", "w3"), ("down", "w2"))}
        names = {"weight": f"{b}.gate.weight", "bias": f"{b}.e_score_correction_bias"}
    elif arch.get("router_bias") == "block":  # MiniMax-M2 as transformers names it (fused experts)
        names["bias"] = f"{p}.mlp.e_score_correction_bias"
    elif arch.get("expert_names") == "w123":  # Kimi-Linear: experts.N.w1 (gate), w3 (up), w2 (down)
        ex = {x: f"{p}.mlp.experts.{{e}}.{w}.weight" for x, w in (("gate", "w1"), ("up", "w3"), ("down", "w2"))}
    router = {"kind": "sigmoid_group", "renorm": arch["norm_topk_prob"], "groups": arch["n_group"],
              "topk_group": arch["topk_group"], "scale": arch["routed_scaling_factor"], "tensors": names}
    spec = {"kind": "moe", "act": "silu", "experts": arch["num_experts"], "top_k": arch["num_experts_per_tok"],
            "width": arch["moe_intermediate_size"], "router": router, "expert_tensors": ex}
    if arch["shared_width"]:
        # resident: shared experts are dense trunk, only the routed experts stream
        spec.update(kind="moe_shared", shared={"width": arch["shared_width"], "tensors": {
            x: f"{p}.mlp.shared_experts.{x}_proj.weight" for x in ("gate", "up", "down")}})
    return spec


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
