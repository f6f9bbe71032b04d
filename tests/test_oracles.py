"""Oracle tests: convert tiny transformers checkpoints with `coli convert`, run them with
`coli logits` / `coli run`, and compare with the references from tools/make_oracles.py."""
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
import make_oracles  # noqa: E402  (imports no torch at module level)

VARIANTS = list(make_oracles.VARIANTS)

EXACT_TOL = 1e-3     # bf16/f32 containers: max|logit - ref| <= EXACT_TOL * max|ref|
LOSSY_TOL = 2e-2     # bf16 container of an f32/f16 source (bf16 weight rounding gave 4e-3)
PREFILL_TOL = 1e-4   # batched prefill vs one token per pass, relative to max|logit|
TIE = 2e-3           # greedy: logit margin < TIE * max|ref| is a near-tie (2x the exact tolerance)
ROUTER_TIE = 1e-2    # greedy: router top-k margin (router logits) below this is a near-tie
MIN_GREEDY = 16      # decoded tokens that must be compared
MIN_SAFE = 10        # margin-safe positions a quantized comparison needs
# Quantized containers; "margin-safe" = logit margin >= safe * max|ref| and router margin >= router_safe.
# Measured (engine at first landing, and a torch simulation of group-32 absmax quantization agreed):
# worst mean KL 3.0e-3 (q8) and 3.1e-2 (q4), top-1 >= 97% on margin-safe positions.
# KL bounds leave ~3x (q8) and ~5x (q4) headroom; a broken kernel gives KL ~1 and random top-1.
QUANT = {
    "q8": dict(flags=["--experts", "q8", "--dense", "q8"], top1=0.98, kl=1e-2, safe=0.02, router_safe=0.1),
    "q4": dict(flags=[], top1=0.90, kl=0.15, safe=0.05, router_safe=0.3),  # defaults: q4 experts, q8 dense
}
EXACT = {"bf16": ["--experts", "bf16", "--dense", "bf16"], "f32": ["--experts", "f32", "--dense", "f32"]}
# DSA (index_topk < sequence): each query's hard top-k of keys turns quantization noise into
# flipped key selections, each moving that position's logits. A torch simulation of group-32
# absmax q8 weights gives the same as the engine (mean KL / top-1 on all positions:
# deepseek_v32 7.2e-2 / 83% simulated, 7.5e-2 / 82% engine; glm_moe_dsa 0.10 / 76% and
# 0.105 / 79%; dense-attention deepseek_v3 8.7e-4 both), so these bounds only catch a broken
# kernel (KL ~1, random top-1); the exact tests prove the sparse path itself.
DSA_QUANT = dict(top1=0.6, kl=0.4, min_safe=5)


# ---------- comparison helpers (pure numpy; also exercised without an engine below) ----------

def exact_ratio(got, ref):
    return float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def safe_positions(ref_info, rel, router):
    margin = np.asarray(ref_info["margin"])
    safe = margin >= rel * ref_info["max_abs_logit"]
    if ref_info["router_margin"] is not None:
        safe &= np.asarray(ref_info["router_margin"]) >= router
    return safe


def quant_stats(got, ref, safe):
    lp, lq = log_softmax(ref), log_softmax(got)
    kl = (np.exp(lp) * (lp - lq)).sum(-1)
    agree = got.argmax(-1) == ref.argmax(-1)
    return {"kl_mean": float(kl.mean()), "kl_max": float(kl.max()), "top1_all": float(agree.mean()),
            "top1_safe": float(agree[safe].mean()) if safe.any() else float("nan"), "n_safe": int(safe.sum())}


