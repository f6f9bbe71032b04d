"""DeepSeek-V4 beyond the oracle comparison (tests/test_oracles.py): the state is what the
mechanism keeps (a sliding layer its window, a compressed layer one entry per `rate` positions
plus its window and open windows as fixed state), the planner and the engine agree on it;
prefix reuse (a wrapped ring; checkpoints for compressed layers, never truncation) and slot
persistence answer as a fresh engine; the release's own format (its tensor names, block-FP8
dense weights with e8m0 scales, FP4 experts, integer tid2eid, legacy config spellings) converts
to the same model; configurations the engine does not run are refused by name."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import family_registry
from colibri import engine_client
from engine_binaries import assert_clean_exit
from test_batching import concurrent, sequential
from test_expert_streaming import Raw
from test_gpt_oss import check_ring_persistence, coli, greedy, kl_top1
from test_oracles import load_ref, run_logits
from test_qwen35 import turn, turn_fresh
from colibri.family import normalize as family_normalize
from colibri.family import specs as family_specs

ROOT = Path(__file__).resolve().parents[1]
SLIDING, COMPRESSED = "deepseek_v4", "deepseek_v4_compressed"
BF16 = ["--experts", "bf16", "--dense", "bf16"]


@pytest.fixture(scope="module")
def models(oracle_root, tmp_path_factory):
    out = {}
    for v in (SLIDING, COMPRESSED):
        out[v] = tmp_path_factory.mktemp(v) / "c"
        coli("convert", Path(oracle_root) / v / "hf", out[v], *BF16)
    return out


def test_state_is_sized_by_the_mechanism(oracle_root, models):
    cfg = json.loads((Path(oracle_root) / COMPRESSED / "hf" / "config.json").read_text())
    man = json.loads((models[COMPRESSED] / "colibri.json").read_text())
    hd, ihd, win = cfg["head_dim"], cfg["index_head_dim"], cfg["sliding_window"]
    csa, hca = cfg["compress_rates"]["compressed_sparse_attention"], cfg["compress_rates"]["heavily_compressed_attention"]
    states = [s["attn"]["state"] for s in man["layers"]]
    # CSA: the entry (f16) and the indexer's key (f32) per 4 positions; the window's rows, the
    # open window of both series (kv and gate), the closed window's first series, for both compressors
    csa_fixed = 4 * (win * hd + csa * 2 * 2 * hd + csa * 2 * hd + csa * 2 * 2 * ihd + csa * 2 * ihd)
    assert states[0] == {"kv_values_per_pos": hd // csa, "f32_values_per_pos": ihd // csa, "fixed_bytes": csa_fixed,
                         "truncatable": False}
    assert states[1] == {"kv_values_per_pos": hd // hca, "fixed_bytes": 4 * (win * hd + hca * 2 * hd), "truncatable": False}
    assert states[2] == {"kv_values_per_pos": hd, "fixed_bytes": 0, "truncatable": True, "window": win}
    e = Raw(models[COMPRESSED])
    ctx = int(e.ready["ctx"])
    per_token = 2 * (hd // csa) * 2 + 4 * (ihd // csa) * 2 + 2 * (hd // hca)  # two CSA layers, one HCA layer
    assert int(e.ready["kv_bytes_per_token"]) == per_token + 2 * hd  # + the sliding layer's ring rows
    assert int(e.ready["kv_slot_bytes"]) == family_specs.kv_slot_bytes(man["layers"], ctx)
    assert int(e.ready["kv_slot_bytes"]) == 4 * ctx + per_token * ctx + 2 * hd * win + 2 * csa_fixed + states[1]["fixed_bytes"]
    e.close()
    p = subprocess.run([sys.executable, str(ROOT / "coli"), "plan", "--model", str(models[COMPRESSED]), "--json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    found = json.dumps(json.loads(p.stdout))
    assert str(sum(s["fixed_bytes"] for s in states)) in found, found[:2000]
    p = subprocess.run([sys.executable, str(ROOT / "coli"), "info", "--model", str(models[COMPRESSED])], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    fixed = sum(s["fixed_bytes"] for s in states)
    assert (f"attention    2 CSA (rate 4) + 1 HCA (rate 8) + 1 sliding layers; fixed state {fixed / 1e6:.2f} MB per slot"
            in p.stdout), p.stdout


def test_prefix_reuse_over_a_wrapped_ring(oracle_root, models):
    ring, ids = models[SLIDING], load_ref(oracle_root, SLIDING)[0]["ids"]
    first = ids[:30]
    e = Raw(ring)
    t1 = e.turn(first, max_tokens=8, temp=0)
    second = first + t1["tokens"] + ids[30:40]
    t2 = e.turn(second, max_tokens=8, temp=0)  # extends the history: the ring still holds its window
    assert int(t2["end"]["reused_tokens"]) >= len(first) + 7, t2["end"]
    assert t2["tokens"] == greedy(ring, second)
    third = ids[:20] + ids[50:60]  # rewinds past the window: recomputed from the start
    t3 = e.turn(third, max_tokens=8, temp=0)
    assert t3["end"]["reused_tokens"] == "0", t3["end"]
    assert t3["tokens"] == greedy(ring, third)
    e.close()


def test_kv_persistence_with_a_ring(oracle_root, models, tmp_path):
    check_ring_persistence(models[SLIDING], load_ref(oracle_root, SLIDING)[0]["ids"], tmp_path)


def test_compressed_prefix_reuse_restores_a_checkpoint(oracle_root, models):
    """Compressed layers keep open windows that no prefix can be cut from: a prompt that diverges
    after a turn boundary restores that checkpoint; one that diverges earlier recomputes."""
    out, ids = models[COMPRESSED], load_ref(oracle_root, COMPRESSED)[0]["ids"]
    prompt, other = ids[:30], ids[60:70]  # 30: inside an open window of both rates
    with engine_client.Engine(out, ctx=128, batch=16) as fresh:
        _, want_short, _ = turn(fresh, prompt[:20] + other)
    with engine_client.Engine(out, ctx=128, batch=16) as eng:
        _, first, _ = turn(eng, prompt)
        accept, got, got_lp = turn(eng, prompt + first[:2] + other)
        assert accept[2] == len(prompt), accept
        accept, short, _ = turn(eng, prompt[:20] + other)
        assert accept[2] == 0 and eng.stderr_seen("full recompute")
    assert_clean_exit(eng)
    _, check, check_lp = turn_fresh(out, prompt + first[:2] + other)
    assert got == check and short == want_short
    for (tok_a, lp_a, *_), (tok_b, lp_b, *_) in zip(got_lp, check_lp):
        assert tok_a == tok_b and abs(lp_a - lp_b) < 1e-4


def test_resumed_slot_is_byte_identical_to_an_uninterrupted_conversation(oracle_root, models, tmp_path):
    out, ids = models[COMPRESSED], load_ref(oracle_root, COMPRESSED)[0]["ids"]
    prompt = ids[:41]
    live, resumed = tmp_path / "live", tmp_path / "resumed"
    live.mkdir()
    resumed.mkdir()
    with engine_client.Engine(out, ctx=128, kv_dir=live, batch=16) as eng:
        _, first, _ = turn(eng, prompt)
        turn2 = prompt + first + ids[41:53]
        _, want, want_lp = turn(eng, turn2)
    assert_clean_exit(eng)
    with engine_client.Engine(out, ctx=128, kv_dir=resumed, batch=16) as eng:
        turn(eng, prompt)
    with engine_client.Engine(out, ctx=128, kv_dir=resumed, batch=16) as eng:
        accept, got, got_lp = turn(eng, turn2)
        assert eng.stderr_seen("restored KV slot 0")
    assert_clean_exit(eng)
    assert accept == ("accept", len(turn2), len(prompt) + len(first) - 1)
    assert got == want and got_lp == want_lp
    assert (live / ".coli_kv").read_bytes() == (resumed / ".coli_kv").read_bytes()


@pytest.mark.parametrize("variant", [SLIDING, COMPRESSED])
def test_batched_decode_equals_one_request_at_a_time(variant, oracle_root, models):
    """Four slots decoded in one forward pass (each row's token ids drive its hash routing, each
    slot its own window, compressors and indexer) answer as each does alone."""
    ids = load_ref(oracle_root, variant)[0]["ids"]
    prompts = [ids[:9], ids[20:43], ids[50:53], ids[60:90]]
    opts = dict(max_tokens=24, temp=0, ignore_eos=1)
    with engine_client.Engine(models[variant], ctx=128, kv_slots=4, extra=["--parallel", "4"]) as eng:
        together, order = concurrent(eng, prompts, **opts)
    with engine_client.Engine(models[variant], ctx=128, kv_slots=4, extra=["--parallel", "1"]) as eng:
        alone = sequential(eng, prompts, **opts)
    assert together == alone and all(len(t) == 24 for t in alone)
    assert set(order[:10]) == {"c0", "c1", "c2", "c3"}


def test_a_turn_saved_incrementally_keeps_the_entries_it_closed(oracle_root, models, tmp_path):
    """A turn that closes a compressed window opened in an earlier turn rewrites that window's
    rows: the slot's incremental log must carry them, so a third engine that replays base + log
    answers as an uninterrupted one."""
    out, ids = models[COMPRESSED], load_ref(oracle_root, COMPRESSED)[0]["ids"]
    p1 = ids[:41]  # 41 + 6 generated: windows of 4 and 8 stay open across the turn boundary
    with engine_client.Engine(out, ctx=128, batch=16) as eng:
        _, first, _ = turn(eng, p1)
        p2 = p1 + first + ids[41:45]
        _, second, _ = turn(eng, p2)
        p3 = p2 + second + ids[45:50]
        _, want, want_lp = turn(eng, p3)
    kv = tmp_path / "kv"
    kv.mkdir()
    for prompt in (p1, p2):  # the second turn is saved as a record from where the first ended
        with engine_client.Engine(out, ctx=128, kv_dir=kv, batch=16) as eng:
            turn(eng, prompt)
    with engine_client.Engine(out, ctx=128, kv_dir=kv, batch=16) as eng:
        accept, got, got_lp = turn(eng, p3)
    assert accept[2] == len(p2) + len(second) - 1, accept
    assert got == want and got_lp == want_lp


# ---------- the release's format ----------

BLOCK = [16, 32]  # the releases use 128 x 128; smaller so the tiny weights span several blocks


def e8m0_fp8(w):
    """Block-FP8 with power-of-two (e8m0) scales: (fp8 weight, scale bytes, the value they encode)."""
    import torch
    r, c = w.shape
    br, bc = BLOCK
    nr, nc = -(-r // br), -(-c // bc)
    pad = torch.zeros(nr * br, nc * bc)
    pad[:r, :c] = w.float()
    blocks = pad.view(nr, br, nc, bc)
    e = torch.ceil(torch.log2((blocks.abs().amax(dim=(1, 3)) / 448.0).clamp(min=1e-30)))
    q = (blocks / torch.exp2(e)[:, None, :, None]).to(torch.float8_e4m3fn)
    deq = (q.float() * torch.exp2(e)[:, None, :, None]).view(nr * br, nc * bc)[:r, :c]
    return q.view(nr * br, nc * bc)[:r, :c].contiguous(), (e + 127).to(torch.uint8).view(torch.float8_e8m0fnu), deq


def fp4(w, dtype):
    """FP4 experts as the releases ship them: [rows, cols/2] packed e2m1 (int8, or torch's
    float4_e2m1fn_x2, which safetensors writes as F4 [rows, cols]), [rows, cols/32] e8m0."""
    import torch
    import mxfp4_ref
    b, s = mxfp4_ref.quantize(w.float().numpy())
    deq = mxfp4_ref.dequantize(b, s).reshape(w.shape)
    packed = torch.from_numpy(np.ascontiguousarray(b.reshape(w.shape[0], -1))).view(dtype)
    return packed, torch.from_numpy(np.ascontiguousarray(s)).view(torch.float8_e8m0fnu), torch.from_numpy(deq)


def release_name(n):
    """save_pretrained's names (partly the release's already) -> the release's own."""
    n = n[len("model."):] if n.startswith("model.") else n
    n = {"embed_tokens.weight": "embed.weight", "hc_head.hc_fn": "hc_head_fn", "hc_head.hc_base": "hc_head_base",
         "hc_head.hc_scale": "hc_head_scale"}.get(n, n)
    return n.replace(".attn.norm.", ".attn.kv_norm.")


