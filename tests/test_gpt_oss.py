"""gpt-oss specifics beyond the oracle comparison (tests/test_oracles.py): the sliding layers'
KV ring (only the window is kept) gives the same bits as keeping every position, prefix reuse and
KV persistence work with it (a wrapped ring is reused by a prompt that extends the history, or
from a turn-boundary checkpoint of the rings; anything earlier recomputes from the start), MXFP4
experts, and the registry's facts for the family."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import family_registry
from test_expert_streaming import Raw
from colibri.family import normalize as family_normalize
from colibri.family import specs as family_specs

ROOT = Path(__file__).resolve().parents[1]


def coli(*args):
    p = subprocess.run([sys.executable, str(ROOT / "coli"), *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    if p.returncode:
        pytest.fail(f"coli {' '.join(map(str, args))} exited {p.returncode}: {p.stderr[-2000:]}", pytrace=False)
    return p


@pytest.fixture(scope="module")
def oracle(oracle_root):
    d = Path(oracle_root) / "gpt_oss"
    return d, json.loads((d / "ref.json").read_text())


@pytest.fixture(scope="module")
def ringed(oracle, tmp_path_factory):
    """The bf16 container (sliding layers keep a ring) and a copy whose specs keep every position."""
    out = tmp_path_factory.mktemp("gpt_oss") / "ring"
    coli("convert", oracle[0] / "hf", out, "--experts", "bf16", "--dense", "bf16")
    full = out.parent / "full"
    shutil.copytree(out, full)
    man = json.loads((full / "colibri.json").read_text())
    n = 0
    for spec in man["layers"]:
        a = spec["attn"]
        if a.pop("ring", False):
            del a["state"]["window"]
            n += 1
    assert n == 2, "the oracle should have two sliding layers"
    (full / "colibri.json").write_text(json.dumps(man))
    return out, full


def logits(model, ids, out, *flags):
    coli("logits", "--model", model, "--ids", ",".join(map(str, ids)), "--out", out, *flags)
    return Path(out).read_bytes()


def test_ring_gives_the_bits_of_the_whole_cache(oracle, ringed, tmp_path):
    ring, full = ringed
    ids = oracle[1]["ids"]
    window = json.loads((oracle[0] / "hf" / "config.json").read_text())["sliding_window"]
    assert len(ids) > 4 * window
    want = logits(full, ids, tmp_path / "full.f32")
    for flags in ([], ["--batch", "1"], ["--batch", "5"], ["--batch", "13"]):
        assert logits(ring, ids, tmp_path / "ring.f32", *flags) == want, flags
    a, b = Raw(ring), Raw(full)
    # per token: 4 layers x K and V x 2 heads x 16 dims x 2 bytes; the two sliding layers hold 12 positions
    ctx = int(a.ready["ctx"])
    assert int(a.ready["kv_bytes_per_token"]) == int(b.ready["kv_bytes_per_token"]) == 4 * 2 * 2 * 16 * 2
    assert int(b.ready["kv_slot_bytes"]) - int(a.ready["kv_slot_bytes"]) == 2 * 2 * 2 * 16 * 2 * (ctx - window)
    a.close()
    b.close()


def greedy(model, prompt, *flags, n=8):
    e = Raw(model, *flags)
    t = e.turn(prompt, max_tokens=n, temp=0)
    e.close()
    return t["tokens"]


def test_prefix_reuse_over_a_wrapped_ring(oracle, ringed):
    ring, _ = ringed
    ids = oracle[1]["ids"]
    first = ids[:30]
    e = Raw(ring)
    t1 = e.turn(first, max_tokens=8, temp=0)
    second = first + t1["tokens"] + ids[30:40]
    t2 = e.turn(second, max_tokens=8, temp=0)  # extends the history: the ring still holds its window
    assert int(t2["end"]["reused_tokens"]) >= len(first) + 7, t2["end"]
    assert t2["tokens"] == greedy(ring, second)
    # diverges inside the last reply (a chat template that re-renders it otherwise): the rings
    # come back from the checkpoint at the end of the last prompt
    third = second + t2["tokens"][:2] + ids[60:70]
    t3 = e.turn(third, max_tokens=8, temp=0)
    assert int(t3["end"]["reused_tokens"]) == len(second), (t3["end"], len(second))
    assert t3["tokens"] == greedy(ring, third)
    fourth = ids[:20] + ids[50:60]  # before every checkpoint, past the ring's window: from the start
    t4 = e.turn(fourth, max_tokens=8, temp=0)
    assert t4["end"]["reused_tokens"] == "0", t4["end"]
    assert t4["tokens"] == greedy(ring, fourth)
    e.close()


def check_ring_persistence(ring, ids, tmp_path):
    """A slot saved by one engine resumes in the next with its rings: the second turn reuses the
    first turn's history and answers as an uninterrupted engine would."""
    kv = tmp_path / "kv"
    kv.mkdir()
    a = Raw(ring, "--kv-dir", kv)
    t1 = a.turn(ids[:30], max_tokens=8, temp=0)
    a.close()
    second = ids[:30] + t1["tokens"] + ids[30:40]
    b = Raw(ring, "--kv-dir", kv)
    t2 = b.turn(second, max_tokens=8, temp=0)
    b.close()
    assert int(t2["end"]["reused_tokens"]) >= 37, t2["end"]
    assert t2["tokens"] == greedy(ring, second)


