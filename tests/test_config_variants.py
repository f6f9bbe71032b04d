"""Checkpoints of the MoE families configured otherwise than the main oracles (see
tools/make_variant_oracles.py): `coli convert` + `coli logits` reproduce transformers, greedy
decoding agrees token for token, and a config value the engine does not implement is refused
at convert time with a message naming the field."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import make_variant_oracles
from test_oracles import (EXACT, QUANT, TIE, coli, exact_ratio, greedy_check, load_ref, parse_ids, quant_stats, run_logits,
                          safe_positions)
from colibri.family import class_defaults as family_defaults
from colibri.family import normalize as family_normalize
from colibri.family import parts as family_parts

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = list(make_variant_oracles.VARIANTS)
MIN_GREEDY = 12  # decoded tokens compared before a reference near-tie may stop the comparison
STRICT_TOL = 1e-4  # bf16 container, f32 K/V: max|logit - ref| / max|ref| (measured: 3e-6 at worst)
# f16 K/V (the default) rounds every cached key and value to 11 bits; the loudest variants here
# (tied embeddings, narrow heads) measured 2.7e-3
F16_KV_TOL = 5e-3


@pytest.fixture(scope="session")
def variant_root():
    return make_variant_oracles.generate(quiet=True)


@pytest.fixture(scope="session")
def converted(variant_root, tmp_path_factory):
    cache = {}

    def get(variant):
        if variant not in cache:
            out = tmp_path_factory.mktemp(variant) / "c"
            # an f32/f16 source keeps its weights exactly in an f32 container only
            dtype = make_variant_oracles.VARIANTS[variant].get("dtype", "bfloat16")
            coli("convert", Path(variant_root) / variant / "hf", out, *EXACT["bf16" if dtype == "bfloat16" else "f32"])
            cache[variant] = out
        return cache[variant]
    return get


@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_and_greedy_match_transformers(variant, variant_root, converted, tmp_path):
    info, ref = load_ref(variant_root, variant)
    # transformers' own greedy run agrees with its teacher-forced pass (its cache once did not,
    # for a one-position window)
    assert info["gen_teacher_forced_agrees"], f"{variant}: the reference's generate() and forward disagree"
    model = converted(variant)
    # f32 K/V: the bf16 weights are the checkpoint's own, so only summation order differs
    exact = exact_ratio(run_logits(model, info["ids"], tmp_path / "f32.f32", "--kv", "f32"), ref)
    got = run_logits(model, info["ids"], tmp_path / "logits.f32")  # the defaults a user gets (f16 K/V)
    assert got.shape == ref.shape, f"logits shape {got.shape}, reference {ref.shape}"
    ratio = exact_ratio(got, ref)
    decisive = np.asarray(info["margin"]) >= TIE * info["max_abs_logit"]
    flips = int((got.argmax(-1) != ref.argmax(-1))[decisive].sum())
    out = coli("run", "--model", model, "--ids", ",".join(map(str, info["prompt_ids"])),
               "--max-tokens", len(info["generated_ids"]), "--temp", 0)
    n, note = greedy_check(parse_ids(out), info)
    print(f"{variant}: max|logit-ref|/max|ref| = {exact:.2e} with f32 K/V, {ratio:.2e} with f16 K/V; argmax differs "
          f"at {flips}/{int(decisive.sum())} decisive positions; {n} greedy tokens identical ({note})")
    assert exact <= STRICT_TOL, f"{variant}: logits ratio {exact:.2e} > {STRICT_TOL:.0e} with f32 K/V"
    assert ratio <= F16_KV_TOL, f"{variant}: logits ratio {ratio:.2e} > {F16_KV_TOL:.0e} with f16 K/V"
    assert flips == 0
    assert n >= MIN_GREEDY, f"{variant}: only {n} greedy tokens comparable ({note})"


LONG = 600  # positions: several prefill batches, chunks of the linear layers, windows 20x over
LONG_VARIANTS = ["qwen3_5_moe_vl_fullfirst", "kimi_linear_qlora", "gpt_oss_wide_yarn", "mimo_v2_flash_default_pattern"]


@pytest.mark.parametrize("variant", LONG_VARIANTS)
def test_long_sequence_matches_transformers(variant, variant_root, tmp_path):
    """A sequence longer than the 96-position references, past YaRN's original context, computed
    by transformers here (float32, eager attention and experts)."""
    import torch
    import make_oracles
    torch.set_num_threads(1)
    spec, hf = make_variant_oracles.VARIANTS[variant], Path(variant_root) / variant / "hf"
    _, cls = make_oracles.model_class(spec["family"], spec.get("wrap"))
    model = cls.from_pretrained(hf, dtype=torch.float32, attn_implementation="eager",
                                experts_implementation="eager").eval()
    ids = torch.randint(1, 320, (LONG,), generator=torch.Generator().manual_seed(7)).tolist()
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].float().numpy()
    coli("convert", hf, tmp_path / "c", *EXACT["bf16"])
    got = run_logits(tmp_path / "c", ids, tmp_path / "l.f32", "--kv", "f32")
    ratio = exact_ratio(got, ref)
    print(f"{variant}: {LONG} positions, max|logit-ref|/max|ref| = {ratio:.2e}")
    assert ratio <= STRICT_TOL and (got.argmax(-1) == ref.argmax(-1)).mean() > 0.99


# Default conversion (q4 experts, q8 dense), as a checkpoint is most often converted. These tiny
# random models are far more fragile than trained ones (top-1 routing, recurrent state carrying a
# flipped choice on); measured at worst: mean KL 0.50, top-1 57%. The bounds catch a broken kernel
# or layout (KL of several nats, top-1 near 1/vocab), not quantization noise.
DEFAULT_KL, DEFAULT_TOP1 = 1.0, 0.45


@pytest.mark.parametrize("variant", VARIANTS)
def test_default_conversion_tracks_transformers(variant, variant_root, tmp_path):
    info, ref = load_ref(variant_root, variant)
    coli("convert", Path(variant_root) / variant / "hf", tmp_path / "c")
    got = run_logits(tmp_path / "c", info["ids"], tmp_path / "logits.f32")
    assert got.shape == ref.shape and np.isfinite(got).all()
    s = quant_stats(got, ref, safe_positions(info, QUANT["q4"]["safe"], QUANT["q4"]["router_safe"]))
    print(f"{variant} q4/q8: mean KL {s['kl_mean']:.2e}, top-1 {100 * s['top1_all']:.1f}% "
          f"({100 * s['top1_safe']:.1f}% on {s['n_safe']} margin-safe positions)")
    assert s["kl_mean"] <= DEFAULT_KL and s["top1_all"] >= DEFAULT_TOP1, s


# ---------- config.json fields left out (no engine needed) ----------

MINIMAL = dict(vocab_size=320, hidden_size=64, num_hidden_layers=4, num_attention_heads=4)
CONFIG_CLASSES = {"olmoe": "OlmoeConfig", "mixtral": "MixtralConfig", "qwen2_moe": "Qwen2MoeConfig",
                  "gpt_oss": "GptOssConfig", "qwen3_5_moe_text": "Qwen3_5MoeTextConfig", "qwen3_5_moe": "Qwen3_5MoeConfig",
                  "kimi_linear": "KimiLinearConfig", "minimax_m2": "MiniMaxM2Config", "mimo_v2_flash": "MiMoV2FlashConfig"}


@pytest.mark.parametrize("model_type", list(CONFIG_CLASSES))
def test_absent_fields_take_the_config_class_defaults(model_type):
    """A config.json that leaves fields out converts as transformers runs it: with its config
    class's defaults (the class's own to_dict spells every one of them out)."""
    import transformers
    from transformers.utils import logging as hf_logging
    import family_registry
    hf_logging.set_verbosity_error()
    cls = getattr(transformers, CONFIG_CLASSES[model_type])
    if model_type == "qwen3_5_moe":  # the release wrapper, its text model given as sparsely
        raw = {"model_type": model_type, "text_config": dict(MINIMAL, model_type="qwen3_5_moe_text")}
        full = cls(text_config=dict(MINIMAL)).to_dict()
    else:
        raw, full = dict(MINIMAL, model_type=model_type), cls(**MINIMAL).to_dict()
    full = json.loads(json.dumps(full))  # as config.json holds it
    _, got = family_normalize.normalize_arch(raw)
    _, want = family_normalize.normalize_arch(full)
    diff = {k: (got.get(k), want.get(k)) for k in set(got) | set(want) if got.get(k) != want.get(k)}
    assert not diff, f"{model_type}: fields left out are read otherwise than the class defaults: {diff}"


# the class whose to_dict spells out a family's CLASS_DEFAULTS (Qwen3.5's are its text model's)
DEFAULTS_CLASS = {f: "qwen3_5_moe_text" if f == "qwen3_5_moe" else f for f in family_parts.MODULES
                  if family_defaults.defaults(f)}
# defaults the class turns into other fields instead of keeping (KimiLinearConfig writes
# first_k_dense_replace into mlp_layer_types)
DERIVED = {"kimi_linear": {"first_k_dense_replace"}}


def test_every_family_with_class_defaults_is_checked():
    assert set(DEFAULTS_CLASS.values()) <= set(CONFIG_CLASSES), DEFAULTS_CLASS
    for module in set(family_parts.MODULES.values()):  # keyed by families the module serves
        for family in getattr(module, "CLASS_DEFAULTS", {}):
            assert family_parts.MODULES.get(family) is module, (module.__name__, family)


@pytest.mark.parametrize("family", list(DEFAULTS_CLASS))
def test_class_defaults_are_the_config_class_values(family):
    """Each family module's CLASS_DEFAULTS value is its config class's (a rope table may gain the
    class's own rope_theta)."""
    import transformers
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    full = json.loads(json.dumps(getattr(transformers, CONFIG_CLASSES[DEFAULTS_CLASS[family]])(**MINIMAL).to_dict()))
    for key, value in family_defaults.defaults(family).items():
        if key in DERIVED.get(family, ()):
            continue
        got = full.get(key)
        if isinstance(value, dict) and isinstance(got, dict):
            got = {k: got.get(k) for k in value}
        assert got == value, f"{family}.{key}: {value!r}, the class has {full.get(key)!r}"


# ---------- what convert refuses, and the CLI a scorer drives ----------

# (variant, config.json change, text the refusal must hold): fields the engine does not
# implement, each named by the message
REFUSED = [
    ("mixtral_top1_headdim", {"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ("olmoe_top1_bias", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}},
     "rope type 'dynamic'"),
    ("minimax_m2_yarn", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 4,
                                             "long_factor": [1.0] * 4}}, "rope type 'longrope'"),
    ("olmoe_top4_yarn", {"head_dim": 16}, "head_dim 16"),
    ("mixtral_top3_llama3", {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0,
                                                 "partial_rotary_factor": 0.5}}, "partial_rotary_factor 0.5"),
    ("gpt_oss_top1_nobias", {"layer_types": ["full_attention", "chunked_attention", "sliding_attention"]},
     "layer_types: chunked_attention"),
    ("qwen3_5_moe_text_interval3", {"attention_bias": True}, "attention_bias"),
    ("qwen3_5_moe_vl_fullfirst", {"text_config": {"linear_num_key_heads": 4}}, "linear_num_value_heads 6"),
    ("kimi_linear_qlora", {"mla_use_nope": False}, "mla_use_nope"),
    ("kimi_linear_qlora", {"linear_attn_config": {"full_attn_layers": [4], "kda_layers": [1, 2]}, "layer_types": None},
     "linear_attn_config.full_attn_layers names layer 4"),
    ("mimo_v2_flash_allfull", {"layer_types": ["full_attention", "chunked_attention", "full_attention"]},
     "layer_types"),
]


