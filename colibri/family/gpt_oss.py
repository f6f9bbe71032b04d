"""gpt-oss: what the converter does for this family alone, from either source.

Hugging Face checkpoints: expert tensors -> per-expert gate/up/down (+ biases) in the container.

transformers keeps each layer's experts fused and transposed: gate_up_proj [E, H, 2I] (x @ W,
gate and up interleaved on the last axis: gate = [..., ::2], up = [..., 1::2]),
gate_up_proj_bias [E, 2I] (interleaved the same way), down_proj [E, I, H], down_proj_bias [E, H].
The releases ship the projections as MXFP4 instead: NAME_blocks [E, rows, in/32, 16] (uint8, two
e2m1 values per byte, the low nibble first) and NAME_scales [E, rows, in/32] (uint8 e8m0, 2^(s -
127) per 32 values), with rows = output channels (gate and up interleaved row by row).
Every output tensor is one gather job for the engine's convert-jobs: a strided read
("gather" rows step, column step, in elements) or MXFP4 rows ("mxfp4" scales file, offset, row
step); nothing is materialised here.

GGUF files (llama.cpp's `gpt-oss`): their metadata as the HF config the family reads, and their
tensor names as HF names. What llama.cpp's converter (GptOssModel) does, and how it is read back:
- the fused gate_up_proj is split into ffn_gate_exps / ffn_up_exps ([E, I, H], output rows first,
  gate = the even rows), down_proj is ffn_down_exps [E, H, I]; their biases are ffn_*_exps.bias
  [E, rows]; each expert's rows are read as the per-expert tensors the container holds;
- MXFP4 experts are GGUF type 39, whose block (e8m0 byte + 16 nibble bytes, element j low, j+16
  high) is colibri's mxfp4 block: kept as they are by default, else dequantized exactly;
- sliding layers are the even ones (llama.cpp's swa pattern 2) with attention.sliding_window;
- the SwiGLU clamp is llama.cpp's fixed 7 (alpha 1.702) unless the file carries swiglu_clamp_exp;
- YaRN: rope.scaling.factor / original_context_length, beta_fast/slow 32/1 unless written, and
  no truncation of the correction range (the gpt-oss reference's `truncate: false`).
"""
from colibri.errors import ConvertError

# transformers' config class defaults for fields config.json leaves out (class_defaults.fill)
CLASS_DEFAULTS = {
    "gpt_oss": {"intermediate_size": 2880, "num_key_value_heads": 8, "head_dim": 64, "rms_norm_eps": 1e-05,
                "max_position_embeddings": 131072, "num_local_experts": 128, "num_experts_per_tok": 4,
                "sliding_window": 128,
                # GptOssConfig.__post_init__, when neither rope_parameters nor rope_scaling is given
                "rope_parameters": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                    "truncate": False, "original_max_position_embeddings": 4096}}}

ELEM = {"F32": 4, "BF16": 2, "F16": 2}


def _error(msg):
    return ConvertError(msg)


def _raw(p, tensors, name, shape, dtypes):
    t = tensors.get(name)
    if t is None:
        raise _error(f"source checkpoint lacks tensor '{name}'")
    if list(t["shape"]) != list(shape):
        raise _error(f"source tensor '{name}' has shape {t['shape']}, the config implies {list(shape)}")
    if t["dtype"] not in dtypes:
        raise _error(f"source tensor '{name}' is {t['dtype']}; gpt-oss experts need {' or '.join(dtypes)}")
    p.used.add(name)
    return t


