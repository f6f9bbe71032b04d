"""Qwen3.5 / Qwen3.6 MoE (`qwen3_5_moe`): a hybrid of gated-DeltaNet linear-attention layers
(a fixed recurrent state per slot) and full GQA layers (sigmoid output gate, partial rotary,
q/k norm), every layer a softmax top-k MoE with a sigmoid-gated shared expert, and RMSNorms
that compute x * (1 + w). family_registry maps a config with these helpers.

Releases ship the vision-language wrapper: config.json holds the text model under
`text_config` and the weights live under `model.language_model.*`, beside the vision tower
(`model.visual.*`) and the multi-token-prediction head (`mtp.*`). Only the text model is
converted: images are not supported, and the MTP head is not run."""

TEXT_PREFIX, VISION_PREFIX, MTP_PREFIX = "model.language_model.", "model.visual.", "mtp."
ELEM = {"F32": 4, "BF16": 2, "F16": 2}


def text_config(cfg):
    """The text model's config: the wrapper's text_config (keys the wrapper sets at top level
    fill in what it lacks; tie_word_embeddings is the wrapper's), or cfg itself for a text-only
    config."""
    tc = cfg.get("text_config")
    if not isinstance(tc, dict):
        return cfg
    out = {k: v for k, v in cfg.items() if k not in ("text_config", "vision_config")}
    out.update(tc)
    out["model_type"] = cfg.get("model_type")
    # the wrapper model ties its lm_head by its own flag (Qwen3_5MoeConfig, default false); the
    # text_config's is not read
    out["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", False))
    return out


def linear_arch(cfg, layers):
    """The hybrid pattern and the DeltaNet geometry; raises ValueError on an unusable config."""
    types = cfg.get("layer_types")
    if types is None:
        every = int(cfg.get("full_attention_interval", 4))
        types = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(layers)]
    if len(types) != layers or set(types) - {"linear_attention", "full_attention"}:
        raise ValueError(f"layer_types must name 'linear_attention' or 'full_attention' for each of the {layers} layers")
    if cfg.get("attention_bias"):
        raise ValueError("attention_bias with the gated q_proj is not supported")
    nk, nv = int(cfg.get("linear_num_key_heads", 16)), int(cfg.get("linear_num_value_heads", 32))
    if nv % nk:
        raise ValueError(f"linear_num_value_heads {nv} is not a multiple of linear_num_key_heads {nk}")
    return {
        "layer_attn": ["gated_deltanet" if t == "linear_attention" else "gqa" for t in types],
        "linear_k_heads": nk, "linear_v_heads": nv,
        "linear_k_head_dim": int(cfg.get("linear_key_head_dim", 128)),
        "linear_v_head_dim": int(cfg.get("linear_value_head_dim", 128)),
        "linear_conv_kernel": int(cfg.get("linear_conv_kernel_dim", 4)),
        "attn_output_gate": True,
        "norm_offset": 1.0,  # the checkpoint's norms store w, they compute x * (1 + w)
    }


def deltanet_state_bytes(arch):
    nk, nv = arch["linear_k_heads"], arch["linear_v_heads"]
    dk, dv, K = arch["linear_k_head_dim"], arch["linear_v_head_dim"], arch["linear_conv_kernel"]
    return 4 * ((K - 1) * (2 * nk * dk + nv * dv) + nv * dk * dv)


def deltanet_spec(arch, p):
    a = f"{p}.linear_attn"
    return {"kind": "gated_deltanet", "k_heads": arch["linear_k_heads"], "v_heads": arch["linear_v_heads"],
            "k_head_dim": arch["linear_k_head_dim"], "v_head_dim": arch["linear_v_head_dim"],
            "conv_kernel": arch["linear_conv_kernel"], "norm_eps": arch["rms_norm_eps"],
            "state": {"kv_values_per_pos": 0, "fixed_bytes": deltanet_state_bytes(arch), "truncatable": False},
            "tensors": {"qkv": f"{a}.in_proj_qkv.weight", "z": f"{a}.in_proj_z.weight", "b": f"{a}.in_proj_b.weight",
                        "a": f"{a}.in_proj_a.weight", "conv": f"{a}.conv1d.weight", "A_log": f"{a}.A_log",
                        "dt_bias": f"{a}.dt_bias", "norm": f"{a}.norm.weight", "out": f"{a}.out_proj.weight"}}


