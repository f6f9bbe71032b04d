"""Stdlib reader for GGUF files (versions 2 and 3, little-endian): header, metadata key/values of
every type (arrays included, nested too), tensor infos and the aligned data section.

Every count, length and offset is checked against the file before it is used, so a truncated
or hostile file is refused with a GGUFError naming the problem instead of allocating or reading
past the end. Tensor bytes are not read; callers get absolute offsets and sizes.
"""
import mmap
import os
import re
import struct
from pathlib import Path

MAGIC = b"GGUF"
MAX_DIMS = 4                  # GGML_MAX_DIMS
MAX_STRING = 256 << 20        # no real key or value comes near this
MAX_ARRAY_DEPTH = 8
DEFAULT_ALIGNMENT = 32

# metadata value types: id -> (name, struct format or None)
VALUE_TYPES = {
    0: ("UINT8", "<B"), 1: ("INT8", "<b"), 2: ("UINT16", "<H"), 3: ("INT16", "<h"), 4: ("UINT32", "<I"),
    5: ("INT32", "<i"), 6: ("FLOAT32", "<f"), 7: ("BOOL", "<B"), 8: ("STRING", None), 9: ("ARRAY", None),
    10: ("UINT64", "<Q"), 11: ("INT64", "<q"), 12: ("FLOAT64", "<d"),
}

# ggml tensor types: id -> (name, elements per block, bytes per block). The full table, so any
# file's tensor sizes can be validated even where the converter does not support the type.
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}


class GGUFError(ValueError):
    pass


class TensorInfo:
    """One tensor: its bytes are nbytes at offset (from the start of the file) in file `path`
    (a part of a split model, or the one file)."""
    __slots__ = ("name", "type", "type_name", "shape", "offset", "nbytes", "n_elements", "path")

    def __init__(self, name, ttype, shape, offset, nbytes, n_elements, path=None):
        self.name, self.type, self.shape, self.path = name, ttype, shape, path
        self.type_name = GGML_TYPES[ttype][0]
        self.offset, self.nbytes, self.n_elements = offset, nbytes, n_elements

    def __repr__(self):
        return f"TensorInfo({self.name!r}, {self.type_name}, ne={self.shape}, offset={self.offset})"


class GGUFFile:
    """version, metadata (key -> value; arrays are lists), value_types (key -> type name, e.g.
    'ARRAY[STRING]'), tensors (name -> TensorInfo, file order kept), alignment, data_start;
    parts: the files of a split model in order (just path for one file)."""

    def __init__(self, path):
        self.path = str(path)
        self.parts = [self.path]
        self.version = 0
        self.metadata, self.value_types, self.tensors = {}, {}, {}
        self.alignment = DEFAULT_ALIGNMENT
        self.data_start = 0
        self.file_size = 0

    def get(self, key, default=None):
        return self.metadata.get(key, default)

    def file_of(self, info):
        """The absolute path of the file holding tensor info's bytes."""
        return str(Path(info.path or self.path).resolve())


