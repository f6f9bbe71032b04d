"""Every fact about a model family in one table.

The converter, the launcher and the tests ask this module; nothing else hard-codes a family.
Each family maps an HF ``config.json`` to the normalized architecture the engine reads
(``arch`` in colibri.json) and names the tensor classes the converter quantizes.
"""
import math
import re

from colibri.family import class_defaults, deepseek, deepseek_v4, kimi, mimo, qwen35

# Families the engine implements (the key is the name written into colibri.json; the engine's
# `colibri families` must list the same, which tests/test_registry.py checks).
#   default_ctx             context the engine allocates unless --ctx says otherwise (capped by the model)
#   interactive_max_tokens  answer cap in `coli chat` (`:more` continues)
#   thinking                chat-template variable that switches reasoning on/off, or None
#   tools                   the tool-call syntax the server parses (colibri/toolcall/formats.py), or False
#   kv                      KV state layout, for the planner (see layer_state)
_LLAMA_LIKE = {"default_ctx": 4096, "interactive_max_tokens": 1024, "thinking": None, "tools": False, "kv": "gqa"}
FAMILIES = {
    "llama": {
        "display": "Llama",
        "model_types": ["llama"],
        **_LLAMA_LIKE,
        "tools": "llama3_json",
        "biases": "config",          # attention_bias / mlp_bias from config
        "qk_norm": False,
        "moe": False,
        "default_tie": False,
    },
    "qwen2": {
        "display": "Qwen2 / Qwen2.5",
        "model_types": ["qwen2"],
        **_LLAMA_LIKE,
        "tools": "hermes",
        "biases": "qkv",             # q/k/v always biased, o never
        "qk_norm": False,
        "moe": False,
        "default_tie": False,
    },
    "qwen3": {
        "display": "Qwen3 (dense)",
        "model_types": ["qwen3"],
        **_LLAMA_LIKE,
        "tools": "hermes",
        "biases": "attention_bias",
        "qk_norm": True,
        "moe": False,
        "default_tie": False,
        "thinking": "enable_thinking",
    },
    "qwen3_moe": {
        "display": "Qwen3-MoE",
        "model_types": ["qwen3_moe"],
        **_LLAMA_LIKE,
        "tools": "hermes",
        "biases": "attention_bias",
        "qk_norm": True,
        "moe": True,
        "default_tie": False,
        "thinking": "enable_thinking",
    },
    # Softmax top-k MoE families (the qwen3_moe path). moe_width: the config key of an expert's
    # width; renorm: the top-k weights always sum to one whatever norm_topk_prob says.
    "olmoe": {
        "display": "OLMoE",
        "model_types": ["olmoe"],
        **_LLAMA_LIKE,
        "biases": "config",
        "qk_norm": "full",           # q/k RMSNorm over the whole projection, not per head
        "moe": True,
        "moe_width": "intermediate_size",
        "rotary": "whole",           # partial_rotary_factor is not read (see _whole_rotary)
        "default_tie": False,
    },
    "qwen2_moe": {
        "display": "Qwen1.5-MoE / Qwen2-MoE",
        "model_types": ["qwen2_moe"],
        **_LLAMA_LIKE,
        "biases": "qkv_bias",        # q/k/v biased unless qkv_bias is false, o never
        "qk_norm": False,
        "moe": True,
        "shared_expert": "gated",    # one shared expert scaled by sigmoid(shared_expert_gate . x)
        "layer_windows": "use_sliding_window",  # sliding_attention layers (as gpt-oss), when switched on
        "rotary": "whole",           # partial_rotary_factor is not read (see _whole_rotary)
        "default_tie": False,
    },
    "mixtral": {
        "display": "Mixtral",
        "model_types": ["mixtral"],
        **_LLAMA_LIKE,
        "biases": "none",
        "qk_norm": False,
        "moe": True,
        "moe_width": "intermediate_size",
        "renorm": True,
        "expert_names": "mixtral",   # block_sparse_moe.experts.N.w1/w3/w2, block_sparse_moe.gate
        "rope_theta": 1000000.0,     # the config class's default_theta
        "rotary": "whole",           # partial_rotary_factor is not read (see _whole_rotary)
        "default_tie": False,
    },
    # gpt-oss: learned attention sinks, sliding-window layers (layer_types) that keep only their
    # window, q/k/v/o biases, a biased router taking top-k on logits then softmax over the k,
    # biased experts with the clamped SwiGLU, fused (and in releases MXFP4) expert tensors.
    # Chat is the harmony format (colibri/chat/harmony.py). It always reasons, in the
    # analysis channel; reasoning_effort (low/medium/high) sets how much. <|return|> ends an
    # answer and <|call|> a tool call: both are end-of-generation tokens.
    "gpt_oss": {
        "display": "gpt-oss",
        "model_types": ["gpt_oss"],
        **_LLAMA_LIKE,
        "interactive_max_tokens": 4096,   # the analysis comes first and is often long
        "biases": "config",
        "bias_default": True,        # GptOssConfig.attention_bias defaults to true
        "qk_norm": False,
        "moe": True,
        "moe_width": "intermediate_size",
        "router": "topk_softmax",
        "expert_names": "gpt_oss",   # mlp.experts.gate_up_proj (interleaved) / down_proj, mlp.router
        "sinks": True,
        "layer_windows": True,       # sliding_attention layers: a ring of sliding_window positions
        "rope_theta": 150000.0,      # the config class's default_theta
        "rotary": "whole",           # partial_rotary_factor is not read (see _whole_rotary)
        "default_tie": False,
        "thinking": None,                 # no on/off switch: reasoning_effort instead
        "reasoning": "harmony",
        "tools": "harmony",
        "reasoning_efforts": ("low", "medium", "high"),
        "stop_tokens": ("<|return|>", "<|call|>"),
    },
    # Hybrid linear attention (colibri/family/qwen35.py): three of four layers gated DeltaNet
    # (fixed recurrent state), the rest GQA with an output gate; releases wrap the text model in
    # a vision-language config (text_config), whose vision tower is not converted.
    "qwen3_5_moe": {
        "display": "Qwen3.5 / Qwen3.6 MoE",
        "model_types": ["qwen3_5_moe", "qwen3_5_moe_text"],
        **_LLAMA_LIKE,
        "biases": "attention_bias",
        "qk_norm": True,
        "moe": True,
        "renorm": True,
        "shared_expert": "gated",
        "hybrid": "gated_deltanet",
        "partial_rotary": 0.25,
        "default_tie": False,
        "thinking": "enable_thinking",
        "tools": "qwen_xml",
    },
    # Kimi-Linear (colibri/family/kimi.py): KDA layers (fixed state, per-channel decay) and MLA
    # layers without position encoding, the DeepSeek-V3 MoE.
    "kimi_linear": {
        "display": "Kimi-Linear",
        "model_types": ["kimi_linear"],
        **_LLAMA_LIKE,
        "kv": "mla",
        "attn": "mla",
        "mla_rope": "none",
        "hybrid": "kda",
        "biases": "config",
        "qk_norm": False,
        "moe": "sigmoid_group",
        "default_tie": False,
    },
    # The DeepSeek-V3 line (colibri/family/deepseek.py): sigmoid group-limited routing, shared
    # experts, leading dense layers; "mla" attention keeps the compressed latent per position.
    "glm4_moe": {
        "display": "GLM-4.5 / 4.6 / 4.7",
        "model_types": ["glm4_moe"],
        **_LLAMA_LIKE,
        "tools": "glm",
        "biases": "qkv_config",      # q/k/v biased when attention_bias, o never
        "qk_norm": "config",         # use_qk_norm
        "moe": "sigmoid_group",
        "default_tie": False,
        "partial_rotary": 0.5,       # the config class's default when config.json names none
        "thinking": "enable_thinking",
    },
    "glm4_moe_lite": {
        "display": "GLM-4.7-Flash",
        "model_types": ["glm4_moe_lite"],
        **_LLAMA_LIKE,
        "tools": "glm",
        "kv": "mla",
        "attn": "mla",
        "biases": "config",
        "qk_norm": False,
        "moe": "sigmoid_group",
        "default_tie": False,
        "thinking": "enable_thinking",
    },
    # DeepSeek sparse attention: MLA (always interleaved RoPE) plus the lightning indexer, whose
    # RoPE is interleaved for GLM-5 and half-split (neox) for DeepSeek-V3.2.
    "glm_moe_dsa": {
        "display": "GLM-5",
        "model_types": ["glm_moe_dsa"],
        **_LLAMA_LIKE,
        "tools": "glm",
        "kv": "mla",
        "attn": "mla",
        "mla_rope": "interleaved",
        "dsa_rope": "interleaved",
        "biases": "config",
        "qk_norm": False,
        "moe": "sigmoid_group",
        "default_tie": False,
        "thinking": "enable_thinking",
    },
    "deepseek_v32": {
        "display": "DeepSeek-V3.2",
        "model_types": ["deepseek_v32"],
        **_LLAMA_LIKE,
        "tools": "deepseek",
        "kv": "mla",
        "attn": "mla",
        "mla_rope": "interleaved",
        "dsa_rope": "neox",
        "biases": "config",
        "qk_norm": False,
        "moe": "sigmoid_group",
        "default_tie": False,
        "thinking": "thinking",
    },
    "deepseek_v3": {
        "display": "DeepSeek-V3 / R1",
        "model_types": ["deepseek_v3"],
        **_LLAMA_LIKE,
        "tools": "deepseek",
        "kv": "mla",
        "attn": "mla",
        "biases": "config",
        "qk_norm": False,
        "moe": "sigmoid_group",
        "default_tie": False,
        "thinking": "thinking",
    },
    # MiniMax-M2: sigmoid routing with the correction bias on the MoE block (one group, top-k
    # always renormalised), experts under Mixtral's names and widths, q/k RMSNorm over the whole
    # projection, partial RoPE given as rotary_dim.
    "minimax_m2": {
        "display": "MiniMax-M2",
        "model_types": ["minimax_m2"],
        **_LLAMA_LIKE,
        "biases": "none",
        "qk_norm": "full",
        "moe": "sigmoid_group",
        "moe_width": "intermediate_size",
        "renorm": True,
        "expert_names": "mixtral",
        "router_bias": "block",      # e_score_correction_bias beside the gate, not in it
        "rope_theta": 5000000.0,     # the config class's default_theta
        "partial_rotary": "rotary_dim",
        "default_tie": False,
        "tools": "minimax",          # <minimax:tool_call> blocks; it always reasons (no on/off switch)
    },
    # MiMo-V2-Flash (colibri/family/mimo.py): full and sliding-window layers, each with its own RoPE
    # and KV heads, sinks on the sliding ones, v heads narrower than q/k, dense first layer.
    "mimo_v2_flash": {
        "display": "MiMo-V2-Flash",
        "model_types": ["mimo_v2_flash"],
        **_LLAMA_LIKE,
        "attn_layout": "mimo",
        "ignored_tensors": r"^model\.mtp\.",  # its MTP module, which transformers does not load
        "biases": "qkv_config",      # q/k/v biased when attention_bias, o never
        "qk_norm": False,
        "moe": "sigmoid_group",
        "default_tie": False,
    },
    # DeepSeek-V4 (colibri/family/deepseek_v4.py): hyper-connection streams, shared-K=V MQA with
    # sinks and a grouped output projection, hash-routed first layers, sqrtsoftplus routing.
    "deepseek_v4": {
        "display": "DeepSeek-V4",
        "model_types": ["deepseek_v4"],
        **_LLAMA_LIKE,
        "attn_layout": "dsv4",
        "ignored_tensors": r"(^|\.)mtp\.",  # its MTP module, which transformers does not load
        "biases": "none",
        "qk_norm": False,
        "moe": "dsv4",
        "default_tie": False,
        "tools": "deepseek",         # V4's DSML <tool_calls> block (V3.2 named it function_calls)
        "thinking": "thinking",
    },
}

