"""Qwen2 / Qwen2.5 (`qwen2`): the shared GQA block with q/k/v biases and a dense MLP; every part
comes from the shared builders and the registry's flags. GGUF (llama.cpp's `qwen2`): NeoX RoPE,
stored unpermuted, the llama-style config as it is."""

GGUF_ARCHS = {"qwen2": "qwen2"}
GGUF_HF_CLASS = {"qwen2": "Qwen2ForCausalLM"}
