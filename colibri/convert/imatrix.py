"""--imatrix FILE: llama.cpp's importance matrix (the GGUF form of its imatrix tool) weighing the
low-bit writer's errors (c/kernels/lowbit_quantize.h); `--calibrate TEXT` gives the same kind of
statistics from colibri's engine (colibri/cli/calibration.py, read here by read_stats).

Such a file holds, per weight tensor by llama.cpp's name, `<name>.in_sum2` (F32, one row of K
column sums of squared activations per matrix: one matrix, or one per expert) and `<name>.counts`
(the tokens each matrix saw). A column's importance is in_sum2 / counts, the mean square of the
activation it multiplies. An expert the calibration text never reached gets its layer's mean.

The vectors a conversion uses go to one scratch file in the output directory, and each job of a
low-bit tensor names its vector (`\\timportance\\tPATH\\tOFFSET`): the engine reads them, Python
only copies floats through."""
import array
import math
import re
import struct
import sys
from pathlib import Path

from colibri.checksum import sha256_file
from colibri.convert.gguf_names import name_tables
from colibri.convert.gguf_reader import GGUFError, read_gguf
from colibri.errors import ConvertError
from colibri.limits import WRITABLE_LOWBIT

SCRATCH = ".importance.f32"


def gguf_keys(outputs, family):
    """output name -> (llama.cpp tensor name, matrix index) for the outputs llama.cpp names."""
    names, per_layer, expert_prefix, experts = name_tables(family)
    whole = {hf: g for g, hf in names.items()}
    layer = {hf: g for g, hf in per_layer.items()}
    expert = {proj: g for g, proj in experts.items()}
    pat = re.compile(rf"model\.layers\.(\d+)\.(?:{re.escape(expert_prefix)}\.(\d+)\.(\w+)\.weight|(.+))$")
    keys = {}
    for o in outputs:
        m = pat.match(o["name"])
        if o["name"] in whole:
            keys[o["name"]] = (whole[o["name"]], 0)
        elif m and m.group(2) is not None and m.group(3) in expert:
            keys[o["name"]] = (f"blk.{m.group(1)}.{expert[m.group(3)]}", int(m.group(2)))
        elif m and m.group(4) in layer:
            keys[o["name"]] = (f"blk.{m.group(1)}.{layer[m.group(4)]}", 0)
    return keys


def _floats(g, info, what):
    if info.type_name != "F32":
        raise ConvertError(f"{g.path}: imatrix tensor '{info.name}' is {info.type_name}, not F32")
    with open(info.path, "rb") as f:
        f.seek(info.offset)
        a = array.array("f")
        a.frombytes(f.read(info.nbytes))
    if sys.byteorder != "little":
        a.byteswap()
    if not all(math.isfinite(v) and v >= 0 for v in a):
        raise ConvertError(f"{g.path}: imatrix tensor '{info.name}' holds negative or non-finite {what}")
    return a


def _means(g, base):
    """The K x n in_sum2 / counts of one entry: a list of n arrays (None for a matrix no token reached)."""
    s, c = g.tensors.get(base + ".in_sum2"), g.tensors.get(base + ".counts")
    if s is None or c is None:
        raise ConvertError(f"{g.path}: imatrix entry '{base}' lacks its {'counts' if s else 'in_sum2'} tensor")
    k, n = s.shape[0], (s.shape[1] if len(s.shape) > 1 else 1)
    if len(s.shape) > 2 or c.n_elements != n:
        raise ConvertError(f"{g.path}: imatrix entry '{base}': in_sum2 {s.shape} does not match counts {c.shape}")
    sums, counts = _floats(g, s, "sums"), _floats(g, c, "counts")
    return k, [array.array("f", (v / counts[i] for v in sums[i * k:(i + 1) * k])) if counts[i] > 0 else None
               for i in range(n)]


def read(path):
    """The imatrix file's header (a GGUFFile), or ConvertError saying what it is not."""
    try:
        g = read_gguf(path)
    except GGUFError as e:
        raise ConvertError(f"--imatrix: {e} (give the GGUF output of llama.cpp's imatrix tool; a legacy imatrix.dat converts "
                           "with llama.cpp's convert_legacy_imatrix_to_gguf.py)") from None
    kind = g.metadata.get("general.type")
    if kind not in (None, "imatrix") or not any(n.endswith(".in_sum2") for n in g.tensors):
        raise ConvertError(f"{g.path}: not an imatrix file (general.type {kind!r}, no <tensor>.in_sum2 entries)")
    return g


def plan(path, planner, family):
    """Matches the imatrix (llama.cpp's GGUF form, or the statistics of `colibri calibrate`) to
    the conversion's low-bit outputs: (settings fingerprint, a plan for write_scratch). Refuses a
    file that matches none of them, or whose widths are another model's."""
    lowbit = [o for o in planner.outputs if o["qtype"] in WRITABLE_LOWBIT and not o.get("blocks_kept")]
    if not lowbit:
        raise ConvertError("--imatrix weighs the low-bit writers only (--experts/--dense "
                           f"{', '.join(WRITABLE_LOWBIT)}); this conversion stores no tensor in one")
    if is_stats(path):
        matched, means = stats_plan(path, lowbit)
    else:
        matched, means = gguf_plan(path, lowbit, family)
    return {"file": sha256_file(path)}, dict(matched=matched, means=means, outputs=lowbit)


