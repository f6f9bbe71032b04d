"""GGUF import of llama.cpp's `qwen35moe` (Qwen3.5 / Qwen3.6 MoE, gated DeltaNet hybrid): its
metadata as the qwen3_5_moe_text config, its tensor names back to the HF names
colibri/family/qwen35.py reads, and llama.cpp's rewrites undone (stdlib only).

What llama.cpp's converter (Qwen3_5MoeTextModel) does, and how it is read back:
- A_log is stored as -exp(A_log) (ssm_a): written back into a scratch file as the float32
  whose exp it is (_log_of_exp).
- With fewer key than value heads, the value heads are reordered from grouped (by key head) to
  tiled: the V rows of attn_qkv, the rows of attn_gate / ssm_alpha / ssm_beta, the V channels of
  ssm_conv1d are read in HF order row by row; ssm_a, ssm_dt.bias and the columns of ssm_out go
  through the scratch file: a column order cuts through a row's blocks, so ssm_out is dequantized
  there (by the engine, from any block type the importer reads: Q4_K, Q6_K, Q5_0, ...), its
  columns put back, and re-quantized to the requested --dense type like any float tensor.
- The conv is squeezed to [channels, kernel]: declared [channels, 1, kernel] again.
- Every norm but the DeltaNet one (ssm_norm) is stored as 1 + w: w comes back through the
  scratch file (exact in float32: the subtraction of 1 is exact).
- The hybrid pattern is full_attention_interval (every n-th layer full attention).
- The multi-token-prediction head is written as nextn_predict_layers extra blocks after the
  text model's; like the HF path, colibri does not convert it (mtp_tensors counts it for the log).
"""
import array
import math
import struct
import tempfile
from pathlib import Path

from colibri.convert import gguf_dequant
from colibri.errors import ConvertError
from colibri.family import qwen35

ARCH = "qwen35moe"
SCRATCH = "qwen35_rewrites.f32.tmp"  # undone tensors, removed once the shards are written

PER_LAYER = {
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "attn_qkv.weight": "linear_attn.in_proj_qkv.weight", "attn_gate.weight": "linear_attn.in_proj_z.weight",
    "ssm_alpha.weight": "linear_attn.in_proj_a.weight", "ssm_beta.weight": "linear_attn.in_proj_b.weight",
    "ssm_conv1d.weight": "linear_attn.conv1d.weight", "ssm_a": "linear_attn.A_log",
    "ssm_dt.bias": "linear_attn.dt_bias", "ssm_norm.weight": "linear_attn.norm.weight",
    "ssm_out.weight": "linear_attn.out_proj.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
}