# Tensor classes by HF name, for the planner and doctor; first match wins (norms before
# attention: q_norm lives in self_attn). The converter's storage choice follows the same split:
# experts, dense trunk (attention, dense MLP, embed, lm_head), and f32 (norms, router, biases).
TENSOR_CLASSES = (
    ("other", re.compile(r"\.mlp\.experts\.\d+\.\w+\.bias$")),  # gpt-oss expert biases: resident f32
    ("expert", re.compile(r"\.(mlp|block_sparse_moe)\.experts\.\d+\.")),
    ("shared_expert", re.compile(r"\.mlp\.shared_experts?\.")),
    ("router", re.compile(r"\.(mlp|block_sparse_moe)\.gate\.(weight|bias|e_score_correction_bias)$")),
    ("router", re.compile(r"\.mlp\.shared_expert_gate\.weight$")),
    ("router", re.compile(r"\.(mlp|block_sparse_moe)\.e_score_correction_bias$")),  # MiniMax-M2
    ("embed", re.compile(r"^model\.embed_tokens\.")),
    ("lm_head", re.compile(r"^lm_head\.")),
    ("norm", re.compile(r"norm\.(weight|bias)$")),
    ("attention", re.compile(r"\.(self_attn|linear_attn)\.")),
    ("dense_mlp", re.compile(r"\.mlp\.(gate|up|down)_proj\.")),
)


