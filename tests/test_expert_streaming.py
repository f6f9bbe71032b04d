"""Expert streaming (docs/architecture.md): the bounded expert cache gives byte-identical logits
and greedy tokens to the resident run under every setting, the engine's peak RSS stays within
its budget, the stats are honest, and .coli_usage learns across runs and survives SIGKILL."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
import make_oracles  # noqa: E402
import streaming_model  # noqa: E402

# every oracle with routed experts, whatever the family calls them (shared experts included)
MOE = [v for v, s in make_oracles.VARIANTS.items()
       if any(s["config"].get(k) for k in ("num_experts", "n_routed_experts", "num_local_experts"))]
# engine flags that may change where experts come from, never what they compute
SETTINGS = [["--cap", "1"], ["--cap", "2"], ["--ram", "0.1", "--ctx", "256"], ["--cap", "1", "--readahead", "on"],
            ["--cap", "3", "--readahead", "off"], ["--cap", "1", "--no-direct"], ["--cap", "2", "--threads", "1"],
            ["--cap", "2", "--threads", "2"], ["--cap", "1", "--batch", "5"], ["--cap", "2", "--io-threads", "1"],
            # prefill passes: layer by layer over several batches (attention still a batch at a time)
            ["--cap", "1", "--batch", "5", "--prefill-pass", "10"], ["--cap", "2", "--batch", "5", "--prefill-pass", "15"],
            ["--cap", "1", "--batch", "32", "--prefill-pass", "64"], ["--cap", "1", "--batch", "32", "--prefill-pass", "0"],
            ["--ram", "0.1", "--ctx", "256", "--batch", "5"]]
END_KEYS = {"hits", "misses", "hit_rate", "bytes_read", "read_gbps", "io_wait_ms", "compute_ms", "peak_rss_mb", "rss_mb",
            "experts_pinned", "experts_cached", "experts_total", "prefill_bytes_read", "prefill_io_wait_ms"}
READY_KEYS = {"ram_budget", "dense_bytes", "kv_bytes", "runtime_bytes", "expert_cache_bytes", "cap", "experts",
              "moe_layers", "expert_bytes", "pinned", "direct", "readahead"}


def coli(*args, check=True):
    p = subprocess.run([sys.executable, str(ROOT / "coli"), *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    if check and p.returncode:
        pytest.fail(f"coli {' '.join(map(str, args))} exited {p.returncode}: {p.stderr[-2000:]}", pytrace=False)
    return p


def engine():
    if not (ROOT / "build" / "colibri").exists():
        pytest.fail("build/colibri is missing: run `make`", pytrace=False)
    return str(ROOT / "build" / "colibri")


@pytest.fixture(scope="module")
def containers(oracle_root, tmp_path_factory):
    out = {}
    for v in MOE:
        d = tmp_path_factory.mktemp(v) / "c"
        coli("convert", Path(oracle_root) / v / "hf", d)
        out[v] = d
    return out


def ref_ids(oracle_root, variant, key="ids"):
    return json.loads((Path(oracle_root) / variant / "ref.json").read_text())[key]


LAUNCHER_FLAGS = {"--cap", "--ram", "--ctx", "--threads", "--batch", "--prefill-pass"}


def logits(model, ids, out, *flags):
    """`coli logits`, or the engine's own logits command for the engine-only flags."""
    args = ["logits", "--model", model, "--ids", ",".join(map(str, ids)), "--out", out, *flags]
    if set(flags[::2]) <= LAUNCHER_FLAGS:
        coli(*args)
    else:
        r = subprocess.run([engine(), *map(str, args)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    return Path(out).read_bytes()


class Raw:
    """The engine driven through raw frames (ROUTING included), stderr kept."""

    def __init__(self, model, *flags, binary=None):
        self.p = subprocess.Popen([binary or engine(), "--model", str(model), *map(str, flags)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = self.p.stdout.readline().decode()
        if not line.startswith("READY"):
            self.p.wait()
            pytest.fail(f"engine did not start: {line!r} {self.p.stderr.read().decode()[-1500:]}", pytrace=False)
        self.ready = dict(kv.split("=", 1) for kv in line.split()[1:])

    def turn(self, ids, rid="r", **opts):
        body = ",".join(map(str, ids)).encode()
        o = " ".join(f"{k}={v}" for k, v in {"ids": 1, **opts}.items())
        self.p.stdin.write(f"SUBMIT {rid} {len(body)} {o}\n".encode() + body)
        self.p.stdin.flush()
        frames = {"tokens": []}
        while True:
            parts = self.p.stdout.readline().decode().split()
            assert parts, f"engine died: {self.p.stderr.read().decode()[-1500:]}"
            verb = parts[0]
            if verb in ("DATA", "ERROR", "LOGITS", "ROUTING"):
                body = self.p.stdout.read(int(parts[3 if verb in ("DATA", "ERROR") else 4]))
                if verb == "DATA" and int(parts[2]) >= 0:
                    frames["tokens"].append(int(parts[2]))
                if verb == "LOGITS":
                    frames["logits"] = body
                if verb == "ROUTING":
                    frames["routing"] = np.frombuffer(body, "<u4").reshape(int(parts[2]), int(parts[3]))
                assert verb != "ERROR", body
            elif verb == "END":
                frames["end"] = dict(kv.split("=", 1) for kv in parts[2:])
                return frames

    def close(self):
        self.p.stdin.close()
        rc = self.p.wait(timeout=60)
        err = self.p.stderr.read().decode()
        assert rc == 0 and "Sanitizer" not in err, err[-2000:]
        return err


# MLA attention expands a prefill chunk's keys only while the chunk is most of the context
# (c/model/block_attn_mla.c); the expanded and the absorbed form quantize different activations for
# the 8-bit matmuls (the latent vs the query), so results depend on how a prompt is chunked
# (--batch) at ~1e-4 of the largest logit, never on where experts live. For these families
# --batch is checked to a tolerance, and the same chunking streamed must be byte-identical.
# With the DSA indexer (glm_moe_dsa, deepseek_v32) such a difference can flip a hard top-k
# selection, so there only the byte-identical check applies. Gated DeltaNet (qwen3_5_moe) and KDA
# (kimi_linear) run a prefill chunk in their chunked form and a single position in their
# recurrent form: the same function, rounded differently.
CHUNK_DEPENDENT = {"deepseek_v3", "deepseek_v32", "glm_moe_dsa", "glm4_moe_lite", "qwen3_5_moe", "kimi_linear"}
TOP_K_SELECTION = {"deepseek_v32", "glm_moe_dsa"}


@pytest.mark.parametrize("variant", MOE)
def test_logits_identical_under_every_streaming_setting(variant, oracle_root, containers, tmp_path):
    ids = ref_ids(oracle_root, variant)
    resident = logits(containers[variant], ids, tmp_path / "r.f32")
    chunked = make_oracles.VARIANTS[variant]["family"] in CHUNK_DEPENDENT
    for flags in SETTINGS:
        got = logits(containers[variant], ids, tmp_path / "s.f32", *flags)
        if chunked and "--batch" in flags:
            a, b = np.frombuffer(got, "<f4"), np.frombuffer(resident, "<f4")
            if make_oracles.VARIANTS[variant]["family"] not in TOP_K_SELECTION:
                assert np.abs(a - b).max() <= 1e-3 * np.abs(b).max(), f"{variant} {' '.join(flags)}"
            # the same chunking with the experts streamed (in passes or not) is byte-identical again
            batch = flags[flags.index("--batch") + 1]
            assert logits(containers[variant], ids, tmp_path / "t.f32", "--batch", batch) == got, f"{variant} {flags}"
            continue
        assert got == resident, f"{variant} {' '.join(flags)}: logits differ from the resident run"


def test_asan_engine_streams_the_same_logits(oracle_root, containers, tmp_path):
    """The ASan+UBSan build through the cache, the pool and read-ahead, with a clean exit."""
    subprocess.run(["make", "-s", "build/colibri_asan"], cwd=ROOT, check=True)
    ids = ref_ids(oracle_root, "qwen3_moe_sparse")
    resident = logits(containers["qwen3_moe_sparse"], ids, tmp_path / "r.f32")
    for flags in (["--cap", "1", "--readahead", "on"], ["--cap", "2", "--no-direct"]):
        r = subprocess.run([str(ROOT / "build" / "colibri_asan"), "logits", "--model", str(containers["qwen3_moe_sparse"]),
                            "--ids", ",".join(map(str, ids)), "--out", str(tmp_path / "a.f32"), *flags],
                           capture_output=True, text=True)
        assert r.returncode == 0 and "Sanitizer" not in r.stderr, r.stderr[-2000:]
        assert (tmp_path / "a.f32").read_bytes() == resident


@pytest.mark.parametrize("variant", MOE)
def test_greedy_run_tokens_identical(variant, oracle_root, containers):
    ids = ",".join(map(str, ref_ids(oracle_root, variant, "prompt_ids")))
    runs = {}
    for flags in ([], ["--cap", "1"], ["--cap", "2"], ["--ram", "0.1", "--ctx", "256"], ["--cap", "1", "--threads", "1"]):
        runs[" ".join(flags)] = coli("run", "--model", containers[variant], "--ids", ids, "--max-tokens", 20, "--temp", 0,
                                     *flags).stdout
    assert len(set(runs.values())) == 1, runs
    m = containers[variant]
    base = Raw(m, "--no-direct")
    want = base.turn(ref_ids(oracle_root, variant, "prompt_ids"), max_tokens=20, temp=0)["tokens"]
    base.close()
    for flags in (["--cap", "1", "--readahead", "on"], ["--cap", "1", "--no-direct"]):
        e = Raw(m, *flags)
        assert e.turn(ref_ids(oracle_root, variant, "prompt_ids"), max_tokens=20, temp=0)["tokens"] == want, flags
        e.close()


@pytest.mark.parametrize("binary", ["colibri", "colibri_asan"])
def test_ready_end_and_routing_frames(oracle_root, containers, binary):
    subprocess.run(["make", "-s", f"build/{binary}"], cwd=ROOT, check=True)
    m = containers["qwen3_moe"]
    ids = ref_ids(oracle_root, "qwen3_moe")
    e = Raw(m, "--cap", "2", "--pin", "off", "--readahead", "on", binary=str(ROOT / "build" / binary))
    assert READY_KEYS <= set(e.ready)
    r = e.ready
    assert (r["cap"], r["experts"], r["moe_layers"], r["ram_budget"]) == ("2", "8", "2", "0")
    assert int(r["expert_cache_bytes"]) >= 2 * 2 * int(r["expert_bytes"]) > 0
    t = e.turn(ids, logits=1, routing=1)
    end = t["end"]
    assert END_KEYS <= set(end)
    hits, misses = int(end["hits"]), int(end["misses"])
    assert misses > 0 and float(end["hit_rate"]) == pytest.approx(hits / (hits + misses), abs=1e-3)
    assert int(end["bytes_read"]) >= misses * int(r["expert_bytes"])
    # a logits turn is all prompt: its prefill reads are the turn's
    assert (end["prefill_bytes_read"], end["prefill_io_wait_ms"]) == (end["bytes_read"], end["io_wait_ms"])
    gen = e.turn(ids[::-1], max_tokens=6, temp=0)["end"]  # no prefix to reuse
    assert END_KEYS <= set(gen)
    assert 0 < int(gen["prefill_bytes_read"]) < int(gen["bytes_read"])  # --cap 2 of 8: decode reads too
    assert float(gen["prefill_io_wait_ms"]) <= float(gen["io_wait_ms"])
    assert end["experts_total"] == "16" and int(end["experts_cached"]) <= 4 and int(end["peak_rss_mb"]) >= int(end["rss_mb"]) > 0
    # every position routes top_k = 2 experts in each MoE layer
    assert t["routing"].shape == (2, 8) and (t["routing"].sum(1) == 2 * len(ids)).all()
    e.close()
    res = Raw(m, binary=str(ROOT / "build" / binary))
    assert res.ready["cap"] == "8" and res.ready["ram_budget"] == "0" and res.ready["expert_cache_bytes"] == "0"
    end = res.turn(ids, logits=1)["end"]
    assert (end["misses"], end["hit_rate"], end["bytes_read"]) == ("0", "1.000", "0") and int(end["hits"]) > 0
    res.close()


def test_a_prefill_pass_reads_each_routed_expert_once(oracle_root, containers):
    """Under --cap 1 a prompt of 12 batches prefilled batch by batch reads nearly every expert
    once per batch; one pass over the whole prompt (the default while experts stream) reads each
    expert it routes to once per layer, and the logits do not change."""
    m, ids = containers["qwen3_moe"], ref_ids(oracle_root, "qwen3_moe")
    assert len(ids) >= 12 * 8
    runs = {}
    for p in ("8", "0"):
        e = Raw(m, "--cap", "1", "--batch", "8", "--prefill-pass", p, "--pin", "off", "--readahead", "off")
        runs[p] = e.ready, e.turn(ids, logits=1, routing=1)
        e.close()
    (chunk_ready, chunk), (pass_ready, whole) = runs["8"], runs["0"]
    assert (chunk_ready["prefill_pass"], chunk_ready["prefill_pass_bytes"]) == ("8", "0")
    assert int(pass_ready["prefill_pass"]) >= len(ids) and pass_ready["prefill_pass_why"] == "prompt"
    assert int(pass_ready["prefill_pass_bytes"]) > 0
    assert whole["logits"] == chunk["logits"]
    distinct = int((whole["routing"] > 0).sum())  # (layer, expert) pairs the prompt routes to
    e_pass, e_chunk = whole["end"], chunk["end"]
    assert int(e_pass["misses"]) + int(e_pass["hits"]) == distinct  # one lookup per expert per layer
    assert int(e_chunk["misses"]) > 6 * int(e_pass["misses"])
    assert int(e_chunk["bytes_read"]) > 6 * int(e_pass["bytes_read"]) > 0
    # a cache that holds every expert: the next layer's load while this one computes (read-ahead),
    # so only the first MoE layer waits on demand reads
    e = Raw(m, "--cap", "8", "--batch", "8", "--pin", "off", "--readahead", "off")
    full = e.turn(ids, logits=1)
    e.close()
    assert full["logits"] == chunk["logits"]
    assert int(full["end"]["misses"]) <= 8 < int(e_pass["misses"])


def test_prefill_pass_flag_is_checked_and_resident_runs_keep_the_batch(containers, tmp_path):
    m = str(containers["qwen3_moe"])
    r = subprocess.run([engine(), "logits", "--model", m, "--ids", "1,2", "--out", str(tmp_path / "x"), "--cap", "1",
                        "--batch", "8", "--prefill-pass", "12"], capture_output=True, text=True)
    assert r.returncode == 1
    assert "--prefill-pass 12 must be a multiple of the prefill batch 8" in r.stderr, r.stderr
    e = Raw(m, "--batch", "8", "--prefill-pass", "64")
    assert (e.ready["prefill_pass"], e.ready["prefill_pass_why"], e.ready["prefill_pass_bytes"]) == ("8", "resident", "0")
    e.close()
    # a budget shortens the pass to what half of its spare bytes hold, never below one batch
    e = Raw(m, "--ram", "0.1", "--batch", "8")
    assert int(e.ready["prefill_pass"]) % 8 == 0 and e.ready["prefill_pass_why"] in ("prompt", "budget")
    e.close()


def test_a_budget_that_cannot_fit_is_refused_with_the_numbers(containers, tmp_path):
    r = subprocess.run([engine(), "logits", "--model", str(containers["qwen3_moe"]), "--ids", "1,2", "--out",
                        str(tmp_path / "x"), "--ram", "0.001"], capture_output=True, text=True)
    assert r.returncode == 1 and "dense" in r.stderr and "give at least --ram 0.0" in r.stderr, r.stderr
    r = subprocess.run([engine(), "logits", "--model", str(containers["qwen3_moe"]), "--ids", "1,2", "--out",
                        str(tmp_path / "x"), "--cap", "9"], capture_output=True, text=True)
    assert r.returncode == 1 and "1 to 8" in r.stderr, r.stderr


def vm_hwm(pid):
    """The process's peak resident set (VmHWM, bytes) as the kernel counts it."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/PID/status")


def test_peak_rss_stays_within_the_budget():
    """4-bit experts ~3x the budget: the kernel's peak RSS of the engine stays within 1.1 x --ram 0.1.
    (Read from /proc while the engine is alive: a fork's ru_maxrss would inherit the test's own.)"""
    model = streaming_model.container()
    ids = [(i * 37 + 11) % 320 for i in range(48)]
    out = {}
    for name, flags in (("resident", []), ("budget", ["--ram", "0.1", "--ctx", "256"]), ("cap1", ["--cap", "1", "--batch", "7"])):
        e = Raw(model, *flags)
        t = e.turn(ids, logits=1)
        out[name] = (vm_hwm(e.p.pid), t["logits"], t["end"], e.ready)
        e.close()
    experts = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    assert experts > 3 * 0.1e9
    peak, _, end, ready = out["budget"]
    print(f"peak RSS resident {out['resident'][0] / 1e6:.0f} MB, --ram 0.1: {peak / 1e6:.0f} MB (cap {ready['cap']} of "
          f"{ready['experts']}, hit rate {end['hit_rate']}, {int(end['bytes_read']) / 1e6:.0f} MB read)")
    assert peak <= 1.1 * 0.1e9, (peak, ready)
    assert out["budget"][1] == out["resident"][1] == out["cap1"][1]
    assert out["resident"][0] > 2 * peak  # the resident run really maps more than the budget


def test_usage_learning_raises_the_hit_rate(oracle_root, containers, tmp_path):
    import shutil
    m = tmp_path / "m"
    shutil.copytree(containers["qwen3_moe_nonorm"], m)
    (m / ".coli_usage").unlink(missing_ok=True)  # other tests' turns: this one starts unlearned
    prompt = ref_ids(oracle_root, "qwen3_moe_nonorm", "prompt_ids")

    def one_run(*flags):
        e = Raw(m, "--cap", "4", *flags)
        end = e.turn(prompt, max_tokens=24, temp=0)["end"]
        e.close()
        return e.ready, end

    r1, end1 = one_run()
    usage = json.loads((m / ".coli_usage").read_text())
    assert (usage["version"], usage["layers"], usage["experts"], usage["turns"]) == (1, 3, 8, 1)
    assert r1["pinned"] == "0"
    r2, end2 = one_run()
    assert int(r2["pinned"]) > 0 and int(end2["experts_pinned"]) == int(r2["pinned"])
    print(f"hit rate run 1 {end1['hit_rate']}, run 2 {end2['hit_rate']} ({r2['pinned']} pinned)")
    assert float(end2["hit_rate"]) > float(end1["hit_rate"])
    r3, _ = one_run("--pin", "off")
    assert r3["pinned"] == "0"
    (m / ".coli_usage").write_text("{not json")
    e = Raw(m, "--cap", "4")
    assert e.ready["pinned"] == "0"
    e.turn(prompt, max_tokens=2, temp=0)
    assert "ignored" in e.close()
    assert json.loads((m / ".coli_usage").read_text())["turns"] == 1  # rewritten from scratch


def test_sigkill_during_usage_writes_never_corrupts_it(oracle_root, containers, tmp_path):
    import shutil
    m = tmp_path / "m"
    shutil.copytree(containers["qwen3_moe"], m)
    (m / ".coli_usage").unlink(missing_ok=True)
    ids = ",".join(map(str, ref_ids(oracle_root, "qwen3_moe", "prompt_ids"))).encode()
    turns = 0
    for k in range(12):
        p = subprocess.Popen([engine(), "--model", str(m), "--cap", "2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)
        assert p.stdout.readline().startswith(b"READY")
        for i in range(40):
            p.stdin.write(f"SUBMIT r{i} {len(ids)} ids=1 max_tokens=1\n".encode() + ids)
        p.stdin.flush()
        # kill right after the (k+1)-th END: the usage writes of turn k+1 and later are under way
        ends = 0
        while ends <= k:
            line = p.stdout.readline()
            assert line, "engine died"
            parts = line.split()
            if parts[0] in (b"DATA", b"ERROR"):
                p.stdout.read(int(parts[3]))
            ends += parts[0] == b"END"
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        p.stdin.close()
        f = m / ".coli_usage"
        if f.exists():
            u = json.loads(f.read_text())  # parses: the previous file or the new one, never a torn one
            assert u["layers"] == 2 and u["experts"] == 8 and len(u["counts"]) == 2 and u["turns"] >= turns
            turns = u["turns"]
    assert turns > 0
    e = Raw(m, "--cap", "2")  # a restart cleans the dead writers' temporaries
    e.close()
    assert not list(m.glob(".coli_usage.tmp.*"))


def test_o_direct_reads_that_fail_fall_back_to_buffered_reads(oracle_root, containers, tmp_path, monkeypatch):
    """A filesystem that opens O_DIRECT but fails its reads with EINVAL (simulated by the engine's
    test hook): the engine says so once, reads buffered, and the logits are the same."""
    ids = ref_ids(oracle_root, "qwen3_moe")
    want = logits(containers["qwen3_moe"], ids, tmp_path / "r.f32", "--kv", "f16")  # the engine's default, as below
    d = Raw(containers["qwen3_moe"], "--cap", "1")
    assert d.ready["direct"] == "1"  # where the filesystem takes it, O_DIRECT is the default
    d.close()
    nd = Raw(containers["qwen3_moe"], "--cap", "1", "--no-direct")
    assert nd.ready["direct"] == "0"
    nd.close()
    # every expert has a slot: buffered reads, so the page cache keeps them for the next engine;
    # they all load at start, so the first turn finds every expert in RAM
    full = Raw(containers["qwen3_moe"], "--cap", "8")
    assert (full.ready["cap"], full.ready["experts"], full.ready["direct"]) == ("8", "8", "0")
    t = full.turn(ids, logits=1)
    assert t["logits"] == want and int(t["end"]["misses"]) == 0 and int(t["end"]["hits"]) > 0
    full.close()
    monkeypatch.setenv("COLI_TEST_DIRECT_EINVAL", "1")
    e = Raw(containers["qwen3_moe"], "--cap", "1")
    assert e.ready["direct"] == "0"
    t = e.turn(ids, logits=1)
    assert t["logits"] == want and int(t["end"]["misses"]) > 0
    assert "O_DIRECT reads fail here" in e.close()


def test_an_expert_that_is_not_one_byte_range_is_read_tensor_by_tensor(oracle_root, containers, tmp_path):
    """Swapping two experts' up projections (bytes and header entries) splits both: the engine
    says why and reads them tensor by tensor, with the same logits."""
    import shutil
    import struct as st
    m = tmp_path / "m"
    shutil.copytree(containers["qwen3_moe"], m)
    shard = next(m.glob("*.safetensors"))
    raw = bytearray(shard.read_bytes())
    n = st.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    a, b = (f"model.layers.1.mlp.experts.{e}.up_proj.weight" for e in (0, 7))
    (a0, a1), (b0, b1) = head[a]["data_offsets"], head[b]["data_offsets"]
    assert a1 - a0 == b1 - b0
    base = 8 + n
    raw[base + a0:base + a1], raw[base + b0:base + b1] = raw[base + b0:base + b1], raw[base + a0:base + a1]
    head[a]["data_offsets"], head[b]["data_offsets"] = [b0, b1], [a0, a1]
    text = json.dumps(head, separators=(",", ":")).encode()
    assert len(text) <= n
    raw[8:8 + n] = text + b" " * (n - len(text))
    shard.write_bytes(bytes(raw))
    ids = ref_ids(oracle_root, "qwen3_moe")
    want = logits(m, ids, tmp_path / "r.f32")
    assert want == logits(containers["qwen3_moe"], ids, tmp_path / "o.f32")  # the same model, stored otherwise
    r = subprocess.run([engine(), "logits", "--model", str(m), "--ids", ",".join(map(str, ids)), "--out",
                        str(tmp_path / "s.f32"), "--cap", "1"], capture_output=True, text=True)
    assert r.returncode == 0 and "tensor by tensor" in r.stderr, r.stderr
    assert (tmp_path / "s.f32").read_bytes() == want


def test_a_tight_budget_lowers_the_prefill_batch_before_refusing(oracle_root, tmp_path):
    """Just below what the default batch needs (128, or 512 with the amx kernels), the engine takes
    a smaller batch (same logits); with --batch given it refuses instead."""
    model = streaming_model.container()
    ids = [(i * 37 + 11) % 320 for i in range(48)]
    base = Raw(model, "--cap", "1", "--ctx", "256", "--pin", "off")
    r = base.ready
    want = base.turn(ids, logits=1)["logits"]
    base.close()
    slot = int(r["expert_cache_bytes"]) // int(r["moe_layers"])
    need = sum(int(r[k]) for k in ("dense_bytes", "kv_bytes", "runtime_bytes", "checkpoint_bytes", "grammar_bytes")) + \
        int(r["moe_layers"]) * slot
    ram = f"{(need - 1_000_000) / 1e9:.6f}"
    e = Raw(model, "--ram", ram, "--ctx", "256", "--pin", "off")
    # halving the batch frees more than the 1 MB missing (with batch 512 enough for a second slot)
    assert int(e.ready["cap"]) >= 1 and int(e.ready["runtime_bytes"]) < int(r["runtime_bytes"])
    assert e.turn(ids, logits=1)["logits"] == want
    assert f"prefill batch lowered to {int(r['batch']) // 2}" in e.close()
    p = subprocess.run([engine(), "--model", str(model), "--ram", ram, "--ctx", "256", "--batch", r["batch"]],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True)
    assert p.returncode == 1 and "give at least --ram" in p.stderr and "READY" not in p.stdout
