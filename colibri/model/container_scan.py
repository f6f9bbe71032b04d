"""What a container holds, from its manifest and safetensors headers only (no weights read).

Shared by `coli plan`, `coli doctor` and `coli info`. The rules mirror docs/container.md and
the engine's loader (c/io/container.c, c/io/safetensors.c) so a problem is named before the engine
trips over it. Stdlib only.
"""
import json
import re
from pathlib import Path

from family_registry import TENSOR_CLASSES  # one table for every tool
from colibri.limits import STORAGE_DTYPE, row_bytes
from colibri.convert.safetensors_io import DTYPE_SIZE, SafetensorsError  # shared with the converter
from colibri.convert.safetensors_io import read_raw_header as _read_raw_header
from colibri.family import specs as family_specs
import family_registry

FORMAT_VERSION = 1

# a routed expert's projections (block_sparse_moe: Mixtral, MiniMax-M2); their biases (gpt-oss) are
# small f32 tensors the engine keeps resident
EXPERT_RE = re.compile(r"^model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(?!.*\.bias$)")
LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.")


class ContainerError(ValueError):
    """The directory is not a usable container; the message says what to do."""


def tensor_class(name):
    for cls, rx in TENSOR_CLASSES:
        if rx.search(name):
            return cls
    return "other"


def read_manifest(model_dir):
    d = Path(model_dir)
    path = d / "colibri.json"
    if path.exists() and not path.is_file():
        raise ContainerError(f"{path} is not a regular file; re-run coli convert")
    if not path.is_file():
        hint = (f"it is a Hugging Face checkpoint; convert it: coli convert {d} OUT" if (d / "config.json").is_file()
                else "convert a checkpoint with: coli convert SRC OUT")
        raise ContainerError(f"{d} has no colibri.json; {hint}")
    try:
        man = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ContainerError(f"{path} is unreadable ({e}); re-run coli convert") from None
    if not isinstance(man, dict) or man.get("format") != "colibri-container":
        raise ContainerError(f"{path} is not a colibri container manifest; re-run coli convert")
    if man.get("format_version") != FORMAT_VERSION:
        raise ContainerError(f"{path}: container format version {man.get('format_version')}, this colibri reads "
                             f"version {FORMAT_VERSION}; re-run coli convert")
    shards = man.get("shards")
    if not isinstance(shards, list) or not shards or not all(isinstance(s, str) for s in shards):
        raise ContainerError(f"{path} lists no shards; re-run coli convert")
    for s in shards:
        if "/" in s or s.startswith("."):
            raise ContainerError(f"{path}: shard entry '{s}' is not a plain file name; re-run coli convert")
    if not isinstance(man.get("arch"), dict):
        raise ContainerError(f"{path} has no arch object; re-run coli convert")
    return man


def read_raw_header(path):
    """Returns (header dict, data_start, file_size); raises ContainerError for what the engine would refuse."""
    try:
        return _read_raw_header(path)
    except SafetensorsError as e:
        raise ContainerError(str(e)) from None


def storage_table(header, path):
    """The shard's colibri.tensors metadata: name -> [storage, rows, cols]."""
    meta = header.get("__metadata__")
    if not isinstance(meta, dict) or "colibri.tensors" not in meta:
        raise ContainerError(f"{path}: no colibri.tensors metadata; the shard was not written by coli convert")
    try:
        table = json.loads(meta["colibri.tensors"])
    except (TypeError, json.JSONDecodeError) as e:
        raise ContainerError(f"{path}: colibri.tensors metadata is not valid JSON ({e})") from None
    if not isinstance(table, dict):
        raise ContainerError(f"{path}: colibri.tensors metadata is not a JSON object")
    return table


def check_entries(header, data_start, size, path):
    """Validates every tensor entry; returns (tensors, problems). tensors: name -> dict(dtype, shape,
    offset, nbytes) with absolute offsets; problems: messages for each bad entry (all, not the first)."""
    tensors, problems = {}, []
    data_size = size - data_start
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
            shape = [int(s) for s in shape]
            a, b = (int(x) for x in offs)
        except (KeyError, TypeError, ValueError):
            problems.append(f"tensor '{name}' lacks a usable dtype, shape or data_offsets")
            continue
        if dtype not in DTYPE_SIZE:
            problems.append(f"tensor '{name}' has unknown dtype '{dtype}'")
            continue
        if any(s < 0 for s in shape) or a < 0 or b < a:
            problems.append(f"tensor '{name}' has a negative dimension or bad data_offsets")
            continue
        if b > data_size:
            problems.append(f"tensor '{name}' ends at byte {b} past the end of the data ({data_size} bytes); "
                            "the file is truncated")
            continue
        count = 1
        for s in shape:
            count *= s
        if count * DTYPE_SIZE[dtype] != b - a:
            problems.append(f"tensor '{name}' has {b - a} bytes but {dtype} {shape} needs {count * DTYPE_SIZE[dtype]}")
            continue
        tensors[name] = {"dtype": dtype, "shape": shape, "offset": data_start + a, "nbytes": b - a}
    order = sorted(tensors.items(), key=lambda kv: kv[1]["offset"])
    for (n1, t1), (n2, t2) in zip(order, order[1:]):
        if t2["offset"] < t1["offset"] + t1["nbytes"]:
            problems.append(f"tensors '{n1}' and '{n2}' overlap")
    return tensors, problems


