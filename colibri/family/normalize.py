"""HF config.json -> (family, the normalized architecture colibri.json carries as ``arch``),
following the registry's flags; a family with parts of its own adds them from its module."""
from family_registry import FAMILIES, UnsupportedModel, family_for_model_type
from colibri.family import class_defaults, sigmoid_moe
from colibri.family import mla as mla_builders
from colibri.family import parts as family_parts
from colibri.family.common import float32, rope_inv_freq


def normalize_arch(cfg):
    """HF config.json -> (family, arch dict for colibri.json). Raises UnsupportedModel."""
    family = family_for_model_type(cfg.get("model_type"))
    fam = FAMILIES[family]
    text_config = family_parts.hook(family, "text_config")
    if text_config:  # a vision-language wrapper: its text model
        cfg = text_config(cfg)
    cfg = class_defaults.fill(family, cfg)  # what transformers assumes for a field left out
    own_arch = family_parts.hook(family, "own_arch")
    if own_arch:  # an architecture the family's module builds whole
        try:
            return family, own_arch(cfg, lambda c, params: rope_inv_freq(dict(c, rope_parameters=params),
                                                                       int(c["head_dim"])), float32)
        except KeyError as e:
            raise UnsupportedModel(f"config.json lacks a usable {e}") from None
        except (TypeError, ValueError) as e:
            raise UnsupportedModel(f"config.json: {e}") from None
    config_defaults = family_parts.hook(family, "config_defaults")
    if config_defaults:  # the release's own spellings, the config class's defaults
        try:
            cfg = config_defaults(cfg)
        except (KeyError, TypeError, ValueError) as e:
            raise UnsupportedModel(f"config.json lacks a usable {e}") from None
    try:
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        layers = int(cfg["num_hidden_layers"])
        vocab = int(cfg["vocab_size"])
    except (KeyError, TypeError, ValueError) as e:
        raise UnsupportedModel(f"config.json lacks a usable {e}") from None
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    mla = None
    if fam.get("attn") == "mla":
        try:
            mla = mla_builders.mla_arch(cfg, fam.get("mla_rope"))
            if fam.get("dsa_rope"):
                mla.update(mla_builders.dsa_arch(cfg, fam["dsa_rope"]))
        except KeyError as e:
            raise UnsupportedModel(f"config.json lacks a usable MLA field {e}") from None
        except (TypeError, ValueError) as e:
            raise UnsupportedModel(f"config.json: {e}") from None
        kv_heads, head_dim = heads, mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModel(f"hidden_act '{act}' is not supported (only silu)")
    if cfg.get("use_sliding_window") and fam.get("layer_windows") != "use_sliding_window":
        raise UnsupportedModel("sliding-window attention (use_sliding_window=true) is not supported yet")
    layered = None
    attn_arch = family_parts.hook(family, "attn_arch")
    if attn_arch:  # one RoPE table per layer kind; the model's is layer 0's
        try:
            layered = attn_arch(cfg, lambda params, partial: rope_inv_freq(dict(cfg, rope_parameters=params), head_dim,
                                                                          partial))
        except (KeyError, TypeError, ValueError) as e:
            raise UnsupportedModel(f"config.json: {e}") from None
        for t in layered["rope_by_type"].values():
            t["inv_freq"] = [float32(f) for f in t["inv_freq"]]
        first = layered["rope_by_type"][layered["layer_types"][0]]
        rot_dim, inv_freq, rope_scale = first["dim"], first["inv_freq"], first["scale"]
    elif mla:  # the rotary part of each head is qk_rope_head_dim, rotated whole
        rot_dim, inv_freq, rope_scale = rope_inv_freq(dict(cfg, partial_rotary_factor=1.0), mla["qk_rope_head_dim"],
                                                       partial=1.0)
    else:
        partial = fam.get("partial_rotary", 1.0)
        if partial == "rotary_dim":  # MiniMax-M2: rotary_dim, unless a partial_rotary_factor overrides it
            partial = int(cfg["rotary_dim"]) / head_dim if cfg.get("rotary_dim") else 1.0
        whole = _whole_rotary(family, cfg) if fam.get("rotary") == "whole" else None
        rot_dim, inv_freq, rope_scale = rope_inv_freq(cfg, head_dim, partial, partial=whole,
                                                       default_theta=fam.get("rope_theta", 10000.0))
    if fam["biases"] == "config":
        qkvo = bool(cfg.get("attention_bias", fam.get("bias_default", False)))
        bias = {"q_bias": qkvo, "k_bias": qkvo, "v_bias": qkvo, "o_bias": qkvo, "mlp_bias": bool(cfg.get("mlp_bias", False))}
    elif fam["biases"] == "qkv":
        bias = {"q_bias": True, "k_bias": True, "v_bias": True, "o_bias": False, "mlp_bias": False}
    elif fam["biases"] == "qkv_bias":
        qkv = bool(cfg.get("qkv_bias", True))
        bias = {"q_bias": qkv, "k_bias": qkv, "v_bias": qkv, "o_bias": False, "mlp_bias": False}
    elif fam["biases"] == "none":
        bias = {"q_bias": False, "k_bias": False, "v_bias": False, "o_bias": False, "mlp_bias": False}
    elif fam["biases"] == "qkv_config":
        qkv = bool(cfg.get("attention_bias", False))
        bias = {"q_bias": qkv, "k_bias": qkv, "v_bias": qkv, "o_bias": False, "mlp_bias": False}
    else:
        qkvo = bool(cfg.get("attention_bias", False))
        bias = {"q_bias": qkvo, "k_bias": qkvo, "v_bias": qkvo, "o_bias": qkvo, "mlp_bias": False}
    arch = {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "rotary_dim": rot_dim,
        "rope_inv_freq": [float32(f) for f in inv_freq],
        "rope_attention_scaling": rope_scale,
        "rms_norm_eps": float(cfg.get("rms_norm_eps", 1e-6)),
        "max_position_embeddings": int(cfg.get("max_position_embeddings", 4096)),
        "hidden_act": act,
        "qk_norm": bool(cfg.get("use_qk_norm")) if fam["qk_norm"] == "config" else fam["qk_norm"],
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", fam["default_tie"])),
        "intermediate_size": int(cfg.get("intermediate_size") or 0),
        "num_experts": 0,
        "num_experts_per_tok": 0,
        "moe_intermediate_size": 0,
        "norm_topk_prob": False,
        **bias,
    }
    if mla:
        arch.update(mla)
    if layered:
        arch["mimo"] = layered
    if fam["qk_norm"] == "full":
        if fam.get("qk_norm_width") == "hidden_size" and heads * head_dim != hidden:
            raise UnsupportedModel(f"{family}: q/k norms span hidden_size, so head_dim {head_dim} x {heads} heads "
                                   f"must equal hidden_size {hidden}")
        arch.update(qk_norm=True, qk_norm_scope="full")
    if cfg.get("clip_qkv") is not None:
        clip = float(cfg["clip_qkv"])
        if not clip > 0:
            raise UnsupportedModel(f"config.json clip_qkv {cfg['clip_qkv']!r} must be positive (or null)")
        arch["clip_qkv"] = clip
    window = cfg.get("sliding_window")
    if fam.get("sliding_window") == "every_layer" and window and int(window) < arch["max_position_embeddings"]:
        # every layer's queries see their last `window` positions (a longer window never binds)
        arch["sliding_window"] = int(window)
    if fam.get("layer_windows") == "use_sliding_window":  # Qwen2-MoE: windows only when switched on
        if cfg.get("use_sliding_window"):
            arch.update(_layer_windows(dict(cfg, layer_types=cfg.get("layer_types") or _qwen2_layer_types(cfg, layers)),
                                       layers, arch["max_position_embeddings"]))
    elif fam.get("layer_windows"):
        arch.update(_layer_windows(cfg, layers, arch["max_position_embeddings"]))
    if fam.get("sinks"):
        arch["attn_sinks"] = True
    if fam.get("router") == "topk_softmax":
        arch["swiglu_alpha"] = float(cfg.get("swiglu_alpha", 1.702))
        arch["swiglu_limit"] = float(cfg.get("swiglu_limit", 7.0))
    kinds = ["dense"] * layers
    if fam["moe"] == "sigmoid_group":
        try:
            arch.update(sigmoid_moe.moe_arch(cfg, layers))
        except (TypeError, ValueError) as e:
            raise UnsupportedModel(f"config.json: {e}") from None
        kinds = arch.pop("layer_mlp")
        if fam.get("moe_width"):  # MiniMax-M2: experts as wide as intermediate_size, top-k renormalised
            arch["moe_intermediate_size"] = int(cfg[fam["moe_width"]])
        if fam.get("renorm"):
            arch["norm_topk_prob"] = True
        if fam.get("expert_names"):
            arch["expert_names"] = fam["expert_names"]
        if fam.get("router_bias"):
            arch["router_bias"] = fam["router_bias"]
    elif fam["moe"]:
        experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
        if experts:
            step = int(cfg.get("decoder_sparse_step", 1) or 1)
            only_dense = set(cfg.get("mlp_only_layers") or [])
            kinds = ["moe" if (l not in only_dense and (l + 1) % step == 0) else "dense" for l in range(layers)]
            arch.update({
                "num_experts": experts,
                "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
                "moe_intermediate_size": int(cfg[fam.get("moe_width", "moe_intermediate_size")]),
                "norm_topk_prob": bool(fam.get("renorm") or cfg.get("norm_topk_prob", False)),
            })
            if fam.get("expert_names"):
                arch["expert_names"] = fam["expert_names"]
            if fam.get("shared_expert") == "gated":
                arch["shared_width"] = int(cfg["shared_expert_intermediate_size"])
    linear_arch = family_parts.hook(family, "linear_arch")
    if linear_arch:  # a hybrid's linear-attention layers
        try:
            arch.update(linear_arch(cfg, layers))
        except (TypeError, ValueError) as e:
            raise UnsupportedModel(f"config.json: {e}") from None
    arch["layer_mlp"] = kinds
    return family, arch