def greedy_check(got, ref_info):
    """Compare greedy ids; stop (and say so) at the first reference near-tie.
    Returns (tokens compared, note); raises AssertionError on a real mismatch."""
    want, lm, rm = ref_info["generated_ids"], ref_info["gen_margin"], ref_info["gen_router_margin"]
    tie = TIE * ref_info["max_abs_logit"]
    for j, w in enumerate(want):
        if lm[j] < tie or (rm is not None and rm[j] < ROUTER_TIE):
            r = f", router margin {rm[j]:.4f}" if rm is not None else ""
            return j, f"stopped at step {j}: reference near-tie (logit margin {lm[j]:.4f}{r})"
        assert j < len(got), f"engine produced {len(got)} tokens, reference {len(want)}: {got} vs {want}"
        assert got[j] == w, f"greedy token {j} differs: engine {got[:j + 1]} vs reference {want[:j + 1]}"
    assert len(got) == len(want), f"engine produced extra tokens: {got} vs {want}"
    return len(want), "all tokens compared"


def parse_ids(stdout):
    lines = [ln for ln in stdout.strip().splitlines() if ln.strip()]
    if not lines or not re.fullmatch(r"[\d,\s]+", lines[-1]):
        raise AssertionError(f"`coli run --ids` should print comma-separated token ids, got: {stdout[-400:]!r}")
    return [int(t) for t in re.split(r"[,\s]+", lines[-1].strip()) if t]


# ---------- engine plumbing ----------

def require_engine():
    missing = [p for p in ("coli", "build/colibri") if not (ROOT / p).exists()]
    if missing:
        pytest.fail(f"oracle tests need the engine, but {' and '.join(missing)} is missing: run `make` first "
                    "(these tests never skip for a missing engine)", pytrace=False)


def coli(*args):
    require_engine()
    cmd = [sys.executable, str(ROOT / "coli"), *map(str, args)]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        pytest.fail(f"`coli {' '.join(map(str, args))}` exited {p.returncode}\n"
                    f"stdout: {p.stdout[-2000:]}\nstderr: {p.stderr[-2000:]}", pytrace=False)
    return p.stdout


def load_ref(root, variant):
    d = Path(root) / variant
    info = json.loads((d / "ref.json").read_text())
    ref = np.fromfile(d / "ref_logits.f32", dtype="<f4").reshape(info["logits_shape"])
    return info, ref


def run_logits(model, ids, out, *extra):
    coli("logits", "--model", model, "--ids", ",".join(map(str, ids)), "--out", out, *extra)
    got = np.fromfile(out, dtype="<f4")
    assert got.size % len(ids) == 0, f"{out}: {got.size} floats is not a multiple of {len(ids)} rows"
    return got.reshape(len(ids), -1)


@pytest.fixture(scope="session")
def container(oracle_root, tmp_path_factory):
    """container(variant, flags) -> converted model dir, converted once per session."""
    cache = {}

    def get(variant, flags):
        key = (variant, tuple(flags))
        if key not in cache:
            out = tmp_path_factory.mktemp(f"{variant}_{'_'.join(flags[1::2]) or 'default'}") / "c"
            coli("convert", Path(oracle_root) / variant / "hf", out, *flags)
            cache[key] = out
        return cache[key]
    return get


# ---------- tests that need the engine ----------

@pytest.mark.parametrize("mode", list(EXACT))
@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_exact(variant, mode, oracle_root, container, tmp_path):
    info, ref = load_ref(oracle_root, variant)
    got = run_logits(container(variant, EXACT[mode]), info["ids"], tmp_path / "logits.f32")
    assert got.shape == ref.shape, f"logits shape {got.shape}, reference {ref.shape}"
    ratio = exact_ratio(got, ref)
    # a bf16 container of an f32/f16 checkpoint rounds the weights: only the f32 container is exact
    lossy = mode == "bf16" and make_oracles.VARIANTS[variant].get("dtype", "bfloat16") != "bfloat16"
    tol = LOSSY_TOL if lossy else EXACT_TOL
    print(f"{variant} {mode}: max|logit-ref|/max|ref| = {ratio:.2e} (bound {tol:.0e}"
          f"{', weights rounded to bf16' if lossy else ''})")
    assert ratio <= tol, f"{variant} {mode}: logits ratio {ratio:.2e} > {tol:.0e}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_tokens(variant, oracle_root, container):
    info, _ = load_ref(oracle_root, variant)
    model = container(variant, EXACT["bf16"])
    out = coli("run", "--model", model, "--ids", ",".join(map(str, info["prompt_ids"])),
               "--max-tokens", len(info["generated_ids"]), "--temp", 0)
    n, note = greedy_check(parse_ids(out), info)
    print(f"{variant}: {n} greedy tokens identical ({note})")
    assert n >= MIN_GREEDY, f"{variant}: only {n} tokens comparable ({note}); the oracle prompt is not decisive"


