"""tools/gguf_reader.py: agreement with the `gguf` package on a file it writes, every value type,
and hostile input refused with a GGUFError that names the problem (never another exception)."""
import struct

import numpy as np
import pytest
from needs import need

from colibri.convert import gguf_reader
from colibri.convert.gguf_reader import GGUFError, read_gguf

gguf = need("gguf")


def s(text):
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, payload):
    return s(key) + struct.pack("<I", vtype) + payload


def tinfo(name, dims, ttype, offset):
    return s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + \
        struct.pack("<IQ", ttype, offset)


def build(kvs=None, tensors=None, version=3, data=None, align=32, n_kv=None, n_t=None):
    """A GGUF file as bytes: default one F32 [8] tensor and two metadata entries."""
    kvs = kvs if kvs is not None else [kv("general.architecture", 8, s("llama")), kv("x.count", 4, struct.pack("<I", 7))]
    tensors = tensors if tensors is not None else [tinfo("t", [8], 0, 0)]
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_t is None else n_t, len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tensors)
    body += b"\0" * ((-len(body)) % align)
    return body + (data if data is not None else np.arange(8, dtype=np.float32).tobytes())


def parse(tmp_path, blob):
    p = tmp_path / "x.gguf"
    p.write_bytes(blob)
    return read_gguf(p)


def refused(tmp_path, blob, needle):
    with pytest.raises(GGUFError) as e:
        parse(tmp_path, blob)
    assert needle in str(e.value), str(e.value)
    return str(e.value)


def test_minimal_file(tmp_path):
    g = parse(tmp_path, build())
    assert g.version == 3 and g.metadata == {"general.architecture": "llama", "x.count": 7}
    t = g.tensors["t"]
    assert t.type_name == "F32" and t.shape == [8] and t.nbytes == 32 and t.offset == g.data_start
    assert g.data_start % 32 == 0


