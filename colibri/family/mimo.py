"""MiMo-V2-Flash: full-attention and sliding-window layers interleaved, each kind with its own
RoPE theta; sliding layers have twice the KV heads and learned attention sinks; q/k heads wider
than v heads, values scaled by attention_value_scale; a dense first layer, then sigmoid-routed
experts (no shared ones). Defaults are the transformers config class's, used when config.json
leaves a field out."""

# transformers' config class defaults for fields config.json leaves out (class_defaults.fill)
CLASS_DEFAULTS = {
    "mimo_v2_flash": {"intermediate_size": 16384, "num_key_value_heads": 4, "rms_norm_eps": 1e-05,
                      "max_position_embeddings": 131072, "n_routed_experts": 256, "num_experts_per_tok": 8,
                      "moe_intermediate_size": 2048, "norm_topk_prob": True, "n_group": 1, "topk_group": 1}}

FULL, SLIDING = "full_attention", "sliding_attention"
DEFAULT_ROPE = {FULL: {"rope_type": "default", "rope_theta": 5000000.0, "partial_rotary_factor": 0.334},
                SLIDING: {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.334}}
DEFAULT_PARTIAL = 0.334


def config_defaults(cfg):
    """cfg with the fields transformers fills in when config.json has none."""
    cfg = dict(cfg)
    layers = int(cfg["num_hidden_layers"])
    cfg.setdefault("head_dim", 192)
    cfg.setdefault("v_head_dim", 128)
    if cfg.get("sliding_window_size") is not None:  # the hub's name: the window without the query
        cfg["sliding_window"] = int(cfg["sliding_window_size"]) + 1
    cfg.setdefault("sliding_window", 129)
    if cfg.get("layer_types") is None:
        cfg["layer_types"] = [FULL if (i == 0 or not (i + 1) % 6) else SLIDING for i in range(layers)]
    if cfg.get("mlp_layer_types") is None:
        cfg["mlp_layer_types"] = ["dense"] + ["sparse"] * (layers - 1)
    if cfg.get("rope_parameters") is None:
        cfg["rope_parameters"] = DEFAULT_ROPE
    if "attention_value_scale" not in cfg:
        cfg["attention_value_scale"] = 0.707
    return cfg


def attn_arch(cfg, rope_table):
    """The per-layer attention facts; rope_table(params, default partial rotary factor) -> (dim,
    inv_freq, scale) for one layer kind's rope parameters. Raises ValueError on an inconsistent config."""
    layers = int(cfg["num_hidden_layers"])
    types = cfg["layer_types"]
    if len(types) != layers or set(types) - {FULL, SLIDING}:
        raise ValueError(f"layer_types must name '{FULL}' or '{SLIDING}' for each of the {layers} layers")
    rope = cfg["rope_parameters"]
    if not all(isinstance(rope.get(t), dict) for t in set(types)):
        raise ValueError(f"rope_parameters must hold one object per layer type ({', '.join(sorted(set(types)))})")
    tables = {}
    for t in sorted(set(types)):
        dim, inv, scale = rope_table(rope[t], DEFAULT_PARTIAL)
        tables[t] = {"dim": dim, "inv_freq": inv, "scale": scale}
    window = int(cfg["sliding_window"])
    if window < 1:
        raise ValueError(f"sliding_window {window} must be at least 1")
    vs = cfg.get("attention_value_scale")
    return {"layer_types": list(types), "v_head_dim": int(cfg["v_head_dim"]),
            "v_scale": float(vs) if vs is not None else 1.0, "sliding_window": window,
            "rope_by_type": tables}


def attn_overrides(arch, l, nkv):
    """What layer l's gqa spec changes (arch["mimo"] from attn_arch): KV heads, window, sinks,
    v geometry, its RoPE table."""
    arch = arch["mimo"]
    t = arch["layer_types"][l]
    table = arch["rope_by_type"][t]
    sliding = t == SLIDING
    return {"kv_heads": 2 * nkv if sliding else nkv, "window": arch["sliding_window"] if sliding else 0,
            "ring": sliding, "sinks": sliding, "v_head_dim": arch["v_head_dim"], "v_scale": arch["v_scale"],
            "rope": {"style": "neox", "dim": table["dim"], "inv_freq": table["inv_freq"], "scale": table["scale"]}}


def gqa_per_layer(arch, l, p, attn):
    """specs.py's hook (colibri/family/parts.py): layer l's gqa spec `attn` with its own KV heads,
    window, sinks, v geometry and RoPE table, and the KV state that follows from them."""
    hd, at = attn["head_dim"], attn["tensors"]
    attn.update(attn_overrides(arch, l, attn["kv_heads"]))
    if attn["sinks"]:
        at["sinks"] = f"{p}.self_attn.{arch['mimo'].get('sinks_name', 'attention_sink_bias')}"
    attn["state"]["kv_values_per_pos"] = attn["kv_heads"] * (hd + attn["v_head_dim"])
    if attn["ring"]:  # a sliding layer keeps only its window
        attn["state"]["window"] = attn["window"]


def hf_source_tensors(tensors, arch, log):
    """The tensors as they are; a checkpoint in transformers' layout names the sliding layers'
    sinks `sinks`, not `attention_sink_bias`, and the layer specs follow it."""
    if arch.get("mimo") and any(n.endswith(".self_attn.sinks") for n in tensors):
        arch["mimo"]["sinks_name"] = "sinks"
    return tensors