@pytest.mark.parametrize("variant", VARIANTS)
def test_prefill_matches_stepwise(variant, oracle_root, container, tmp_path):
    info, _ = load_ref(oracle_root, variant)
    model = container(variant, EXACT["bf16"])
    batched = run_logits(model, info["ids"], tmp_path / "batched.f32")
    step = run_logits(model, info["ids"], tmp_path / "step.f32", "--batch", 1)
    diff = float(np.abs(batched - step).max() / np.abs(batched).max())
    print(f"{variant}: prefill vs step-by-step max diff / max|logit| = {diff:.2e} (bound {PREFILL_TOL:.0e})")
    assert diff <= PREFILL_TOL


@pytest.mark.parametrize("quant", list(QUANT))
@pytest.mark.parametrize("variant", VARIANTS)
def test_quantized(variant, quant, oracle_root, container, tmp_path):
    q = QUANT[quant]
    if "index_topk" in make_oracles.VARIANTS[variant]["config"]:
        q = dict(q, **DSA_QUANT)
    info, ref = load_ref(oracle_root, variant)
    got = run_logits(container(variant, q["flags"]), info["ids"], tmp_path / "logits.f32")
    assert got.shape == ref.shape
    safe = safe_positions(info, q["safe"], q["router_safe"])
    s = quant_stats(got, ref, safe)
    print(f"{variant} {quant}: mean KL {s['kl_mean']:.2e} (bound {q['kl']:.2g}), top-1 {100 * s['top1_safe']:.1f}% "
          f"on {s['n_safe']}/{len(ref)} margin-safe positions ({100 * s['top1_all']:.1f}% on all)")
    assert s["n_safe"] >= q.get("min_safe", MIN_SAFE), f"{variant}: only {s['n_safe']} margin-safe positions in the oracle"
    assert s["top1_safe"] >= q["top1"], f"{variant} {quant}: top-1 {s['top1_safe']:.3f} < {q['top1']}"
    assert s["kl_mean"] <= q["kl"], f"{variant} {quant}: mean KL {s['kl_mean']:.2e} > {q['kl']:.2g}"


# ---------- tests of the oracles and of the comparison helpers (no engine needed) ----------