@pytest.fixture(scope="module", params=["int8", "float4_e2m1fn_x2"])
def release(oracle_root, tmp_path_factory, request):
    """The compressed oracle as the release ships it (FP4 experts in either dtype), and the bf16
    checkpoint of exactly its values."""
    import torch
    from safetensors.torch import load_file, save_file
    src = Path(oracle_root) / COMPRESSED / "hf"
    root = tmp_path_factory.mktemp("release")
    rel, deq = root / "release", root / "deq"
    for d in (rel, deq):
        shutil.copytree(src, d, ignore=shutil.ignore_patterns("*.safetensors"))
    a, b = {}, {}
    for name, w in load_file(src / "model.safetensors").items():
        r = release_name(name)
        dense = w.dim() == 2 and ".attn.w" in name or ".shared_experts." in name  # compressors stay bf16
        if ".experts." in name and ".shared_experts." not in name:
            a[r], a[r[:-len("weight")] + "scale"], v = fp4(w, getattr(torch, request.param))
            b[name] = v.to(torch.bfloat16)
        elif dense:
            a[r], a[r[:-len("weight")] + "scale"], v = e8m0_fp8(w)
            b[name] = v.to(torch.bfloat16)
        else:
            a[r] = w.to(torch.int32) if name.endswith("tid2eid") else w
            b[name] = w
    a["mtp.0.attn_norm.weight"] = a["norm.weight"].clone()  # the release's MTP module: left out
    save_file(a, rel / "model.safetensors")
    save_file(b, deq / "model.safetensors")
    cfg = json.loads((rel / "config.json").read_text())
    # the release's spellings: hash layers counted, the rope dim given, one flat YaRN block
    cfg["num_hash_layers"] = cfg.pop("mlp_layer_types").count("hash_moe")
    cfg["qk_rope_head_dim"] = int(cfg.pop("partial_rotary_factor") * cfg["head_dim"])
    comp = cfg.pop("rope_parameters")["compress"]
    cfg["rope_scaling"] = {k: comp[k] for k in ("rope_type", "factor", "original_max_position_embeddings", "beta_fast",
                                                "beta_slow")}
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": BLOCK, "scale_fmt": "ue8m0", "expert_dtype": "fp4"}
    (rel / "config.json").write_text(json.dumps(cfg))
    return rel, deq


