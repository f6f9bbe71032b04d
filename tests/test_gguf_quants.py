"""c/kernels/gguf_quants.c against the `gguf` package's reference dequantization, on tensors made here.

The C file is compiled with quant.c into a small shared library and called through ctypes, so
these tests need neither the engine build nor the convert-jobs wiring."""
import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from needs import need

gguf = need("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf import quants  # noqa: E402
from gguf_lowbit_blocks import LOWBIT_STORAGE, lowbit_blocks  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
QT = {"f32": 0, "bf16": 1, "f16": 2, "q8": 3, "q4": 4}  # QType order in c/kernels/quant.h


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    so = tmp_path_factory.mktemp("gq") / "libgguf_quants.so"
    # the kernel dispatch reaches every kernel set and family, so the library is all of c/kernels
    # (each set compiles to nothing on a CPU family it is not for) on the allocator they share
    srcs = sorted((ROOT / "c" / "kernels").glob("*.c")) + sorted((ROOT / "c" / "util").glob("*.c"))
    r = subprocess.run(["gcc", "-std=c11", "-D_GNU_SOURCE", "-O2", "-Wall", "-Wextra", "-Werror", "-fopenmp", "-shared",
                        "-fPIC", "-I", str(ROOT / "c"), "-o", str(so)] + [str(s) for s in srcs] + ["-lm"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    L = ctypes.CDLL(str(so))
    L.gguf_type_from_name.argtypes = [ctypes.c_char_p]
    L.gguf_row_bytes.restype = ctypes.c_size_t
    L.gguf_row_bytes.argtypes = [ctypes.c_int, ctypes.c_longlong]
    L.gguf_dequant_row.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_void_p]
    L.gguf_keep_row.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int, ctypes.c_void_p]
    L.dequant_row.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    return L


def random_blocks(qtype, rows, cols, rng):
    """Row bytes of type qtype: quantized from floats where the package can, else random bytes
    with every f16 scale field set to a sane value (any bit pattern of the quants is valid)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    x = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    x[0, :7] = [0, -0.2, 0.2, 1e-5, -1e-5, 3.0, -3.0]  # zero, extremes, tiny
    if qtype == T.F32:
        return x.view(np.uint8).reshape(rows, -1)
    if qtype == T.F16:
        return x.astype(np.float16).view(np.uint8).reshape(rows, -1)
    if qtype in (T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1):
        return np.ascontiguousarray(quants.quantize(x, qtype))
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    scales = (rng.random((rows, cols // block, 2)) * 0.01).astype(np.float16)
    if qtype == T.Q6_K:  # d is the last field
        raw[:, :, 208:210] = scales[:, :, :1].view(np.uint8)
    else:  # d, dmin first
        raw[:, :, 0:4] = scales.view(np.uint8).reshape(rows, cols // block, 4)
    return raw.reshape(rows, -1)


def c_dequant(lib, tid, data, cols):
    out = np.zeros((data.shape[0], cols), dtype=np.float32)
    for r in range(data.shape[0]):
        row = np.ascontiguousarray(data[r])
        lib.gguf_dequant_row(tid, row.ctypes.data, cols, out[r].ctypes.data)
    return out


@pytest.mark.parametrize("name", TYPES)
def test_dequant_matches_reference(lib, name):
    rng = np.random.default_rng(sum(map(ord, name)))
    qtype = T[name]
    tid = lib.gguf_type_from_name(f"GGUF_{name}".encode())
    assert tid == int(qtype), f"type id of {name}"
    cols = 512
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    assert lib.gguf_row_bytes(tid, cols) == cols // block * size
    data = random_blocks(qtype, 6, cols, rng)
    ref = quants.dequantize(data, qtype).astype(np.float32).reshape(6, cols)
    got = c_dequant(lib, tid, data, cols)
    # ggml's formulas evaluated in float32 in both: equal up to float rounding order
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)
    assert np.abs(ref).max() > 0, "the generated tensor must not be all zero"


def test_row_bytes_and_names_refuse_bad_input(lib):
    assert lib.gguf_type_from_name(b"GGUF_TQ1_0") == -1
    assert lib.gguf_type_from_name(b"Q4_K") == -1
    assert lib.gguf_type_from_name(None) == -1
    q4k = lib.gguf_type_from_name(b"GGUF_Q4_K")
    assert lib.gguf_row_bytes(q4k, 255) == 0 and lib.gguf_row_bytes(q4k, 0) == 0 and lib.gguf_row_bytes(q4k, -256) == 0
    assert lib.gguf_row_bytes(lib.gguf_type_from_name(b"GGUF_Q8_0"), 33) == 0
    assert lib.gguf_row_bytes(99, 256) == 0


@pytest.mark.parametrize("name,qt,exact", [("Q8_0", "q8", True), ("Q4_1", "q4", True), ("Q4_0", "q4", True),
                                            ("Q4_0", "q8", True), ("Q5_0", "q8", True), ("Q4_K", "q4", False)])
def test_keep_paths(lib, name, qt, exact):
    """Rows kept without float re-quantization decode (with colibri's own dequant) to the
    reference values: bit-exactly, or for Q4_K within f16 rounding of the sub-block scales."""
    rng = np.random.default_rng(7)
    qtype = T[name]
    tid = lib.gguf_type_from_name(f"GGUF_{name}".encode())
    cols = 512
    data = random_blocks(qtype, 4, cols, rng)
    ref = quants.dequantize(data, qtype).astype(np.float32).reshape(4, cols)
    out_row = cols // 32 * (34 if qt == "q8" else 20)
    for r in range(4):
        row = np.ascontiguousarray(data[r])
        dst = np.zeros(out_row, dtype=np.uint8)
        assert lib.gguf_keep_row(tid, row.ctypes.data, cols, QT[qt], dst.ctypes.data) == 1
        if (name, qt) in (("Q8_0", "q8"), ("Q4_1", "q4")):
            assert dst.tobytes() == row.tobytes(), "identical block layout: a byte copy"
        back = np.zeros(cols, dtype=np.float32)
        lib.dequant_row(QT[qt], dst.ctypes.data, cols, back.ctypes.data)
        if exact:
            np.testing.assert_array_equal(back, ref[r])
        else:
            np.testing.assert_allclose(back, ref[r], rtol=2e-3, atol=2e-4 * np.abs(ref[r]).max())


@pytest.mark.parametrize("name,qt", [("Q6_K", "q8"), ("Q5_1", "q8"), ("Q4_1", "q8"), ("Q8_0", "q4"), ("F16", "q8")])
def test_no_keep_path_where_not_exact(lib, name, qt):
    rng = np.random.default_rng(3)
    data = np.ascontiguousarray(random_blocks(T[name], 1, 256, rng)[0])
    dst = np.zeros(256, dtype=np.uint8)
    assert lib.gguf_keep_row(lib.gguf_type_from_name(f"GGUF_{name}".encode()), data.ctypes.data, 256, QT[qt],
                             dst.ctypes.data) == 0


# ---------------------------------------------------------------- low-bit types kept as they are

LOWBIT_QT = {n: 7 + i for i, n in enumerate(LOWBIT_STORAGE)}  # QT_Q2_K.. in c/kernels/quant.h


class QAct(ctypes.Structure):  # c/kernels/quant.h
    _fields_ = [("nb", ctypes.c_int), ("rows", ctypes.c_int), ("q", ctypes.c_void_p), ("d", ctypes.c_void_p),
                ("s", ctypes.c_void_p), ("lp", ctypes.c_void_p)]


def act_quantize(lib, x):
    """x's rows as the engine's int16 activation blocks (quantize_act_portable)."""
    T_, cols = x.shape
    nb = cols // 32
    q = np.zeros((T_, nb, 32), dtype=np.int16)
    d = np.zeros(nb * T_, dtype=np.float32)
    s = np.zeros(nb * T_, dtype=np.float32)
    a = QAct(nb, T_, q.ctypes.data, d.ctypes.data, s.ctypes.data, None)
    lib.quantize_act_portable.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(QAct), ctypes.c_int]
    for t in range(T_):
        row = np.ascontiguousarray(x[t])
        lib.quantize_act_portable(row.ctypes.data, cols, ctypes.byref(a), t)
    return a, (q, d, s)


def qdot(lib, fn, data, a, t0, nt):
    rows = data.shape[0]
    y = np.zeros((nt, rows), dtype=np.float32)
    f = getattr(lib, fn)
    f.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.POINTER(QAct), ctypes.c_int, ctypes.c_int,
                  ctypes.c_void_p, ctypes.c_size_t]
    w = np.ascontiguousarray(data)
    f(w.ctypes.data, w.shape[1], rows, ctypes.byref(a), t0, nt, y.ctypes.data, rows)
    return y


@pytest.mark.parametrize("name", LOWBIT_STORAGE)
def test_lowbit_dequant_is_bit_exact(lib, name):
    """The engine's decode of random blocks equals gguf.quants.dequantize bit for bit, through
    the GGUF source path and through the container type's own dequant_row."""
    rng = np.random.default_rng(sum(map(ord, name)) + 1)
    qtype = T[name]
    tid = lib.gguf_type_from_name(f"GGUF_{name}".encode())
    assert tid == int(qtype), f"type id of {name}"
    cols = 1024
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    assert lib.gguf_row_bytes(tid, cols) == cols // block * size
    lib.qtype_row_bytes.restype = ctypes.c_size_t
    lib.qtype_row_bytes.argtypes = [ctypes.c_int, ctypes.c_int]
    qt = LOWBIT_QT[name]
    assert lib.qtype_row_bytes(qt, cols) == cols // block * size
    assert lib.qtype_row_bytes(qt, cols + 16) == 0, "a row that is not whole blocks has no size"
    data = lowbit_blocks(name, 6, cols, rng)
    ref = quants.dequantize(data, qtype).astype(np.float32).reshape(6, cols)
    got = c_dequant(lib, tid, data, cols)
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))
    own = np.zeros_like(got)
    for r in range(6):
        row = np.ascontiguousarray(data[r])
        lib.dequant_row(qt, row.ctypes.data, cols, own[r].ctypes.data)
        dst = np.zeros(row.size, dtype=np.uint8)
        assert lib.gguf_keep_row(tid, row.ctypes.data, cols, qt, dst.ctypes.data) == 1
        assert dst.tobytes() == row.tobytes(), "kept byte for byte"
        assert lib.gguf_keep_row(tid, row.ctypes.data, cols, QT["q8"], dst.ctypes.data) == 0
    np.testing.assert_array_equal(own.view(np.uint32), ref.view(np.uint32))
    assert np.abs(ref).max() > 0 and len(np.unique(ref)) > 16


