"""The scale-out recipe of docs/scaling.md, run as written: nginx (docs/nginx-colibri.conf) in
front of two `coli serve` instances on 127.0.0.1. A session keeps its instance (and so its KV
slot: the second turn reuses the first one's tokens), a killed instance's sessions fail over to
the other, and an instance's admission 429 reaches the client instead of being retried. nginx
runs from its own prefix under tmp_path (pid, logs, temporaries), on an unprivileged port."""
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from server_helpers import ServerProc, convert, post_json, resume_engine, stop_engine

ROOT = Path(__file__).resolve().parents[1]
MID = "llama"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nginx:
    def __init__(self, prefix, listen, upstreams):
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        assert os.path.exists(nginx), "nginx is missing: apt-get install nginx (the CI script installs it)"
        prefix.mkdir(parents=True, exist_ok=True)
        conf = (ROOT / "docs" / "nginx-colibri.conf").read_text()
        for k, v in {"@PREFIX@": str(prefix), "@LISTEN@": listen, "@A@": upstreams[0], "@B@": upstreams[1]}.items():
            conf = conf.replace(k, v)
        if os.geteuid() == 0:  # a root master would hand the workers to `nobody`, who cannot enter tmp_path
            conf = "user root;\n" + conf
        (prefix / "nginx.conf").write_text(conf)
        self.port = int(listen.rsplit(":", 1)[1])
        # -e: the error log nginx opens before it has read the configuration
        self.proc = subprocess.Popen([nginx, "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-e",
                                      str(prefix / "error.log"), "-g", "daemon off;"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.prefix = prefix
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"nginx exited: {self.proc.stderr.read().decode()}"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("nginx did not start listening")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful: workers finish, then the master exits
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def farm(oracle_root, tmp_path_factory, tmp_path):
    model = convert(oracle_root, MID, tmp_path_factory.mktemp("farm") / MID)
    args = ("--kv-slots", "2", "--parallel", "1", "--max-queue", "0", "--no-kv-persist")
    a, b = ServerProc(model, *args), None
    nginx = None
    try:
        b = ServerProc(model, *args)
        nginx = Nginx(tmp_path / "nginx", f"127.0.0.1:{free_port()}", [f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"])
        yield nginx, {f"127.0.0.1:{a.port}": a, f"127.0.0.1:{b.port}": b}
    finally:
        if nginx:
            nginx.stop()
        for s in (a, b):
            if s:
                s.stop()


def ask(nginx, session, prompt, timeout=60):
    status, headers, body = post_json(nginx.port, "/v1/completions",
                                      {"model": MID, "prompt": prompt, "max_tokens": 6, "temperature": 0},
                                      headers={"X-Session-Id": session}, timeout=timeout)
    return status, headers, body


def sessions_on_both(nginx):
    """Two session ids that the hash places on different instances: {upstream: session}."""
    seen = {}
    for i in range(64):
        sid = f"user-{i}"
        status, headers, _ = ask(nginx, sid, "hi")
        assert status == 200
        seen.setdefault(headers["x-colibri-upstream"], sid)
        if len(seen) == 2:
            return seen
    raise AssertionError(f"64 sessions all hashed to {list(seen)}")


def test_session_affinity_keeps_the_kv_slot(farm):
    nginx, servers = farm
    placed = sessions_on_both(nginx)
    for upstream, sid in placed.items():
        first = "A conversation about the sea and its many moods, turn one"
        s1, h1, b1 = ask(nginx, sid, first)
        s2, h2, _ = ask(nginx, sid, first + b1["choices"][0]["text"] + " and more")
        assert s1 == s2 == 200
        assert h1["x-colibri-upstream"] == h2["x-colibri-upstream"] == upstream
        assert int(h2["x-colibri-reused-tokens"]) > 5  # the instance still held the first turn


def test_failover_when_an_instance_is_killed(farm):
    nginx, servers = farm
    placed = sessions_on_both(nginx)
    (dead, sid), (alive, other) = sorted(placed.items())
    srv = servers[dead]
    os.killpg(srv.proc.pid, signal.SIGKILL)  # the whole instance: server and engine
    srv.proc.wait(timeout=10)
    for _ in range(3):
        status, headers, body = ask(nginx, sid, "still there?")
        assert status == 200, body
        assert headers["x-colibri-upstream"].split(", ")[-1] == alive
    status, headers, _ = ask(nginx, other, "and you?")
    assert status == 200 and headers["x-colibri-upstream"] == alive


def test_admission_429_is_passed_through_not_retried(farm):
    nginx, servers = farm
    placed = sessions_on_both(nginx)
    (busy, sid), (idle, _) = sorted(placed.items())
    srv, other = servers[busy], servers[idle]
    done_before = other.health()["requests"]["completed"]
    pid = srv.engine_pid()
    stop_engine(pid)  # --parallel 1 --max-queue 0: the first request holds the instance
    try:
        first = {}
        t = threading.Thread(target=lambda: first.update(r=ask(nginx, sid, "the long one")), daemon=True)
        t.start()
        srv.wait_health(lambda h: h["requests"]["active"] == 1)
        status, headers, body = ask(nginx, sid, "one more")
        assert status == 429 and body["error"]["code"] == "queue_full"
        assert int(headers["retry-after"]) >= 1 and headers["x-colibri-upstream"] == busy
    finally:
        resume_engine(pid)
    t.join(60)
    assert first["r"][0] == 200
    assert other.health()["requests"]["completed"] == done_before  # nothing went to the other instance
    log = (nginx.prefix / "access.log").read_text()
    assert log.count('"POST /v1/completions HTTP/1.1" 429') == 1  # logged once: no second attempt
