"""`coli convert`: container layout, resumability, refusal of mixed settings, bad sources."""
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

ROOT = Path(__file__).resolve().parents[1]
from colibri.convert.safetensors_io import read_header  # noqa: E402


def coli(*args, ok=True):
    p = subprocess.run([sys.executable, str(ROOT / "coli"), *map(str, args)], capture_output=True, text=True, timeout=300)
    if ok:
        assert p.returncode == 0, p.stderr
    return p


@pytest.fixture(scope="module")
def moe_src(oracle_root):
    return Path(oracle_root) / "qwen3_moe_sparse" / "hf"  # sharded, hub layout


def test_container_layout(moe_src, tmp_path):
    out = tmp_path / "c"
    coli("convert", moe_src, out)
    man = json.loads((out / "colibri.json").read_text())
    assert man["format"] == "colibri-container" and man["family"] == "qwen3_moe"
    assert man["quant"]["experts"] == "q4" and man["quant"]["dense"] == "q8" and man["quant"]["norms"] == "f32"
    assert set(man["source"]["files"]) == {p.name for p in moe_src.glob("*.safetensors")}
    assert all(len(h) == 64 for h in man["source"]["files"].values())
    for name in ("config.json", "tokenizer.json", "generation_config.json"):
        assert (out / name).exists()
    arch = man["arch"]
    seen_experts = 0
    for shard in man["shards"]:
        header, _ = read_header(out / shard)
        with safe_open(out / shard, "np") as st:  # the safetensors library opens every shard
            meta = json.loads(st.metadata()["colibri.tensors"])
            assert set(st.keys()) == set(meta)
        for name, (qtype, rows, cols) in meta.items():
            t = header[name]
            if name.endswith("norm.weight") or name.endswith("mlp.gate.weight"):
                assert qtype == "f32" and t["dtype"] == "F32"
            if ".experts." in name:
                assert qtype == "q4" and t["dtype"] == "U8" and t["shape"] == [rows, (cols + 31) // 32 * 20]
            if name.endswith("experts.0.gate_proj.weight") or ".experts." in name and name.endswith("gate_proj.weight"):
                base = name[: -len("gate_proj.weight")]
                up, down = header[base + "up_proj.weight"], header[base + "down_proj.weight"]
                # one expert = one contiguous byte range: gate, up, down back to back
                assert up["offset"] == t["offset"] + t["nbytes"] and down["offset"] == up["offset"] + up["nbytes"]
                seen_experts += 1
            elif qtype in ("q8", "q4") or ".experts." in name:
                pass
            if t["dtype"] == "F32":
                assert t["offset"] % 4 == 0
    assert seen_experts == arch["num_experts"] * arch["layer_mlp"].count("moe")


def test_same_settings_resume_and_other_settings_refused(moe_src, tmp_path):
    out = tmp_path / "c"
    coli("convert", moe_src, out, "--experts", "q8")
    first = sorted(out.glob("*.safetensors"))
    # simulate an interrupt after the first shard: drop the manifest and one shard, keep the state
    (out / "colibri.json").unlink()
    state = json.loads((out / ".coli_convert.json").read_text())
    state["done"] = state["done"][:1]
    (out / ".coli_convert.json").write_text(json.dumps(state))
    first[-1].unlink()
    p = coli("convert", moe_src, out, "--experts", "q8")
    assert "resuming: 1/" in p.stderr and (out / "colibri.json").exists() and first[-1].exists()
    p = coli("convert", moe_src, out, "--experts", "q4", ok=False)
    assert p.returncode == 2 and "other settings" in p.stderr and "experts q8" in p.stderr
    p = coli("convert", moe_src, out, "--experts", "q8")
    assert "already converted" in p.stderr


def test_fused_and_hub_layouts_give_identical_containers(oracle_root, tmp_path):
    """The same weights saved both ways convert to byte-identical expert tensors."""
    hub, fused = Path(oracle_root) / "qwen3_moe" / "hf", Path(oracle_root) / "qwen3_moe_fused" / "hf"
    a, b = tmp_path / "a", tmp_path / "b"
    coli("convert", hub, a)
    coli("convert", fused, b)
    # different seeds make different weights; compare layouts instead: same names, shapes, storage
    ha = read_header(next(a.glob("*.safetensors")))[0]
    hb = read_header(next(b.glob("*.safetensors")))[0]
    assert {k: (v["dtype"], v["shape"]) for k, v in ha.items()} == {k: (v["dtype"], v["shape"]) for k, v in hb.items()}


def test_bad_sources_are_refused_clearly(moe_src, tmp_path):
    p = coli("convert", tmp_path / "nowhere", tmp_path / "o1", ok=False)
    assert p.returncode == 2 and "nowhere: no such file or directory" in p.stderr
    (tmp_path / "weights.bin").write_bytes(b"x")
    p = coli("convert", tmp_path / "weights.bin", tmp_path / "o1", ok=False)
    assert p.returncode == 2 and "not a .gguf file" in p.stderr and "Traceback" not in p.stderr
    src = tmp_path / "src"
    shutil.copytree(moe_src, src)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps(dict(cfg, model_type="mamba")))
    p = coli("convert", src, tmp_path / "o2", ok=False)
    assert "model_type 'mamba' is not supported" in p.stderr
    (src / "config.json").write_text(json.dumps(dict(cfg, num_hidden_layers=cfg["num_hidden_layers"] + 1)))
    p = coli("convert", src, tmp_path / "o3", ok=False)
    assert "lacks tensor 'model.layers.4." in p.stderr
    (src / "config.json").write_text(json.dumps(dict(cfg, num_hidden_layers=cfg["num_hidden_layers"] - 1)))
    p = coli("convert", src, tmp_path / "o4", ok=False)
    assert "does not use" in p.stderr and "refusing to drop weights" in p.stderr
    (src / "config.json").write_text(json.dumps(cfg))
    shard = sorted(src.glob("*.safetensors"))[-1]
    shard.write_bytes(shard.read_bytes()[:-100])  # truncated
    p = coli("convert", src, tmp_path / "o5", ok=False)
    assert "does not fit the file" in p.stderr
    shard.write_bytes(struct.pack("<Q", 10 ** 12) + b"{}")  # hostile header length
    p = coli("convert", src, tmp_path / "o6", ok=False)
    assert "exceeds the file" in p.stderr


