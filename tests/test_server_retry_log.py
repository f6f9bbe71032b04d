"""`coli serve` against the scripted engine (fake_engine.py): the Retry-After of a 429 estimated
from the queue, and the access log. The engine is paused with SIGSTOP where a request must stay
in flight, so what is measured does not depend on timing."""
import json
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
