"""Slow clients must not starve normal ones: request heads are read without a thread per
connection, the connection caps evict the connection that waited longest without a request,
and only connections inside requests count against a client (server_conns)."""
import json
import socket
import sys

import pytest

from server_helpers import COLI, ServerProc, model, request, stop_engine, resume_engine, template  # noqa: F401
from slowloris import Slowloris, measure

MID = "qwen3_moe"
ATTACKERS = 200
ATTACK_S = 20


def test_normal_clients_are_served_during_a_slowloris_attack(model, template):  # noqa: F811
    """200 dribbling connections, half from the normal client's own address (127.0.0.1) and
    half from 127.0.0.2, for 20 s with the server's default limits: >= 95 % of the normal
    requests (GET /v1/models, every fifth a chat completion) succeed."""
    with ServerProc(model, "--chat-template", template, "--no-kv-persist", "--quiet") as server:
        with Slowloris("127.0.0.1", server.port, ATTACKERS, sources=["127.0.0.2", "127.0.0.1"]) as attack:
            outcomes = measure("127.0.0.1", server.port, ATTACK_S, tick=0.25, model=MID)
        metrics = request(server.port, "GET", "/metrics")[2].decode()
    total, ok = sum(outcomes.values()), outcomes.get(200, 0)
    assert total >= 20, outcomes
    assert ok >= 0.95 * total, f"{ok} of {total} normal requests succeeded: {dict(outcomes)}"
    evicted = int(next(line.split()[1] for line in metrics.splitlines()
                       if line.startswith("colibri_connections_evicted_total")))
    assert attack.connects > ATTACKERS and evicted > 0  # the attack really filled the caps


def _open_stream(port, source):
    """A streaming chat request from `source`, sent completely; returns the socket."""
    body = json.dumps({"model": MID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                       "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return s


def _read_all(s):
    """A response up to the server's close or the last chunk of a chunked body."""
    out = b""
    while not out.partition(b"\r\n\r\n")[2].endswith(b"\r\n0\r\n\r\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        out += chunk
    return out


def _read_response(s):
    """One complete Content-Length response from a kept-alive socket."""
    out = b""
    while b"\r\n\r\n" not in out:
        out += s.recv(65536)
    head, _, body = out.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += s.recv(65536)
    return head


@pytest.fixture(scope="module")
def small(model, template):  # noqa: F811
    with ServerProc(model, "--chat-template", template, "--no-kv-persist", "--max-connections", "8",
                    "--max-connections-per-ip", "2", "--body-timeout", "1") as s:
        yield s


def test_per_address_cap_refuses_only_that_address(small):
    """Connections inside requests are never evicted: an address whose every connection is
    busy gets a 503 for a new one, while other addresses are served."""
    pid = small.engine_pid()
    stop_engine(pid)  # the requests stay inside the server until the engine resumes
    socks = []
    try:
        socks = [_open_stream(small.port, "127.0.0.2") for _ in range(2)]
        small.wait_health(lambda h: h["active"] + h["queued"] == 2)
        with socket.create_connection(("127.0.0.1", small.port), timeout=10, source_address=("127.0.0.2", 0)) as s:
            s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            out = _read_all(s)
        assert out.startswith(b"HTTP/1.1 503") and b"too_many_connections" in out
        assert request(small.port, "GET", "/v1/models")[0] == 200  # 127.0.0.1 is not affected
    finally:
        resume_engine(pid)
    for s in socks:
        with s:
            out = _read_all(s)
        assert out.startswith(b"HTTP/1.1 200") and b"data: [DONE]" in out


def test_idle_keepalive_connections_do_not_hold_threads(small):
    """More kept-alive connections than the per-address cap, each after a request: every new
    request still succeeds (the idle ones are evicted oldest first)."""
    conns = []
    try:
        for _ in range(12):  # more than --max-connections 8, too
            s = socket.create_connection(("127.0.0.1", small.port), timeout=10, source_address=("127.0.0.3", 0))
            s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            head = _read_response(s)
            assert head.startswith(b"HTTP/1.1 200"), head
            conns.append(s)
    finally:
        for s in conns:
            s.close()


def test_silent_connections_are_evicted_before_a_kept_alive_one(small):
    """At the per-address cap, connections that never sent a request make room first."""
    src = ("127.0.0.4", 0)
    with socket.create_connection(("127.0.0.1", small.port), timeout=10, source_address=src) as kept:
        for _ in range(2):
            kept.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert _read_response(kept).startswith(b"HTTP/1.1 200")
            silent = [socket.create_connection(("127.0.0.1", small.port), timeout=10, source_address=src)
                      for _ in range(3)]  # each one past the cap evicts an older silent one
            silent[-1].sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            assert _read_all(silent[-1]).startswith(b"HTTP/1.1 200")
            for s in silent:
                s.close()


@pytest.mark.parametrize("length", [100, 200_000])  # read by the connection thread / by a worker
def test_a_slow_body_gets_408(small, length):
    with socket.create_connection(("127.0.0.1", small.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n{\"prompt\":" % length)
        out = _read_all(s)
    assert out.startswith(b"HTTP/1.1 408") and b"request_timeout" in out


def _limited(args, files=300):
    """Runs `args` with an open-files limit of `files` (soft and hard, in the child only)."""
    import resource
    import subprocess

    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))
    return subprocess.run(args, preexec_fn=limit, capture_output=True, text=True, timeout=60, cwd=COLI.parent)


def test_connection_caps_respect_the_open_files_limit(model):  # noqa: F811
    r = _limited([sys.executable, str(COLI), "serve", "--model", str(model), "--max-connections", "150"])
    assert r.returncode == 2 and "--max-connections 150 needs 364 open files" in r.stderr and "ulimit -n" in r.stderr
    code = ("import argparse; from colibri.server import config as server_config; p = argparse.ArgumentParser(); "
            "server_config.add_arguments(p); "
            f"args = p.parse_args(['--model', {str(model)!r}, '--no-kv-persist']); "
            "print(server_config.resolve(args).max_connections)")
    r = _limited([sys.executable, "-c", code])
    assert r.returncode == 0 and r.stdout.split() == ["118"], r.stderr  # the default shrinks to fit (300 - 64) / 2
