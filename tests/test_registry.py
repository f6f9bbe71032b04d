"""family_registry: agrees with the engine, and resolves RoPE exactly as transformers does."""
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from colibri.family import normalize as family_normalize
from colibri.family import specs as family_specs

ROOT = Path(__file__).resolve().parents[1]
import family_registry  # noqa: E402


def test_registry_matches_engine_families():
    out = subprocess.run([str(ROOT / "build" / "colibri"), "families"], capture_output=True, text=True, check=True)
    assert sorted(out.stdout.split()) == sorted(family_registry.FAMILIES)


@pytest.mark.parametrize("variant", ["llama", "llama_llama3", "llama_linear", "llama_yarn", "llama_headdim", "qwen2"])
def test_rope_matches_transformers(variant, oracle_root):
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    cfg_path = Path(oracle_root) / variant / "hf" / "config.json"
    raw = json.loads(cfg_path.read_text())
    hf_cfg = transformers.AutoConfig.from_pretrained(cfg_path.parent)
    rope_type = hf_cfg.rope_parameters.get("rope_type", "default")
    if rope_type == "default":
        base = hf_cfg.rope_parameters["rope_theta"]
        dim = getattr(hf_cfg, "head_dim", None) or hf_cfg.hidden_size // hf_cfg.num_attention_heads
        inv, scale = 1.0 / (base ** (np.arange(0, dim, 2) / dim)), 1.0
    else:
        t, scale = ROPE_INIT_FUNCTIONS[rope_type](hf_cfg, "cpu")
        inv = t.numpy()
    _, arch = family_normalize.normalize_arch(raw)
    got = np.array(arch["rope_inv_freq"])
    assert got.shape == inv.shape
    np.testing.assert_allclose(got, inv, rtol=2e-6)
    assert arch["rope_attention_scaling"] == pytest.approx(scale, rel=1e-6)


def test_unsupported_configs_are_named():
    base = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1, "vocab_size": 10}
    with pytest.raises(family_registry.UnsupportedModel, match="model_type 'gpt2'"):
        family_normalize.normalize_arch(dict(base, model_type="gpt2"))
    with pytest.raises(family_registry.UnsupportedModel, match="rope type 'dynamic'"):
        family_normalize.normalize_arch(dict(base, rope_scaling={"rope_type": "dynamic", "factor": 2.0}))
    with pytest.raises(family_registry.UnsupportedModel, match="hidden_act 'gelu'"):
        family_normalize.normalize_arch(dict(base, hidden_act="gelu"))
    with pytest.raises(family_registry.UnsupportedModel, match="sliding-window"):
        family_normalize.normalize_arch(dict(base, model_type="qwen2", use_sliding_window=True))
    with pytest.raises(family_registry.UnsupportedModel, match="vocab_size"):
        family_normalize.normalize_arch({k: v for k, v in base.items() if k != "vocab_size"})


def test_moe_layer_kinds():
    cfg = {"model_type": "qwen3_moe", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 6,
           "vocab_size": 10, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
           "intermediate_size": 96, "decoder_sparse_step": 2, "mlp_only_layers": [3]}
    _, arch = family_normalize.normalize_arch(cfg)
    assert arch["layer_mlp"] == ["dense", "moe", "dense", "dense", "dense", "moe"]
    _, arch = family_normalize.normalize_arch(dict(cfg, num_experts=None, num_local_experts=4, decoder_sparse_step=1,
                                                  mlp_only_layers=[]))
    assert arch["layer_mlp"] == ["moe"] * 6 and arch["num_experts"] == 4


def test_registry_describes_every_family_fully():
    for name, fam in family_registry.FAMILIES.items():
        for key in ("display", "model_types", "default_ctx", "interactive_max_tokens", "thinking", "tools", "kv"):
            assert key in fam, f"{name} lacks {key}"
    assert family_registry.FAMILIES["qwen3_moe"]["thinking"] == "enable_thinking"
    assert family_registry.FAMILIES["llama"]["thinking"] is None


