"""`coli serve` against the scripted engine (fake_engine.py): the Retry-After of a 429 estimated
from the queue, and the access log (latency, tokens, cancelled streams). The engine is paused with SIGSTOP where a request must stay
in flight, so what is measured does not depend on timing."""
import json
import re
import socket
import threading
import time
from pathlib import Path

from server_helpers import ServerProc, model, post_json, resume_engine, stop_engine, template  # noqa: F401

FAKE = Path(__file__).with_name("fake_engine.py")
STEP_S = 0.5   # the slow fake engine sleeps this long before each token
TOKENS = 4     # so every request runs at least STEP_S * TOKENS seconds in the engine


def chat(port, max_tokens=TOKENS, timeout=60):
    return post_json(port, "/v1/chat/completions",
                     {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": max_tokens}, timeout=timeout)


def slow_server(model, template, *args):  # noqa: F811
    return ServerProc(model, "--chat-template", template, "--no-kv-persist", "--parallel", "1", "--kv-slots", "1",
                      "--shutdown-timeout", "1", *args,
                      env={"COLI_ENGINE": str(FAKE), "COLI_FAKE_MODE": f"slow:{STEP_S}"})


def retry_after_with_full_queue(model, template, max_queue):  # noqa: F811
    """One request to learn the duration, then one running and `max_queue` waiting (engine
    frozen): the Retry-After of the next request, which finds the queue full."""
    with slow_server(model, template, "--max-queue", str(max_queue)) as s:
        assert chat(s.port)[0] == 200
        pid = s.engine_pid()
        stop_engine(pid)
        try:
            for _ in range(max_queue + 1):
                threading.Thread(target=chat, args=(s.port,), daemon=True).start()
            s.wait_health(lambda h: h["requests"]["active"] == 1 and h["requests"]["queued"] == max_queue)
            status, headers, body = chat(s.port)
            assert status == 429 and body["error"]["code"] == "queue_full", body
            return int(headers["retry-after"])
        finally:
            resume_engine(pid)


def test_retry_after_grows_with_the_queue(model, template):  # noqa: F811
    short = retry_after_with_full_queue(model, template, 1)
    long = retry_after_with_full_queue(model, template, 4)
    # the requests ahead (queued + running) x their mean duration / one parallel slot
    least = STEP_S * TOKENS
    assert 2 * least <= short <= 2 * 10 * least, short
    assert 5 * least <= long <= 5 * 10 * least, long
    assert long > short


def access_lines(s, path):
    return [line for line in s.log().splitlines() if f'"POST {path} HTTP/1.1"' in line]


def wait_line(s, pred, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        hits = [line for line in access_lines(s, "/v1/chat/completions") if pred(line)]
        if hits:
            return hits[-1]
        time.sleep(0.05)
    raise AssertionError(f"no such access-log line:\n{s.log()[-3000:]}")


def test_access_log_has_latency_tokens_and_cancelled_streams(model, template):  # noqa: F811
    with slow_server(model, template) as s:
        status, headers, _ = chat(s.port)
        assert status == 200
        rid = headers["x-request-id"]
        line = wait_line(s, lambda line: rid in line)
        m = re.search(r'" 200 (\S+) (\d+) ms prompt=(\d+) completion=(\d+)$', line)
        assert m, line
        assert m[1] == rid and (int(m[3]), int(m[4])) == (3, TOKENS)
        assert STEP_S * TOKENS * 1000 <= int(m[2]) <= 60_000, line  # it ran at least the engine's sleeps
        assert "cancelled" not in line
        # a stream the client leaves after its first token: 499 cancelled, not the 200 that went out
        body = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 10, "stream": True,
                           "user": "leaves-early"}).encode()
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=30)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"x-request-id: leaves-early\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        got = b""
        while b'"content":"a"' not in got.replace(b" ", b""):  # the first token
            chunk = sock.recv(4096)
            assert chunk, got
            got += chunk
        assert got.startswith(b"HTTP/1.1 200")
        sock.close()
        line = wait_line(s, lambda line: "leaves-early" in line)
        m = re.search(r'" 499 leaves-early (\d+) ms prompt=3 completion=(\d+) cancelled: the client went away after '
                      r'a 200$', line)
        assert m, line
        assert 1 <= int(m[2]) < 10 and int(m[1]) >= STEP_S * 1000, line
        s.wait_health(lambda h: h["requests"]["active"] == 0)
