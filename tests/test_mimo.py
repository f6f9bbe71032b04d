"""MiMo-V2-Flash beyond the oracle comparison (tests/test_oracles.py): its sliding layers (twice
the KV heads, v heads narrower than q/k) keep only their window in a ring that gives the bits of
keeping every position; prefix reuse and KV persistence work with it; the engine allocates what
the planner says."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import family_registry
from test_expert_streaming import Raw
from test_gpt_oss import check_ring_persistence, coli, greedy, logits
from colibri.family import specs as family_specs


@pytest.fixture(scope="module")
def oracle(oracle_root):
    d = Path(oracle_root) / "mimo_v2_flash"
    return d, json.loads((d / "ref.json").read_text()), json.loads((d / "hf" / "config.json").read_text())


@pytest.fixture(scope="module")
def ringed(oracle, tmp_path_factory):
    """The bf16 container (sliding layers keep a ring) and a copy whose specs keep every position."""
    out = tmp_path_factory.mktemp("mimo") / "ring"
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
    assert n == oracle[2]["layer_types"].count("sliding_attention") == 2
    (full / "colibri.json").write_text(json.dumps(man))
    return out, full


def test_ring_gives_the_bits_of_the_whole_cache(oracle, ringed, tmp_path):
    ring, full = ringed
    ids, window = oracle[1]["ids"], oracle[2]["sliding_window"]
    assert len(ids) > 4 * window
    want = logits(full, ids, tmp_path / "full.f32")
    for flags in ([], ["--batch", "1"], ["--batch", "5"], ["--batch", "13"]):
        assert logits(ring, ids, tmp_path / "ring.f32", *flags) == want, flags
    a, b = Raw(ring), Raw(full)
    # per token, f16: K (48) and V (32) of 1 KV head on the 2 full layers, of 2 on the 2 sliding ones
    ctx = int(a.ready["ctx"])
    assert int(a.ready["kv_bytes_per_token"]) == int(b.ready["kv_bytes_per_token"]) == (2 * 1 + 2 * 2) * (48 + 32) * 2
    assert int(b.ready["kv_slot_bytes"]) - int(a.ready["kv_slot_bytes"]) == 2 * 2 * (48 + 32) * 2 * (ctx - window)
    man = json.loads((ring / "colibri.json").read_text())
    assert family_specs.kv_slot_bytes(family_specs.manifest_layers(man), ctx) == int(a.ready["kv_slot_bytes"])
    a.close()
    b.close()


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
    third = ids[:20] + ids[50:60]  # rewinds past the ring's window: recomputed from the start
    t3 = e.turn(third, max_tokens=8, temp=0)
    assert t3["end"]["reused_tokens"] == "0", t3["end"]
    assert t3["tokens"] == greedy(ring, third)
    e.close()


def test_kv_persistence_with_a_ring(oracle, ringed, tmp_path):
    check_ring_persistence(ringed[0], oracle[1]["ids"], tmp_path)


def test_the_releases_mtp_module_is_left_out(oracle, tmp_path):
    """The release ships an MTP module under model.mtp.*, which transformers does not load: the
    converter leaves it out instead of refusing the checkpoint; any other stray tensor is refused."""
    from safetensors.torch import load_file, save_file
    src = tmp_path / "src"
    shutil.copytree(oracle[0] / "hf", src)
    t = load_file(src / "model.safetensors")
    t["model.mtp.layers.0.input_layernorm.weight"] = t["model.norm.weight"].clone()
    save_file(t, src / "model.safetensors", metadata={"format": "pt"})
    coli("convert", src, tmp_path / "out")
    man = json.loads((tmp_path / "out" / "colibri.json").read_text())
    assert man["family"] == "mimo_v2_flash"
    t["model.extra.weight"] = t["model.norm.weight"].clone()
    save_file(t, src / "model.safetensors", metadata={"format": "pt"})
    r = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "coli"), "convert", str(src),
                        str(tmp_path / "out2")], capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "model.extra.weight" in r.stderr and "model.mtp" not in r.stderr
