"""Checkpoints saved in transformers' own layout (save_original_format=False: Mixtral's and
MiniMax-M2's mlp.gate and MiniMax's mlp.e_score_correction_bias for block_sparse_moe, fused
mlp.experts.gate_up_proj / down_proj, MiMo-V2-Flash's self_attn.sinks for attention_sink_bias)
convert to the same model as their original layout."""
import json
import shutil
from pathlib import Path

import pytest

from launcher_helpers import coli

F32 = ["--experts", "f32", "--dense", "f32"]


@pytest.mark.parametrize("variant", ["mixtral", "minimax_m2", "mimo_v2_flash"])
def test_transformers_layout_converts_to_the_same_model(variant, oracle_root, tmp_path):
    import make_oracles
    from safetensors import safe_open
    hf = Path(oracle_root) / variant / "hf"
    fused = tmp_path / "fused"
    _, cls = make_oracles.model_class(make_oracles.VARIANTS[variant]["family"])
    cls.from_pretrained(hf).save_pretrained(fused, save_original_format=False)
    for f in hf.glob("tokenizer*"):
        shutil.copy(f, fused / f.name)
    with safe_open(fused / "model.safetensors", "pt") as st:
        keys = set(st.keys())
    assert "model.layers.1.mlp.experts.gate_up_proj" in keys and not any("block_sparse_moe" in k for k in keys)
    assert not any(k.endswith("attention_sink_bias") for k in keys)
    ids = ",".join(map(str, json.loads((Path(oracle_root) / variant / "ref.json").read_text())["ids"][:40]))
    out = {}
    for name, src in (("orig", hf), ("fused", fused)):
        r = coli("convert", src, tmp_path / f"c_{name}", *F32, timeout=600)
        assert r.returncode == 0, r.stderr
        r = coli("logits", "--model", tmp_path / f"c_{name}", "--ids", ids, "--out", tmp_path / f"{name}.f32", timeout=600)
        assert r.returncode == 0, r.stderr
        out[name] = (tmp_path / f"{name}.f32").read_bytes()
    assert out["fused"] == out["orig"]
