"""tools/quant_study.py: one conversion per changed class, each scored against the unquantized
container, and the Pareto front of bytes per token against KL; a rerun converts nothing again."""
import json
import os
import subprocess
import sys

import kl_pareto
import quant_study
from test_kl_pareto import TEXT
from test_lowbit_quantize import coli_convert, tiny_qwen3moe

from test_gguf_common import ROOT


def test_pareto_front():
    rows = [dict(bytes=10, kl_mean=3.0), dict(bytes=12, kl_mean=1.0), dict(bytes=12, kl_mean=2.0),
            dict(bytes=9, kl_mean=3.0), dict(bytes=20, kl_mean=1.0)]
    assert [r["front"] for r in quant_study.pareto(rows)] == [False, True, False, True, False]


def test_variants_replace_or_add_one_class():
    v = quant_study.variants(["--experts", "q4_k", "--dense", "q4_k"], ["experts=q2_k", "attention=q6_k,q8"],
                             ["head6=--tensor-type lm_head=q6_k"])
    assert v == [("base", ["--experts", "q4_k", "--dense", "q4_k"]),
                 ("experts=q2_k", ["--experts", "q2_k", "--dense", "q4_k"]),
                 ("attention=q6_k", ["--experts", "q4_k", "--dense", "q4_k", "--tensor-type", "attention=q6_k"]),
                 ("attention=q8", ["--experts", "q4_k", "--dense", "q4_k", "--tensor-type", "attention=q8"]),
                 ("head6", ["--experts", "q4_k", "--dense", "q4_k", "--tensor-type", "lm_head=q6_k"])]


def study(tmp_path, hf, ref, text):
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "quant_study.py"), "--src", str(hf), "--ref", str(ref),
                        "--file", str(text), "--work", str(tmp_path / "work"), "--base", "--experts q4_k --dense q4_k",
                        "--vary", "attention=q8", "--vary", "experts=q2_k", "--ctx", "16", "--chunks", "2",
                        "--threads", "1", "--json"], capture_output=True, text=True, timeout=900,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), r.stderr


def test_study_scores_each_setting(tmp_path):
    hf = tiny_qwen3moe(tmp_path, 471)
    ref = tmp_path / "ref"
    coli_convert(hf, ref, "--experts", "f32", "--dense", "f32")
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    rows, log = study(tmp_path, hf, ref, text)
    by = {r["label"]: r for r in rows}
    assert list(by) == ["base", "attention=q8", "experts=q2_k"]
    assert log.count(" convert ") == 3, log
    for r in rows:  # the tool's numbers are the container's byte count and coli perplexity's KL
        assert r["bytes"] == kl_pareto.colibri_bytes_per_token(r["container"])
    assert by["attention=q8"]["bytes"] > by["base"]["bytes"] > by["experts=q2_k"]["bytes"]
    assert by["attention=q8"]["kl_mean"] < by["base"]["kl_mean"] < by["experts=q2_k"]["kl_mean"]
    assert all(r["front"] for r in rows)  # each buys its bytes' worth on this model
    again, log = study(tmp_path, hf, ref, text)
    assert " convert " not in log and [r["kl_mean"] for r in again] == [r["kl_mean"] for r in rows], log