class _Cursor:
    def __init__(self, buf, path):
        self.buf, self.pos, self.size, self.path = buf, 0, len(buf), path

    def fail(self, what):
        raise GGUFError(f"{self.path}: {what} (at byte {self.pos} of {self.size})")

    def need(self, n, what):
        if n < 0 or self.pos + n > self.size:
            self.fail(f"{what} runs past the end of the file; it is truncated or not a GGUF file")

    def unpack(self, fmt, size, what):
        self.need(size, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return v

    def u32(self, what):
        return self.unpack("<I", 4, what)

    def u64(self, what):
        return self.unpack("<Q", 8, what)

    def string(self, what):
        n = self.u64(f"length of {what}")
        if n > MAX_STRING:
            self.fail(f"{what} claims {n} bytes, more than the {MAX_STRING} byte limit")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what} is not valid UTF-8")

    def value(self, vtype, what, depth=0):
        if vtype not in VALUE_TYPES:
            self.fail(f"{what} has unknown value type {vtype}")
        name, fmt = VALUE_TYPES[vtype]
        if fmt:
            v = self.unpack(fmt, struct.calcsize(fmt), what)
            if name == "BOOL":
                if v > 1:
                    self.fail(f"{what} is a bool with value {v}")
                return bool(v)
            return v
        if name == "STRING":
            return self.string(what)
        if depth >= MAX_ARRAY_DEPTH:
            self.fail(f"{what}: arrays nested more than {MAX_ARRAY_DEPTH} deep")
        etype = self.u32(f"element type of {what}")
        count = self.u64(f"element count of {what}")
        if etype not in VALUE_TYPES:
            self.fail(f"{what} is an array of unknown value type {etype}")
        efmt = VALUE_TYPES[etype][1]
        min_size = struct.calcsize(efmt) if efmt else (8 if VALUE_TYPES[etype][0] == "STRING" else 12)
        if count * min_size > self.size - self.pos:
            self.fail(f"{what} claims {count} elements, more than the rest of the file can hold")
        if efmt and VALUE_TYPES[etype][0] != "BOOL":  # fixed-size numbers: one unpack
            n = struct.calcsize(efmt)
            vals = list(struct.unpack_from(f"<{count}{efmt[1]}", self.buf, self.pos))
            self.pos += n * count
            return vals
        return [self.value(etype, f"{what}[{i}]", depth + 1) for i in range(count)]


SPLIT_NAME = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")  # llama.cpp's gguf-split: PREFIX-00001-of-00003.gguf


