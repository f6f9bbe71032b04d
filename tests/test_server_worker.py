"""The server's engine worker under faults that a real engine cannot be made to produce on cue:
an engine that cannot be started, odd or malformed frames, a silent engine, bad text, a bug in
the worker. A scripted engine (fake_engine.py) stands in for build/colibri; nothing depends on
timing except the liveness deadline itself, whose margins are wide."""
import os
import select
import signal
import sys
import time
from pathlib import Path

import pytest

from server_helpers import ROOT, model  # noqa: F401

from colibri.server import app as server_app  # noqa: E402
from colibri.server import config as server_config  # noqa: E402
from colibri.server.scheduler import Job, Scheduler, ServedEngine, SlotTable, Unavailable  # noqa: E402
from colibri.engine_client import EngineError  # noqa: E402
from colibri.server.generate import engine_error, load_failed_error  # noqa: E402
from colibri.server.metrics import Metrics  # noqa: E402

FAKE = Path(__file__).with_name("fake_engine.py")
SECRET_PATH = "/opt/secret-place/build/colibri"


class Harness:
    """A Scheduler whose engine factory plays `modes` in turn (the last one repeats); a mode is
    a fake_engine.py MODE or an exception to raise instead of starting the engine."""

    def __init__(self, model_dir, modes, engine_timeout=None):
        self.modes, self.logs, self.started = list(modes), [], []

        def factory():
            mode = self.modes.pop(0) if len(self.modes) > 1 else self.modes[0]
            self.started.append(mode)
            if isinstance(mode, BaseException):
                raise mode
            return ServedEngine(model_dir, command=[sys.executable, str(FAKE), mode])
        self.sched = Scheduler(factory, 8, SlotTable(4), Metrics(), self.logs.append, engine_timeout=engine_timeout)

    def run(self, payload="hi", max_tokens=3, key_text="hi", timeout=30):
        """Enqueues one job and returns its events up to the final end/error."""
        job = Job(payload, {"max_tokens": max_tokens}, None, key_text)
        self.sched.enqueue(job)
        events, deadline = [], time.monotonic() + timeout
        try:
            while not events or events[-1][0] not in ("end", "error"):
                left = deadline - time.monotonic()
                assert left > 0, f"the job got no final event; so far {events}; log: {self.logs}"
                select.select([job], [], [], left)
                events += job.drain()
            return events
        finally:
            job.close()

    def wait(self, pred, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.sched.status()
            if pred(st):
                return st
            time.sleep(0.02)
        raise AssertionError(f"scheduler never reached the state; last {self.sched.status()}; log {self.logs}")

    def close(self):
        self.sched.close()


@pytest.fixture
def harness(tmp_path):
    made = []

    def make(modes, **kw):
        h = Harness(tmp_path, modes, **kw)
        made.append(h)
        return h
    yield make
    for h in made:
        h.close()


def final(events):
    return events[-1]


def busy(n=0):
    """A load refused because another engine holds --kv-dir (exit 3): worth retrying."""
    return EngineError("load_failed", f"the engine exited with code 3 ({n}); KV dir {SECRET_PATH} is in use",
                       exit_code=3, stderr=[f"colibri: the KV directory {SECRET_PATH} is in use"])


def refused(msg="--ram 0.0001 GB cannot hold dense 0.3 MB"):
    """A load the engine refused (exit 1), as for a --ram too small for the dense trunk."""
    return EngineError("load_failed", f"the engine exited with code 1; its last messages:\ncolibri: {msg}",
                       exit_code=1, stderr=[f"colibri: {msg}"])


def wait_job(job):
    select.select([job], [], [], 30)
    ev = job.drain()
    job.close()
    return ev


def kill_engine(h):
    pid = h.wait(lambda st: st["state"] == "ready")["pid"]
    os.kill(pid, signal.SIGKILL)
    return pid


def test_an_engine_that_cannot_start_at_all_ends_the_retries(harness):
    h = harness([PermissionError(13, "Permission denied", SECRET_PATH), "ok"])
    waiting = Job("hi", {"max_tokens": 2}, None, "hi")
    h.sched.enqueue(waiting)  # queued while the engine loads: the failed start fails it
    h.sched.start()
    ev = wait_job(waiting)
    assert ev and ev[-1][:2] == ("error", "engine_load_failed")
    st = h.wait(lambda st: st["gave_up"] is not None)
    assert st["gave_up"].kind == "cannot_start" and not st["ever_loaded"] and st["worker_alive"]
    assert "PermissionError" in st["last_error"] and SECRET_PATH in st["last_error"]
    assert SECRET_PATH not in st["last_error_public"]
    public, private = load_failed_error(ev[-1][2], False), load_failed_error(ev[-1][2], True)
    assert public.status == private.status == 503 and public.code == "engine_load_failed"
    assert SECRET_PATH not in public.message and SECRET_PATH in private.message
    assert "Retry-After" not in public.headers  # only the operator can fix it
    with pytest.raises(Unavailable) as e:
        h.sched.enqueue(Job("hi", {}, None, "hi"))
    assert e.value.failure is st["gave_up"]
    assert h.started == [h.started[0]]  # no second try


def test_a_refused_first_load_is_not_retried(harness):
    h = harness([refused(), "ok"])
    h.sched.start()
    st = h.wait(lambda st: st["gave_up"] is not None)
    assert st["gave_up"].kind == "load_refused"
    assert st["gave_up"].reason == "colibri: --ram 0.0001 GB cannot hold dense 0.3 MB"  # the engine's own line
    assert st["state"] == "failed" and len(h.started) == 1


def test_the_same_load_failure_after_a_crash_ends_the_retries(harness):
    from colibri.server.load_policy import MAX_SAME
    h = harness(["ok", refused(), refused(), refused(), "ok"])
    h.sched.start()
    kill_engine(h)
    st = h.wait(lambda st: st["gave_up"] is not None, timeout=60)
    assert len(h.started) == 1 + MAX_SAME and st["ever_loaded"] and st["gave_up"].kind == "load_refused"
    with pytest.raises(Unavailable):
        h.sched.enqueue(Job("hi", {}, None, "hi"))
    assert any("not retrying" in m and "--ram 0.0001" in m and "coli serve again" in m for m in h.logs)


def test_different_load_failures_after_a_crash_keep_retrying(harness):
    h = harness(["ok", refused("a"), refused("b"), refused("a"), "ok"])
    h.sched.start()
    pid = kill_engine(h)
    # pid is None (not the old one) from the kill until the scheduler notices, while the state
    # still says ready: wait for a live new engine
    st = h.wait(lambda st: st["state"] == "ready" and st["pid"] not in (None, pid), timeout=60)
    assert st["gave_up"] is None and len(h.started) == 5
    assert final(h.run())[0] == "end"


def test_a_load_failure_no_retry_can_fix_ends_the_retries_after_a_crash(harness):
    bad_args = EngineError("load_failed", "the engine exited with code 2", exit_code=2,
                           stderr=["colibri: unknown argument"])
    h = harness(["ok", bad_args, "ok"])
    h.sched.start()
    kill_engine(h)
    st = h.wait(lambda st: st["gave_up"] is not None)
    assert st["gave_up"].kind == "bad_arguments" and len(h.started) == 2


@pytest.mark.parametrize("mode,kind", [("odd", "internal_error"), ("garbage", "bad_frame")])
def test_odd_frame_fails_only_that_job_and_restarts_the_engine(harness, mode, kind):
    h = harness([mode, "ok"])
    h.sched.start()
    h.wait(lambda st: st["state"] == "ready")
    pid = h.sched.status()["pid"]
    ev = h.run()
    assert final(ev)[:2] == ("error", kind)
    err = engine_error(*final(ev)[1:])
    assert err.status == 500 and err.code == "internal_error" and "Traceback" not in err.message
    for _ in range(2):  # later jobs are served by a fresh engine
        assert final(h.run())[0] == "end"
    st = h.sched.status()
    assert st["restarts"] == 1 and st["pid"] != pid and st["state"] == "ready"
    assert st["last_error_public"] and (("ValueError" in st["last_error"]) if mode == "odd"
                                        else ("malformed frame" in st["last_error"]))


def test_text_the_engine_cannot_take_fails_only_that_job(harness):
    h = harness(["ok"])
    h.sched.start()
    ev = h.run(payload="a\ud800b", key_text="a")
    assert final(ev)[:2] == ("error", "internal_error")
    assert final(h.run())[0] == "end"
    assert h.sched.status()["restarts"] == 0  # nothing reached the engine, so it was kept


def test_a_bug_in_the_worker_fails_only_that_job(harness, monkeypatch):
    h = harness(["ok"])
    real_pick = h.sched.slots.pick

    def pick(prompt):
        if prompt == "boom":
            raise LookupError("a bug in the slot table")
        return real_pick(prompt)
    monkeypatch.setattr(h.sched.slots, "pick", pick)
    h.sched.start()
    ev = h.run(key_text="boom")
    assert final(ev)[:2] == ("error", "internal_error")
    assert final(h.run())[0] == "end"
    assert "LookupError" in h.sched.status()["last_error"]


def test_a_silent_engine_is_killed_and_restarted(harness):
    h = harness(["silent", "ok"], engine_timeout=0.5)
    h.sched.start()
    h.wait(lambda st: st["state"] == "ready")
    pid = h.sched.status()["pid"]
    ev = h.run()
    assert final(ev)[:2] == ("error", "engine_timeout")
    err = engine_error(*final(ev)[1:])
    assert err.status == 504 and err.code == "engine_timeout" and "pid" not in err.message
    assert final(h.run())[0] == "end"
    st = h.sched.status()
    assert st["restarts"] == 1 and st["pid"] != pid and "--engine-timeout" in st["last_error"]


def test_the_deadline_counts_silence_not_the_whole_turn(harness):
    # 8 frames 0.1 s apart: the turn lasts longer than the deadline, no silence comes near it
    h = harness(["slow:0.1"], engine_timeout=0.6)
    h.sched.start()
    ev = h.run(max_tokens=8)
    assert final(ev)[0] == "end" and sum(1 for e in ev if e[0] == "data") == 8
    assert h.sched.status()["restarts"] == 0


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_health_tells_the_truth_when_the_worker_is_gone(harness, model, monkeypatch):  # noqa: F811
    settings = server_config.Settings(model_dir=model, model_id="m")
    app = server_app.App(settings, lambda msg: None)
    h = harness(["ok"])
    app.sched = h.sched
    h.sched.start()
    h.wait(lambda st: st["state"] == "ready")
    code, body = app.health()
    assert code == 200 and body["engine"]["worker"] == "running"

    def die():
        raise SystemExit("worker gone")  # not an Exception: nothing may catch it
    monkeypatch.setattr(h.sched, "_step", die)
    h.wait(lambda st: not st["worker_alive"])
    code, body = app.health()
    assert code == 503 and body["status"] == "failed" and body["engine"]["worker"] == "stopped"
    with pytest.raises(Unavailable):  # refused at once instead of waiting out the queue timeout
        h.sched.enqueue(Job("hi", {}, None, "hi"))


def test_health_hides_fault_details_unless_allowed(harness, model):  # noqa: F811
    settings = server_config.Settings(model_dir=model, model_id="m")
    app = server_app.App(settings, lambda msg: None)
    h = harness([busy(), "ok"])
    app.sched = h.sched
    h.sched.start()
    h.wait(lambda st: st["state"] == "ready")
    _, public = app.health(detail=False)
    _, private = app.health(detail=True)
    assert SECRET_PATH not in str(public) and public["engine"]["last_error"] and not public["engine"]["details"]
    assert SECRET_PATH in private["engine"]["last_error"] and private["engine"]["details"]


def test_restarts_back_off_while_the_engine_keeps_failing(harness):
    from colibri.server.scheduler import restart_delay
    assert [restart_delay(n) for n in range(1, 9)] == [0, 1, 2, 4, 8, 16, 30, 30]
    h = harness([busy(1), busy(2), busy(3), "ok"])  # retried for as long as another engine holds --kv-dir
    waits, pause = [], h.sched._pause

    def recorded(seconds):
        waits.append(seconds)
        return pause(seconds)
    h.sched._pause = recorded
    h.sched.start()
    h.wait(lambda st: st["state"] == "ready", timeout=60)
    assert [type(m).__name__ for m in h.started] == ["EngineError"] * 3 + ["str"]
    assert waits[:4] == [0, 0, 1, 2]  # before each start: the first two at once, then backing off
    assert h.sched.failures == 3  # the count resets only when the engine finishes a turn
    assert final(h.run())[0] == "end" and h.sched.failures == 0


def test_health_gives_the_load_error_and_hides_its_message_unless_allowed(harness, model):  # noqa: F811
    settings = server_config.Settings(model_dir=model, model_id="m")
    app = server_app.App(settings, lambda msg: None)
    h = harness([refused(f"{SECRET_PATH}: damaged")])
    app.sched = h.sched
    h.sched.start()
    h.wait(lambda st: st["gave_up"] is not None)
    code, public = app.health(detail=False)
    _, private = app.health(detail=True)
    assert code == 503 and public["status"] == "failed"
    err = public["engine"]["load_error"]
    assert err["kind"] == "load_refused" and err["message"] is None
    assert SECRET_PATH not in str(public) and "coli serve again" in public["engine"]["load_error"]["fix"]
    assert private["engine"]["load_error"]["message"] == f"colibri: {SECRET_PATH}: damaged"
