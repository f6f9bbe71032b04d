"""tools/glm5_geometry.py writes a block-FP8 checkpoint of GLM-5's layout (the benchmark's model):
shrunk here to a tiny width, it converts as a GLM-5 container and generates, and its FP8 blocks
decode to the magnitudes the generator promises (finite, 0.006..0.012)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

import glm5_geometry  # tools/, on the path through pytest.ini

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(H=128, HEADS=2, Q_LORA=64, KV_LORA=32, NOPE=16, ROPE=16, V_DIM=16, IDX_HEADS=2, IDX_DIM=32, EXPERTS=8,
            WIDTH=128, DENSE_WIDTH=256, VOCAB=152000)


def e4m3(b):
    """e4m3fn bytes (no zero/subnormal among the generator's) -> floats."""
    b = b.astype(np.int32)
    return np.where(b & 0x80, -1.0, 1.0) * 2.0 ** (((b >> 3) & 15) - 7) * (1 + (b & 7) / 8)


def test_a_tiny_glm5_geometry_checkpoint_converts_and_generates(tmp_path, monkeypatch):
    for k, v in TINY.items():
        monkeypatch.setattr(glm5_geometry, k, v)
    cfg = dict(glm5_geometry.CONFIG, hidden_size=128, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=64,
               kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, qk_head_dim=32, head_dim=16, v_head_dim=16,
               index_n_heads=2, index_head_dim=32, n_routed_experts=8, moe_intermediate_size=128,
               intermediate_size=256, vocab_size=152000, index_topk=16)
    monkeypatch.setattr(glm5_geometry, "CONFIG", cfg)
    hf = tmp_path / "hf"
    glm5_geometry.gen(hf, 3, seed=1)
    index = json.loads((hf / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.layers.2.mlp.experts.7.down_proj.weight_scale_inv" in index
    assert "model.layers.0.mlp.gate.weight" not in index and "model.layers.1.mlp.gate.weight" in index  # one dense layer
    from safetensors import safe_open
    with safe_open(str(hf / index["model.layers.1.mlp.experts.3.up_proj.weight"]), "np") as f:
        raw = f.get_slice("model.layers.1.mlp.experts.3.up_proj.weight")
        assert raw.get_dtype() == "F8_E4M3"
        scale = f.get_tensor("model.layers.1.mlp.experts.3.up_proj.weight_scale_inv")
    data = hf / index["model.layers.1.mlp.experts.3.up_proj.weight"]
    head = int.from_bytes(data.read_bytes()[:8], "little")
    meta = json.loads(data.read_bytes()[8:8 + head])["model.layers.1.mlp.experts.3.up_proj.weight"]
    a, b = meta["data_offsets"]
    w = e4m3(np.frombuffer(data.read_bytes()[8 + head + a:8 + head + b], np.uint8)) * float(scale.flat[0])
    assert scale.shape == (1, 1) and np.isfinite(w).all() and 0.006 <= np.abs(w).min() and np.abs(w).max() <= 0.012
    out = tmp_path / "col"
    subprocess.run([sys.executable, str(ROOT / "coli"), "convert", str(hf), str(out)], check=True, capture_output=True)
    man = json.loads((out / "colibri.json").read_text())
    assert man["family"] == "glm_moe_dsa" and man["arch"]["num_experts"] == 8
    r = subprocess.run([sys.executable, str(ROOT / "coli"), "run", "--model", str(out), "--max-tokens", "4", "--temp",
                        "0", "hello"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-1500:]
    assert r.stdout.strip()