def read_gguf(path):
    """Parses the header, metadata and tensor infos of a GGUF file, or of every part of a split
    model given its first part (gguf-split's PREFIX-00001-of-0000N.gguf, `split.*` metadata):
    the metadata is the first part's, the tensors those of all parts. Raises GGUFError."""
    g = _read_one(path)
    count = g.metadata.get("split.count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise GGUFError(f"{g.path}: split.count {count!r} is not a positive count")
    if count == 1:
        return g
    return _read_split(g, count)


def _read_split(g, count):
    if g.metadata.get("split.no") != 0:
        first = SPLIT_NAME.match(Path(g.path).name)
        hint = f" ({first.group(1)}-00001-of-{first.group(3)}.gguf)" if first else ""
        raise GGUFError(f"{g.path}: part {g.metadata.get('split.no', '?')!r} of a model split in {count}; "
                        f"give the first part{hint}")
    m = SPLIT_NAME.match(Path(g.path).name)
    if not m or int(m.group(3)) != count:
        raise GGUFError(f"{g.path}: a split model's first part ({count} parts) must be named "
                        f"PREFIX-00001-of-{count:05d}.gguf so its other parts can be found")
    parts = [g.path] + [str(Path(g.path).with_name(f"{m.group(1)}-{i:05d}-of-{count:05d}.gguf")) for i in range(2, count + 1)]
    for i, part in enumerate(parts[1:], 1):
        if not os.path.exists(part):
            raise GGUFError(f"{g.path}: part {i + 1} of {count}, {part}, is missing")
        p = _read_one(part)
        if p.metadata.get("split.count") != count or p.metadata.get("split.no") != i:
            raise GGUFError(f"{part}: not part {i + 1} of {count} of {g.path} (its split.no "
                            f"{p.metadata.get('split.no')!r}, split.count {p.metadata.get('split.count')!r})")
        for name, info in p.tensors.items():
            if name in g.tensors:
                raise GGUFError(f"{part}: tensor '{name}' is also in {g.tensors[name].path}")
            g.tensors[name] = info
    want = g.metadata.get("split.tensors.count")
    if want is not None and want != len(g.tensors):
        raise GGUFError(f"{g.path}: the {count} parts hold {len(g.tensors)} tensors; split.tensors.count says {want}")
    g.parts = parts
    return g


def _read_one(path):
    path = str(path)
    try:
        size = os.path.getsize(path)
        f = open(path, "rb")
    except OSError as e:
        raise GGUFError(f"{path}: {e.strerror}") from None
    with f:
        if size < 24:
            raise GGUFError(f"{path}: {size} bytes is too short to be a GGUF file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(buf, path, size)


def _parse(buf, path, size):
    c = _Cursor(buf, path)
    g = GGUFFile(path)
    g.file_size = size
    if bytes(buf[0:4]) != MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (magic {bytes(buf[0:4])!r}, expected b'GGUF')")
    c.pos = 4
    version = c.u32("version")
    if version in (2, 3):
        g.version = version
    elif version == 1:
        raise GGUFError(f"{path}: GGUF version 1 is not supported (only 2 and 3); re-export the file with a current llama.cpp")
    elif version & 0xFFFF == 0 and (version >> 16) in (0x100, 0x200, 0x300):
        raise GGUFError(f"{path}: big-endian GGUF files are not supported")
    else:
        raise GGUFError(f"{path}: unknown GGUF version {version} (supported: 2, 3)")
    n_tensors = c.u64("tensor count")
    n_kv = c.u64("metadata count")
    # the smallest key/value is 8 (key length) + 1 + 4 (type) + 1 bytes; the smallest tensor
    # info 8 + 1 + 4 + 8 + 4 + 8
    if n_kv * 14 > size - c.pos:
        c.fail(f"metadata count {n_kv} is more than the file can hold")
    if n_tensors * 33 > size - c.pos:
        c.fail(f"tensor count {n_tensors} is more than the file can hold")
    for i in range(n_kv):
        key = c.string(f"key of metadata entry {i}")
        if not key:
            c.fail(f"metadata entry {i} has an empty key")
        if key in g.metadata:
            c.fail(f"metadata key '{key}' appears twice")
        vtype = c.u32(f"value type of '{key}'")
        start = c.pos
        g.metadata[key] = c.value(vtype, f"metadata '{key}'")
        name = VALUE_TYPES[vtype][0]
        if name == "ARRAY":
            name += f"[{VALUE_TYPES[struct.unpack_from('<I', buf, start)[0]][0]}]"
        g.value_types[key] = name
    align = g.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(align, int) or isinstance(align, bool) or align < 1 or align & (align - 1) or align > 1 << 20:
        raise GGUFError(f"{path}: general.alignment {align!r} is not a power of two up to 1 MiB")
    g.alignment = align
    infos = []
    for i in range(n_tensors):
        name = c.string(f"name of tensor {i}")
        n_dims = c.u32(f"dimension count of tensor '{name}'")
        if not 1 <= n_dims <= MAX_DIMS:
            c.fail(f"tensor '{name}' has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        shape = [c.u64(f"dimension {d} of tensor '{name}'") for d in range(n_dims)]
        ttype = c.u32(f"type of tensor '{name}'")
        offset = c.u64(f"offset of tensor '{name}'")
        infos.append((name, shape, ttype, offset))
    data_start = (c.pos + align - 1) // align * align
    if data_start > size:
        c.fail("the tensor data section starts past the end of the file")
    g.data_start = data_start
    spans = []
    for name, shape, ttype, offset in infos:
        if name in g.tensors:
            raise GGUFError(f"{path}: tensor '{name}' appears twice")
        if ttype not in GGML_TYPES:
            raise GGUFError(f"{path}: tensor '{name}' has unknown ggml type {ttype}")
        tname, block, bsize = GGML_TYPES[ttype]
        n = 1
        for d in shape:
            if d < 1:
                raise GGUFError(f"{path}: tensor '{name}' has a zero dimension ({shape})")
            n *= d
        if shape[0] % block:
            raise GGUFError(f"{path}: tensor '{name}' ({tname}) has rows of {shape[0]} elements, "
                            f"not a multiple of its block size {block}")
        nbytes = n // block * bsize
        if offset % align:
            raise GGUFError(f"{path}: tensor '{name}' offset {offset} is not a multiple of the alignment {align}")
        if offset + nbytes > size - data_start:
            raise GGUFError(f"{path}: tensor '{name}' ({tname} {shape}, {nbytes} bytes at data offset {offset}) "
                            f"runs past the end of the file; it is truncated")
        g.tensors[name] = TensorInfo(name, ttype, shape, data_start + offset, nbytes, n, path)
        spans.append((offset, offset + nbytes, name))
    spans.sort()
    for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
        if b0 < a1:
            raise GGUFError(f"{path}: tensors '{an}' and '{bn}' overlap")
    return g
