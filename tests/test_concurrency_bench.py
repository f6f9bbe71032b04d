"""tools/concurrency_bench.py: its rate and percentile arithmetic, the SSE and llama-batched-bench
parsing, and a whole run over HTTP against `coli serve` and a stand-in llama-server."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
import bench_http  # tools/ is on pytest's pythonpath
import concurrency_bench as cb


def test_pct_is_nearest_rank():
    xs = [5, 1, 4, 2, 3]
    assert cb.pct(xs, 0.5) == 3 and cb.pct(xs, 0.0) == 1 and cb.pct(xs, 1.0) == 5
    assert cb.pct(list(range(1, 21)), 0.95) == 19  # 19 of 20 values at or below it
    assert cb.pct([1, 2, 3, 4], 0.5) == 2 and cb.pct([1, 2, 3, 4, 5, 6], 0.5) == 3  # the lower middle, both counts
    assert cb.pct([7.0], 0.95) == 7.0
    with pytest.raises(ValueError):
        cb.pct([], 0.5)


def test_no_two_prompts_of_a_run_share_a_prefix():
    # slots and llama-server's prompt cache would otherwise skip a prefill the round should pay
    firsts = [pr[0] for k in list(range(40)) + [999] for pr in cb.prompts_for(16, 64, 49152, k)]
    assert len(set(firsts)) == len(firsts)
    assert all(len(pr) == 64 and 1 <= min(pr) and max(pr) < 49152 for pr in cb.prompts_for(8, 64, 49152, 3))


def test_one_stream_decode_is_first_to_last_token():
    times = [[1.0, 1.5, 2.0, 2.5, 3.0]]  # first token at 1 s (prefill), then 4 tokens in 2 s
    decode, with_prefill, ttft = cb.round_rates(times, wall=4.0)
    assert decode == pytest.approx(2.0)
    assert with_prefill == pytest.approx(5 / 4.0)
    assert ttft == [1.0]


def test_decode_window_is_while_every_stream_decodes():
    # stream a starts at 0.5, stream b at 1.0 (its prefill waited); a ends at 3.0, b at 3.5
    a = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    b = [1.0, 1.5, 2.0, 2.5, 3.0, 3.5]
    decode, with_prefill, ttft = cb.round_rates([a, b], wall=4.0)
    # window (1.0, 3.0]: a has 1.5 2.0 2.5 3.0, b has 1.5 2.0 2.5 3.0 -> 8 tokens in 2 s
    assert decode == pytest.approx(4.0)
    assert with_prefill == pytest.approx(12 / 4.0)
    assert sorted(ttft) == [0.5, 1.0]


def test_chunks_carrying_several_tokens_count_by_usage():
    # 3 chunks for 6 tokens (held-back UTF-8 pieces): each chunk stands for two
    decode, with_prefill, _ = cb.round_rates([[1.0, 2.0, 3.0]], wall=4.0, counts=[6])
    assert decode == pytest.approx(2 * 2 / 2.0) and with_prefill == pytest.approx(6 / 4.0)


def test_streams_that_never_overlapped_are_rated_one_after_another():
    a, b = [0.0, 1.0, 2.0], [3.0, 3.5, 4.0]  # b started after a ended
    decode, _, _ = cb.round_rates([a, b], wall=4.0)
    assert decode == pytest.approx(4 / 3.0)  # 2 + 2 tokens after the first, 2 s + 1 s of decoding


def test_round_rates_refuses_a_stream_without_tokens():
    with pytest.raises(ValueError):
        cb.round_rates([[1.0, 2.0], []], wall=3.0)


def test_summarize_takes_medians_and_pools_ttfts():
    rounds = [(10.0, 8.0, [0.1, 0.2]), (30.0, 9.0, [0.3, 0.4]), (20.0, 7.0, [0.5, 0.6])]
    s = cb.summarize(rounds)
    assert s["decode_tok_s"] == 20.0 and s["agg_tok_s"] == 8.0
    assert s["ttft_p50_ms"] == pytest.approx(300.0)  # six TTFTs pooled: the third
    assert s["ttft_p95_ms"] == pytest.approx(600.0)


def test_cpu_seconds_sums_a_process_and_its_descendants(tmp_path):
    tick = os.sysconf("SC_CLK_TCK")

    def proc(pid, name, ppid, utime, stime):
        (tmp_path / str(pid)).mkdir()
        rest = ["S", str(ppid)] + ["0"] * 9 + [str(utime), str(stime)] + ["0"] * 30
        (tmp_path / str(pid) / "stat").write_text(f"{pid} ({name}) " + " ".join(rest) + "\n")

    proc(10, "python3 coli", 1, 3 * tick, tick)  # the gateway
    proc(11, "colibri (x) y", 10, 5 * tick, 0)  # its engine: a name with spaces and parentheses
    proc(12, "grandchild", 11, tick, tick)
    proc(13, "unrelated", 1, 100 * tick, 0)
    (tmp_path / "self").mkdir()
    assert bench_http.cpu_seconds(10, str(tmp_path)) == pytest.approx(11.0)
    assert bench_http.cpu_seconds(11, str(tmp_path)) == pytest.approx(7.0)
    assert bench_http.cpu_seconds(99, str(tmp_path)) == 0.0


def test_sse_events_stop_at_done_and_skip_other_lines():
    lines = [b": keep-alive\n", b"data: {\"choices\": [{\"text\": \"a\"}]}\n", b"\n", b"event: x\n",
             b"data: {\"choices\": [], \"usage\": {\"completion_tokens\": 1}}\n", b"data: [DONE]\n",
             b"data: {\"never\": 1}\n"]
    evs = list(bench_http.sse_events(lines))
    assert len(evs) == 2 and evs[1]["usage"]["completion_tokens"] == 1
    assert [bench_http.chunk_tokens(e) for e in evs] == [1, 0]
    assert bench_http.chunk_tokens({"choices": [{"text": ""}]}) == 0


def test_parse_batched_bench_reads_s_tg_per_batch():
    out = """
