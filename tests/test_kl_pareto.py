"""tools/kl_pareto.py: its GGUF byte count, its reading of llama-perplexity's output and base
file, the tokenizer check, and the whole run with a stand-in for llama-perplexity and the tiny
Qwen3-MoE oracle converted by colibri."""
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import kl_pareto

ROOT = Path(__file__).resolve().parents[1]
CTX, CHUNKS = 16, 2
TEXT = ("The river runs past the old mill, under the stone bridge and out across the fields, where the "
        "farmers cut hay in summer and the children skate when it freezes in winter.\n") * 4


def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def write_gguf(path, meta, tensors):
    """A GGUF with string/uint32 metadata, tensor infos at aligned offsets and zero data."""
    from colibri.convert.gguf_reader import DEFAULT_ALIGNMENT, GGML_TYPES
    raw = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta))
    for k, v in meta.items():
        raw += gguf_str(k) + (struct.pack("<I", 8) + gguf_str(v) if isinstance(v, str) else struct.pack("<II", 4, v))
    off = 0
    for name, shape, t in tensors:
        raw += gguf_str(name) + struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}Q", *shape)
        raw += struct.pack("<IQ", t, off)
        n = 1
        for d in shape:
            n *= d
        _, block, size = GGML_TYPES.get(t, ("", 1, 0))
        off += (n // block * size + DEFAULT_ALIGNMENT - 1) // DEFAULT_ALIGNMENT * DEFAULT_ALIGNMENT
    raw += bytes(-len(raw) % DEFAULT_ALIGNMENT)
    Path(path).write_bytes(raw + bytes(off))


MOE_META = {"general.architecture": "qwen3moe", "qwen3moe.expert_count": 8, "qwen3moe.expert_used_count": 2}
MOE_TENSORS = [("token_embd.weight", (4, 10), 0),          # f32, 160 bytes: one row per token, not counted
               ("blk.0.ffn_up_exps.weight", (32, 4, 8), 2),  # Q4_0: 32 blocks of 18 bytes, 2 of 8 experts read
               ("blk.0.attn_q.weight", (64, 2), 8)]          # Q8_0: 4 blocks of 34 bytes


def test_gguf_bytes_per_token_counts_top_k_experts_and_skips_the_embedding(tmp_path):
    write_gguf(tmp_path / "m.gguf", MOE_META, MOE_TENSORS)
    assert kl_pareto.gguf_bytes_per_token(tmp_path / "m.gguf") == 32 * 18 * 2 / 8 + 4 * 34


def test_gguf_errors_name_the_problem(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"NOPE" + bytes(20))
    with pytest.raises(kl_pareto.Fail, match="not a GGUF file"):
        kl_pareto.gguf_bytes_per_token(tmp_path / "x.gguf")
    write_gguf(tmp_path / "t.gguf", MOE_META, [("blk.0.attn_q.weight", (64, 2), 99)])
    with pytest.raises(kl_pareto.Fail, match="type 99"):
        kl_pareto.gguf_bytes_per_token(tmp_path / "t.gguf")
    write_gguf(tmp_path / "e.gguf", {"general.architecture": "qwen3moe"}, MOE_TENSORS)
    with pytest.raises(kl_pareto.Fail, match="expert_count"):
        kl_pareto.gguf_bytes_per_token(tmp_path / "e.gguf")


KLD_OUTPUT = """\
====== Perplexity statistics ======
Mean PPL(Q)                   : 151930.123456 ±  12.000000
Mean PPL(base)                : 151920.000000 ±  12.000000

====== KL divergence statistics ======
Mean    KLD:   0.012345 ±   0.000500
Maximum KLD:   0.200000
====== Token probability statistics ======
RMS Δp    :  1.234 ± 0.050 %
Same top p: 97.500 ± 0.300 %
"""


def test_parse_llama_kld():
    r = kl_pareto.parse_llama_kld(KLD_OUTPUT)
    assert r == {"kl_mean": 0.012345, "kl_err": 0.0005, "top1": 0.975, "ppl": 151930.123456}
    with pytest.raises(kl_pareto.Fail, match="no final KL statistics"):
        kl_pareto.parse_llama_kld("chunk PPL\n   1  12.0\n")


def test_base_file_tokens_and_first_mismatch(tmp_path):
    ids = list(range(100, 100 + CTX * CHUNKS))
    f = tmp_path / "base.kld"
    f.write_bytes(b"_logits_" + struct.pack("<Iii", CTX, 320, CHUNKS) + struct.pack(f"<{len(ids)}i", *ids))
    assert kl_pareto.read_kld_base_tokens(f) == (CTX, 320, CHUNKS, ids)
    f.write_bytes(b"_logits_" + struct.pack("<Iii", CTX, 320, CHUNKS) + struct.pack("<3i", 1, 2, 3))
    with pytest.raises(kl_pareto.Fail, match="truncated"):
        kl_pareto.read_kld_base_tokens(f)
    assert kl_pareto.first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert kl_pareto.first_mismatch([1, 2, 3], [1, 5, 3]) == 1
    assert kl_pareto.first_mismatch([1, 2], [1, 2, 3]) == 2


def test_table_marks_the_references():
    rows = [{"engine": "llama.cpp", "format": "bf16.gguf (reference)", "reference": True, "bytes": 2e6, "ppl": 3.0},
            {"engine": "colibri", "format": "q4/q8", "bytes": 1.5e6, "kl_mean": 7.06e-6, "top1": 0.95, "ppl": 3.1},
            {"engine": "llama.cpp", "format": "Q4_0", "bytes": 1.2e6, "kl_mean": 5.33e-4, "kl_err": 1e-6, "top1": 0.849}]
    t = kl_pareto.table(rows).splitlines()
    assert t[2] == "| llama.cpp | bf16.gguf (reference) | 2.0 | 0 (reference) | 100 % (reference) | 3.0000 |"
    assert t[3] == "| colibri | q4/q8 | 1.5 | 7.06e-06 | 95.00 % | 3.1000 |"
    assert t[4] == "| llama.cpp | Q4_0 | 1.2 | 5.33e-04 ± 1e-06 | 84.90 % | - |"


FAKE = """#!{python}
# llama-perplexity's stand-in: writes a --kl-divergence-base file holding the ids in FAKE_IDS,
# prints the final KL statistics with --kl-divergence, and logs its arguments
import os, struct, sys
a = sys.argv[1:]
open(os.environ["FAKE_LOG"], "a").write(" ".join(a) + "\\n")
ctx, chunks = int(a[a.index("-c") + 1]), int(a[a.index("--chunks") + 1])
if "--kl-divergence" in a:
    sys.stdout.write(open(os.environ["FAKE_KLD"]).read())
else:
    ids = [int(x) for x in open(os.environ["FAKE_IDS"]).read().split(",")][:ctx * chunks]
    open(a[a.index("--kl-divergence-base") + 1], "wb").write(
        b"_logits_" + struct.pack("<Iii", ctx, 320, chunks) + struct.pack("<%di" % len(ids), *ids))
    print("Final estimate: PPL = 321.5000 +/- 4.00000")
"""


@pytest.fixture(scope="module")
def containers(oracle_root, tmp_path_factory):
    d = tmp_path_factory.mktemp("klp")
    hf = str(Path(oracle_root) / "qwen3_moe" / "hf")
    out = {}
    for name, opts in (("bf16", ["--experts", "bf16", "--dense", "bf16"]), ("q4q8", [])):
        out[name] = d / name
        subprocess.run([sys.executable, str(ROOT / "coli"), "convert", hf, str(out[name]), *opts], check=True,
                       capture_output=True)
    return out


def fake_setup(tmp_path, monkeypatch, ids):
    exe = tmp_path / "fake-llama-perplexity"
    exe.write_text(FAKE.format(python=sys.executable))
    exe.chmod(0o755)
    (tmp_path / "ids").write_text(",".join(map(str, ids)))
    (tmp_path / "kld.txt").write_text(KLD_OUTPUT)
    for k, f in (("FAKE_IDS", "ids"), ("FAKE_KLD", "kld.txt"), ("FAKE_LOG", "log")):
        monkeypatch.setenv(k, str(tmp_path / f))
    write_gguf(tmp_path / "bf16.gguf", MOE_META, [("blk.0.attn_q.weight", (64, 2), 30)])
    write_gguf(tmp_path / "q4_0.gguf", MOE_META, MOE_TENSORS)
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    return exe, text


def argv(tmp_path, exe, text, containers):
    return ["--file", str(text), "--work", str(tmp_path / "work"), "--ctx", str(CTX), "--chunks", str(CHUNKS),
            "--threads", "1", "--colibri-ref", str(containers["bf16"]), "--colibri", "same=" + str(containers["bf16"]),
            "--colibri", "q4/q8=" + str(containers["q4q8"]), "--llama-perplexity", str(exe),
            "--gguf-ref", str(tmp_path / "bf16.gguf"), "--gguf", "Q4_0=" + str(tmp_path / "q4_0.gguf"), "--json"]


def test_a_whole_run_with_a_stand_in_peer(containers, tmp_path, monkeypatch, capsys):
    ids = kl_pareto.colibri_ids(containers["bf16"], _text(tmp_path))
    assert len(ids) >= CTX * CHUNKS
    exe, text = fake_setup(tmp_path, monkeypatch, ids)
    assert kl_pareto.main(argv(tmp_path, exe, text, containers)) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["engine"], r["format"]) for r in rows] == [
        ("llama.cpp", "bf16.gguf (reference)"), ("llama.cpp", "Q4_0"), ("colibri", "bf16 (reference)"),
        ("colibri", "same"), ("colibri", "q4/q8")]
    assert rows[0]["ppl"] == 321.5 and rows[0]["bytes"] == 128 * 2
    assert rows[1]["kl_mean"] == 0.012345 and rows[1]["top1"] == 0.975 and rows[1]["bytes"] == 32 * 18 * 2 / 8 + 4 * 34
    assert rows[3]["kl_mean"] == pytest.approx(0, abs=1e-9) and rows[3]["top1"] == 1.0  # the reference against itself
    assert rows[4]["kl_mean"] > 1e-6 and 0 <= rows[4]["top1"] <= 1 and rows[4]["bytes"] < rows[3]["bytes"]
    calls = (tmp_path / "log").read_text().splitlines()
    assert len(calls) == 2 and f"-c {CTX} --chunks {CHUNKS} -t 1" in calls[0]
    assert calls[1].endswith("--kl-divergence") and "q4_0.gguf" in calls[1]


def test_tokenizers_that_disagree_are_refused(containers, tmp_path, monkeypatch, capsys):
    ids = kl_pareto.colibri_ids(containers["bf16"], _text(tmp_path))
    ids[5] = (ids[5] + 1) % 320
    exe, text = fake_setup(tmp_path, monkeypatch, ids)
    assert kl_pareto.main(argv(tmp_path, exe, text, containers)) == 2
    err = capsys.readouterr().err
    assert "tokenizers disagree" in err and "at token 5" in err


def _text(tmp_path):
    t = tmp_path / "text.txt"
    t.write_text(TEXT)
    return t
