"""`coli serve` security: API keys, DNS-rebinding Host check, CORS, body cap, read deadlines,
connection cap, and the settings it refuses."""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time

import anthropic
import openai
import pytest

from server_helpers import COLI, ServerProc, model, raw_exchange, request, template  # noqa: F401

MID = "qwen3_moe"
KEY = "s3cret-key"
HI = [{"role": "user", "content": "hi"}]
ROOT = COLI.parent
from colibri.server import config as server_config  # noqa: E402
from colibri.errors import UserError  # noqa: E402


@pytest.fixture(scope="module")
def server(model, template):  # noqa: F811
    with ServerProc(model, "--chat-template", template, "--no-kv-persist", "--api-key", KEY,
                    "--cors-origin", "https://app.example.com", "--header-timeout", "1", "--body-timeout", "1",
                    "--keepalive-timeout", "1", "--max-connections", "6", "--max-body-mb", "0.01") as s:
        yield s


def auth(key=KEY):
    return {"Authorization": f"Bearer {key}"}


def test_api_key_with_the_official_clients(server):
    for key in ("wrong", KEY[:-1], KEY + "x"):
        bad = openai.OpenAI(base_url=server.base + "/v1", api_key=key, max_retries=0, timeout=30)
        with pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(model=MID, messages=HI, max_tokens=2)
    good = openai.OpenAI(base_url=server.base + "/v1", api_key=KEY, max_retries=0, timeout=30)
    assert good.chat.completions.create(model=MID, messages=HI, max_tokens=2, temperature=0).usage.completion_tokens == 2
    ant = anthropic.Anthropic(base_url=server.base, api_key=KEY, max_retries=0, timeout=30)  # sends x-api-key
    assert ant.messages.create(model=MID, max_tokens=2, messages=HI, extra_body={"temperature": 0}).usage.output_tokens == 2
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.base, api_key="nope", max_retries=0).messages.create(
            model=MID, max_tokens=2, messages=HI)


def test_missing_key_and_public_health(server):
    s, h, body = request(server.port, "POST", "/v1/completions", b'{"prompt":"x"}')
    assert s == 401 and b"invalid_api_key" in body and h["www-authenticate"].startswith("Bearer")
    assert request(server.port, "GET", "/health")[0] == 200
    for path in ("/metrics", "/v1/models", f"/v1/models/{MID}"):
        assert request(server.port, "GET", path)[0] == 401
        assert request(server.port, "GET", path, headers=auth())[0] == 200
    assert request(server.port, "GET", "/v1/models", headers={"x-api-key": KEY})[0] == 200


@pytest.mark.parametrize("host,ok", [
    ("evil.example", False), ("evil.example:{port}", False), ("127.0.0.1.nip.io", False),
    ("localhost:{port}", True), ("127.0.0.1:{port}", True), ("[::1]:{port}", True), ("app.localhost", True),
])
def test_host_header_check(server, host, ok):
    s, _, body = request(server.port, "GET", "/v1/models", headers={**auth(), "Host": host.format(port=server.port)})
    assert (s == 200) == ok, body
    if not ok:
        assert s == 403 and b"host_not_allowed" in body


def test_cors(server):
    def preflight(origin):
        return request(server.port, "OPTIONS", "/v1/chat/completions",
                       headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                "Access-Control-Request-Headers": "authorization, content-type"})
    for origin in ("https://app.example.com", "http://localhost:5173", "http://127.0.0.1:8080"):
        s, h, _ = preflight(origin)
        assert s == 204 and h["access-control-allow-origin"] == origin
        assert "POST" in h["access-control-allow-methods"] and "authorization" in h["access-control-allow-headers"]
    for origin in ("https://evil.example", "https://app.example.com.evil.example", "null"):
        assert preflight(origin)[0] == 403
    s, h, _ = request(server.port, "GET", "/v1/models", headers={**auth(), "Origin": "https://app.example.com"})
    assert s == 200 and h["access-control-allow-origin"] == "https://app.example.com"
    s, h, _ = request(server.port, "GET", "/v1/models", headers={**auth(), "Origin": "https://evil.example"})
    assert s == 403 and "access-control-allow-origin" not in h


