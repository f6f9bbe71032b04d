"""convert_gguf: the tiny transformers oracles (tools/make_oracles.py) written as GGUF files the
way llama.cpp's converter lays them out (Q/K rows permuted for llama, experts stacked, RoPE
scaling as metadata or rope_freqs), converted back and run by the engine; every supported GGUF
block type through convert-jobs; tokenizers rebuilt from GGUF metadata against HF `tokenizers`."""
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from needs import need

from test_gguf_common import ROOT, CTokenizer, convert, engine
from colibri.family import normalize as family_normalize

gguf = need("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402

from colibri.convert import gguf as convert_gguf  # noqa: E402
from colibri.errors import ConvertError  # noqa: E402

EXACT_TOL = 1e-3  # as tests/test_oracles.py: f32 container, max|logit-ref| <= 1e-3 max|ref|
GGUF_ARCH = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3moe"}
VARIANTS = ["llama", "llama_gqa", "llama_tied", "llama_headdim", "llama_llama3", "llama_linear", "llama_yarn",
            "qwen2", "qwen2_tied", "qwen2_f16", "qwen3_moe", "qwen3_moe_nonorm", "qwen3_moe_sparse"]


# ---------------------------------------------------------------- writing GGUF like llama.cpp

def load_hf(hf_dir):
    import torch
    from safetensors.torch import load_file
    sd = {}
    for f in sorted(Path(hf_dir).glob("*.safetensors")):
        sd.update({k: v.to(torch.float32).numpy() for k, v in load_file(str(f)).items()})
    return sd


def permute(w, n_head):
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def add_bpe_tokenizer(w, hf_dir, eos_token_id, pre="gpt-2"):
    """Writes hf_dir's byte-level BPE tokenizer.json into GGUF writer w as llama.cpp does."""
    tokens, ttypes, merges = tokenizer_fields(json.loads((Path(hf_dir) / "tokenizer.json").read_text()))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(ttypes)
    w.add_token_merges(merges)
    w.add_eos_token_id(eos_token_id)


def tensor_putter(w, matrix_type, unblocked=(T.F32, T.F16), exact=None):
    """put(name, x, t=None) adding x to w: vectors f32, matrices matrix_type unless t says
    otherwise; a row that is not whole blocks of its type falls back to f16, as llama.cpp does,
    unless its type is in `unblocked`. K-quants come from tests/gguf_kquant_encode.py. With
    `exact` (tests/gguf_lowbit_blocks.ExactWeights), a tensor it stored keeps that type and its
    blocks."""
    import gguf_kquant_encode

    def put(name, x, t=None):
        if t is None and exact is not None:
            t = exact.type_of(x)
        if t is None:  # (T.F32 is 0)
            t = T.F32 if x.ndim == 1 else matrix_type
        if t not in unblocked and x.shape[-1] % gguf.GGML_QUANT_SIZES[t][0]:
            t = T.F16
        x = np.ascontiguousarray(x, dtype=np.float32)
        if t == T.F32:
            w.add_tensor(name, x)
        elif t == T.F16:
            w.add_tensor(name, x.astype(np.float16))
        elif exact is not None and exact.type_of(x) == t:
            w.add_tensor(name, exact.encode(x, t), raw_dtype=t)
        elif t.name in gguf_kquant_encode.ENCODERS:
            w.add_tensor(name, gguf_kquant_encode.quantize(x, t.name), raw_dtype=t)
        else:
            w.add_tensor(name, gguf.quants.quantize(x, t), raw_dtype=t)
    return put


def tokenizer_fields(tok_json):
    """tokenizer.ggml.* as llama.cpp's get_vocab_base writes them for a byte-level BPE."""
    vocab = tok_json["model"]["vocab"]
    added = {a["id"]: a for a in tok_json["added_tokens"]}
    size = max(list(vocab.values()) + list(added)) + 1
    rev = {i: t for t, i in vocab.items()}
    rev.update({i: a["content"] for i, a in added.items()})
    tokens, types = [], []
    for i in range(size):
        if i not in rev:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        else:
            tokens.append(rev[i])
            types.append(gguf.TokenType.CONTROL if i in added and added[i]["special"] else
                         gguf.TokenType.USER_DEFINED if i in added else gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok_json["model"]["merges"]]
    return tokens, types, merges


def write_gguf(path, hf_dir, types=None, extra_kv=None, pad_vocab=0, matrix_type=None, exact=None, split_max_tensors=0):
    """An HF checkpoint directory -> GGUF file. types: GGUF type per HF tensor name pattern
    (default: vectors F32, matrices matrix_type, by default the checkpoint's own dtype; with
    `exact`, the type and blocks it stored a tensor as, see tensor_putter). split_max_tensors:
    gguf-split's parts (PATH-00001-of-0000N.gguf, the first part returned) of that many tensors."""
    cfg = json.loads((Path(hf_dir) / "config.json").read_text())
    family = cfg["model_type"]
    arch = GGUF_ARCH[family]
    sd = load_hf(hf_dir)
    if matrix_type is None:
        matrix_type = {"float16": T.F16, "float32": T.F32}.get(cfg.get("torch_dtype", cfg.get("dtype")), T.BF16)
    L, H, nh = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads") or nh
    hd = cfg.get("head_dim") or H // nh
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    w = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    w.add_block_count(L)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(H)
    if cfg.get("intermediate_size"):
        w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    rtype = rope.get("rope_type", "default")
    if rtype == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    elif rtype == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if family == "qwen3_moe":
        w.add_expert_count(cfg.get("num_experts") or cfg["num_local_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_bool(f"{arch}.expert_weights_norm", bool(cfg.get("norm_topk_prob")))
    tok = json.loads((Path(hf_dir) / "tokenizer.json").read_text())
    tokens, ttypes, merges = tokenizer_fields(tok)
    tokens += [f"[PAD{i}]" for i in range(len(tokens), len(tokens) + pad_vocab)]
    ttypes += [gguf.TokenType.UNUSED] * pad_vocab
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(ttypes)
    w.add_token_merges(merges)
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_chat_template("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}")
    for k, v in (extra_kv or {}).items():
        w.add_uint32(k, v) if isinstance(v, int) else w.add_string(k, v)
    if rtype == "llama3":  # llama.cpp's LlamaModel.generate_extra_tensors
        base, dim = rope["rope_theta"], hd
        freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
        lo_wl = rope["original_max_position_embeddings"] / rope["low_freq_factor"]
        hi_wl = rope["original_max_position_embeddings"] / rope["high_freq_factor"]
        factors = []
        for f in freqs:
            wl = 2 * math.pi / f
            if wl < hi_wl:
                factors.append(1)
            elif wl > lo_wl:
                factors.append(rope["factor"])
            else:
                smooth = (rope["original_max_position_embeddings"] / wl - rope["low_freq_factor"]) / \
                         (rope["high_freq_factor"] - rope["low_freq_factor"])
                factors.append(1 / ((1 - smooth) / rope["factor"] + smooth))
        w.add_tensor("rope_freqs.weight", np.array(factors, dtype=np.float32))

    put_exact = tensor_putter(w, matrix_type, exact=exact) if exact is not None else None

    def put(name, x, hf_name):
        if put_exact is not None:
            return put_exact(name, x, (types or {}).get(hf_name))
        t = (types or {}).get(hf_name) or (T.F32 if x.ndim == 1 else matrix_type)
        if t == T.F32:
            w.add_tensor(name, x.astype(np.float32))
        elif t == T.F16:
            w.add_tensor(name, x.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(x.astype(np.float32), t), raw_dtype=t)

    emb = sd["model.embed_tokens.weight"]
    if pad_vocab:
        emb = np.concatenate([emb, np.zeros((pad_vocab, H), np.float32)])
    put("token_embd.weight", emb, "model.embed_tokens.weight")
    put("output_norm.weight", sd["model.norm.weight"], "model.norm.weight")
    if "lm_head.weight" in sd and not cfg.get("tie_word_embeddings"):
        head = sd["lm_head.weight"]
        if pad_vocab:
            head = np.concatenate([head, np.zeros((pad_vocab, H), np.float32)])
        put("output.weight", head, "lm_head.weight")
    names = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
             "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
             "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
             "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
             "self_attn.v_proj.bias": "attn_v.bias", "self_attn.q_norm.weight": "attn_q_norm.weight",
             "self_attn.k_norm.weight": "attn_k_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
             "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
             "mlp.gate.weight": "ffn_gate_inp.weight"}
    for l in range(L):
        pre = f"model.layers.{l}."
        for hf, gg in names.items():
            if pre + hf not in sd:
                continue
            x = sd[pre + hf]
            if family == "llama" and hf == "self_attn.q_proj.weight":
                x = permute(x, nh)
            if family == "llama" and hf == "self_attn.k_proj.weight":
                x = permute(x, nkv)
            put(f"blk.{l}.{gg}", x, pre + hf)
        if pre + "mlp.experts.0.gate_proj.weight" in sd:
            for proj, gg in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
                x = np.stack([sd[f"{pre}mlp.experts.{e}.{proj}.weight"] for e in range(cfg.get("num_experts") or cfg["num_local_experts"])])
                put(f"blk.{l}.{gg}.weight", x, f"{pre}mlp.experts.{proj}")
        elif pre + "mlp.experts.gate_up_proj" in sd:
            gu, dn = sd[pre + "mlp.experts.gate_up_proj"], sd[pre + "mlp.experts.down_proj"]
            I = gu.shape[1] // 2
            put(f"blk.{l}.ffn_gate_exps.weight", np.ascontiguousarray(gu[:, :I]), f"{pre}mlp.experts.gate_proj")
            put(f"blk.{l}.ffn_up_exps.weight", np.ascontiguousarray(gu[:, I:]), f"{pre}mlp.experts.up_proj")
            put(f"blk.{l}.ffn_down_exps.weight", dn, f"{pre}mlp.experts.down_proj")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    parts = w.format_shard_names(Path(path))
    return parts[0] if split_max_tensors else path


def logits(model, ids, out):
    r = subprocess.run([str(engine()), "logits", "--model", str(model), "--ids", ",".join(map(str, ids)),
                        "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)


# ---------------------------------------------------------------- oracle round trips

@pytest.mark.parametrize("variant", VARIANTS)
def test_oracle_via_gguf(variant, oracle_root, tmp_path):
    """f32 container of the GGUF file reproduces transformers' logits (the oracle reference)."""
    vdir = Path(oracle_root) / variant
    info = json.loads((vdir / "ref.json").read_text())
    ref = np.fromfile(vdir / "ref_logits.f32", dtype="<f4").reshape(info["logits_shape"])
    src = write_gguf(tmp_path / "m.gguf", vdir / "hf")
    out = convert(src, tmp_path / "c", experts="f32", dense="f32")
    got = logits(out, info["ids"], tmp_path / "l.f32")
    ratio = float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())
    print(f"{variant} via GGUF: max|logit-ref|/max|ref| = {ratio:.2e} (bound {EXACT_TOL:.0e})")
    assert ratio <= EXACT_TOL
    man = json.loads((out / "colibri.json").read_text())
    hf_cfg = json.loads((vdir / "hf" / "config.json").read_text())
    assert man["family"] == hf_cfg["model_type"]
    assert man["eos_token_ids"][0] == info["eos_token_id"]
    assert (out / "tokenizer.json").exists() and "chat_template" in json.loads((out / "tokenizer_config.json").read_text())


def test_llama_unpermute_matters(oracle_root, tmp_path):
    """The same file with the Q/K rows left in llama.cpp's order gives different logits: the
    round trip above would notice a missing or wrong un-permutation."""
    vdir = Path(oracle_root) / "llama"
    info = json.loads((vdir / "ref.json").read_text())
    ref = np.fromfile(vdir / "ref_logits.f32", dtype="<f4").reshape(info["logits_shape"])
    src = write_gguf(tmp_path / "m.gguf", vdir / "hf")
    g = convert_gguf.read_gguf(src)
    cfg = convert_gguf.build_config(g, g.tensors)[1]
    table, sources = convert_gguf.map_tensors(g, "llama", cfg)
    assert sources["model.layers.0.self_attn.q_proj.weight"][2] == cfg["num_attention_heads"]
    assert sources["model.layers.0.self_attn.k_proj.weight"][2] == cfg["num_key_value_heads"]
    orig = convert_gguf._row_perm
    convert_gguf._row_perm = lambda rows, n: list(range(rows))
    try:
        out = convert(src, tmp_path / "c", experts="f32", dense="f32")
    finally:
        convert_gguf._row_perm = orig
    got = logits(out, info["ids"], tmp_path / "l.f32")
    assert float(np.abs(got - ref).max() / np.abs(ref).max()) > 10 * EXACT_TOL


def test_padded_vocab_and_tokenizer(oracle_root, tmp_path):
    """llama.cpp pads the vocabulary with [PADn] UNUSED tokens up to the embedding rows; the
    rebuilt tokenizer.json drops them and encodes like the original, in HF tokenizers and in
    the engine's tokenizer."""
    from tokenizers import Tokenizer
    vdir = Path(oracle_root) / "qwen2"
    src = write_gguf(tmp_path / "m.gguf", vdir / "hf", pad_vocab=16)
    out = convert(src, tmp_path / "c", experts="f32", dense="f32")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["vocab_size"] == 320 + 16
    orig = Tokenizer.from_file(str(vdir / "hf" / "tokenizer.json"))
    mine = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert "[PAD330]" not in json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    for text in CORPUS:
        assert mine.encode(text).ids == orig.encode(text).ids, text
        assert engine_tokenize(out, text) == orig.encode(text).ids, text


def test_every_gguf_type_through_convert_jobs(oracle_root, tmp_path):
    """A llama GGUF whose weights use every supported block type: the f32 container holds
    exactly the gguf package's dequantization (Q/K un-permuted), and the default container
    keeps Q8_0/Q4_1/Q4_0/Q5_0/Q4_K blocks without float re-quantization."""
    from safetensors.numpy import load_file
    vdir = Path(oracle_root) / "llama_gqa"
    cycle = [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.F16, T.BF16]
    names = [f"model.layers.{l}.{n}" for l in range(3) for n in (
        "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
        "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")]
    types = {n: cycle[i % len(cycle)] for i, n in enumerate(names)}
    types["model.embed_tokens.weight"] = T.Q8_0
    src = write_gguf(tmp_path / "m.gguf", vdir / "hf", types=types)
    # K-quants: gguf cannot quantize them, so put random blocks in a second file's tensors by
    # patching bytes in place (the reference is whatever the bytes decode to)
    ref_reader = gguf.GGUFReader(str(src))
    cfg = json.loads((vdir / "hf" / "config.json").read_text())
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hf_name = {f"blk.{l}.{a}": f"model.layers.{l}.{b}" for l in range(3) for a, b in (
        ("attn_q.weight", "self_attn.q_proj.weight"), ("attn_k.weight", "self_attn.k_proj.weight"),
        ("attn_v.weight", "self_attn.v_proj.weight"), ("attn_output.weight", "self_attn.o_proj.weight"),
        ("ffn_gate.weight", "mlp.gate_proj.weight"), ("ffn_up.weight", "mlp.up_proj.weight"),
        ("ffn_down.weight", "mlp.down_proj.weight"))}
    hf_name["token_embd.weight"] = "model.embed_tokens.weight"
    want = {}
    for t in ref_reader.tensors:
        if t.name not in hf_name:
            continue
        x = gguf.quants.dequantize(t.data, t.tensor_type).reshape([int(d) for d in reversed(t.shape)])
        if t.name.endswith("attn_q.weight"):
            x = permute_back(x, nh)
        if t.name.endswith("attn_k.weight"):
            x = permute_back(x, nkv)
        want[hf_name[t.name]] = (x.astype(np.float32), t.tensor_type.name)
    f32 = convert(src, tmp_path / "f32", experts="f32", dense="f32")
    got = load_file(str(f32 / "model-00001-of-00001.safetensors"))
    for n, (x, tname) in want.items():
        np.testing.assert_array_equal(got[n], x, err_msg=f"{n} ({tname})")
    dflt = convert(src, tmp_path / "dflt")
    meta = json.loads(safetensors_metadata(dflt / "model-00001-of-00001.safetensors")["colibri.tensors"])
    got = load_file(str(dflt / "model-00001-of-00001.safetensors"))
    seen = set()
    for n, (x, tname) in want.items():
        storage = meta[n][0]
        expect = {"Q4_0": "q4", "Q4_1": "q4", "Q8_0": "q8", "Q5_0": "q8"}.get(tname, "q8")
        assert storage == expect, f"{n}: {tname} stored as {storage}, expected {expect}"
        dec = decode(storage, got[n], x.shape[1])
        if tname in ("Q4_0", "Q4_1", "Q8_0", "Q5_0"):
            np.testing.assert_array_equal(dec, x, err_msg=f"{n}: {tname} must be kept exactly")
        else:  # re-quantized to q8: within half a q8 step of each block's absmax
            step = np.abs(x).reshape(x.shape[0], -1, 32).max(-1, keepdims=True) / 127
            assert (np.abs(dec - x).reshape(step.shape[0], -1, 32) <= step * 0.5 + 1e-6).all(), n
        seen.add(tname)
    assert seen >= {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "F16", "BF16"}


def test_k_quants_through_convert_jobs(tmp_path):
    """Q4_K, Q5_K and Q6_K tensors (random blocks with sane scales) in a llama GGUF: the f32
    container equals the reference dequantization; q4 keeps Q4_K nibbles (f16 scales); --dense q6
    keeps Q5_K and Q6_K byte for byte (q5_k, q6_k), and --dense q6_k all three, decoding to the
    reference bit for bit."""
    from safetensors.numpy import load_file
    from test_gguf_quants import random_blocks
    rng = np.random.default_rng(5)
    path = tmp_path / "k.gguf"
    w = gguf.GGUFWriter(str(path), "qwen2")
    H, V = 256, 320
    for k, v in (("block_count", 1), ("context_length", 64), ("embedding_length", H), ("feed_forward_length", 512),
                 ("attention.head_count", 4), ("attention.head_count_kv", 2)):
        w.add_uint32(f"qwen2.{k}", v)
    w.add_float32("qwen2.attention.layer_norm_rms_epsilon", 1e-6)
    tok = ["a", "b", "ab"] + [f"<t{i}>" for i in range(3, V)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tok)
    w.add_token_merges(["a b"])
    ref = {}

    def put(name, hf, rows, cols, t):
        if t == T.F32:
            x = rng.standard_normal((rows, cols)).astype(np.float32).reshape(-1 if rows == 1 else rows, cols)
            x = x[0] if rows == 1 else x
            w.add_tensor(name, x)
            ref[hf] = (x, "F32")
            return
        data = random_blocks(t, rows, cols, rng)
        w.add_tensor(name, data, raw_dtype=t)
        ref[hf] = (gguf.quants.dequantize(data, t).reshape(rows, cols).astype(np.float32), t.name)

    put("token_embd.weight", "model.embed_tokens.weight", V, H, T.Q6_K)
    put("output.weight", "lm_head.weight", V, H, T.Q5_K)
    put("output_norm.weight", "model.norm.weight", 1, H, T.F32)
    p = "model.layers.0."
    for gg, hf, rows, cols, t in (("attn_norm.weight", "input_layernorm.weight", 1, H, T.F32),
                                  ("ffn_norm.weight", "post_attention_layernorm.weight", 1, H, T.F32),
                                  ("attn_q.weight", "self_attn.q_proj.weight", H, H, T.Q4_K),
                                  ("attn_k.weight", "self_attn.k_proj.weight", H // 2, H, T.Q4_K),
                                  ("attn_v.weight", "self_attn.v_proj.weight", H // 2, H, T.Q6_K),
                                  ("attn_q.bias", "self_attn.q_proj.bias", 1, H, T.F32),
                                  ("attn_k.bias", "self_attn.k_proj.bias", 1, H // 2, T.F32),
                                  ("attn_v.bias", "self_attn.v_proj.bias", 1, H // 2, T.F32),
                                  ("attn_output.weight", "self_attn.o_proj.weight", H, H, T.Q5_K),
                                  ("ffn_gate.weight", "mlp.gate_proj.weight", 512, H, T.Q4_K),
                                  ("ffn_up.weight", "mlp.up_proj.weight", 512, H, T.Q5_K),
                                  ("ffn_down.weight", "mlp.down_proj.weight", H, 512, T.Q6_K)):
        put(f"blk.0.{gg}", p + hf, rows, cols, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f32 = convert(path, tmp_path / "f32", experts="f32", dense="f32")
    got = load_file(str(f32 / "model-00001-of-00001.safetensors"))
    for n, (x, tname) in ref.items():
        np.testing.assert_allclose(got[n], x, rtol=1e-6, atol=1e-7, err_msg=f"{n} ({tname})")
    q = convert(path, tmp_path / "q")
    meta = json.loads(safetensors_metadata(q / "model-00001-of-00001.safetensors")["colibri.tensors"])
    got = load_file(str(q / "model-00001-of-00001.safetensors"))
    for n, (x, tname) in ref.items():
        if tname == "Q4_K":
            assert meta[n][0] == "q4", n
            dec = decode("q4", got[n], x.shape[1])
            np.testing.assert_allclose(dec, x, rtol=2e-3, atol=2e-4 * np.abs(x).max(), err_msg=n)
        elif tname != "F32":
            assert meta[n][0] == "q8", f"{n}: {tname} -> {meta[n][0]}"
    for dense, kept in (("q6", ("Q5_K", "Q6_K")), ("q6_k", ("Q4_K", "Q5_K", "Q6_K"))):  # q6_k: narrower ones too
        q6 = convert(path, tmp_path / dense, dense=dense)
        meta = json.loads(safetensors_metadata(q6 / "model-00001-of-00001.safetensors")["colibri.tensors"])
        got = load_file(str(q6 / "model-00001-of-00001.safetensors"))
        for n, (x, tname) in ref.items():
            if tname in kept:
                assert meta[n][0] == tname.lower(), f"{n}: {tname} -> {meta[n][0]}"
                dec = gguf.quants.dequantize(np.asarray(got[n], dtype=np.uint8), T[tname]).reshape(x.shape)
                np.testing.assert_array_equal(dec, x, err_msg=n)


def test_refusals(oracle_root, tmp_path):
    vdir = Path(oracle_root) / "llama_bias"
    src = write_gguf(tmp_path / "b.gguf", vdir / "hf")
    with pytest.raises(ConvertError, match="Q/K biases"):
        convert(src, tmp_path / "b")
    src = write_gguf(tmp_path / "l.gguf", Path(oracle_root) / "llama" / "hf")
    g = convert_gguf.read_gguf(src)
    g.metadata["tokenizer.ggml.pre"] = "tekken"
    with pytest.raises(ConvertError, match="pre-tokenizer 'tekken'"):
        convert_gguf.build_tokenizer(g)
    g.metadata["tokenizer.ggml.model"] = "llama"  # SentencePiece: its scores are what the merges come from
    with pytest.raises(ConvertError, match="SentencePiece .* needs tokenizer.ggml.scores"):
        convert_gguf.build_tokenizer(g)
    g.metadata["tokenizer.ggml.model"] = "bert"
    with pytest.raises(ConvertError, match="tokenizer.ggml.model 'bert' is not supported"):
        convert_gguf.build_tokenizer(g)
    g.metadata["general.architecture"] = "gemma3"
    with pytest.raises(ConvertError, match="architecture 'gemma3' is not supported"):
        convert_gguf.build_config(g, g.tensors)
    g.metadata["general.architecture"] = "qwen35moe"  # llama keys under another name: its own are missing
    with pytest.raises(ConvertError, match="GGUF metadata lacks qwen35moe.block_count"):
        convert_gguf.build_config(g, g.tensors)
    # a conversion with other settings into the same directory is refused
    convert(src, tmp_path / "o", experts="f32", dense="f32")
    with pytest.raises(ConvertError, match="other settings"):
        convert(src, tmp_path / "o")


def test_split_gguf_reads_as_one_file(oracle_root, tmp_path):
    """gguf-split's parts (PREFIX-00001-of-00003.gguf ...), given by the first part, convert to
    the container the one-file GGUF gives: the same tensors, the same logits; the manifest names
    every part. Another part, a missing part or a renamed first part are refused by name."""
    vdir = Path(oracle_root) / "qwen3_moe"
    info = json.loads((vdir / "ref.json").read_text())
    one = write_gguf(tmp_path / "one.gguf", vdir / "hf", matrix_type=T.Q8_0)
    first = write_gguf(tmp_path / "m.gguf", vdir / "hf", matrix_type=T.Q8_0, split_max_tensors=12)
    parts = sorted(tmp_path.glob("m-*-of-*.gguf"))
    n = len(parts)
    assert n >= 3 and first.name == f"m-00001-of-{n:05d}.gguf", parts
    g = convert_gguf.read_gguf(first)
    assert len(g.tensors) == len(convert_gguf.read_gguf(one).tensors) and g.parts == [str(p) for p in parts]
    a = logits(convert(one, tmp_path / "a"), info["ids"], tmp_path / "a.f32")
    out = convert(first, tmp_path / "b")
    assert np.array_equal(logits(out, info["ids"], tmp_path / "b.f32"), a)
    man = json.loads((out / "colibri.json").read_text())
    assert sorted(man["source"]["files"]) == [p.name for p in parts]
    with pytest.raises(ConvertError, match=f"part 1 of a model split in {n}; give the first part \\(m-00001-of-{n:05d}.gguf\\)"):
        convert(parts[1], tmp_path / "c")
    parts[2].rename(tmp_path / "elsewhere.gguf")
    with pytest.raises(ConvertError, match=f"part 3 of {n}, .*m-00003-of-{n:05d}.gguf, is missing"):
        convert(first, tmp_path / "d")
    (tmp_path / "elsewhere.gguf").rename(parts[2])
    first.rename(tmp_path / "renamed.gguf")
    with pytest.raises(ConvertError, match=f"must be named PREFIX-00001-of-{n:05d}.gguf"):
        convert(tmp_path / "renamed.gguf", tmp_path / "e")


def test_unsupported_type_named(tmp_path, oracle_root):
    src = write_gguf(tmp_path / "m.gguf", Path(oracle_root) / "llama" / "hf")
    g = convert_gguf.read_gguf(src)
    t = g.tensors["blk.0.attn_v.weight"]
    t.type, t.type_name = 34, "TQ1_0"  # ternary: no kernel reads it yet
    cfg = convert_gguf.build_config(g, g.tensors)[1]
    with pytest.raises(ConvertError, match="'blk.0.attn_v.weight' is TQ1_0; supported GGUF types: .*IQ1_S"):
        convert_gguf.map_tensors(g, "llama", cfg)


# ---------------------------------------------------------------- tokenizers from GGUF metadata

CORPUS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "  leading and trailing  spaces   \n\n\ttabs\r\nwindows lines",
    "def main():\n    return 42  # code\n",
    "Numbers: 1234567890, 3.14159, 1e-10, 2024-01-01",
    "Ünïcödé: naïve café, straße, Ελληνικά, русский, 中文字符, 日本語のテキスト, 한국어",
    "emoji 🦜🚀👩‍👩‍👧 and symbols ©®™ ∑∫√",
    "I'm sure they'll say it's fine; we've WE'VE done it'S",
    "<|endoftext|> special tokens <|im_start|>user\nhi<|im_end|>",
]


class _Meta:
    def __init__(self, md):
        self.metadata, self.path = md, "test.gguf"


@pytest.mark.parametrize("name,pre", [("qwen3", "qwen2"), ("deepseek_v3", "deepseek-v3"), ("gptoss", "gpt-4o")])
def test_real_tokenizer_roundtrip(name, pre, tmp_path):
    """A real tokenizer.json -> GGUF fields (as llama.cpp writes them) -> rebuilt tokenizer.json:
    the same ids as the original on the corpus, in HF tokenizers and in the engine."""
    import fetch_tokenizers
    from tokenizers import Tokenizer
    d = Path(fetch_tokenizers.fetch(name))
    tj = json.loads((d / "tokenizer.json").read_text())
    tokens, types, merges = tokenizer_fields(tj)
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": [int(t) for t in types], "tokenizer.ggml.merges": merges}
    rebuilt, *_ = convert_gguf.build_tokenizer(_Meta(md))
    (tmp_path / "tokenizer.json").write_text(json.dumps(rebuilt, ensure_ascii=False))
    orig = Tokenizer.from_file(str(d / "tokenizer.json"))
    mine = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    for text in CORPUS:
        want = orig.encode(text, add_special_tokens=False).ids
        assert mine.encode(text, add_special_tokens=False).ids == want, text
        assert engine_tokenize(tmp_path, text) == want, text


def engine_tokenize(model_dir, text):
    return CTokenizer(Path(model_dir) / "tokenizer.json").encode(text)


# ---------------------------------------------------------------- helpers

def permute_back(w, n_head):
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def decode(storage, raw, cols):
    """colibri q8/q4 rows (docs/container.md) -> float32, in numpy."""
    rows = raw.shape[0]
    if storage == "q8":
        b = raw.reshape(rows, -1, 34)
        d = b[:, :, :2].copy().view(np.float16).astype(np.float32)
        return (b[:, :, 2:].view(np.int8).astype(np.float32) * d).reshape(rows, -1)[:, :cols]
    b = raw.reshape(rows, -1, 20)
    d = b[:, :, 0:2].copy().view(np.float16).astype(np.float32)
    m = b[:, :, 2:4].copy().view(np.float16).astype(np.float32)
    qs = b[:, :, 4:]
    q = np.concatenate([qs & 0xF, qs >> 4], axis=-1).astype(np.float32)
    return (q * d + m).reshape(rows, -1)[:, :cols]


def safetensors_metadata(path):
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))["__metadata__"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_qwen3_dense_mapping():
    """qwen3 (dense) GGUF metadata and tensor names -> HF config and names (no qwen3 dense oracle
    exists, so the mapping is checked directly)."""
    import family_registry
    from colibri.convert.gguf_reader import GGML_TYPES, GGUFFile, TensorInfo

    G = GGUFFile("qwen3.gguf")
    G.metadata = {"general.architecture": "qwen3", "qwen3.block_count": 1, "qwen3.embedding_length": 64,
                  "qwen3.feed_forward_length": 96, "qwen3.attention.head_count": 4,
                  "qwen3.attention.head_count_kv": 2, "qwen3.attention.key_length": 32,
                  "qwen3.attention.value_length": 32, "qwen3.rope.freq_base": 1e6, "qwen3.context_length": 4096,
                  "qwen3.attention.layer_norm_rms_epsilon": 1e-6}

    def t(name, *ne):
        G.tensors[name] = TensorInfo(name, 0, list(ne), 0, 4 * math.prod(ne), math.prod(ne))

    t("token_embd.weight", 64, 320)
    t("output_norm.weight", 64)
    t("output.weight", 64, 320)
    for n, ne in (("attn_norm", (64,)), ("ffn_norm", (64,)), ("attn_q", (64, 128)), ("attn_k", (64, 64)),
                  ("attn_v", (64, 64)), ("attn_output", (128, 64)), ("attn_q_norm", (32,)), ("attn_k_norm", (32,)),
                  ("ffn_gate", (64, 96)), ("ffn_up", (64, 96)), ("ffn_down", (96, 64))):
        t(f"blk.0.{n}.weight", *ne)
    assert GGML_TYPES[0][0] == "F32"
    family, cfg = convert_gguf.build_config(G, G.tensors)
    assert family == "qwen3" and cfg["head_dim"] == 32 and cfg["tie_word_embeddings"] is False
    fam, arch = family_normalize.normalize_arch(cfg)
    assert fam == "qwen3" and arch["qk_norm"] and arch["num_kv_heads"] == 2 and arch["layer_mlp"] == ["dense"]
    table, sources = convert_gguf.map_tensors(G, family, cfg)
    assert table["model.layers.0.self_attn.q_norm.weight"]["shape"] == [32]
    assert table["model.layers.0.self_attn.o_proj.weight"]["shape"] == [64, 128]
    assert all(p is None for _, _, p in sources.values()), "qwen GGUFs are not row-permuted"
    G.tensors["blk.0.attn_extra.weight"] = G.tensors["blk.0.attn_norm.weight"]
    with pytest.raises(ConvertError, match="does not use: blk.0.attn_extra.weight"):
        convert_gguf.map_tensors(G, family, cfg)


def test_bad_tokenizer_metadata_refused():
    base = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.tokens": ["a", "b", "ab"],
            "tokenizer.ggml.merges": ["a b"]}
    rebuilt, *_ = convert_gguf.build_tokenizer(_Meta(dict(base)))
    assert rebuilt["model"]["merges"] == [["a", "b"]] and rebuilt["model"]["vocab"] == {"a": 0, "b": 1, "ab": 2}
    for patch, needle in ((({"tokenizer.ggml.merges": ["a c"]}), "not in the vocabulary"),
                          (({"tokenizer.ggml.merges": ["ab"]}), "is not 'a b'"),
                          (({"tokenizer.ggml.tokens": []}), "non-empty list"),
                          (({"tokenizer.ggml.tokens": "abc"}), "non-empty list"),
                          (({"tokenizer.ggml.token_type": [1]}), "1 token types for 3 tokens"),
                          (({"tokenizer.ggml.merges": None}), "merges must be a list")):
        with pytest.raises(ConvertError, match=needle):
            convert_gguf.build_tokenizer(_Meta(dict(base, **patch)))


def test_sharded_output(oracle_root, tmp_path, monkeypatch):
    """A GGUF file is cut into several shards by layer (each layer's experts stay together);
    the result is the same model."""
    vdir = Path(oracle_root) / "qwen3_moe"
    info = json.loads((vdir / "ref.json").read_text())
    ref = np.fromfile(vdir / "ref_logits.f32", dtype="<f4").reshape(info["logits_shape"])
    monkeypatch.setattr(convert_gguf, "SHARD_BYTES", 100_000)
    out = convert(write_gguf(tmp_path / "m.gguf", vdir / "hf"), tmp_path / "c", experts="f32", dense="f32")
    shards = json.loads((out / "colibri.json").read_text())["shards"]
    assert len(shards) >= 3
    for f in shards:
        names = json.loads(safetensors_metadata(out / f)["colibri.tensors"])
        layers = {n.split(".")[2] for n in names if n.startswith("model.layers.")}
        experts = {n.rsplit(".", 2)[0] for n in names if ".experts." in n}
        for e in experts:
            assert all(f"{e}.{p}_proj.weight" in names for p in ("gate", "up", "down")), f"{e} split across shards"
        assert layers or f == shards[0] or f == shards[-1]
    got = logits(out, info["ids"], tmp_path / "l.f32")
    assert float(np.abs(got - ref).max() / np.abs(ref).max()) <= EXACT_TOL


def test_info_reports_the_storage_each_tensor_class_got(oracle_root, tmp_path):
    """A 4-bit GGUF converted with the default --dense q8 keeps its 4-bit blocks; `coli info`
    says so from the shard tables instead of repeating the requested q8."""
    src = write_gguf(tmp_path / "m.gguf", Path(oracle_root) / "llama_gqa" / "hf", matrix_type=T.Q4_1,
                     types={"model.embed_tokens.weight": T.Q8_0})
    out = convert(src, tmp_path / "c")
    r = subprocess.run([sys.executable, str(ROOT / "coli"), "info", "--model", str(out)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    quant = next(ln for ln in r.stdout.splitlines() if ln.startswith("quant"))
    assert "attention q4" in quant and "dense mlp q4" in quant and "embed q8" in quant and "norm f32" in quant, quant
    assert "dense q8" not in quant and "expert" not in quant, quant  # a dense model: no expert class to report