@pytest.mark.parametrize("variant", VARIANTS)
def test_oracle_checkpoint(variant, oracle_root):
    """The generated checkpoint has the layout, dtype and references the tests rely on."""
    from safetensors import safe_open
    info, ref = load_ref(oracle_root, variant)
    spec = make_oracles.VARIANTS[variant]
    hf = Path(oracle_root) / variant / "hf"
    cfg = json.loads((hf / "config.json").read_text())
    assert cfg["model_type"] == spec.get("model_type", spec["family"]) and (hf / "tokenizer.json").exists()
    assert np.isfinite(ref).all() and ref.std() > 0.5, "reference logits are degenerate"
    files = sorted(hf.glob("*.safetensors"))
    assert (len(files) > 1) == ("shard" in spec) == (hf / "model.safetensors.index.json").exists()
    keys, dtypes = set(), set()
    for f in files:
        with safe_open(f, "pt") as st:
            for k in st.keys():
                keys.add(k)
                dtypes.add(st.get_slice(k).get_dtype())
    want = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}[spec.get("dtype", "bfloat16")]
    if spec["family"] == "deepseek_v4":  # the hash layers' tid2eid is an integer table; the release's names
        assert "I64" in dtypes and any(k.endswith(".ffn.gate.tid2eid") for k in keys) and "head.weight" in keys
        dtypes.discard("I64")
        keys.add("lm_head.weight")
        assert "sliding_attention" in cfg["layer_types"] and cfg["sliding_window"] < make_oracles.PROMPT_LEN + make_oracles.NEW_TOKENS
        if "compressed_sparse_attention" in cfg["layer_types"]:  # both compressed kinds; an HCA entry before generation
            assert "heavily_compressed_attention" in cfg["layer_types"]
            assert cfg["compress_rates"]["heavily_compressed_attention"] < make_oracles.PROMPT_LEN + make_oracles.NEW_TOKENS
    assert dtypes == {want}
    assert ("lm_head.weight" in keys) != bool(cfg.get("tie_word_embeddings"))
    if spec["family"] == "qwen3_moe":
        fused = any(k.endswith("mlp.experts.gate_up_proj") for k in keys)
        hub = any(k.endswith("mlp.experts.0.gate_proj.weight") for k in keys)
        assert (fused, hub) == ((True, False) if spec.get("layout") == "fused" else (False, True))
    if spec["family"] == "qwen2_moe":  # the gated shared expert, and a dense layer among the sparse ones
        assert any(k.endswith("mlp.shared_expert_gate.weight") for k in keys) and cfg["mlp_only_layers"]
    if spec["family"] == "mixtral":  # the original per-expert names; a window, where set, that binds
        assert any(k.endswith("block_sparse_moe.experts.0.w1.weight") for k in keys)
        w = cfg["sliding_window"]
        assert w is None or w < make_oracles.PROMPT_LEN + make_oracles.NEW_TOKENS < len(info["ids"])
    if spec["family"] == "gpt_oss":  # sliding and full layers, a window that binds, sinks that take weight
        assert set(cfg["layer_types"]) == {"sliding_attention", "full_attention"}
        assert cfg["sliding_window"] < make_oracles.PROMPT_LEN + make_oracles.NEW_TOKENS
        with safe_open(files[0], "pt") as st:
            sinks = [st.get_tensor(f"model.layers.{i}.self_attn.sinks").float() for i in range(cfg["num_hidden_layers"])]
        assert max(float(x.abs().max()) for x in sinks) > 0.5
        assert cfg["swiglu_limit"] < 7 and cfg["rope_parameters"]["truncate"] is False
    if spec["family"] == "qwen3_5_moe":  # linear and full layers; the release's wrapper carries a vision tower
        types = (cfg.get("text_config") or cfg)["layer_types"]
        assert {"linear_attention", "full_attention"} == set(types)
        assert any(k.startswith("model.visual.") for k in keys) == (spec.get("wrap") == "vl")
    if spec["family"] == "kimi_linear":  # the release's 1-indexed layer lists; its own tensor names
        assert cfg["linear_attn_config"]["kda_layers"] and cfg["linear_attn_config"]["full_attn_layers"]
        assert any(k.endswith("self_attn.q_conv1d.weight") for k in keys)
        assert any(k.endswith("block_sparse_moe.experts.0.w1.weight") for k in keys)
    if spec["family"] == "olmoe":  # clip_qkv set (the engine clamps q/k/v), top-k unnormalised
        assert cfg["clip_qkv"] and not cfg["norm_topk_prob"]
    if spec["family"] == "minimax_m2":  # whole-projection q/k norms, partial rotary, the bias on the MoE block
        assert cfg["num_attention_heads"] * cfg["head_dim"] != cfg["hidden_size"] and cfg["rotary_dim"] < cfg["head_dim"]
        assert any(k.endswith("block_sparse_moe.e_score_correction_bias") for k in keys)
        assert info["selection_changed_by_bias"] > 0
    if spec["family"] == "mimo_v2_flash":  # both layer kinds, a window that binds, sinks
        types = cfg["layer_types"]
        assert {"full_attention", "sliding_attention"} <= set(types) and "dense" in cfg["mlp_layer_types"]
        assert cfg["sliding_window"] < make_oracles.PROMPT_LEN + make_oracles.NEW_TOKENS
        assert sum(k.endswith("self_attn.attention_sink_bias") for k in keys) == types.count("sliding_attention")
        if variant == "mimo_v2_flash":  # v heads narrower than q/k, values scaled, the release's dense first layer
            assert cfg["v_head_dim"] < cfg["head_dim"] and cfg["attention_value_scale"] not in (None, 1)
            assert cfg["mlp_layer_types"][0] == "dense"
        else:  # biases, v heads as wide as q/k (the kernels' sinks), no value scale
            assert cfg["attention_bias"] and cfg["v_head_dim"] == cfg["head_dim"] and cfg["attention_value_scale"] is None
    if spec["family"] in make_oracles.MOE_FAMILIES:
        assert info["router_margin"] is not None and min(info["router_margin"]) > 0
    if spec["family"] in make_oracles.SIGMOID_FAMILIES:
        # sigmoid group routing: the oracle must exercise the group limit and the selection-only bias
        # (and shared experts, except MiMo-V2-Flash, which has none; Kimi-Linear spells them its own way)
        n_group, n_shared = cfg.get("n_group", cfg.get("num_expert_group")), cfg.get("n_shared_experts", cfg.get("num_shared_experts"))
        assert cfg["topk_group"] < n_group
        assert (n_shared or 0) >= 1 or spec["family"] == "mimo_v2_flash"
        assert info["selection_changed_by_groups"] > 0 and info["selection_changed_by_bias"] > 0
    if "index_topk" in spec["config"]:
        # DSA: sparse selection for most positions, by an indexer with several heads whose
        # top-k gaps were picked to survive the engine's rounding (make_oracles.IndexMargins)
        assert cfg["index_topk"] < len(info["ids"]) // 2 and cfg["index_n_heads"] >= 8
        assert info["index_margin"] is not None and info["index_margin"] > 0
    assert len(info["generated_ids"]) == make_oracles.NEW_TOKENS and info["gen_teacher_forced_agrees"]


