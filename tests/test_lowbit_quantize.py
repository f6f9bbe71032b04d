"""The converter's low-bit writer (c/kernels/lowbit_quantize.c): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
IQ4_NL and IQ4_XS blocks written from float weights. Its bytes are read back with the gguf package's `dequantize`
(llama.cpp's layouts, not ours), their error is held under a naive per-block round-to-nearest
computed here in numpy, importance weights lower the error they weigh, and a tiny Qwen3-MoE
converted to these types runs against transformers holding the values its blocks decode to."""
import json
import subprocess
import sys

import numpy as np
import pytest
from needs import need

from test_gguf_common import ROOT, engine

gguf = need("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf.quants import dequantize  # noqa: E402
from test_gguf_convert import load_hf, safetensors_metadata  # noqa: E402
from test_gguf_lowbit import QWEN3MOE, check_model  # noqa: E402

torch = need("torch")
import make_oracles  # noqa: E402

WRITABLE = {"q2_k": T.Q2_K, "q3_k": T.Q3_K, "q4_k": T.Q4_K, "q5_k": T.Q5_K, "q6_k": T.Q6_K, "iq4_nl": T.IQ4_NL,
            "iq4_xs": T.IQ4_XS}
ROW_BYTES = {"q2_k": (256, 84), "q3_k": (256, 110), "q4_k": (256, 144), "q5_k": (256, 176), "q6_k": (256, 210),
             "iq4_nl": (32, 18), "iq4_xs": (256, 136)}
IQ4_BOOK = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)
# relative squared error of Gaussian rows with an outlier column, measured: q2_k 0.076, q3_k 0.025,
# q4_k 0.0061, q5_k 0.0015, q6_k 0.0004, iq4_nl 0.0076, iq4_xs 0.0078; the bounds leave room for nothing worse than a few percent
REL_ERR_BOUND = {"q2_k": 0.085, "q3_k": 0.028, "q4_k": 0.0066, "q5_k": 0.0017, "q6_k": 0.00045, "iq4_nl": 0.0085, "iq4_xs": 0.0087}


def weights(rows=64, cols=512, seed=0):
    """Gaussian rows with one column ten times larger (the outlier channels real models have),
    one all-zero row and one constant row."""
    x = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    x[:, 5] *= 10
    x[1] = 0
    x[2] = 0.25
    return x


