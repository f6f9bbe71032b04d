"""GGUF import of llama.cpp's qwen35moe (Qwen3.5 / Qwen3.6 MoE) files: the qwen3_5_moe_text oracle
checkpoint is written as GGUF the way llama.cpp's Qwen3_5MoeTextModel lays it out (tensor names
from the gguf package's TensorNameMap, A_log as -exp(A_log), value heads reordered from grouped
to tiled, the conv squeezed, norms as 1 + w, experts stacked), converted back, and run by the
engine next to the same weights converted from safetensors."""
import json
from pathlib import Path

import numpy as np
import pytest
from needs import need

from test_gguf_common import convert, gguf_engine
from test_gguf_convert import add_bpe_tokenizer, load_hf, logits, tensor_putter
from test_gguf_softmax_moe import ratio, reference

gguf = need("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402

from colibri.convert import gguf as convert_gguf  # noqa: E402
from colibri.convert import hf as convert_hf  # noqa: E402
from colibri.convert.hf import ConvertError  # noqa: E402

VARIANT = "qwen3_5_moe_text"
EXACT_TOL = 1e-3  # as tests/test_oracles.py: max|logit-ref| <= 1e-3 max|ref|


def tiled(x, dim, nk, r, hd):
    """llama.cpp's _reorder_v_heads: value heads grouped by key head -> tiled, along dim."""
    shape = list(x.shape)
    y = x.reshape(shape[:dim] + [nk, r, hd] + shape[dim + 1:])
    return np.swapaxes(y, dim, dim + 1).reshape(shape)


def llama_cpp_tensor(hf, x, cfg):
    """One HF tensor as llama.cpp's converter rewrites it (float32 arithmetic)."""
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, r = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], nv // nk
    if "linear_attn." in hf and nk != nv:
        qk = 2 * nk * dk
        if ".in_proj_qkv." in hf:
            x = np.concatenate([x[:qk], tiled(x[qk:], 0, nk, r, dv)])
        elif ".in_proj_z." in hf:
            x = tiled(x, 0, nk, r, dv)
        elif ".in_proj_a." in hf or ".in_proj_b." in hf or hf.endswith((".A_log", ".dt_bias")):
            x = tiled(x, 0, nk, r, 1)
        elif ".conv1d." in hf:
            x = x.squeeze()
            x = np.concatenate([x[:qk], tiled(x[qk:], 0, nk, r, dv)])
        elif ".out_proj." in hf:
            x = tiled(x, 1, nk, r, dv)
    if hf.endswith(".A_log"):
        x = -np.exp(x.astype(np.float32))
    elif ".conv1d." in hf:
        x = x.squeeze()
    elif hf.endswith("norm.weight") and not hf.endswith("linear_attn.norm.weight"):
        x = x.astype(np.float32) + np.float32(1)
    return x