|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|    64 |     64 |    1 |    128 |    1.049 |    61.01 |    2.493 |    25.67 |    3.542 |    36.13 |
|    64 |     64 |    4 |    512 |    2.884 |    88.78 |    3.940 |    64.98 |    6.823 |    75.04 |
"""
    rows = cb.parse_batched_bench(out, {})
    assert rows == {1: {"agg": [25.67], "pp": [1.049]}, 4: {"agg": [64.98], "pp": [2.884]}}
    cb.parse_batched_bench(out, rows)  # a second run appends
    assert rows[4]["agg"] == [64.98, 64.98]


def test_server_commands():
    cmd = bench_http.llama_server_cmd("/x/llama-server", "m.gguf", 9000, 4, 144, 1)
    assert cmd[:3] == ["/x/llama-server", "-m", "m.gguf"]
    assert cmd[cmd.index("-np") + 1] == "4" and cmd[cmd.index("-c") + 1] == str(144 * 4)  # -c is all slots
    assert "--cont-batching" in cmd and cmd[cmd.index("-t") + 1] == "1"
    ours = bench_http.coli_serve_cmd("/m", 9001, 4, 144, 2)
    for flag, val in (("--kv-slots", "4"), ("--parallel", "4"), ("--ctx", "144"), ("--threads", "2"), ("--port", "9001")):
        assert ours[ours.index(flag) + 1] == val


def test_table_puts_the_ratio_of_decode_rates():
    ours = {1: {"decode_tok_s": 50.0, "agg_tok_s": 40.0, "ttft_p50_ms": 100, "ttft_p95_ms": 120},
            4: {"decode_tok_s": 100.0, "agg_tok_s": 80.0, "ttft_p50_ms": 300, "ttft_p95_ms": 400, "tok_per_cpu_s": 90.0}}
    peer = {1: {"decode_tok_s": 25.0, "agg_tok_s": 20.0, "ttft_p50_ms": 200, "ttft_p95_ms": 220},
            4: {"decode_tok_s": 50.0, "agg_tok_s": 40.0, "ttft_p50_ms": 500, "ttft_p95_ms": 900, "tok_per_cpu_s": 30.0}}
    lines = cb.table([1, 4], ours, peer, "llama-server", {}).splitlines()
    assert "llama-server dec" in lines[0]
    cells = lines[2].split()
    assert cells[0] == "4" and cells[3] == "2.00"  # x1 stream, decode
    assert cells[-3:] == ["2.00", "2.00", "3.00"]  # ours/peer: decode, +prefill, tokens per CPU-second
    assert "nan" in lines[1].split()  # the 1-stream rows measured no CPU


FAKE_LLAMA_SERVER = r'''#!/usr/bin/env python3
"""Stands in for llama-server: records its arguments, streams max_tokens one-token chunks."""
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
args = sys.argv[1:]
open(sys.argv[0] + ".args", "a").write(json.dumps(args) + "\n")
class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"{}")
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["ignore_eos"] is True and body["temperature"] == 0 and all(isinstance(t, int) for t in body["prompt"])
        self.send_response(200); self.send_header("Content-Type", "text/event-stream"); self.end_headers()
        for i in range(body["max_tokens"]):
            time.sleep(0.002)  # tokens take time, as on a real server
            self.wfile.write(b"data: " + json.dumps({"choices": [{"text": "t%d" % i}]}).encode() + b"\n\n"); self.wfile.flush()
        self.wfile.write(b"data: " + json.dumps({"choices": [], "usage": {"completion_tokens": body["max_tokens"]}}).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True
ThreadingHTTPServer(("127.0.0.1", int(args[args.index("--port") + 1])), H).serve_forever()
'''


def convert_tiny(oracle_root, model):
    """The tiny llama oracle converted into `model`: a container for the bench to drive."""
    subprocess.run([sys.executable, str(ROOT / "coli"), "convert", str(Path(oracle_root) / "llama" / "hf"), str(model)],
                   check=True, capture_output=True, timeout=300)


def test_http_run_against_coli_serve_and_a_stand_in_peer(oracle_root, tmp_path):
    model = tmp_path / "llama"
    convert_tiny(oracle_root, model)
    peer = tmp_path / "llama-server"
    peer.write_text(FAKE_LLAMA_SERVER)
    peer.chmod(0o755)
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "concurrency_bench.py"), "--model", str(model),
                        "--concurrency", "1,2", "--repeat", "1", "--prompt-tokens", "6", "--gen-tokens", "5",
                        "--threads", "1", "--http", "--llama-server", str(peer), "--gguf", "weights.gguf", "--json"],
                       capture_output=True, text=True, timeout=600, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    for side in ("colibri", "llama-server"):
        for p in ("1", "2"):
            row = res[side][p]
            assert row["decode_tok_s"] > 0 and row["agg_tok_s"] > 0 and row["ttft_p95_ms"] >= row["ttft_p50_ms"] > 0
            assert "tok_per_cpu_s" in row
    calls = [json.loads(line) for line in (tmp_path / "llama-server.args").read_text().splitlines()]
    assert [c[c.index("-np") + 1] for c in calls] == ["2"]  # one server, as many slots as the most streams
    assert "--cont-batching" in calls[0] and calls[0][calls[0].index("-m") + 1] == "weights.gguf"


def test_engine_protocol_run_interleaves_concurrencies(oracle_root, tmp_path):
    """--model takes a pulled name, as coli does: the container in the store (COLI_HOME) here."""
    model = tmp_path / "home" / "models" / "tiny"
    model.parent.mkdir(parents=True)
    convert_tiny(oracle_root, model)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLI_HOME": str(tmp_path / "home")}
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "concurrency_bench.py"), "--model", "tiny",
                        "--concurrency", "1,3", "--repeat", "2", "--prompt-tokens", "6", "--gen-tokens", "5",
                        "--threads", "1"], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("colibri via the engine protocol") and "load average" in lines[0]
    rows = [line.split() for line in lines[2:]]
    assert [row[0] for row in rows] == ["1", "3"] and rows[0][3] == "1.00"
    assert all(float(row[1]) > 0 and float(row[2]) > 0 for row in rows)


def test_a_model_that_is_neither_a_directory_nor_pulled_is_refused_by_name(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "concurrency_bench.py"), "--model", "not-pulled"],
                       capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLI_HOME": str(tmp_path)})
    assert r.returncode == 2 and "--model not-pulled: no such directory or pulled model" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_peer_without_gguf_is_refused_when_the_container_names_none(oracle_root, tmp_path):
    """--gguf defaults to the file a model came from (coli bench's default_gguf); a container
    converted from safetensors has none, and the peers cannot run without one."""
    model = tmp_path / "llama"
    convert_tiny(oracle_root, model)
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "concurrency_bench.py"), "--model", str(model),
                        "--llama-server", "llama-server"], capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLI_HOME": str(tmp_path / "home")})
    assert r.returncode == 2 and "need --gguf" in r.stderr, r.stderr


def test_a_pulled_model_gives_the_peer_the_gguf_it_was_downloaded_as(oracle_root, tmp_path):
    home = tmp_path / "home"
    model = home / "models" / "tiny"
    model.parent.mkdir(parents=True)
    convert_tiny(oracle_root, model)
    gguf = home / "downloads" / "llm-tiny" / "tiny.Q4_0.gguf"
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(b"GGUF")  # only its path reaches the stand-in peer
    peer = tmp_path / "llama-server"
    peer.write_text(FAKE_LLAMA_SERVER)
    peer.chmod(0o755)
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "concurrency_bench.py"), "--model", "tiny",
                        "--concurrency", "1", "--repeat", "1", "--prompt-tokens", "6", "--gen-tokens", "5",
                        "--threads", "1", "--http", "--llama-server", str(peer), "--json"],
                       capture_output=True, text=True, timeout=600,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLI_HOME": str(home)})
    assert r.returncode == 0, r.stderr[-3000:]
    calls = [json.loads(line) for line in (tmp_path / "llama-server.args").read_text().splitlines()]
    assert calls and calls[0][calls[0].index("-m") + 1] == str(gguf)
