"""Block-FP8 sources (the DeepSeek-V3 / GLM releases' format): float8_e4m3 weights with a
weight_scale_inv per block are dequantized exactly before re-quantizing, so an FP8 checkpoint
converts to the same container as its dequantized f32 copy."""
import json
import shutil
from pathlib import Path

import pytest

from launcher_helpers import coli

F32 = ["--experts", "f32", "--dense", "f32"]
BLOCK = [24, 16]  # smaller than the releases' 128 x 128 so the tiny weights span several, some partial


def quantize(w, block):
    """(fp8 weight, f32 scale_inv, the f32 value they encode) for one 2-D weight."""
    import torch
    r, c = w.shape
    br, bc = block
    nr, nc = -(-r // br), -(-c // bc)
    pad = torch.zeros(nr * br, nc * bc)
    pad[:r, :c] = w.float()
    blocks = pad.view(nr, br, nc, bc)
    scale = (blocks.abs().amax(dim=(1, 3)) / 448.0).clamp(min=1e-12)
    q = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn)
    deq = (q.float() * scale[:, None, :, None]).view(nr * br, nc * bc)[:r, :c]
    return q.view(nr * br, nc * bc)[:r, :c].contiguous(), scale, deq.contiguous()


@pytest.fixture(scope="module")
def fp8_pairs(oracle_root, tmp_path_factory):
    """pair(variant): the oracle as an FP8 checkpoint (linear weights of attention, MLPs and
    experts; routers, norms, embeddings stay as they were, as in the releases) and as the f32
    checkpoint of exactly the values the FP8 one encodes."""
    from safetensors.torch import load_file, save_file
    made = {}

    def pair(variant):
        if variant in made:
            return made[variant]
        src = Path(oracle_root) / variant / "hf"
        root = tmp_path_factory.mktemp(f"fp8_{variant}")
        fp8, deq = root / "fp8", root / "deq"
        for d in (fp8, deq):
            shutil.copytree(src, d, ignore=shutil.ignore_patterns("*.safetensors", "*.index.json"))
        a, b = {}, {}
        for f in sorted(src.glob("*.safetensors")):
            for name, w in load_file(f).items():
                linear = w.dim() == 2 and any(x in name for x in (".self_attn.", "_proj.", ".experts."))
                if linear:
                    q, s, v = quantize(w, BLOCK)
                    a[name], a[name + "_scale_inv"], b[name] = q, s, v
                else:
                    a[name], b[name] = w, w.float()
        save_file(a, fp8 / "model.safetensors")
        save_file(b, deq / "model.safetensors")
        cfg = json.loads((fp8 / "config.json").read_text())
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                      "weight_block_size": BLOCK}
        (fp8 / "config.json").write_text(json.dumps(cfg))
        assert sum(1 for k in a if k.endswith("_scale_inv")) > 20
        made[variant] = fp8, deq
        return made[variant]
    return pair


# DeepSeek-V3 / GLM, MiniMax-M2 (experts under w1/w2/w3) and MiMo-V2-Flash releases ship block-FP8
@pytest.mark.parametrize("variant", ["deepseek_v3", "minimax_m2", "mimo_v2_flash"])
def test_fp8_source_converts_to_its_exact_values(variant, fp8_pairs, oracle_root, tmp_path):
    fp8, deq = fp8_pairs(variant)
    info = json.loads((Path(oracle_root) / variant / "ref.json").read_text())
    outs = {}
    for name, src in (("fp8", fp8), ("deq", deq)):
        r = coli("convert", src, tmp_path / name, *F32, timeout=600)
        assert r.returncode == 0, r.stderr
        r = coli("logits", "--model", tmp_path / name, "--ids", ",".join(map(str, info["ids"][:48])),
                 "--out", tmp_path / f"{name}.f32", timeout=600)
        assert r.returncode == 0, r.stderr
        outs[name] = (tmp_path / f"{name}.f32").read_bytes()
    assert outs["fp8"] == outs["deq"]
    shards = lambda d: {p.name: p.read_bytes() for p in sorted(Path(d).glob("*.safetensors"))}  # noqa: E731
    assert shards(tmp_path / "fp8") == shards(tmp_path / "deq")  # the same container, byte for byte


def test_fp8_weight_without_its_scale_is_refused(fp8_pairs, tmp_path):
    from safetensors.torch import load_file, save_file
    fp8, _ = fp8_pairs("deepseek_v3")
    bad = tmp_path / "bad"
    shutil.copytree(fp8, bad)
    t = load_file(bad / "model.safetensors")
    gone = next(k for k in t if k.endswith("q_a_proj.weight_scale_inv"))
    del t[gone]
    save_file(t, bad / "model.safetensors")
    r = coli("convert", bad, tmp_path / "out", *F32, timeout=600)
    assert r.returncode != 0 and gone in r.stderr and "block scale" in r.stderr