def gated_q_names(p):
    """Container names of the query and output-gate halves of q_proj (split by the converter)."""
    return f"{p}.self_attn.q_proj.query.weight", f"{p}.self_attn.q_proj.gate.weight"


def attn_outputs(spec, arch, p, H):
    """The converter's outputs for one attention block of this family, or None for the generic
    path: (output name, storage class, rows, cols, [(source name, source shape, row ranges)])."""
    t = spec["tensors"]
    if spec["kind"] == "gated_deltanet":
        nk, nv, dk, dv, K = (spec[x] for x in ("k_heads", "v_heads", "k_head_dim", "v_head_dim", "conv_kernel"))
        cd = 2 * nk * dk + nv * dv
        shapes = {"qkv": ("dense", [cd, H]), "z": ("dense", [nv * dv, H]), "out": ("dense", [H, nv * dv]),
                  "b": ("f32", [nv, H]), "a": ("f32", [nv, H]), "conv": ("f32", [cd, 1, K]),
                  "A_log": ("f32", [nv]), "dt_bias": ("f32", [nv]), "norm": ("f32", [dv])}
        out = []
        for key, name in t.items():
            klass, shape = shapes[key]
            rows = 1 if len(shape) == 1 else shape[0]
            out.append((name, klass, rows, shape[-1], [(name, shape, [(0, rows)])]))
        return out
    if "gate" not in t:
        return None
    nh, nkv, hd = spec["heads"], spec["kv_heads"], spec["head_dim"]
    src, shape = f"{p}.self_attn.q_proj.weight", [2 * nh * hd, H]  # heads x (query hd, gate hd)
    out = [(t["q"], "dense", nh * hd, H, [(src, shape, [(2 * h * hd, hd) for h in range(nh)])]),
           (t["gate"], "dense", nh * hd, H, [(src, shape, [((2 * h + 1) * hd, hd) for h in range(nh)])])]
    shapes = {"k": [nkv * hd, H], "v": [nkv * hd, H], "o": [H, nh * hd], "q_norm": [hd], "k_norm": [hd]}
    for key in ("k", "v", "o", "q_norm", "k_norm"):
        s = shapes[key]
        rows = 1 if len(s) == 1 else s[0]
        out.append((t[key], "dense" if len(s) == 2 else "f32", rows, s[-1], [(t[key], s, [(0, rows)])]))
    return out


def text_tensors(tensors, log):
    """The wrapper's text-model tensors under the text model's own names (model.layers.*);
    the vision tower and the MTP head are left out, and the log says so."""
    if not any(n.startswith(TEXT_PREFIX) for n in tensors):
        return tensors
    out, vision, mtp = {}, 0, 0
    for name, t in tensors.items():
        if name.startswith(VISION_PREFIX):
            vision += 1
        elif name.startswith(MTP_PREFIX):
            mtp += 1
        else:
            out["model." + name[len(TEXT_PREFIX):] if name.startswith(TEXT_PREFIX) else name] = t
    if vision:
        log(f"note: the vision tower ({vision} tensors under {VISION_PREFIX}*) is not converted: "
            "colibri runs the text model only, images and video are not supported")
    if mtp:
        log(f"note: the multi-token-prediction head ({mtp} tensors under {MTP_PREFIX}*) is not converted")
    return out


def hf_source_tensors(tensors, arch, log):
    """The converter's renames (colibri/family/parts.py): the text model's own names."""
    return text_tensors(tensors, log)
