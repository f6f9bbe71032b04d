"""gpt-oss expert tensors -> per-expert gate/up/down (+ biases) in the container.

transformers keeps each layer's experts fused and transposed: gate_up_proj [E, H, 2I] (x @ W,
gate and up interleaved on the last axis: gate = [..., ::2], up = [..., 1::2]),
gate_up_proj_bias [E, 2I] (interleaved the same way), down_proj [E, I, H], down_proj_bias [E, H].
The releases ship the projections as MXFP4 instead: NAME_blocks [E, rows, in/32, 16] (uint8, two
e2m1 values per byte, the low nibble first) and NAME_scales [E, rows, in/32] (uint8 e8m0, 2^(s -
127) per 32 values), with rows = output channels (gate and up interleaved row by row).
Every output tensor is one gather job for the engine's convert-jobs: a strided read
("gather" rows step, column step, in elements) or MXFP4 rows ("mxfp4" scales file, offset, row
step); nothing is materialised here."""
from colibri.errors import ConvertError

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
