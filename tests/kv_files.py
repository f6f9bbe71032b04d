"""Crafted KV state files (the format kv_persist.c writes) for tests of the restore path."""
import json
import struct
from pathlib import Path

import family_registry  # noqa: E402
from colibri.family import specs as family_specs  # noqa: E402

MAGIC = b"COLIKV02"
QTYPE = {"f32": 0, "bf16": 1, "f16": 2}  # c/kernels/quant.h QType
FNV_OFFSET, FNV_PRIME = 1469598103934665603, 1099511628211


def fnv(data, h=FNV_OFFSET):
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def fingerprint(model_dir):
    """What the engine stamps into a model's KV files: FNV-1a of its colibri.json."""
    return fnv((Path(model_dir) / "colibri.json").read_bytes())


def layout(model_dir, kv):
    """(layers, bytes per position, fixed bytes) summed over the layers' state descriptors."""
    man = json.loads((Path(model_dir) / "colibri.json").read_text())
    states = [family_specs.layer_state(s, kv) for s in family_specs.manifest_layers(man)]
    return len(states), sum(s[0] for s in states), sum(s[1] for s in states)


def craft(path, model_dir, n, body=b"", fp=None, checksum=True, kv=family_registry.KV_DEFAULT):
    """A v2 header for this model claiming n positions, then body, then the file's checksum."""
    layers, per_pos, fixed = layout(model_dir, kv)
    head = MAGIC + struct.pack("<QIIIIQQ", fingerprint(model_dir) if fp is None else fp, n, layers, QTYPE[kv], 0,
                               per_pos, fixed)
    data = head + body
    Path(path).write_bytes(data + (struct.pack("<Q", fnv(data)) if checksum else b""))
