"""Per-layer block specs for colibri.json (docs/container.md) and the KV state they imply: the
shared GQA and softmax-MoE blocks here, each family's own blocks from its module."""
import family_registry
from family_registry import KV_DEFAULT, KV_TYPES
from colibri.family import common, mla, sigmoid_moe
from colibri.family import parts as family_parts


def layer_specs(arch):
    """Per-layer block specs for colibri.json (docs/container.md): which blocks each layer runs,
    their geometry, and the container tensor names each block reads. The engine spells no
    tensor name; it reads these. Also applied to an older manifest's arch, which had none."""
    whole = family_parts.whole_layout(arch)
    if whole:  # a module that lays out every layer itself
        return whole.layer_specs(arch, common.norm)
    L, nkv, hd = int(arch["num_layers"]), int(arch["num_kv_heads"]), int(arch["head_dim"])
    nh, eps = arch.get("num_heads"), arch.get("rms_norm_eps")
    kinds = arch.get("layer_mlp") or ["dense"] * L
    specs = []
    for l in range(L):
        p = f"model.layers.{l}"
        mlp = sigmoid_moe.moe_mlp_spec(arch, p) if kinds[l] == "moe" and arch.get("router") == "sigmoid_group" else None
        linear = (arch.get("layer_attn") or [None] * L)[l]
        if linear in family_parts.LINEAR_ATTN:
            attn = family_parts.LINEAR_ATTN[linear](arch, p)
            specs.append(common.layer(arch, p, attn, mlp or _mlp_spec(arch, p, kinds[l])))
            continue
        if arch.get("attn") == "mla":
            specs.append(common.layer(arch, p, mla.mla_attn_spec(arch, p), mlp or _mlp_spec(arch, p, kinds[l])))
            continue
        at = {x: f"{p}.self_attn.{x}_proj.weight" for x in "qkvo"}
        for x in "qkvo":
            if arch.get(f"{x}_bias"):
                at[f"{x}_bias"] = f"{p}.self_attn.{x}_proj.bias"
        if arch.get("qk_norm"):
            at["q_norm"], at["k_norm"] = f"{p}.self_attn.q_norm.weight", f"{p}.self_attn.k_norm.weight"
        qkn = (arch.get("qk_norm_scope") or "per_head") if arch.get("qk_norm") else "none"
        window = int((arch.get("layer_window") or [arch.get("sliding_window") or 0] * L)[l])
        attn = {"kind": "gqa", "heads": nh, "kv_heads": nkv, "head_dim": hd,
                "qk_norm": qkn, "qk_norm_eps": eps, "window": window, "sinks": bool(arch.get("attn_sinks")),
                "rope": {"style": "neox", "dim": arch.get("rotary_dim")},
                "state": {"kv_values_per_pos": 2 * nkv * hd, "fixed_bytes": 0, "truncatable": True},
                "tensors": at}
        per_layer = family_parts.gqa_per_layer(arch)
        if per_layer:  # each layer's own geometry
            per_layer(arch, l, p, attn)
        if arch.get("attn_sinks"):  # one learned logit per head joins the softmax
            at["sinks"] = f"{p}.self_attn.sinks"
        if window and arch.get("kv_ring"):  # the slot keeps only the window (a ring)
            attn["ring"] = True
            attn["state"]["window"] = window
        if arch.get("clip_qkv"):
            attn["clip_qkv"] = arch["clip_qkv"]
        if arch.get("attn_output_gate"):  # q_proj's per-head query|gate halves, split by the converter
            at["q"], at["gate"] = family_parts.gated_q_names(p)
        if arch.get("norm_offset") and arch.get("qk_norm"):
            attn["qk_norm_offset"] = arch["norm_offset"]
        specs.append(common.layer(arch, p, attn, mlp or _mlp_spec(arch, p, kinds[l])))
    return specs


