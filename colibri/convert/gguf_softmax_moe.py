"""GGUF import of the softmax top-k MoE families: llama.cpp's `olmoe` (OLMoE), `qwen2moe`
(Qwen1.5-MoE / Qwen2-MoE) and Mixtral, which llama.cpp writes as architecture `llama` with
`llama.expert_count` > 0. Their metadata as the HF config the olmoe / qwen2_moe / mixtral families
read, and the tensor names that differ from gguf.py's llama-style table (stdlib only).

What llama.cpp's converter does to these checkpoints, and how it is read back:
- Mixtral's Q/K rows are permuted like llama's (gguf.py undoes that); OLMoE and Qwen2-MoE run
  NeoX RoPE and are stored unpermuted.
- The expert width is expert_feed_forward_length where written (qwen2moe), else
  feed_forward_length (OLMoE and Mixtral use one width for all experts); the expert tensors'
  own shape is checked against it.
- OLMoE's q/k norms span the whole projection (attn_q_norm / attn_k_norm of n_embd and
  n_embd_k_gqa values); clip_qkv is attention.clamp_kqv where the file has it (llama.cpp's
  converter writes it for OLMo, not OLMoE).
- Qwen2-MoE's shared expert: ffn_{gate,up,down}_shexp, and ffn_gate_inp_shexp the sigmoid gate
  (one row). llama.cpp's qwen2moe has every layer sparse; a layer without ffn_gate_inp (a
  checkpoint with mlp_only_layers) is read as the dense MLP its ffn_gate/ffn_up/ffn_down name.
- A Mixtral file that names attention.sliding_window gets it honoured (llama.cpp's converter
  does not write one: Mixtral's releases have none).
- None of them renormalizes the top-k weights except Mixtral (the registry's renorm); a file
  that says expert_weights_norm keeps its word.
"""
from colibri.errors import ConvertError

ARCHS = {"olmoe": "olmoe", "qwen2moe": "qwen2_moe"}  # plus `llama` with experts -> mixtral
HF_CLASS = {"olmoe": "OlmoeForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM", "mixtral": "MixtralForCausalLM"}
FAMILIES = ("olmoe", "qwen2_moe", "mixtral")

# per-layer GGUF tensor -> HF name under model.layers.N (besides gguf.py's llama-style table)
PER_LAYER = {
    "qwen2_moe": {
        "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
        "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
        "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
        "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
    },
    "mixtral": {"ffn_gate_inp.weight": "block_sparse_moe.gate.weight"},
}
# HF expert projection names: (prefix under the layer, {GGUF tensor: HF projection})
EXPERTS = {
    "mixtral": ("block_sparse_moe.experts", {"ffn_gate_exps.weight": "w1", "ffn_up_exps.weight": "w3",
                                             "ffn_down_exps.weight": "w2"}),
}
DEFAULT_EXPERTS = ("mlp.experts", {"ffn_gate_exps.weight": "gate_proj", "ffn_up_exps.weight": "up_proj",
                                   "ffn_down_exps.weight": "down_proj"})


def family_for(gg_arch, metadata):
    """The colibri family of a GGUF architecture, or None when this module does not handle it."""
    if gg_arch == "llama" and (metadata.get("llama.expert_count") or 0) > 0:
        return "mixtral"
    return ARCHS.get(gg_arch)


def _width(g, tensors, name, L, what):
    """The expert (or shared expert) width from the first layer that has tensor `name` (GGUF
    shape [cols, rows(, experts)]: the row count of an up projection)."""
    for l in range(L):
        info = tensors.get(f"blk.{l}.{name}")
        if info is not None:
            return info.shape[1]
    raise ConvertError(f"{g.path}: no layer has {name}; cannot tell the {what} width")


def moe_config(g, tensors, m, family, cfg, L):
    """Adds the MoE keys of `family` to the llama-style cfg gguf.build_config made."""
    cfg["architectures"], cfg["model_type"] = [HF_CLASS[family]], family
    experts = m.need("expert_count", int)
    used = m.need("expert_used_count", int)
    if not 0 < used <= experts:
        raise ConvertError(f"{g.path}: {m.arch}.expert_used_count {used} must be between 1 and expert_count {experts}")
    sparse = [l for l in range(L) if f"blk.{l}.ffn_gate_inp.weight" in tensors]
    dense = [l for l in range(L) if l not in sparse]
    if not sparse:
        raise ConvertError(f"{g.path}: {m.arch}.expert_count is {experts} but no layer has a router (ffn_gate_inp)")
    if dense and family != "qwen2_moe":
        raise ConvertError(f"{g.path}: layers {dense} have no router (ffn_gate_inp); every {family} layer is sparse")
    got = _width(g, tensors, "ffn_up_exps.weight", L, "expert")
    # qwen2moe's feed_forward_length is the dense layers' width, not the experts'
    width = m.get("expert_feed_forward_length", kind=int) or \
        (cfg["intermediate_size"] if family != "qwen2_moe" else 0) or got
    if got != width:
        raise ConvertError(f"{g.path}: the expert tensors are {got} wide, the metadata says {width}")
    for l in sparse:
        info = tensors.get(f"blk.{l}.ffn_up_exps.weight")
        if info is None or len(info.shape) != 3 or info.shape[2] != experts:
            raise ConvertError(f"{g.path}: blk.{l}.ffn_up_exps.weight must hold {experts} experts "
                               f"({m.arch}.expert_count); it is {None if info is None else list(info.shape)}")
    norm = m.get("expert_weights_norm")
    window = m.get("attention.sliding_window", kind=int)
    if window and family != "mixtral":
        raise ConvertError(f"{g.path}: {m.arch}.attention.sliding_window {window}: sliding-window attention is "
                           f"not supported for {family}")
    if window:  # every Mixtral layer attends to its last `window` positions
        cfg["sliding_window"] = window
    if family == "mixtral":
        cfg.update(num_local_experts=experts, num_experts_per_tok=used, intermediate_size=width)
    elif family == "olmoe":
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
    else:  # qwen2_moe
        shared = m.get("expert_shared_feed_forward_length", kind=int) or \
            _width(g, tensors, "ffn_up_shexp.weight", L, "shared expert")
        cfg.update(num_experts=experts, num_experts_per_tok=used, moe_intermediate_size=width,
                   shared_expert_intermediate_size=shared, norm_topk_prob=bool(norm), decoder_sparse_step=1,
                   mlp_only_layers=dense, qkv_bias="blk.0.attn_q.bias" in tensors)
        if dense and not cfg["intermediate_size"]:
            raise ConvertError(f"{g.path}: layers {dense} are dense but {m.arch}.feed_forward_length is missing")
        for l in sparse:
            if f"blk.{l}.ffn_gate_inp_shexp.weight" not in tensors:
                raise ConvertError(f"{g.path}: blk.{l} lacks the shared expert gate ffn_gate_inp_shexp")
    return cfg
