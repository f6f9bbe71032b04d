"""The resource planner: container scans from headers, hardware discovery, the tier arithmetic,
and `coli plan` as a user meets it."""
import json
from pathlib import Path

import pytest

from launcher_helpers import clean_env, coli, convert_tiny, write_synthetic

from colibri.model import container_scan
from colibri.machine import probe as machine_probe
import resource_plan

GB = 1e9


@pytest.fixture(scope="module")
def tiny(oracle_root, tmp_path_factory):
    return convert_tiny(oracle_root, tmp_path_factory.mktemp("plan") / "moe")


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    d, entries = write_synthetic(tmp_path_factory.mktemp("synth") / "m", layers=4, experts=16)
    return d, entries


def machine(avail=8 * GB, cores=4, simd="avx2", mhz=3000.0, kernels="avx2"):
    return {"cpu": {"model": "test", "logical": cores, "physical_cores": cores, "usable": cores, "quota_cpus": None,
                    "mhz": mhz, "simd": simd, "engine_kernels": kernels},
            "memory": {"total": 2 * avail, "available": avail, "cgroup": {"version": None, "limit": None, "usage": None},
                       "usable": avail, "default_budget": int(avail * 0.9), "overcommit": 0},
            "disk": {"path": "/", "free": 100 * GB, "total": 200 * GB, "fs": "ext4"}, "gpus": []}


# ---------------------------------------------------------------- scan

