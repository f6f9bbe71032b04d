"""Qwen1.5-MoE / Qwen2-MoE (`qwen2_moe`): softmax top-k experts beside one shared expert behind a
sigmoid gate; layers listed in mlp_only_layers are dense.

GGUF (llama.cpp's `qwen2moe`): NeoX RoPE, stored unpermuted; the experts' width is
expert_feed_forward_length (feed_forward_length is the dense layers'); the shared expert is
ffn_{gate,up,down}_shexp, and ffn_gate_inp_shexp its gate (one row). llama.cpp's qwen2moe has
every layer sparse; a layer without ffn_gate_inp (a checkpoint with mlp_only_layers) is read as
the dense MLP its ffn_gate/ffn_up/ffn_down name."""
from colibri.errors import ConvertError
from colibri.family import gguf_softmax_moe

# transformers' config class defaults for fields config.json leaves out (class_defaults.fill)
CLASS_DEFAULTS = {
    "qwen2_moe": {"intermediate_size": 5632, "num_key_value_heads": 16, "rms_norm_eps": 1e-06,
                  "max_position_embeddings": 32768, "num_experts": 60, "num_experts_per_tok": 4,
                  "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632}}

GGUF_ARCHS = {"qwen2moe": "qwen2_moe"}
GGUF_HF_CLASS = {"qwen2_moe": "Qwen2MoeForCausalLM"}
GGUF_PER_LAYER = {
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
}


def gguf_config_keys(g, tensors, m, family, cfg, L):
    """The MoE and shared-expert keys of a Qwen2-MoE file, added to the llama-style config."""
    experts, used, sparse, dense, width, norm = gguf_softmax_moe.moe_layers(g, tensors, m, family, cfg, L,
                                                                            dense_layers=True)
    shared = m.get("expert_shared_feed_forward_length", kind=int) or \
        gguf_softmax_moe.width(g, tensors, "ffn_up_shexp.weight", L, "shared expert")
    cfg.update(num_experts=experts, num_experts_per_tok=used, moe_intermediate_size=width,
               shared_expert_intermediate_size=shared, norm_topk_prob=bool(norm), decoder_sparse_step=1,
               mlp_only_layers=dense, qkv_bias="blk.0.attn_q.bias" in tensors)
    if dense and not cfg["intermediate_size"]:
        raise ConvertError(f"{g.path}: layers {dense} are dense but {m.arch}.feed_forward_length is missing")
    for l in sparse:
        if f"blk.{l}.ffn_gate_inp_shexp.weight" not in tensors:
            raise ConvertError(f"{g.path}: blk.{l} lacks the shared expert gate ffn_gate_inp_shexp")
