"""`coli bench`: runs colibri, runs a peer alternately, reports medians and ratios."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from engine_binaries import engine_bin  # noqa: F401  (fixture)

from colibri import limits

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def moe_model(oracle_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "moe"
    subprocess.run([sys.executable, str(ROOT / "coli"), "convert", str(Path(oracle_root) / "qwen3_moe" / "hf"),
                    str(out)], check=True, capture_output=True)
    return out


def test_bytes_per_token_counts_top_k_experts_only(moe_model):
    from colibri.cli import bench
    from colibri.model import container_scan
    scan = container_scan.scan(moe_model)
    a = scan["arch"]
    want = scan["dense_bytes"] - scan["classes"]["embed"] + scan["expert_bytes"] * a["top_k"] / a["experts"]
    assert bench.bytes_per_decoded_token(scan) == pytest.approx(want)
    assert want < scan["dense_bytes"] + scan["expert_bytes"]


def fake_llama_bench(tmp_path, pp=100.0, tg=50.0, log=None, name="fake-llama-bench", tag="peer"):
    """A stand-in with llama-bench's JSON shape (pp 100, tg 50 tok/s by default) that records its
    tag and arguments in the returned log file, a line a run."""
    peer, log = tmp_path / name, log or tmp_path / "calls"
    peer.parent.mkdir(parents=True, exist_ok=True)
    peer.write_text(f"#!/bin/sh\necho \"{tag} $@\" >> " + str(log) + "\n"
                    f"echo '[{{\"n_prompt\": 16, \"n_gen\": 0, \"avg_ts\": {pp}}},"
                    f" {{\"n_prompt\": 0, \"n_gen\": 8, \"avg_ts\": {tg}}}]'\n")
    peer.chmod(0o755)
    return peer, log


def test_bench_against_two_peers_in_turn_with_their_own_flags(moe_model, tmp_path):
    """Each peer is named by the project it was built in, gets its own flags, runs once a round
    in an order that turns, and is reported with its decode GB/s from the GGUF's bytes."""
    log = tmp_path / "calls"
    main, _ = fake_llama_bench(tmp_path / "llama.cpp", 100.0, 50.0, log, "build/bin/llama-bench", "llama.cpp")
    ik, _ = fake_llama_bench(tmp_path / "ik_llama.cpp", 200.0, 80.0, log, "build/bin/llama-bench", "ik_llama.cpp")
    gguf = tmp_path / "m.gguf"
    write_tiny_moe_gguf(gguf)
    r = subprocess.run([sys.executable, str(ROOT / "coli"), "bench", "--model", str(moe_model), "--prompt-tokens", "16",
                        "--gen-tokens", "8", "--repeat", "2", "--llama-bench", str(main), "--llama-bench", f"{ik} -rtr 1",
                        "--gguf", str(gguf), "--mem-bw", "20", "--temp", "0"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    calls = log.read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["llama.cpp", "ik_llama.cpp", "ik_llama.cpp", "llama.cpp"], calls
    assert all(c.endswith("-rtr 1") == c.startswith("ik_") for c in calls), calls
    header = next(ln for ln in r.stdout.splitlines() if "colibri" in ln and "ratio" in ln)
    assert "llama.cpp" in header and "ik_llama.cpp" in header, r.stdout
    r = subprocess.run([sys.executable, str(ROOT / "coli"), "bench", "--model", str(moe_model), "--prompt-tokens", "16",
                        "--gen-tokens", "8", "--repeat", "1", "--llama-bench", str(main), "--llama-bench", f"{ik} -rtr 1",
                        "--gguf", str(gguf), "--mem-bw", "20", "--temp", "0", "--json"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    want_bytes = 2 * 64 * 4 + 64 * 4 + 2 * (8 * 4 * 4 * 4) * 2 / 8  # head, norm, and 2 of 8 experts of two f32 *_exps
    names = [(p["name"], p["flags"], p["decode_tok_s"], p["bytes_per_decoded_token"]) for p in res["peers"]]
    assert names == [("llama.cpp", [], 50.0, want_bytes), ("ik_llama.cpp", ["-rtr", "1"], 80.0, want_bytes)], names
    ik_row = res["peers"][1]
    assert ik_row["decode_gb_s"] == pytest.approx(want_bytes * 80.0 / 1e9)
    assert ik_row["ratio_decode_tok_s"] == pytest.approx(res["colibri"]["decode_tok_s"] / 80.0)
    assert ik_row["ratio_decode_gb_s"] == pytest.approx(res["colibri"]["decode_gb_s"] / ik_row["decode_gb_s"])
    assert res["peer"]["name"] == "llama.cpp" and res["ratio_decode_tok_s"] == pytest.approx(
        res["colibri"]["decode_tok_s"] / 50.0)  # the single-peer fields are the first peer's


def write_tiny_moe_gguf(path):
    """A GGUF whose bytes per decoded token are known: an embedding (not read whole), an output
    head and norm, and 8 experts of which 2 are used."""
    import gguf
    import numpy as np
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_expert_count(8)
    w.add_expert_used_count(2)
    w.add_tensor("token_embd.weight", np.zeros((100, 64), np.float32))
    w.add_tensor("output.weight", np.zeros((2, 64), np.float32))
    w.add_tensor("output_norm.weight", np.zeros(64, np.float32))
    w.add_tensor("blk.0.ffn_up_exps.weight", np.zeros((8, 4, 4), np.float32))
    w.add_tensor("blk.0.ffn_down_exps.weight", np.zeros((8, 4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_bench_against_a_peer(moe_model, tmp_path):
    peer, log = fake_llama_bench(tmp_path)
    r = subprocess.run([sys.executable, str(ROOT / "coli"), "bench", "--model", str(moe_model), "--prompt-tokens", "16",
                        "--gen-tokens", "8", "--repeat", "2", "--llama-bench", str(peer), "--gguf", str(peer),
                        "--mem-bw", "20", "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert len(log.read_text().splitlines()) == 2  # one peer run after each colibri run
    assert "-p 16 -n 8 -t" in log.read_text()  # no -d 0: ik_llama.cpp's llama-bench has no -d
    assert res["colibri"]["decode_tok_s"] > 0 and res["colibri"]["prefill_tok_s"] > 0
    assert res["ratio_decode_tok_s"] == pytest.approx(res["colibri"]["decode_tok_s"] / 50.0)
    assert res["ratio_prefill_tok_s"] == pytest.approx(res["colibri"]["prefill_tok_s"] / 100.0)
    assert res["colibri"]["decode_gb_s"] == pytest.approx(res["bytes_per_decoded_token"] * res["colibri"]["decode_tok_s"] / 1e9)


def test_bench_errors(moe_model, tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "coli"), "bench", "--model", str(moe_model), "--llama-bench",
                        str(tmp_path / "missing")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not an executable" in r.stderr
    r = subprocess.run([sys.executable, str(ROOT / "coli"), "bench", "--model", str(moe_model), "--repeat", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--repeat must be at least 1" in r.stderr


def test_bench_fits_a_small_vocabulary_and_refuses_an_oversized_prompt(moe_model):
    """The default 64-token prompt reaches id 442 and more; the tiny model has 320 ids."""
    base = [sys.executable, str(ROOT / "coli"), "bench", "--model", str(moe_model), "--repeat", "1", "--gen-tokens",
            "2", "--mem-bw", "20", "--json"]
    r = subprocess.run(base, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    res = json.loads(r.stdout)["colibri"]
    assert res["kernels"] and res["batch"] == limits.default_batch(res["kernels"])  # what the engine chose
    r = subprocess.run(base + ["--kernels", "portable", "--batch", "16"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)["colibri"]
    assert res["kernels"] == "portable" and res["batch"] == 16  # both reach the engine
    r = subprocess.run(base + ["--prompt-tokens", "600"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "context_exceeded" in r.stderr and "512" in r.stderr


def test_bench_at_depth_with_a_sampled_leg(moe_model, tmp_path):
    """--depth fills the slot first and hands the same depth to the peer (llama-bench -d); the
    sampled leg reports its rate and what sampling adds per token."""
    peer, log = fake_llama_bench(tmp_path)
    base = [sys.executable, str(ROOT / "coli"), "bench", "--model", str(moe_model), "--prompt-tokens", "16",
            "--gen-tokens", "8", "--repeat", "1", "--mem-bw", "20"]
    r = subprocess.run(base + ["--depth", "200", "--llama-bench", str(peer), "--gguf", str(peer), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert "-p 16 -n 8 -d 200" in log.read_text()
    assert res["depth"] == 200 and res["colibri"]["sampled_temp"] == 1.0
    c = res["colibri"]
    assert c["sampled_decode_tok_s"] > 0 and c["decode_tok_s"] > 0 and c["prefill_tok_s"] > 0
    assert c["sampler_ms_per_token"] == pytest.approx(1e3 / c["sampled_decode_tok_s"] - 1e3 / c["decode_tok_s"])
    r = subprocess.run(base + ["--temp", "0", "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and json.loads(r.stdout)["colibri"]["sampled_decode_tok_s"] is None, r.stderr
    r = subprocess.run(base + ["--depth", "600"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "context_exceeded" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(base + ["--depth", "-1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--depth must be 0 or more" in r.stderr


def test_bench_measures_memory_with_the_decode_thread_count(moe_model):
    """Without --mem-bw the achieved bandwidth is set against `colibri membw` run with decode's
    thread count, and its one-thread rate is reported beside it."""
    r = subprocess.run([sys.executable, str(ROOT / "coli"), "bench", "--model", str(moe_model), "--repeat", "1",
                        "--prompt-tokens", "8", "--gen-tokens", "4", "--temp", "0", "--threads", "2", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["memory_read_source"] == "measured (2 threads)"
    assert res["memory_read_gb_s"] > 0 and res["memory_read_one_thread_gb_s"] > 0
    assert res["memory_read_one_thread_source"] == "colibri membw"


def test_membw_reads_with_the_threads_asked_and_refuses_bad_arguments(engine_bin):  # noqa: F811
    r = subprocess.run([str(engine_bin), "membw", "--threads", "2", "--mib", "16"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    fields = dict(f.split("=") for f in r.stdout.split()[1:])
    assert fields["threads"] == "2" and fields["mib"] == "16" and float(fields["gb_s"]) > 0
    for bad in (["--threads", "0"], ["--mib", "x"], ["--mib"], ["--bogus", "1"]):
        r = subprocess.run([str(engine_bin), "membw", *bad], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "usage: colibri membw" in r.stderr


def test_bench_profile_reports_each_op_per_token(moe_model):
    from colibri.cli import bench
    from colibri.model import container_scan
    r = subprocess.run([sys.executable, str(ROOT / "coli"), "bench", "--model", str(moe_model), "--repeat", "1",
                        "--prompt-tokens", "8", "--gen-tokens", "4", "--mem-bw", "20", "--profile", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    prof = json.loads(r.stdout)["colibri"]["profile"]
    assert set(prof) == set(bench.PROFILE_OPS) | {"token"}
    assert sum(prof[op]["ms"] for op in bench.PROFILE_OPS) == pytest.approx(prof["token"]["ms"], rel=1e-3, abs=1e-3)
    scan = container_scan.scan(moe_model)
    assert prof["head"]["bytes"] == scan["classes"]["lm_head"]
    assert prof["attn_proj"]["bytes"] == scan["classes"]["attention"]
    r = subprocess.run([sys.executable, str(ROOT / "coli"), "bench", "--model", str(moe_model), "--repeat", "1",
                        "--prompt-tokens", "8", "--gen-tokens", "4", "--mem-bw", "20", "--profile"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "per-op decode profile" in r.stdout and "output head" in r.stdout, r.stderr
