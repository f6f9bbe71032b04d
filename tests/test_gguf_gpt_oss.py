"""GGUF import of llama.cpp's gpt-oss files: the gpt_oss oracle (and its MXFP4 form, as the
releases ship it) written as GGUF the way llama.cpp's convert_hf_to_gguf.py GptOssModel lays it
out (gate/up split from the fused tensor, MXFP4 blocks repacked into GGUF type 39 with their
scales, per-expert biases, attn_sinks), converted back and run by the engine next to the same
weights converted from safetensors."""
import json
from pathlib import Path

import numpy as np
import pytest
from needs import need

import mxfp4_ref
from test_gguf_common import convert
from test_gguf_convert import add_bpe_tokenizer, load_hf, logits

gguf = need("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402

from colibri.convert import hf as convert_hf  # noqa: E402

EXACT_TOL = 1e-3  # as tests/test_oracles.py


def ggml_mxfp4(blocks, scales):
    """Release MXFP4 ([..., G, 16]: byte j = elements 2j, 2j+1; scales [..., G]) -> GGUF MXFP4
    bytes [..., G * 17] (e8m0, then byte j = element j low, j + 16 high): llama.cpp's repack_mxfp4."""
    lo, hi = blocks & 15, blocks >> 4
    codes = np.stack([lo, hi], -1).reshape(*blocks.shape[:-1], 32)  # element order
    qs = (codes[..., :16] | (codes[..., 16:] << 4)).astype(np.uint8)
    return np.concatenate([scales[..., None], qs], -1).reshape(*scales.shape[:-1], -1)


def write_gpt_oss_gguf(path, hf_dir, mx_dir=None):
    """llama.cpp's GptOssModel conversion in small; experts F32 from hf_dir, or MXFP4 (type 39)
    from the MXFP4 checkpoint mx_dir."""
    cfg = json.loads((Path(hf_dir) / "config.json").read_text())
    sd = load_hf(hf_dir)
    L, H, I = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"]
    rope = cfg["rope_parameters"]
    arch = gguf.MODEL_ARCH.GPT_OSS
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    w.add_block_count(L)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(H)
    w.add_feed_forward_length(I)
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(cfg["num_local_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(I)
    w.add_sliding_window(cfg["sliding_window"])
    w.add_swiglu_clamp_exp([cfg["swiglu_limit"]] * L)  # the oracle's limit is not llama.cpp's fixed 7
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rope["factor"])
    w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    add_bpe_tokenizer(w, hf_dir, cfg["eos_token_id"])
    names = gguf.get_tensor_name_map(arch, L)
    for hf, x in sd.items():
        if ".mlp.experts." in hf:
            continue
        base, suffix = (hf, "weight") if hf.endswith(".sinks") else hf.rsplit(".", 1)
        gg = names.get_name(base)
        assert gg is not None, hf
        w.add_tensor(f"{gg}.{suffix}", np.ascontiguousarray(x, dtype=np.float32))
    packed = None
    if mx_dir is not None:
        from safetensors.torch import load_file
        packed = {k: v.numpy() for k, v in load_file(str(Path(mx_dir) / "model.safetensors")).items() if k.endswith(("_blocks", "_scales"))}
    for l in range(L):
        pre, blk = f"model.layers.{l}.mlp.experts", f"blk.{l}"
        gub, dnb = sd[f"{pre}.gate_up_proj_bias"], sd[f"{pre}.down_proj_bias"]
        for name, b in (("ffn_gate_exps", gub[:, ::2]), ("ffn_up_exps", gub[:, 1::2]), ("ffn_down_exps", dnb)):
            w.add_tensor(f"{blk}.{name}.bias", np.ascontiguousarray(b, dtype=np.float32))
        if packed is None:  # [E, in, out] -> [E, out, in], gate = the even outputs
            gu, dn = sd[f"{pre}.gate_up_proj"].transpose(0, 2, 1), sd[f"{pre}.down_proj"].transpose(0, 2, 1)
            for name, x in (("ffn_gate_exps", gu[:, ::2]), ("ffn_up_exps", gu[:, 1::2]), ("ffn_down_exps", dn)):
                w.add_tensor(f"{blk}.{name}.weight", np.ascontiguousarray(x, dtype=np.float32))
            continue
        gb, gs = packed[f"{pre}.gate_up_proj_blocks"], packed[f"{pre}.gate_up_proj_scales"]
        db, ds = packed[f"{pre}.down_proj_blocks"], packed[f"{pre}.down_proj_scales"]
        for name, b, s in (("ffn_gate_exps", gb[:, ::2], gs[:, ::2]), ("ffn_up_exps", gb[:, 1::2], gs[:, 1::2]),
                           ("ffn_down_exps", db, ds)):
            w.add_tensor(f"{blk}.{name}.weight", np.ascontiguousarray(ggml_mxfp4(b, s)), raw_dtype=T.MXFP4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def oracle(oracle_root):
    vdir = Path(oracle_root) / "gpt_oss"
    info = json.loads((vdir / "ref.json").read_text())
    return vdir, info, np.fromfile(vdir / "ref_logits.f32", dtype="<f4").reshape(info["logits_shape"])


def test_repacked_blocks_decode_as_gguf_reads_them():
    """The repack above is what the gguf package's own MXFP4 dequantization reads back."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 64)).astype(np.float32) * 3
    b, s = mxfp4_ref.quantize(x)
    got = gguf.quants.dequantize(ggml_mxfp4(b, s), T.MXFP4)
    assert np.array_equal(got, mxfp4_ref.dequantize(b, s))


def test_gpt_oss_gguf_matches_safetensors(oracle, tmp_path):
    vdir, info, ref = oracle
    src = write_gpt_oss_gguf(tmp_path / "m.gguf", vdir / "hf")
    out = convert(src, tmp_path / "g", experts="f32", dense="f32")
    st = convert_hf.convert(vdir / "hf", tmp_path / "st", experts="f32", dense="f32", log=lambda *a, **k: None)
    got, want = logits(out, info["ids"], tmp_path / "g.f32"), logits(st, info["ids"], tmp_path / "s.f32")
    r_st = float(np.abs(got - want).max() / np.abs(want).max())
    r_ref = float(np.abs(got - ref).max() / np.abs(ref).max())
    print(f"gpt-oss via GGUF: vs safetensors {r_st:.2e}, vs transformers {r_ref:.2e}")
    assert r_st <= 1e-5 and r_ref <= EXACT_TOL
    man = json.loads((out / "colibri.json").read_text())
    assert man["family"] == "gpt_oss" and [s["attn"]["window"] for s in man["layers"]] == [12, 0, 12, 0]


def test_mxfp4_gguf_keeps_its_blocks_and_matches_the_safetensors_release(oracle, tmp_path):
    """MXFP4 experts (type 39): kept as mxfp4 by default, byte for byte the container the
    release-layout safetensors checkpoint gives; dequantized exactly with --experts f32."""
    vdir, info, _ = oracle
    mx = mxfp4_ref.mxfp4_checkpoint(vdir / "hf", tmp_path / "mx")
    src = write_gpt_oss_gguf(tmp_path / "m.gguf", vdir / "hf", mx_dir=mx)
    out = convert(src, tmp_path / "g")
    man = json.loads((out / "colibri.json").read_text())
    assert man["quant"]["experts"] == "mxfp4" and man["quant"]["from_gguf"].get("MXFP4 -> mxfp4") == 3 * 4 * 8
    st = convert_hf.convert(mx, tmp_path / "st", dense="f32", log=lambda *a, **k: None)
    out32 = convert(src, tmp_path / "g32", dense="f32")
    got = logits(out32, info["ids"], tmp_path / "g.f32")
    want = logits(st, info["ids"], tmp_path / "s.f32")
    assert got.tobytes() == want.tobytes()  # the same blocks, the same f32 trunk
    f32 = convert(src, tmp_path / "f32", experts="f32", dense="f32")
    ref = mxfp4_ref.reference_logits(vdir / "hf", mx, info["ids"])
    r = float(np.abs(logits(f32, info["ids"], tmp_path / "f.f32") - ref).max() / np.abs(ref).max())
    print(f"MXFP4 GGUF, f32 experts vs transformers' MXFP4 model: {r:.2e}")
    assert r <= EXACT_TOL