@pytest.mark.parametrize("name", LOWBIT_STORAGE)
def test_lowbit_dot_within_bound(lib, name):
    """qdot (weight rows . int16 activation rows) against dequant(w) . x in float64: the
    activations' rounding is at most half a step (amax/32767) per element, so per block the
    error is <= step/2 * sum|w|; the float accumulation adds at most (blocks + 4) ulps of
    sum|w*x|. The AVX2 dot and its AVX-512 and VNNI builds, where the CPU has them, equal the portable
    one bit for bit, both on the activation blocks and on their rearranged copy
    (lowbit_pack_act), which they read in matmuls."""
    rng = np.random.default_rng(sum(map(ord, name)) + 2)
    qtype = T[name]
    cols, rows, T_ = 512, 11, 70  # 11 rows: the packed dots decode eight at a time
    data = lowbit_blocks(name, rows, cols, rng)
    wf = quants.dequantize(data, qtype).astype(np.float64).reshape(rows, cols)
    x = rng.standard_normal((T_, cols)).astype(np.float32)
    x[1] *= 1e3  # blocks of very different scales
    x[2, :40] = 0
    a, keep = act_quantize(lib, x)
    q, d, _ = keep
    lib.lowbit_pack_bytes.restype = ctypes.c_size_t
    lib.lowbit_pack_bytes.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.lowbit_pack_act.argtypes = [ctypes.POINTER(QAct), ctypes.c_void_p]
    pack = np.zeros(lib.lowbit_pack_bytes(T_, a.nb), dtype=np.uint8)
    assert pack.size == T_ * (cols // 256) * 608
    packed = QAct(a.nb, a.rows, a.q, a.d, a.s, pack.ctypes.data)
    lib.lowbit_pack_act(ctypes.byref(a), pack.ctypes.data)
    step = d.reshape(cols // 32, T_).T  # per row and block
    suffix = name.lower()
    # up to LOWBIT_MAX_ROWS (64) rows per weight pass; from 3 rows on the SIMD dots read the pack
    for t0, nt in ((0, 4), (4, 3), (2, 1), (3, 16), (1, 2), (5, 64), (60, 9)):
        got = qdot(lib, f"qdot_{suffix}_portable", data, a, t0, nt).astype(np.float64)
        ref = x[t0:t0 + nt].astype(np.float64) @ wf.T
        absw = np.abs(wf).reshape(rows, cols // 32, 32).sum(-1)  # rows x blocks
        act_err = (step[t0:t0 + nt] / 2) @ absw.T * (1 + 1e-6)
        fl = (cols // 32 + 4) * 2.0 ** -23 * (np.abs(x[t0:t0 + nt].astype(np.float64)) @ np.abs(wf).T)
        err = np.abs(got - ref)
        assert (err <= act_err + fl).all(), (name, t0, nt, float((err / (act_err + fl)).max()))
        lib.kernels_supported.argtypes = [ctypes.c_int]
        for isa, s in ((1, "avx2"), (2, "avx512"), (4, "vnni")):  # KI_AVX2, KI_AVX512, KI_VNNI (also the amx set's dots)
            if lib.kernels_supported(isa):
                for act in (a, packed):
                    fast = qdot(lib, f"qdot_{suffix}_{s}", data, act, t0, nt)
                    np.testing.assert_array_equal(fast.view(np.uint32), got.astype(np.float32).view(np.uint32), err_msg=s)
    # one and two positions alone, as decode runs them (the pack holds no rearranged x then)
    for n in (1, 2):
        few, _ = act_quantize(lib, x[:n])
        few_pack = np.zeros(lib.lowbit_pack_bytes(n, few.nb), dtype=np.uint8)
        lib.lowbit_pack_act(ctypes.byref(few), few_pack.ctypes.data)
        few_packed = QAct(few.nb, few.rows, few.q, few.d, few.s, few_pack.ctypes.data)
        got = qdot(lib, f"qdot_{suffix}_portable", data, few, 0, n)
        np.testing.assert_array_equal(got, qdot(lib, f"qdot_{suffix}_portable", data, a, 0, n))
        for isa, s in ((1, "avx2"), (2, "avx512"), (4, "vnni")):
            if lib.kernels_supported(isa):
                fast = qdot(lib, f"qdot_{suffix}_{s}", data, few_packed, 0, n)
                np.testing.assert_array_equal(fast.view(np.uint32), got.view(np.uint32), err_msg=f"{s}, {n} alone")


def test_lowbit_grids_are_generated_from_the_gguf_package():
    """c/kernels/lowbit_grids.c is what tools/gen_lowbit_grids.py writes from the installed gguf
    package's tables: a hand edit, or a gguf release that changed a lattice, fails here."""
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_lowbit_grids.py"), "--check"], cwd=ROOT,
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stdout + r.stderr
