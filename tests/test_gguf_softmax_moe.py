"""GGUF import of llama.cpp's olmoe, qwen2moe and Mixtral (architecture llama with experts) files:
the olmoe / qwen2_moe / mixtral oracle checkpoints are written as GGUF the way llama.cpp's
converter lays them out (tensor names from the gguf package's TensorNameMap, experts stacked
into ffn_*_exps, Mixtral's Q/K rows permuted, its metadata keys), converted back, and run by the
engine next to the same weights converted from safetensors."""
import json
from pathlib import Path

import numpy as np
import pytest
from needs import need

from test_gguf_common import convert
from test_gguf_convert import add_bpe_tokenizer, load_hf, logits, permute, tensor_putter

gguf = need("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402

from colibri.convert import gguf as convert_gguf  # noqa: E402
from colibri.convert import hf as convert_hf  # noqa: E402
from colibri.errors import ConvertError  # noqa: E402

EXACT_TOL = 1e-3  # as tests/test_oracles.py: max|logit-ref| <= 1e-3 max|ref|
GGUF_ARCH = {"olmoe": gguf.MODEL_ARCH.OLMOE, "qwen2_moe": gguf.MODEL_ARCH.QWEN2MOE, "mixtral": gguf.MODEL_ARCH.LLAMA}
VARIANTS = ["olmoe", "qwen2_moe", "mixtral", "mixtral_window"]


def write_softmax_moe_gguf(path, hf_dir, matrix_type=T.F32, expert_type=None, write_widths=True):
    """llama.cpp's OlmoeModel / Qwen2MoeModel / LlamaModel (Mixtral) conversion of an HF
    checkpoint, in small. write_widths=False leaves out the expert widths, as older files do."""
    cfg = json.loads((Path(hf_dir) / "config.json").read_text())
    family = cfg["model_type"]
    arch = GGUF_ARCH[family]
    sd = load_hf(hf_dir)
    L, H, nh = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"]
    nkv = cfg["num_key_value_heads"]
    E = cfg.get("num_experts") or cfg["num_local_experts"]
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    w.add_block_count(L)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(H)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_rope_freq_base(float(cfg["rope_parameters"]["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(E)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    if family == "qwen2_moe" and write_widths:
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    if family == "olmoe" and cfg.get("clip_qkv"):
        w.add_clamp_kqv(cfg["clip_qkv"])
    if family == "mixtral":
        w.add_rope_dimension_count(H // nh)
        if cfg.get("sliding_window"):
            w.add_sliding_window(cfg["sliding_window"])
    add_bpe_tokenizer(w, hf_dir, cfg["eos_token_id"])

    put = tensor_putter(w, matrix_type)

    names = gguf.get_tensor_name_map(arch, L)
    for hf, x in sd.items():
        if ".experts." in hf:
            continue
        base, suffix = hf.rsplit(".", 1)
        gg = names.get_name(base)
        if gg is None and family == "qwen2_moe" and ".mlp." in base:
            # a dense layer (mlp_only_layers): llama.cpp's qwen2moe has none; named as llama's MLP
            gg = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, L).get_name(base)
        assert gg is not None, hf
        if hf.endswith("shared_expert_gate.weight") and matrix_type == T.F32:
            x = x.reshape(-1)  # a vector of n_embd, the shape llama.cpp's qwen2moe declares
        if family == "mixtral" and hf.endswith(("q_proj.weight", "k_proj.weight")):
            x = permute(x, nh if "q_proj" in hf else nkv)
        put(f"{gg}.{suffix}", x, T.F32 if gg.endswith(("ffn_gate_inp", "ffn_gate_inp_shexp")) else None)  # as llama.cpp
    for l in range(L):
        if family == "mixtral":
            for wid in ("w1", "w2", "w3"):
                x = np.stack([sd[f"model.layers.{l}.block_sparse_moe.experts.{e}.{wid}.weight"] for e in range(E)])
                put(names.get_name(f"layers.{l}.feed_forward.experts.{wid}") + ".weight", x, expert_type)
        elif f"model.layers.{l}.mlp.experts.0.up_proj.weight" in sd:
            for proj in ("gate_proj", "up_proj", "down_proj"):
                x = np.stack([sd[f"model.layers.{l}.mlp.experts.{e}.{proj}.weight"] for e in range(E)])
                put(names.get_name(f"model.layers.{l}.mlp.experts.{proj}") + ".weight", x, expert_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def from_safetensors(oracle_root, variant, tmp_path, **kw):
    return convert_hf.convert(Path(oracle_root) / variant / "hf", tmp_path / "st", log=lambda *a, **k: None, **kw)


def f32(x):
    """x with every float rounded to float32."""
    if isinstance(x, float):
        return float(np.float32(x))
    if isinstance(x, dict):
        return {k: f32(v) for k, v in x.items()}
    if isinstance(x, list):
        return [f32(v) for v in x]
    return x


def ratio(got, want):
    return float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())


def reference(oracle_root, variant):
    vdir = Path(oracle_root) / variant
    info = json.loads((vdir / "ref.json").read_text())
    return info, np.fromfile(vdir / "ref_logits.f32", dtype="<f4").reshape(info["logits_shape"])


@pytest.mark.parametrize("variant", VARIANTS)
def test_softmax_moe_gguf_matches_safetensors(variant, oracle_root, tmp_path):
    """f32 containers from the GGUF file and from the safetensors checkpoint give the same
    logits, and both match transformers' reference; the manifests agree on the layer specs."""
    info, ref = reference(oracle_root, variant)
    src = write_softmax_moe_gguf(tmp_path / "m.gguf", Path(oracle_root) / variant / "hf")
    out = convert(src, tmp_path / "g", experts="f32", dense="f32")
    st = from_safetensors(oracle_root, variant, tmp_path, experts="f32", dense="f32")
    got = logits(out, info["ids"], tmp_path / "g.f32")
    want = logits(st, info["ids"], tmp_path / "s.f32")
    r_st, r_ref = ratio(got, want), ratio(got, ref)
    print(f"{variant} via GGUF (f32): vs safetensors {r_st:.2e}, vs transformers {r_ref:.2e}")
    assert r_st <= 1e-5 and r_ref <= EXACT_TOL
    assert (got.argmax(-1) == ref.argmax(-1)).all()
    man, st_man = (json.loads((d / "colibri.json").read_text()) for d in (out, st))
    assert man["family"] == variant.replace("_window", "")
    # same blocks, routers, norms, shared expert, clip_qkv (GGUF keeps eps as float32)
    assert f32(man["layers"]) == f32(st_man["layers"])
    for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob", "layer_mlp",
                "qk_norm", "clip_qkv", "shared_width", "q_bias"):
        assert man["arch"].get(key) == st_man["arch"].get(key), key


@pytest.mark.parametrize("variant", VARIANTS)
def test_q8_0_gguf_matches_q8_safetensors(variant, oracle_root, tmp_path):
    """Q8_0 matrices (F16 where a row is not whole blocks, routers F32 as llama.cpp writes them)
    in a q8 container: the Q8_0 blocks are kept, and the logits stay as close to the safetensors
    q8 container as both are to transformers."""
    info, ref = reference(oracle_root, variant)
    src = write_softmax_moe_gguf(tmp_path / "m.gguf", Path(oracle_root) / variant / "hf", matrix_type=T.Q8_0)
    out = convert(src, tmp_path / "g", experts="q8", dense="q8")
    st = from_safetensors(oracle_root, variant, tmp_path, experts="q8", dense="q8")
    got = logits(out, info["ids"], tmp_path / "g.f32")
    want = logits(st, info["ids"], tmp_path / "s.f32")
    r = ratio(got, want)
    top1 = float((got.argmax(-1) == want.argmax(-1)).mean())
    kept = json.loads((out / "colibri.json").read_text())["quant"]["from_gguf"]
    assert kept.get("Q8_0 -> q8", 0) > 0, kept
    print(f"{variant} Q8_0 GGUF vs safetensors (q8): max ratio {r:.2e}, top-1 agreement {top1:.3f}; "
          f"vs transformers: GGUF {ratio(got, ref):.2e}, safetensors {ratio(want, ref):.2e}")
    # the two 8-bit roundings differ by about what each is off transformers; the GGUF path is no worse
    assert ratio(got, ref) <= 1.25 * ratio(want, ref) + 1e-3 and r <= 2 * ratio(want, ref) + 1e-3 and top1 >= 0.9


@pytest.mark.parametrize("variant", VARIANTS)
def test_q4_0_experts_kept_as_q4(variant, oracle_root, tmp_path):
    """Q4_0 experts (llama.cpp's Q4_0 file type) in a q4 container are re-encoded exactly, never
    widened: the same storage as the safetensors q4 container, and close logits."""
    info, ref = reference(oracle_root, variant)
    src = write_softmax_moe_gguf(tmp_path / "m.gguf", Path(oracle_root) / variant / "hf", matrix_type=T.Q8_0,
                                 expert_type=T.Q4_0)
    out = convert(src, tmp_path / "g", experts="q4", dense="q8")
    st = from_safetensors(oracle_root, variant, tmp_path, experts="q4", dense="q8")
    got = logits(out, info["ids"], tmp_path / "g.f32")
    want = logits(st, info["ids"], tmp_path / "s.f32")
    kept = json.loads((out / "colibri.json").read_text())["quant"]["from_gguf"]
    assert kept.get("Q4_0 -> q4", 0) > 0 and not any(k.startswith("Q4_0 -> q8") for k in kept), kept
    top1 = float((got.argmax(-1) == want.argmax(-1)).mean())
    g_ref, s_ref = float((got.argmax(-1) == ref.argmax(-1)).mean()), float((want.argmax(-1) == ref.argmax(-1)).mean())
    print(f"{variant} Q4_0-expert GGUF vs safetensors (q4): max ratio {ratio(got, want):.2e}, top-1 {top1:.3f}; "
          f"top-1 vs transformers: GGUF {g_ref:.3f}, safetensors {s_ref:.3f}")
    # two different 4-bit roundings of random tiny experts: judged by how well each tracks transformers
    assert g_ref >= s_ref - 0.1 and top1 >= 0.7


def test_qwen2moe_widths_from_the_tensors(oracle_root, tmp_path):
    """A qwen2moe file without expert_feed_forward_length / expert_shared_feed_forward_length (as
    llama.cpp reads them: optional) takes both widths from the tensors."""
    src = write_softmax_moe_gguf(tmp_path / "m.gguf", Path(oracle_root) / "qwen2_moe" / "hf", write_widths=False)
    g = convert_gguf.read_gguf(src)
    family, cfg = convert_gguf.build_config(g, g.tensors)
    hf_cfg = json.loads((Path(oracle_root) / "qwen2_moe" / "hf" / "config.json").read_text())
    assert family == "qwen2_moe" and cfg["mlp_only_layers"] == hf_cfg["mlp_only_layers"]
    assert cfg["moe_intermediate_size"] == hf_cfg["moe_intermediate_size"]
    assert cfg["shared_expert_intermediate_size"] == hf_cfg["shared_expert_intermediate_size"]
    assert cfg["qkv_bias"] is True and cfg["norm_topk_prob"] is False


def test_mixtral_is_llama_with_experts(oracle_root, tmp_path):
    """Architecture llama with expert_count is Mixtral (block_sparse_moe names, top-2 renormalised,
    Q/K un-permuted); without experts it stays llama."""
    src = write_softmax_moe_gguf(tmp_path / "m.gguf", Path(oracle_root) / "mixtral" / "hf")
    g = convert_gguf.read_gguf(src)
    family, cfg = convert_gguf.build_config(g, g.tensors)
    assert family == "mixtral" and cfg["num_local_experts"] == 8
    table, sources = convert_gguf.map_tensors(g, family, cfg)
    assert "model.layers.0.block_sparse_moe.experts.7.w2.weight" in table
    assert "model.layers.0.block_sparse_moe.gate.weight" in table
    assert sources["model.layers.0.self_attn.q_proj.weight"][2] == cfg["num_attention_heads"]
    assert sources["model.layers.0.self_attn.v_proj.weight"][2] is None


@pytest.mark.parametrize("variant,edit,message", [
    ("mixtral", lambda g: g.tensors.pop("blk.1.ffn_gate_inp.weight"), r"layers \[1\] have no router"),
    ("olmoe", lambda g: g.metadata.update({"olmoe.expert_count": 4}), "must hold 4 experts"),
    ("olmoe", lambda g: g.metadata.update({"olmoe.expert_used_count": 9}), "expert_used_count 9"),
    ("qwen2_moe", lambda g: g.tensors.pop("blk.2.ffn_gate_inp_shexp.weight"), "lacks the shared expert gate"),
    ("qwen2_moe", lambda g: g.metadata.update({"qwen2moe.expert_feed_forward_length": 64}), "32 wide"),
    ("olmoe", lambda g: g.metadata.update({"olmoe.attention.sliding_window": 8}), "sliding-window attention is not"),
    ("olmoe", lambda g: g.tensors.pop("blk.0.attn_k_norm.weight"), "attn_k_norm must span the whole projection"),
])
def test_inconsistent_files_are_refused(variant, edit, message, oracle_root, tmp_path):
    src = write_softmax_moe_gguf(tmp_path / "m.gguf", Path(oracle_root) / variant / "hf")
    g = convert_gguf.read_gguf(src)
    edit(g)
    with pytest.raises(ConvertError, match=message):
        convert_gguf.build_config(g, g.tensors)
