"""Llama (`llama`): the shared GQA block and dense MLP, biases as the config says.

GGUF (llama.cpp's `llama`): llama.cpp stores the Q and K projections with the rows of each head
interleaved for its rotary layout (the converter puts them back in HF order); a `llama` file
with experts is Mixtral (mixtral.py)."""

GGUF_ARCHS = {"llama": "llama"}
GGUF_HF_CLASS = {"llama": "LlamaForCausalLM"}
GGUF_PERMUTED_QK = True


def gguf_family(metadata):
    """The family of a `llama` file: Mixtral when it has experts."""
    if (metadata.get("llama.expert_count") or 0) > 0:
        return "mixtral"
    return "llama"


def gguf_config_keys(g, tensors, m, family, cfg, L):
    """The bias flags of a llama file, added to the llama-style config."""
    cfg["attention_bias"] = "blk.0.attn_q.bias" in tensors
    cfg["mlp_bias"] = False