def test_kv_persistence_with_a_ring(oracle, ringed, tmp_path):
    check_ring_persistence(ringed[0], oracle[1]["ids"], tmp_path)


def test_registry_facts():
    cfg = {"model_type": "gpt_oss", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "num_hidden_layers": 3, "vocab_size": 10, "num_local_experts": 4, "num_experts_per_tok": 2,
           "intermediate_size": 32, "sliding_window": 8, "max_position_embeddings": 512, "swiglu_limit": 7.0,
           "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                               "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 64}}
    family, arch = family_normalize.normalize_arch(cfg)
    specs = family_specs.layer_specs(arch)
    assert family == "gpt_oss" and arch["q_bias"] and arch["o_bias"]  # attention_bias defaults to true
    # no layer_types: sliding, full, sliding (the config class's default)
    assert [s["attn"]["window"] for s in specs] == [8, 0, 8]
    assert [s["attn"].get("ring", False) for s in specs] == [True, False, True]
    assert [s["attn"]["state"].get("window", 0) for s in specs] == [8, 0, 8]
    a = specs[1]["attn"]
    assert a["sinks"] and a["tensors"]["sinks"] == "model.layers.1.self_attn.sinks"
    assert a["tensors"]["o_bias"] == "model.layers.1.self_attn.o_proj.bias"
    mlp = specs[0]["mlp"]
    assert mlp["act"] == "swiglu_clamp" and mlp["swiglu_alpha"] == 1.702 and mlp["swiglu_limit"] == 7.0
    assert mlp["router"]["kind"] == "topk_softmax" and mlp["router"]["tensors"]["bias"] == "model.layers.0.mlp.router.bias"
    assert mlp["expert_tensors"]["down_bias"] == "model.layers.0.mlp.experts.{e}.down_proj.bias"
    assert arch["rope_attention_scaling"] == pytest.approx(0.1 * __import__("math").log(32.0) + 1)
    _, arch = family_normalize.normalize_arch(dict(cfg, layer_types=["full_attention"] * 3, attention_bias=False))
    assert [s["attn"]["window"] for s in family_specs.layer_specs(arch)] == [0, 0, 0] and not arch["q_bias"]
    with pytest.raises(family_registry.UnsupportedModel, match="layer_types: chunked_attention"):
        family_normalize.normalize_arch(dict(cfg, layer_types=["chunked_attention"] * 3))
    with pytest.raises(family_registry.UnsupportedModel, match="one type per layer"):
        family_normalize.normalize_arch(dict(cfg, layer_types=["full_attention"]))
    with pytest.raises(family_registry.UnsupportedModel, match="sliding_window"):
        family_normalize.normalize_arch(dict(cfg, sliding_window=None))


# ---------- MXFP4 (the releases' expert format) ----------

EXACT_TOL = 1e-3  # tests/test_oracles.py: max|logit - ref| <= EXACT_TOL * max|ref|


def kl_top1(got, ref):
    import numpy as np

    def ls(x):
        x = x.astype(np.float64)
        m = x.max(-1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))
    lp, lq = ls(ref), ls(got)
    return float((np.exp(lp) * (lp - lq)).sum(-1).mean()), float((got.argmax(-1) == ref.argmax(-1)).mean())


@pytest.fixture(scope="module")
def mxfp4(oracle, tmp_path_factory):
    """The oracle with its experts quantized to MXFP4 as the releases ship them, and transformers'
    logits of that model (its own MXFP4 dequantization)."""
    import mxfp4_ref
    hf, info = oracle[0] / "hf", oracle[1]
    mx = mxfp4_ref.mxfp4_checkpoint(hf, tmp_path_factory.mktemp("mx") / "hf")
    return mx, mxfp4_ref.reference_logits(hf, mx, info["ids"])