def test_agrees_with_gguf_package(tmp_path):
    path = tmp_path / "w.gguf"
    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_uint8("a.u8", 200)
    w.add_int8("a.i8", -5)
    w.add_uint16("a.u16", 60000)
    w.add_int16("a.i16", -30000)
    w.add_uint32("a.u32", 4000000000)
    w.add_int32("a.i32", -2000000000)
    w.add_float32("a.f32", 1.5)
    w.add_uint64("a.u64", 1 << 60)
    w.add_int64("a.i64", -(1 << 60))
    w.add_float64("a.f64", 2.25)
    w.add_bool("a.bool", True)
    w.add_string("a.str", "héllo ✓")
    w.add_array("a.arr_s", ["x", "", "ü"])
    w.add_array("a.arr_i", [1, 2, 3])
    w.add_array("a.arr_f", [0.5, 1.0])
    w.add_custom_alignment(64)
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 8)).astype(np.float32))
    q = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q4_1)
    w.add_tensor("q41", q, raw_dtype=gguf.GGMLQuantizationType.Q4_1)
    w.add_tensor("f16", rng.standard_normal(16).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    g = read_gguf(path)
    ref = gguf.GGUFReader(str(path))
    assert g.alignment == 64 and g.version == 3
    assert g.metadata["a.u8"] == 200 and g.metadata["a.i8"] == -5 and g.metadata["a.u64"] == 1 << 60
    assert g.metadata["a.i64"] == -(1 << 60) and g.metadata["a.f32"] == 1.5 and g.metadata["a.f64"] == 2.25
    assert g.metadata["a.bool"] is True and g.metadata["a.str"] == "héllo ✓"
    assert g.metadata["a.arr_s"] == ["x", "", "ü"] and g.metadata["a.arr_i"] == [1, 2, 3]
    assert g.value_types["a.arr_s"] == "ARRAY[STRING]" and g.value_types["a.u16"] == "UINT16"
    for k in ("a.u16", "a.i16", "a.u32", "a.i32"):
        assert g.metadata[k] == ref.fields[k].contents()
    assert set(g.tensors) == {t.name for t in ref.tensors}
    for t in ref.tensors:
        mine = g.tensors[t.name]
        assert mine.shape == [int(x) for x in t.shape] and mine.type == int(t.tensor_type)
        assert mine.offset == t.data_offset and mine.nbytes == t.n_bytes
        assert mine.offset % 64 == 0


def test_v2_accepted(tmp_path):
    assert parse(tmp_path, build(version=2)).version == 2


def test_every_truncation_is_refused_cleanly(tmp_path):
    blob = build(kvs=[kv("k.s", 8, s("abc")), kv("k.arr", 9, struct.pack("<IQ", 8, 2) + s("p") + s("qq")),
                      kv("k.f", 6, struct.pack("<f", 1.0))])
    for cut in range(0, len(blob) - 1):
        with pytest.raises(GGUFError):
            parse(tmp_path, blob[:cut])


@pytest.mark.parametrize("blob_fn,needle", [
    (lambda: b"GGML" + build()[4:], "not a GGUF file"),
    (lambda: build(version=1), "version 1 is not supported"),
    (lambda: build(version=0x03000000), "big-endian"),
    (lambda: build(version=7), "unknown GGUF version 7"),
    (lambda: build(n_kv=1 << 62), "metadata count"),
    (lambda: build(n_t=1 << 62), "tensor count"),
    (lambda: build(kvs=[s("k") + struct.pack("<I", 8) + struct.pack("<Q", 1 << 40)]), "more than the"),
    (lambda: build(kvs=[s("k") + struct.pack("<I", 8) + struct.pack("<Q", 1 << 20) + b"ab"]), "past the end"),
    (lambda: build(kvs=[kv("k", 9, struct.pack("<IQ", 4, 1 << 40))]), "claims 1099511627776 elements"),
    (lambda: build(kvs=[kv("k", 9, struct.pack("<IQ", 8, 1 << 30))]), "elements"),
    (lambda: build(kvs=[kv("k", 13, b"")]), "unknown value type 13"),
    (lambda: build(kvs=[kv("k", 9, struct.pack("<IQ", 77, 1))]), "unknown value type 77"),
    (lambda: build(kvs=[kv("k", 7, b"\x02")]), "bool with value 2"),
    (lambda: build(kvs=[kv("k", 4, b"\1\0\0\0"), kv("k", 4, b"\2\0\0\0")]), "appears twice"),
    (lambda: build(kvs=[s(b"\xff\xfe") + struct.pack("<I", 4) + b"\0\0\0\0"]), "not valid UTF-8"),
    (lambda: build(kvs=[kv("", 4, b"\0\0\0\0")]), "empty key"),
    (lambda: build(kvs=[kv("general.alignment", 4, struct.pack("<I", 3))]), "power of two"),
    (lambda: build(kvs=[kv("general.alignment", 4, struct.pack("<I", 0))]), "power of two"),
    (lambda: build(kvs=[kv("general.alignment", 8, s("32"))]), "power of two"),
    (lambda: build(tensors=[tinfo("t", [8, 1, 1, 1, 1], 0, 0)]), "5 dimensions"),
    (lambda: build(tensors=[s("t") + struct.pack("<I", 0) + struct.pack("<IQ", 0, 0)]), "0 dimensions"),
    (lambda: build(tensors=[tinfo("t", [8, 0], 0, 0)]), "zero dimension"),
    (lambda: build(tensors=[tinfo("t", [8], 0, 4)]), "not a multiple of the alignment"),
    (lambda: build(tensors=[tinfo("t", [8], 0, 1 << 50)]), "runs past the end"),
    (lambda: build(tensors=[tinfo("t", [1 << 40, 1 << 40], 0, 0)]), "runs past the end"),
    (lambda: build(tensors=[tinfo("t", [9], 0, 0)]), "runs past the end"),
    (lambda: build(tensors=[tinfo("t", [8], 99, 0)]), "unknown ggml type 99"),
    (lambda: build(tensors=[tinfo("t", [33], 8, 0)]), "not a multiple of its block size 32"),
    (lambda: build(tensors=[tinfo("t", [4], 0, 0), tinfo("t", [4], 0, 0)]), "appears twice"),
    (lambda: build(tensors=[tinfo("a", [8], 0, 0), tinfo("b", [4], 0, 0)]), "overlap"),
])
def test_hostile_input_refused(tmp_path, blob_fn, needle):
    msg = refused(tmp_path, blob_fn(), needle)
    assert str(tmp_path) in msg, "the message names the file"


def test_deeply_nested_arrays_refused(tmp_path):
    payload = b""
    for _ in range(gguf_reader.MAX_ARRAY_DEPTH + 2):
        payload = struct.pack("<IQ", 9, 1) + payload
    payload += struct.pack("<IQ", 4, 0)
    refused(tmp_path, build(kvs=[kv("k", 9, payload)]), "nested")


def test_nested_arrays_read(tmp_path):
    inner = struct.pack("<IQ", 4, 2) + struct.pack("<II", 5, 6)
    g = parse(tmp_path, build(kvs=[kv("k", 9, struct.pack("<IQ", 9, 2) + inner + inner)]))
    assert g.metadata["k"] == [[5, 6], [5, 6]]


def test_not_a_file(tmp_path):
    with pytest.raises(GGUFError, match="No such file"):
        read_gguf(tmp_path / "missing.gguf")
    (tmp_path / "short.gguf").write_bytes(b"GGUF")
    with pytest.raises(GGUFError, match="too short"):
        read_gguf(tmp_path / "short.gguf")