def _qwen2_layer_types(cfg, layers):
    """Qwen2MoeConfig's layer_types when config.json has none: with use_sliding_window, every
    other layer below max_window_layers slides (the first among them)."""
    below = int(cfg.get("max_window_layers", 28))
    return ["sliding_attention" if (i + 1) % 2 and i < below else "full_attention" for i in range(layers)]


def _whole_rotary(family, cfg):
    """1.0 for a family whose transformers model rotates every head dimension: its default RoPE
    never reads partial_rotary_factor, and a scaled RoPE that does cannot run it."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    factor = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if factor not in (None, 1, 1.0) and rope_type != "default":
        raise UnsupportedModel(f"partial_rotary_factor {factor} with rope type '{rope_type}': {family} rotates whole "
                               "heads (transformers' model cannot apply a partial rotary); remove the field")
    return 1.0


def _layer_windows(cfg, layers, max_pos):
    """layer_types (sliding_attention / full_attention) -> each layer's window, 0 = full; a
    sliding layer's KV slot keeps only its window (kv_ring)."""
    types = cfg.get("layer_types")
    window = cfg.get("sliding_window")
    if types is None:  # the config classes' default: sliding, full, sliding, ...
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers:
        raise UnsupportedModel(f"config.json layer_types must list one type per layer ({layers})")
    unknown = sorted({t for t in types if t not in ("sliding_attention", "full_attention")})
    if unknown:
        raise UnsupportedModel(f"config.json layer_types: {', '.join(map(str, unknown))} is not supported "
                               "(sliding_attention, full_attention)")
    if "sliding_attention" in types and not (isinstance(window, int) and window > 0):
        raise UnsupportedModel(f"config.json sliding_window {window!r} must be a positive integer for sliding_attention layers")
    w = [window if t == "sliding_attention" and window < max_pos else 0 for t in types]
    return {"layer_window": w, "kv_ring": True}
