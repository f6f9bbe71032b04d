"""DeepSeek-V4: hc_mult residual streams mixed by hyper-connections (Sinkhorn-projected), one
shared K=V head (MQA) with interleaved RoPE on each head's trailing dims (undone on the output),
learned sinks, a grouped low-rank output projection, sliding-window attention on every layer
(compressed layers add a compressor), hash-routed first MoE layers (tid2eid[token]) and
sqrtsoftplus routing elsewhere, SwiGLU clamped at swiglu_limit, one shared expert.

Defaults follow transformers' DeepseekV4Config (its __post_init__ folds in the release's legacy
spellings: compress_ratios, num_hash_layers, qk_rope_head_dim). Tensor names are transformers'
module names; source_tensors maps the release's own (and save_pretrained's) onto them."""
import re

SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
RATIO_TYPES = {0: SLIDING, 4: CSA, 128: HCA}
SCORES = ("sqrtsoftplus", "sigmoid")  # the router's score functions (transformers' ACT2FN names)
DEFAULTS = dict(vocab_size=129280, hidden_size=4096, moe_intermediate_size=2048, num_hidden_layers=43,
                num_attention_heads=64, num_key_value_heads=1, head_dim=512, q_lora_rank=1024, num_experts_per_tok=6,
                n_routed_experts=256, n_shared_experts=1, scoring_func="sqrtsoftplus", routed_scaling_factor=1.5,
                max_position_embeddings=1048576, rope_theta=10000.0, compress_rope_theta=160000.0, hc_mult=4,
                hc_sinkhorn_iters=20, hc_eps=1e-6, swiglu_limit=10.0, sliding_window=128, o_groups=8,
                o_lora_rank=1024, index_n_heads=64, index_head_dim=128, index_topk=512, rms_norm_eps=1e-6,
                tie_word_embeddings=False, hidden_act="silu")


def config(cfg):
    """cfg with transformers' defaults and legacy spellings resolved (DeepseekV4Config.__post_init__)."""
    cfg = {**DEFAULTS, **{k: v for k, v in cfg.items() if v is not None or k in ("layer_types", "mlp_layer_types")}}
    n = int(cfg["num_hidden_layers"])
    rates = dict(cfg.get("compress_rates") or {CSA: 4, HCA: 128})
    if cfg.get("compress_rate_csa") is not None:
        rates[CSA] = int(cfg["compress_rate_csa"])
    if cfg.get("compress_rate_hca") is not None:
        rates[HCA] = int(cfg["compress_rate_hca"])
    cfg["compress_rates"] = rates
    types = cfg.get("layer_types")
    if types is None and cfg.get("compress_ratios") is not None:
        try:
            types = [RATIO_TYPES[int(r)] for r in cfg["compress_ratios"]]
        except KeyError as e:
            raise ValueError(f"compress_ratios holds {e}; DeepSeek-V4 layers compress by 0, 4 or 128") from None
    if types is None:
        types = [HCA] * min(n, 2) + [CSA if i % 2 else HCA for i in range(max(n - 2, 0))]
    cfg["layer_types"] = list(types[:n])
    mlp = cfg.get("mlp_layer_types")
    if mlp is None:
        k = int(cfg["num_hash_layers"]) if cfg.get("num_hash_layers") is not None else 3
        mlp = ["hash_moe"] * min(n, k) + ["moe"] * max(0, n - k)
    cfg["mlp_layer_types"] = list(mlp[:n])
    if cfg.get("partial_rotary_factor") is None:
        rd = cfg.get("qk_rope_head_dim")
        cfg["partial_rotary_factor"] = int(rd) / int(cfg["head_dim"]) if rd is not None else 64 / 512
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not (isinstance(rp.get("main"), dict) and isinstance(rp.get("compress"), dict)):
        yarn = {k: v for k, v in rp.items() if k not in ("main", "compress")}
        comp = {**yarn, "rope_theta": cfg["compress_rope_theta"], "partial_rotary_factor": cfg["partial_rotary_factor"]}
        comp.setdefault("rope_type", comp.get("type", "default"))
        if comp["rope_type"] == "yarn":
            comp.setdefault("attention_factor", 1.0)
        rp = {"main": {"rope_type": "default", "rope_theta": cfg["rope_theta"],
                       "partial_rotary_factor": cfg["partial_rotary_factor"]}, "compress": comp}
    cfg["rope_parameters"] = rp
    return cfg


