"""Kimi-Linear (`kimi_linear`): a hybrid of Kimi-delta-attention (KDA) layers, whose fixed
recurrent state decays per key channel, and MLA full-attention layers without any position
encoding; sigmoid group-limited routing with a correction bias and scaling plus shared experts
(the shared sigmoid MoE, colibri/family/sigmoid_moe.py), a dense first layer.

The release's config spells several fields its own way (num_experts_per_token, moe_renormalize,
model_max_length, ...) and lists its layer kinds as 1-indexed `linear_attn_config.kda_layers` /
`full_attn_layers`; its tensors live under `block_sparse_moe` (experts w1/w2/w3) and carry one
conv per q/k/v. family_registry maps a config with these helpers."""
import re

# transformers' config class defaults for fields config.json leaves out (class_defaults.fill)
# in the release's spellings (config() maps them to the usual ones afterwards)
CLASS_DEFAULTS = {
    "kimi_linear": {"intermediate_size": 9216, "rms_norm_eps": 1e-05, "model_max_length": 1048576,
                    "num_experts": 256, "num_experts_per_token": 8, "moe_intermediate_size": 1024,
                    "moe_renormalize": True, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                    "v_head_dim": 128, "num_shared_experts": 1, "routed_scaling_factor": 2.446,
                    "num_expert_group": 1, "topk_group": 1,
                    # KimiLinearConfig.__post_init__: one dense layer unless mlp_layer_types says otherwise
                    "first_k_dense_replace": 1}}

# release spelling -> the name the shared MLA and MoE builders read
ALIASES = {"num_experts_per_token": "num_experts_per_tok", "moe_renormalize": "norm_topk_prob",
           "num_expert_group": "n_group", "num_shared_experts": "n_shared_experts",
           "model_max_length": "max_position_embeddings"}
ELEM = {"F32": 4, "BF16": 2, "F16": 2}


def config(cfg):
    """cfg with the release's spellings mapped to the usual ones (an explicit usual one wins)."""
    out = dict(cfg)
    for src, dst in ALIASES.items():
        if src in cfg and cfg.get(dst) is None:
            out[dst] = cfg[src]
    return out


def config_defaults(cfg):
    """normalize.py's hook (colibri/family/parts.py): the release's spellings."""
    return config(cfg)


def linear_arch(cfg, layers):
    """The KDA/MLA layer pattern and the KDA geometry; raises ValueError on an unusable config."""
    if cfg.get("mla_use_nope") is False:
        raise ValueError("mla_use_nope false (rotary MLA layers) is not supported: Kimi-Linear's MLA has no RoPE")
    act = cfg.get("moe_router_activation_func", "sigmoid")
    if act != "sigmoid":
        raise ValueError(f"moe_router_activation_func '{act}' is not supported (sigmoid)")
    lac = cfg.get("linear_attn_config") or {}
    types = cfg.get("layer_types")
    if types is None and "kda_layers" in lac and "full_attn_layers" in lac:
        types = [None] * layers
        for key, kind in (("full_attn_layers", "full_attention"), ("kda_layers", "linear_attention")):
            for i in lac[key]:
                if not (isinstance(i, int) and 1 <= i <= layers):
                    raise ValueError(f"linear_attn_config.{key} names layer {i!r}; layers are numbered 1..{layers}")
                types[i - 1] = kind
    if types is None:
        types = ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(layers)]
    if len(types) != layers or set(types) - {"linear_attention", "full_attention"}:
        raise ValueError(f"every one of the {layers} layers must be a KDA or a full-attention layer "
                         f"(layer_types or linear_attn_config.kda_layers/full_attn_layers), got {types}")
    return {"layer_attn": ["kda" if t == "linear_attention" else "mla" for t in types],
            "kda_heads": int(lac.get("num_heads", cfg.get("linear_num_heads", 32))),
            "kda_head_dim": int(lac.get("head_dim", cfg.get("linear_head_dim", 128))),
            "kda_conv_kernel": int(lac.get("short_conv_kernel_size", cfg.get("linear_conv_kernel_dim", 4))),
            "expert_names": "w123"}


