"""`coli plan` prints the RAM split the engine will make: for the same budget, context, KV
slots, cap and threads, the plan's engine_split equals the engine's READY fields, and a budget
the plan says cannot fit is one the engine refuses, naming the same smallest --ram."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

import streaming_model
from colibri import engine_client

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ("ram_budget", "dense_bytes", "kv_bytes", "runtime_bytes", "checkpoint_bytes", "grammar_bytes", "kv_writer_bytes",
          "mask_cache_bytes",
          "expert_cache_bytes", "cap", "experts", "moe_layers",
          "batch", "prefill_pass", "prefill_pass_bytes", "prefill_pass_why")
WORDS = {"prefill_pass_why"}  # READY fields that are words, not numbers


def ready_split(info):
    return {k: info[k] if k in WORDS else int(info[k]) for k in FIELDS}


def coli(*args):
    return subprocess.run([sys.executable, str(ROOT / "coli"), *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def models(oracle_root, tmp_path_factory):
    import mtp_reference
    out = {"streaming": streaming_model.container()}
    hf = mtp_reference.add_mtp_layer(Path(oracle_root) / "deepseek_v3" / "hf", tmp_path_factory.mktemp("mtp") / "hf")
    r = coli("convert", hf, hf.parent / "c")
    assert r.returncode == 0, r.stderr
    out["deepseek_v3_mtp"] = hf.parent / "c"
    for v in ("qwen3_moe", "llama", "gpt_oss", "qwen3_5_moe", "glm_moe_dsa", "glm_moe_dsa_shared", "deepseek_v4"):
        d = tmp_path_factory.mktemp(v) / "c"
        r = coli("convert", Path(oracle_root) / v / "hf", d)
        assert r.returncode == 0, r.stderr
        out[v] = d
    return out


def planned(model, ram, ctx, slots, threads, cap=None, kv=None, persist=False, batch=None, prefill=None, draft=()):
    args = ["plan", "--json", "--no-measure", "--model", model, "--ram", ram, "--ctx", ctx, "--kv-slots", slots,
            "--threads", threads] + (["--cap", cap] if cap else []) + (["--kv", kv] if kv else []) + \
        (["--kv-persist"] if persist else []) + (["--batch", batch] if batch else []) + \
        (["--prefill-pass", prefill] if prefill is not None else []) + list(draft)
    r = coli(*args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["plan"]


CASES = [  # model, --ram GB, ctx, slots, threads, cap, kv
    ("streaming", "0.1", 256, 1, 1, None, None),
    ("streaming", "0.2", 500, 2, 2, None, "f32"),
    ("streaming", "0.1", 128, 1, 2, 3, None),
    ("qwen3_moe", "0.05", 512, 4, 2, None, None),
    ("qwen3_moe", "2", 64, 1, 1, 1, "bf16"),
    ("llama", "0.05", 300, 3, 2, None, None),
    ("gpt_oss", "0.05", 400, 2, 2, 1, None),  # sliding layers keep a ring of 12; resident expert biases
    ("streaming", "0.05", 512, 1, 2, None, None),  # tight: the engine lowers its prefill batch to fit
    ("qwen3_5_moe", "0.05", 256, 3, 2, None, None),  # recurrent layers: checkpoints of their fixed state
    ("glm_moe_dsa", "0.05", 400, 2, 2, None, None),  # latent attention's chunk memory, the indexer's selection
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_plan_split_equals_the_engines(models, case):
    name, ram, ctx, slots, threads, cap, kv = case
    p = planned(models[name], ram, ctx, slots, threads, cap, kv)
    extra = ["--ram", ram] + (["--cap", str(cap)] if cap else [])
    with engine_client.Engine(models[name], ctx=ctx, kv_slots=slots, threads=threads, kv=kv, extra=extra) as eng:
        ready = ready_split(eng.info)
    assert p["engine_split"] == ready
    assert not p["problems"]


PASS_CASES = [  # model, --ram GB, ctx, --batch, --prefill-pass, why the pass is as long as it is
    ("streaming", "0.2", 512, 64, None, "prompt"),  # the whole prompt
    ("streaming", "0.05", 512, 16, None, "budget"),  # half the spare budget holds a shorter one
    ("streaming", "0.1", 256, 16, 64, "flag"),  # as given
    ("qwen3_moe", "0.05", 500, 8, None, "prompt"),  # ctx rounded up to whole batches
    ("llama", "0.05", 300, 8, None, "resident"),  # no routed experts: one batch
    ("glm_moe_dsa_shared", "0.05", 400, 8, None, "prompt"),  # a shared expert's rows, the indexer's selection
    ("deepseek_v4", "0.05", 400, 8, None, "prompt"),  # a residual row per hyper-connection stream
]


@pytest.mark.parametrize("case", PASS_CASES, ids=lambda c: "-".join(map(str, c)))
def test_plan_prefill_pass_equals_the_engines(models, case):
    name, ram, ctx, batch, prefill, why = case
    p = planned(models[name], ram, ctx, 1, 2, batch=batch, prefill=prefill)
    extra = ["--ram", ram] + (["--prefill-pass", str(prefill)] if prefill is not None else [])
    with engine_client.Engine(models[name], ctx=ctx, kv_slots=1, threads=2, batch=batch, extra=extra) as eng:
        ready = ready_split(eng.info)
    assert p["engine_split"] == ready
    assert not p["problems"]
    assert ready["prefill_pass_why"] == why
    assert (ready["prefill_pass"] > batch) == (why != "resident")
    assert ready["prefill_pass_bytes"] == 0 if why == "resident" else ready["prefill_pass_bytes"] > 0


DRAFT_CASES = [  # model, --ram GB, ctx, slots, draft flags
    ("deepseek_v3_mtp", "0.05", 256, 2, ("--draft", "mtp")),  # the head's KV and buffers; its experts stream
    ("deepseek_v3_mtp", "0.05", 300, 1, ("--draft", "mtp", "--draft-max", "3")),
    ("deepseek_v3_mtp", "0.05", 256, 2, ("--draft", "lookup")),
    ("qwen3_5_moe", "0.05", 256, 2, ("--draft", "lookup", "--draft-max", "16")),  # a saved recurrent state per stream
    ("gpt_oss", "0.05", 400, 1, ("--draft", "lookup")),  # a sliding window: drafting off, nothing reserved
]


@pytest.mark.parametrize("case", DRAFT_CASES, ids=lambda c: "-".join(map(str, c[:4] + c[4][1:2])))
def test_plan_counts_drafting_as_the_engine_does(models, case):
    name, ram, ctx, slots, draft = case
    p = planned(models[name], ram, ctx, slots, 2, draft=draft)
    plain = planned(models[name], ram, ctx, slots, 2)
    with engine_client.Engine(models[name], ctx=ctx, kv_slots=slots, threads=2, extra=["--ram", ram, *draft]) as eng:
        ready = ready_split(eng.info)
        off = eng.info.get("draft_off")
    assert p["engine_split"] == ready
    assert not p["problems"]
    if off:
        assert p["engine_split"] == plain["engine_split"] and any("--draft lookup: off" in n for n in p["notes"])
    else:
        assert ready["runtime_bytes"] > plain["engine_split"]["runtime_bytes"]
        assert ready["moe_layers"] == plain["engine_split"]["moe_layers"] + (draft[1] == "mtp")


def test_a_budget_the_plan_refuses_the_engine_refuses(models):
    p = planned(models["streaming"], "0.01", 256, 1, 1)
    assert any("refuses to start" in msg for msg in p["problems"])
    with pytest.raises(engine_client.EngineError) as e:
        engine_client.Engine(models["streaming"], ctx=256, kv_slots=1, threads=1, extra=["--ram", "0.01"])
    want = math.ceil(p["min_ram"] / 1e7) / 100  # the engine rounds the smallest budget up to 0.01 GB
    assert f"give at least --ram {want:.2f}" in e.value.message


@pytest.mark.parametrize("name", ["streaming", "qwen3_5_moe"])
def test_plan_counts_the_kv_writer_as_the_engine_does(models, name, tmp_path):
    """With --kv-dir the engine reserves its KV writer's bound; `coli plan --kv-persist` the same
    bytes, and the rest of the split follows from it alike."""
    p = planned(models[name], "0.2", 256, 2, 2, persist=True)
    with engine_client.Engine(models[name], ctx=256, kv_slots=2, threads=2, kv_dir=tmp_path, extra=["--ram", "0.2"]) as eng:
        ready = ready_split(eng.info)
    assert ready["kv_writer_bytes"] > 0 and p["engine_split"] == ready
