"""The hybrid linear-attention families beyond the shared oracle suite: Qwen3.5/3.6-MoE (gated
DeltaNet; the release wrapper converts to its text model) and Kimi-Linear (KDA; the release's
config spelling and tensor names); prefill in chunks of any size matches the reference, and the
recurrent state behaves under prefix reuse (turn-boundary checkpoints, never truncation) and
slot persistence (a resumed conversation is byte-identical to an uninterrupted one)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
from colibri import engine_client  # noqa: E402
from engine_binaries import assert_clean_exit  # noqa: E402
from test_oracles import EXACT_TOL, exact_ratio, load_ref, run_logits  # noqa: E402

WRAPPED, TEXT, KIMI = "qwen3_5_moe", "qwen3_5_moe_text", "kimi_linear"


def convert(src, out, *flags):
    p = subprocess.run([sys.executable, str(ROOT / "coli"), "convert", str(src), str(out), *flags], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout + p.stderr


@pytest.fixture(scope="module")
def model(oracle_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("q35") / "c"
    log = convert(Path(oracle_root) / WRAPPED / "hf", out, "--experts", "bf16", "--dense", "bf16")
    return out, log


def test_release_wrapper_converts_the_text_model(model, oracle_root):
    out, log = model
    hf = json.loads((Path(oracle_root) / WRAPPED / "hf" / "config.json").read_text())
    assert hf["model_type"] == "qwen3_5_moe" and "text_config" in hf and "vision_config" in hf
    assert "vision tower" in log and "images and video are not supported" in log
    man = json.loads((out / "colibri.json").read_text())
    kinds = [spec["attn"]["kind"] for spec in man["layers"]]
    assert kinds == ["gated_deltanet"] * 3 + ["gqa"], kinds
    lin, full = man["layers"][0]["attn"], man["layers"][3]["attn"]
    tc = hf["text_config"]
    conv = 2 * tc["linear_num_key_heads"] * tc["linear_key_head_dim"] + tc["linear_num_value_heads"] * tc["linear_value_head_dim"]
    want = 4 * ((tc["linear_conv_kernel_dim"] - 1) * conv
                + tc["linear_num_value_heads"] * tc["linear_key_head_dim"] * tc["linear_value_head_dim"])
    assert lin["state"] == {"kv_values_per_pos": 0, "fixed_bytes": want, "truncatable": False}
    assert "gate" in full["tensors"] and full["qk_norm_offset"] == 1.0 and full["rope"]["dim"] == 8  # 0.25 x 32
    assert man["layers"][0]["attn_norm"]["weight_offset"] == 1.0 and man["trunk"]["final_norm"]["weight_offset"] == 1.0
    names = set()
    for shard in man["shards"]:
        with open(out / shard, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            names |= set(json.loads(f.read(n))) - {"__metadata__"}
    assert not any("visual" in n or "language_model" in n for n in names)


def test_info_names_the_layer_mix_and_the_fixed_state(model):
    out, _ = model
    p = subprocess.run([sys.executable, str(ROOT / "coli"), "info", "--model", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    man = json.loads((out / "colibri.json").read_text())
    fixed = sum(s["attn"]["state"]["fixed_bytes"] for s in man["layers"])
    assert f"attention    3 gated_deltanet + 1 gqa layers; fixed state {fixed / 1e6:.2f} MB per slot" in p.stdout, p.stdout


def test_plan_counts_fixed_state_and_per_token_kv_apart(model):
    out, _ = model
    p = subprocess.run([sys.executable, str(ROOT / "coli"), "plan", "--model", str(out), "--json"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    plan = json.loads(p.stdout)
    man = json.loads((out / "colibri.json").read_text())
    fixed = sum(s["attn"]["state"]["fixed_bytes"] for s in man["layers"])
    per_token = 2 * sum(s["attn"]["state"]["kv_values_per_pos"] for s in man["layers"])  # f16 cache
    found = json.dumps(plan)
    assert str(fixed) in found and str(per_token) in found, found[:2000]


def test_kimi_release_layout_converts(oracle_root, tmp_path):
    out = tmp_path / "c"
    convert(Path(oracle_root) / KIMI / "hf", out, "--experts", "bf16", "--dense", "bf16")
    hf = json.loads((Path(oracle_root) / KIMI / "hf" / "config.json").read_text())
    man = json.loads((out / "colibri.json").read_text())
    kinds = [spec["attn"]["kind"] for spec in man["layers"]]
    want = ["mla"] * hf["num_hidden_layers"]
    for i in hf["linear_attn_config"]["kda_layers"]:  # 1-indexed, as the release writes them
        want[i - 1] = "kda"
    assert kinds == want and "kda" in kinds and "mla" in kinds
    kda = man["layers"][kinds.index("kda")]["attn"]
    lac = hf["linear_attn_config"]
    nh, hd, K = lac["num_heads"], lac["head_dim"], lac["short_conv_kernel_size"]
    assert kda["state"] == {"kv_values_per_pos": 0, "fixed_bytes": 4 * ((K - 1) * 3 * nh * hd + nh * hd * hd),
                            "truncatable": False}
    mla = man["layers"][kinds.index("mla")]["attn"]
    assert mla["rope"]["style"] == "none"  # no position encoding in the full-attention layers
    moe = man["layers"][1]["mlp"]
    assert moe["router"]["kind"] == "sigmoid_group" and moe["router"]["scale"] == hf["routed_scaling_factor"]
    assert moe["top_k"] == hf["num_experts_per_token"] and moe["router"]["groups"] == hf["num_expert_group"]
    assert man["layers"][0]["mlp"]["kind"] == "dense" and moe["kind"] == "moe_shared"


@pytest.mark.parametrize("variant", [WRAPPED, TEXT, KIMI])
@pytest.mark.parametrize("batch", [7, 40])
def test_prefill_in_chunks_of_any_size_matches_the_reference(variant, batch, oracle_root, tmp_path):
    """96 positions in forward passes of 7 or 40 (each run in the chunked form from the state the
    last one left, 40 splitting transformers' 64-position chunks differently) match transformers
    (an f32 cache, so only the arithmetic differs)."""
    info, ref = load_ref(oracle_root, variant)
    out = tmp_path / "c"
    convert(Path(oracle_root) / variant / "hf", out, "--experts", "f32", "--dense", "f32")
    got = run_logits(out, info["ids"], tmp_path / "l.f32", "--batch", batch, "--kv", "f32")
    ratio = exact_ratio(got, ref)
    print(f"{variant} --batch {batch} --kv f32: max|logit-ref|/max|ref| = {ratio:.2e}")
    assert ratio <= EXACT_TOL / 10


def turn(eng, ids, slot=0, n=6):
    """Greedy tokens and their LOGPROB lines (log-softmax of the raw logits, top 5, %.6f)."""
    ev = list(eng.generate(ids, max_tokens=n, temp=0, slot=slot, logprobs=1, top_logprobs=5))
    toks = [e[1] for e in ev if e[0] == "data" and e[1] >= 0]
    return ev[0], toks, [e[1:] for e in ev if e[0] == "logprob"]


@pytest.fixture(scope="module")
def models(model, oracle_root, tmp_path_factory):
    kimi = tmp_path_factory.mktemp("kimi") / "c"
    convert(Path(oracle_root) / KIMI / "hf", kimi, "--experts", "bf16", "--dense", "bf16")
    return {WRAPPED: model[0], KIMI: kimi}


@pytest.mark.parametrize("variant", [WRAPPED, KIMI])
def test_resumed_slot_is_byte_identical_to_an_uninterrupted_conversation(variant, models, oracle_root, tmp_path):
    out = models[variant]
    info, _ = load_ref(oracle_root, variant)
    prompt = info["ids"][:40]
    live, resumed = tmp_path / "live", tmp_path / "resumed"
    live.mkdir()
    resumed.mkdir()
    with engine_client.Engine(out, ctx=128, kv_dir=live, batch=16) as eng:
        _, first, _ = turn(eng, prompt)
        turn2 = prompt + first + info["ids"][40:52]
        _, want, want_lp = turn(eng, turn2)
    assert_clean_exit(eng)
    with engine_client.Engine(out, ctx=128, kv_dir=resumed, batch=16) as eng:
        turn(eng, prompt)
    with engine_client.Engine(out, ctx=128, kv_dir=resumed, batch=16) as eng:
        accept, got, got_lp = turn(eng, turn2)
        assert eng.stderr_seen("restored KV slot 0")
    assert_clean_exit(eng)
    assert accept == ("accept", len(turn2), len(prompt) + len(first) - 1)  # warm: only the new tokens run
    assert got == want and got_lp == want_lp
    # the recurrent and the attention state after both turns: the same bytes
    assert (live / ".coli_kv").read_bytes() == (resumed / ".coli_kv").read_bytes()


@pytest.mark.parametrize("variant", [WRAPPED, KIMI])
def test_prefix_reuse_restores_a_checkpoint_instead_of_truncating(variant, models, oracle_root):
    out = models[variant]
    info, _ = load_ref(oracle_root, variant)
    prompt, other = info["ids"][:30], info["ids"][60:70]
    with engine_client.Engine(out, ctx=128, batch=16) as fresh:
        _, want, want_lp = turn(fresh, prompt + other)
        _, want_short, _ = turn(fresh, prompt[:20] + other, slot=0)
    with engine_client.Engine(out, ctx=128, batch=16) as eng:
        _, first, _ = turn(eng, prompt)
        # diverges inside the generated answer: the state at the end of the prompt is restored
        accept, got, got_lp = turn(eng, prompt + first[:2] + other)
        assert accept[2] == len(prompt), accept
        assert eng.stderr_seen(f"reusing {len(prompt)} of {len(prompt) + 2} common positions")
        # diverges inside the prompt, before any checkpoint: recomputed from the start, and said so
        accept, short, _ = turn(eng, prompt[:20] + other)
        assert accept[2] == 0 and eng.stderr_seen("full recompute")
    assert_clean_exit(eng)
    _, check, check_lp = turn_fresh(out, prompt + first[:2] + other)
    assert got == check and short == want_short
    for (tok_a, lp_a, *_), (tok_b, lp_b, *_) in zip(got_lp, check_lp):
        assert tok_a == tok_b and abs(lp_a - lp_b) < 1e-4
    assert want and want_lp  # the fresh engine answered


def turn_fresh(out, ids):
    with engine_client.Engine(out, ctx=128, batch=16) as eng:
        return turn(eng, ids)


def test_kimi_release_spellings_give_the_same_logits(oracle_root, tmp_path):
    """The release as it ships: layer kinds only in linear_attn_config, the dense layer under
    first_k_dense_replace, its MLP under .mlp., A_log as [heads]; the same model as the oracle."""
    from safetensors.torch import load_file, save_file
    src = Path(oracle_root) / KIMI / "hf"
    rel = tmp_path / "release"
    rel.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (rel / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((src / "config.json").read_text())
    for key in ("layer_types", "mlp_layer_types", "linear_head_dim", "linear_num_heads", "linear_conv_kernel_dim"):
        cfg.pop(key)
    cfg.update(first_k_dense_replace=1, mla_use_nope=True, moe_router_activation_func="sigmoid")
    (rel / "config.json").write_text(json.dumps(cfg))
    tensors = {}
    for f in src.glob("*.safetensors"):
        for name, t in load_file(f).items():
            if name.endswith("A_log"):
                t = t.reshape(-1)
            tensors[name.replace("layers.0.block_sparse_moe.", "layers.0.mlp.")] = t
    save_file(tensors, rel / "model.safetensors", metadata={"format": "pt"})
    info, ref = load_ref(oracle_root, KIMI)
    out = tmp_path / "c"
    convert(rel, out, "--experts", "f32", "--dense", "f32")
    got = run_logits(out, info["ids"], tmp_path / "l.f32", "--kv", "f32")
    assert exact_ratio(got, ref) <= EXACT_TOL / 10
    cfg["mla_use_nope"] = False
    (rel / "config.json").write_text(json.dumps(cfg))
    p = subprocess.run([sys.executable, str(ROOT / "coli"), "convert", str(rel), str(tmp_path / "d")], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode != 0 and "mla_use_nope" in p.stderr


@pytest.mark.parametrize("variant", [WRAPPED, KIMI])
def test_slots_keep_their_own_recurrent_state(variant, models, oracle_root):
    """Two conversations interleaved on two slots answer as each does alone."""
    out = models[variant]
    info, _ = load_ref(oracle_root, variant)
    a, b = info["ids"][:24], info["ids"][50:70]
    alone = {}
    for name, ids in (("a", a), ("b", b)):
        with engine_client.Engine(out, ctx=128, batch=16) as eng:
            _, first, _ = turn(eng, ids)
            alone[name] = (first, turn(eng, ids + first + [5, 6, 7])[1])
    with engine_client.Engine(out, ctx=128, kv_slots=2, batch=16) as eng:
        _, fa, _ = turn(eng, a, slot=0)
        _, fb, _ = turn(eng, b, slot=1)
        _, sa, _ = turn(eng, a + fa + [5, 6, 7], slot=0)
        _, sb, _ = turn(eng, b + fb + [5, 6, 7], slot=1)
    assert_clean_exit(eng)
    assert (fa, sa) == alone["a"] and (fb, sb) == alone["b"]


@pytest.mark.parametrize("variant", [WRAPPED, TEXT, KIMI])
def test_transformers_own_layout_converts_to_the_same_model(variant, oracle_root, tmp_path):
    """save_pretrained(save_original_format=False): fused experts, one conv tensor, the forget
    gate's own module; the same logits as the release layout."""
    import make_oracles
    import torch
    torch.set_num_threads(1)
    spec = make_oracles.VARIANTS[variant]
    src = Path(oracle_root) / variant / "hf"
    model = make_oracles.model_class(spec["family"], spec.get("wrap"))[1].from_pretrained(src, dtype=torch.float32)
    hf = tmp_path / "hf"
    model.save_pretrained(hf, save_original_format=False)
    from safetensors import safe_open
    with safe_open(hf / "model.safetensors", "pt") as f:
        assert any(n.endswith("experts.gate_up_proj") for n in f.keys())
    info, ref = load_ref(oracle_root, variant)
    out = tmp_path / "c"
    convert(hf, out, "--experts", "f32", "--dense", "f32")
    got = run_logits(out, info["ids"], tmp_path / "l.f32", "--kv", "f32")
    assert exact_ratio(got, ref) <= EXACT_TOL / 10


@pytest.mark.parametrize("variant", [WRAPPED, KIMI])
def test_turn_boundary_checkpoints_survive_a_restart(variant, models, oracle_root, tmp_path):
    """A prompt that leaves the last answer early (a template that drops it, say) resumes from
    the turn-boundary checkpoint after a restart too, as it does in the engine that made it."""
    out = models[variant]
    info, _ = load_ref(oracle_root, variant)
    prompt, other = info["ids"][:30], info["ids"][60:70]
    live, resumed = tmp_path / "live", tmp_path / "resumed"
    live.mkdir()
    resumed.mkdir()
    with engine_client.Engine(out, ctx=128, kv_dir=live, batch=16) as eng:
        _, first, _ = turn(eng, prompt)
        again = prompt + first[:2] + other
        want_accept, want, want_lp = turn(eng, again)
    with engine_client.Engine(out, ctx=128, kv_dir=resumed, batch=16) as eng:
        turn(eng, prompt)
    with engine_client.Engine(out, ctx=128, kv_dir=resumed, batch=16) as eng:
        accept, got, got_lp = turn(eng, again)
    assert_clean_exit(eng)
    assert accept == want_accept == ("accept", len(again), len(prompt))
    assert got == want and got_lp == want_lp
    assert (live / ".coli_kv").read_bytes() == (resumed / ".coli_kv").read_bytes()