def test_bf16_of_wider_source_is_announced(oracle_root, tmp_path):
    p = coli("convert", Path(oracle_root) / "llama_f32" / "hf", tmp_path / "c", "--dense", "bf16")
    assert "bf16 storage rounds wider source weights" in p.stderr


def test_engine_refuses_corrupt_container(oracle_root, tmp_path):
    out = tmp_path / "c"
    coli("convert", Path(oracle_root) / "llama" / "hf", out)
    shard = next(out.glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    shard.write_bytes(bytes(data[: len(data) // 2]))
    p = coli("logits", "--model", out, "--ids", "1,2", "--out", tmp_path / "x", ok=False)
    assert p.returncode != 0 and "truncated" in p.stderr
    man = json.loads((out / "colibri.json").read_text())
    man["arch"]["hidden_size"] += 32
    shard.write_bytes(bytes(data))
    (out / "colibri.json").write_text(json.dumps(man))
    p = coli("logits", "--model", out, "--ids", "1,2", "--out", tmp_path / "x", ok=False)
    assert p.returncode != 0 and "architecture needs" in p.stderr


@pytest.mark.parametrize("state", ['{"settings": ', '[1, 2]', '{"settings": {}, "done": [3]}', '\udcff'])
def test_a_damaged_resume_record_is_refused_by_name(moe_src, tmp_path, state):
    out = tmp_path / "c"
    out.mkdir()
    (out / ".coli_convert.json").write_text(state, errors="surrogateescape")
    p = coli("convert", moe_src, out, ok=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert ".coli_convert.json" in p.stderr and "damaged" in p.stderr and f"delete the directory {out}" in p.stderr


def test_an_output_that_is_a_file_is_refused(moe_src, tmp_path):
    done = tmp_path / "c"
    coli("convert", moe_src, done)
    for target in (done / "colibri.json", tmp_path / "plain-file"):
        target.touch()
        p = coli("convert", moe_src, target, ok=False)
        assert p.returncode == 2 and "Traceback" not in p.stderr
        assert f"{target} exists and is not a directory" in p.stderr


def test_a_directory_with_other_files_is_refused(moe_src, tmp_path):
    out = tmp_path / "home"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    p = coli("convert", moe_src, out, ok=False)
    assert p.returncode == 2 and "is not empty (notes.txt)" in p.stderr
    assert sorted(x.name for x in out.iterdir()) == ["notes.txt"]  # nothing written next to them


def test_help_names_both_source_kinds():
    p = coli("convert", "--help")
    assert "GGUF" in p.stdout and ".gguf" in p.stdout and "safetensors" in p.stdout
    assert "Q4_1" in p.stdout  # which GGUF block types are read
    top = coli("--help")
    assert "GGUF" in next(ln for ln in top.stdout.splitlines() if ln.strip().startswith("convert "))