def test_reference_quantizer_layout_is_transformers(mxfp4):
    """The test's MXFP4 blocks decode, by transformers' own code, to what the quantizer meant."""
    import numpy as np
    import torch
    from safetensors.torch import load_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    import mxfp4_ref
    t = load_file(mxfp4[0] / "model.safetensors")
    b, s = t["model.layers.1.mlp.experts.down_proj_blocks"], t["model.layers.1.mlp.experts.down_proj_scales"]
    theirs = convert_moe_packed_tensors(b, s, dtype=torch.float32).numpy()  # [E, I, H], transformers' layout
    assert np.array_equal(mxfp4_ref.dequantize(b.numpy(), s.numpy()).transpose(0, 2, 1), theirs)
    # amax 6.5 needs the scale 2: 0.25 -> 0, -0.75 -> -1 (the code 0.5), 3 -> 3, 6.5 -> 6
    w = np.array([[0.25, -0.75, 3.0, 6.5] * 8])
    assert np.array_equal(mxfp4_ref.dequantize(*mxfp4_ref.quantize(w)), [[0.0, -1.0, 3.0, 6.0] * 8])


def test_mxfp4_checkpoint_converts_exactly_and_stays_mxfp4(oracle, mxfp4, tmp_path):
    import numpy as np
    mx, ref = mxfp4
    ids = oracle[1]["ids"]
    got = {}
    for name, flags in (("f32", ["--experts", "f32"]), ("q4", ["--experts", "q4"]), ("mxfp4", ["--experts", "mxfp4"]),
                        ("default", [])):
        out = tmp_path / name
        log = coli("convert", mx, out, "--dense", "f32", *flags).stderr
        assert re.search(r"(\d+)/\1 tensors", log), log  # the progress reaches the end (gather jobs count)
        got[name] = np.frombuffer(logits(out, ids, tmp_path / f"{name}.f32"), "<f4").reshape(ref.shape)
        if name == "default":
            assert json.loads((out / "colibri.json").read_text())["quant"]["experts"] == "mxfp4"
        if name == "mxfp4":  # streamed through a one-slot expert cache: the same bytes
            assert logits(out, ids, tmp_path / "cap1.f32", "--cap", "1") == got[name].tobytes()
    ratio = float(np.abs(got["f32"] - ref).max() / np.abs(ref).max())
    print(f"MXFP4 source, f32 experts: max|logit-ref|/max|ref| = {ratio:.2e}")
    assert ratio <= EXACT_TOL  # dequantized exactly (the same bound as the bf16 oracle)
    assert got["default"].tobytes() == got["mxfp4"].tobytes()
    kl_q4, top_q4 = kl_top1(got["q4"], ref)
    kl_mx, top_mx = kl_top1(got["mxfp4"], ref)
    print(f"MXFP4 source: experts kept mxfp4 mean KL {kl_mx:.2e} top-1 {100 * top_mx:.1f}%; "
          f"re-quantized q4 mean KL {kl_q4:.2e} top-1 {100 * top_q4:.1f}%")
    assert kl_mx < 1e-5 and top_mx == 1.0  # the shipped weights themselves: activation rounding only
    assert kl_mx < kl_q4 / 100


def test_mxfp4_experts_from_a_bf16_source(oracle, tmp_path):
    """--experts mxfp4 quantizes a float checkpoint's experts too (judged as a 4-bit container)."""
    import numpy as np
    info = oracle[1]
    ref = np.fromfile(oracle[0] / "ref_logits.f32", "<f4").reshape(info["logits_shape"])
    out = {}
    for q in ("q4", "mxfp4"):
        coli("convert", oracle[0] / "hf", tmp_path / q, "--experts", q)
        got = np.frombuffer(logits(tmp_path / q, info["ids"], tmp_path / f"{q}.f32"), "<f4").reshape(ref.shape)
        out[q] = kl_top1(got, ref)
    print(f"bf16 source: q4 experts mean KL {out['q4'][0]:.2e} top-1 {100 * out['q4'][1]:.1f}%, "
          f"mxfp4 experts mean KL {out['mxfp4'][0]:.2e} top-1 {100 * out['mxfp4'][1]:.1f}%")
    assert out["mxfp4"][0] < 0.15 and out["mxfp4"][1] >= 0.9


def test_doctor_and_info_count_expert_biases_as_resident(ringed):
    """Expert biases are small resident f32 tensors, not parts of the streamed experts."""
    ring, _ = ringed
    p = subprocess.run([sys.executable, str(ROOT / "coli"), "doctor", "--deep", "--model", str(ring)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert "[fail]" not in p.stdout and "expert layout agree" in p.stdout, p.stdout
    info = coli("info", "--model", ring).stdout
    assert "expert bf16," in info and "other f32" in info, info