def test_the_release_format_converts_to_its_exact_values(oracle_root, release, tmp_path):
    rel, deq = release
    ids = load_ref(oracle_root, COMPRESSED)[0]["ids"]
    got = {}
    for name, d in (("release", rel), ("deq", deq)):
        coli("convert", d, tmp_path / name, *BF16)
        got[name] = run_logits(tmp_path / name, ids, tmp_path / f"{name}.f32", "--kv", "f32")
    assert np.array_equal(got["release"], got["deq"])
    man = json.loads((tmp_path / "release" / "colibri.json").read_text())
    assert [s["attn"].get("compress", {}).get("rate", 0) for s in man["layers"]] == [4, 8, 0, 4]
    assert "tid2eid" in man["layers"][1]["mlp"]["router"]["tensors"] and "bias" in man["layers"][2]["mlp"]["router"]["tensors"]
    # by default FP4 experts stay MXFP4 (the same e2m1 values and e8m0 scales; the kernel rounds
    # the activations to 8 bits) and the dense trunk goes to q8
    coli("convert", rel, tmp_path / "mx")
    assert json.loads((tmp_path / "mx" / "colibri.json").read_text())["quant"]["experts"] == "mxfp4"
    kl, top1 = kl_top1(run_logits(tmp_path / "mx", ids, tmp_path / "mx.f32"), got["deq"])
    print(f"release defaults (mxfp4 experts, q8 dense) vs its exact values: mean KL {kl:.2e}, top-1 {100 * top1:.1f}%")
    assert kl < 0.05 and top1 >= 0.85


