"""Per-layer block specs in colibri.json, their mapping from older manifests, the KV state the
engine reports against the planner's, and the KV element type (--kv)."""
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from colibri.family import specs as family_specs

ROOT = Path(__file__).resolve().parents[1]
from colibri.model import container_scan  # noqa: E402
import family_registry  # noqa: E402
from launcher_helpers import coli, ready_line  # noqa: E402

F32 = ["--experts", "f32", "--dense", "f32"]


@pytest.fixture(scope="module")
def moe_container(oracle_root, tmp_path_factory):
    """qwen3_moe_sparse: dense and MoE layers, q/k norms; converted unquantized."""
    out = tmp_path_factory.mktemp("blockspec") / "c"
    r = coli("convert", Path(oracle_root) / "qwen3_moe_sparse" / "hf", out, *F32, timeout=600)
    assert r.returncode == 0, r.stderr
    return out


def manifest(d):
    return json.loads((Path(d) / "colibri.json").read_text())


def logits(model, ids, out, *flags):
    r = coli("logits", "--model", model, "--ids", ",".join(map(str, ids)), "--out", out, *flags, timeout=600)
    assert r.returncode == 0, r.stderr
    return Path(out).read_bytes()


def test_manifest_names_every_block_and_tensor(moe_container):
    man = manifest(moe_container)
    layers, arch = man["layers"], man["arch"]
    assert len(layers) == arch["num_layers"]
    assert [s["mlp"]["kind"] for s in layers] == arch["layer_mlp"]
    names = set()
    for shard in man["shards"]:
        header, _, _ = container_scan.read_raw_header(Path(moe_container) / shard)
        names |= set(header) - {"__metadata__"}
    named = {man["trunk"]["embed"], man["trunk"]["lm_head"], man["trunk"]["final_norm"]["tensors"]["weight"]}
    for s in layers:
        assert s["attn"]["kind"] == "gqa" and s["attn"]["rope"] == {"style": "neox", "dim": arch["rotary_dim"]}
        assert s["attn"]["state"] == {"kv_values_per_pos": 2 * arch["num_kv_heads"] * arch["head_dim"],
                                      "fixed_bytes": 0, "truncatable": True}
        for block in (s["attn_norm"], s["attn"], s["mlp_norm"], s["mlp"]):
            named |= set(block.get("tensors", {}).values())
        if s["mlp"]["kind"] == "moe":
            assert s["mlp"]["router"]["kind"] == "softmax_topk"
            named |= set(s["mlp"]["router"]["tensors"].values())
            named |= {t.replace("{e}", str(e)) for t in s["mlp"]["expert_tensors"].values()
                      for e in range(s["mlp"]["experts"])}
    assert named == names, f"named but absent: {sorted(named - names)[:3]}; present but unnamed: {sorted(names - named)[:3]}"
    # the registry maps the same arch to the same specs (what an older manifest gets at load time)
    assert family_specs.layer_specs(arch) == layers


def test_older_manifest_is_mapped_to_the_same_model(moe_container, oracle_root, tmp_path):
    """A container converted before layer specs existed loads through the arch mapping and gives
    byte-identical logits."""
    info = json.loads((Path(oracle_root) / "qwen3_moe_sparse" / "ref.json").read_text())
    old = tmp_path / "old"
    shutil.copytree(moe_container, old)
    man = manifest(old)
    del man["layers"], man["trunk"]
    (old / "colibri.json").write_text(json.dumps(man))
    a = logits(moe_container, info["ids"], tmp_path / "new.f32", "--kv", "f32")
    b = logits(old, info["ids"], tmp_path / "old.f32", "--kv", "f32")
    assert a == b
    scan_new, scan_old = container_scan.scan(moe_container), container_scan.scan(old)
    assert scan_new["kv_bytes_per_token"] == scan_old["kv_bytes_per_token"] > 0