def _mlp_spec(arch, p, kind):
    if kind == "moe":
        own, names = family_parts.moe_layout(arch)
        if own:  # a MoE block of the module's own
            return own(arch, p)
        if names:  # the shared block under the module's tensor names
            ex, router = names(p)
        else:
            ex = {x: f"{p}.mlp.experts.{{e}}.{x}_proj.weight" for x in ("gate", "up", "down")}
            router = f"{p}.mlp.gate.weight"
        spec = {"kind": "moe", "act": "silu", "experts": arch.get("num_experts"),
                "top_k": arch.get("num_experts_per_tok"), "width": arch.get("moe_intermediate_size"),
                "router": {"kind": "softmax_topk", "renorm": bool(arch.get("norm_topk_prob")),
                           "tensors": {"weight": router}},
                "expert_tensors": ex}
        if arch.get("shared_width"):  # Qwen2-MoE: one resident shared expert behind a sigmoid gate
            spec.update(kind="moe_shared", shared={
                "width": arch["shared_width"],
                "tensors": {x: f"{p}.mlp.shared_expert.{x}_proj.weight" for x in ("gate", "up", "down")},
                "gate": {"act": "sigmoid", "tensors": {"weight": f"{p}.mlp.shared_expert_gate.weight"}}})
        return spec
    mt = {x: f"{p}.mlp.{x}_proj.weight" for x in ("gate", "up", "down")}
    if arch.get("mlp_bias"):
        mt.update({f"{x}_bias": f"{p}.mlp.{x}_proj.bias" for x in ("gate", "up", "down")})
    return {"kind": "dense", "act": "silu", "width": arch.get("intermediate_size"), "tensors": mt}


def trunk_spec(arch):
    """The tensors around the layers: embedding, final norm, output head."""
    trunk = {"embed": "model.embed_tokens.weight",
             "final_norm": common.norm(arch, "model.norm.weight"),
             "lm_head": "model.embed_tokens.weight" if arch.get("tie_word_embeddings") else "lm_head.weight"}
    whole = family_parts.whole_layout(arch)
    if whole:  # e.g. residual streams that collapse into one before the final norm
        trunk.update(whole.trunk_extra(arch))
    return trunk


def manifest_layers(man):
    """A manifest's layer specs: its own, or (older manifests) the ones its arch implies."""
    layers = man.get("layers")
    return layers if isinstance(layers, list) else layer_specs(man["arch"])


def layer_state(spec, kv=KV_DEFAULT):
    """One layer's state descriptor as the engine allocates it (c/model/model.h StateDesc): (bytes per
    position, fixed bytes per slot, truncatable, window: positions kept, 0 = all). Only blocks
    that keep state (the attention kinds) declare one."""
    st = (spec.get("attn") or {}).get("state") or {}
    # f32_values_per_pos: values kept as f32 whatever the cache type (DSA indexer keys)
    return (int(st.get("kv_values_per_pos", 0)) * KV_TYPES[kv] + 4 * int(st.get("f32_values_per_pos", 0)),
            int(st.get("fixed_bytes", 0)),
            bool(st.get("truncatable", True)), int(st.get("window", 0)))


def kv_slot_bytes(layers, ctx, kv=KV_DEFAULT):
    """Bytes one KV slot of ctx positions allocates (c/model/kv.c kv_bytes, which READY reports as
    kv_slot_bytes): the token id of every position (kept for prefix reuse), and each layer's
    state: a windowed layer holds min(ctx, window) positions, a recurrent one its fixed state."""
    total = 4 * ctx
    for spec in layers:
        per_pos, fixed, _, window = layer_state(spec, kv)
        total += per_pos * (min(ctx, window) if window > 0 else ctx) + fixed
    return total


def kv_bytes_per_token(arch, family=None, kv=KV_DEFAULT, layers=None):
    """Bytes one token takes in one KV slot: the sum over the layers' state descriptors
    (c/model/kv.c allocates the same). `layers` defaults to the specs the arch implies."""
    layout = family_registry.FAMILIES.get(family, {}).get("kv", "gqa")
    if layout not in ("gqa", "mla"):
        raise ValueError(f"unknown KV layout {layout}")
    try:
        specs = layers if layers is not None else layer_specs(arch)
        return sum(layer_state(s, kv)[0] for s in specs)
    except (KeyError, TypeError, ValueError):
        return 0


def kv_values_per_token(layers):
    """KV values one token adds to a slot in the cache's element type, summed over the layers (times
    KV_TYPES[kv] for bytes; kv_f32_bytes_per_token adds those always kept as f32)."""
    return sum(int(((s.get("attn") or {}).get("state") or {}).get("kv_values_per_pos", 0)) for s in layers)


def kv_f32_bytes_per_token(layers):
    """Bytes per token of the state values kept as f32 whatever --kv (DSA indexer keys)."""
    return 4 * sum(int(((s.get("attn") or {}).get("state") or {}).get("f32_values_per_pos", 0)) for s in layers)


def kv_fixed_bytes(layers):
    """Bytes per slot that do not grow with the context (recurrent layers' state)."""
    return sum(layer_state(s)[1] for s in layers)