# KV cache element types the engine offers (`--kv`); f16 is the default (measured in
# docs/architecture.md: its oracle error is 8x below bf16's at the same size).
KV_TYPES = {"f16": 2, "bf16": 2, "f32": 4}
KV_DEFAULT = "f16"


def layer_specs(arch):
    """Per-layer block specs for colibri.json (docs/container.md): which blocks each layer runs,
    their geometry, and the container tensor names each block reads. The engine spells no
    tensor name; it reads these. Also applied to an older manifest's arch, which had none."""
    if arch.get("dsv4"):
        return deepseek_v4.layer_specs(arch, _norm)
    L, nkv, hd = int(arch["num_layers"]), int(arch["num_kv_heads"]), int(arch["head_dim"])
    nh, eps = arch.get("num_heads"), arch.get("rms_norm_eps")
    kinds = arch.get("layer_mlp") or ["dense"] * L
    specs = []
    for l in range(L):
        p = f"model.layers.{l}"
        mlp = deepseek.moe_mlp_spec(arch, p) if kinds[l] == "moe" and arch.get("router") == "sigmoid_group" else None
        linear = (arch.get("layer_attn") or [None] * L)[l]
        if linear in ("gated_deltanet", "kda"):
            attn = qwen35.deltanet_spec(arch, p) if linear == "gated_deltanet" else kimi.kda_spec(arch, p)
            specs.append(_layer(arch, p, attn, mlp or _mlp_spec(arch, p, kinds[l])))
            continue
        if arch.get("attn") == "mla":
            specs.append(_layer(arch, p, deepseek.mla_attn_spec(arch, p), mlp or _mlp_spec(arch, p, kinds[l])))
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
        if arch.get("mimo"):
            attn.update(mimo.attn_overrides(arch, l, nkv))
            if attn["sinks"]:
                at["sinks"] = f"{p}.self_attn.{arch['mimo'].get('sinks_name', 'attention_sink_bias')}"
            attn["state"]["kv_values_per_pos"] = attn["kv_heads"] * (hd + attn["v_head_dim"])
            if attn["ring"]:  # a sliding layer keeps only its window
                attn["state"]["window"] = attn["window"]
        if arch.get("attn_sinks"):  # one learned logit per head joins the softmax
            at["sinks"] = f"{p}.self_attn.sinks"
        if window and arch.get("kv_ring"):  # the slot keeps only the window (a ring)
            attn["ring"] = True
            attn["state"]["window"] = window
        if arch.get("clip_qkv"):
            attn["clip_qkv"] = arch["clip_qkv"]
        if arch.get("attn_output_gate"):  # q_proj's per-head query|gate halves, split by the converter
            at["q"], at["gate"] = qwen35.gated_q_names(p)
        if arch.get("norm_offset") and arch.get("qk_norm"):
            attn["qk_norm_offset"] = arch["norm_offset"]
        specs.append(_layer(arch, p, attn, mlp or _mlp_spec(arch, p, kinds[l])))
    return specs