def check_storage(name, t, entry):
    """Compares a tensor's stored dtype/shape with its colibri.tensors entry (as the engine does)."""
    if (not isinstance(entry, list) or len(entry) != 3 or entry[0] not in STORAGE_DTYPE
            or not all(isinstance(x, int) and x >= 1 for x in entry[1:])):
        return f"tensor '{name}' has no valid [storage, rows, cols] entry in colibri.tensors"
    storage, rows, cols = entry
    dtype = STORAGE_DTYPE[storage]
    try:
        want_cols = row_bytes(storage, cols) if dtype == "U8" else cols
    except ValueError as e:  # a low-bit row of partial blocks
        return f"tensor '{name}': {e}"
    shape = t["shape"]
    ok = t["dtype"] == dtype and (shape == [rows, want_cols] or (rows == 1 and shape == [want_cols]))
    if not ok:
        return f"tensor '{name}' is stored as {t['dtype']} {shape} but declared {storage} [{rows}, {cols}]"
    return None


PAGE = 4096


def expert_slot_bytes(segs):
    """What one expert cache slot holds for an expert stored as segs [(shard, offset, bytes)]:
    one read of the whole range when its tensors sit together in one shard (what coli convert
    writes), else one read per tensor; each read lands as its enclosing O_DIRECT-aligned range
    (c/experts/expert_store.c, expert_geom and seg_room)."""
    room = lambda n: (n + PAGE - 1) // PAGE * PAGE + PAGE  # noqa: E731
    lo, hi = min(o for _, o, _ in segs), max(o + n for _, o, n in segs)
    total = sum(n for _, _, n in segs)
    if len({f for f, _, _ in segs}) == 1 and hi - lo <= total + PAGE:
        return room(hi - lo)
    return sum(room(n) for _, _, n in segs)


