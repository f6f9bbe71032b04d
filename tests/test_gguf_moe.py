"""GGUF import of llama.cpp's glm4moe and deepseek2 files: the glm4_moe / deepseek_v3 oracle
checkpoints are written as GGUF the way llama.cpp's convert_hf_to_gguf.py lays them out (its
tensor names from the gguf package's TensorNameMap, its metadata keys, MTP layers counted in
glm4moe's block_count, kv_b_proj split into attn_k_b (transposed) / attn_v_b or kept whole),
converted back, and run by the engine next to the same weights converted from safetensors."""
import json
from pathlib import Path

import numpy as np
import pytest
from needs import need

from test_gguf_common import convert, engine
from test_gguf_convert import add_bpe_tokenizer, load_hf, logits, tensor_putter

gguf = need("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402

from colibri.convert import gguf as convert_gguf  # noqa: E402
from colibri.convert import hf as convert_hf  # noqa: E402
from colibri.errors import ConvertError  # noqa: E402

EXACT_TOL = 1e-3  # as tests/test_oracles.py: max|logit-ref| <= 1e-3 max|ref|
GGUF_ARCH = {"glm4_moe": gguf.MODEL_ARCH.GLM4_MOE, "deepseek_v3": gguf.MODEL_ARCH.DEEPSEEK2}


def write_moe_gguf(path, hf_dir, split_kv_b=True, matrix_type=T.F32, kb_type=None, exact=None):
    """llama.cpp's Glm4MoeModel / DeepseekV2Model conversion of an HF checkpoint, in small.
    split_kv_b: True (recent llama.cpp: attn_k_b + attn_v_b), False (attn_kv_b), "both" (the
    early MLA versions kept attn_kv_b beside the split copies). exact: see tensor_putter."""
    cfg = json.loads((Path(hf_dir) / "config.json").read_text())
    family = cfg["model_type"]
    arch = GGUF_ARCH[family]
    sd = load_hf(hf_dir)
    L, H, nh = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"]
    nextn = cfg.get("num_nextn_predict_layers") or 0
    blocks = L + nextn if family == "glm4_moe" else L  # deepseek2 drops the MTP layers
    rope = dict(cfg.get("rope_parameters") or {})
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    w.add_block_count(blocks)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(H)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(nh)
    w.add_rope_freq_base(float(rope["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(cfg["n_routed_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_count(cfg["n_shared_experts"])
    w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    w.add_expert_weights_norm(cfg["norm_topk_prob"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    # deepseek2 writes the groups; glm4moe's converter does not (GLM-4.5 has one group), but the
    # oracle has several, so they are written for both
    w.add_expert_group_count(cfg["n_group"])
    w.add_expert_group_used_count(cfg["topk_group"])
    if family == "glm4_moe":
        hd = cfg["head_dim"]
        w.add_head_count_kv(cfg["num_key_value_heads"])
        w.add_key_length(hd)
        w.add_value_length(hd)
        w.add_rope_dimension_count(int(hd * rope.get("partial_rotary_factor", 0.5)))
        w.add_nextn_predict_layers(nextn)
    else:
        kl, dr, dn, dv = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
        if cfg.get("q_lora_rank"):
            w.add_q_lora_rank(cfg["q_lora_rank"])
        w.add_kv_lora_rank(kl)
        if split_kv_b is True:  # llama.cpp's MLA mode: one KV head of the latent
            w.add_head_count_kv(1)
            w.add_key_length(kl + dr)
            w.add_value_length(kl)
            w.add_key_length_mla(dn + dr)
            w.add_value_length_mla(dv)
        else:
            w.add_head_count_kv(nh)
            w.add_key_length(dn + dr)
            w.add_value_length(dv)
        w.add_rope_dimension_count(dr)
        if rope.get("rope_type") == "yarn":
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            w.add_rope_scaling_factor(rope["factor"])
            w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
            w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])
    add_bpe_tokenizer(w, hf_dir, cfg["eos_token_id"])

    put = tensor_putter(w, matrix_type, exact=exact)

    names = gguf.get_tensor_name_map(arch, blocks)
    E = cfg["n_routed_experts"]
    for hf, x in sd.items():
        if ".mlp.experts." in hf:
            continue
        base, suffix = hf.rsplit(".", 1)
        if hf.endswith("e_score_correction_bias"):  # llama.cpp renames it e_score_correction.bias
            base, suffix = hf[:-len("_bias")], "bias"
        if hf.endswith("kv_b_proj.weight") and split_kv_b:
            kv_b = x.reshape(nh, dn + dv, kl)
            k_b = np.ascontiguousarray(kv_b[:, :dn].transpose(0, 2, 1))   # [nh, kl, dn]
            put(names.get_name(base.replace("kv_b_proj", "k_b_proj")) + ".weight", k_b, kb_type)
            put(names.get_name(base.replace("kv_b_proj", "v_b_proj")) + ".weight", kv_b[:, dn:])
            if split_kv_b != "both":
                continue
        gg = names.get_name(base)
        assert gg is not None, hf
        put(f"{gg}.{suffix}", x, T.F32 if gg.endswith("ffn_gate_inp") else None)  # llama.cpp keeps routers F32
    for l in range(blocks):
        pre = f"model.layers.{l}.mlp.experts"
        if f"{pre}.0.gate_proj.weight" in sd:
            for proj in ("gate_proj", "up_proj", "down_proj"):
                put(names.get_name(f"{pre}.{proj}") + ".weight",
                    np.stack([sd[f"{pre}.{e}.{proj}.weight"] for e in range(E)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def with_glm_mtp(oracle_root, tmp_path):
    """The glm4_moe oracle plus the MTP layer its config declares, at index L: a copy of its last
    layer (experts included) and the MTP-only projections and norms."""
    import shutil
    from safetensors.torch import load_file, save_file
    src = Path(oracle_root) / "glm4_moe" / "hf"
    L = json.loads((src / "config.json").read_text())["num_hidden_layers"]
    d = tmp_path / "hf_mtp"
    shutil.copytree(src, d)
    t = load_file(d / "model.safetensors")
    last = f"model.layers.{L - 1}."
    extra = {f"model.layers.{L}." + k[len(last):]: v.clone() for k, v in t.items() if k.startswith(last)}
    w = t["model.norm.weight"]
    H = w.shape[0]
    extra[f"model.layers.{L}.eh_proj.weight"] = w.new_ones(H, 2 * H) * 0.5
    for n in ("enorm", "hnorm", "shared_head.norm"):
        extra[f"model.layers.{L}.{n}.weight"] = w.new_ones(H) * 2
    save_file({**t, **extra}, d / "model.safetensors")
    return d, L, extra


def from_safetensors(oracle_root, variant, tmp_path, **kw):
    return convert_hf.convert(Path(oracle_root) / variant / "hf", tmp_path / "st", log=lambda *a, **k: None, **kw)


def ratio(got, want):
    return float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())


@pytest.mark.parametrize("variant,split", [("glm4_moe", False), ("deepseek_v3", True), ("deepseek_v3", False),
                                           ("deepseek_v3", "both")])
def test_moe_gguf_matches_safetensors(variant, split, oracle_root, tmp_path):
    """f32 containers from the GGUF file and from the safetensors checkpoint give the same
    logits, and both match transformers' reference."""
    vdir = Path(oracle_root) / variant
    info = json.loads((vdir / "ref.json").read_text())
    ref = np.fromfile(vdir / "ref_logits.f32", dtype="<f4").reshape(info["logits_shape"])
    src = write_moe_gguf(tmp_path / "m.gguf", vdir / "hf", split_kv_b=split)
    out = convert(src, tmp_path / "g", experts="f32", dense="f32")
    st = from_safetensors(oracle_root, variant, tmp_path, experts="f32", dense="f32")
    got = logits(out, info["ids"], tmp_path / "g.f32")
    want = logits(st, info["ids"], tmp_path / "s.f32")
    r_st, r_ref = ratio(got, want), ratio(got, ref)
    print(f"{variant} via GGUF (split kv_b {split}): vs safetensors {r_st:.2e}, vs transformers {r_ref:.2e}")
    assert r_st <= 1e-5 and r_ref <= EXACT_TOL
    man = json.loads((out / "colibri.json").read_text())
    assert man["family"] == variant
    assert not (out / convert_gguf.KV_B_SCRATCH).exists()


@pytest.mark.parametrize("variant", ["glm4_moe", "deepseek_v3"])
def test_q8_0_gguf_matches_q8_safetensors(variant, oracle_root, tmp_path):
    """Q8_0 matrices (F16 where a row is not whole blocks, attn_k_b here; routers F32 as llama.cpp
    writes them) in a q8 container: Q8_0 blocks are kept, and the logits stay as close to the
    safetensors q8 container as both are to transformers."""
    vdir = Path(oracle_root) / variant
    info = json.loads((vdir / "ref.json").read_text())
    src = write_moe_gguf(tmp_path / "m.gguf", vdir / "hf", matrix_type=T.Q8_0)
    out = convert(src, tmp_path / "g", experts="q8", dense="q8")
    st = from_safetensors(oracle_root, variant, tmp_path, experts="q8", dense="q8")
    got = logits(out, info["ids"], tmp_path / "g.f32")
    want = logits(st, info["ids"], tmp_path / "s.f32")
    ref = np.fromfile(vdir / "ref_logits.f32", dtype="<f4").reshape(info["logits_shape"])
    r = ratio(got, want)
    top1 = float((got.argmax(-1) == want.argmax(-1)).mean())
    kept = json.loads((out / "colibri.json").read_text())["quant"]["from_gguf"]
    assert kept.get("Q8_0 -> q8", 0) > 0, kept
    print(f"{variant} Q8_0 GGUF vs safetensors (q8): max ratio {r:.2e}, top-1 agreement {top1:.3f}; "
          f"vs transformers: GGUF {ratio(got, ref):.2e}, safetensors {ratio(want, ref):.2e}")
    assert r <= 0.05 and top1 >= 0.9


@pytest.mark.parametrize("qt", [T.Q8_0, T.Q4_0, T.Q5_1, T.BF16])
def test_k_b_transpose(qt, tmp_path):
    """write_kv_b_key_halves on a block-quantized attn_k_b (dequantized by the engine): the
    scratch file holds exactly the transposed dequantization, head by head."""
    from colibri.convert import gguf_kv_b
    engine()
    rng = np.random.default_rng(3)
    nh, kl, dn = 2, 8, 64
    x = rng.standard_normal((nh, kl, dn)).astype(np.float32)
    q = gguf.quants.quantize(x, qt)
    w = gguf.GGUFWriter(str(tmp_path / "k.gguf"), "deepseek2")
    w.add_tensor("blk.0.attn_k_b.weight", q, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    deq = gguf.quants.dequantize(q, qt).astype(np.float32).reshape(nh, kl, dn)
    g = convert_gguf.read_gguf(tmp_path / "k.gguf")
    cfg = {"num_attention_heads": nh, "qk_nope_head_dim": dn, "kv_lora_rank": kl, "num_hidden_layers": 1}
    gguf_kv_b.write_kv_b_key_halves(g, cfg, tmp_path / "s.f32")
    got = np.fromfile(tmp_path / "s.f32", dtype="<f4").reshape(nh, dn, kl)
    np.testing.assert_array_equal(got, deq.transpose(0, 2, 1))
    assert not (tmp_path / "s.f32.deq").exists()


def test_deepseek2_half_split_kv_b_refused(oracle_root, tmp_path):
    """attn_k_b without attn_v_b cannot make kv_b_proj: refused by name, not half-converted."""
    vdir = Path(oracle_root) / "deepseek_v3"
    src = write_moe_gguf(tmp_path / "m.gguf", vdir / "hf")
    g = convert_gguf.read_gguf(src)
    family, cfg = convert_gguf.build_config(g, g.tensors)
    del g.tensors["blk.1.attn_v_b.weight"]
    with pytest.raises(ConvertError, match="layer 1 needs attn_k_b and attn_v_b together"):
        convert_gguf.map_tensors(g, family, cfg)


def test_deepseek2_softmax_routing_refused(oracle_root, tmp_path):
    """DeepSeek-V2 files (deepseek2 with softmax gating) are refused, not run with the wrong router."""
    vdir = Path(oracle_root) / "deepseek_v3"
    src = write_moe_gguf(tmp_path / "m.gguf", vdir / "hf")
    g = convert_gguf.read_gguf(src)
    g.metadata["deepseek2.expert_gating_func"] = 1
    with pytest.raises(ConvertError, match="softmax routing"):
        convert_gguf.build_config(g, g.tensors)


def test_glm4moe_mtp_layer_kept_not_run(oracle_root, tmp_path):
    """glm4moe counts its MTP layer in block_count (nextn_predict_layers): the converter takes
    num_hidden_layers = block_count - nextn, keeps blk.L (nextn.* included) under the HF names
    as mtp_layers, and the logits equal those of the file without it."""
    from safetensors.numpy import load_file
    d, L, extra = with_glm_mtp(oracle_root, tmp_path)
    info = json.loads((Path(oracle_root) / "glm4_moe" / "ref.json").read_text())
    src = write_moe_gguf(tmp_path / "mtp.gguf", d)
    g = convert_gguf.read_gguf(src)
    assert g.metadata["glm4moe.block_count"] == L + 1 and "blk.3.nextn.eh_proj.weight" in g.tensors
    out = convert(src, tmp_path / "mtp", experts="f32", dense="f32")
    plain = convert(write_moe_gguf(tmp_path / "plain.gguf", Path(oracle_root) / "glm4_moe" / "hf"), tmp_path / "plain",
                    experts="f32", dense="f32")
    man = json.loads((out / "colibri.json").read_text())
    assert man["mtp_layers"] == [L] and json.loads((out / "config.json").read_text())["num_hidden_layers"] == L
    assert man["mtp"][0]["layer"] == L  # the nextn tensors, named back, make the head --draft mtp runs
    import subprocess
    import mtp_reference
    from colibri import engine_client
    ids = info["ids"][:12]
    r = subprocess.run([str(engine_client.release_engine()), "logits", "--model", str(out), "--ids", ",".join(map(str, ids)),
                        "--out", str(tmp_path / "m.f32"), "--mtp-out", str(tmp_path / "mtp.f32")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ref = mtp_reference.mtp_logits(d, ids)
    assert ratio(np.fromfile(tmp_path / "mtp.f32", "<f4").reshape(ref.shape), ref) < 1e-4
    np.testing.assert_array_equal(logits(out, info["ids"], tmp_path / "a.f32"), logits(plain, info["ids"], tmp_path / "b.f32"))
    kept = {}
    for s in man["shards"]:
        kept.update(load_file(str(out / s)))
    for name, v in extra.items():
        assert name in kept and np.array_equal(kept[name].reshape(-1), v.float().numpy().reshape(-1)), name


def test_coli_convert_and_info_glm4moe_gguf(oracle_root, tmp_path):
    """`coli convert FILE.gguf OUT` (default storage) on a glm4moe file with its MTP layer, then
    `coli info` names the family and says the MTP layer drafts with --draft mtp."""
    from launcher_helpers import coli
    d, L, _ = with_glm_mtp(oracle_root, tmp_path)
    src = write_moe_gguf(tmp_path / "glm.gguf", d, matrix_type=T.Q8_0)
    engine()
    r = coli("convert", src, tmp_path / "c", timeout=600)
    assert r.returncode == 0, r.stderr
    r = coli("info", "--model", tmp_path / "c")
    assert r.returncode == 0, r.stderr
    assert "family       glm4_moe" in r.stdout
    assert f"multi-token-prediction layer(s) (layer {L}): drafts tokens with --draft mtp" in r.stdout