def write_qwen35_gguf(path, hf_dir, matrix_type=T.F32, mtp=False):
    """llama.cpp's Qwen3_5MoeTextModel conversion of an HF checkpoint, in small; mtp=True adds an
    MTP block after the text model's layers (blk.L.nextn.*), as llama.cpp writes a release's."""
    cfg = json.loads((Path(hf_dir) / "config.json").read_text())
    arch = gguf.MODEL_ARCH.QWEN35MOE
    sd = load_hf(hf_dir)
    L, H, nh, hd = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"]
    E = cfg["num_experts"]
    types = cfg["layer_types"]
    every = types.index("full_attention") + 1
    assert types == ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(L)]
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    w.add_block_count(L + int(mtp))
    if mtp:
        w.add_nextn_predict_layers(1)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(H)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(nh)
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(float(cfg["rope_parameters"]["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(E)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    w.add_ssm_conv_kernel(cfg["linear_conv_kernel_dim"])
    w.add_ssm_state_size(cfg["linear_key_head_dim"])
    w.add_ssm_group_count(cfg["linear_num_key_heads"])
    w.add_ssm_time_step_rank(cfg["linear_num_value_heads"])
    w.add_ssm_inner_size(cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"])
    w.add_full_attention_interval(every)
    w.add_rope_dimension_count(int(hd * cfg["rope_parameters"]["partial_rotary_factor"]))
    w.add_rope_dimension_sections(cfg["rope_parameters"]["mrope_section"] + [0])
    add_bpe_tokenizer(w, hf_dir, cfg["eos_token_id"], pre="qwen35")

    put = tensor_putter(w, matrix_type, unblocked=(T.F32, T.F16, T.BF16))

    names = gguf.get_tensor_name_map(arch, L)
    for hf, x in sd.items():
        if ".experts." in hf:
            continue
        base = hf.rsplit(".", 1)[0] if hf.endswith((".weight", ".bias")) else hf
        suffix = hf[len(base):]
        if hf.endswith(".dt_bias"):  # llama.cpp renames it dt_proj.bias
            base, suffix = hf[:-len(".dt_bias")] + ".dt_proj", ".bias"
        gg = names.get_name(base)
        assert gg is not None, hf
        x = llama_cpp_tensor(hf, x, cfg)
        if hf.endswith("shared_expert_gate.weight"):
            x = x.reshape(-1)
        # the router, the DeltaNet's small projections and the conv stay F32, as llama.cpp keeps them
        small = gg.endswith(("ffn_gate_inp", "ffn_gate_inp_shexp", "ssm_alpha", "ssm_beta", "ssm_conv1d"))
        put(f"{gg}{suffix}", x, T.F32 if small else None)
    for l in range(L):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            x = np.stack([sd[f"model.layers.{l}.mlp.experts.{e}.{proj}.weight"] for e in range(E)])
            put(names.get_name(f"model.layers.{l}.mlp.experts.{proj}") + ".weight", x)
    if mtp:  # a few of the MTP block's tensors: none of them may reach the container
        rng = np.random.default_rng(0)
        put(f"blk.{L}.nextn.eh_proj.weight", rng.standard_normal((H, 2 * H)).astype(np.float32))
        put(f"blk.{L}.nextn.enorm.weight", np.ones(H, np.float32))
        put(f"blk.{L}.attn_norm.weight", np.ones(H, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def from_safetensors(oracle_root, tmp_path, **kw):
    """The safetensors conversion, with rms_norm_eps rounded to float32 as GGUF stores it, so
    any difference left is the tensors'."""
    hf, src = tmp_path / "hf", Path(oracle_root) / VARIANT / "hf"
    hf.mkdir()
    for f in src.iterdir():
        (hf / f.name).symlink_to(f.resolve())
    cfg = json.loads((src / "config.json").read_text())
    cfg["rms_norm_eps"] = float(np.float32(cfg["rms_norm_eps"]))
    (hf / "config.json").unlink()
    (hf / "config.json").write_text(json.dumps(cfg))
    return convert_hf.convert(hf, tmp_path / "st", log=lambda *a, **k: None, **kw)


def test_qwen35moe_gguf_matches_safetensors(oracle_root, tmp_path):
    """The f32 container from the GGUF file gives the logits of the safetensors conversion, and
    both match transformers' reference: every rewrite is undone."""
    info, ref = reference(oracle_root, VARIANT)
    src = write_qwen35_gguf(tmp_path / "m.gguf", Path(oracle_root) / VARIANT / "hf")
    out = convert(src, tmp_path / "g", experts="f32", dense="f32")
    st = from_safetensors(oracle_root, tmp_path, experts="f32", dense="f32")
    got = logits(out, info["ids"], tmp_path / "g.f32")
    want = logits(st, info["ids"], tmp_path / "s.f32")
    r_st, r_ref = ratio(got, want), ratio(got, ref)
    print(f"qwen35moe via GGUF (f32): vs safetensors {r_st:.2e}, vs transformers {r_ref:.2e}")
    assert r_st == 0 and r_ref <= EXACT_TOL
    assert (got.argmax(-1) == ref.argmax(-1)).all()
    man, st_man = (json.loads((d / "colibri.json").read_text()) for d in (out, st))
    assert man["family"] == st_man["family"] == "qwen3_5_moe"
    assert not (out / convert_gguf.gguf_qwen35.SCRATCH).exists()
    assert man["layers"] == st_man["layers"] and man["arch"] == st_man["arch"]


def test_mtp_block_is_left_out(oracle_root, tmp_path):
    """A file with llama.cpp's MTP block after the text layers converts to the same container
    (nextn_predict_layers taken off block_count), and the log says the head is left out."""
    info, _ = reference(oracle_root, VARIANT)
    src = write_qwen35_gguf(tmp_path / "m.gguf", Path(oracle_root) / VARIANT / "hf", mtp=True)
    notes = []
    gguf_engine()
    out = convert_gguf.convert(src, tmp_path / "g", experts="f32", dense="f32", log=lambda m, **k: notes.append(m))
    plain = convert(write_qwen35_gguf(tmp_path / "p.gguf", Path(oracle_root) / VARIANT / "hf"), tmp_path / "p",
                    experts="f32", dense="f32")
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 4
    assert any("multi-token-prediction head (3 tensors" in n for n in notes), notes
    got, want = logits(out, info["ids"], tmp_path / "g.f32"), logits(plain, info["ids"], tmp_path / "p.f32")
    assert ratio(got, want) == 0


def test_a_log_and_heads_come_back(oracle_root, tmp_path):
    """The undone DeltaNet tensors equal the checkpoint's: A_log from -exp(A_log), dt_bias and
    out_proj's columns back from tiled to grouped heads, norms from 1 + w."""
    from colibri.convert import gguf_qwen35
    hf_dir = Path(oracle_root) / VARIANT / "hf"
    sd = load_hf(hf_dir)
    g = convert_gguf.read_gguf(write_qwen35_gguf(tmp_path / "m.gguf", hf_dir))
    family, cfg = convert_gguf.build_config(g, g.tensors)
    assert cfg["layer_types"] == json.loads((hf_dir / "config.json").read_text())["layer_types"]
    table, sources = convert_gguf.map_tensors(g, family, cfg)
    for hf in ("model.layers.0.linear_attn.A_log", "model.layers.0.linear_attn.dt_bias",
               "model.layers.0.linear_attn.out_proj.weight", "model.layers.1.self_attn.q_norm.weight",
               "model.norm.weight"):
        info, _, (kind, how) = sources[hf]
        assert kind == "scratch", hf
        shape = table[hf]["shape"]
        vals = sum(gguf_qwen35.undone(g, info, how, 1 if len(shape) == 1 else shape[0], shape[-1]), [])
        # bit for bit: A_log too, although log(-x) alone comes out a float32 step off for layer 0
        np.testing.assert_array_equal(np.array(vals, np.float32), sd[hf].reshape(-1), err_msg=hf)
    assert table["model.layers.0.linear_attn.conv1d.weight"]["shape"] == list(sd["model.layers.0.linear_attn.conv1d.weight"].shape)


def test_bf16_gguf_is_exact(oracle_root, tmp_path):
    """BF16 matrices (llama.cpp's --outtype bf16) of a bf16 checkpoint hold the same values, so
    the f32 container matches the safetensors one exactly; ssm_out's columns are put back from BF16."""
    info, _ = reference(oracle_root, VARIANT)
    src = write_qwen35_gguf(tmp_path / "m.gguf", Path(oracle_root) / VARIANT / "hf", matrix_type=T.BF16)
    assert convert_gguf.read_gguf(src).tensors["blk.0.ssm_out.weight"].type_name == "BF16"
    out = convert(src, tmp_path / "g", experts="f32", dense="f32")
    st = from_safetensors(oracle_root, tmp_path, experts="f32", dense="f32")
    assert ratio(logits(out, info["ids"], tmp_path / "g.f32"), logits(st, info["ids"], tmp_path / "s.f32")) == 0


def test_q8_0_gguf_matches_q8_safetensors(oracle_root, tmp_path):
    """Q8_0 matrices (F16 where a row is not whole blocks; ssm_out's columns, reordered inside its
    blocks, dequantized and put back) in a q8 container: the Q8_0 blocks are kept, and the
    logits stay as close to the safetensors q8 container as both are to transformers."""
    info, ref = reference(oracle_root, VARIANT)
    src = write_qwen35_gguf(tmp_path / "m.gguf", Path(oracle_root) / VARIANT / "hf", matrix_type=T.Q8_0)
    out = convert(src, tmp_path / "g", experts="q8", dense="q8")
    st = from_safetensors(oracle_root, tmp_path, experts="q8", dense="q8")
    got = logits(out, info["ids"], tmp_path / "g.f32")
    want = logits(st, info["ids"], tmp_path / "s.f32")
    r = ratio(got, want)
    top1 = float((got.argmax(-1) == want.argmax(-1)).mean())
    kept = json.loads((out / "colibri.json").read_text())["quant"]["from_gguf"]
    assert kept.get("Q8_0 -> q8", 0) > 0, kept
    print(f"qwen35moe Q8_0 GGUF vs safetensors (q8): max ratio {r:.2e}, top-1 agreement {top1:.3f}; "
          f"vs transformers: GGUF {ratio(got, ref):.2e}, safetensors {ratio(want, ref):.2e}")
    assert ratio(got, ref) <= 1.25 * ratio(want, ref) + 1e-3 and r <= 2 * ratio(want, ref) + 1e-3 and top1 >= 0.9


def test_other_blocks_in_out_proj_are_refused(oracle_root, tmp_path):
    """A Q4_0 ssm_out (its columns reordered inside 4-bit blocks) is refused with a clear error."""
    src = write_qwen35_gguf(tmp_path / "m.gguf", Path(oracle_root) / VARIANT / "hf", matrix_type=T.Q4_0)
    with pytest.raises(ConvertError, match="ssm_out.weight is Q4_0"):
        convert(src, tmp_path / "g", experts="q8", dense="q8")


def test_positive_ssm_a_is_refused_before_writing(oracle_root, tmp_path):
    """ssm_a holds -exp(A_log), so a value >= 0 is a damaged file: refused, nothing written."""
    src = write_qwen35_gguf(tmp_path / "m.gguf", Path(oracle_root) / VARIANT / "hf")
    info = convert_gguf.read_gguf(src).tensors["blk.2.ssm_a"]
    with open(src, "r+b") as f:
        f.seek(info.offset)
        f.write(np.float32(0.5).tobytes())
    with pytest.raises(ConvertError, match="blk.2.ssm_a must hold -exp"):
        convert(src, tmp_path / "g", experts="f32", dense="f32")
    assert not (tmp_path / "g").exists()


@pytest.mark.parametrize("edit,message", [
    (lambda g: g.metadata.update({"qwen35moe.ssm.group_count": 3}), "not a valid DeltaNet geometry"),
    (lambda g: g.metadata.update({"qwen35moe.expert_count": 4}), "must hold 4 experts"),
    (lambda g: g.metadata.pop("qwen35moe.full_attention_interval"), "lacks qwen35moe.full_attention_interval"),
])
def test_inconsistent_files_are_refused(edit, message, oracle_root, tmp_path):
    g = convert_gguf.read_gguf(write_qwen35_gguf(tmp_path / "m.gguf", Path(oracle_root) / VARIANT / "hf"))
    edit(g)
    with pytest.raises(ConvertError, match=message):
        convert_gguf.build_config(g, g.tensors)
