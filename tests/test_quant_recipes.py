"""--quant NAME (colibri/convert/recipes.py): a recipe fills --experts, --dense and --tensor-type,
a flag beside it wins for its part and the log says so, and the container holds what it names."""
import json

import pytest

from colibri.convert import recipes
from test_gguf_convert import safetensors_metadata
from test_lowbit_quantize import coli_convert, tiny_qwen3moe


def test_flags_beside_a_recipe_win_and_are_named():
    notes = []
    assert recipes.resolve("q4-mix", None, None, {}, notes.append) == (
        "q4_k", "q4_k", {"attn_v": "q6_k", "lm_head": "q6", "embed": "q6_k"})
    assert not notes
    got = recipes.resolve("q4-mix", "q8", None, {"attn_v": "q8", "embed": "q6_k"}, notes.append)
    assert got == ("q8", "q4_k", {"attn_v": "q8", "lm_head": "q6", "embed": "q6_k"})
    assert notes == ["--quant q4-mix: --experts q8, --tensor-type attn_v=q8 given beside it, in place of the recipe's"]
    assert recipes.resolve(None, "q4", None, {}, notes.append) == ("q4", None, {})


def stored_types(out):
    types = {}
    for shard in json.loads((out / "colibri.json").read_text())["shards"]:
        types.update({n: m[0] for n, m in json.loads(safetensors_metadata(out / shard)["colibri.tensors"]).items()})
    return types


@pytest.mark.parametrize("name", ["q2-mix", "q4-fast", "q5-mix"])  # K-quants, q4 blocks; q4_k and q6 heads
def test_container_holds_the_recipe(tmp_path, name):
    hf = tiny_qwen3moe(tmp_path, 481)
    out = tmp_path / name
    log = coli_convert(hf, out, "--quant", name, "--tensor-type", "down=q8")
    r = recipes.RECIPES[name]
    types = stored_types(out)
    assert types["model.layers.0.mlp.experts.1.gate_proj.weight"] == r["experts"]
    assert types["model.layers.1.self_attn.q_proj.weight"] == r["dense"]
    assert types["model.layers.1.self_attn.v_proj.weight"] == r["tensor_types"]["attn_v"]
    assert types["lm_head.weight"] == r["tensor_types"]["lm_head"] and types["model.embed_tokens.weight"] == "q6_k"
    assert types["model.layers.2.mlp.experts.0.down_proj.weight"] == "q8"
    assert "given beside it" not in log  # down is not a class the recipe sets
