"""`coli doctor` on a good model and on broken model directories built here."""
import json
import os
import struct
from pathlib import Path

import pytest

from launcher_helpers import coli, convert_tiny, copy_model, rewrite_header, shard_of

import doctor


@pytest.fixture(scope="module")
def good(oracle_root, tmp_path_factory):
    return convert_tiny(oracle_root, tmp_path_factory.mktemp("doc") / "good")


@pytest.fixture
def broken(good, tmp_path):
    return copy_model(good, tmp_path / "broken")


def checks(model, deep=False):
    rep = doctor.diagnose(str(model), deep=deep)
    return {c["name"]: c for c in rep.checks}, rep.worst


def doctor_json(*args):
    r = coli("doctor", "--json", *args)
    res = json.loads(r.stdout)
    assert r.returncode == res["exit_code"] == doctor.RANK[res["worst"]]
    return res, {c["name"]: c for c in res["checks"]}


def test_a_good_model_passes_every_model_check(good):
    res, by = doctor_json("--deep", "--model", good)
    for name in ("model", "family", "shard headers", "tensors", "tokenizer", "chat template", "memory",
                 "open files", "engine load"):
        assert by[name]["status"] == "pass", by[name]
    assert "walked" in by["tensors"]["detail"]
    assert by["O_DIRECT"]["status"] in ("pass", "warn")  # tmpfs has no O_DIRECT: a warning, with the reason
    assert res["worst"] in ("pass", "warn")


def test_missing_shard_fails(broken):
    shard_of(broken).unlink()
    by, worst = checks(broken)
    assert worst == "fail" and by["shards"]["status"] == "fail"
    assert "missing" in by["shards"]["detail"] and "coli convert" in by["shards"]["fix"]


