"""`coli serve` under load and faults: a saturated queue, client disconnects, a killed engine,
malformed requests. The engine is paused with SIGSTOP where a test needs a request to stay
in flight, so the outcomes do not depend on timing."""
import array
import collections
import fcntl
import json
import os
import signal
import socket
import termios
import threading
import time

import openai
import pytest

from server_helpers import (ServerProc, model, post_json, raw_exchange, request, resume_engine,  # noqa: F401
                            stop_engine, template)

MID = "qwen3_moe"
HI = [{"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def server(model, template):  # noqa: F811
    # one request at a time, so "the running one" is well defined (tests/test_server_parallel.py: several)
    with ServerProc(model, "--chat-template", template, "--no-kv-persist", "--max-queue", "8", "--parallel", "1") as s:
        yield s


@pytest.fixture(scope="module")
def small(model, template):  # noqa: F811
    with ServerProc(model, "--chat-template", template, "--no-kv-persist", "--max-queue", "1",
                    "--queue-timeout", "1", "--parallel", "1") as s:
        yield s


def counts(srv):
    return srv.health()["requests"]


def chat(port, max_tokens=4, timeout=60, **extra):
    return post_json(port, "/v1/chat/completions",
                     {"model": MID, "messages": HI, "max_tokens": max_tokens, "temperature": 0, **extra},
                     timeout=timeout)


class Paused:
    """Freezes the engine for the duration of a block (always resumed)."""

    def __init__(self, srv):
        self.pid = srv.engine_pid()

    def __enter__(self):
        stop_engine(self.pid)
        return self

    def __exit__(self, *exc):
        resume_engine(self.pid)


def run_threads(fns, timeout=60):
    results = [None] * len(fns)

    def wrap(i, fn):
        try:
            results[i] = fn()
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            results[i] = e
    threads = [threading.Thread(target=wrap, args=(i, fn), daemon=True) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    return threads, results


def join_all(threads, timeout=60):
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a request hung"


def test_load_32_clients_against_queue_of_8(server):
    before = greedy_text(server)
    c0 = counts(server)
    with Paused(server):  # one request runs (frozen), 8 wait, 23 are turned away
        threads, results = run_threads([lambda: chat(server.port, max_tokens=8) for _ in range(32)])
        server.wait_health(lambda h: h["requests"]["rejected"] - c0["rejected"] == 23
                           and h["requests"]["queued"] == 8 and h["requests"]["active"] == 1)
    join_all(threads)
    statuses = collections.Counter(r[0] for r in results)
    assert statuses == {200: 9, 429: 23}, results
    for status, headers, body in results:
        assert headers["x-request-id"] and "x-colibri-queue-wait-ms" in headers
        if status == 429:
            assert int(headers["retry-after"]) >= 1 and body["error"]["code"] == "queue_full"
        else:
            assert body["usage"]["completion_tokens"] == 8
    c1 = server.wait_health(lambda h: h["requests"]["active"] == 0 and h["requests"]["queued"] == 0)["requests"]
    delta = {k: c1[k] - c0[k] for k in ("completed", "rejected", "cancelled", "failed", "invalid")}
    assert delta == {"completed": 9, "rejected": 23, "cancelled": 0, "failed": 0, "invalid": 0}
    assert greedy_text(server) == before  # nothing leaked from the load into later requests


def test_unpaused_load_all_end_in_200_or_429(server):
    c0 = counts(server)
    threads, results = run_threads([lambda: chat(server.port, max_tokens=48) for _ in range(32)])
    join_all(threads)
    assert all(not isinstance(r, Exception) for r in results), results
    statuses = collections.Counter(r[0] for r in results)
    assert set(statuses) <= {200, 429}
    # a request is counted when its handler finishes, after the response is written: wait for all
    c1 = server.wait_health(lambda h: sum(h["requests"][k] - c0[k] for k in ("completed", "rejected", "failed",
                                                                                "invalid", "cancelled")) >= 32)["requests"]
    assert c1["completed"] - c0["completed"] == statuses[200]
    assert c1["rejected"] - c0["rejected"] == statuses[429]


def greedy_text(srv):
    s, _, b = chat(srv.port, max_tokens=10)
    assert s == 200
    return b["choices"][0]["message"]["content"]


# 480 tokens with 20 alternatives each: about 190 KB of frames, far more than a pipe holds.
LONG = {"model": MID, "prompt": "The long story begins", "max_tokens": 480, "temperature": 0, "stream": True,
        "logprobs": 20}
LONG_OUTPUT = 150_000  # bytes of frames LONG makes at least (measured: about 190 KB)
F_GETPIPE_SZ = 1032    # Linux fcntl: the capacity of a pipe


def pipe_state(pid, fd=1):
    """(bytes waiting, capacity) of the pipe behind `pid`'s file descriptor `fd`; reads nothing."""
    r = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK)
    try:
        buf = array.array("i", [0])
        fcntl.ioctl(r, termios.FIONREAD, buf)
        return buf[0], fcntl.fcntl(r, F_GETPIPE_SZ)
    finally:
        os.close(r)


def frozen_mid_stream(srv, body=LONG):
    """A stream that has started and whose generation cannot have finished: returns (socket,
    bytes received, engine pid) with the engine stopped (SIGSTOP) mid-generation.

    The engine runs while the server is stopped, so it can only write until the pipe to the
    server is full, and LONG needs several pipes' worth: it is necessarily mid-generation when
    it is stopped in turn. No timing is involved."""
    pid = srv.engine_pid()
    stop_engine(pid)
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    try:
        payload = json.dumps(body).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
        srv.wait_health(lambda h: h["engine"]["turn"] is not None)  # the SUBMIT is in the engine's input
        os.kill(srv.proc.pid, signal.SIGSTOP)
        try:
            capacity = pipe_state(pid)[1]
            assert capacity < LONG_OUTPUT, f"a {capacity}-byte pipe could hold the whole generation"
            resume_engine(pid)
            deadline = time.monotonic() + 60
            while pipe_state(pid)[0] < 4096:  # ACCEPT and some tokens written, the rest cannot follow
                assert time.monotonic() < deadline, "the engine wrote nothing while the server was stopped"
                time.sleep(0.01)
            stop_engine(pid)
        finally:
            os.kill(srv.proc.pid, signal.SIGCONT)
        buf = b""
        while buf.count(b"data: ") < 1:
            chunk = s.recv(65536)
            assert chunk, f"the server closed the stream early: {buf[:300]!r}"
            buf += chunk
        assert b"200 OK" in buf.split(b"\r\n", 1)[0], buf[:300]
        return s, buf, pid
    except BaseException:
        resume_engine(pid)
        s.close()
        raise


def read_to_end(s, buf, timeout=30):
    s.settimeout(timeout)
    while not buf.endswith(b"0\r\n\r\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    s.close()
    return buf


def test_disconnect_mid_stream_cancels_the_generation(server):
    c0 = counts(server)
    s, _, pid = frozen_mid_stream(server)
    try:
        s.close()  # the client goes away mid-stream
        h = server.wait_health(lambda h: h["engine"]["turn"] and h["engine"]["turn"]["cancel_sent"])
        assert h["requests"]["active"] == 1  # CANCEL is written while the engine is still stopped
    finally:
        resume_engine(pid)
    h = server.wait_health(lambda h: h["requests"]["active"] == 0 and h["requests"]["cancelled"] > c0["cancelled"])
    assert h["requests"]["cancelled"] == c0["cancelled"] + 1 and h["requests"]["completed"] == c0["completed"]
    assert h["last_cancel"]["tokens_generated"] < LONG["max_tokens"]  # stopped early, not run to the end
    assert server.engine_pid() == pid  # cancelling needs no restart
    assert greedy_text(server)  # the engine is free again
    # that the engine stops within one token of CANCEL is the engine's promise, proven without a
    # server in test_protocol.py::test_stop_and_cancel_end_generation_within_one_token


def test_disconnect_while_queued_frees_the_place(server):
    c0 = counts(server)
    with Paused(server):
        threads, results = run_threads([lambda: chat(server.port)])
        server.wait_health(lambda h: h["requests"]["active"] == 1)
        s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        body = json.dumps({"model": MID, "messages": HI, "max_tokens": 3}).encode()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n%s"
                  % (len(body), body))
        server.wait_health(lambda h: h["requests"]["queued"] == 1)
        s.close()
        # the place is freed first, the outcome is counted when the handler finishes: wait for both
        h = server.wait_health(lambda h: h["requests"]["queued"] == 0
                               and h["requests"]["cancelled"] == c0["cancelled"] + 1)
        assert h["requests"]["active"] == 1 and h["requests"]["rejected"] == c0["rejected"]
    join_all(threads)
    assert results[0][0] == 200


def test_queue_full_and_queue_timeout_are_429s_before_any_stream(small):
    client = openai.OpenAI(base_url=small.base + "/v1", api_key="x", max_retries=0, timeout=30)
    c0 = counts(small)
    with Paused(small):
        running, r_run = run_threads([lambda: chat(small.port)])
        small.wait_health(lambda h: h["requests"]["active"] == 1)
        waiting, r_wait = run_threads([lambda: chat(small.port, stream=True)])
        small.wait_health(lambda h: h["requests"]["queued"] == 1)
        with pytest.raises(openai.RateLimitError) as e:
            client.chat.completions.create(model=MID, messages=HI, max_tokens=3, stream=True)
        assert e.value.body["code"] == "queue_full"
        assert int(e.value.response.headers["retry-after"]) >= 1
        join_all(waiting, timeout=10)  # --queue-timeout 1
    status, headers, body = r_wait[0]
    assert status == 429 and body["error"]["code"] == "queue_timeout" and "retry-after" in headers
    assert headers["content-type"] == "application/json"  # refused before any SSE header
    join_all(running)
    assert r_run[0][0] == 200
    c1 = counts(small)
    assert c1["rejected"] - c0["rejected"] == 2 and c1["timed_out"] - c0["timed_out"] == 1


def test_engine_killed_mid_stream_then_recovers(server):
    r0 = server.health()["engine"]["restarts"]
    s, buf, pid = frozen_mid_stream(server)
    os.kill(pid, signal.SIGKILL)
    text = read_to_end(s, buf).decode(errors="replace")
    assert text.endswith("0\r\n\r\n")
    errors = [json.loads(line[6:])["error"] for line in text.split("\n")
              if line.startswith("data: {") and '"error"' in line]
    assert len(errors) == 1 and errors[0]["code"] == "engine_crashed"
    assert "SIGKILL" not in errors[0]["message"] and "/" not in errors[0]["message"]  # no detail for clients
    h = server.wait_health(lambda h: h["status"] == "ok" and h["engine"]["restarts"] == r0 + 1)
    assert h["engine"]["pid"] != pid and "SIGKILL" in h["engine"]["last_error"]  # loopback, no key: details
    assert greedy_text(server)


def test_engine_killed_before_answer_gives_500_and_the_queue_survives(server):
    r0 = server.health()["engine"]["restarts"]
    pid = server.engine_pid()
    stop_engine(pid)
    try:
        running, r_run = run_threads([lambda: chat(server.port)])
        server.wait_health(lambda h: h["requests"]["active"] == 1)
        waiting, r_wait = run_threads([lambda: chat(server.port)])
        server.wait_health(lambda h: h["requests"]["queued"] == 1)
    finally:
        os.kill(pid, signal.SIGKILL)
    join_all(running + waiting)
    status, headers, body = r_run[0]
    assert status == 500 and body["error"]["code"] == "engine_crashed" and "retry" in body["error"]["message"]
    assert "SIGKILL" not in body["error"]["message"]  # the cause is for the log and /health, not the client
    assert r_wait[0][0] == 200  # the queued request is served by the restarted engine
    h = server.wait_health(lambda h: h["status"] == "ok" and h["engine"]["restarts"] == r0 + 1)
    assert h["engine"]["pid"] != pid and "SIGKILL" in h["engine"]["last_error"]
    assert "SIGKILL" in server.log()  # the server log has the detail
    assert greedy_text(server)


@pytest.fixture(scope="module")
def strict(model, template):  # noqa: F811
    with ServerProc(model, "--chat-template", template, "--no-kv-persist", "--engine-timeout", "2", "--parallel", "1") as s:
        yield s


@pytest.mark.parametrize("stream", [False, True])
def test_frozen_engine_is_killed_restarted_and_the_client_told(strict, stream):
    h0 = strict.health()
    assert h0["engine"]["timeout_s"] == 2
    pid = strict.engine_pid()
    stop_engine(pid)  # frozen for good: only the liveness deadline can end this request
    try:
        status, headers, body = chat(strict.port, stream=stream)
    finally:
        resume_engine(pid)
    assert status == 504 and headers["content-type"] == "application/json"  # nothing was streamed yet
    assert body["error"]["code"] == "engine_timeout" and "retry" in body["error"]["message"]
    assert "retry-after" in headers
    h = strict.wait_health(lambda h: h["status"] == "ok" and h["engine"]["restarts"] == h0["engine"]["restarts"] + 1)
    assert h["engine"]["pid"] != pid and "--engine-timeout" in h["engine"]["last_error"]
    assert greedy_text(strict)
    assert counts(strict)["failed"] == h0["requests"]["failed"] + 1


def test_engine_dying_while_idle_is_restarted(server):
    r0 = server.health()["engine"]["restarts"]
    pid = server.engine_pid()
    os.kill(pid, signal.SIGKILL)
    h = server.wait_health(lambda h: h["status"] == "ok" and h["engine"]["restarts"] == r0 + 1)
    assert h["engine"]["pid"] != pid and "SIGKILL" in h["engine"]["last_error"]
    assert greedy_text(server)


@pytest.mark.parametrize("raw,code", [
    (b"{not json", "invalid_json"),
    (b"[1, 2]", "invalid_json"),
    (b'{"messages": [], "max_tokens": NaN}', "invalid_json"),
    (b"\xff\xfe", "invalid_json"),
])
def test_malformed_bodies(server, raw, code):
    s, _, body = request(server.port, "POST", "/v1/chat/completions", raw, {"Content-Type": "application/json"})
    assert s == 400 and json.loads(body)["error"]["code"] == code


@pytest.mark.parametrize("field,value", [
    ("messages", "hi"), ("max_tokens", "10"), ("max_tokens", 0), ("temperature", "hot"), ("stream", "yes"),
    ("stop", 5), ("seed", 1.5), ("top_p", 0), ("logprobs", 1), ("messages", [{"role": "robot", "content": "x"}]),
    ("cache_slot", -1), ("cache_slot", 4), ("cache_slot", "1"), ("cache_slot", 1.5), ("cache_slot", True),
    # integers the engine cannot take: refused here, naming the field, not with the engine's protocol text
    ("max_tokens", 1 << 31), ("max_tokens", 1 << 64), ("max_tokens", 1e300), ("max_completion_tokens", 1 << 31),
    ("max_completion_tokens", 0), ("n", 1 << 31), ("top_k", 1 << 31), ("top_k", -2), ("seed", 1 << 64),
    ("seed", -(1 << 63) - 1), ("top_logprobs", 1 << 31),
])
def test_wrong_types_and_values_are_400(server, field, value):
    extra = {"logprobs": True} if field == "top_logprobs" else {}
    s, _, body = chat(server.port, **{field: value}, **extra)
    assert s == 400, body
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"]
    assert body["error"]["param"].startswith(field) and "SUBMIT" not in body["error"]["message"]
    if field == "cache_slot":
        assert body["error"]["code"] == "invalid_cache_slot"


def test_wrong_model_unknown_route_and_method(server):
    s, _, body = chat(server.port, model="other")
    assert s == 404 and body["error"]["code"] == "model_not_found"
    s, _, body = request(server.port, "GET", "/v1/nothing")
    assert s == 404 and json.loads(body)["error"]["code"] == "not_found"
    s, _, body = request(server.port, "GET", "/v1/chat/completions")
    assert s == 405


def test_oversized_and_unframed_bodies(server):
    out = raw_exchange(server.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                    b"Content-Length: 104857600\r\n\r\n{\"model\":")
    assert out.startswith(b"HTTP/1.1 413") and b"request_too_large" in out
    out = raw_exchange(server.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 411")
    out = raw_exchange(server.port, b"GARBAGE\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400") and b'"error"' in out


def test_chunked_request_body(server):
    body = json.dumps({"model": MID, "prompt": "abc", "max_tokens": 2, "temperature": 0}).encode()
    half = len(body) // 2
    chunked = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, body[:half], len(body) - half, body[half:])
    out = raw_exchange(server.port, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                                    b"Transfer-Encoding: chunked\r\n\r\n" + chunked)
    assert out.startswith(b"HTTP/1.1 200") and b'"text_completion"' in out
