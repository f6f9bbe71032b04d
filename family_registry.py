"""Every fact about a model family in one table, as data.

The converter, the launcher and the tests ask this module; nothing else hard-codes a family.
It imports nothing from the package: the code that reads these facts lives in colibri/family/
(normalize.py maps an HF ``config.json`` to the normalized architecture the engine reads,
specs.py builds the per-layer block specs, one module per family adds its own parts).
"""
import re

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
        "qk_norm_width": "hidden_size",  # ... hidden_size wide, so heads x head_dim must equal it
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
        "sliding_window": "every_layer",  # the config's sliding_window binds every layer (no layer_types)
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
    # The DeepSeek-V3 line (colibri/family/mla.py, sigmoid_moe.py): sigmoid group-limited routing,
    # shared experts, leading dense layers; "mla" attention keeps the compressed latent per position.
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
        # the release encodes chats with a Python script: the template written when a checkpoint has
        # none (colibri/chat_template/defaults/), and where its text comes from
        "default_chat_template": ("deepseek_v4.jinja", "llama.cpp's default DeepSeek-V4 template, "
                                                       "models/templates/deepseek-ai-DeepSeek-V4.jinja"),
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


SUPPORTED_ROPE = ("default", "linear", "llama3", "yarn")


class UnsupportedModel(ValueError):
    """The checkpoint asks for something the engine does not implement."""


def family_for_model_type(model_type):
    for name, fam in FAMILIES.items():
        if model_type in fam["model_types"]:
            return name
    known = ", ".join(sorted(t for f in FAMILIES.values() for t in f["model_types"]))
    raise UnsupportedModel(f"model_type '{model_type}' is not supported (supported: {known})")


def supported_model_types():
    return sorted(t for f in FAMILIES.values() for t in f["model_types"])