def arch(cfg, rope_table, f32):
    """The normalized arch (colibri.json) of a resolved config; rope_table(cfg, params) ->
    (dim, inv_freq, scale). Raises ValueError naming what the engine does not run."""
    n, H = int(cfg["num_hidden_layers"]), int(cfg["hidden_size"])
    nh, hd, kvh = int(cfg["num_attention_heads"]), int(cfg["head_dim"]), int(cfg["num_key_value_heads"])
    types, mlp = cfg["layer_types"], cfg["mlp_layer_types"]
    if len(types) != n or len(mlp) != n:
        raise ValueError(f"layer_types and mlp_layer_types must list one entry per layer ({n})")
    bad = sorted(set(types) - {SLIDING, CSA, HCA}) + sorted(set(mlp) - {"hash_moe", "moe"})
    if bad:
        raise ValueError(f"layer kinds {', '.join(map(str, bad))} are not DeepSeek-V4's")
    rates = {t: int(cfg["compress_rates"][t]) for t in (CSA, HCA) if t in types}
    ihd = int(cfg["index_head_dim"])
    for t, m in rates.items():
        if m < 1:
            raise ValueError(f"{t} layers compress by {m}; a rate is at least 1")
    if CSA in types and ihd < int(cfg["head_dim"] * cfg["partial_rotary_factor"]):
        raise ValueError(f"index_head_dim {ihd} cannot hold the {int(cfg['head_dim'] * cfg['partial_rotary_factor'])} "
                         "rotary dims the indexer rotates")
    if kvh != 1:
        raise ValueError(f"num_key_value_heads {kvh}: DeepSeek-V4 attention shares one K=V head")
    if cfg.get("scoring_func") not in SCORES:
        raise ValueError(f"scoring_func '{cfg.get('scoring_func')}' is not implemented ({', '.join(SCORES)})")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act '{cfg.get('hidden_act')}' is not supported (only silu)")
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise ValueError("attention_bias / mlp_bias are not part of DeepSeek-V4 attention; refusing to drop them")
    groups, rank = int(cfg["o_groups"]), int(cfg["o_lora_rank"])
    if nh % groups:
        raise ValueError(f"{nh} heads do not split into o_groups {groups}")
    tables = {}
    for kind, params in cfg["rope_parameters"].items():
        if isinstance(params, dict):
            dim, inv, scale = rope_table(cfg, params)
            tables[kind] = {"dim": dim, "inv_freq": [f32(x) for x in inv], "scale": scale}
    main = tables["main"]
    if main["dim"] % 2 or main["dim"] > hd:
        raise ValueError(f"rotary dim {main['dim']} must be even and at most head_dim {hd}")
    window = int(cfg["sliding_window"])
    if window < 1:
        raise ValueError(f"sliding_window {window} must be at least 1")
    experts, top_k = int(cfg["n_routed_experts"]), int(cfg["num_experts_per_tok"])
    return {
        "vocab_size": int(cfg["vocab_size"]), "hidden_size": H, "num_layers": n, "num_heads": nh,
        "num_kv_heads": 1, "head_dim": hd, "rotary_dim": main["dim"], "rope_inv_freq": main["inv_freq"],
        "rope_attention_scaling": main["scale"], "rms_norm_eps": float(cfg["rms_norm_eps"]),
        "max_position_embeddings": int(cfg["max_position_embeddings"]), "hidden_act": "silu", "qk_norm": False,
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)), "intermediate_size": 0,
        "num_experts": experts, "num_experts_per_tok": top_k, "moe_intermediate_size": int(cfg["moe_intermediate_size"]),
        "norm_topk_prob": True, "q_bias": False, "k_bias": False, "v_bias": False, "o_bias": False, "mlp_bias": False,
        "layer_mlp": ["moe"] * n,
        "dsv4": {"layer_types": list(types), "mlp_layer_types": list(mlp), "hc_mult": int(cfg["hc_mult"]),
                 "hc_sinkhorn_iters": int(cfg["hc_sinkhorn_iters"]), "hc_eps": float(cfg["hc_eps"]),
                 "q_lora_rank": int(cfg["q_lora_rank"]), "o_groups": groups, "o_lora_rank": rank,
                 "sliding_window": window, "swiglu_limit": float(cfg["swiglu_limit"]),
                 "routed_scaling_factor": float(cfg["routed_scaling_factor"]), "rope": tables,
                 "score": cfg["scoring_func"],
                 "compress_rates": rates, "index_n_heads": int(cfg["index_n_heads"]), "index_head_dim": ihd,
                 "index_topk": int(cfg["index_topk"])},
    }