def test_unknown_block_kind_and_false_state_are_refused(moe_container, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(moe_container, bad)
    man = manifest(bad)
    man["layers"][1]["attn"]["kind"] = "no_such_kind"
    (bad / "colibri.json").write_text(json.dumps(man))
    r = coli("logits", "--model", bad, "--ids", "1,2", "--out", tmp_path / "x.f32")
    assert r.returncode != 0 and "layer 1" in r.stderr and "attention kind 'no_such_kind' is not implemented" in r.stderr
    man["layers"][1]["attn"]["kind"] = "gqa"
    man["layers"][1]["attn"]["state"]["kv_values_per_pos"] += 1  # the planner would size memory wrongly
    (bad / "colibri.json").write_text(json.dumps(man))
    r = coli("logits", "--model", bad, "--ids", "1,2", "--out", tmp_path / "x.f32")
    assert r.returncode != 0 and "attn.state declares" in r.stderr


def test_engine_state_is_what_the_planner_counts(moe_container):
    """The engine reports the bytes its state descriptors allocate; the planner's scan agrees, per --kv."""
    scan = container_scan.scan(moe_container)
    values = scan["kv_values_per_token"]
    for kv, size in family_registry.KV_TYPES.items():
        got = ready_line(moe_container, "--kv", kv)
        assert got["kv"] == kv and int(got["kv_bytes_per_token"]) == values * size
    default = ready_line(moe_container)
    assert default["kv"] == family_registry.KV_DEFAULT == "f16"
    assert int(default["kv_bytes_per_token"]) == scan["kv_bytes_per_token"] == values * 2


def test_planner_counts_windows_and_fixed_state():
    """State descriptors as the planner reads them: a windowed layer holds only its window, a
    recurrent layer a fixed state whatever the context (c/model/kv.c kv_bytes allocates the same)."""
    full = {"attn": {"state": {"kv_values_per_pos": 64, "fixed_bytes": 0, "truncatable": True}}}
    window = {"attn": {"state": {"kv_values_per_pos": 64, "fixed_bytes": 0, "truncatable": True, "window": 128}}}
    recurrent = {"attn": {"state": {"kv_values_per_pos": 0, "fixed_bytes": 4096, "truncatable": False}}}
    layers = [full, window, recurrent]
    assert family_specs.kv_slot_bytes(layers, 100) == 2 * (64 * 2 * 100) + 4096 + 4 * 100  # f16: 2 bytes a value; token ids
    assert family_specs.kv_slot_bytes(layers, 1000) == 64 * 2 * 1000 + 64 * 2 * 128 + 4096 + 4 * 1000
    assert family_specs.kv_slot_bytes(layers, 1000, "f32") == 64 * 4 * 1000 + 64 * 4 * 128 + 4096 + 4 * 1000
    assert family_specs.kv_fixed_bytes(layers) == 4096 and family_specs.kv_values_per_token(layers) == 128


def test_kv_type_changes_storage_not_the_model(moe_container, oracle_root, tmp_path):
    """f16 (the serving default) rounds K/V, so its logits differ from f32's (coli logits'
    default), but stay within the oracle tolerance; a bad --kv is refused by the launcher and by
    the engine."""
    info = json.loads((Path(oracle_root) / "qwen3_moe_sparse" / "ref.json").read_text())
    ref = np.fromfile(Path(oracle_root) / "qwen3_moe_sparse" / "ref_logits.f32", dtype="<f4")
    f32 = np.frombuffer(logits(moe_container, info["ids"], tmp_path / "a.f32"), dtype="<f4")
    f16 = np.frombuffer(logits(moe_container, info["ids"], tmp_path / "b.f32", "--kv", "f16"), dtype="<f4")
    assert not np.array_equal(f16, f32)
    assert np.array_equal(f32, np.frombuffer(logits(moe_container, info["ids"], tmp_path / "d.f32", "--kv", "f32"),
                                             dtype="<f4"))
    assert np.abs(f16 - ref).max() <= 1e-3 * np.abs(ref).max()
    r = coli("logits", "--model", moe_container, "--ids", "1", "--out", tmp_path / "c.f32", "--kv", "q4")
    assert r.returncode != 0 and "--kv" in r.stderr
    p = subprocess.run([str(ROOT / "build" / "colibri"), "serve", "--model", str(moe_container), "--kv", "q4"],
                       input=b"", capture_output=True, timeout=60)
    assert p.returncode != 0 and b"--kv needs f16, bf16 or f32" in p.stderr
