"""Multi-head latent attention (deepseek_v3, glm4_moe_lite): the cache holds the compressed latent,
decode (weight-absorbed) and prefill (expanded) agree, and the config facts MLA depends on
(YaRN mscale in the softmax scale, hub-style RoPE keys, expert-count spellings) are read as
transformers reads them."""
import json
from pathlib import Path

import numpy as np
import pytest

import family_registry  # noqa: E402
from colibri.model import container_scan  # noqa: E402
from launcher_helpers import coli, f32_containers, ready_line  # noqa: E402
from colibri.family import normalize as family_normalize  # noqa: E402

MLA_VARIANTS = ["deepseek_v3", "deepseek_v3_noqlora", "glm4_moe_lite"]


@pytest.fixture(scope="module")
def converted(oracle_root, tmp_path_factory):
    return f32_containers(oracle_root, tmp_path_factory)


def run_logits(model, ids, out, *flags):
    r = coli("logits", "--model", model, "--ids", ",".join(map(str, ids)), "--out", out, *flags, timeout=600)
    assert r.returncode == 0, r.stderr
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)


@pytest.mark.parametrize("variant", ["deepseek_v3", "glm4_moe_lite"])
def test_cache_holds_the_compressed_latent(variant, oracle_root, converted):
    """Per token and layer the engine keeps kv_lora_rank + qk_rope_head_dim values (from the
    checkpoint's own config), not the heads' expanded keys and values."""
    cfg = json.loads((Path(oracle_root) / variant / "hf" / "config.json").read_text())
    latent = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
    expanded = cfg["num_attention_heads"] * (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"] + cfg["v_head_dim"])
    model = converted(variant)
    for kv, size in family_registry.KV_TYPES.items():
        got = int(ready_line(model, "--kv", kv)["kv_bytes_per_token"])
        assert got == cfg["num_hidden_layers"] * latent * size, (kv, got)
    assert latent < expanded
    assert container_scan.scan(model)["kv_values_per_token"] == cfg["num_hidden_layers"] * latent


@pytest.mark.parametrize("variant", MLA_VARIANTS)
def test_absorbed_decode_matches_expanded_prefill(variant, oracle_root, converted, tmp_path):
    """One position per pass takes the weight-absorbed path, a chunk the expanded one; with an f32
    cache both compute the same attention up to float rounding, and both match transformers."""
    info = json.loads((Path(oracle_root) / variant / "ref.json").read_text())
    ref = np.fromfile(Path(oracle_root) / variant / "ref_logits.f32", dtype="<f4").reshape(info["logits_shape"])
    model = converted(variant)
    prefill = run_logits(model, info["ids"], tmp_path / "p.f32", "--kv", "f32")
    decode = run_logits(model, info["ids"], tmp_path / "d.f32", "--kv", "f32", "--batch", 1)
    # chunks of 16: the first two expand, later ones (a small part of the context) go absorbed
    chunked = run_logits(model, info["ids"], tmp_path / "c.f32", "--kv", "f32", "--batch", 16)
    scale = np.abs(ref).max()
    assert np.abs(chunked - decode).max() <= 1e-5 * scale
    diff = np.abs(prefill - decode).max() / scale
    print(f"{variant}: absorbed vs expanded {diff:.2e}, expanded vs transformers "
          f"{np.abs(prefill - ref).max() / scale:.2e}, absorbed vs transformers {np.abs(decode - ref).max() / scale:.2e}")
    assert diff <= 1e-5
    assert np.abs(prefill - ref).max() <= 1e-4 * scale and np.abs(decode - ref).max() <= 1e-4 * scale


def test_softmax_scale_and_rope_match_transformers(oracle_root):
    """YaRN: inv_freq and cos/sin scale as transformers' rotary embedding, and the attention's
    scaling (qk_head_dim^-1/2 times mscale(factor, mscale_all_dim)^2) as its MLA module."""
    import transformers
    hf = Path(oracle_root) / "deepseek_v3" / "hf"
    cfg = transformers.AutoConfig.from_pretrained(hf)
    assert cfg.rope_parameters["rope_type"] == "yarn"
    model = transformers.DeepseekV3ForCausalLM(cfg)
    _, arch = family_normalize.normalize_arch(json.loads((hf / "config.json").read_text()))
    attn = model.model.layers[0].self_attn
    assert arch["attn_scale"] == pytest.approx(attn.scaling, rel=1e-7) and attn.scaling != attn.qk_head_dim ** -0.5
    rot = model.model.rotary_emb
    np.testing.assert_allclose(arch["rope_inv_freq"], rot.inv_freq.numpy(), rtol=2e-6)
    assert arch["rope_attention_scaling"] == pytest.approx(rot.attention_scaling, rel=1e-6)


def test_hub_style_config_is_read_the_same(oracle_root):
    """Released DeepSeek/GLM configs spell RoPE as top-level rope_theta / rope_scaling (type=yarn)
    and count experts as n_routed_experts or num_local_experts: the same arch either way."""
    cfg = json.loads((Path(oracle_root) / "deepseek_v3" / "hf" / "config.json").read_text())
    params = dict(cfg["rope_parameters"])
    hub = {k: v for k, v in cfg.items() if k != "rope_parameters"}
    hub["rope_theta"] = params.pop("rope_theta")
    hub["rope_scaling"] = dict(params, type=params.pop("rope_type"))
    hub["num_local_experts"] = hub.pop("n_routed_experts")
    assert family_normalize.normalize_arch(hub) == family_normalize.normalize_arch(cfg)


def test_glm4_moe_hub_style_partial_rotary(oracle_root):
    """GLM-4.5 releases put rope_theta and partial_rotary_factor at the top level; a config that
    names no factor gets the config class's 0.5, as transformers does."""
    import transformers
    hf = Path(oracle_root) / "glm4_moe" / "hf"
    cfg = json.loads((hf / "config.json").read_text())
    params = dict(cfg["rope_parameters"])
    assert params["partial_rotary_factor"] == 0.5
    hub = {k: v for k, v in cfg.items() if k != "rope_parameters"}
    hub.update(rope_theta=params["rope_theta"], partial_rotary_factor=0.5)
    bare = {k: v for k, v in hub.items() if k != "partial_rotary_factor"}
    want = family_normalize.normalize_arch(cfg)
    assert family_normalize.normalize_arch(hub) == want == family_normalize.normalize_arch(bare)
    rot = transformers.Glm4MoeForCausalLM(transformers.AutoConfig.from_pretrained(hf)).model.rotary_emb
    np.testing.assert_allclose(want[1]["rope_inv_freq"], rot.inv_freq.numpy(), rtol=2e-6)
    assert want[1]["rotary_dim"] == cfg["head_dim"] // 2