def _mlp_spec(arch, p, kind):
    if kind == "moe":
        if arch.get("expert_names") == "gpt_oss":
            return _gpt_oss_moe_spec(arch, p)
        if arch.get("expert_names") == "mixtral":
            ex = {x: f"{p}.block_sparse_moe.experts.{{e}}.{w}.weight" for x, w in (("gate", "w1"), ("up", "w3"), ("down", "w2"))}
            router = f"{p}.block_sparse_moe.gate.weight"
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


def _gpt_oss_moe_spec(arch, p):
    """gpt-oss experts: per-expert gate/up/down with biases in the container (the converter splits
    the fused, interleaved source), the clamped SwiGLU, a biased top-k-then-softmax router."""
    ex = {x: f"{p}.mlp.experts.{{e}}.{x}_proj.weight" for x in ("gate", "up", "down")}
    ex.update({f"{x}_bias": f"{p}.mlp.experts.{{e}}.{x}_proj.bias" for x in ("gate", "up", "down")})
    return {"kind": "moe", "act": "swiglu_clamp", "swiglu_alpha": arch["swiglu_alpha"],
            "swiglu_limit": arch["swiglu_limit"], "experts": arch.get("num_experts"),
            "top_k": arch.get("num_experts_per_tok"), "width": arch.get("moe_intermediate_size"),
            "router": {"kind": "topk_softmax",
                       "tensors": {"weight": f"{p}.mlp.router.weight", "bias": f"{p}.mlp.router.bias"}},
            "expert_tensors": ex}


