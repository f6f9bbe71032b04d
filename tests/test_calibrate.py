"""`coli convert --calibrate TEXT`: the engine's activation statistics (`colibri calibrate`,
c/kernels/act_stats.h) and the conversion they weigh.

The statistics are checked against transformers' own activations on a tiny Qwen3-MoE (every
attention matrix, the head, and each expert's inputs with its own token count), also when the
experts stream through a cache of two slots a layer. On SmolLM2 (real weights) a conversion
calibrated by the engine lowers the importance-weighted error of every tensor class, the
importance being the one transformers measures on the same text."""
import json
import re
import struct
import subprocess
import sys

import numpy as np
import pytest
from needs import need

from engine_binaries import build
from test_gguf_common import ROOT, reference, smollm2_container, smollm2_gguf  # noqa: F401 (fixtures)
from test_imatrix import coli_convert, smollm2_calibration, weighted_errors_by_class
from test_lowbit_quantize import tiny_qwen3moe, write

torch = need("torch")
from test_gguf_convert import load_hf  # noqa: E402

TEXT_CHARS = 1500  # of README.md: ~1,300 tokens of the tiny models' byte-level vocabulary, three chunks of 512


def read_stats(path):
    """The engine's file, parsed here independently of the converter: name -> (positions, sums)."""
    b = path.read_bytes()
    assert b[:8] == b"COLISTAT" and struct.unpack_from("<I", b, 8)[0] == 1
    out, o = {}, 16
    for _ in range(struct.unpack_from("<I", b, 12)[0]):
        (n,) = struct.unpack_from("<I", b, o)
        name = b[o + 4:o + 4 + n].decode()
        o += 4 + n
        cols, positions = struct.unpack_from("<Id", b, o)
        out[name] = (positions, np.frombuffer(b, np.float32, cols, o + 12).astype(np.float64))
        o += 12 + 4 * cols
    assert o == len(b)
    return out


def write_stats(path, entries):
    """A statistics file as the engine writes it (name -> (positions, sums))."""
    parts = [b"COLISTAT", struct.pack("<II", 1, len(entries))]
    for name, (positions, sums) in entries.items():
        parts += [struct.pack("<I", len(name)), name.encode(), struct.pack("<Id", len(sums), positions),
                  np.asarray(sums, np.float32).tobytes()]
    path.write_bytes(b"".join(parts))
    return path


def calibrate(engine, model, ids, out, *flags):
    ids_file = out.with_suffix(".ids")
    ids_file.write_text(",".join(map(str, ids)))
    r = subprocess.run([str(engine), "calibrate", "--model", str(model), "--ids-file", str(ids_file), "--out", str(out),
                        "--chunk", "512", "--threads", "1", *flags], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return r.stderr


def torch_statistics(hf, ids):
    """What each matrix of the tiny Qwen3-MoE multiplies, per input column: the sum of squares
    over positions, and the positions (for an expert, those routed to it), in 512-token chunks."""
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32, attn_implementation="eager",
                                                 experts_implementation="eager").eval()
    sd = load_hf(hf)
    stats = {}

    def add(name, x):
        x = x.detach().reshape(-1, x.shape[-1]).double()
        p, s = stats.get(name, (0, 0))
        stats[name] = (p + x.shape[0], s + (x * x).sum(0).numpy())

    def moe(layer, x, chosen):
        x, chosen = x.detach().double().numpy(), chosen.numpy()
        for e in range(model.config.num_experts):
            rows = x[(chosen == e).any(1)]
            if not len(rows):
                continue
            w = {p: sd[f"model.layers.{layer}.mlp.experts.{e}.{p}.weight"].astype(np.float64) for p in
                 ("gate_proj", "up_proj")}
            g, u = rows @ w["gate_proj"].T, rows @ w["up_proj"].T
            prefix = f"model.layers.{layer}.mlp.experts.{e}"
            add(f"{prefix}.gate_proj.weight", torch.from_numpy(rows))
            add(f"{prefix}.up_proj.weight", torch.from_numpy(rows))
            add(f"{prefix}.down_proj.weight", torch.from_numpy(g / (1 + np.exp(-g)) * u))

    hooks = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and (".self_attn." in name or name == "lm_head"):
            hooks.append(mod.register_forward_pre_hook(lambda _, a, n=f"{name}.weight": add(n, a[0])))
    for layer, block in enumerate(model.model.layers):
        # the experts' inputs and transformers' own choice of experts
        hooks.append(block.mlp.experts.register_forward_pre_hook(lambda _, a, layer=layer: moe(layer, a[0], a[1])))
    with torch.no_grad():
        for i in range(0, len(ids), 512):
            model(torch.tensor([ids[i:i + 512]]))
    for h in hooks:
        h.remove()
    return stats


