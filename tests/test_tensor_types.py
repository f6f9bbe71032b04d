"""`coli convert --tensor-type CLASS=TYPE`: one tensor class stored in another type than --experts /
--dense give it, and the GGUF names q8_0 / q4_1 for q8 / q4. Checked from what the container
holds (the shard tables), what `coli info` reports, and the logits against transformers."""
import json
from pathlib import Path

import numpy as np
import pytest

from launcher_helpers import coli
from test_gguf_convert import T, write_gguf
from test_oracles import EXACT_TOL, load_ref, quant_stats, run_logits, safe_positions

from colibri.convert import tensor_types
from colibri.model import container_scan


def stored(out):
    """name -> storage, over every shard of container `out`."""
    man = json.loads((Path(out) / "colibri.json").read_text())
    table = {}
    for s in man["shards"]:
        header, _, _ = container_scan.read_raw_header(Path(out) / s)
        table.update({n: e[0] for n, e in container_scan.storage_table(header, Path(out) / s).items()})
    return table


def test_parse_takes_classes_types_and_aliases_and_refuses_the_rest():
    assert tensor_types.parse(["attention=q6", "down=q8_0", "lm_head=q4_1"]) == \
        {"attention": "q6", "down": "q8", "lm_head": "q4"}
    assert tensor_types.parse(["down=q6", "down=q6"]) == {"down": "q6"}  # the same twice is no conflict
    for bad, why in (("attention", "CLASS=TYPE"), ("=q4", "CLASS=TYPE"), ("attn=q4", "unknown class 'attn'"),
                     ("expert=q4", "--experts"), ("router=q4", "unknown class"), ("down=q5", "'q5' is not"),
                     ("embed=mxfp4", "not a storage type")):
        with pytest.raises(ValueError, match=why):
            tensor_types.parse([bad])
    with pytest.raises(ValueError, match="down twice"):
        tensor_types.parse(["down=q6", "down=q8"])


def test_down_wins_over_the_class_it_is_in():
    types = {"down": "q6", "dense_mlp": "bf16", "shared_expert": "q8", "attention": "q4"}
    at = tensor_types.type_for
    assert at("model.layers.1.mlp.experts.3.down_proj.weight", types) == "q6"
    assert at("model.layers.1.block_sparse_moe.experts.3.w2.weight", types) == "q6"  # Mixtral's name
    assert at("model.layers.1.block_sparse_moe.experts.3.w1.weight", types) is None  # experts: --experts
    assert at("model.layers.0.mlp.down_proj.weight", types) == "q6"
    assert at("model.layers.0.mlp.up_proj.weight", types) == "bf16"
    assert at("model.layers.2.mlp.shared_experts.gate_proj.weight", types) == "q8"
    assert at("model.layers.2.self_attn.o_proj.weight", types) == "q4"
    assert at("model.embed_tokens.weight", types) is None and at("lm_head.weight", {}) is None


def test_attn_v_wins_over_attention():
    types = {"attn_v": "q6_k", "attention": "q4_k"}
    at = tensor_types.type_for
    assert at("model.layers.3.self_attn.v_proj.weight", types) == "q6_k"
    assert at("model.layers.3.self_attn.k_proj.weight", types) == "q4_k"
    assert at("model.layers.3.self_attn.kv_b_proj.weight", types) == "q4_k"  # MLA: no value projection of its own
    assert at("model.layers.3.self_attn.v_proj.weight", {"attn_v": "q8"}) == "q8"
    assert at("model.layers.3.mlp.experts.0.down_proj.weight", {"attn_v": "q8"}) is None


def test_every_class_overridden_to_f32_is_exact(oracle_root, tmp_path):
    """--dense q4 with every trunk class raised to f32 (and f32 experts) leaves nothing at q4: the
    logits are transformers' within the f32 container bound."""
    out = tmp_path / "c"
    r = coli("convert", Path(oracle_root) / "qwen3_moe" / "hf", out, "--experts", "f32", "--dense", "q4",
             *[a for c in ("attention", "dense_mlp", "embed", "lm_head") for a in ("--tensor-type", f"{c}=f32")])
    assert r.returncode == 0, r.stderr
    assert "attention f32, dense_mlp f32, embed f32, lm_head f32" in r.stderr
    assert set(stored(out).values()) == {"f32"}
    info, ref = load_ref(oracle_root, "qwen3_moe")
    got = run_logits(out, info["ids"], tmp_path / "l.f32")
    assert np.abs(got - ref).max() <= EXACT_TOL * np.abs(ref).max()