def _norm(arch, weight):
    spec = {"kind": "rmsnorm", "eps": arch.get("rms_norm_eps"), "tensors": {"weight": weight}}
    if arch.get("norm_offset"):  # x * (w + offset): Qwen3.5's (1 + w) norms
        spec["weight_offset"] = arch["norm_offset"]
    return spec


def _layer(arch, p, attn, mlp):
    return {
        "attn_norm": _norm(arch, f"{p}.input_layernorm.weight"),
        "attn": attn,
        "mlp_norm": _norm(arch, f"{p}.post_attention_layernorm.weight"),
        "mlp": mlp,
    }


def trunk_spec(arch):
    """The tensors around the layers: embedding, final norm, output head."""
    trunk = {"embed": "model.embed_tokens.weight",
             "final_norm": _norm(arch, "model.norm.weight"),
             "lm_head": "model.embed_tokens.weight" if arch.get("tie_word_embeddings") else "lm_head.weight"}
    if arch.get("dsv4"):  # the streams collapse into one before the final norm
        trunk["hc_head"] = deepseek_v4.trunk_extra(arch)
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
    layout = FAMILIES.get(family, {}).get("kv", "gqa")
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

SUPPORTED_ROPE = ("default", "linear", "llama3", "yarn")


class UnsupportedModel(ValueError):
    """The checkpoint asks for something the engine does not implement."""


def family_for_model_type(model_type):
    for name, fam in FAMILIES.items():
        if model_type in fam["model_types"]:
            return name
    known = ", ".join(sorted(t for f in FAMILIES.values() for t in f["model_types"]))
    raise UnsupportedModel(f"model_type '{model_type}' is not supported (supported: {known})")


def _rope_inv_freq(cfg, head_dim, default_partial=1.0, partial=None, default_theta=10000.0):
    """inv_freq and cos/sin scale exactly as transformers' modeling_rope_utils computes them."""
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE:
        raise UnsupportedModel(f"rope type '{rope_type}' is not supported (supported: {', '.join(SUPPORTED_ROPE)})")
    base = float(params.get("rope_theta", cfg.get("rope_theta", default_theta)))
    if partial is None:
        partial = float(params.get("partial_rotary_factor", cfg.get("partial_rotary_factor")) or default_partial)
    dim = int(head_dim * partial)
    inv = [1.0 / (base ** (i / dim)) for i in range(0, dim, 2)]
    scale = 1.0
    max_pos = cfg.get("max_position_embeddings")
    orig = cfg.get("original_max_position_embeddings", params.get("original_max_position_embeddings", max_pos))
    if rope_type == "linear":
        inv = [f / float(params["factor"]) for f in inv]
    elif rope_type == "llama3":
        factor, lo, hi = float(params["factor"]), float(params["low_freq_factor"]), float(params["high_freq_factor"])
        lo_wave, hi_wave = orig / lo, orig / hi
        out = []
        for f in inv:
            wave = 2 * math.pi / f
            if wave < hi_wave:
                out.append(f)
            elif wave > lo_wave:
                out.append(f / factor)
            else:
                smooth = (orig / wave - lo) / (hi - lo)
                out.append((1 - smooth) * f / factor + smooth * f)
        inv = out
    elif rope_type == "yarn":
        factor = params.get("factor")
        if factor is None:
            factor = max_pos / orig
        factor = float(factor)
        att = params.get("attention_factor")
        mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")

        def get_mscale(s, m=1.0):
            return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

        if att is None:
            att = get_mscale(factor, mscale) / get_mscale(factor, mscale_all) if mscale and mscale_all else get_mscale(factor)
        beta_fast = params.get("beta_fast") or 32
        beta_slow = params.get("beta_slow") or 1

        def corr_dim(rot):
            return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

        low, high = corr_dim(beta_fast), corr_dim(beta_slow)
        if params.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        out = []
        for i, f in enumerate(inv):
            ramp = min(max((i - low) / (high - low), 0.0), 1.0)
            extra = 1 - ramp
            out.append((f / factor) * (1 - extra) + f * extra)
        inv = out
        scale = float(att)
    # an odd int(head_dim * partial) still rotates whole pairs: transformers' cos/sin hold
    # 2 x ceil(dim / 2) dims, the frequencies keep dim as their exponent's denominator
    return 2 * len(inv), inv, scale