def test_kv_bytes_per_token_sums_the_layers_state():
    arch = {"num_layers": 3, "num_kv_heads": 2, "head_dim": 32}
    # K and V for every layer and KV head; f16 by default, 4 bytes with --kv f32
    assert family_specs.kv_bytes_per_token(arch, "qwen3_moe") == 2 * 3 * 2 * 32 * 2
    assert family_specs.kv_bytes_per_token(arch, "qwen3_moe", kv="f32") == 2 * 3 * 2 * 32 * 4


@pytest.mark.parametrize("variant", ["llama_gqa", "llama_headdim", "qwen2", "qwen3_moe", "minimax_m2"])
def test_kv_slot_bytes_is_what_the_engine_allocates(variant, oracle_root, tmp_path):
    """Asked of the engine (READY kv_slot_bytes, what kv_init allocates), not of a copy of the formula."""
    from launcher_helpers import convert_tiny
    from colibri import engine_client
    d = convert_tiny(oracle_root, tmp_path / "m", family=variant, template=None)
    man = json.loads((d / "colibri.json").read_text())
    with engine_client.Engine(d, ctx=200, kv_slots=1, threads=1) as eng:
        allocated = int(eng.info["kv_slot_bytes"])
    assert family_specs.kv_slot_bytes(family_specs.manifest_layers(man), 200) == allocated


def test_tensor_classes():
    cls = lambda n: next(c for c, rx in family_registry.TENSOR_CLASSES if rx.search(n))  # noqa: E731
    assert cls("model.layers.3.mlp.experts.17.down_proj.weight") == "expert"
    assert cls("model.layers.3.mlp.gate.weight") == "router"
    assert cls("model.layers.3.self_attn.q_norm.weight") == "norm"
    assert cls("model.layers.3.self_attn.q_proj.weight") == "attention"
    assert cls("model.layers.0.mlp.gate_proj.weight") == "dense_mlp"


def test_new_moe_families_config_facts():
    """OLMoE / Qwen2-MoE / Mixtral: the config facts each family's blocks depend on."""
    base = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 10,
            "num_experts_per_tok": 2, "intermediate_size": 32, "max_position_embeddings": 8192}
    _, arch = family_normalize.normalize_arch(dict(base, model_type="olmoe", num_experts=4, clip_qkv=8.0))
    attn = family_specs.layer_specs(arch)[0]["attn"]
    assert attn["qk_norm"] == "full" and attn["clip_qkv"] == 8.0 and arch["moe_intermediate_size"] == 32
    assert not family_specs.layer_specs(arch)[0]["mlp"]["router"]["renorm"]
    with pytest.raises(family_registry.UnsupportedModel, match="q/k norms span hidden_size"):
        family_normalize.normalize_arch(dict(base, model_type="olmoe", num_experts=4, head_dim=32))
    with pytest.raises(family_registry.UnsupportedModel, match="clip_qkv"):
        family_normalize.normalize_arch(dict(base, model_type="olmoe", num_experts=4, clip_qkv=0))
    _, arch = family_normalize.normalize_arch(dict(base, model_type="qwen2_moe", num_experts=4, moe_intermediate_size=16,
                                                  shared_expert_intermediate_size=48, mlp_only_layers=[0]))
    dense, moe = (s["mlp"] for s in family_specs.layer_specs(arch))
    assert dense["kind"] == "dense" and moe["kind"] == "moe_shared" and moe["shared"]["width"] == 48
    assert moe["shared"]["gate"]["tensors"]["weight"] == "model.layers.1.mlp.shared_expert_gate.weight"
    assert arch["q_bias"] and not arch["o_bias"] and not moe["router"]["renorm"]
    _, arch = family_normalize.normalize_arch(dict(base, model_type="qwen2_moe", num_experts=4, moe_intermediate_size=16,
                                                  shared_expert_intermediate_size=48, qkv_bias=False))
    assert not arch["q_bias"]
    # use_sliding_window: every other layer below max_window_layers (Qwen2MoeConfig's layer_types)
    _, arch = family_normalize.normalize_arch(dict(base, model_type="qwen2_moe", num_hidden_layers=5, num_experts=4,
                                                  moe_intermediate_size=16, shared_expert_intermediate_size=48,
                                                  use_sliding_window=True, sliding_window=64, max_window_layers=3))
    assert [s["attn"]["window"] for s in family_specs.layer_specs(arch)] == [64, 0, 64, 0, 0]
    assert family_specs.layer_specs(arch)[0]["attn"]["state"]["window"] == 64
    mix = dict(base, model_type="mixtral", num_local_experts=4, norm_topk_prob=False)
    _, arch = family_normalize.normalize_arch(mix)
    moe = family_specs.layer_specs(arch)[0]["mlp"]
    assert moe["router"]["renorm"] and moe["router"]["tensors"]["weight"] == "model.layers.0.block_sparse_moe.gate.weight"
    assert moe["expert_tensors"]["up"] == "model.layers.0.block_sparse_moe.experts.{e}.w3.weight"
    assert arch["max_position_embeddings"] == 8192
    assert family_specs.layer_specs(arch)[0]["attn"]["window"] == 0
    # a window shorter than the context reaches the attention blocks; the cache keeps every position
    _, arch = family_normalize.normalize_arch(dict(mix, sliding_window=4096))
    attn = family_specs.layer_specs(arch)[1]["attn"]
    assert attn["window"] == 4096 and attn["state"].get("window", 0) == 0 and arch["max_position_embeddings"] == 8192
    _, arch = family_normalize.normalize_arch(dict(mix, sliding_window=32768))
    assert family_specs.layer_specs(arch)[0]["attn"]["window"] == 0


