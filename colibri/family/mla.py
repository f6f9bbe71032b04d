"""Multi-head latent attention (MLA) and the DSA lightning indexer, shared by every family that
has them (the DeepSeek-V3 and GLM lines, Kimi-Linear's full-attention layers): the arch fields
from a config, the "mla" block spec, the tensor shapes. They never call back into a family module."""
import math


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