def test_scan_of_synthetic_headers_counts_every_byte(synthetic):
    d, entries = synthetic
    s = container_scan.scan(d)
    expert = sum(n for name, _, _, n in entries if ".experts." in name)
    assert s["expert_bytes"] == expert
    assert s["dense_bytes"] == sum(n for *_, n in entries) - expert
    assert s["tensor_bytes"] == sum(n for *_, n in entries)
    ex = s["experts"]
    assert ex["count"] == 3 * 16 and ex["layers"] == 3 and ex["per_layer"] == 16
    # one expert: gate + up [128, 256] and down [256, 128], q4 = 20 bytes per 32 values
    assert ex["bytes_each"] == 2 * 128 * (256 // 32 * 20) + 256 * (128 // 32 * 20)
    assert ex["elements_each"] == 3 * 128 * 256
    assert set(ex["bytes_per_layer"]) == {"1", "2", "3"}
    assert s["arch"]["moe_layers"] == [1, 2, 3]
    assert s["kv_bytes_per_token"] == 2 * 4 * 2 * 64 * 2  # K and V, f16 (the engine default)
    assert s["classes"]["router"] == 3 * 16 * 256 * 4
    assert s["classes"]["dense_mlp"] > 0 and s["classes"]["norm"] == (2 * 4 + 1) * 256 * 4


def test_scan_of_a_real_container_matches_its_files(tiny):
    s = container_scan.scan(tiny)
    man = json.loads((tiny / "colibri.json").read_text())
    assert s["family"] == "qwen3_moe"
    assert s["file_bytes"] == sum((tiny / f).stat().st_size for f in man["shards"])
    assert s["tensor_bytes"] < s["file_bytes"]  # the header is the difference
    a = man["arch"]
    assert s["experts"]["per_layer"] == a["num_experts"]
    assert s["experts"]["layers"] == a["layer_mlp"].count("moe")
    assert s["expert_bytes"] == s["experts"]["bytes_each"] * s["experts"]["count"]


@pytest.mark.parametrize("variant", ["mixtral", "minimax_m2"])
def test_scan_counts_experts_kept_under_block_sparse_moe(variant, oracle_root, tmp_path):
    """Mixtral and MiniMax-M2 name their experts block_sparse_moe.experts.N: the plan streams them too."""
    d = convert_tiny(oracle_root, tmp_path / "m", family=variant, template=None)
    s = container_scan.scan(d)
    a = json.loads((d / "colibri.json").read_text())["arch"]
    assert s["experts"]["per_layer"] == a["num_experts"] and s["experts"]["layers"] == a["layer_mlp"].count("moe")
    assert s["expert_bytes"] == s["experts"]["bytes_each"] * s["experts"]["count"] > 0


@pytest.mark.parametrize("name,cls", [
    ("model.layers.3.mlp.experts.17.down_proj.weight", "expert"),
    ("model.layers.0.self_attn.q_norm.weight", "norm"),
    ("model.layers.0.self_attn.k_proj.bias", "attention"),
    ("model.layers.2.mlp.gate.weight", "router"),
    ("model.layers.2.mlp.gate_proj.weight", "dense_mlp"),
    ("model.layers.2.mlp.shared_expert.up_proj.weight", "shared_expert"),
    ("model.embed_tokens.weight", "embed"),
    ("lm_head.weight", "lm_head"),
    ("model.norm.weight", "norm"),
])
def test_tensor_classes(name, cls):
    assert container_scan.tensor_class(name) == cls


# ---------------------------------------------------------------- the plan

def budget_for(s, slots, ctx):
    """The smallest budget that holds `slots` expert slots per MoE layer (the plan's min_ram)."""
    return resource_plan.plan(s, machine(), ram=int(1e12), ctx=ctx, cap=slots, threads=4)["min_ram"]


def test_tiers_add_up_and_cache_slots_follow_the_budget(synthetic):
    d, _ = synthetic
    s = container_scan.scan(d)
    ex = s["experts"]
    one_slot_all_layers = ex["slot_bytes"] * ex["layers"]
    assert ex["slot_bytes"] >= ex["bytes_each"]  # a slot holds the expert's aligned read
    budget = budget_for(s, 5, 1024) + one_slot_all_layers // 2  # room for 5.5 slots per layer
    p = resource_plan.plan(s, machine(), ram=budget, ctx=1024, mem_bw=20, disk_bw=2, threads=4)
    assert p["experts"]["cache_slots_per_layer"] == 5
    t = p["tiers"]
    assert t["dense"] + t["runtime"] + t["kv"] + t["checkpoints"] + t["grammar"] + t["mask_cache"] + \
        t["expert_cache"] + t["free"] == budget
    assert t["expert_cache"] == 5 * one_slot_all_layers
    assert p["experts"]["hit_rate_low"] == pytest.approx(5 / 16)
    assert p["experts"]["hit_rate_low"] < p["experts"]["hit_rate_high"] < 1
    lo, hi = p["planned"]["tok_s_low"], p["planned"]["tok_s_high"]
    assert 0 < lo <= hi
    assert "stream from disk" in p["planned"]["summary"]


def test_the_plan_takes_the_engines_default_batch_for_the_kernel_set(synthetic):
    """The engine prefills 512 positions per pass with its amx kernels, 128 with the others, and
    the plan's runtime share follows (tests/test_budget_agreement.py checks this machine's)."""
    from colibri import limits
    s = container_scan.scan(synthetic[0])
    plans = {k: resource_plan.plan(s, machine(simd="avx512", kernels=k), ram=int(1e10), ctx=256, mem_bw=20, disk_bw=2,
                                   threads=4) for k in ("avx512", "amx")}
    assert plans["avx512"]["batch"] == limits.DEFAULT_BATCH == 128
    assert plans["amx"]["batch"] == limits.DEFAULT_BATCH_AMX == 512
    grow = resource_plan.runtime_bytes(s["manifest"], 256, 512, 4, tokenizer_bytes=s["tokenizer_bytes"]) - \
        resource_plan.runtime_bytes(s["manifest"], 256, 128, 4, tokenizer_bytes=s["tokenizer_bytes"])
    assert grow > 0 and plans["amx"]["tiers"]["runtime"] - plans["avx512"]["tiers"]["runtime"] == grow
    given = resource_plan.plan(s, machine(kernels="amx"), ram=int(1e10), ctx=256, batch=64, threads=4)
    assert given["batch"] == 64


def test_more_ram_never_plans_fewer_slots_or_a_lower_hit_rate(synthetic):
    s = container_scan.scan(synthetic[0])
    slots = [resource_plan.plan(s, machine(), ram=int(r * 1e6), ctx=512, mem_bw=20, disk_bw=2)["experts"]
             for r in (70, 80, 90, 100, 200)]
    counts = [e["cache_slots_per_layer"] for e in slots]
    assert counts == sorted(counts) and counts[-1] == 16 and slots[-1]["all_resident"]
    assert [e["hit_rate_high"] for e in slots] == sorted(e["hit_rate_high"] for e in slots)


def test_bottleneck_moves_with_the_bandwidths(synthetic):
    s = container_scan.scan(synthetic[0])
    budget = budget_for(s, 3, 256)  # a few slots per layer: most experts come from disk
    slow_disk = resource_plan.plan(s, machine(), ram=budget, ctx=256, mem_bw=50, disk_bw=0.01)
    assert slow_disk["experts"]["cache_slots_per_layer"] < 16
    assert slow_disk["planned"]["bottleneck"] == "disk"
    slow_mem = resource_plan.plan(s, machine(), ram=int(1e9), ctx=256, mem_bw=0.001, disk_bw=5)
    assert slow_mem["experts"]["all_resident"] and slow_mem["planned"]["bottleneck"] == "memory"
    slow_cpu = resource_plan.plan(s, machine(cores=1, simd="portable", mhz=1.0), ram=int(1e9), ctx=256,
                                  mem_bw=50, disk_bw=5)
    assert slow_cpu["planned"]["bottleneck"] == "compute"
    unknown = resource_plan.plan(s, machine(), ram=budget, ctx=256, mem_bw=50, disk_bw=None)
    assert unknown["planned"]["tok_s_low"] is None and "unknown" in unknown["planned"]["bottleneck"]


def test_a_budget_below_the_dense_trunk_is_a_problem_not_a_negative_cache(synthetic):
    s = container_scan.scan(synthetic[0])
    p = resource_plan.plan(s, machine(), ram=int(1e6), ctx=256, mem_bw=20, disk_bw=2)
    assert p["experts"]["cache_slots_per_layer"] == 0
    assert any("lower --ctx" in msg and "refuses to start" in msg for msg in p["problems"])
    assert p["tiers"]["expert_cache"] == 0


def test_cap_above_what_fits_is_reported(synthetic):
    s = container_scan.scan(synthetic[0])
    p = resource_plan.plan(s, machine(), ram=budget_for(s, 3, 256), ctx=256, cap=16, mem_bw=20, disk_bw=2, threads=4)
    assert any("--cap 16" in msg for msg in p["problems"])


def test_zipf_mass():
    assert resource_plan.zipf_mass(0, 8) == 0
    assert resource_plan.zipf_mass(8, 8) == pytest.approx(1.0)
    assert resource_plan.zipf_mass(1, 2) == pytest.approx(1 / 1.5)
    assert resource_plan.zipf_mass(4, 16) > 4 / 16


# ---------------------------------------------------------------- discovery

def fake_files(monkeypatch, files, cgroup_lines):
    files = dict(files)
    files["/proc/self/cgroup"] = cgroup_lines
    monkeypatch.setattr(machine_probe, "_read", lambda path: files.get(str(path)))


MEMINFO = "MemTotal:       16000000 kB\nMemFree:  1000 kB\nMemAvailable:   12000000 kB\n"


def test_cgroup_v2_limit_of_a_parent_counts(monkeypatch):
    fake_files(monkeypatch, {
        "/proc/meminfo": MEMINFO,
        "/sys/fs/cgroup/app.slice/svc/memory.max": "max\n",
        "/sys/fs/cgroup/app.slice/memory.max": f"{4 << 30}\n",
        "/sys/fs/cgroup/app.slice/memory.current": f"{1 << 30}\n",
    }, "0::/app.slice/svc\n")
    m = machine_probe.memory_info()
    assert m["cgroup"] == {"version": 2, "limit": 4 << 30, "usage": 1 << 30}
    assert m["usable"] == 3 << 30  # the cgroup's room is below MemAvailable
    assert m["total"] == 4 << 30
    assert m["default_budget"] == int((3 << 30) * machine_probe.BUDGET_SHARE)


def test_cgroup_v1_limit_and_no_limit(monkeypatch):
    fake_files(monkeypatch, {
        "/proc/meminfo": MEMINFO,
        "/sys/fs/cgroup/memory/memory.limit_in_bytes": f"{2 << 30}\n",
        "/sys/fs/cgroup/memory/memory.usage_in_bytes": f"{1 << 29}\n",
    }, "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n")
    m = machine_probe.memory_info()
    assert m["cgroup"]["version"] == 1 and m["usable"] == (2 << 30) - (1 << 29)
    fake_files(monkeypatch, {"/proc/meminfo": MEMINFO,
                             "/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n"},
               "4:memory:/\n")
    m = machine_probe.memory_info()
    assert m["cgroup"]["limit"] is None and m["usable"] == 12000000 * 1024


def test_this_machine_is_discovered():
    m = machine_probe.discover(gpus=False)
    assert m["cpu"]["logical"] >= 1 and 1 <= m["cpu"]["physical_cores"] <= m["cpu"]["logical"]
    assert m["memory"]["total"] > m["memory"]["usable"] > 0
    assert m["disk"]["free"] > 0
    assert m["cpu"]["engine_kernels"] in ("amx", "vnni", "avx512", "avx2", "portable")


def test_memory_bandwidth_measurement_gives_a_rate():
    bw = machine_probe.measure_memory_bw(size=32 << 20, reps=2)
    assert 0.1 < bw < 1000


def test_disk_measurement_refuses_tiny_files(tiny):
    bw, mode, note = machine_probe.measure_disk_bw([str(p) for p in tiny.glob("*.safetensors")])
    assert bw is None and "--disk-bw" in note


# ---------------------------------------------------------------- coli plan

def test_plan_text_for_a_model(tiny):
    r = coli("plan", "--model", tiny, "--mem-bw", "20", "--disk-bw", "1.6")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for piece in ("machine", "dense trunk", "KV cache", "expert cache", "cache slots per layer",
                  "bottleneck", "every routed expert fits in the cache", "20.0 GB/s (given)"):
        assert piece in out, piece


def test_plan_json_is_complete(tiny):
    r = coli("plan", "--model", tiny, "--json", "--no-measure", "--ctx", "256", "--kv-slots", "2")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert set(res) == {"machine", "model", "bandwidth", "plan"}
    p = res["plan"]
    assert p["ctx"] == 256 and p["kv_slots"] == 2
    assert res["bandwidth"]["memory_source"].startswith("not measured")
    assert p["engine_split"]["cap"] == p["experts"]["per_layer"] > 0


@pytest.mark.parametrize("ctx,slots", [(256, 2), (512, 1), (77, 3)])
def test_planned_kv_cache_is_what_the_engine_allocates(tiny, ctx, slots):
    """The plan's KV tier against the engine's own report of what it allocates per slot."""
    from colibri import engine_client
    r = coli("plan", "--model", tiny, "--json", "--no-measure", "--ctx", ctx, "--kv-slots", slots)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)["plan"]
    with engine_client.Engine(tiny, ctx=ctx, kv_slots=slots, threads=1) as eng:
        info = eng.info
    assert (int(info["ctx"]), int(info["slots"])) == (ctx, slots)
    assert plan["tiers"]["kv"] == int(info["kv_slot_bytes"]) * slots