def test_transformers_own_layout_converts(oracle_root, models, tmp_path):
    """save_original_format=False: transformers' module names and fused experts [E, 2I, H]."""
    import torch
    import transformers
    torch.set_num_threads(1)
    src = Path(oracle_root) / COMPRESSED / "hf"
    own = tmp_path / "own"
    transformers.DeepseekV4ForCausalLM.from_pretrained(src, dtype=torch.bfloat16).save_pretrained(
        own, save_original_format=False)
    keys = json.loads((own / "model.safetensors").read_bytes()[8:8 + int.from_bytes(
        (own / "model.safetensors").read_bytes()[:8], "little")])
    assert "model.layers.0.mlp.experts.gate_up_proj" in keys and "model.layers.0.self_attn.sinks" in keys
    coli("convert", own, tmp_path / "c", *BF16)
    ids = load_ref(oracle_root, COMPRESSED)[0]["ids"]
    a = run_logits(tmp_path / "c", ids, tmp_path / "a.f32", "--kv", "f32")
    b = run_logits(models[COMPRESSED], ids, tmp_path / "b.f32", "--kv", "f32")
    assert np.array_equal(a, b)


def test_an_unused_release_tensor_is_refused(release, tmp_path):
    from safetensors.torch import load_file, save_file
    rel = tmp_path / "rel"
    shutil.copytree(release[0], rel)
    t = load_file(rel / "model.safetensors")
    t["layers.0.attn.extra.weight"] = t["norm.weight"].clone()
    save_file(t, rel / "model.safetensors")
    p = subprocess.run([sys.executable, str(ROOT / "coli"), "convert", str(rel), str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode != 0 and "model.layers.0.self_attn.extra.weight" in p.stderr and "mtp" not in p.stderr


def test_release_names_map_to_transformers_modules():
    from colibri.family import deepseek_v4 as d
    assert d.canonical("embed.weight") == "model.embed_tokens.weight" and d.canonical("head.weight") == "lm_head.weight"
    assert d.canonical("layers.3.attn.indexer.compressor.wkv.weight") == "model.layers.3.self_attn.compressor.indexer.kv_proj.weight"
    assert d.canonical("layers.3.attn.compressor.norm.weight") == "model.layers.3.self_attn.compressor.kv_norm.weight"
    assert d.canonical("layers.3.attn.kv_norm.weight") == d.canonical("model.layers.3.attn.norm.weight") \
        == "model.layers.3.self_attn.kv_norm.weight"
    assert d.canonical("layers.3.ffn.experts.7.w3.weight") == "model.layers.3.mlp.experts.7.up_proj.weight"
    assert d.canonical("layers.3.ffn.gate.bias") == "model.layers.3.mlp.gate.e_score_correction_bias"
    assert d.canonical("layers.3.hc_ffn_scale") == "model.layers.3.ffn_hc.scale"
    assert d.canonical("model.layers.3.self_attn.q_a_proj.weight") == "model.layers.3.self_attn.q_a_proj.weight"
    got = d.source_tensors({"layers.0.attn.wq_a.weight": 1, "layers.0.attn.wq_a.scale": 2, "layers.0.hc_attn_scale": 3})
    assert got == {"model.layers.0.self_attn.q_a_proj.weight": 1, "model.layers.0.self_attn.q_a_proj.weight_scale_inv": 2,
                   "model.layers.0.attn_hc.scale": 3}


BASE_CFG = {"model_type": "deepseek_v4", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 1,
            "head_dim": 128, "num_hidden_layers": 3, "vocab_size": 10, "n_routed_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 32, "q_lora_rank": 16, "o_groups": 2, "o_lora_rank": 8, "qk_rope_head_dim": 8,
            "index_head_dim": 16, "index_n_heads": 2, "max_position_embeddings": 512}


def test_registry_facts_and_defaults():
    family, arch = family_normalize.normalize_arch(dict(BASE_CFG, compress_ratios=[128, 4, 0], num_hash_layers=1))
    specs = family_specs.layer_specs(arch)
    assert family == "deepseek_v4" and arch["dsv4"]["hc_mult"] == 4 and arch["dsv4"]["hc_sinkhorn_iters"] == 20
    assert [s["attn"].get("compress", {}).get("rate", 0) for s in specs] == [128, 4, 0]
    assert [s["attn"].get("compress", {}).get("overlap") for s in specs] == [False, True, None]
    assert "indexer" in specs[1]["attn"]["compress"] and "indexer" not in specs[0]["attn"]["compress"]
    assert [("tid2eid" in s["mlp"]["router"]["tensors"]) for s in specs] == [True, False, False]
    # sliding layers rotate with rope_theta, compressed ones with compress_rope_theta
    assert specs[2]["attn"]["rope"]["inv_freq"][1] == pytest.approx(10000.0 ** -0.25)
    assert specs[0]["attn"]["rope"]["inv_freq"][1] == pytest.approx(160000.0 ** -0.25)
    assert specs[0]["mlp"]["act"] == "silu_clamp" and specs[0]["mlp"]["shared"]["swiglu_limit"] == 10.0
    assert family_specs.trunk_spec(arch)["hc_head"]["tensors"]["fn"] == "model.hc_head.hc_fn"


@pytest.mark.parametrize("change, words", [
    ({"num_key_value_heads": 2}, "one K=V head"),
    ({"index_head_dim": 4, "compress_ratios": [0, 4, 0]}, "cannot hold the 8 rotary dims"),
    ({"compress_ratios": [0, 8, 0]}, "compress by 0, 4 or 128"),
    ({"scoring_func": "softmax"}, "sqrtsoftplus, sigmoid"),
    ({"o_groups": 3}, "o_groups"),
    ({"layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}, "full_attention"),
])
def test_configurations_the_engine_does_not_run_are_refused(change, words):
    with pytest.raises(family_registry.UnsupportedModel, match=words):
        family_normalize.normalize_arch(dict(BASE_CFG, **change))
