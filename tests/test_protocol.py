"""The engine protocol from the launcher side: a real engine on a tiny converted model, driven
through engine_client and through raw frames (docs/protocol.md). Every test runs against the
release build and the ASan+UBSan build of the engine (engine_binaries.py)."""
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
from colibri import engine_client  # noqa: E402
from engine_binaries import assert_clean_exit, engine_bin  # noqa: E402, F401


@pytest.fixture(scope="module", autouse=True)
def every_binary(engine_bin):  # noqa: F811
    return engine_bin


@pytest.fixture(scope="module")
def model(oracle_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("proto") / "llama"
    subprocess.run([sys.executable, str(ROOT / "coli"), "convert", str(Path(oracle_root) / "llama" / "hf"), str(out),
                    "--experts", "bf16", "--dense", "bf16"], check=True, capture_output=True)
    return out


@pytest.fixture
def engine(model):
    with engine_client.Engine(model, ctx=64, kv_slots=2) as eng:
        yield eng
    assert_clean_exit(eng)


def events(eng, payload, **opts):
    return list(eng.generate(payload, **opts))


def test_ready_line_describes_the_engine(engine):
    assert engine.info["family"] == "llama" and engine.info["ctx"] == "64" and engine.info["slots"] == "2"
    assert int(engine.info["vocab"]) > 0 and engine.info["kernels"] in ("amx", "vnni", "avx512", "avx2", "portable")


def test_accept_comes_before_data_and_end_has_stats(engine):
    ev = events(engine, [5, 6, 7], max_tokens=4)
    assert ev[0] == ("accept", 3, 0)
    assert {e[0] for e in ev[1:-1]} == {"data"}
    assert len([e for e in ev if e[0] == "data" and e[1] >= 0]) == 4  # a token -1 frame may flush held-back bytes
    stats = ev[-1][1]
    assert ev[-1][0] == "end" and stats["finish"] == "length"
    assert stats["prompt_tokens"] == "3" and stats["completion_tokens"] == "4"
    for key in ("ttft_ms", "prefill_tok_s", "decode_tok_s", "hit_rate", "bytes_read", "rss_mb"):
        assert key in stats


def test_greedy_is_deterministic_and_matches_logits(engine, model, tmp_path):
    a = [e[1] for e in events(engine, [5, 6, 7], max_tokens=6) if e[0] == "data"]
    b = [e[1] for e in events(engine, [5, 6, 7], max_tokens=6, slot=1) if e[0] == "data"]
    assert a == b
    out = tmp_path / "l.f32"
    subprocess.run([sys.executable, str(ROOT / "coli"), "logits", "--model", str(model), "--ids", "5,6,7",
                    "--out", str(out)], check=True)
    logits = np.fromfile(out, dtype="<f4").reshape(3, -1)
    assert a[0] == int(logits[-1].argmax())


def test_logits_frame(engine):
    ev = events(engine, [5, 6, 7, 8], logits=1)
    assert ev[0] == ("accept", 4, 0)
    (rows, vocab), body = ev[1][1], ev[1][2]
    assert ev[1][0] == "logits" and rows == 4 and len(body) == 4 * rows * vocab
    assert ev[-1][1]["finish"] == "logits"


def test_prefix_reuse_gives_the_same_tokens(engine):
    first = [e[1] for e in events(engine, [9, 10, 11, 12], max_tokens=3) if e[0] == "data"]
    ev = events(engine, [9, 10, 11, 12] + first + [13, 14], max_tokens=5)
    # the prompt and every generated token but the last (never fed back) are reused
    assert ev[0][0] == "accept" and ev[0][2] == 4 + len(first) - 1
    fresh = [e[1] for e in events(engine, [9, 10, 11, 12] + first + [13, 14], max_tokens=5, slot=1) if e[0] == "data"]
    reused = [e[1] for e in ev if e[0] == "data"]
    assert reused == fresh


def test_seeded_sampling_is_reproducible(engine):
    run = lambda seed: [e[1] for e in events(engine, [1, 2], max_tokens=8, temp=1.5, seed=seed) if e[0] == "data"]
    assert run(7) == run(7)
    assert any(run(7) != run(s) for s in (8, 9, 10))


@pytest.mark.parametrize("opts,kind,needle", [
    (dict(slot=5), "bad_request", "slot 5 out of range"),
    (dict(temp="hot"), "bad_request", "bad value"),
    (dict(colour=1), "bad_request", "unknown SUBMIT option"),
])
def test_bad_requests_get_typed_errors(engine, opts, kind, needle):
    with pytest.raises(engine_client.EngineError) as e:
        events(engine, [1, 2, 3], **opts)
    assert e.value.kind == kind and needle in e.value.message
    assert [e[0] for e in events(engine, [1, 2], max_tokens=1)][0] == "accept"  # still serving


def test_bad_ids_and_context(engine):
    with pytest.raises(engine_client.EngineError) as e:
        events(engine, [1, 10 ** 6])
    assert e.value.kind == "bad_request" and "not an id" in e.value.message
    with pytest.raises(engine_client.EngineError) as e:
        events(engine, list(range(1, 65)))
    assert e.value.kind == "context_exceeded" and "64" in e.value.message


def test_generation_stops_at_end_of_context(engine):
    ev = events(engine, list(range(1, 61)))  # no max_tokens: runs until the context is full
    assert ev[-1][1]["finish"] == "length"
    assert int(ev[-1][1]["completion_tokens"]) == 64 - 60


def test_fit_refuses_max_tokens_the_context_cannot_hold(engine):
    """fit=1: a max_tokens that does not fit after the prompt is context_exceeded, before ACCEPT,
    naming the numbers; one that just fits is generated in full; without fit it is cut at the end."""
    with pytest.raises(engine_client.EngineError) as e:
        events(engine, list(range(1, 61)), max_tokens=5, fit=1)
    assert e.value.kind == "context_exceeded"
    assert "maximum context length is 64 tokens" in e.value.message and "65 (60 in the prompt, max_tokens 5)" in e.value.message
    assert "max_tokens to 4 or less" in e.value.message
    ev = events(engine, list(range(1, 61)), max_tokens=4, fit=1, ignore_eos=1)
    assert ev[0] == ("accept", 60, 0) and ev[-1][1]["completion_tokens"] == "4"
    ev = events(engine, list(range(1, 61)), max_tokens=5, ignore_eos=1)
    assert ev[-1][1]["finish"] == "length" and ev[-1][1]["completion_tokens"] == "4"


def raw_engine(model):
    return subprocess.Popen([str(engine_client.ENGINE), "serve", "--model", str(model), "--ctx", "512"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def read_frame(out):
    head = out.readline().decode().rstrip("\n").split(" ")
    if head[0] in ("DATA", "ERROR"):
        out.read(int(head[3]))
    return head


def run_until_end(p):
    frames = []
    while True:
        f = read_frame(p.stdout)
        frames.append(f)
        if f[0] in ("END", "ERROR"):
            return frames


def test_stop_and_cancel_end_generation_within_one_token(model):
    """STOP/CANCEL written right behind the SUBMIT are seen after the first token."""
    p = raw_engine(model)
    assert p.stdout.readline().startswith(b"READY")
    p.stdin.write(b"SUBMIT s1 5 ids=1\n1,2,3STOP s1\n")
    p.stdin.flush()
    frames = run_until_end(p)
    assert frames[0][0] == "ACCEPT"
    assert [f[0] for f in frames[1:-1] if f[0] == "DATA" and f[2] != "-1"] == ["DATA"]
    assert frames[-1][0] == "END" and "finish=stop" in frames[-1] and "completion_tokens=1" in frames[-1]
    p.stdin.write(b"SUBMIT c1 5 ids=1\n1,2,3CANCEL c1\n")
    p.stdin.flush()
    frames = run_until_end(p)
    assert [f[0] for f in frames[1:-1] if f[0] == "DATA" and f[2] != "-1"] == ["DATA"]
    assert frames[-1][:3] == ["ERROR", "c1", "cancelled"]
    # a STOP for a request still queued behind a running one removes it before it starts
    p.stdin.write(b"SUBMIT q1 5 ids=1 max_tokens=3\n1,2,3SUBMIT q2 5 ids=1\n4,5,6CANCEL q2\n")
    p.stdin.flush()
    assert run_until_end(p)[-1][0] == "END"
    assert run_until_end(p)[-1][:3] == ["ERROR", "q2", "cancelled"]
    p.stdin.close()
    assert p.wait(timeout=10) == 0


def test_cancel_during_prefill(model):
    p = subprocess.Popen([str(engine_client.ENGINE), "serve", "--model", str(model), "--ctx", "512", "--batch", "1"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout.readline().startswith(b"READY")
    ids = ",".join(str(1 + i % 300) for i in range(400)).encode()
    p.stdin.write(b"SUBMIT p1 %d ids=1\n%sCANCEL p1\n" % (len(ids), ids))
    p.stdin.flush()
    frames = run_until_end(p)
    assert frames[0][0] == "ACCEPT" and frames[-1][:3] == ["ERROR", "p1", "cancelled"]
    assert not [f for f in frames if f[0] == "DATA"], "no token is generated once cancelled during prefill"
    p.stdin.close()
    assert p.wait(timeout=10) == 0


def test_malformed_frames_and_eof(model):
    p = raw_engine(model)
    assert p.stdout.readline().startswith(b"READY")
    p.stdin.write(b"HELLO there\nSUBMIT x 5 ids=1\n1,2")  # second frame's payload is cut by EOF
    p.stdin.close()
    f = read_frame(p.stdout)
    assert f[:3] == ["ERROR", "-", "bad_request"] or f[:3] == ["ERROR", "there", "bad_request"]
    f = read_frame(p.stdout)
    assert f[0] == "ERROR" and f[2] == "bad_request"
    assert p.wait(timeout=10) == 0


def test_load_failure_is_explained(tmp_path):
    (tmp_path / "colibri.json").write_text("{not json")
    with pytest.raises(engine_client.EngineError) as e:
        engine_client.Engine(tmp_path)
    assert e.value.kind == "load_failed" and "colibri.json" in e.value.message and "exited with code" in e.value.message


def test_engine_death_is_explained(model):
    eng = engine_client.Engine(model)
    eng.proc.kill()
    eng.proc.wait()
    t0 = time.time()
    with pytest.raises(engine_client.EngineError) as e:
        events(eng, [1, 2, 3])
    assert e.value.kind == "engine_died" and "SIGKILL" in e.value.message and "out-of-memory" in e.value.message
    assert time.time() - t0 < 5


def log_softmax(x):
    x = x.astype(np.float64)
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


def test_logprobs_follow_each_token(engine):
    ev = events(engine, [5, 6, 7], max_tokens=3, logprobs=1, top_logprobs=3)
    kinds = [e[0] for e in ev]
    data = [i for i, k in enumerate(kinds) if k == "data" and ev[i][1] >= 0]
    assert len(data) == 3 and all(kinds[i + 1] == "logprob" for i in data)
    logits = np.frombuffer(events(engine, [5, 6, 7], logits=1)[1][2], dtype="<f4").reshape(3, -1)
    want = log_softmax(logits[-1])
    _, tok, lp, _, alts = ev[data[0] + 1]
    assert tok == ev[data[0]][1] == int(want.argmax())
    assert abs(lp - want[tok]) < 1e-4
    assert [a[0] for a in alts] == list(np.argsort(-want)[:3])
    assert all(abs(a[1] - want[a[0]]) < 1e-4 for a in alts)


def test_kv_slots_persist_across_restarts(model, tmp_path):
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    with engine_client.Engine(model, ctx=128, kv_slots=2, kv_dir=tmp_path) as eng:
        first = [e[1] for e in events(eng, prompt, max_tokens=5, slot=1) if e[0] == "data" and e[1] >= 0]
        turn2 = prompt + first + [7, 7]
        uninterrupted = [e[1] for e in events(eng, turn2, max_tokens=6, slot=1) if e[0] == "data" and e[1] >= 0]
    assert (tmp_path / ".coli_kv.1").exists() and not (tmp_path / ".coli_kv").exists()
    # replay turn 1 in a fresh state dir, restart, then continue: must equal the uninterrupted run
    state = tmp_path / "restart"
    state.mkdir()
    with engine_client.Engine(model, ctx=128, kv_slots=2, kv_dir=state) as eng:
        events(eng, prompt, max_tokens=5, slot=1)
    with engine_client.Engine(model, ctx=128, kv_slots=2, kv_dir=state) as eng:
        ev = events(eng, turn2, max_tokens=6, slot=1)
        assert ev[0] == ("accept", len(turn2), len(prompt) + 4)  # warm: nothing re-read but the new tokens
        assert [e[1] for e in ev if e[0] == "data" and e[1] >= 0] == uninterrupted
        assert eng.stderr_seen("restored KV slot 1")
        assert not eng.stderr_seen("a line the engine never writes", timeout=0.1)  # the wait can fail
    assert_clean_exit(eng)


def test_corrupt_or_foreign_kv_state_is_ignored(model, tmp_path):
    (tmp_path / ".coli_kv").write_bytes(b"COLIKV01" + b"\0" * 40)
    with engine_client.Engine(model, ctx=64, kv_dir=tmp_path) as eng:
        assert events(eng, [1, 2, 3], max_tokens=1)[0] == ("accept", 3, 0)
        assert eng.stderr_seen(lambda line: "another model" in line or "corrupt" in line)
    with engine_client.Engine(model, ctx=64, kv_dir=tmp_path) as eng:  # the good state written above loads
        assert events(eng, [1, 2, 3, 4], max_tokens=1)[0][2] == 3
    data = (tmp_path / ".coli_kv").read_bytes()
    (tmp_path / ".coli_kv").write_bytes(data[:-10])  # torn write
    with engine_client.Engine(model, ctx=64, kv_dir=tmp_path) as eng:
        assert events(eng, [1, 2, 3, 4], max_tokens=1)[0] == ("accept", 4, 0)
    assert_clean_exit(eng)