def test_plan_measures_memory_when_not_given(tiny):
    r = coli("plan", "--model", tiny, "--json")
    res = json.loads(r.stdout)
    assert res["bandwidth"]["memory_gbps"] > 0 and res["bandwidth"]["memory_source"].startswith("measured")


def test_plan_without_a_model_describes_the_machine():
    r = coli("plan", "--no-measure")
    assert r.returncode == 0
    assert "cpu" in r.stdout and "no model given" in r.stdout and "--model" in r.stdout


@pytest.mark.parametrize("flags,message", [
    (["--ctx", "100000"], "positions"),
    (["--cap", "99"], "experts per layer"),
    (["--kv-slots", "17"], "1 to 16"),
    (["--ram", "-1"], "positive"),
])
def test_plan_refuses_values_it_cannot_honour(tiny, flags, message):
    r = coli("plan", "--model", tiny, "--no-measure", *flags)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_plan_on_wrong_paths(tmp_path, oracle_root):
    r = coli("plan", "--model", tmp_path / "nope")
    assert r.returncode == 2 and "no such directory" in r.stderr
    r = coli("plan", "--model", tmp_path)
    assert r.returncode == 2 and "colibri.json" in r.stderr
    r = coli("plan", "--model", Path(oracle_root) / "qwen3_moe" / "hf")
    assert r.returncode == 2 and "coli convert" in r.stderr