def write(tmp_path, x, storage, importance=None, gather=None):
    """x written as `storage` by convert-jobs; the job reads x (or, with gather=(rs, cs), x's
    elements at those strides) and, given one, an importance vector: the output's bytes."""
    src, out, imp = tmp_path / "x.f32", tmp_path / "o.bin", tmp_path / "imp.f32"
    x.tofile(src)
    out.write_bytes(b"")
    rows, cols = (x.shape if gather is None else gather[2])
    line = f"{src}\t0\tF32\t{rows}\t{cols}\t{out}\t0\t{storage}"
    if gather is not None:
        line += f"\tgather\t{gather[0]}\t{gather[1]}"
    if importance is not None:
        imp.write_bytes(bytes(12) + importance.astype(np.float32).tobytes())  # at an offset, as in a shared file
        line += f"\timportance\t{imp}\t12"
    (tmp_path / "jobs.tsv").write_text(line + "\n")
    r = subprocess.run([str(engine()), "convert-jobs", str(tmp_path / "jobs.tsv")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    block, nbytes = ROW_BYTES[storage]
    raw = out.read_bytes()
    assert len(raw) == rows * cols // block * nbytes, (storage, len(raw))
    return raw


def decoded(raw, storage, rows, cols):
    return dequantize(np.frombuffer(raw, np.uint8).reshape(rows, -1), WRITABLE[storage]).reshape(rows, cols)


def naive(storage, x):
    """Round-to-nearest with float (unquantized) scales: each sub-block's range over Q2_K's,
    Q4_K's or Q5_K's levels, its signed extreme onto Q3_K's -4 or Q6_K's -32, each 32-element
    block's extreme onto the IQ4 codebook's -127. The writer quantizes its scales too and must still do better."""
    if storage in ("q2_k", "q4_k", "q5_k"):  # each sub-block's range over its levels
        n, top = {"q2_k": (16, 3), "q4_k": (32, 15), "q5_k": (32, 31)}[storage]
        b = x.reshape(-1, n)
        lo, hi = np.minimum(b.min(1, keepdims=True), 0), b.max(1, keepdims=True)
        a = np.where(hi > lo, (hi - lo) / top, 1)
        return (np.clip(np.round((b - lo) / a), 0, top) * a + lo).reshape(x.shape)
    n = 16 if storage in ("q3_k", "q6_k") else 32
    b = x.reshape(-1, n)
    ext = b[np.arange(len(b)), np.abs(b).argmax(1)][:, None]
    if storage in ("q3_k", "q6_k"):  # the signed extreme onto the lowest code
        low = 4 if storage == "q3_k" else 32
        s = np.where(ext != 0, -ext / low, 1)
        return (np.clip(np.round(b / s), -low, low - 1) * s).reshape(x.shape)
    d = np.where(ext != 0, -ext / 127, 1)
    idx = np.abs(b[:, :, None] / d[:, :, None] - IQ4_BOOK).argmin(-1)
    return (IQ4_BOOK[idx] * d).reshape(x.shape)


def rel_err(x, y, w=None):
    w = np.ones(x.shape[1]) if w is None else w
    return float(((x - y) ** 2 * w).sum() / ((x ** 2) * w).sum())


@pytest.mark.parametrize("storage", sorted(WRITABLE))
def test_blocks_decode_close_to_the_weights(tmp_path, storage):
    """gguf's dequantize of the written blocks: error under the bound and under naive rounding;
    the zero row decodes to zeros and the constant row to within a step of itself."""
    x = weights()
    got = decoded(write(tmp_path, x, storage), storage, *x.shape)
    err, base = rel_err(x, got), rel_err(x, naive(storage, x))
    print(f"{storage}: relative squared error {err:.4f}, naive round-to-nearest {base:.4f}")
    assert err <= REL_ERR_BOUND[storage] and err < base
    assert not got[1].any()
    np.testing.assert_allclose(got[2], 0.25, rtol=0.07)


@pytest.mark.parametrize("storage", sorted(WRITABLE))
def test_importance_lowers_the_error_it_weighs(tmp_path, storage):
    """With per-column importance (heavy-tailed, as activations' mean squares are) the error
    weighted by it falls below the unweighted writer's by at least 5%."""
    x = weights(seed=1)
    imp = np.random.default_rng(2).exponential(1.0, x.shape[1]) ** 2
    plain = rel_err(x, decoded(write(tmp_path, x, storage), storage, *x.shape), imp)
    weighted = rel_err(x, decoded(write(tmp_path, x, storage, importance=imp), storage, *x.shape), imp)
    print(f"{storage}: importance-weighted error {plain:.4f} unweighted, {weighted:.4f} with importance")
    assert weighted < 0.95 * plain


def test_gathered_rows_get_the_same_blocks(tmp_path):
    """A strided (gathered) source with importance writes the bytes the contiguous job writes."""
    x = weights(rows=8, cols=256, seed=3)
    imp = np.random.default_rng(4).exponential(1.0, 256)
    want = write(tmp_path, x, "q3_k", importance=imp)
    got = write(tmp_path, np.ascontiguousarray(x.T), "q3_k", importance=imp, gather=(1, 8, (8, 256)))
    assert got == want


def run_job(tmp_path, line):
    (tmp_path / "jobs.tsv").write_text(line + "\n")
    return subprocess.run([str(engine()), "convert-jobs", str(tmp_path / "jobs.tsv")], capture_output=True, text=True)


def test_refusals_name_the_reason(tmp_path):
    """Rows that are not whole blocks, the lattice i-quants, and a missing importance vector."""
    src, out = tmp_path / "x.f32", tmp_path / "o.bin"
    np.ones(256, np.float32).tofile(src)
    out.write_bytes(b"")
    r = run_job(tmp_path, f"{src}\t0\tF32\t2\t96\t{out}\t0\tq3_k")
    assert r.returncode != 0 and "a row of 96 elements is not a whole number of q3_k blocks" in r.stderr, r.stderr
    r = run_job(tmp_path, f"{src}\t0\tF32\t1\t256\t{out}\t0\tiq2_xxs")
    assert r.returncode != 0 and "iq2_xxs storage is kept from GGUF blocks of that type only" in r.stderr, r.stderr
    r = run_job(tmp_path, f"{src}\t0\tF32\t1\t256\t{out}\t0\tq2_k\timportance\t{tmp_path / 'none.f32'}\t0")
    assert r.returncode != 0 and "cannot read its 256 importance weights" in r.stderr, r.stderr
    r = run_job(tmp_path, f"{src}\t0\tF32\t1\t256\t{out}\t0\tq2_k\timportance\t{src}\t4")  # one float short
    assert r.returncode != 0 and "cannot read its 256 importance weights" in r.stderr, r.stderr


def test_rows_that_are_not_whole_blocks_fall_back_and_say_so():
    from colibri.limits import fitted_storage
    assert fitted_storage("q3_k", 512) == "q3_k" and fitted_storage("iq4_xs", 768) == "iq4_xs"
    assert fitted_storage("q2_k", 96) == "iq4_nl" and fitted_storage("iq4_xs", 2880) == "iq4_nl"
    assert fitted_storage("q3_k", 100) == "q4" and fitted_storage("iq4_nl", 48) == "q4"
    assert fitted_storage("q8", 100) == "q8"


def tiny_qwen3moe(tmp_path, seed, **cfg):
    cfg_cls, model_cls = make_oracles.model_class("qwen3_moe")
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**{**make_oracles.BASE, **QWEN3MOE, **cfg})).float().eval()
    make_oracles.randomize(model, seed, make_oracles.OUT_GAIN)
    hf = tmp_path / "hf"
    model.save_pretrained(hf)
    make_oracles.write_tokenizer(hf)
    return hf