def test_cors_exposes_the_colibri_headers(server):
    """A page on an allowed origin can read every x-colibri-* header a response carries."""
    s, h, _ = request(server.port, "POST", "/v1/completions", b'{"prompt":"hi","max_tokens":1}',
                      {**auth(), "Origin": "http://localhost:5173", "Content-Type": "application/json"})
    assert s == 200
    exposed = {x.strip() for x in h["access-control-expose-headers"].split(",")}
    ours = {k for k in h if k.startswith("x-colibri-")}
    assert {"x-colibri-queue-wait-ms", "x-colibri-slot", "x-colibri-prompt-tokens"} <= ours <= exposed
    assert "x-request-id" in exposed


def test_body_cap(server):
    big = b'{"prompt": "' + b"x" * 20000 + b'"}'
    s, _, body = request(server.port, "POST", "/v1/completions", big, auth())
    assert s == 413 and b"request_too_large" in body
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(big), big)
    out = raw_exchange(server.port, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                       + KEY.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked)
    assert out.startswith(b"HTTP/1.1 413")


def _closed_within(sock, seconds):
    """Reads until the server closes; returns (bytes, elapsed) or fails after `seconds`."""
    t0 = time.monotonic()
    sock.settimeout(seconds)
    out = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return out, time.monotonic() - t0
        out += chunk