def test_new_moe_tensor_classes():
    cls = lambda n: next(c for c, rx in family_registry.TENSOR_CLASSES if rx.search(n))  # noqa: E731
    assert cls("model.layers.3.block_sparse_moe.experts.7.w2.weight") == "expert"
    assert cls("model.layers.3.block_sparse_moe.gate.weight") == "router"
    assert cls("model.layers.3.mlp.shared_expert_gate.weight") == "router"
    assert cls("model.layers.3.mlp.shared_expert.up_proj.weight") == "shared_expert"


def test_minimax_m2_config_facts():
    """MiniMax-M2: rotary_dim gives the partial RoPE (a partial_rotary_factor wins), theta defaults to
    the config class's 5e6, q/k norms span the whole projection whatever hidden_size is, the
    correction bias is read from the MoE block and the top-k is renormalised whatever the config says."""
    cfg = {"model_type": "minimax_m2", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 32, "num_hidden_layers": 2, "vocab_size": 10, "num_local_experts": 4,
           "num_experts_per_tok": 2, "intermediate_size": 48, "rotary_dim": 16, "norm_topk_prob": False}
    _, arch = family_normalize.normalize_arch(cfg)
    assert arch["rotary_dim"] == 16 and arch["rope_inv_freq"][1] == pytest.approx(5e6 ** (-2 / 16), rel=1e-6)
    spec = family_specs.layer_specs(arch)[1]
    attn, mlp = spec["attn"], spec["mlp"]
    assert attn["qk_norm"] == "full" and attn["rope"]["dim"] == 16 and "q_bias" not in attn["tensors"]
    assert mlp["kind"] == "moe" and mlp["width"] == 48 and mlp["experts"] == 4
    r = mlp["router"]
    assert (r["kind"], r["renorm"], r["groups"], r["scale"]) == ("sigmoid_group", True, 1, 1.0)
    assert r["tensors"] == {"weight": "model.layers.1.block_sparse_moe.gate.weight",
                            "bias": "model.layers.1.block_sparse_moe.e_score_correction_bias"}
    assert mlp["expert_tensors"]["gate"] == "model.layers.1.block_sparse_moe.experts.{e}.w1.weight"
    _, arch = family_normalize.normalize_arch(dict(cfg, rope_parameters={"rope_theta": 1e4, "partial_rotary_factor": 0.25}))
    assert arch["rotary_dim"] == 8 and arch["rope_inv_freq"][1] == pytest.approx(1e4 ** (-2 / 8), rel=1e-6)
    cls = lambda n: next(c for c, rx in family_registry.TENSOR_CLASSES if rx.search(n))  # noqa: E731
    assert cls("model.layers.1.block_sparse_moe.e_score_correction_bias") == "router"


