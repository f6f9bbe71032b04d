"""MLA's kv_b_proj from a GGUF file that splits it per head (llama.cpp's recent deepseek2 files):
attn_v_b, the value half, is a row copy; attn_k_b, the key half, is stored transposed to
[kv_lora_rank, qk_nope] per head, so it is dequantized by the engine and transposed back into a
scratch F32 file next to the output (a transposed block type would need its blocks re-cut), and
kv_b_proj is re-quantized from that F32 whatever --dense says (stdlib only)."""
import array
from pathlib import Path

from colibri.convert import gguf_dequant


def key_half_offsets(g, cfg):
    """Offset in the scratch file of each layer's transposed attn_k_b (layers in order)."""
    size = cfg["num_attention_heads"] * cfg["qk_nope_head_dim"] * cfg["kv_lora_rank"] * 4
    layers = [l for l in range(cfg["num_hidden_layers"]) if f"blk.{l}.attn_k_b.weight" in g.tensors]
    return {l: i * size for i, l in enumerate(layers)}


def write_kv_b_key_halves(g, cfg, scratch):
    """Transposes every layer's attn_k_b ([heads][kv_lora_rank rows of qk_nope]) back to HF's
    key rows ([heads][qk_nope rows of kv_lora_rank]) into one F32 file, at key_half_offsets."""
    heads = cfg["num_attention_heads"]
    offsets = key_half_offsets(g, cfg)
    infos = [g.tensors[f"blk.{l}.attn_k_b.weight"] for l in offsets]
    flat = Path(str(scratch) + ".deq")
    try:
        gguf_dequant.to_f32(g, list(zip(infos, offsets.values())), flat, "attn_k_b")  # equal sizes: one after another
        with open(flat, "rb") as f, open(scratch, "wb") as out:
            for info, off in zip(infos, offsets.values()):
                dn, kl = info.shape[0], info.shape[1]
                assert out.tell() == off
                for h in range(heads):
                    src = array.array("f")
                    src.frombytes(f.read(4 * dn * kl))  # kl rows of dn
                    t = array.array("f", bytes(4 * dn * kl))
                    for j in range(dn):
                        t[j * kl:(j + 1) * kl] = src[j::dn]
                    out.write(t.tobytes())
    finally:
        flat.unlink(missing_ok=True)