def test_truncated_shard_fails(broken):
    p = shard_of(broken)
    os.truncate(p, p.stat().st_size // 2)
    by, worst = checks(broken)
    assert worst == "fail" and by["shard headers"]["status"] == "fail"
    assert "truncated" in by["shard headers"]["detail"]


def test_bad_header_length_and_bad_json_fail(broken):
    p = shard_of(broken)
    raw = bytearray(p.read_bytes())
    raw[:8] = struct.pack("<Q", 1 << 40)
    p.write_bytes(bytes(raw))
    by, _ = checks(broken)
    assert by["shard headers"]["status"] == "fail" and "header length" in by["shard headers"]["detail"]
    raw[:8] = struct.pack("<Q", 64)
    raw[8:72] = b"{" * 64
    p.write_bytes(bytes(raw))
    by, _ = checks(broken)
    assert by["shard headers"]["status"] == "fail" and "JSON" in by["shard headers"]["detail"]


def test_missing_tokenizer_fails_and_missing_template_warns(broken):
    (broken / "tokenizer.json").unlink()
    (broken / "chat_template.jinja").unlink()
    by, worst = checks(broken)
    assert worst == "fail"
    assert by["tokenizer"]["status"] == "fail" and "tokenizer.json" in by["tokenizer"]["fix"]
    assert by["chat template"]["status"] == "warn" and "--raw" in by["chat template"]["fix"]


def test_unreadable_tokenizer_fails(broken):
    (broken / "tokenizer.json").write_text("{not json")
    by, _ = checks(broken)
    assert by["tokenizer"]["status"] == "fail" and "unreadable" in by["tokenizer"]["detail"]


def test_unknown_family_fails(broken):
    man = json.loads((broken / "colibri.json").read_text())
    man["family"] = "mamba9"
    (broken / "colibri.json").write_text(json.dumps(man))
    by, _ = checks(broken)
    assert by["family"]["status"] == "fail" and "mamba9" in by["family"]["detail"]


def test_storage_entry_disagreeing_with_the_stored_shape_fails_only_deep(broken):
    def mutate(h):
        table = json.loads(h["__metadata__"]["colibri.tensors"])
        name = next(n for n, e in table.items() if e[0] == "q4")
        table[name][0] = "q8"
        h["__metadata__"]["colibri.tensors"] = json.dumps(table)
    rewrite_header(shard_of(broken), mutate)
    by, _ = checks(broken)
    assert by["shard headers"]["status"] == "pass"
    by, worst = checks(broken, deep=True)
    assert worst == "fail" and by["tensors"]["status"] == "fail"
    assert "declared q8" in by["tensors"]["detail"]
    assert "engine load" not in by  # not attempted on a container that already failed


def test_overlapping_tensors_fail_deep(broken):
    def mutate(h):
        a, b = "model.layers.1.mlp.experts.0.gate_proj.weight", "model.layers.1.mlp.experts.0.up_proj.weight"
        h[b]["data_offsets"] = list(h[a]["data_offsets"])
    rewrite_header(shard_of(broken), mutate)
    by, _ = checks(broken, deep=True)
    assert by["tensors"]["status"] == "fail" or by["shard headers"]["status"] == "fail"
    details = by["shard headers"]["detail"] + by.get("tensors", {}).get("detail", "")
    assert "overlap" in details


def test_missing_expert_projection_fails_deep(broken):
    def mutate(h):
        name = "model.layers.2.mlp.experts.3.down_proj.weight"
        del h[name]
        table = json.loads(h["__metadata__"]["colibri.tensors"])
        del table[name]
        h["__metadata__"]["colibri.tensors"] = json.dumps(table)
    rewrite_header(shard_of(broken), mutate)
    by, _ = checks(broken, deep=True)
    assert by["tensors"]["status"] == "fail" and "layer 2 expert 3" in by["tensors"]["detail"]


def test_stray_shard_warns(broken):
    (broken / "model-00009-of-00009.safetensors").write_bytes(b"\0" * 16)
    by, _ = checks(broken)
    assert by["stray shards"]["status"] == "warn"


def test_low_open_file_limit_is_reported(monkeypatch):
    import resource
    monkeypatch.setattr(resource, "getrlimit", lambda _r: (32, 4096))
    rep = doctor.Report()
    doctor.check_open_files(rep, 10)
    assert rep.checks[0]["status"] == "warn" and "ulimit -n" in rep.checks[0]["fix"]
    monkeypatch.setattr(resource, "getrlimit", lambda _r: (32, 64))
    rep = doctor.Report()
    doctor.check_open_files(rep, 100)
    assert rep.checks[0]["status"] == "fail"


def test_text_output_and_exit_code(broken):
    (broken / "tokenizer.json").unlink()
    r = coli("doctor", "--model", broken)
    assert r.returncode == 2
    assert "[fail] tokenizer" in r.stdout and "fix:" in r.stdout and "\033[" not in r.stdout
    assert "failed" in r.stdout.splitlines()[-1]


def test_no_model_wrong_path_non_model_dir_and_hf_checkpoint(tmp_path, oracle_root):
    res, by = doctor_json()
    assert by["model"]["status"] == "warn" and "--model" in by["model"]["fix"]
    assert "engine" in by and res["exit_code"] >= 1
    res, by = doctor_json("--model", tmp_path / "nope")
    assert by["model"]["status"] == "fail" and "no such directory" in by["model"]["detail"]
    res, by = doctor_json("--model", tmp_path)
    assert by["model"]["status"] == "fail" and "colibri.json" in by["model"]["detail"]
    res, by = doctor_json("--model", Path(oracle_root) / "qwen3_moe" / "hf")
    assert by["model"]["status"] == "fail" and "coli convert" in by["model"]["fix"]


def test_memory_names_the_kv_writers_share_and_warns_when_only_serving_would_not_fit(good):
    """`coli serve` saves its KV slots, and the engine then reserves the writer's bound: a default
    budget that holds the model but not that bound gets a warning naming --no-kv-persist."""
    man = json.loads((Path(good) / "colibri.json").read_text())

    def status(budget):
        rep = doctor.Report()
        doctor.check_memory(rep, str(good), man, {"default_budget": budget})
        return rep.checks[-1]

    assert "reserves" in status(1 << 34)["detail"]

    def smallest(ok, lo=1, hi=1 << 34):  # the least budget the predicate accepts
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if ok(mid) else (mid + 1, hi)
        return lo

    runs = smallest(lambda b: status(b)["status"] != "fail")
    serves = smallest(lambda b: status(b)["status"] == "pass")
    assert runs < serves  # the writer's share lies between them
    warned = status((runs + serves) // 2)
    assert warned["status"] == "warn" and "--no-kv-persist" in warned["fix"] and "refuse" in warned["detail"]