def test_a_mixed_container_holds_what_was_asked_and_runs(oracle_root, tmp_path):
    src = Path(oracle_root) / "qwen3_moe" / "hf"
    out = tmp_path / "c"
    r = coli("convert", src, out, "--experts", "q8_0", "--dense", "q4", "--tensor-type", "down=q6",
             "--tensor-type", "attention=q4_1", "--tensor-type", "lm_head=bf16", "--tensor-type", "dense_mlp=q8")
    assert r.returncode == 0, r.stderr
    table = stored(out)
    for name, storage in table.items():
        cls = container_scan.tensor_class(name)
        want = ("f32" if cls in ("norm", "router") else "q6" if name.endswith("down_proj.weight")
                else {"expert": "q8", "attention": "q4", "lm_head": "bf16", "dense_mlp": "q8", "embed": "q4"}[cls])
        assert storage == want, (name, storage, want)
    assert sum(n.endswith("experts.0.down_proj.weight") for n in table) == 2  # two MoE layers really checked
    quant = json.loads((out / "colibri.json").read_text())["quant"]
    assert (quant["experts"], quant["dense"], quant["lm_head"], quant["embed"]) == ("q8", "q4", "bf16", "q4")
    assert quant["tensor_types"] == {"attention": "q4", "dense_mlp": "q8", "down": "q6", "lm_head": "bf16"}
    line = next(ln for ln in coli("info", "--model", out).stdout.splitlines() if ln.startswith("quant"))
    assert "expert q6 x16/q8 x32" in line and "attention q4" in line and "lm head bf16" in line, line
    assert "dense mlp q6 x1/q8 x2" in line, line
    info, ref = load_ref(oracle_root, "qwen3_moe")
    got = run_logits(out, info["ids"], tmp_path / "l.f32")
    s = quant_stats(got, ref, safe_positions(info, 0.05, 0.3))
    assert s["kl_mean"] <= 0.3 and s["top1_safe"] >= 0.75, s  # test_dense_low_bit's q4-trunk bounds
    again = coli("convert", src, out, "--experts", "q8", "--dense", "q4", "--tensor-type", "down=q8")
    assert again.returncode != 0 and "down q8" in again.stderr and "down q6" in again.stderr, again.stderr


def test_gguf_q8_experts_kept_except_the_class_asked_for(oracle_root, tmp_path):
    """Without --experts a GGUF's Q8_0 experts stay q8; `down=q4` re-quantizes only the down
    projections, experts' included, because the user chose their type."""
    src = write_gguf(tmp_path / "m.gguf", Path(oracle_root) / "qwen3_moe" / "hf", matrix_type=T.Q8_0)
    out = tmp_path / "c"
    r = coli("convert", src, out, "--tensor-type", "down=q4")
    assert r.returncode == 0, r.stderr
    table = stored(out)
    experts = {n: s for n, s in table.items() if container_scan.tensor_class(n) == "expert"}
    assert experts and all(s == ("q4" if n.endswith("down_proj.weight") else "q8") for n, s in experts.items()), experts
    assert table["model.layers.0.mlp.down_proj.weight"] == "q4" and table["model.layers.0.mlp.up_proj.weight"] == "q8"
    info, ref = load_ref(oracle_root, "qwen3_moe")
    got = run_logits(out, info["ids"], tmp_path / "l.f32")
    assert np.isfinite(got).all() and (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.75


def test_convert_refuses_a_bad_tensor_type_before_reading_the_source(tmp_path):
    r = coli("convert", tmp_path / "nothing", tmp_path / "out", "--tensor-type", "attn=q4")
    assert r.returncode == 2 and "unknown class 'attn'" in r.stderr and "attention" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_the_converters_refuse_overrides_the_flag_parser_would_refuse(oracle_root, tmp_path):
    """Called from Python (coli pull, tools), the converters check the overrides themselves."""
    from colibri.convert import gguf as convert_gguf, hf as convert_hf
    from colibri.errors import ConvertError
    for conv, src in ((convert_hf.convert, Path(oracle_root) / "qwen3_moe" / "hf"), (convert_gguf.convert, tmp_path / "x.gguf")):
        for bad in ({"attn": "q4"}, {"attention": "q5"}):
            with pytest.raises(ConvertError, match="--tensor-type"):
                conv(src, tmp_path / "out", tensor_types=bad, log=lambda *a, **k: None)
    assert not (tmp_path / "out").exists()