def tokens(model):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(model / "tokenizer.json")).encode((ROOT / "README.md").read_text()[:TEXT_CHARS]).ids


@pytest.fixture(scope="module")
def moe_f32(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("calibrate")
    hf = tiny_qwen3moe(tmp, 441)
    out = tmp / "f32"
    coli_convert(hf, out, "--experts", "f32", "--dense", "f32")
    return hf, out


def test_statistics_are_the_models_activations(tmp_path, moe_f32):
    """Every attention matrix, the head and every expert's three matrices: the engine's sums
    equal transformers' to f32 rounding, and each expert counts the positions routed to it.
    Streaming the experts through two slots a layer changes the sums by f32 rounding only."""
    hf, model = moe_f32
    ids = tokens(hf)
    assert len(ids) > 512, "the text must span two chunks"
    engine = build("build/colibri_asan")
    log = calibrate(engine, model, ids, tmp_path / "resident", "--kv", "f32")  # K/V as transformers keeps them
    got = read_stats(tmp_path / "resident")
    want = torch_statistics(hf, ids)
    assert f"calibrate: {len(ids)} positions; {len(got)} of " in log, log
    assert set(want) <= set(got), sorted(set(want) - set(got))[:5]
    assert any(".experts." in n for n in want) and "lm_head.weight" in want
    worst = 0.0
    for name, (positions, sums) in want.items():
        assert got[name][0] == positions, name
        worst = max(worst, float(np.abs(got[name][1] - sums).max() / sums.max()))
    print(f"{len(want)} matrices, largest error {worst:.1e} of a column's sum")
    assert worst < 1e-4
    calibrate(engine, model, ids, tmp_path / "streamed", "--kv", "f32", "--ram", "0.05", "--cap", "2")
    streamed = read_stats(tmp_path / "streamed")
    assert set(streamed) == set(got)
    for name in got:  # a tight budget may take smaller passes: the f32 sums group differently
        assert streamed[name][0] == got[name][0], name
        assert np.abs(streamed[name][1] - got[name][1]).max() <= 1e-6 * got[name][1].max(), name


def test_calibrated_conversion_weighs_each_expert_by_its_own_inputs(tmp_path, moe_f32):
    """`coli convert --calibrate`, experts streaming: an expert's blocks are those the writer
    gives the mean squares the engine measures for it on the 8-bit calibration model, from the
    text as `coli perplexity` tokenizes it; the work directory is gone afterwards, and OUT is
    checked before any calibration runs."""
    hf, _ = moe_f32
    text = tmp_path / "text.txt"
    text.write_text((ROOT / "README.md").read_text()[:TEXT_CHARS])
    q8 = tmp_path / "q8"
    coli_convert(hf, q8, "--experts", "q8", "--dense", "q8")
    from colibri.cli.perplexity import tokenize
    stats = tmp_path / "stats"
    flags = ("--ram", "0.05", "--cap", "2", "--threads", "1")
    calibrate(build("build/colibri"), q8, tokenize(q8, text), stats, *flags)
    engine_stats = read_stats(stats)
    out = tmp_path / "cal"
    log = coli_convert(hf, out, "--experts", "q2_k", "--dense", "q3_k", "--calibrate", text, *flags)
    assert "calibration: converting" in log and re.search(r"calibrate: chunk (\d+) of \1\n", log), log
    assert "imatrix: importance for 85 of 86 low-bit tensors; the others: plain least squares" in log, log  # embed
    assert not (tmp_path / "cal.calibration").exists()
    sd = load_hf(hf)
    from safetensors.numpy import load_file
    stored = {}
    for shard in json.loads((out / "colibri.json").read_text())["shards"]:
        stored.update({k: v.tobytes() for k, v in load_file(str(out / shard)).items()})
    for name, storage in (("model.layers.1.mlp.experts.5.down_proj.weight", "q2_k"),
                          ("model.layers.0.self_attn.q_proj.weight", "q3_k")):
        positions, sums = engine_stats[name]
        imp = (sums.astype(np.float32) / np.float32(positions)).astype(np.float32)
        assert stored[name] == write(tmp_path, sd[name], storage, importance=imp), name
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("x")
    err = coli_convert(hf, busy, "--dense", "q3_k", "--calibrate", text, ok=False)
    assert "is not empty and holds no conversion to resume" in err and "calibration:" not in err, err


def test_statistics_files_group_experts_and_fill_the_unreached(tmp_path):
    """The engine's file given as --imatrix: an expert it does not list takes its layer's mean."""
    hf = tiny_qwen3moe(tmp_path, 451)
    sd = load_hf(hf)
    rng = np.random.default_rng(7)
    entries = {}
    for e in range(8):
        if e != 3:
            name = f"model.layers.1.mlp.experts.{e}.down_proj.weight"
            entries[name] = (float(10 + e), rng.exponential(1.0, sd[name].shape[1]) ** 2 * (10 + e))
    stats = write_stats(tmp_path / "stats", entries)
    out = tmp_path / "c"
    log = coli_convert(hf, out, "--experts", "q2_k", "--imatrix", stats)
    assert "imatrix: importance for 8 of 72 low-bit tensors (1 matrices no calibration token reached took their " \
           "layer's mean)" in log, log
    from safetensors.numpy import load_file
    stored = {}
    for shard in json.loads((out / "colibri.json").read_text())["shards"]:
        stored.update({k: v.tobytes() for k, v in load_file(str(out / shard)).items()})
    means = [(s.astype(np.float32) / np.float32(p)).astype(np.float32) for p, s in entries.values()]
    name = "model.layers.1.mlp.experts.3.down_proj.weight"
    mean = (np.sum([m.astype(np.float64) for m in means], 0) / len(means)).astype(np.float32)
    assert stored[name] == write(tmp_path, sd[name], "q2_k", importance=mean)
    bad = write_stats(tmp_path / "wide", {"model.layers.0.mlp.experts.0.up_proj.weight": (4.0, np.ones(7))})
    err = coli_convert(hf, tmp_path / "d", "--experts", "q2_k", "--imatrix", bad, ok=False)
    assert "has 7 columns there and 256 here: the statistics are of another model" in err, err
    (tmp_path / "cut").write_bytes(bad.read_bytes()[:-5])
    err = coli_convert(hf, tmp_path / "e", "--experts", "q2_k", "--imatrix", tmp_path / "cut", ok=False)
    assert "truncated at byte" in err, err


def test_calibrate_refusals(tmp_path):
    hf = tiny_qwen3moe(tmp_path, 461)
    text = tmp_path / "t.txt"
    text.write_text("hello")
    err = coli_convert(hf, tmp_path / "a", "--calibrate", text, ok=False)
    assert "--calibrate weighs the low-bit writers only" in err, err
    err = coli_convert(hf, tmp_path / "b", "--dense", "q3_k", "--calibrate", tmp_path / "none.txt", ok=False)
    assert "--calibrate" in err and "no such file" in err, err
    err = coli_convert(hf, tmp_path / "c", "--dense", "q3_k", "--calibrate-model", tmp_path, ok=False)
    assert "give --calibrate TEXT too" in err, err
    err = coli_convert(hf, tmp_path / "d", "--dense", "q3_k", "--calibrate", text, "--calibrate-model", tmp_path, ok=False)
    assert "no colibri.json" in err, err
    for d in "abcd":
        assert not (tmp_path / d / "colibri.json").exists()


def test_smollm2_engine_calibration_weighs_every_class(tmp_path, smollm2_container, reference):
    """--dense iq4_nl calibrated by the engine over README text, against the plain conversion:
    weighted by transformers' importance on that text, every class's error falls."""
    model, _ = reference
    chars, _, entries, plain = smollm2_calibration()
    text = tmp_path / "text.txt"
    text.write_text(chars)
    calibrated = tmp_path / "cal"
    log = coli_convert(smollm2_gguf(), calibrated, "--dense", "iq4_nl", "--calibrate", text, "--calibrate-model",
                       smollm2_container, "--threads", "1")
    assert "imatrix: importance for " in log and not (tmp_path / "cal.calibration").exists(), log
    assert (smollm2_container / "colibri.json").is_file()  # the model it ran is left as it was
    for kind, (p, c) in sorted(weighted_errors_by_class(model, entries, plain, calibrated).items()):
        print(f"{kind}: importance-weighted relative error {p / 30:.5f} plain, {c / 30:.5f} engine-calibrated")
        assert c < p, kind


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