def edited_checkpoint(variant_root, variant, change, dst):
    shutil.copytree(Path(variant_root) / variant / "hf", dst)
    cfg = json.loads((dst / "config.json").read_text())
    for key, value in change.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict) and key != "rope_parameters":
            cfg[key].update(value)  # a sub-config: change some of its fields
        else:
            cfg[key] = value
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("variant,change,message", REFUSED, ids=[f"{v}-{next(iter(c))}" for v, c, _ in REFUSED])
def test_unsupported_fields_are_refused_by_name(variant, change, message, variant_root, tmp_path):
    src = edited_checkpoint(variant_root, variant, change, tmp_path / "hf")
    p = subprocess.run([sys.executable, str(ROOT / "coli"), "convert", str(src), str(tmp_path / "c")], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and message in p.stderr, f"exit {p.returncode}: {p.stderr[-600:]}"
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "c" / "colibri.json").exists()


def test_logits_cli_contract(variant_root, converted, tmp_path):
    """What a scorer relies on: --help, [len(ids), vocab] little-endian float32 rows, errors
    that name the bad id and exit non-zero."""
    helps = {cmd: subprocess.run([sys.executable, str(ROOT / "coli"), cmd, "--help"], capture_output=True, text=True)
             for cmd in ("convert", "logits")}
    assert all(p.returncode == 0 for p in helps.values())
    assert "--ids" in helps["logits"].stdout and "little-endian float32" in helps["logits"].stdout
    assert "--experts" in helps["convert"].stdout and "--dense" in helps["convert"].stdout
    info, ref = load_ref(variant_root, "mixtral_top1_headdim")
    model = converted("mixtral_top1_headdim")
    raw = run_logits(model, [5, 6, 7], tmp_path / "three.f32")
    assert raw.shape == (3, info["vocab_size"]) and (tmp_path / "three.f32").stat().st_size == 3 * info["vocab_size"] * 4
    coli("logits", "--model", model, "--ids", "5, 6, 7", "--out", tmp_path / "spaced.f32")  # spaces after commas
    assert np.array_equal(raw, np.fromfile(tmp_path / "spaced.f32", dtype="<f4").reshape(raw.shape))
    bad = subprocess.run([sys.executable, str(ROOT / "coli"), "logits", "--model", str(model), "--ids",
                          f"5,{info['vocab_size']}", "--out", str(tmp_path / "bad.f32")], capture_output=True, text=True)
    assert bad.returncode != 0 and f"'{info['vocab_size']}' is not an id in [0, {info['vocab_size']})" in bad.stderr, bad.stderr