def test_comparison_helpers_can_fail(oracle_root):
    """The comparisons accept the reference itself and reject perturbed or wrong results."""
    info, ref = load_ref(oracle_root, "qwen3_moe")
    assert exact_ratio(ref, ref) == 0.0
    rng = np.random.default_rng(0)
    bumped = ref + (2 * EXACT_TOL * np.abs(ref).max()) * np.sign(rng.standard_normal(ref.shape))
    assert exact_ratio(bumped, ref) > EXACT_TOL
    safe = safe_positions(info, QUANT["q4"]["safe"], QUANT["q4"]["router_safe"])
    s = quant_stats(ref, ref, safe)
    assert s["kl_mean"] < 1e-12 and s["top1_all"] == 1.0
    shuffled = ref[:, rng.permutation(ref.shape[1])]
    s = quant_stats(shuffled, ref, safe)
    assert s["kl_mean"] > QUANT["q4"]["kl"] and s["top1_safe"] < QUANT["q4"]["top1"]
    assert greedy_check(list(info["generated_ids"]), info)[0] >= MIN_GREEDY
    wrong = list(info["generated_ids"])
    wrong[3] = (wrong[3] + 1) % info["vocab_size"]
    with pytest.raises(AssertionError):
        greedy_check(wrong, info)
    with pytest.raises(AssertionError):
        greedy_check(wrong[:5], info)
    assert parse_ids("loading...\n5, 6,7\n") == [5, 6, 7]
