"""`coli serve` (and `coli run` / `coli chat`) when the engine cannot load: a --ram too small for
the dense trunk, a damaged container file, an engine binary that fails at start. The first load
failing ends `coli serve` with the engine's error; after a crash mid-serve, an engine that keeps
failing to load the same way ends the retries with the error in every answer and in /health.
Real server processes, real engines, real clients; every wait polls with a generous deadline."""
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import openai
import pytest

from server_helpers import COLI, ServerProc, model, post_json, request, template  # noqa: F401

RAM_MESSAGE = "--ram 0.0001 GB cannot hold dense"


def serve(model_dir, *args, env=None, timeout=120):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("COLI_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, str(COLI), "serve", "--model", str(model_dir), "--port", "0",
                           "--no-kv-persist", *args], capture_output=True, text=True, env=full_env, timeout=timeout)


def damaged_copy(model_dir, tmp_path):
    """A copy of the container whose tokenizer.json is cut short: only the engine's load finds it
    (the launcher's start-up checks cover the manifest and the shards)."""
    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    tok = broken / "tokenizer.json"
    tok.write_bytes(tok.read_bytes()[:3000])
    return broken


def client(port):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60)


def wait_for(pred, what, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


def test_serve_with_a_ram_too_small_exits_with_the_engines_error(model):  # noqa: F811
    r = serve(model, "--ram", "0.0001")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-2:]  # the engine's error, then what to do
    assert "(load_refused)" in last[0] and RAM_MESSAGE in last[0] and "give at least --ram" in last[0]
    assert "start coli serve again" in last[1]
    assert r.stderr.count("engine fault (load_failed)") == 1  # tried once, not restarted


def test_serve_with_a_damaged_container_exits_with_the_engines_error(model, tmp_path):  # noqa: F811
    r = serve(damaged_copy(model, tmp_path))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "(load_refused)" in r.stderr and "tokenizer.json" in r.stderr.strip().splitlines()[-2]
    assert r.stderr.count("engine fault (load_failed)") == 1


# An engine that loads until the test says so, then fails as asked: a client can be queued
# behind the load first.
SCRIPT = """#!/bin/sh
while [ ! -e "{gate}" ]; do sleep 0.02; done
echo "colibri: {message}" >&2
{ending}
"""


@pytest.mark.parametrize("ending,kind", [("exit 1", "load_refused"), ("exit 2", "bad_arguments"),
                                         ("kill -SEGV $$", "load_crashed")])
def test_a_request_waiting_on_a_failing_first_load_gets_the_error_and_serve_exits(model, tmp_path,  # noqa: F811
                                                                                  ending, kind):
    gate, message = tmp_path / "go", f"this engine cannot start ({kind})"
    engine = tmp_path / "engine.sh"
    engine.write_text(SCRIPT.format(gate=gate, message=message, ending=ending))
    engine.chmod(0o755)
    srv = ServerProc(model, "--no-kv-persist", env={"COLI_ENGINE": str(engine)}, wait_ready=False)
    try:
        assert srv.health()["status"] == "loading"
        result = {}

        def ask():
            try:
                client(srv.port).completions.create(model=model.name, prompt="hi", max_tokens=2)
            except openai.APIStatusError as e:
                result["error"] = e
        t = threading.Thread(target=ask, daemon=True)
        t.start()
        wait_for(lambda: srv.health()["requests"]["queued"] == 1, "the request queued behind the load")
        gate.touch()
        t.join(60)
        err = result["error"]
        assert err.status_code == 503 and err.body["code"] == "engine_load_failed"
        assert f"({kind})" in err.body["message"] and message in err.body["message"]  # loopback: details
        assert "retry-after" not in err.response.headers
        srv.proc.wait(timeout=60)
        assert srv.proc.returncode != 0
        log = srv.log()
        assert f"({kind}): " in log and f"colibri: {message}" in log and "start coli serve again" in log
        assert "Traceback" not in log
    finally:
        srv.stop()


def test_an_engine_that_fails_to_load_after_a_crash_ends_the_retries(model, template, tmp_path):  # noqa: F811
    mine = tmp_path / "model"
    shutil.copytree(model, mine)
    with ServerProc(mine, "--chat-template", template, "--no-kv-persist") as srv:
        c = client(srv.port)
        ok = c.chat.completions.create(model=mine.name, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert ok.choices[0].message.content is not None
        tok = mine / "tokenizer.json"
        tok.write_bytes(tok.read_bytes()[:3000])  # damaged while the engine runs: only a restart reads it
        pid = srv.engine_pid()
        os.kill(pid, signal.SIGKILL)
        h = srv.wait_health(lambda h: h["engine"]["load_error"] is not None, timeout=120)
        assert h["status"] == "failed" and h["engine"]["pid"] is None
        err = h["engine"]["load_error"]
        assert err["kind"] == "load_refused" and "tokenizer.json" in err["message"] and "coli serve again" in err["fix"]
        status, headers, _ = request(srv.port, "GET", "/health")
        assert status == 503 and "retry-after" not in headers
        with pytest.raises(openai.APIStatusError) as e:
            c.chat.completions.create(model=mine.name, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert e.value.status_code == 503 and e.value.body["code"] == "engine_load_failed"
        assert "tokenizer.json" in e.value.body["message"]
        status, _, body = post_json(srv.port, "/v1/messages", {"model": mine.name, "max_tokens": 2,
                                                              "messages": [{"role": "user", "content": "hi"}]})
        assert status == 503 and body["type"] == "error" and "tokenizer.json" in body["error"]["message"]
        assert srv.proc.poll() is None  # still serving its answers: the operator decides
        log = srv.log()
        assert "SIGKILL" in log and log.count("engine fault (load_failed)") == 3  # MAX_SAME tries
        assert "after a restart, 3 attempts in a row); not retrying" in log and "coli serve again" in log
        restarts = h["engine"]["restarts"]
    assert restarts == 1


def test_a_crash_with_a_loadable_model_is_still_restarted(model, template):  # noqa: F811
    with ServerProc(model, "--chat-template", template, "--no-kv-persist") as srv:
        for _ in range(2):
            pid = srv.engine_pid()
            os.kill(pid, signal.SIGKILL)
            h = srv.wait_health(lambda h: h["status"] == "ok" and h["engine"]["pid"] not in (None, pid), timeout=120)
            assert h["engine"]["load_error"] is None
        ok = client(srv.port).chat.completions.create(model=model.name, max_tokens=2,
                                                      messages=[{"role": "user", "content": "hi"}])
        assert ok.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("cmd", ["run", "chat"])
@pytest.mark.parametrize("breakage", ["ram", "tokenizer"])
def test_run_and_chat_print_the_engines_error_and_exit_non_zero(model, tmp_path, cmd, breakage):  # noqa: F811
    target, extra = (model, ["--ram", "0.0001"]) if breakage == "ram" else (damaged_copy(model, tmp_path), [])
    args = [cmd, "--model", str(target), "--raw", *extra] + (["hi", "--max-tokens", "2"] if cmd == "run" else [])
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLI_")}
    r = subprocess.run([sys.executable, str(COLI), *args], capture_output=True, text=True, env=env, input="hi\n",
                       timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr and r.stdout.strip() == ""
    assert (RAM_MESSAGE if breakage == "ram" else "tokenizer.json") in r.stderr
    assert f"coli {cmd}:" in r.stderr
