"""Crafted KV state files (the format kv_persist.c writes) for tests of the restore path."""
import json
import struct
from pathlib import Path

MAGIC = b"COLIKV01"
FNV_OFFSET, FNV_PRIME = 1469598103934665603, 1099511628211


def fnv(data, h=FNV_OFFSET):
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def fingerprint(model_dir):
    """What the engine stamps into a model's KV files: FNV-1a of its colibri.json."""
    return fnv((Path(model_dir) / "colibri.json").read_bytes())


def geometry(model_dir):
    arch = json.loads((Path(model_dir) / "colibri.json").read_text())["arch"]
    return arch["num_kv_heads"] * arch["head_dim"], arch["num_layers"]


def craft(path, model_dir, n, body=b"", fp=None, checksum=True):
    """A header for this model claiming n positions, then body, then the file's checksum."""
    kv_dim, layers = geometry(model_dir)
    head = MAGIC + struct.pack("<QIIII", fingerprint(model_dir) if fp is None else fp, n, kv_dim, layers, 0)
    data = head + body
    Path(path).write_bytes(data + (struct.pack("<Q", fnv(data)) if checksum else b""))