def test_slow_headers_are_dropped(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        for _ in range(3):  # keeps dribbling, but never finishes the headers
            time.sleep(0.3)
            s.sendall(b"X-Slow: 1\r\n")
        out, waited = _closed_within(s, 5)
    assert waited < 3 and b"200 OK" not in out


def test_slow_body_gets_408(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + KEY.encode()
                  + b"\r\nContent-Length: 100\r\n\r\n{\"prompt\":")
        out, waited = _closed_within(s, 5)
    assert out.startswith(b"HTTP/1.1 408") and b"request_timeout" in out and waited < 3.5


def test_connection_cap_evicts_the_oldest_silent_connection(server):
    """At --max-connections, a new client makes room by closing the connection that has waited
    longest without sending a request; silent connections cannot lock clients out."""
    socks = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(6)]
    try:
        time.sleep(0.2)
        out = raw_exchange(server.port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 200")
        socks[0].settimeout(5)
        assert socks[0].recv(1) == b""  # the oldest was closed to make room
    finally:
        for s in socks:
            s.close()
    m = request(server.port, "GET", "/metrics", headers=auth())[2].decode()
    assert "colibri_connections_evicted_total 0" not in m


def resolve(model_dir, *argv):
    p = argparse.ArgumentParser()
    server_config.add_arguments(p)
    return server_config.resolve(p.parse_args(["--model", str(model_dir), *argv]))


@pytest.mark.parametrize("argv,env,message", [
    (["--kv-slots", "17"], {}, "--kv-slots 17 is out of range"),
    (["--kv-slots", "0"], {}, "between 1 and 16"),
    ([], {"COLI_KV_SLOTS": "many"}, "COLI_KV_SLOTS"),
    ([], {"COLI_MAX_QUEUE": "-1"}, "--max-queue -1"),
    ([], {"COLI_QUEUE_TIMEOUT": "0"}, "--queue-timeout"),
    (["--host", "0.0.0.0"], {}, "no API key"),
    (["--cors-origin", "*"], {}, "exact origins"),
    (["--cors-origin", "example.com"], {}, "is not an origin"),
    (["--api-key", ""], {}, "empty"),
    (["--kv-dir", "x", "--no-kv-persist"], {}, "not both"),
    (["--max-connections", "8", "--max-connections-per-ip", "9"], {}, "--max-connections-per-ip 9 is out of range"),
    (["--shutdown-timeout", "-1"], {}, "--shutdown-timeout -1"),
    (["--engine-timeout", "0"], {}, "--engine-timeout 0"),
    ([], {"COLI_ENGINE_TIMEOUT": "soon"}, "COLI_ENGINE_TIMEOUT"),
])
def test_settings_refused_with_reason(model, monkeypatch, argv, env, message):  # noqa: F811
    for k in ("COLI_KV_SLOTS", "COLI_MAX_QUEUE", "COLI_QUEUE_TIMEOUT", "COLI_API_KEY", "COLI_ENGINE_TIMEOUT"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(UserError, match=message.replace("*", r"\*")):
        resolve(model, "--no-kv-persist", *argv) if "--kv-dir" not in argv else resolve(model, *argv)


def test_flags_win_over_environment(model, monkeypatch):  # noqa: F811
    monkeypatch.setenv("COLI_MAX_QUEUE", "not-a-number")
    monkeypatch.setenv("COLI_KV_SLOTS", "3")
    monkeypatch.setenv("COLI_QUEUE_TIMEOUT", "7.5")
    s = resolve(model, "--no-kv-persist", "--max-queue", "2")
    assert (s.max_queue, s.kv_slots, s.queue_timeout) == (2, 3, 7.5)
    assert 300 <= s.engine_timeout < 301  # the default: 300 s plus 10 s per GB of (here tiny) weights
    monkeypatch.setenv("COLI_ENGINE_TIMEOUT", "45")
    assert resolve(model, "--no-kv-persist", "--max-queue", "2").engine_timeout == 45
    assert resolve(model, "--no-kv-persist", "--max-queue", "2", "--engine-timeout", "9").engine_timeout == 9
    monkeypatch.delenv("COLI_ENGINE_TIMEOUT")
    monkeypatch.delenv("COLI_MAX_QUEUE")
    monkeypatch.setenv("COLI_API_KEY", "from-env")
    assert resolve(model, "--no-kv-persist", "--host", "0.0.0.0").api_key == "from-env"
    monkeypatch.delenv("COLI_API_KEY")
    assert resolve(model, "--no-kv-persist", "--host", "0.0.0.0", "--allow-remote-without-key").api_key is None


def test_cli_exit_code_and_message(model):  # noqa: F811
    r = subprocess.run([sys.executable, str(COLI), "serve", "--model", str(model), "--kv-slots", "99"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--kv-slots 99 is out of range" in r.stderr
    r = subprocess.run([sys.executable, str(COLI), "serve"], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "--model" in r.stderr


def test_fault_details_need_the_key(model, template):  # noqa: F811
    """Engine faults carry exit codes, stderr lines and paths: /health shows them to a caller with
    the key only; clients and anonymous /health callers get the short public text."""
    with ServerProc(model, "--chat-template", template, "--no-kv-persist", "--api-key", KEY) as srv:
        pid = srv.request("GET", "/health", headers=auth())[2]
        pid = json.loads(pid)["engine"]["pid"]
        r0 = json.loads(srv.request("GET", "/health")[2])["engine"]["restarts"]
        os.kill(pid, signal.SIGKILL)
        anon = srv.wait_health(lambda h: h["status"] == "ok" and h["engine"]["restarts"] == r0 + 1)
        assert anon["engine"]["last_error"] and not anon["engine"]["details"]
        assert "SIGKILL" not in json.dumps(anon) and str(model) not in json.dumps(anon)
        s, _, body = srv.request("GET", "/health", headers=auth())
        keyed = json.loads(body)
        assert s == 200 and keyed["engine"]["details"] and "SIGKILL" in keyed["engine"]["last_error"]
        s, _, body = srv.request("GET", "/health", headers=auth("wrong"))
        assert s == 200 and "SIGKILL" not in body.decode()  # a wrong key is no key
        assert "SIGKILL" in srv.log()


@pytest.mark.parametrize("key,address,offered,shown", [
    (None, "127.0.0.1", None, True), (None, "::1", None, True), (None, "192.168.1.20", None, False),
    (KEY, "127.0.0.1", None, False), (KEY, "192.168.1.20", KEY, True), (KEY, "127.0.0.1", "nope", False),
])
def test_who_may_see_fault_details(key, address, offered, shown):
    from colibri.server import app as server_app

    class Fake:
        pass
    h = server_app.Handler.__new__(server_app.Handler)
    h.server = Fake()
    h.server.app = Fake()
    h.server.app.settings = Fake()
    h.server.app.settings.api_key = key
    h.client_address = (address, 40000)
    h.headers = {"Authorization": f"Bearer {offered}"} if offered else {}
    assert h.may_see_details() == shown
