"""Qwen3 (`qwen3`, dense) and Qwen3-MoE (`qwen3_moe`): the shared GQA block with per-head q/k
norms, a dense MLP or softmax top-k experts; every part comes from the shared builders and the
registry's flags.

GGUF (llama.cpp's `qwen3` / `qwen3moe`): NeoX RoPE, stored unpermuted; a layer without a router
(ffn_gate_inp) is one of mlp_only_layers."""

GGUF_ARCHS = {"qwen3": "qwen3", "qwen3moe": "qwen3_moe"}
GGUF_HF_CLASS = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}


def gguf_config_keys(g, tensors, m, family, cfg, L):
    """The bias flag, and a Qwen3-MoE file's MoE keys, added to the llama-style config."""
    cfg["attention_bias"] = "blk.0.attn_q.bias" in tensors
    if family == "qwen3_moe":
        cfg["num_experts"] = m.need("expert_count", int)
        cfg["num_experts_per_tok"] = m.need("expert_used_count", int)
        cfg["moe_intermediate_size"] = m.need("expert_feed_forward_length", int)
        cfg["norm_topk_prob"] = bool(m.get("expert_weights_norm", True))
        cfg["decoder_sparse_step"] = 1
        cfg["mlp_only_layers"] = [l for l in range(L) if f"blk.{l}.ffn_gate_inp.weight" not in tensors]
