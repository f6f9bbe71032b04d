"""No state of a request holds a connection slot against others: a body is read by the
connection thread (evictable like a head) and must keep a minimum rate, and at the total cap
the address holding the most connections gives one up, so a reconnect storm from other
addresses cannot evict a client that is still sending its head. Loopback only, a few seconds
each."""
import select
import socket
import threading
import time

import pytest

from colibri.server import bodies
from server_helpers import ServerProc, model, template  # noqa: F401

GET = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


def big_body_head(length):
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n{\"messages\":" % length)


def connect(port, source):
    return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))


def read_response(s):
    out = b""
    while True:
        try:
            chunk = s.recv(65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    return out


class Storm:
    """Opens connections from `sources` as fast as it can (each sends `first` and then waits),
    keeping at most `keep` of its own open: a client that reconnects the moment it is evicted."""

    def __init__(self, port, sources, first=b"", keep=48):
        self.port, self.sources, self.first, self.keep = port, sources, first, keep
        self.connects, self.stop = 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        socks = []
        while not self.stop.is_set():
            for src in self.sources:
                try:
                    s = connect(self.port, src)
                    if self.first:
                        s.sendall(self.first)
                    socks.append(s)
                    self.connects += 1
                except OSError:
                    pass
            while len(socks) > self.keep:
                socks.pop(0).close()
            time.sleep(0.002)
        for s in socks:
            s.close()

    def __enter__(self):
        self.thread.start()
        time.sleep(0.3)
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)


@pytest.fixture(scope="module")
def server(model, template):  # noqa: F811
    with ServerProc(model, "--chat-template", template, "--no-kv-persist", "--max-connections", "8",
                    "--max-connections-per-ip", "4") as s:
        yield s


def test_dribbled_large_bodies_do_not_lock_their_address_out(server):
    """Bodies over 64 KiB used to be read by a worker, unevictable: four dribbling uploads from
    an address at its cap of four left that address nothing but 503s."""
    src = "127.0.0.5"
    dribblers, outs, connects = [], [], 0
    try:
        for _ in range(6):
            for d in [d for d in dribblers if select.select([d], [], [], 0)[0]]:  # evicted: reconnect
                dribblers.remove(d)
                d.close()
            while len(dribblers) < 4:
                d = connect(server.port, src)
                d.sendall(big_body_head(200_000))
                dribblers.append(d)
                connects += 1
            time.sleep(0.1)  # the server has the dribblers' heads
            with connect(server.port, src) as s:
                s.sendall(GET)
                outs.append(read_response(s)[:40])
    finally:
        for d in dribblers:
            d.close()
    assert connects > 4
    assert all(o.startswith(b"HTTP/1.1 200") for o in outs), outs


def test_a_dribbled_body_is_dropped_long_before_the_body_timeout(server):
    """The default --body-timeout is 60 s; a body arriving at a few bytes a second gets a 408
    naming the minimum rate after the grace period."""
    t0 = time.monotonic()
    with connect(server.port, "127.0.0.9") as s:
        s.sendall(big_body_head(200_000))
        s.setblocking(False)
        out = b""
        while time.monotonic() - t0 < 20 and not out.endswith(b"}}"):
            try:
                s.send(b" ")
            except OSError:
                pass
            if select.select([s], [], [], 0.25)[0]:
                try:
                    chunk = s.recv(65536)
                except OSError:
                    break
                if not chunk:
                    break
                out += chunk
    assert out.startswith(b"HTTP/1.1 408") and b"KiB/s" in out, out[:300]
    assert time.monotonic() - t0 < bodies.GRACE_S + 10  # generous: far below the 60 s body timeout


def test_a_reconnect_storm_takes_only_its_own_share(model, template):  # noqa: F811
    """With the per-address cap as large as the total (8), a storm from two addresses keeps the
    total cap full; a client on a third address that sends its head in two parts, 0.3 s apart,
    is answered every time: each storm connection evicts one of the storm's own."""
    outs = []
    with ServerProc(model, "--chat-template", template, "--no-kv-persist", "--max-connections", "8",
                    "--max-connections-per-ip", "8") as server:
        with Storm(server.port, ["127.0.1.1", "127.0.1.2"]) as storm:
            for _ in range(5):
                with connect(server.port, "127.0.0.7") as s:
                    s.sendall(GET[:30])
                    time.sleep(0.3)
                    try:
                        s.sendall(GET[30:])
                    except OSError:
                        pass
                    outs.append(read_response(s)[:40])
    assert storm.connects > 50
    assert all(o.startswith(b"HTTP/1.1 200") for o in outs), outs


def test_chunked_and_expect_bodies_are_read_whole(server):
    """A chunked body and one sent after "100 Continue" still reach the handler complete."""
    import json
    body = json.dumps({"model": "qwen3_moe", "prompt": "hi", "max_tokens": 1}).encode()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 7]), body[i:i + 7]) for i in range(0, len(body), 7))
    with connect(server.port, "127.0.0.10") as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
                  b"Connection: close\r\n\r\n" + chunked + b"0\r\n\r\n")
        assert read_response(s).startswith(b"HTTP/1.1 200")
    with connect(server.port, "127.0.0.10") as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\n"
                  b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body))
        assert s.recv(25) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(body)
        out = read_response(s)
    assert out.startswith(b"HTTP/1.1 200") and b"100 Continue" not in out, out[:200]
    with connect(server.port, "127.0.0.10") as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
        out = read_response(s)
    assert out.startswith(b"HTTP/1.1 400") and b"chunked" in out, out[:200]
