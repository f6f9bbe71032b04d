"""`coli convert --imatrix FILE`: llama.cpp importance matrices (GGUF form, written here with
gguf-py's writer as llama-imatrix writes them) weigh the low-bit writer's errors.

On SmolLM2 (real weights) the imatrix is collected here from transformers' activations over real
text, and the calibrated conversion's importance-weighted error is lower than the uncalibrated
one's in every tensor class. On a tiny Qwen3-MoE each expert's blocks are exactly those the
writer gives its own vector, an expert no token reached gets its layer's mean, and files that do
not fit the model are refused with the reason."""
import atexit
import functools
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from needs import need

from test_gguf_common import ROOT, _reference, _smollm2_container, reference, smollm2_container, smollm2_gguf  # noqa: F401
from test_lowbit_quantize import container_values, decoded, rel_err, tiny_qwen3moe, write

gguf = need("gguf")
torch = need("torch")
from test_gguf_convert import load_hf  # noqa: E402

HF_TO_GGUF = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}
CALIBRATION_CHARS = 6000  # of README.md: ~1,400 tokens, as a short llama-imatrix run


class IMatrixWriter(gguf.GGUFWriter):
    def add_architecture(self):
        pass  # llama-imatrix's files name no architecture


def write_imatrix(path, entries):
    """entries: GGUF tensor name -> (sums [n_mat, K], counts [n_mat]), as llama-imatrix saves them."""
    w = IMatrixWriter(str(path), arch="")
    w.add_type("imatrix")
    w.add_array("imatrix.datasets", ["test"])
    w.add_uint32("imatrix.chunk_count", 1)
    w.add_uint32("imatrix.chunk_size", 512)
    for name, (sums, counts) in sorted(entries.items()):
        w.add_tensor(f"{name}.in_sum2", np.asarray(sums, np.float32))
        w.add_tensor(f"{name}.counts", np.asarray(counts, np.float32).reshape(-1, 1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def coli_convert(src, out, *flags, ok=True):
    r = subprocess.run([sys.executable, str(ROOT / "coli"), "convert", str(src), str(out), *flags],
                       capture_output=True, text=True, timeout=900)
    assert (r.returncode == 0) == ok, r.stderr
    return r.stderr


def smollm2_imatrix(model, ids):
    """llama-imatrix's statistics of every layer matrix: per input column, the sum of squared
    activations over the text's tokens, and the token count."""
    sums, hooks = {}, []
    for name, mod in model.named_modules():
        parts = name.split(".")
        key = ".".join(parts[3:])
        if isinstance(mod, torch.nn.Linear) and key in HF_TO_GGUF:
            gname = f"blk.{parts[2]}.{HF_TO_GGUF[key]}.weight"
            def hook(_, args, gname=gname):
                x = args[0].detach().reshape(-1, args[0].shape[-1]).double()
                s, n = sums.get(gname, (0, 0))
                sums[gname] = (s + (x * x).sum(0).numpy(), n + x.shape[0])
            hooks.append(mod.register_forward_pre_hook(hook))
    with torch.no_grad():
        for i in range(0, len(ids), 512):  # llama-imatrix's chunks
            model(torch.tensor([ids[i:i + 512]]))
    for h in hooks:
        h.remove()
    return {n: (s[None, :], [c]) for n, (s, c) in sums.items()}


@functools.lru_cache(maxsize=None)
def smollm2_calibration():
    """(README text, its ids, transformers' imatrix entries over them, the values of the plain
    --dense iq4_nl conversion), built once per run for the imatrix and the --calibrate tests."""
    from tokenizers import Tokenizer
    model, _ = _reference()
    text = (ROOT / "README.md").read_text()[:CALIBRATION_CHARS]
    ids = Tokenizer.from_file(str(_smollm2_container() / "tokenizer.json")).encode(text).ids
    tmp = Path(tempfile.mkdtemp(prefix="coli-smollm2-plain-"))
    atexit.register(shutil.rmtree, tmp, True)
    coli_convert(smollm2_gguf(), tmp / "plain", "--dense", "iq4_nl")
    return text, ids, smollm2_imatrix(model, ids), container_values(tmp / "plain")


def weighted_errors_by_class(model, entries, plain, calibrated):
    """Per tensor class: the importance-weighted relative error of the plain conversion's values
    and the calibrated conversion, summed over the layers, weighed by transformers' importance."""
    want = {k: v.float().numpy() for k, v in model.state_dict().items()}
    got_plain, got_cal = plain, container_values(calibrated)
    by_class = {}
    for gname, (sums, counts) in entries.items():
        layer, kind = gname.split(".")[1:3]
        hf = next(f"model.layers.{layer}.{k}.weight" for k, v in HF_TO_GGUF.items() if v == kind)
        imp = sums[0] / counts[0]
        errs = by_class.setdefault(kind, [0.0, 0.0])
        errs[0] += rel_err(want[hf], got_plain[hf], imp)
        errs[1] += rel_err(want[hf], got_cal[hf], imp)
    assert set(by_class) == set(HF_TO_GGUF.values())
    return by_class


def test_smollm2_calibrated_conversion_weighs_every_class(tmp_path, smollm2_container, reference):
    """--dense iq4_nl (every SmolLM2 matrix is whole 32-element blocks) with and without the
    imatrix: in each class the error weighted by the columns' importance falls."""
    model, _ = reference
    _, _, entries, plain = smollm2_calibration()
    imatrix = write_imatrix(tmp_path / "imatrix.gguf", entries)
    src = next(iter(json.loads((smollm2_container / "colibri.json").read_text())["source"]["files"]))
    gguf_file = smollm2_gguf()
    assert gguf_file.name == src
    calibrated = tmp_path / "cal"
    log = coli_convert(gguf_file, calibrated, "--dense", "iq4_nl", "--imatrix", imatrix)
    assert f"imatrix: importance for {len(entries)} of " in log, log
    for kind, (p, c) in sorted(weighted_errors_by_class(model, entries, plain, calibrated).items()):
        print(f"{kind}: importance-weighted relative error {p / 30:.5f} plain, {c / 30:.5f} calibrated")
        assert c < p, kind


def moe_imatrix(hf, rng, silent_expert=(1, 3)):
    """Random statistics for every matrix of the tiny Qwen3-MoE llama.cpp collects (attention and
    experts; per expert for the experts), one expert of one layer never reached."""
    sd = load_hf(hf)
    cfg = json.loads((hf / "config.json").read_text())
    L = cfg["num_hidden_layers"]
    E = len({n.split(".")[5] for n in sd if n.startswith("model.layers.0.mlp.experts.")})
    entries = {}
    for l in range(L):
        for proj, g in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")):
            k = sd[f"model.layers.{l}.self_attn.{proj}.weight"].shape[1]
            entries[f"blk.{l}.{g}.weight"] = (rng.exponential(1.0, (1, k)) ** 2 * 40, [40])
        for proj, g in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
            k = sd[f"model.layers.{l}.mlp.experts.0.{proj}.weight"].shape[1]
            counts = rng.integers(5, 50, E).astype(np.float32)
            if l == silent_expert[0]:
                counts[silent_expert[1]] = 0
            sums = rng.exponential(1.0, (E, k)) ** 2 * counts[:, None]
            entries[f"blk.{l}.{g}.weight"] = (sums, counts)
    return entries


def test_moe_experts_get_their_own_vectors(tmp_path):
    """Each expert's blocks equal those convert-jobs writes with that expert's in_sum2 / counts;
    the expert no token reached gets the mean of its layer's others; attention its own."""
    hf = tiny_qwen3moe(tmp_path, 421)
    rng = np.random.default_rng(5)
    entries = moe_imatrix(hf, rng)
    imatrix = write_imatrix(tmp_path / "moe.imatrix.gguf", entries)
    out = tmp_path / "c"
    log = coli_convert(hf, out, "--experts", "q2_k", "--dense", "q3_k", "--imatrix", imatrix)
    assert "imatrix: importance for 84 of 86 low-bit tensors (3 matrices no calibration token reached took " \
           "their layer's mean); the others: plain least squares" in log, log  # embed and head: no entries
    sd = load_hf(hf)
    from safetensors.numpy import load_file
    stored = {}
    for shard in json.loads((out / "colibri.json").read_text())["shards"]:
        stored.update({k: v.tobytes() for k, v in load_file(str(out / shard)).items()})
    sums, counts = entries["blk.1.ffn_down_exps.weight"]
    # as the file holds them (f32), each expert's mean rounded to f32 as the converter stores it
    means = (sums.astype(np.float32).astype(np.float64) / counts.astype(np.float32)[:, None]).astype(np.float32)
    reached = counts > 0
    checks = {"model.layers.1.mlp.experts.0.down_proj.weight": ("q2_k", means[0]),
              "model.layers.1.mlp.experts.3.down_proj.weight": ("q2_k", means[reached].astype(np.float64).sum(0) / reached.sum()),
              "model.layers.2.self_attn.o_proj.weight": ("q3_k", entries["blk.2.attn_output.weight"][0][0] / 40)}
    for name, (storage, imp) in checks.items():
        x = sd[name]
        assert stored[name] == write(tmp_path, x, storage, importance=imp.astype(np.float32)), name
        assert stored[name] != write(tmp_path, x, storage), f"{name}: the importance changed nothing"
    values = container_values(out)
    assert rel_err(sd["model.layers.1.mlp.experts.0.down_proj.weight"], values["model.layers.1.mlp.experts.0.down_proj.weight"]) < 0.1


def test_imatrix_refusals(tmp_path):
    hf = tiny_qwen3moe(tmp_path, 431)
    rng = np.random.default_rng(6)
    good = write_imatrix(tmp_path / "good.gguf", moe_imatrix(hf, rng))
    err = coli_convert(hf, tmp_path / "a", "--experts", "q4", "--imatrix", good, ok=False)
    assert "--imatrix weighs the low-bit writers only" in err, err
    other = write_imatrix(tmp_path / "other.gguf", {"blk.0.ffn_down.weight": (np.ones((1, 64)), [1])})
    err = coli_convert(hf, tmp_path / "b", "--experts", "q3_k", "--imatrix", other, ok=False)
    assert "none of its entries names a tensor of this model" in err, err
    wide = write_imatrix(tmp_path / "wide.gguf", {"blk.0.attn_q.weight": (np.ones((1, 512)), [1])})
    err = coli_convert(hf, tmp_path / "c", "--dense", "q3_k", "--imatrix", wide, ok=False)
    assert "imatrix entry 'blk.0.attn_q.weight' is [512, 1]" in err and "the imatrix is of another model" in err, err
    (tmp_path / "legacy.dat").write_bytes(b"\x01\x00\x00\x00" + b"x" * 64)
    err = coli_convert(hf, tmp_path / "d", "--dense", "q3_k", "--imatrix", tmp_path / "legacy.dat", ok=False)
    assert "not a GGUF file" in err and "convert_legacy_imatrix_to_gguf.py" in err, err
    negative = write_imatrix(tmp_path / "neg.gguf", {"blk.0.attn_q.weight": (-np.ones((1, 256)), [1])})
    err = coli_convert(hf, tmp_path / "e", "--dense", "q3_k", "--imatrix", negative, ok=False)
    assert "holds negative or non-finite sums" in err, err
    for d in "abcde":
        assert not (tmp_path / d / "colibri.json").exists()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