def plan_experts(p, tensors, take, pre, names, E, I, H):
    """Adds layer `pre`'s E experts (gate [I, H], up [I, H], down [H, I] and their biases) to the
    planner p; each expert's three projections adjacent, anchored in the gate_up source's file."""
    base = f"{pre}.mlp.experts"
    if f"{base}.0.gate_proj.weight" in tensors:  # already one tensor per expert (GGUF files)
        return _per_expert(p, take, pre, names, E, I, H)
    mx = f"{base}.gate_up_proj_blocks" in tensors
    gub = _raw(p, tensors, f"{base}.gate_up_proj_bias", [E, 2 * I], ELEM)
    dnb = _raw(p, tensors, f"{base}.down_proj_bias", [E, H], ELEM)
    if mx:
        for n, inner in ((H, "gate_up"), (I, "down")):
            if n % 32:
                raise _error(f"{base}.{inner}_proj_blocks: MXFP4 rows of {n} values are not whole 32-value blocks")
        gu = _raw(p, tensors, f"{base}.gate_up_proj_blocks", [E, 2 * I, H // 32, 16], ("U8",))
        gus = _raw(p, tensors, f"{base}.gate_up_proj_scales", [E, 2 * I, H // 32], ("U8",))
        dn = _raw(p, tensors, f"{base}.down_proj_blocks", [E, H, I // 32, 16], ("U8",))
        dns = _raw(p, tensors, f"{base}.down_proj_scales", [E, H, I // 32], ("U8",))
    else:
        gu = take(f"{base}.gate_up_proj", [E, H, 2 * I])
        dn = take(f"{base}.down_proj", [E, I, H])
        for t in (gu, dn):
            if t["dtype"] not in ELEM:
                raise _error(f"gpt-oss fused experts in {t['dtype']} are not supported (F32, BF16, F16 or MXFP4)")
    anchor = gu["file"]
    for e in range(E):
        out = {k: v.replace("{e}", str(e)) for k, v in names.items()}
        eo = (int(pre.rsplit(".", 1)[1]) + 1, e)
        if mx:
            gb, gs = gu["offset"] + e * 2 * I * H // 2, gus["offset"] + e * 2 * I * H // 32
            db, ds = dn["offset"] + e * H * I // 2, dns["offset"] + e * H * I // 32
            parts = {"gate": (gu["file"], gb, "MXFP4", I, ("mxfp4", gus["file"], gs, 2)),
                     "up": (gu["file"], gb + H // 2, "MXFP4", I, ("mxfp4", gus["file"], gs + H // 32, 2)),
                     "down": (dn["file"], db, "MXFP4", H, ("mxfp4", dns["file"], ds, 1))}
        else:
            ge, de = ELEM[gu["dtype"]], ELEM[dn["dtype"]]
            gb, db = gu["offset"] + e * H * 2 * I * ge, dn["offset"] + e * I * H * de
            # gate[i][h] = W[h][2i], up[i][h] = W[h][2i+1], down[h][i] = D[i][h]
            parts = {"gate": (gu["file"], gb, gu["dtype"], I, ("gather", 2, 2 * I)),
                     "up": (gu["file"], gb + ge, gu["dtype"], I, ("gather", 2, 2 * I)),
                     "down": (dn["file"], db, dn["dtype"], H, ("gather", 1, H))}
        for proj, (rows, cols) in (("gate", (I, H)), ("up", (I, H)), ("down", (H, I))):
            p.add(out[proj], "expert", rows, cols, [parts[proj]], anchor, eo)
        be, de = ELEM[gub["dtype"]], ELEM[dnb["dtype"]]
        b0 = gub["offset"] + e * 2 * I * be
        p.add(out["gate_bias"], "f32", 1, I, [(gub["file"], b0, gub["dtype"], 1, ("gather", 0, 2))], anchor, eo)
        p.add(out["up_bias"], "f32", 1, I, [(gub["file"], b0 + be, gub["dtype"], 1, ("gather", 0, 2))], anchor, eo)
        p.add(out["down_bias"], "f32", 1, H, [(dnb["file"], dnb["offset"] + e * H * de, dnb["dtype"], 1)], anchor, eo)


def _per_expert(p, take, pre, names, E, I, H):
    """Experts stored one tensor per projection and expert, under the container's own names."""
    shapes = {"gate": [I, H], "up": [I, H], "down": [H, I], "gate_bias": [I], "up_bias": [I], "down_bias": [H]}
    anchor = None
    for e in range(E):
        eo = (int(pre.rsplit(".", 1)[1]) + 1, e)
        for key, shape in shapes.items():
            t = take(names[key].replace("{e}", str(e)), shape)
            anchor = anchor or t["file"]
            rows, cols = (shape[0], shape[1]) if len(shape) == 2 else (1, shape[0])
            p.add(names[key].replace("{e}", str(e)), "f32" if len(shape) == 1 else "expert", rows, cols,
                  [(t["file"], t["offset"], t["dtype"], rows)], anchor, eo)


def moe_spec(arch, p):
    """gpt-oss experts: per-expert gate/up/down with biases in the container (the converter splits
    the fused, interleaved source), the clamped SwiGLU, a biased top-k-then-softmax router."""
    ex = {x: f"{p}.mlp.experts.{{e}}.{x}_proj.weight" for x in ("gate", "up", "down")}
    ex.update({f"{x}_bias": f"{p}.mlp.experts.{{e}}.{x}_proj.bias" for x in ("gate", "up", "down")})
    return {"kind": "moe", "act": "swiglu_clamp", "swiglu_alpha": arch["swiglu_alpha"],
            "swiglu_limit": arch["swiglu_limit"], "experts": arch.get("num_experts"),
            "top_k": arch.get("num_experts_per_tok"), "width": arch.get("moe_intermediate_size"),
            "router": {"kind": "topk_softmax",
                       "tensors": {"weight": f"{p}.mlp.router.weight", "bias": f"{p}.mlp.router.bias"}},
            "expert_tensors": ex}


# GGUF: the names llama.cpp gives this family's tensors and metadata
ARCH_NAME = "gpt-oss"  # llama.cpp's general.architecture
GGUF_ARCHS = {ARCH_NAME: "gpt_oss"}

GGUF_PER_LAYER = {
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "attn_sinks.weight": "self_attn.sinks",
    "ffn_gate_inp.weight": "mlp.router.weight",
    "ffn_gate_inp.bias": "mlp.router.bias",
}
# [E, rows] GGUF tensors -> per-expert HF names (rows = one vector per expert)
EXPERT_BIASES = {"ffn_gate_exps.bias": "gate_proj", "ffn_up_exps.bias": "up_proj", "ffn_down_exps.bias": "down_proj"}


def gguf_config(g, tensors, m, uniform, base):
    """gpt-oss metadata -> ("gpt_oss", HF config). base: the keys every family shares."""
    L = m.need("block_count", int)
    heads = uniform(m, "attention.head_count", L)
    kv = uniform(m, "attention.head_count_kv", L)
    hd = m.get("attention.key_length", kind=int) or base["hidden_size"] // heads
    if (m.get("attention.value_length", kind=int) or hd) != hd:
        raise ConvertError(f"{g.path}: gpt-oss key and value lengths differ")
    window = m.need("attention.sliding_window", int)
    limit = m.get("swiglu_clamp_exp")
    if isinstance(limit, list):
        if len(set(limit)) != 1:
            raise ConvertError(f"{g.path}: {ARCH_NAME}.swiglu_clamp_exp varies by layer ({limit[:8]}); not supported")
        limit = limit[0]
    rope = {"rope_type": "default", "rope_theta": float(m.get("rope.freq_base", 150000.0, kind=float))}
    kind = m.get("rope.scaling.type")
    if kind == "yarn":
        rope.update(rope_type="yarn", factor=float(m.need("rope.scaling.factor", float)),
                    original_max_position_embeddings=m.need("rope.scaling.original_context_length", int),
                    beta_fast=float(m.get("rope.scaling.yarn_beta_fast", 32.0, kind=float)),
                    beta_slow=float(m.get("rope.scaling.yarn_beta_slow", 1.0, kind=float)), truncate=False)
    elif kind not in (None, "none"):
        raise ConvertError(f"{g.path}: rope scaling '{kind}' is not supported for {ARCH_NAME}")
    cfg = dict(base, architectures=["GptOssForCausalLM"], model_type="gpt_oss", num_hidden_layers=L,
               num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd,
               intermediate_size=m.need("expert_feed_forward_length", int),
               num_local_experts=m.need("expert_count", int), num_experts_per_tok=m.need("expert_used_count", int),
               sliding_window=window, attention_bias="blk.0.attn_q.bias" in tensors,
               layer_types=["sliding_attention" if l % 2 == 0 else "full_attention" for l in range(L)],
               swiglu_alpha=1.702, swiglu_limit=float(limit if limit is not None else 7.0), rope_parameters=rope)
    return "gpt_oss", cfg


def gguf_expert_bias_rows(name, shape, pre, path, table, sources, info):
    """ffn_*_exps.bias [E, rows] -> one f32 vector per expert; False if name is not one."""
    proj = EXPERT_BIASES.get(name)
    if proj is None:
        return False
    if len(shape) != 2:
        raise ConvertError(f"expert bias '{name}' is not 2-D ({shape})")
    E, n = shape
    for e in range(E):
        hn = f"{pre}.mlp.experts.{e}.{proj}.bias"
        table[hn] = dict(file=path, dtype="F32", shape=[n], offset=0)
        sources[hn] = (info, e, None)
    return True
