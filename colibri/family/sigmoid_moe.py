"""The MoE of sigmoid group-limited routing (a correction bias, a routed scaling factor, shared
experts, leading dense layers), shared by every family that routes so (the DeepSeek-V3 and GLM
lines, Kimi-Linear, MiniMax-M2, MiMo-V2-Flash): the arch fields from a config and the layer's
"moe" spec under each release's tensor names. They never call back into a family module."""


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
