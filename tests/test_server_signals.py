"""The engine never outlives `coli serve`: it runs in a session of its own (so a terminal's
Ctrl-C reaches only the launcher), and the launcher ends it before exiting, after one signal
(graceful) or two (at once), also while the engine is still loading."""
import os
import signal
import time
from pathlib import Path

import pytest

from server_helpers import ServerProc, model, template  # noqa: F401

FAKE = Path(__file__).with_name("fake_engine.py")


def children_of(pid):
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def wait_engine(server, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in children_of(server.proc.pid):
            try:
                if "serve" in Path(f"/proc/{c}/cmdline").read_bytes().decode(errors="replace"):
                    return c
            except OSError:
                pass
        time.sleep(0.05)
    raise AssertionError(f"no engine process appeared\n{server.log()}")


def running(pid):
    """True while `pid` exists and is not a zombie (exited, waiting to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("signals", [1, 2])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_an_engine_still_loading_ends_with_the_launcher(model, tmp_path, signals, sig):  # noqa: F811
    env = {"COLI_ENGINE": str(FAKE), "COLI_FAKE_MODE": "loading"}
    server = ServerProc(model, "--no-kv-persist", "--shutdown-timeout", "1", env=env, log_dir=tmp_path,
                        wait_ready=False)
    try:
        engine = wait_engine(server)
        for _ in range(signals):
            server.proc.send_signal(sig)
            time.sleep(0.2)
        server.proc.wait(timeout=30)
        assert not running(engine), f"engine {engine} outlived the launcher\n{server.log()}"
    finally:
        server.stop()
        for c in [c for c in [locals().get("engine")] if c and running(c)]:
            os.kill(c, signal.SIGKILL)


def test_a_second_signal_ends_a_busy_engine_before_exiting(model, template):  # noqa: F811
    """A stopped engine (SIGSTOP) ignores the graceful close; the second SIGTERM kills it and
    the launcher waits until it is gone."""
    with ServerProc(model, "--chat-template", template, "--no-kv-persist", "--shutdown-timeout", "30") as server:
        engine = server.engine_pid()
        os.kill(engine, signal.SIGSTOP)
        try:
            server.proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            server.proc.send_signal(signal.SIGTERM)
            server.proc.wait(timeout=20)
            assert server.proc.returncode == 128 + signal.SIGTERM
            assert not running(engine), server.log()
        finally:
            if running(engine):
                os.kill(engine, signal.SIGKILL)
