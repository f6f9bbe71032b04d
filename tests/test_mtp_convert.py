"""Multi-token-prediction layers (stored at layer index num_hidden_layers in DeepSeek-V3 and
GLM-4.5 releases) are kept in the container, not dropped, and described by the manifest's `mtp`
entry; only `--draft mtp` runs them (test_mtp_draft.py), so the logits do not change."""
import json
import shutil
from pathlib import Path

import pytest

from colibri.model import container_scan
from launcher_helpers import coli

BF16 = ["--experts", "bf16", "--dense", "bf16"]


@pytest.fixture(scope="module")
def with_mtp(oracle_root, tmp_path_factory):
    """The deepseek_v3 oracle plus an MTP layer at index L: a copy of its last layer (routed
    experts included) and the MTP-only projections and norms."""
    from safetensors.torch import load_file, save_file
    src = Path(oracle_root) / "deepseek_v3" / "hf"
    cfg = json.loads((src / "config.json").read_text())
    L = cfg["num_hidden_layers"]
    d = tmp_path_factory.mktemp("mtp") / "hf"
    shutil.copytree(src, d)
    t = load_file(d / "model.safetensors")
    last = f"model.layers.{L - 1}."
    extra = {f"model.layers.{L}." + k[len(last):]: v.clone() for k, v in t.items() if k.startswith(last)}
    H = cfg["hidden_size"]
    w = next(iter(t.values()))
    extra[f"model.layers.{L}.eh_proj.weight"] = w.new_ones(H, 2 * H)
    for n in ("enorm", "hnorm", "shared_head.norm"):
        extra[f"model.layers.{L}.{n}.weight"] = w.new_ones(H)
    save_file({**t, **extra}, d / "model.safetensors")
    return d, L, extra


def test_mtp_layer_is_kept_and_only_drafts(with_mtp, oracle_root, tmp_path):
    from safetensors.torch import load_file
    d, L, extra = with_mtp
    info = json.loads((Path(oracle_root) / "deepseek_v3" / "ref.json").read_text())
    ids = ",".join(map(str, info["ids"][:32]))
    out = {}
    for name, src in (("mtp", d), ("plain", Path(oracle_root) / "deepseek_v3" / "hf")):
        r = coli("convert", src, tmp_path / name, *BF16, timeout=600)
        assert r.returncode == 0, r.stderr
        r = coli("logits", "--model", tmp_path / name, "--ids", ids, "--out", tmp_path / f"{name}.f32", timeout=600)
        assert r.returncode == 0, r.stderr
        out[name] = (tmp_path / f"{name}.f32").read_bytes()
    assert out["mtp"] == out["plain"]  # not run
    man = json.loads((tmp_path / "mtp" / "colibri.json").read_text())
    assert man["mtp_layers"] == [L] and "mtp_layers" not in json.loads((tmp_path / "plain" / "colibri.json").read_text())
    kept = {}
    for s in man["shards"]:
        kept.update(load_file(tmp_path / "mtp" / s))
    for name, v in extra.items():  # kept, not dropped: every tensor, its values intact
        assert name in kept and kept[name].float().flatten().equal(v.float().flatten()), name
    scan = container_scan.scan(tmp_path / "mtp")
    plain = container_scan.scan(tmp_path / "plain")
    assert scan["classes"]["mtp"] > 0 and scan["experts"]["count"] == plain["experts"]["count"]
    assert scan["dense_bytes"] == plain["dense_bytes"]
    r = coli("info", "--model", tmp_path / "mtp")
    assert r.returncode == 0, r.stderr
    assert f"multi-token-prediction layer(s) (layer {L}): drafts tokens with --draft mtp" in r.stdout
    entry = man["mtp"][0]
    assert entry["layer"] == L and entry["eh_proj"] == f"model.layers.{L}.eh_proj.weight"
    assert entry["head"] is None and entry["embed"] is None  # the trunk's are shared


def test_only_the_declared_mtp_layers_are_kept(with_mtp, tmp_path):
    """A config that declares no MTP layer (or a layer count one short) leaves the extra layer's
    tensors unused: refused, never silently kept or dropped."""
    d, L, _ = with_mtp
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["num_nextn_predict_layers"] == 1
    src = tmp_path / "src"
    shutil.copytree(d, src)
    (src / "config.json").write_text(json.dumps(dict(cfg, num_nextn_predict_layers=0)))
    r = coli("convert", src, tmp_path / "out", *BF16, timeout=600)
    assert r.returncode != 0 and "does not use" in r.stderr and f"model.layers.{L}." in r.stderr
