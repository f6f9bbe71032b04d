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
          "batch")


def coli(*args):
    return subprocess.run([sys.executable, str(ROOT / "coli"), *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def models(oracle_root, tmp_path_factory):
    out = {"streaming": streaming_model.container()}
    for v in ("qwen3_moe", "llama", "gpt_oss", "qwen3_5_moe", "glm_moe_dsa"):
        d = tmp_path_factory.mktemp(v) / "c"
        r = coli("convert", Path(oracle_root) / v / "hf", d)
        assert r.returncode == 0, r.stderr
        out[v] = d
    return out


def planned(model, ram, ctx, slots, threads, cap=None, kv=None, persist=False):
    args = ["plan", "--json", "--no-measure", "--model", model, "--ram", ram, "--ctx", ctx, "--kv-slots", slots,
            "--threads", threads] + (["--cap", cap] if cap else []) + (["--kv", kv] if kv else []) + \
        (["--kv-persist"] if persist else [])
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
        ready = {k: int(eng.info[k]) for k in FIELDS}
    assert p["engine_split"] == ready
    assert not p["problems"]


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
        ready = {k: int(eng.info[k]) for k in FIELDS}
    assert ready["kv_writer_bytes"] > 0 and p["engine_split"] == ready