def scan(model_dir):
    """Summarizes a container's bytes by tensor class. Raises ContainerError on the first problem."""
    d = Path(model_dir)
    man = read_manifest(d)
    arch = man["arch"]
    classes, shards, elems = {}, [], {}
    per_expert = {}  # (layer, expert) -> [bytes, elements]
    segments = {}    # (layer, expert) -> [(shard index, offset, bytes)] of its tensors
    dense_f32 = 0
    mtp_expert, mtp_segments = {}, {}  # (layer, expert) -> [bytes, F32 bytes]; its byte ranges
    total_tensors = 0
    for k, s in enumerate(man["shards"]):
        p = d / s
        if not p.is_file():
            raise ContainerError(f"{p}: shard listed in colibri.json is missing; re-run coli convert")
        header, start, size = read_raw_header(p)
        tensors, problems = check_entries(header, start, size, p)
        if problems:
            raise ContainerError(f"{p}: {problems[0]}; run `coli doctor --deep` for every problem")
        table = storage_table(header, p)
        for name, t in tensors.items():
            entry = table.get(name)
            n_el = entry[1] * entry[2] if isinstance(entry, list) and len(entry) == 3 else \
                t["nbytes"] // DTYPE_SIZE[t["dtype"]]
            m = EXPERT_RE.match(name) or LAYER_RE.match(name)
            mtp = bool(m) and int(m.group(1)) >= int(arch.get("num_layers") or 1 << 30)
            cls = "mtp" if mtp else tensor_class(name)  # kept, never run: neither trunk nor streamed
            classes[cls] = classes.get(cls, 0) + t["nbytes"]
            elems[cls] = elems.get(cls, 0) + n_el
            m = EXPERT_RE.match(name)
            if m and mtp:  # the MTP head's experts: streamed like the trunk's when it drafts (--draft mtp)
                acc = mtp_expert.setdefault((int(m.group(1)), int(m.group(2))), [0, 0])
                acc[0] += t["nbytes"]
                acc[1] += t["nbytes"] if t["dtype"] == "F32" else 0
                mtp_segments.setdefault((int(m.group(1)), int(m.group(2))), []).append((k, t["offset"], t["nbytes"]))
            if mtp:
                m = None
            if m:
                acc = per_expert.setdefault((int(m.group(1)), int(m.group(2))), [0, 0])
                acc[0] += t["nbytes"]
                acc[1] += n_el
                segments.setdefault((int(m.group(1)), int(m.group(2))), []).append((k, t["offset"], t["nbytes"]))
            elif t["dtype"] == "F32":
                dense_f32 += t["nbytes"]
        total_tensors += len(tensors)
        shards.append({"file": s, "bytes": size, "tensors": len(tensors), "data_start": start})
    layer_bytes, layer_experts = {}, {}
    for (layer, _e), (b, _n) in per_expert.items():
        layer_bytes[layer] = layer_bytes.get(layer, 0) + b
        layer_experts[layer] = layer_experts.get(layer, 0) + 1
    n_exp = len(per_expert)
    expert_bytes = classes.get("expert", 0)
    layer_kinds = arch.get("layer_mlp") or []
    tok = d / "tokenizer.json"
    return {
        "dir": str(d),
        "manifest": man,
        "tokenizer_bytes": tok.stat().st_size if tok.is_file() else 0,
        "family": man.get("family"),
        "converter_version": man.get("converter_version"),
        "format_version": man.get("format_version"),
        "quant": man.get("quant", {}),
        "arch": {
            "layers": arch.get("num_layers"), "hidden": arch.get("hidden_size"), "heads": arch.get("num_heads"),
            "kv_heads": arch.get("num_kv_heads"), "head_dim": arch.get("head_dim"), "vocab": arch.get("vocab_size"),
            "max_ctx": arch.get("max_position_embeddings"), "experts": arch.get("num_experts") or 0,
            "top_k": arch.get("num_experts_per_tok") or 0,
            "intermediate": arch.get("intermediate_size") or 0,
            "moe_intermediate": arch.get("moe_intermediate_size") or 0,
            "moe_layers": [i for i, k in enumerate(layer_kinds) if k == "moe"],
            "tied_embeddings": bool(arch.get("tie_word_embeddings")),
        },
        "shards": shards,
        "file_bytes": sum(s["bytes"] for s in shards),
        "tensor_count": total_tensors,
        "tensor_bytes": sum(classes.values()),
        "classes": dict(sorted(classes.items())),
        "class_elements": dict(sorted(elems.items())),
        "dense_bytes": sum(v for k, v in classes.items() if k not in ("expert", "mtp")),
        "expert_bytes": expert_bytes,
        "dense_f32_bytes": dense_f32,  # the engine copies these out of the mapping (norms, routers, biases)
        "mtp_experts": {  # the MTP layers' routed experts (kept in the "mtp" class)
            "layers": len({layer for layer, _ in mtp_expert}),
            "per_layer": max((sum(1 for l2, _ in mtp_expert if l2 == layer) for layer, _ in mtp_expert), default=0),
            "bytes": sum(b for b, _ in mtp_expert.values()),
            "f32_bytes": sum(f for _, f in mtp_expert.values()),
            "slot_bytes": max((expert_slot_bytes(v) for v in mtp_segments.values()), default=0),
        },
        "experts": {
            "slot_bytes": max((expert_slot_bytes(v) for v in segments.values()), default=0),
            "count": n_exp,
            "layers": len(layer_bytes),
            "per_layer": max(layer_experts.values()) if layer_experts else 0,
            "bytes_per_layer": {str(k): v for k, v in sorted(layer_bytes.items())},
            "bytes_each": expert_bytes // n_exp if n_exp else 0,
            "max_bytes_each": max((b for b, _ in per_expert.values()), default=0),
            "elements_each": sum(n for _, n in per_expert.values()) // n_exp if n_exp else 0,
        },
        "kv_bytes_per_token": kv_bytes_per_token(arch, man.get("family"), layers=_layers(man)),
        "kv_fixed_bytes": _kv_fixed(man),
        "kv_values_per_token": _kv_values(man),
        "kv_f32_bytes_per_token": family_registry_f32(_layers(man)),
        "kv_layers": _layers(man) and [(s.get("attn") or {}).get("state") or {} for s in _layers(man)],
    }


def _layers(man):
    try:
        return family_specs.manifest_layers(man)
    except (KeyError, TypeError, ValueError):
        return None


def _kv_values(man):
    layers = _layers(man)
    return family_specs.kv_values_per_token(layers) if layers else 0


def family_registry_f32(layers):
    return family_specs.kv_f32_bytes_per_token(layers) if layers else 0


def _kv_fixed(man):
    layers = _layers(man)
    return family_specs.kv_fixed_bytes(layers) if layers else 0


def kv_bytes_per_token(arch, family=None, kv=None, layers=None):
    """Bytes of KV state one token takes in one slot: the sum of the layers' state descriptors
    (colibri.json "layers"; for an older manifest, the specs its arch implies)."""
    kv = kv or family_registry.KV_DEFAULT
    return family_specs.kv_bytes_per_token(arch, family, kv=kv, layers=layers)