def gguf_plan(path, lowbit, family):
    """llama.cpp's imatrix: output name -> (entry, matrix index), and entry -> its means."""
    g = read(path)
    keys = gguf_keys(lowbit, family)
    matched = {name: key for name, key in keys.items() if key[0] + ".in_sum2" in g.tensors}
    if not matched:
        raise ConvertError(f"{g.path}: none of its entries names a tensor of this model "
                           f"(e.g. {next(n for n in g.tensors if n.endswith('.in_sum2'))[:-8]}); is it another model's?")
    for o in lowbit:
        if o["name"] in matched:
            info = g.tensors[matched[o["name"]][0] + ".in_sum2"]
            if info.shape[0] != o["cols"] or matched[o["name"]][1] >= (info.shape[1] if len(info.shape) > 1 else 1):
                raise ConvertError(f"{g.path}: imatrix entry '{info.name[:-8]}' is {info.shape}; {o['name']} has "
                                   f"{o['cols']} columns: the imatrix is of another model")
    return matched, lambda base: _means(g, base)[1]


STATS_MAGIC = b"COLISTAT"
EXPERT_NAME = re.compile(r"^(.*\.experts)\.(\d+)\.(.+)$")  # one routed expert's matrix in a container


def is_stats(path):
    with open(path, "rb") as f:
        return f.read(len(STATS_MAGIC)) == STATS_MAGIC


def read_stats(path):
    """`colibri calibrate`'s file (c/kernels/act_stats.c): {tensor name: (positions, column sums)}."""
    data = memoryview(Path(path).read_bytes())
    out, o = {}, 16

    def take(n, what):
        nonlocal o
        if o + n > len(data):
            raise ConvertError(f"{path}: truncated at byte {o} ({what}); collect the statistics again")
        o += n
        return data[o - n:o]
    if len(data) < 16 or struct.unpack_from("<I", data, 8)[0] != 1:
        raise ConvertError(f"{path}: not version 1 of colibri's calibration statistics")
    for _ in range(struct.unpack_from("<I", data, 12)[0]):
        name = bytes(take(struct.unpack("<I", take(4, "a name's length"))[0], "a name")).decode("utf-8", "replace")
        cols, positions = struct.unpack("<Id", take(12, f"{name}'s size"))
        sums = array.array("f")
        sums.frombytes(take(4 * cols, f"{name}'s sums"))
        if sys.byteorder != "little":
            sums.byteswap()
        if not (positions > 0 and all(math.isfinite(v) and v >= 0 for v in sums)):
            raise ConvertError(f"{path}: {name} holds negative or non-finite statistics")
        out[name] = (positions, sums)
    return out


def stats_plan(path, lowbit):
    """The engine's statistics name container tensors, which are the outputs' names: each output
    is its own entry, but a routed expert's is (its layer's matrix, expert id), so an expert the
    text never reached can take its layer's mean."""
    stats = read_stats(path)
    matched, members = {}, {}
    for o in lowbit:
        m = EXPERT_NAME.match(o["name"])
        key = (f"{m.group(1)}.{m.group(3)}", int(m.group(2))) if m else (o["name"], 0)
        entry = stats.get(o["name"])
        if entry is not None and len(entry[1]) != o["cols"]:
            raise ConvertError(f"{path}: {o['name']} has {len(entry[1])} columns there and {o['cols']} here: the "
                               "statistics are of another model")
        members.setdefault(key[0], {})[key[1]] = entry
        matched[o["name"]] = key
    if not any(e for group in members.values() for e in group.values()):
        raise ConvertError(f"{path}: none of its statistics names a low-bit tensor of this conversion "
                           f"(e.g. {next(iter(stats), 'no entries')}); are they of another model?")

    def means(base):
        group = members[base]
        n = max(group) + 1
        return [array.array("f", (v / group[i][0] for v in group[i][1])) if group.get(i) else None for i in range(n)]
    return matched, means


def write_scratch(out, p, log):
    """Writes the matched vectors to OUT/.importance.f32 and gives each output its (path, offset)."""
    matched = p["matched"]
    scratch = (out / SCRATCH).resolve()
    offsets, filled = {}, 0
    with open(scratch, "wb") as f:
        for base in sorted({key[0] for key in matched.values()}):
            means = p["means"](base)
            reached = [m for m in means if m is not None]
            if not reached:
                continue  # no token reached any of its matrices: plain least squares
            layer_mean = array.array("f", (sum(col) / len(reached) for col in zip(*reached)))
            for i, m in enumerate(means):
                filled += m is None
                offsets[base, i] = f.tell()
                f.write((m if m is not None else layer_mean).tobytes())
    used = 0
    for o in p["outputs"]:
        off = offsets.get(matched.get(o["name"]))
        if off is not None:
            o["importance"] = (str(scratch), off)
            used += 1
    log(f"imatrix: importance for {used} of {len(p['outputs'])} low-bit tensors"
        + (f" ({filled} matrices no calibration token reached took their layer's mean)" if filled else "")
        + ("; the others: plain least squares" if used < len(p["outputs"]) else ""))
