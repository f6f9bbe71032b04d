"""Stdlib reading and writing of safetensors headers (tensor bytes are moved by the engine)."""
import json
import os
import struct

DTYPE_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
              "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}
MAX_HEADER = 256 << 20


class SafetensorsError(ValueError):
    pass


def read_raw_header(path):
    """Returns (header dict, data_start, file_size) after checking the length prefix and JSON."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise SafetensorsError(f"{path}: {size} bytes, too short for a safetensors header; the file is truncated")
        (hlen,) = struct.unpack("<Q", raw)
        if hlen > MAX_HEADER or hlen > size - 8:
            raise SafetensorsError(f"{path}: header length {hlen} exceeds the file ({size} bytes); "
                                   "the file is truncated or not safetensors")
        body = f.read(hlen)
    try:
        header = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: bad safetensors header JSON ({e})") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: safetensors header is not a JSON object")
    return header, 8 + hlen, size


def read_header(path):
    """Returns (tensors, data_start) where tensors maps name -> dict(dtype, shape, offset, nbytes).

    Offsets are absolute file offsets. Every entry is validated against the file size."""
    header, start, size = read_raw_header(path)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (a, b) = info["dtype"], [int(s) for s in info["shape"]], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise SafetensorsError(f"{path}: tensor '{name}' has a malformed entry") from None
        count = 1
        for s in shape:
            if s < 0:
                raise SafetensorsError(f"{path}: tensor '{name}' has a negative dimension")
            count *= s
        # F4: torch's float4_e2m1fn_x2, two values per byte, the shape counting values
        nbytes = (count + 1) // 2 if dtype == "F4" else count * DTYPE_SIZE.get(dtype, 0)
        if (dtype not in DTYPE_SIZE and dtype != "F4") or not (0 <= a <= b <= size - start) or b - a != nbytes:
            raise SafetensorsError(f"{path}: tensor '{name}' ({dtype} {shape}, bytes {a}..{b}) does not fit the file")
        out[name] = {"dtype": dtype, "shape": shape, "offset": start + a, "nbytes": b - a}
    return out, start


def build_header(entries, metadata):
    """entries: list of (name, dtype, shape, nbytes) in file order. Returns (header bytes incl.
    the 8-byte length, data offsets per name). The header is padded so data starts 64-aligned."""
    table, pos, offsets = {"__metadata__": metadata}, 0, {}
    for name, dtype, shape, nbytes in entries:
        table[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + nbytes]}
        offsets[name] = pos
        pos += nbytes
    body = json.dumps(table, separators=(",", ":")).encode()
    body += b" " * ((-(len(body) + 8)) % 64)
    return struct.pack("<Q", len(body)) + body, offsets, pos
