"""DeepSeek sparse attention (glm_moe_dsa = GLM-5, deepseek_v32): the lightning indexer's top-k
selection matters on the oracles (index_topk < sequence), forcing it to keep every key gives
dense MLA bit for bit, and its keys are part of the per-layer state the engine reports. The
match against transformers with sparse selection is tests/test_oracles.py's exact test. Also:
`coli plan` sizes the MLA / DSA state as the engine allocates it and keeps shared experts resident."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import family_registry  # noqa: E402
import make_oracles  # noqa: E402
from launcher_helpers import coli, f32_containers, ready_line  # noqa: E402
from colibri.family import normalize as family_normalize  # noqa: E402
from colibri.family import specs as family_specs  # noqa: E402

DSA_VARIANTS = ["glm_moe_dsa", "glm_moe_dsa_shared", "deepseek_v32"]


@pytest.fixture(scope="module")
def converted(oracle_root, tmp_path_factory):
    return f32_containers(oracle_root, tmp_path_factory)


def logits(model, ids, out, *flags):
    r = coli("logits", "--model", model, "--ids", ",".join(map(str, ids)), "--out", out, *flags, timeout=600)
    assert r.returncode == 0, r.stderr
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)


def variant_copy(model, dst, edit):
    """A copy of the container whose manifest's attention specs went through edit(attn)."""
    shutil.copytree(model, dst)
    man = json.loads((dst / "colibri.json").read_text())
    for layer in man["layers"]:
        edit(layer["attn"])
    (dst / "colibri.json").write_text(json.dumps(man))
    return dst


def all_keys(attn):
    if not attn["indexer"].get("shared"):
        attn["indexer"]["topk"] = 1 << 30


def no_indexer(attn):
    del attn["indexer"]
    attn["state"].pop("f32_values_per_pos", None)


@pytest.mark.parametrize("variant", DSA_VARIANTS)
def test_all_keys_selected_is_dense_mla(variant, oracle_root, converted, tmp_path):
    """An indexer that keeps every key computes exactly the dense MLA attention (same bytes, in
    prefill and in decode); with its real top-k it follows transformers' sparse reference, which
    dense attention does not."""
    info = json.loads((Path(oracle_root) / variant / "ref.json").read_text())
    ref = np.fromfile(Path(oracle_root) / variant / "ref_logits.f32", dtype="<f4").reshape(info["logits_shape"])
    topk = make_oracles.VARIANTS[variant]["config"]["index_topk"]
    assert topk < len(info["ids"])
    model = converted(variant)
    full = variant_copy(model, tmp_path / "full", all_keys)
    dense = variant_copy(model, tmp_path / "dense", no_indexer)
    for flags in ([], ["--batch", "1"]):
        a = logits(full, info["ids"], tmp_path / "a.f32", *flags)
        b = logits(dense, info["ids"], tmp_path / "b.f32", *flags)
        assert a.tobytes() == b.tobytes(), f"all-keys DSA differs from dense MLA ({flags})"
    sparse = logits(model, info["ids"], tmp_path / "s.f32")
    scale = np.abs(ref).max()
    dense_err = np.abs(b - ref).max(-1) / scale
    sparse_err = np.abs(sparse - ref).max(-1) / scale
    print(f"{variant}: vs transformers, sparse max {sparse_err.max():.2e}; dense MLA max {dense_err.max():.2e}")
    assert dense_err[:topk].max() <= 1e-3  # the first index_topk positions keep all their keys anyway
    assert dense_err[topk:].max() > 1e-2 and sparse_err.max() <= 1e-3


@pytest.mark.parametrize("variant", DSA_VARIANTS)
def test_state_holds_latent_and_indexer_keys(variant, oracle_root, converted):
    """Per token and layer: the latent (kv_lora_rank + qk_rope_head_dim values in the cache's type)
    and the indexer key (index_head_dim values, f32 whatever --kv), read from the engine."""
    cfg = json.loads((Path(oracle_root) / variant / "hf" / "config.json").read_text())
    model = converted(variant)
    for kv, size in family_registry.KV_TYPES.items():
        ready = ready_line(model, "--kv", kv)
        full = sum(1 for t in cfg.get("indexer_types") or ["full"] * cfg["num_hidden_layers"] if t == "full")
        want = (cfg["num_hidden_layers"] * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * size
                + full * cfg["index_head_dim"] * 4)  # shared layers keep no indexer keys
        assert int(ready["kv_bytes_per_token"]) == want, (kv, ready)
        man = json.loads((model / "colibri.json").read_text())
        assert family_specs.kv_bytes_per_token(man["arch"], variant, kv=kv, layers=man["layers"]) == want


