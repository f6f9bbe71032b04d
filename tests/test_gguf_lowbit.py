"""Low-bit GGUF files end to end: a tiny qwen3moe and a tiny deepseek2 (MLA) model written with
gguf-py's writer in a mix like the dynamic 1-3-bit quants of the large MoEs (every low-bit type
somewhere: routed experts, shared experts, the dense MLP, attention, embeddings, head), converted
with the defaults, which keep every block as it is, and run against transformers.

The reference runs the very values the file holds: transformers loads the qwen3moe GGUF file
itself (it dequantizes through gguf-py); it has no deepseek2 GGUF loader, so for deepseek2 it
runs the HF checkpoint holding the values the GGUF blocks decode to (tests/gguf_lowbit_blocks.py)."""
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from needs import need

from test_gguf_common import ROOT, convert, engine

gguf = need("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf_lowbit_blocks import LOWBIT, ExactWeights  # noqa: E402
from test_gguf_convert import load_hf, write_gguf  # noqa: E402
from test_gguf_moe import write_moe_gguf  # noqa: E402

torch = need("torch")
import make_oracles  # noqa: E402

LOGIT_TOL = 2e-3  # max|logit-ref| / max|ref|: the engine's int16 activations against float32 (2e-4 measured)
# deepseek2: kv_b_proj is rebuilt from attn_k_b / attn_v_b and stored q8 (9e-3 measured from that alone)
MLA_LOGIT_TOL = 2e-2
F32_TOL = 1e-4  # the same file converted to f32: the tensor mapping, without any kernel's rounding
NEW_TOKENS = 16
SEQ = 40
# rows of the 256-element blocks: every matrix but MLA's small k_b/v_b is whole blocks wide
GEOMETRY = dict(hidden_size=256, intermediate_size=256, moe_intermediate_size=256, num_attention_heads=4)
QWEN3MOE = dict(make_oracles.MOE, **GEOMETRY, head_dim=64, num_hidden_layers=3, norm_topk_prob=True)
DEEPSEEK2 = dict(make_oracles.MLA, **GEOMETRY, q_lora_rank=256, kv_lora_rank=64, v_head_dim=64)

# HF tensor name suffix -> GGUF type, per layer: each low-bit type at least once, in the classes a
# dynamic quant puts them (experts lowest, attention and down projections higher). Q8_0 stands in
# for the dynamic quants' Q4_K/Q6_K tensors, which the converter re-encodes as q4/q8 (their own
# error, tested in test_gguf_convert.py), so the bound below measures the low-bit kernels.
MIX = {
    "qwen3_moe": {
        "embed_tokens.weight": T.Q3_K, "lm_head.weight": T.IQ4_XS,
        0: {"q_proj": T.Q8_0, "k_proj": T.IQ4_NL, "v_proj": T.Q8_0, "o_proj": T.IQ3_S,
            "gate_proj": T.IQ1_S, "up_proj": T.IQ1_M, "down_proj": T.Q2_K},
        1: {"q_proj": T.IQ4_XS, "k_proj": T.Q8_0, "v_proj": T.Q3_K, "o_proj": T.IQ2_XS,
            "gate_proj": T.IQ2_XXS, "up_proj": T.IQ2_S, "down_proj": T.IQ3_XXS},
        2: {"q_proj": T.IQ3_XXS, "k_proj": T.IQ2_XXS, "v_proj": T.Q2_K, "o_proj": T.Q8_0,
            "gate_proj": T.IQ2_XS, "up_proj": T.IQ3_S, "down_proj": T.IQ4_NL},
    },
    "deepseek_v3": {
        "embed_tokens.weight": T.IQ4_NL, "lm_head.weight": T.Q3_K,
        0: {"q_a_proj": T.IQ3_S, "q_b_proj": T.IQ4_XS, "kv_a_proj_with_mqa": T.Q8_0, "o_proj": T.IQ3_XXS,
            "gate_proj": T.IQ2_S, "up_proj": T.IQ2_XS, "down_proj": T.Q3_K},  # the dense first layer
        1: {"q_a_proj": T.Q2_K, "q_b_proj": T.IQ2_XXS, "kv_a_proj_with_mqa": T.IQ4_NL, "o_proj": T.Q8_0,
            "shared_experts.gate_proj": T.IQ3_XXS, "shared_experts.up_proj": T.IQ4_XS,
            "shared_experts.down_proj": T.Q8_0, "gate_proj": T.IQ1_S, "up_proj": T.IQ1_M, "down_proj": T.Q2_K},
        2: {"q_a_proj": T.IQ2_XS, "q_b_proj": T.IQ3_S, "kv_a_proj_with_mqa": T.Q3_K, "o_proj": T.IQ2_S,
            "shared_experts.gate_proj": T.IQ1_M, "shared_experts.up_proj": T.IQ1_S,
            "shared_experts.down_proj": T.IQ4_NL, "gate_proj": T.IQ2_XXS, "up_proj": T.Q8_0, "down_proj": T.IQ4_XS},
    },
}


def type_for(family, name, x):
    """The MIX type of HF tensor `name`; f16 for the other matrices (routers f32), f32 vectors."""
    mix = MIX[family]
    if x.ndim == 1 or name.endswith("mlp.gate.weight"):
        return T.F32
    for key in ("embed_tokens.weight", "lm_head.weight"):
        if name.endswith(key):
            return mix[key]
    parts = name.split(".")
    if parts[:2] == ["model", "layers"]:
        rest = ".".join(parts[3:])
        for proj, t in sorted(mix[int(parts[2])].items(), key=lambda kv: -len(kv[0])):
            if f".{proj}.weight" in f".{rest}" and ("shared_experts" in proj) == ("shared_experts" in rest):
                return t
    return T.F16


def build(family, cfg, tmp_path, seed):
    """A random tiny HF model, its weights rewritten to the MIX types' values: (hf dir, ExactWeights)."""
    from safetensors.torch import save_file
    cfg_cls, model_cls = make_oracles.model_class(family)
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**{**make_oracles.BASE, **cfg})).float().eval()
    make_oracles.randomize(model, seed, make_oracles.OUT_GAIN)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):  # routers: decisive top-k
                p.copy_(make_oracles.SIGMOID_ROUTER_STD * 2 * torch.randn(p.shape, generator=g))
    hf = tmp_path / "hf"
    model.save_pretrained(hf)
    make_oracles.write_tokenizer(hf)
    exact = ExactWeights(seed)
    sd = load_hf(hf)
    used = set()
    for name in sorted(sd):
        t = type_for(family, name, sd[name])
        sd[name] = exact.store(sd[name], t)
        used.add(t.name)
    assert used >= set(LOWBIT), f"the mix leaves out {sorted(set(LOWBIT) - used)}"
    for f in hf.glob("*.safetensors"):
        f.unlink()
    (hf / "model.safetensors.index.json").unlink(missing_ok=True)
    save_file({k: torch.from_numpy(v) for k, v in sd.items()}, str(hf / "model.safetensors"), metadata={"format": "pt"})
    return hf, exact


