"""KV persistence written incrementally and off the request path: after the first turn of a
slot its base file stays as it is and each later turn appends only its new positions to the
slot's log (docs/protocol.md, "KV persistence"). The log survives kill -9: a restarted engine
resumes byte-identical to an uninterrupted run, and a record torn by the kill takes the slot
back one turn, never to a mixed state."""
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
from colibri import engine_client  # noqa: E402

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


@pytest.fixture(scope="module")
def model(oracle_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("kvlog") / "qwen3_moe"
    subprocess.run([sys.executable, str(ROOT / "coli"), "convert", str(Path(oracle_root) / "qwen3_moe" / "hf"), str(out),
                    "--experts", "bf16", "--dense", "bf16"], check=True, capture_output=True)
    return out


def turn(eng, ids, n):
    ev = list(eng.generate(ids, max_tokens=n, temp=0, ignore_eos=1))
    return ev[0], [e[1] for e in ev if e[0] == "data" and e[1] >= 0]


def wait_logged(log, n, timeout=30):
    """Waits until the writer thread has appended the record that ends at position n."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        data = log.read_bytes() if log.exists() else b""
        # records are appended whole and fdatasynced; the newest head's n1 is what the slot holds
        heads = [struct.unpack_from("<IIII", data, i) for i in range(24, len(data) - 15, 4)
                 if struct.unpack_from("<I", data, i)[0] == 0x3143524B]
        if heads and heads[-1][2] == n:
            return
        time.sleep(0.02)
    raise AssertionError(f"the log never reached {n} positions")


def wait_logged_base(base, timeout=30):
    deadline = time.monotonic() + timeout
    while not base.exists():
        assert time.monotonic() < deadline, "no base file was written"
        time.sleep(0.02)


def three_turns(eng):
    a, first = turn(eng, PROMPT, 5)
    t2 = PROMPT + first + [7, 7]
    b, second = turn(eng, t2, 6)
    t3 = t2 + second + [8, 8]
    return t2, t3, first, second


def test_turns_append_to_the_log_and_survive_kill_9(model, tmp_path):
    with engine_client.Engine(model, ctx=128, kv_slots=1) as ref:  # no --kv-dir: the uninterrupted run
        t2, t3, _, _ = three_turns(ref)
        _, want = turn(ref, t3, 6)
    d = tmp_path / "kv"
    d.mkdir()
    eng = engine_client.Engine(model, ctx=128, kv_slots=1, kv_dir=d)
    try:
        _, first = turn(eng, PROMPT, 5)
        base = d / ".coli_kv"
        wait_logged_base(base)  # written to a temporary and renamed: it appears whole
        base_after_1 = base.read_bytes()
        _, second = turn(eng, t2, 6)
        wait_logged(d / ".coli_kv.log", len(t2) + 5)
        assert base.read_bytes() == base_after_1  # the second turn did not rewrite the base
        os.kill(eng.proc.pid, signal.SIGKILL)
        eng.proc.wait(timeout=10)
    finally:
        eng.kill()
    torn = tmp_path / "torn"
    shutil.copytree(d, torn)
    log = torn / ".coli_kv.log"
    log.write_bytes(log.read_bytes()[:-10])  # a record the kill cut short

    with engine_client.Engine(model, ctx=128, kv_slots=1, kv_dir=d) as warm:
        accept, got = turn(warm, t3, 6)
        assert accept == ("accept", len(t3), len(t2) + 5) and got == want  # resumed where it was killed
        assert warm.stderr_seen(lambda line: "restored KV slot 0" in line and "log" in line)
    with engine_client.Engine(model, ctx=128, kv_slots=1, kv_dir=torn) as back:
        accept, got = turn(back, t3, 6)
        assert accept == ("accept", len(t3), len(PROMPT) + 4) and got == want  # one turn back, same tokens
        assert back.stderr_seen("cut off")


def test_many_turns_compact_into_a_new_base(model, tmp_path):
    """A log that outgrows its base is folded into a new base; the slot still restores exactly."""
    with engine_client.Engine(model, ctx=400, kv_slots=1, kv_dir=tmp_path) as eng:
        ids = PROMPT
        for i in range(12):
            _, out = turn(eng, ids, 20)
            ids = ids + out + [7]
            if i == 0:
                wait_logged_base(tmp_path / ".coli_kv")
                first_base = (tmp_path / ".coli_kv").stat().st_size
    assert (tmp_path / ".coli_kv").stat().st_size > 4 * first_base  # rewritten with the later turns
    with engine_client.Engine(model, ctx=400, kv_slots=1) as ref:
        want = turn(ref, ids, 5)[1]
    with engine_client.Engine(model, ctx=400, kv_slots=1, kv_dir=tmp_path) as warm:
        accept, got = turn(warm, ids, 5)
    assert accept[2] == len(ids) - 2 and got == want  # the last answer's last token was never fed back