def test_indexer_rope_follows_the_family(oracle_root):
    """GLM-5's indexer rotates interleaved pairs, DeepSeek-V3.2's the two halves; both main
    attentions are interleaved."""
    styles = {}
    for v in ("glm_moe_dsa", "deepseek_v32"):
        cfg = json.loads((Path(oracle_root) / v / "hf" / "config.json").read_text())
        _, arch = family_normalize.normalize_arch(cfg)
        spec = family_specs.layer_specs(arch)[0]["attn"]
        styles[v] = (spec["rope"]["style"], spec["indexer"]["rope"]["style"])
    assert styles == {"glm_moe_dsa": ("interleaved", "interleaved"), "deepseek_v32": ("interleaved", "neox")}


def test_shared_indexer_layers_follow_a_full_one(oracle_root, converted, tmp_path):
    """A "shared" layer has no indexer of its own: the first layer must have one, in the config
    (refused at conversion) and in the manifest (refused at load)."""
    cfg = json.loads((Path(oracle_root) / "glm_moe_dsa_shared" / "hf" / "config.json").read_text())
    _, arch = family_normalize.normalize_arch(cfg)
    specs = family_specs.layer_specs(arch)
    assert [s["attn"]["indexer"].get("shared", False) for s in specs] == [False, True, False]
    assert "f32_values_per_pos" not in specs[1]["attn"]["state"]
    with pytest.raises(family_registry.UnsupportedModel, match="indexer_types"):
        family_normalize.normalize_arch(dict(cfg, indexer_types=["shared", "full", "full"]))
    bad = tmp_path / "bad"
    shutil.copytree(converted("glm_moe_dsa_shared"), bad)
    man = json.loads((bad / "colibri.json").read_text())
    man["layers"][0]["attn"]["indexer"] = {"shared": True}
    man["layers"][0]["attn"]["state"].pop("f32_values_per_pos")
    (bad / "colibri.json").write_text(json.dumps(man))
    r = coli("logits", "--model", bad, "--ids", "1,2", "--out", tmp_path / "x.f32")
    assert r.returncode != 0 and "layer 0" in r.stderr and "shared DSA indexer needs" in r.stderr


@pytest.mark.parametrize("variant", ["deepseek_v3", "glm_moe_dsa_shared"])
def test_plan_counts_latent_state_and_resident_shared_experts(variant, oracle_root, tmp_path):
    """`coli plan`: the KV tier is what the engine allocates for the latent (and f32 indexer keys),
    and the shared experts are part of the resident dense trunk, not of the streamed experts."""
    from colibri import engine_client
    from colibri.model import container_scan
    model = tmp_path / "c"
    r = coli("convert", Path(oracle_root) / variant / "hf", model, timeout=600)
    assert r.returncode == 0, r.stderr
    r = coli("plan", "--model", model, "--json", "--no-measure", "--ctx", 300, "--kv-slots", 2)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)["plan"]
    with engine_client.Engine(model, ctx=300, kv_slots=2, threads=1) as eng:
        assert plan["tiers"]["kv"] == int(eng.info["kv_slot_bytes"]) * 2
    scan = container_scan.scan(model)
    assert scan["classes"]["shared_expert"] > 0
    assert scan["dense_bytes"] == sum(v for k, v in scan["classes"].items() if k != "expert")
    r = coli("plan", "--model", model, "--no-measure")
    assert r.returncode == 0 and "shared_expert" in r.stdout.split("experts ")[0]


def test_a_saved_slot_with_indexer_keys_is_restored(oracle_root, converted, tmp_path):
    """The indexer's f32 keys at the end of each row are checked as f32, not as f16 pairs (whose
    random low halves look like inf): a saved slot resumes instead of being refused as corrupt."""
    from colibri import engine_client
    ids = json.loads((Path(oracle_root) / "glm_moe_dsa" / "ref.json").read_text())["ids"]
    with engine_client.Engine(converted("glm_moe_dsa"), ctx=128, kv_dir=tmp_path, batch=16) as eng:
        list(eng.generate(ids[:41], max_tokens=4, temp=0, slot=0))
    with engine_client.Engine(converted("glm_moe_dsa"), ctx=128, kv_dir=tmp_path, batch=16) as eng:
        accept = list(eng.generate(ids[:50], max_tokens=4, temp=0, slot=0))[0]
        assert eng.stderr_seen("restored KV slot 0"), eng.stderr_tail
    assert accept[2] >= 41, accept