def reference(model, prompt, ids):
    """(logits of ids, greedy continuation of prompt, its smallest top-2 logit margin)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float().numpy()
        seq, margin = list(prompt), float("inf")
        for _ in range(NEW_TOKENS):
            last = model(torch.tensor([seq])).logits[0, -1].float()
            top = torch.topk(last, 2).values
            margin = min(margin, float(top[0] - top[1]))
            seq.append(int(last.argmax()))
    return logits, seq[len(prompt):], margin


def engine_logits(model_dir, ids, out, *flags):
    r = subprocess.run([str(engine()), "logits", "--model", str(model_dir), "--ids", ",".join(map(str, ids)),
                        "--out", str(out), *map(str, flags)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out.read_bytes()


def engine_greedy(model_dir, prompt):
    r = subprocess.run([sys.executable, str(ROOT / "coli"), "run", "--model", str(model_dir), "--ids",
                        ",".join(map(str, prompt)), "--max-tokens", str(NEW_TOKENS), "--temp", "0"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return [int(t) for t in r.stdout.strip().splitlines()[-1].replace(",", " ").split()]


def check_model(out, model, tmp_path, seed, tol=LOGIT_TOL, f32=None):
    """Logits close to the reference's (and f32's, a container of the same file in f32, closer),
    greedy tokens identical, streaming byte-identical."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, make_oracles.VOCAB, SEQ).tolist()
    best = None
    for _ in range(4):  # the most decisive of a few prompts, so float rounding cannot flip a token
        prompt = rng.integers(1, make_oracles.VOCAB, 8).tolist()
        ref, want, margin = reference(model, prompt, ids)
        if best is None or margin > best[2]:
            best = (prompt, want, margin)
    prompt, want, margin = best
    def ratio(model_dir, *flags):
        got = np.frombuffer(engine_logits(model_dir, ids, tmp_path / "r.f32", *flags), "<f4").reshape(len(ids), -1)
        return float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())
    exact, r = ratio(f32), ratio(out)
    print(f"max|logit-ref|/max|ref|: f32 container {exact:.2e} (bound {F32_TOL:.0e}), low-bit container {r:.2e} "
          f"(bound {tol:.0e}); greedy margin {margin:.3f}")
    assert exact <= F32_TOL and r <= tol
    for kset in cpu_kernel_sets():  # every kernel set this CPU runs, prefill (T > 1) and decode rows alike
        r = ratio(out, "--kernels", kset)
        print(f"  --kernels {kset}: {r:.2e}")
        assert r <= tol, kset
    assert engine_greedy(out, prompt) == want
    resident = engine_logits(out, ids, tmp_path / "a.f32")
    for flags in (["--cap", "1"], ["--ram", streaming_ram(out), "--ctx", "256"], ["--cap", "1", "--readahead", "off"]):
        assert engine_logits(out, ids, tmp_path / "s.f32", *flags) == resident, f"{' '.join(flags)} changed the logits"


