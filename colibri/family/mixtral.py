"""Mixtral's expert layout (`expert_names: mixtral`, also MiniMax-M2's): experts under
block_sparse_moe.experts.N.w1/w3/w2 and the router at block_sparse_moe.gate, as the releases
save them."""
from colibri.family import gguf_softmax_moe

# transformers' config class defaults for fields config.json leaves out (class_defaults.fill)
CLASS_DEFAULTS = {
    "mixtral": {"intermediate_size": 14336, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
                "max_position_embeddings": 131072, "num_local_experts": 8, "num_experts_per_tok": 2},
    "minimax_m2": {"intermediate_size": 1536, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-06,
                   "max_position_embeddings": 196608, "num_local_experts": 256, "num_experts_per_tok": 8},
}


def moe_names(p):
    """specs.py's hook (colibri/family/parts.py): layer p's expert and router tensor names."""
    ex = {x: f"{p}.block_sparse_moe.experts.{{e}}.{w}.weight" for x, w in (("gate", "w1"), ("up", "w3"), ("down", "w2"))}
    return ex, f"{p}.block_sparse_moe.gate.weight"


def hf_source_tensors(tensors, arch, log):
    """The tensors as they are; a checkpoint in transformers' own layout (save_original_format=False:
    mlp.gate, fused experts) reads through the shared MoE names instead."""
    if arch.get("expert_names") == "mixtral" and not any(".block_sparse_moe." in n for n in tensors):
        del arch["expert_names"]
    return tensors


# ---------------------------------------------------------------- GGUF
# llama.cpp writes Mixtral as architecture `llama` with llama.expert_count > 0 (llama.py's
# gguf_family): Q/K rows permuted like llama's, every layer sparse, one width for all experts.
# A file that names attention.sliding_window gets it honoured (llama.cpp's converter does not
# write one: Mixtral's releases have none).
GGUF_ARCHS = {}
GGUF_HF_CLASS = {"mixtral": "MixtralForCausalLM"}
GGUF_PERMUTED_QK = True
GGUF_PER_LAYER = {"ffn_gate_inp.weight": "block_sparse_moe.gate.weight"}
# HF expert projection names: (prefix under the layer, {GGUF tensor: HF projection})
GGUF_EXPERTS = ("block_sparse_moe.experts", {"ffn_gate_exps.weight": "w1", "ffn_up_exps.weight": "w3",
                                             "ffn_down_exps.weight": "w2"})


def gguf_config_keys(g, tensors, m, family, cfg, L):
    """The MoE keys of a Mixtral file, added to the llama-style config."""
    experts, used, _, _, width, _ = gguf_softmax_moe.moe_layers(g, tensors, m, family, cfg, L, windowed=True)
    cfg.update(num_local_experts=experts, num_experts_per_tok=used, intermediate_size=width)