def kda_state_bytes(arch):
    nh, hd, K = arch["kda_heads"], arch["kda_head_dim"], arch["kda_conv_kernel"]
    return 4 * ((K - 1) * 3 * nh * hd + nh * hd * hd)


def kda_spec(arch, p):
    sa = f"{p}.self_attn"
    t = {x: f"{sa}.{x}_proj.weight" for x in ("q", "k", "v", "o")}
    t.update({"conv": f"{sa}.conv1d.weight", "f_a": f"{sa}.f_a_proj.weight", "f_b": f"{sa}.f_b_proj.weight",
              "dt_bias": f"{sa}.dt_bias", "A_log": f"{sa}.A_log", "b": f"{sa}.b_proj.weight",
              "g_a": f"{sa}.g_a_proj.weight", "g_b": f"{sa}.g_b_proj.weight", "norm": f"{sa}.o_norm.weight"})
    return {"kind": "kda", "heads": arch["kda_heads"], "head_dim": arch["kda_head_dim"],
            "conv_kernel": arch["kda_conv_kernel"], "norm_eps": arch["rms_norm_eps"],
            "state": {"kv_values_per_pos": 0, "fixed_bytes": kda_state_bytes(arch), "truncatable": False},
            "tensors": t}


def attn_outputs(spec, H, shape_of):
    """Converter outputs of a KDA block: (name, class, rows, cols, [(source, shape, row ranges)]);
    `shape_of(name)` is a source tensor's shape, or None. The conv is one tensor (as transformers
    saves it) or the release's three, concatenated q, k, v; A_log is [1, 1, heads, 1] (as
    transformers keeps it) or [heads]."""
    nh, hd, K = spec["heads"], spec["head_dim"], spec["conv_kernel"]
    qd, t = nh * hd, spec["tensors"]
    shapes = {"q": ("dense", [qd, H]), "k": ("dense", [qd, H]), "v": ("dense", [qd, H]), "o": ("dense", [H, qd]),
              "f_a": ("f32", [hd, H]), "f_b": ("f32", [qd, hd]), "g_a": ("f32", [hd, H]), "g_b": ("f32", [qd, hd]),
              "b": ("f32", [nh, H]), "dt_bias": ("f32", [qd]), "A_log": ("f32", [1, 1, nh, 1]), "norm": ("f32", [hd])}
    out = []
    if shape_of(t["A_log"]) == [nh]:
        shapes["A_log"] = ("f32", [nh])
    for key, (klass, shape) in shapes.items():
        rows, cols = (1, nh) if key == "A_log" else (1, shape[0]) if len(shape) == 1 else (shape[0], shape[1])
        out.append((t[key], klass, rows, cols, [(t[key], shape, [(0, rows)])]))
    conv = t["conv"]
    if shape_of(conv) is not None:
        pieces = [(conv, [3 * qd, 1, K], [(0, 3 * qd)])]
    else:
        pieces = [(conv.replace(".conv1d.", f".{x}_conv1d."), [qd, 1, K], [(0, qd)]) for x in "qkv"]
    out.append((conv, "f32", 3 * qd, K, pieces))
    return out


RENAMES = ((re.compile(r"\.block_sparse_moe\."), ".mlp."), (re.compile(r"\.self_attn\.forget_gate\."), ".self_attn."))


def source_tensors(tensors, log):
    """The release's tensors under the names the layer specs use: MoE (and the dense first layer,
    which some files also keep under block_sparse_moe) under .mlp., the forget gate's tensors
    directly under .self_attn. as the release has them."""
    out = {}
    for name, t in tensors.items():
        for pat, rep in RENAMES:
            name = pat.sub(rep, name)
        out[name] = t
    return out


def hf_source_tensors(tensors, arch, log):
    """The converter's renames (colibri/family/parts.py): the layer specs' names."""
    return source_tensors(tensors, log)
