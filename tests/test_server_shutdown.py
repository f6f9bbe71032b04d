"""Graceful shutdown of `coli serve`: on SIGTERM it stops accepting, lets running streams finish
within --shutdown-timeout, ends the rest with an SSE error event ([DONE] too for OpenAI
streams) and exits 0; a second signal exits at once. The engine is frozen with SIGSTOP so a
stream is reliably still running when the signal arrives."""
import http.client
import json
import os
import signal
import socket
import subprocess
import time

import anthropic
import openai
import pytest

from server_helpers import ServerProc, model, resume_engine, sse_events, stop_engine, template  # noqa: F401

MID = "qwen3_moe"
HI = [{"role": "user", "content": "hi"}]


def wait_log(server, text, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in server.log():
            return
        if server.proc.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"the log never said {text!r}:\n{server.log()[-3000:]}")


def exit_code(server, timeout=30):
    try:
        return server.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"coli serve did not exit within {timeout} s:\n{server.log()[-3000:]}") from None


def refused(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        return False
    except ConnectionRefusedError:
        return True


def raw_stream(port, path, body):
    """Starts a streaming request; returns (connection, response) with the headers read."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", path, json.dumps({**body, "stream": True}), {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200
    return conn, r


def test_a_running_stream_finishes_after_sigterm(model, template):  # noqa: F811
    with ServerProc(model, "--chat-template", template, "--no-kv-persist") as server:
        client = openai.OpenAI(base_url=server.base + "/v1", api_key="x", max_retries=0, timeout=60)
        stream = client.chat.completions.create(model=MID, messages=HI, max_tokens=20, temperature=0, stream=True,
                                                stream_options={"include_usage": True})
        chunks = [next(stream)]  # the stream is running
        pid = server.engine_pid()
        stop_engine(pid)
        try:
            server.proc.send_signal(signal.SIGTERM)
            wait_log(server, "shutting down")
            assert refused(server.port)  # no new connections while draining
        finally:
            resume_engine(pid)
        chunks += list(stream)
        assert chunks[-2].choices[0].finish_reason == "length" and chunks[-1].usage.completion_tokens == 20
        assert exit_code(server) == 0
        assert "every request in progress finished" in server.log()


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_streams_still_running_at_the_shutdown_timeout_end_with_an_error(model, template, dialect):  # noqa: F811
    with ServerProc(model, "--chat-template", template, "--no-kv-persist", "--shutdown-timeout", "1") as server:
        if dialect == "openai":
            conn, r = raw_stream(server.port, "/v1/chat/completions", {"model": MID, "messages": HI, "max_tokens": 400,
                                                                       "temperature": 0})
            first = r.readline()  # the first event: the stream began
        else:
            client = anthropic.Anthropic(base_url=server.base, api_key="x", max_retries=0, timeout=60)
            # greedy: a sampled end-of-sequence could end the stream before the engine is frozen
            stream = client.messages.create(model=MID, max_tokens=1000, messages=HI, stream=True,
                                            extra_body={"temperature": 0})
            first = next(iter(stream))
        assert first
        pid = server.engine_pid()
        stop_engine(pid)  # frozen: this stream cannot finish within the timeout
        try:
            server.proc.send_signal(signal.SIGTERM)
            if dialect == "openai":
                events = sse_events(first + r.read())  # read() ends only when the server ends the stream
                conn.close()
                assert events[-1] == "[DONE]"
                err = json.loads(events[-2])["error"]
                assert err["code"] == "engine_unavailable" and "shutting down" in err["message"]
            else:
                with pytest.raises(anthropic.APIStatusError, match="shutting down"):
                    for _ in stream:
                        pass
            assert exit_code(server) == 0
        finally:
            resume_engine(pid)
        assert "1 request(s) did not finish within --shutdown-timeout and ended with an error" in server.log()
        assert not os.path.exists(f"/proc/{pid}") or _is_zombie(pid)  # the frozen engine was stopped too


def _is_zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_second_signal_exits_at_once(model, template):  # noqa: F811
    with ServerProc(model, "--chat-template", template, "--no-kv-persist", "--shutdown-timeout", "600") as server:
        conn, r = raw_stream(server.port, "/v1/chat/completions", {"model": MID, "messages": HI, "max_tokens": 50})
        assert r.readline()
        pid = server.engine_pid()
        stop_engine(pid)
        try:
            server.proc.send_signal(signal.SIGTERM)
            wait_log(server, "shutting down")
            server.proc.send_signal(signal.SIGTERM)
            assert exit_code(server, timeout=10) == 128 + signal.SIGTERM  # not the 600 s drain
        finally:
            resume_engine(pid)
            conn.close()
        assert "second SIGTERM: ending the engine and exiting now" in server.log()
        assert not os.path.exists(f"/proc/{pid}") or _is_zombie(pid)  # gone before the launcher exited
