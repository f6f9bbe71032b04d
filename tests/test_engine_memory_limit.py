"""The engine under a real address-space limit (RLIMIT_AS set on the running process): a SUBMIT
whose payload cannot be buffered is answered `ERROR out_of_memory` and dropped as it arrives,
instead of the reader spinning forever on a buffer it cannot grow, and the engine goes on
serving. Release build only: ASan reserves terabytes of shadow address space, so an
address-space limit cannot be applied to the sanitizer build."""
import resource
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
from colibri import engine_client  # noqa: E402
from engine_binaries import BINARIES, assert_clean_exit, build  # noqa: E402
from test_engine_hardening import convert  # noqa: E402


@pytest.fixture(scope="module")
def model(oracle_root, tmp_path_factory):
    return convert(oracle_root, "llama", tmp_path_factory.mktemp("rlimit") / "llama")


def vm_size_bytes(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize in /proc/PID/status")


def bounded(fn, timeout=60):
    """Runs fn in a thread; its result, or a failure if it has not returned within timeout."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            box["error"] = e
    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"no answer within {timeout} s: the engine is wedged"
    if "error" in box:
        raise box["error"]
    return box["value"]


def test_unbufferable_payload_is_out_of_memory_not_a_wedge(model, monkeypatch):
    monkeypatch.setattr(engine_client, "ENGINE", build(BINARIES["release"]))
    eng = engine_client.Engine(model, ctx=64)
    try:
        want = [e[1] for e in eng.generate([1, 2, 3], max_tokens=3) if e[0] == "data"]  # threads, arenas exist
        limit = vm_size_bytes(eng.proc.pid) + 8 * 1024 * 1024
        resource.prlimit(eng.proc.pid, resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
        payload = b"a" * (60 * 1024 * 1024)  # under the 64 MiB protocol cap, far over the limit
        rid = "big1"
        writer = threading.Thread(target=lambda: eng._write(b"SUBMIT %s %d\n" % (rid.encode(), len(payload)) + payload),
                                  daemon=True)
        writer.start()
        verb, f, body = bounded(eng.read_frame)
        assert (verb, f[0], f[1]) == ("ERROR", rid, "out_of_memory") and b"payload" in body
        writer.join(120)
        assert not writer.is_alive(), "the engine stopped reading its input"
        # still under the limit: a normal request is served, with the same answer as before
        got = bounded(lambda: [e[1] for e in eng.generate([1, 2, 3], max_tokens=3) if e[0] == "data"])
        assert got == want
    except BaseException:
        eng.proc.kill()  # a wedged engine would block close() behind the writer thread
        raise
    eng.close()
    assert_clean_exit(eng)