def test_plan_reads_the_model_from_the_environment(tiny):
    r = coli("plan", "--no-measure", env=clean_env(COLI_MODEL=tiny))
    assert r.returncode == 0 and "cache slots per layer" in r.stdout


def test_disk_measurement_reads_with_o_direct(tmp_path):
    d, _ = write_synthetic(tmp_path / "big", layers=2, experts=64, hidden=1024, moe_inter=512)
    shard = next(d.glob("*.safetensors"))
    assert shard.stat().st_size > 32 << 20
    bw, mode, note = machine_probe.measure_disk_bw([str(shard)], limit_bytes=32 << 20)
    if bw is None:  # a filesystem without O_DIRECT (tmpfs) must say so
        assert "O_DIRECT" in note
    else:
        assert bw > 0 and mode == "o_direct" and "32 MiB" in note


def test_plan_text_when_the_model_does_not_fit(synthetic):
    s = container_scan.scan(synthetic[0])
    r = coli("plan", "--model", synthetic[0], "--ram", f"{(budget_for(s, 3, 256) + 1000) / 1e9:.9f}", "--mem-bw", "20",
             "--disk-bw", "2", "--threads", "4", "--ctx", "256")
    assert r.returncode == 0, r.stderr
    assert "3 of 16 experts per layer stay in RAM; the rest stream from disk" in r.stdout
    assert "cache slots per layer" in r.stdout and "of 16" in r.stdout


def test_gpus_are_read_from_nvidia_smi_and_rocm_smi(tmp_path, monkeypatch):
    nv = tmp_path / "nvidia-smi"
    nv.write_text("#!/bin/sh\necho 'NVIDIA H200, 143771, 143000'\necho 'NVIDIA L4, 23034, 22000'\n")
    rocm = tmp_path / "rocm-smi"
    rocm.write_text("#!/bin/sh\necho '{\"card0\": {\"Card series\": \"MI300X\", \"VRAM Total Memory (B)\": "
                    "\"206141652992\", \"VRAM Total Used Memory (B)\": \"1000\"}}'\n")
    for p in (nv, rocm):
        p.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    gpus = machine_probe.gpu_info()
    assert [g["name"] for g in gpus] == ["NVIDIA H200", "NVIDIA L4", "MI300X"]
    assert gpus[0]["vram"] == 143771 << 20 and gpus[0]["vram_free"] == 143000 << 20
    assert gpus[2]["vram"] == 206141652992 and gpus[2]["vram_free"] == 206141652992 - 1000
    lines = resource_plan.machine_lines({**machine(), "gpus": gpus})
    assert any("NVIDIA H200" in ln and "not used" in ln for ln in lines)