def test_mimo_v2_flash_config_facts():
    """MiMo-V2-Flash: the config class's defaults where config.json is silent (layer pattern, dense
    first layer, per-kind RoPE, value scale), and each layer's gqa geometry from its kind."""
    cfg = {"model_type": "mimo_v2_flash", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_hidden_layers": 7, "vocab_size": 10, "n_routed_experts": 4, "num_experts_per_tok": 2,
           "moe_intermediate_size": 16, "intermediate_size": 48}
    _, arch = family_normalize.normalize_arch(cfg)
    assert arch["layer_mlp"] == ["dense"] + ["moe"] * 6 and arch["head_dim"] == 192
    specs = family_specs.layer_specs(arch)
    kinds = [(s["attn"]["kv_heads"], s["attn"]["window"], s["attn"]["sinks"]) for s in specs]
    assert kinds == [(2, 0, False)] + [(4, 129, True)] * 4 + [(2, 0, False), (4, 129, True)]
    full, swa = specs[0]["attn"], specs[1]["attn"]
    assert full["rope"]["dim"] == swa["rope"]["dim"] == 64 and arch["rotary_dim"] == 64
    assert full["rope"]["inv_freq"][1] == pytest.approx(5e6 ** (-2 / 64), rel=1e-6)
    assert swa["rope"]["inv_freq"][1] == pytest.approx(1e4 ** (-2 / 64), rel=1e-6)
    assert (swa["v_head_dim"], swa["v_scale"]) == (128, 0.707)
    assert swa["tensors"]["sinks"] == "model.layers.1.self_attn.attention_sink_bias" and "sinks" not in full["tensors"]
    assert swa["state"] == {"kv_values_per_pos": 4 * (192 + 128), "fixed_bytes": 0, "truncatable": True, "window": 129}
    assert swa["ring"] and not full["ring"] and "window" not in full["state"]
    assert full["state"]["kv_values_per_pos"] == 2 * (192 + 128)
    assert specs[1]["mlp"]["kind"] == "moe" and specs[1]["mlp"]["router"]["kind"] == "sigmoid_group"
    # the hub's sliding_window_size excludes the query; an explicit null value scale is 1
    _, arch = family_normalize.normalize_arch(dict(cfg, sliding_window_size=127, attention_value_scale=None))
    assert family_specs.layer_specs(arch)[1]["attn"]["window"] == 128
    assert family_specs.layer_specs(arch)[1]["attn"]["v_scale"] == 1.0
    # one slot of 200 positions, f16: token ids, 2 full layers of 2 KV heads, 5 sliding ones of 4
    # that keep their 128-position window
    layers = family_specs.layer_specs(arch)
    assert family_specs.kv_slot_bytes(layers, 200) == 4 * 200 + 2 * (2 * 320 * 2) * 200 + 5 * (4 * 320 * 2) * 128
    with pytest.raises(family_registry.UnsupportedModel, match="layer_types"):
        family_normalize.normalize_arch(dict(cfg, layer_types=["full_attention"] * 3))
    with pytest.raises(family_registry.UnsupportedModel, match="rope_parameters"):
        family_normalize.normalize_arch(dict(cfg, rope_parameters={"rope_type": "default", "rope_theta": 1e4}))
