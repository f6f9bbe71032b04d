"""OLMoE (`olmoe`): a softmax top-k MoE in every layer, q/k norms over the whole projection.

GGUF (llama.cpp's `olmoe`): NeoX RoPE, stored unpermuted; the experts' width is
feed_forward_length; attn_q_norm / attn_k_norm hold n_embd and n_embd_k_gqa values; clip_qkv is
attention.clamp_kqv where the file has it (llama.cpp's converter writes it for OLMo, not OLMoE)."""
from colibri.errors import ConvertError
from colibri.family import gguf_softmax_moe

# transformers' config class defaults for fields config.json leaves out (class_defaults.fill)
CLASS_DEFAULTS = {"olmoe": {"intermediate_size": 2048, "rms_norm_eps": 1e-05, "max_position_embeddings": 4096,
                            "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": False}}

GGUF_ARCHS = {"olmoe": "olmoe"}
GGUF_HF_CLASS = {"olmoe": "OlmoeForCausalLM"}


def gguf_config_keys(g, tensors, m, family, cfg, L):
    """The MoE and norm keys of an OLMoE file, added to the llama-style config."""
    experts, used, _, _, width, norm = gguf_softmax_moe.moe_layers(g, tensors, m, family, cfg, L)
    cfg.update(num_experts=experts, num_experts_per_tok=used, intermediate_size=width,
               norm_topk_prob=bool(norm))
    clip = m.get("attention.clamp_kqv", kind=float)
    if clip:
        cfg["clip_qkv"] = float(clip)
    for x, n in (("q", cfg["num_attention_heads"]), ("k", cfg["num_key_value_heads"])):
        info = tensors.get(f"blk.0.attn_{x}_norm.weight")
        if info is None or info.shape[0] != n * cfg["head_dim"]:
            raise ConvertError(f"{g.path}: OLMoE's attn_{x}_norm must span the whole projection "
                               f"({n} x {cfg['head_dim']} values); it is {None if info is None else list(info.shape)}")