def build_config(g, tensors, m, uniform, base):
    """(family, HF config) of a qwen35moe file; base holds the keys every MoE import shares."""
    blocks = m.need("block_count", int)
    L = blocks - (m.get("nextn_predict_layers", 0, kind=int) or 0)  # the MTP layers come last
    if L < 1:
        raise ConvertError(f"{g.path}: {ARCH}.block_count {blocks} leaves no layer besides the "
                           f"{blocks - L} multi-token-prediction layers")
    heads, kv = uniform(m, "attention.head_count", blocks), uniform(m, "attention.head_count_kv", blocks)
    head_dim = m.need("attention.key_length", int)
    rot = m.need("rope.dimension_count", int)
    every = m.need("full_attention_interval", int)
    nk, nv = m.need("ssm.group_count", int), m.need("ssm.time_step_rank", int)
    inner = m.need("ssm.inner_size", int)
    if not every or not nk or nv % nk or inner % nv:
        raise ConvertError(f"{g.path}: {nv} value heads over {nk} key heads (inner size {inner}), "
                           f"full attention every {every} layers: not a valid DeltaNet geometry")
    experts, used = m.need("expert_count", int), m.need("expert_used_count", int)
    cfg = dict(base, architectures=["Qwen3_5MoeForCausalLM"], model_type="qwen3_5_moe_text", num_hidden_layers=L,
               num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, attention_bias=False,
               layer_types=["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(L)],
               linear_conv_kernel_dim=m.need("ssm.conv_kernel", int), linear_key_head_dim=m.need("ssm.state_size", int),
               linear_num_key_heads=nk, linear_num_value_heads=nv, linear_value_head_dim=inner // nv,
               num_experts=experts, num_experts_per_tok=used,
               intermediate_size=uniform(m, "feed_forward_length", blocks) if f"{ARCH}.feed_forward_length" in g.metadata else 0,
               moe_intermediate_size=m.need("expert_feed_forward_length", int),
               shared_expert_intermediate_size=m.need("expert_shared_feed_forward_length", int),
               rope_parameters={"rope_type": "default", "rope_theta": float(m.get("rope.freq_base", 10000.0, kind=float)),
                                "partial_rotary_factor": rot / head_dim})
    for l in range(L):
        info = tensors.get(f"blk.{l}.ffn_up_exps.weight")
        if info is None or len(info.shape) != 3 or info.shape[2] != experts:
            raise ConvertError(f"{g.path}: blk.{l}.ffn_up_exps.weight must hold {experts} experts "
                               f"({ARCH}.expert_count); it is {None if info is None else list(info.shape)}")
    return "qwen3_5_moe", cfg


def mtp_tensors(g, cfg):
    """The GGUF tensors of the MTP layers (blk.N with N >= the text model's layer count)."""
    L = cfg["num_hidden_layers"]
    return [n for n in g.tensors if n.startswith("blk.") and n.split(".")[1].isdigit() and int(n.split(".")[1]) >= L]


def _hf_heads(nk, nv):
    """GGUF head index of each HF value head: HF head k*r + j sits at tiled position j*nk + k."""
    r = nv // nk
    return [(h % r) * nk + h // r for h in range(nv)]


def _rows(heads, hd, start=0):
    return [start + heads[h] * hd + i for h in range(len(heads)) for i in range(hd)]


def rewrites(cfg, name, hf, shape):
    """How tensor `name` is read back: (HF shape, rows, scratch) where rows lists the GGUF row
    of each HF row (None: in order) and scratch is (op, indices) for undone(): op 'log_neg',
    'minus_one', 'cols' (a column order) or None (the elements in another order)."""
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    heads = _hf_heads(nk, nv)
    tiled = nk != nv
    kind = name.split(".", 2)[2] if name.startswith("blk.") else name
    if kind == "ssm_conv1d.weight":
        qk = 2 * nk * dk
        return [shape[0], 1, shape[1]], (list(range(qk)) + _rows(heads, dv, qk)) if tiled else None, None
    if kind == "attn_qkv.weight" and tiled:
        qk = 2 * nk * dk
        return shape, list(range(qk)) + _rows(heads, dv, qk), None
    if kind == "attn_gate.weight" and tiled:
        return shape, _rows(heads, dv), None
    if kind in ("ssm_alpha.weight", "ssm_beta.weight") and tiled:
        return shape, _rows(heads, 1), None
    if kind == "ssm_a":
        return shape, None, ("log_neg", heads)
    if kind == "ssm_dt.bias":
        return shape, None, (None, heads) if tiled else None
    if kind == "ssm_out.weight" and tiled:
        return shape, None, ("cols", _rows(heads, dv))
    if hf.endswith("norm.weight") and kind != "ssm_norm.weight":
        return shape, None, ("minus_one", None)
    return shape, None, None


def _floats(g, info):
    """Every value of a tensor (an F32 / F16 / BF16 one read here, a block type by the engine)."""
    if info.type_name not in ("F32", "F16", "BF16"):
        with tempfile.TemporaryDirectory() as d:
            gguf_dequant.to_f32(g, [(info, 0)], Path(d) / "t.f32", info.name)
            return array.array("f", (Path(d) / "t.f32").read_bytes())
    n, size = info.n_elements, 4 if info.type_name == "F32" else 2
    with open(g.file_of(info), "rb") as f:
        f.seek(info.offset)
        raw = f.read(n * size)
    if info.type_name == "BF16":  # the top half of a float32
        return struct.unpack(f"<{n}f", b"".join(b"\0\0" + raw[i:i + 2] for i in range(0, len(raw), 2)))
    return struct.unpack(f"<{n}{'f' if size == 4 else 'e'}", raw)


def _f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _log_of_exp(y):
    """A float32 a whose float32 exp is y to a step, the one with the shortest mantissa: exp maps
    several float32 values onto one (and float32 exp implementations differ by a step), and
    checkpoints ship A_log in bf16, so that value is the checkpoint's own where log(y) alone
    comes out a step off."""
    a = _f32(math.log(y))
    ulp = math.ulp(_f32(y)) * 2 ** 29  # one float32 step at y
    bits = struct.unpack("<i", struct.pack("<f", a))[0]
    best = None
    for d in range(-8, 9):
        c = struct.unpack("<f", struct.pack("<i", bits + d))[0]
        if abs(_f32(math.exp(c)) - y) <= ulp:  # float32 exp is not correctly rounded everywhere
            m = (bits + d) & 0x7FFFFF
            zeros = 23 if m == 0 else (m & -m).bit_length() - 1
            if best is None or (zeros, -abs(d)) > best[0]:
                best = ((zeros, -abs(d)), c)
    return a if best is None else best[1]


def check(g, info, how):
    """Refuses, before any shard is written, an ssm_a that is not -exp of anything."""
    if how[0] == "log_neg" and any(v >= 0 for v in _floats(g, info)):
        raise ConvertError(f"{g.path}: {info.name} must hold -exp(A_log) (all negative); the file is damaged")


def _runs(idx):
    """A column order as (first, end) runs of consecutive source columns (whole heads)."""
    runs = []
    for i in idx:
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return runs


def _undo(f, off, how, rows, cols):
    """Rewrites rows x cols float32 values at off in f (the tensor's dequantized values) as HF has them."""
    op, idx = how
    rb = cols * 4
    step = max(1, (4 << 20) // rb)  # ~4 MiB of rows at a time: bounded RAM for any tensor
    runs = [(a * 4, b * 4) for a, b in _runs(idx)] if idx is not None else None
    for r0 in range(0, rows, step):
        n = min(step, rows - r0)
        f.seek(off + r0 * rb)
        raw = memoryview(f.read(n * rb))
        if runs is not None:  # whole heads move: byte slices, not values
            raw = memoryview(b"".join(raw[r * rb + a:r * rb + b] for r in range(n) for a, b in runs))
        if op == "log_neg":
            raw = array.array("f", [_log_of_exp(-v) for v in raw.cast("f")]).tobytes()
        elif op == "minus_one":
            raw = array.array("f", [v - 1.0 for v in raw.cast("f")]).tobytes()  # exact in float32
        f.seek(off + r0 * rb)
        f.write(raw)


def write_scratch(g, path, pieces):
    """pieces: [(offset, info, how, rows, cols)] -> one f32 file: every tensor dequantized to
    its offset by the engine, then its values put back in place."""
    for off, info, how, rows, cols in pieces:
        assert rows * cols == info.n_elements, info.name
    gguf_dequant.to_f32(g, [(info, off) for off, info, *_ in pieces], path, "the DeltaNet tensors and norms")
    with open(path, "r+b") as f:
        for off, info, how, rows, cols in pieces:
            _undo(f, off, how, rows, cols)


def gated_q_sources(cfg, sources):
    """The planner splits each full-attention q_proj (heads x (query, gate)) into two outputs;
    each is read as rows of the GGUF attn_q, which llama.cpp stores unchanged."""
    nh, hd = cfg["num_attention_heads"], cfg["head_dim"]
    for hf in [n for n in sources if n.endswith(".self_attn.q_proj.weight")]:
        info, row0, _ = sources[hf]
        query, gate = qwen35.gated_q_names(hf[:-len(".self_attn.q_proj.weight")])
        for name, half in ((query, 0), (gate, 1)):
            sources[name] = (info, row0, ("rows", [(2 * h + half) * hd + i for h in range(nh) for i in range(hd)]))
