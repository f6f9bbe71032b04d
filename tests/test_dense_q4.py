"""`--dense q4`: the dense trunk (attention, embeddings, head, dense MLPs) in the same 4-bit
blocks as the routed experts, for byte-for-byte comparisons with llama.cpp's Q4_0. Judged like
the default container (top-1 on margin-safe positions, mean KL against transformers), with a
looser bound: on these tiny random models 4-bit dense weights cost 4-200x the default's KL
(qwen3_moe 0.12 vs 0.014, llama 0.062 vs 0.0003 mean KL), which is why q8 stays the default."""
import json
from pathlib import Path

import numpy as np
import pytest

from launcher_helpers import coli
from test_oracles import load_ref, quant_stats, run_logits, safe_positions


@pytest.mark.parametrize("variant", ["qwen3_moe", "llama"])
def test_dense_q4_container_is_4_bit_and_close(variant, oracle_root, tmp_path):
    out = tmp_path / "c"
    r = coli("convert", Path(oracle_root) / variant / "hf", out, "--dense", "q4")
    assert r.returncode == 0, r.stderr
    quant = json.loads((out / "colibri.json").read_text())["quant"]
    assert quant["dense"] == quant["embed"] == quant["lm_head"] == "q4"
    info, ref = load_ref(oracle_root, variant)
    got = run_logits(out, info["ids"], tmp_path / "q4.f32")
    base = tmp_path / "d"
    assert coli("convert", Path(oracle_root) / variant / "hf", base).returncode == 0
    default = run_logits(base, info["ids"], tmp_path / "q8.f32")
    safe = safe_positions(info, 0.05, 0.3)
    s, d = quant_stats(got, ref, safe), quant_stats(default, ref, safe)
    print(f"{variant} --dense q4: mean KL {s['kl_mean']:.3g} (default q8 dense {d['kl_mean']:.3g}), "
          f"top-1 {100 * s['top1_safe']:.0f}% on {s['n_safe']} margin-safe positions")
    assert s["kl_mean"] <= 0.3 and s["top1_safe"] >= 0.75
    assert s["kl_mean"] > d["kl_mean"]  # really 4-bit: coarser than the 8-bit trunk
    assert np.isfinite(got).all()