def own_arch(cfg, rope_table, f32):
    """normalize.py's hook (colibri/family/parts.py): the whole architecture, from the config
    with transformers' defaults."""
    return arch(config(cfg), rope_table, f32)


def _hc(arch, name):
    d = arch["dsv4"]
    return {"n": d["hc_mult"], "iters": d["hc_sinkhorn_iters"], "eps": d["hc_eps"], "norm_eps": arch["rms_norm_eps"],
            "tensors": {k: f"{name}.{k}" for k in ("fn", "base", "scale")}}


def trunk_extra(arch):
    """The trunk's extra block: the final collapse of the streams (HyperHead), before the final norm."""
    d = arch["dsv4"]
    return {"hc_head": {"n": d["hc_mult"], "eps": d["hc_eps"], "norm_eps": arch["rms_norm_eps"],
                        "tensors": {"fn": "model.hc_head.hc_fn", "base": "model.hc_head.hc_base",
                                    "scale": "model.hc_head.hc_scale"}}}


def layer_specs(arch, norm):
    d, hd = arch["dsv4"], arch["head_dim"]
    specs = []
    for l in range(arch["num_layers"]):
        p = f"model.layers.{l}"
        a = f"{p}.self_attn"
        kind = d["layer_types"][l]
        rope = d["rope"]["main" if kind == SLIDING else "compress"]
        attn = {"kind": "dsv4", "heads": arch["num_heads"], "head_dim": hd, "q_lora_rank": d["q_lora_rank"],
                "o_groups": d["o_groups"], "o_lora_rank": d["o_lora_rank"], "window": d["sliding_window"],
                "eps": arch["rms_norm_eps"],
                "rope": {"style": "interleaved_tail", "dim": rope["dim"], "inv_freq": rope["inv_freq"],
                         "scale": rope["scale"]},
                "state": {"kv_values_per_pos": hd, "fixed_bytes": 0, "truncatable": True, "window": d["sliding_window"]},
                "tensors": {"q_a": f"{a}.q_a_proj.weight", "q_a_norm": f"{a}.q_a_norm.weight",
                            "q_b": f"{a}.q_b_proj.weight", "kv": f"{a}.kv_proj.weight", "kv_norm": f"{a}.kv_norm.weight",
                            "o_a": f"{a}.o_a_proj.weight", "o_b": f"{a}.o_b_proj.weight", "sinks": f"{a}.sinks"}}
        if kind != SLIDING:
            attn["compress"] = _compress(arch, a, kind)
            # entry w fills rows w*m.. of its window, ceil(dim / m) values each (the last zero-padded)
            m, ihd = attn["compress"]["rate"], d["index_head_dim"]
            attn["state"] = {"kv_values_per_pos": -(-hd // m), "fixed_bytes": 4 * _fixed_floats(attn), "truncatable": False}
            if kind == CSA:
                attn["state"]["f32_values_per_pos"] = -(-ihd // m)
        m = f"{p}.mlp"
        hashed = d["mlp_layer_types"][l] == "hash_moe"
        router = {"kind": "sqrtsoftplus", "score": d.get("score", "sqrtsoftplus"), "scale": d["routed_scaling_factor"],
                  "tensors": {"weight": f"{m}.gate.weight",
                              **({"tid2eid": f"{m}.gate.tid2eid"} if hashed else
                                 {"bias": f"{m}.gate.e_score_correction_bias"})}}
        act = {"act": "silu_clamp", "swiglu_limit": d["swiglu_limit"]}
        mlp = {"kind": "moe_shared", **act, "experts": arch["num_experts"], "top_k": arch["num_experts_per_tok"],
               "width": arch["moe_intermediate_size"], "router": router,
               "expert_tensors": {x: f"{m}.experts.{{e}}.{x}_proj.weight" for x in ("gate", "up", "down")},
               "shared": {"width": arch["moe_intermediate_size"], **act,
                          "tensors": {x: f"{m}.shared_experts.{x}_proj.weight" for x in ("gate", "up", "down")}}}
        specs.append({"attn_norm": norm(arch, f"{p}.input_layernorm.weight"), "attn": attn,
                      "mlp_norm": norm(arch, f"{p}.post_attention_layernorm.weight"), "mlp": mlp,
                      "attn_hc": _hc(arch, f"{p}.attn_hc"), "mlp_hc": _hc(arch, f"{p}.ffn_hc")})
    return specs


def _compress(arch, a, kind):
    d = arch["dsv4"]
    c = f"{a}.compressor"
    names = lambda pre: {"kv": f"{pre}.kv_proj.weight", "gate": f"{pre}.gate_proj.weight",  # noqa: E731
                         "position_bias": f"{pre}.position_bias", "norm": f"{pre}.kv_norm.weight"}
    spec = {"rate": d["compress_rates"][kind], "overlap": kind == CSA, "tensors": names(c)}
    if kind == CSA:  # the lightning indexer: its own compressor, queries from the q_a latent
        spec["indexer"] = {"rate": spec["rate"], "overlap": True, "heads": d["index_n_heads"],
                           "head_dim": d["index_head_dim"], "top_k": d["index_topk"],
                           "tensors": {**names(f"{c}.indexer"), "q_b": f"{c}.indexer.q_b_proj.weight",
                                       "weights": f"{c}.indexer.scorer.weights_proj.weight"}}
    return spec


def _comp_floats(rate, width, overlap):
    """f32 values of a compressor's open window (c/model/dsv4_compress.c dsv4c_state_floats)."""
    C = (2 if overlap else 1) * width
    return rate * 2 * C + (rate * 2 * width if overlap else 0)


def _fixed_floats(attn):
    c = attn["compress"]
    n = attn["window"] * attn["head_dim"] + _comp_floats(c["rate"], attn["head_dim"], c["overlap"])
    if "indexer" in c:
        n += _comp_floats(c["rate"], c["indexer"]["head_dim"], True)
    return n


def compress_tensors(attn, hidden):
    """(name, shape, storage class) of a compressed layer's compressor and indexer tensors."""
    c = attn.get("compress") if attn.get("kind") == "dsv4" else None
    if not c:
        return []
    out = []
    for spec, width in ((c, attn["head_dim"]), (c.get("indexer"), (c.get("indexer") or {}).get("head_dim"))):
        if not spec:
            continue
        C = (2 if spec["overlap"] else 1) * width
        shapes = {"kv": ([C, hidden], "dense"), "gate": ([C, hidden], "dense"), "position_bias": ([spec["rate"], C], "f32"),
                  "norm": ([width], "f32"), "q_b": ([spec.get("heads", 0) * width, attn["q_lora_rank"]], "dense"),
                  "weights": ([spec.get("heads", 0), hidden], "dense")}
        out += [(name, *shapes[key]) for key, name in spec["tensors"].items()]
    return out


def attn_shapes(attn, hidden):
    """Source shape of every tensor a "dsv4" attention spec names."""
    nh, hd, ql = attn["heads"], attn["head_dim"], attn["q_lora_rank"]
    g, r = attn["o_groups"], attn["o_lora_rank"]
    return {"q_a": [ql, hidden], "q_a_norm": [ql], "q_b": [nh * hd, ql], "kv": [hd, hidden], "kv_norm": [hd],
            "o_a": [g * r, nh * hd // g], "o_b": [hidden, g * r], "sinks": [nh]}


def hc_shapes(hc, hidden):
    n = hc["n"]
    m = (2 + n) * n if "iters" in hc else n
    return {"fn": [m, n * hidden], "base": [m], "scale": [3 if "iters" in hc else 1]}


# The release's names (DeepSeek's inference code) -> transformers' module names, in the order
# transformers' conversion_mapping applies them; save_pretrained writes a mix of both.
RENAMES = [(re.compile(a), b) for a, b in (
    (r"\.attn\.", ".self_attn."), (r"\.ffn\.", ".mlp."), (r"\.indexer\.compressor\.", ".compressor.indexer."),
    (r"^embed\.weight", "embed_tokens.weight"), (r"^head\.weight", "lm_head.weight"),
    (r"^hc_head_fn", "hc_head.hc_fn"), (r"^hc_head_base", "hc_head.hc_base"), (r"^hc_head_scale", "hc_head.hc_scale"),
    (r"\.attn_norm\.", ".input_layernorm."), (r"\.ffn_norm\.", ".post_attention_layernorm."),
    (r"\.hc_attn_fn", ".attn_hc.fn"), (r"\.hc_attn_base", ".attn_hc.base"), (r"\.hc_attn_scale", ".attn_hc.scale"),
    (r"\.hc_ffn_fn", ".ffn_hc.fn"), (r"\.hc_ffn_base", ".ffn_hc.base"), (r"\.hc_ffn_scale", ".ffn_hc.scale"),
    (r"\.attn_sink", ".sinks"), (r"\.indexer\.weights_proj\.", ".compressor.indexer.scorer.weights_proj."),
    (r"\.indexer\.wq_b\.", ".compressor.indexer.q_b_proj."), (r"\.norm\.", ".kv_norm."), (r"\.ape", ".position_bias"),
    (r"\.wq_a\.", ".q_a_proj."), (r"\.self_attn\.wq_b\.", ".self_attn.q_b_proj."), (r"\.wkv\.", ".kv_proj."),
    (r"\.wgate\.", ".gate_proj."), (r"\.wo_a\.", ".o_a_proj."), (r"\.wo_b\.", ".o_b_proj."),
    (r"\.q_norm\.", ".q_a_norm."), (r"\.gate\.bias$", ".gate.e_score_correction_bias"),
    (r"\.(shared_experts|experts\.\d+)\.w1\.", r".\1.gate_proj."), (r"\.(shared_experts|experts\.\d+)\.w2\.", r".\1.down_proj."),
    (r"\.(shared_experts|experts\.\d+)\.w3\.", r".\1.up_proj."))]


def canonical(name):
    n = name[len("model."):] if name.startswith("model.") else name
    for pat, rep in RENAMES:
        n = pat.sub(rep, n)
    return n if n == "lm_head.weight" else "model." + n


def source_tensors(tensors, log=None):
    """Source tensors under transformers' names; a release's NAME.scale block scale becomes
    NAME.weight_scale_inv (the block-FP8 spelling the converter reads)."""
    out = {}
    for name, t in tensors.items():
        if name.endswith(".scale") and name[:-len("scale")] + "weight" in tensors:
            name = name[:-len("scale")] + "weight_scale_inv"
        c = canonical(name.replace(".weight_scale_inv", ".weight")) + (
            "_scale_inv" if name.endswith(".weight_scale_inv") else "")
        if c in out:
            raise ValueError(f"source tensors '{name}' and another both map to '{c}'")
        out[c] = t
    return out


def hf_source_tensors(tensors, arch, log):
    """The converter's renames (colibri/family/parts.py): transformers' module names."""
    return source_tensors(tensors, log)