def _float32(x):
    """Rounds to float32 so the engine sees the values transformers computes with."""
    import struct
    return struct.unpack("<f", struct.pack("<f", x))[0]


def normalize_arch(cfg):
    """HF config.json -> (family, arch dict for colibri.json). Raises UnsupportedModel."""
    family = family_for_model_type(cfg.get("model_type"))
    fam = FAMILIES[family]
    if fam.get("hybrid") == "gated_deltanet":  # a vision-language wrapper: its text model
        cfg = qwen35.text_config(cfg)
    cfg = class_defaults.fill(family, cfg)  # what transformers assumes for a field left out
    if fam.get("attn_layout") == "dsv4":
        try:
            cfg = deepseek_v4.config(cfg)
            return family, deepseek_v4.arch(cfg, lambda c, params: _rope_inv_freq(dict(c, rope_parameters=params),
                                                                               int(c["head_dim"])), _float32)
        except KeyError as e:
            raise UnsupportedModel(f"config.json lacks a usable {e}") from None
        except (TypeError, ValueError) as e:
            raise UnsupportedModel(f"config.json: {e}") from None
    if fam.get("attn_layout") == "mimo":
        try:
            cfg = mimo.config_defaults(cfg)
        except (KeyError, TypeError, ValueError) as e:
            raise UnsupportedModel(f"config.json lacks a usable {e}") from None
    elif fam.get("hybrid") == "kda":  # the release's own spellings
        cfg = kimi.config(cfg)
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
            mla = deepseek.mla_arch(cfg, fam.get("mla_rope"))
            if fam.get("dsa_rope"):
                mla.update(deepseek.dsa_arch(cfg, fam["dsa_rope"]))
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
    if fam.get("attn_layout") == "mimo":  # one RoPE table per layer kind; the model's is layer 0's
        try:
            layered = mimo.attn_arch(cfg, lambda params: _rope_inv_freq(dict(cfg, rope_parameters=params), head_dim,
                                                                      mimo.DEFAULT_PARTIAL))
        except (KeyError, TypeError, ValueError) as e:
            raise UnsupportedModel(f"config.json: {e}") from None
        for t in layered["rope_by_type"].values():
            t["inv_freq"] = [_float32(f) for f in t["inv_freq"]]
        first = layered["rope_by_type"][layered["layer_types"][0]]
        rot_dim, inv_freq, rope_scale = first["dim"], first["inv_freq"], first["scale"]
    elif mla:  # the rotary part of each head is qk_rope_head_dim, rotated whole
        rot_dim, inv_freq, rope_scale = _rope_inv_freq(dict(cfg, partial_rotary_factor=1.0), mla["qk_rope_head_dim"],
                                                       partial=1.0)
    else:
        partial = fam.get("partial_rotary", 1.0)
        if partial == "rotary_dim":  # MiniMax-M2: rotary_dim, unless a partial_rotary_factor overrides it
            partial = int(cfg["rotary_dim"]) / head_dim if cfg.get("rotary_dim") else 1.0
        whole = _whole_rotary(family, cfg) if fam.get("rotary") == "whole" else None
        rot_dim, inv_freq, rope_scale = _rope_inv_freq(cfg, head_dim, partial, partial=whole,
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
        "rope_inv_freq": [_float32(f) for f in inv_freq],
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
        if family == "olmoe" and heads * head_dim != hidden:
            raise UnsupportedModel(f"{family}: q/k norms span hidden_size, so head_dim {head_dim} x {heads} heads "
                                   f"must equal hidden_size {hidden}")
        arch.update(qk_norm=True, qk_norm_scope="full")
    if cfg.get("clip_qkv") is not None:
        clip = float(cfg["clip_qkv"])
        if not clip > 0:
            raise UnsupportedModel(f"config.json clip_qkv {cfg['clip_qkv']!r} must be positive (or null)")
        arch["clip_qkv"] = clip
    window = cfg.get("sliding_window")
    if family == "mixtral" and window and int(window) < arch["max_position_embeddings"]:
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
            arch.update(deepseek.moe_arch(cfg, layers))
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
    if fam.get("hybrid"):
        try:
            arch.update((kimi if fam["hybrid"] == "kda" else qwen35).linear_arch(cfg, layers))
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


def supported_model_types():
    return sorted(t for f in FAMILIES.values() for t in f["model_types"])