def coli_convert(src, out, *flags):
    r = subprocess.run([sys.executable, str(ROOT / "coli"), "convert", str(src), str(out), *flags],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return r.stdout + r.stderr


def container_values(out):
    """Every tensor of a container as float32 (name -> array), low-bit blocks through gguf."""
    from safetensors.numpy import load_file
    values = {}
    for shard in json.loads((out / "colibri.json").read_text())["shards"]:
        meta = json.loads(safetensors_metadata(out / shard)["colibri.tensors"])
        for name, raw in load_file(str(out / shard)).items():
            storage, rows, cols = meta[name]
            if storage in WRITABLE:
                values[name] = decoded(raw.tobytes(), storage, rows, cols)
            else:
                assert storage == "f32", (name, storage)
                values[name] = raw.view(np.float32).reshape(rows, cols) if raw.dtype != np.float32 else raw
    return values


@pytest.mark.parametrize("experts,dense", [("q2_k", "q3_k"), ("iq4_xs", "iq4_nl"), ("q4_k", "q6_k")])
def test_converted_model_against_transformers(tmp_path, experts, dense):
    """A checkpoint converted to low-bit storage runs against transformers holding exactly the
    values its blocks decode to (gguf's dequantize): logits, greedy tokens, streaming."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM
    hf = tiny_qwen3moe(tmp_path, 401)
    out = tmp_path / "c"
    coli_convert(hf, out, "--experts", experts, "--dense", dense)
    values = container_values(out)
    sd = load_hf(hf)
    assert set(sd) == set(values), sorted(set(sd) ^ set(values))
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    for f in hf.iterdir():
        if f.suffix != ".safetensors" and f.name != "model.safetensors.index.json":
            (ref_dir / f.name).write_bytes(f.read_bytes())
    save_file({k: torch.from_numpy(np.ascontiguousarray(values[k].reshape(v.shape))) for k, v in sd.items()},
              str(ref_dir / "model.safetensors"), metadata={"format": "pt"})
    drift = max(rel_err(sd[k].reshape(values[k].shape), values[k]) for k in sd if sd[k].ndim == 2)
    print(f"--experts {experts} --dense {dense}: worst tensor's relative squared error {drift:.4f}")
    ref = AutoModelForCausalLM.from_pretrained(str(ref_dir), dtype=torch.float32, attn_implementation="eager",
                                               experts_implementation="eager").eval()
    f32 = tmp_path / "f32"
    coli_convert(ref_dir, f32, "--experts", "f32", "--dense", "f32")
    check_model(out, ref, tmp_path, 402, f32=f32)


def test_convert_notes_the_tensors_that_fall_back(tmp_path):
    """Experts 384 wide are not whole q3_k blocks: they get iq4_nl, and the conversion says so."""
    hf = tiny_qwen3moe(tmp_path, 403, moe_intermediate_size=384)
    out = tmp_path / "c"
    log = coli_convert(hf, out, "--experts", "q3_k", "--dense", "iq4_xs")
    assert "note: 24 tensor(s) have rows that are not whole 256-element q3_k blocks; stored as iq4_nl" in log, log
    meta = {}
    for shard in json.loads((out / "colibri.json").read_text())["shards"]:
        meta.update(json.loads(safetensors_metadata(out / shard)["colibri.tensors"]))
    down = meta["model.layers.0.mlp.experts.0.down_proj.weight"]
    assert down == ["iq4_nl", 256, 384], down
    assert meta["model.layers.0.mlp.experts.0.gate_proj.weight"] == ["q3_k", 384, 256]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