def cpu_kernel_sets():
    out = subprocess.run([str(engine()), "version"], capture_output=True, text=True, check=True).stdout
    return re.search(r"available=(\S+)", out).group(1).split(",")


def budget_line(model_dir, ram):
    r = subprocess.run([str(engine()), "logits", "--model", str(model_dir), "--ids", "1,2", "--out", "/dev/null",
                        "--ram", str(ram), "--ctx", "256"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return next(ln for ln in r.stderr.splitlines() if "ram budget" in ln)


def streaming_ram(model_dir):
    """A --ram (GB) whose expert cache holds about two experts of each layer's eight, from the
    engine's own budget line with room for all of them."""
    line = budget_line(model_dir, 1)
    terms = {k.strip(): float(v) for k, v in re.findall(r"([a-z ]+) ([0-9.]+) MB", line.split("=", 1)[1])}
    total = int(re.search(r"cap (\d+) of (\d+)", line).group(2))
    fixed = sum(v for k, v in terms.items() if k != "expert cache")
    ram = round((fixed + 2.5 * terms["expert cache"] / total) / 1000, 4)
    cap = re.search(r"cap (\d+) of (\d+)", budget_line(model_dir, ram))
    assert 1 <= int(cap.group(1)) < total, f"--ram {ram} does not stream: {cap.group(0)}"
    return ram


def convert_keeping_every_type(src, tmp_path):
    """The default conversion of src, which keeps every low-bit type as its own storage."""
    out = convert(src, tmp_path / "c")
    kept = json.loads((out / "colibri.json").read_text())["quant"]["from_gguf"]
    for name in LOWBIT:
        assert kept.get(f"{name} -> {name.lower()}", 0) > 0, (name, kept)
    return out


def test_qwen3moe_lowbit_gguf_against_transformers(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM
    hf, exact = build("qwen3_moe", QWEN3MOE, tmp_path, 301)
    src = write_gguf(tmp_path / "m.gguf", hf, matrix_type=T.F16, exact=exact)
    out = convert_keeping_every_type(src, tmp_path)
    r = subprocess.run([sys.executable, str(ROOT / "coli"), "info", "--model", str(out)], capture_output=True,
                       text=True, timeout=120)
    quant = next(ln for ln in r.stdout.splitlines() if ln.startswith("quant"))
    assert "expert iq1_m x8/iq1_s x8/iq2_s x8/iq2_xs x8/iq2_xxs x8/iq3_s x8" in quant, quant  # the mix, per class
    assert "embed q3_k" in quant and "lm head iq4_xs" in quant, quant
    # the weights from the GGUF file; the config from the checkpoint (transformers' GGUF config
    # mapping has no key for the experts' width)
    ref = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="m.gguf", config=AutoConfig.from_pretrained(hf),
                                               dtype=torch.float32, attn_implementation="eager",
                                               experts_implementation="eager").eval()
    check_model(out, ref, tmp_path, 302, f32=convert(src, tmp_path / "f", experts="f32", dense="f32"))


def test_deepseek2_lowbit_gguf_against_transformers(tmp_path):
    from transformers import AutoModelForCausalLM
    hf, exact = build("deepseek_v3", DEEPSEEK2, tmp_path, 311)
    src = write_moe_gguf(tmp_path / "m.gguf", hf, matrix_type=T.F16, exact=exact)
    out = convert_keeping_every_type(src, tmp_path)
    ref = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32, attn_implementation="eager",
                                               experts_implementation="eager").eval()
    check_model(out, ref, tmp_path, 312, tol=MLA_LOGIT_TOL, f32=convert(src, tmp_path / "f", experts="f32", dense="f32"))


def test_lattice_storage_is_never_written_from_floats(tmp_path):
    """--experts q4 (or q3_k) on a Q2_K tensor keeps Q2_K; bf16 dequantizes; a job asking
    convert-jobs to write iq2_xxs from floats is refused with the reason (the K-quants and the
    IQ4 types are written: tests/test_lowbit_quantize.py)."""
    from colibri.convert import gguf as convert_gguf
    assert convert_gguf.storage_for("Q2_K", "q4") == "q2_k" and convert_gguf.storage_for("IQ1_S", "q8") == "iq1_s"
    assert convert_gguf.storage_for("Q2_K", "q3_k") == "q2_k" and convert_gguf.storage_for("IQ2_XS", "iq4_xs") == "iq2_xs"
    assert convert_gguf.storage_for("F16", "q3_k") == "q3_k" and convert_gguf.storage_for("Q4_K", "q2_k") == "q2_k"
    assert convert_gguf.storage_for("IQ2_XXS", "bf16") == "bf16"
    # Q5_K/Q6_K are kept where q6 is asked for, re-quantized to any other type
    assert convert_gguf.storage_for("Q6_K", "q6") == "q6_k" and convert_gguf.storage_for("Q5_K", "q6") == "q5_k"
    assert convert_gguf.storage_for("Q6_K", "q8") == "q8" and convert_gguf.storage_for("Q6_K", "q4", default=True) == "q4"
    assert convert_gguf.storage_for("Q5_K", "q2_k") == "q2_k" and convert_gguf.storage_for("Q6_K", "f32") == "f32"
    # a K-quant asked for by its own name or a wider K-quant's is kept; a narrower one re-quantizes
    assert convert_gguf.storage_for("Q4_K", "q4_k") == "q4_k" and convert_gguf.storage_for("Q4_K", "q6_k") == "q4_k"
    assert convert_gguf.storage_for("Q5_K", "q6_k") == "q5_k" and convert_gguf.storage_for("Q6_K", "q4_k") == "q4_k"
    assert convert_gguf.storage_for("Q4_K", "q4") == "q4" and convert_gguf.storage_for("Q4_K", "q6") == "q4"
    # a Q8_0 expert stays q8 unless --experts asked for q4
    assert convert_gguf.storage_for("Q8_0", "q4", default=True) == "q8" and convert_gguf.storage_for("Q8_0", "q4") == "q4"
    src = tmp_path / "x.f32"
    np.ones(256, np.float32).tofile(src)
    jobs = tmp_path / "jobs.tsv"
    (tmp_path / "o.bin").write_bytes(b"")
    jobs.write_text(f"{src}\t0\tF32\t1\t256\t{tmp_path / 'o.bin'}\t0\tiq2_xxs\n")
    r = subprocess.run([str(engine()), "convert-jobs", str(jobs)], capture_output=True, text=True)
    assert r.returncode != 0 and "iq2_xxs storage is kept from GGUF blocks of that type only" in r.stderr, r.stderr


def test_container_check_of_low_bit_rows():
    """A low-bit tensor is checked against whole blocks: its bytes, and a declared width that is
    not whole blocks (a damaged manifest) is named, not raised."""
    from colibri.model.container_scan import check_storage
    assert check_storage("w", {"dtype": "U8", "shape": [2, 84]}, ["q2_k", 2, 256]) is None
    assert "stored as U8 [2, 84] but declared iq2_xxs" in check_storage("w", {"dtype": "U8", "shape": [2, 84]},
                                                                         ["iq2_xxs", 2, 256])
    assert "not whole 256-element blocks" in check_storage("w", {"dtype": "U8", "shape": [2, 84]}, ["q2_k", 2, 300])
