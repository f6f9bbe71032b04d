"""Builders every family shares: RMSNorm and layer specs, RoPE frequencies as transformers
computes them, float32 rounding. They never call back into a family module."""
import math
import struct

from family_registry import SUPPORTED_ROPE, UnsupportedModel


def norm(arch, weight):
    spec = {"kind": "rmsnorm", "eps": arch.get("rms_norm_eps"), "tensors": {"weight": weight}}
    if arch.get("norm_offset"):  # x * (w + offset): Qwen3.5's (1 + w) norms
        spec["weight_offset"] = arch["norm_offset"]
    return spec


def layer(arch, p, attn, mlp):
    return {
        "attn_norm": norm(arch, f"{p}.input_layernorm.weight"),
        "attn": attn,
        "mlp_norm": norm(arch, f"{p}.post_attention_layernorm.weight"),
        "mlp": mlp,
    }


def gqa_shapes(attn, hidden):
    """Source shape of every tensor a "gqa" spec names, from the layer's own geometry (MiMo's
    sliding layers have more KV heads than its full ones, and v heads narrower than q/k)."""
    nh, nkv, hd = attn["heads"], attn["kv_heads"], attn["head_dim"]
    vd = attn.get("v_head_dim", hd)
    full = attn.get("qk_norm") == "full"  # one norm over all heads (OLMoE, MiniMax-M2)
    return {"q": [nh * hd, hidden], "k": [nkv * hd, hidden], "v": [nkv * vd, hidden], "o": [hidden, nh * vd],
            "q_bias": [nh * hd], "k_bias": [nkv * hd], "v_bias": [nkv * vd], "o_bias": [hidden],
            "q_norm": [nh * hd] if full else [hd], "k_norm": [nkv * hd] if full else [hd], "sinks": [nh]}


def rope_inv_freq(cfg, head_dim, default_partial=1.0, partial=None, default_theta=10000.0):
    """inv_freq and cos/sin scale exactly as transformers' modeling_rope_utils computes them."""
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE:
        raise UnsupportedModel(f"rope type '{rope_type}' is not supported (supported: {', '.join(SUPPORTED_ROPE)})")
    base = float(params.get("rope_theta", cfg.get("rope_theta", default_theta)))
    if partial is None:
        partial = float(params.get("partial_rotary_factor", cfg.get("partial_rotary_factor")) or default_partial)
    dim = int(head_dim * partial)
    inv = [1.0 / (base ** (i / dim)) for i in range(0, dim, 2)]
    scale = 1.0
    max_pos = cfg.get("max_position_embeddings")
    orig = cfg.get("original_max_position_embeddings", params.get("original_max_position_embeddings", max_pos))
    if rope_type == "linear":
        inv = [f / float(params["factor"]) for f in inv]
    elif rope_type == "llama3":
        factor, lo, hi = float(params["factor"]), float(params["low_freq_factor"]), float(params["high_freq_factor"])
        lo_wave, hi_wave = orig / lo, orig / hi
        out = []
        for f in inv:
            wave = 2 * math.pi / f
            if wave < hi_wave:
                out.append(f)
            elif wave > lo_wave:
                out.append(f / factor)
            else:
                smooth = (orig / wave - lo) / (hi - lo)
                out.append((1 - smooth) * f / factor + smooth * f)
        inv = out
    elif rope_type == "yarn":
        factor = params.get("factor")
        if factor is None:
            factor = max_pos / orig
        factor = float(factor)
        att = params.get("attention_factor")
        mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")

        def get_mscale(s, m=1.0):
            return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

        if att is None:
            att = get_mscale(factor, mscale) / get_mscale(factor, mscale_all) if mscale and mscale_all else get_mscale(factor)
        beta_fast = params.get("beta_fast") or 32
        beta_slow = params.get("beta_slow") or 1

        def corr_dim(rot):
            return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

        low, high = corr_dim(beta_fast), corr_dim(beta_slow)
        if params.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        out = []
        for i, f in enumerate(inv):
            ramp = min(max((i - low) / (high - low), 0.0), 1.0)
            extra = 1 - ramp
            out.append((f / factor) * (1 - extra) + f * extra)
        inv = out
        scale = float(att)
    # an odd int(head_dim * partial) still rotates whole pairs: transformers' cos/sin hold
    # 2 x ceil(dim / 2) dims, the frequencies keep dim as their exponent's denominator
    return 2 * len(inv), inv, scale


def float32(x):
    """Rounds to float32 so the engine sees the values transformers computes with."""
    return struct.unpack("<f", struct.pack("<f", x))[0]
