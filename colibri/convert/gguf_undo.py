"""Tensors whose values llama.cpp's converter rewrote, computed back through one scratch F32 file
next to the output: every such tensor is dequantized there by the engine (from any block type
the importer reads), then its values are put back as the checkpoint had them: `log_neg` (a
stored -exp(a) back to a), `minus_one` (a stored 1 + w back to w), and a column order (whole
heads moved back); the scratch rows are then re-quantized like any float tensor (stdlib only).
Which tensors, and how, is the family module's gguf_rewrites."""
import array
import math
import struct
import tempfile
from pathlib import Path

from colibri.convert import gguf_dequant
from colibri.errors import ConvertError

SCRATCH = "gguf_rewrites.f32.tmp"  # undone tensors, removed once the shards are written


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
