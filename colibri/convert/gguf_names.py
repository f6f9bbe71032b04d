"""llama.cpp's tensor names and the HF names they stand for, per family: read by the GGUF
converter (gguf.py) and by --imatrix (imatrix.py), whose entries carry llama.cpp's names."""
from colibri.family import parts as family_parts

DEFAULT_EXPERTS = ("mlp.experts", {"ffn_gate_exps.weight": "gate_proj", "ffn_up_exps.weight": "up_proj",
                                   "ffn_down_exps.weight": "down_proj"})


def name_tables(family):
    """llama.cpp's tensor names -> HF names for the family: (whole-model names, per-layer names
    under blk.N, the experts' HF prefix, blk.N expert tensors -> HF projection). A family without
    a GGUF reader of its own gets llama.cpp's common names."""
    reader = family_parts.MODULES.get(family)
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    per_layer = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
                 "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
                 "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
                 "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
                 "attn_v.bias": "self_attn.v_proj.bias", "attn_output.bias": "self_attn.o_proj.bias",
                 "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
                 "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
                 "ffn_down.weight": "mlp.down_proj.weight", "ffn_gate_inp.weight": "mlp.gate.weight"}
    per_layer.update(getattr(reader, "GGUF_PER_LAYER", {}))
    expert_prefix, experts = getattr(reader, "GGUF_EXPERTS", DEFAULT_EXPERTS)
    return names, per_layer, expert_prefix, experts
