"""Connections of `coli serve`: accepting, reading request heads, caps and eviction.

One selector thread owns every connection that is not inside a request: it accepts sockets,
reads each request head and its body (Content-Length or chunked, up to --max-body-mb) into a
buffer under the header and body deadlines, and keeps idle keep-alive connections. Only a
complete request reaches a worker thread. A slow or silent client therefore costs a buffer and
a file descriptor, never a thread, and stays evictable until its request is complete; a body
must also keep a minimum rate (bodies.py), so a dribbled upload is dropped within seconds.

Caps (--max-connections in total, --max-connections-per-ip per address) count every open
connection. When a new one would exceed a cap, the connection of that scope that has waited
longest without sending a complete request (reading a head or a body, or idle between
requests; one that never completed a request goes before a kept-alive one; at the total cap,
one of the address holding the most connections) is closed to make room. A dribbling client is
always older than a normal client's fresh connection, so it goes first, even when both share an
address. Only when every connection of the scope is inside a request is the new one refused
with a 503.
"""
import json
import re
import selectors
import socket
import threading
import time
from collections import OrderedDict, deque

from colibri.server import bodies
from colibri.chat.params import ApiError
from colibri.server.request_head import BadHead, parse_head

MAX_HEAD = 64 * 1024           # request line and headers together
HEAD_END = re.compile(rb"\r?\n\r?\n")
ACCEPTS_PER_ROUND = 32         # bounded, so a flood of connects cannot delay reading heads
LINGER_S = 1.0                 # after a last answer, its request's bytes are read and dropped this long,
MAX_LINGER = 256               # for at most this many sockets: closing with unread data would reset the
                               # connection, and the client could lose the answer
ACCEPT_PAUSE_S = 0.5           # after accept() failed (out of descriptors), so the log is not flooded
EXPIRE_EVERY = 0.1             # seconds between deadline sweeps (deadlines are that precise)
NO_ROOM_WAIT_S = 0.5           # a connection that meets a cap waits this long for a slot before its 503,
NO_ROOM_MAX = 64               # and at most this many wait (beyond that: the 503 at once)


def canned(status, reason, message, code, extra=""):
    """A complete JSON error response, for answers the selector thread writes itself."""
    body = json.dumps(ApiError(status, message, code=code).body("openai")).encode()
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"{extra}Connection: close\r\n\r\n").encode() + body


class Conn:
    """One client connection. state: head (reading a request head), body (reading a small body),
    idle (kept alive), busy (in a worker), closed."""

    __slots__ = ("sock", "addr", "ip", "buf", "state", "deadline", "served", "head", "body_at", "body_t0",
                 "body_until", "continued")

    def __init__(self, sock, addr):
        self.sock, self.addr, self.ip = sock, addr, addr[0]
        self.buf = b""
        self.state, self.deadline, self.served = "head", 0.0, 0
        self.head = None  # the parsed head of the request being read or served (request_head.Head)
        self.body_at = self.body_t0 = self.body_until = 0  # where the body starts in buf; when it began, ends
        self.continued = False  # "100 Continue" sent for this request


class ConnReader:
    """The handler's rfile: the bytes the selector already read, then the socket."""

    def __init__(self, sock, buf):
        self.sock, self.buf = sock, bytearray(buf)

    def _fill(self):
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def _take(self, n):
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def readline(self, limit=-1):
        start = 0
        while True:
            i = self.buf.find(b"\n", start)
            if i >= 0 and (limit < 0 or i < limit):
                return self._take(i + 1)
            if 0 <= limit <= len(self.buf):
                return self._take(limit)
            start = len(self.buf)
            if not self._fill():
                return self._take(len(self.buf))

    def read(self, n=-1):
        while (n < 0 or len(self.buf) < n) and self._fill():
            pass
        return self._take(len(self.buf) if n < 0 else n)

    def leftover(self):
        """Bytes read past the request (a pipelined next request)."""
        return bytes(self.buf)

    def close(self):
        pass


class ConnWriter:
    def __init__(self, sock):
        self.sock = sock

    def write(self, data):
        self.sock.sendall(data)
        return len(data)

    def flush(self):
        pass

    def close(self):
        pass


class Evictable:
    """Connections not inside a request, in the order they started waiting. Those that never
    completed a request go first: a slowloris connection never does, a kept-alive client has."""

    def __init__(self):
        self.tiers = (OrderedDict(), OrderedDict())  # never served, served before

    def add(self, c):
        self.tiers[1 if c.served else 0][c] = None

    def remove(self, c):
        for t in self.tiers:
            t.pop(c, None)

    def oldest(self):
        for t in self.tiers:
            if t:
                return next(iter(t))
        return None

    def __len__(self):
        return len(self.tiers[0]) + len(self.tiers[1])

    def __iter__(self):
        for t in self.tiers:
            yield from t


class Watchdog:
    """The total deadline for reading a large request body in a worker: a slow client gets its
    socket shut down. Socket timeouts bound each recv(); a client dribbling one byte at a time
    would never hit them, so this thread enforces the body deadline as a whole."""

    def __init__(self, metrics):
        self.metrics = metrics
        self.lock = threading.Lock()
        self.deadlines = {}   # socket -> (deadline, how)
        self.fired = set()
        t = threading.Thread(target=self._loop, name="deadline-watchdog", daemon=True)
        t.start()

    def arm(self, sock, seconds, how):
        with self.lock:
            self.deadlines[sock] = (time.monotonic() + seconds, how)
            self.fired.discard(sock)

    def disarm(self, sock):
        """Returns True if the deadline had fired."""
        with self.lock:
            self.deadlines.pop(sock, None)
            fired = sock in self.fired
            self.fired.discard(sock)
            return fired

    def _loop(self):
        while True:
            time.sleep(0.2)
            now = time.monotonic()
            with self.lock:
                late = [(s, how) for s, (d, how) in self.deadlines.items() if d <= now]
                for s, _ in late:
                    del self.deadlines[s]
                    self.fired.add(s)
            for s, how in late:
                self.metrics.count("slow_clients")
                try:
                    s.shutdown(how)
                except OSError:
                    pass


class Server:
    def __init__(self, settings, handler_cls, app):
        self.settings, self.handler_cls, self.app = settings, handler_cls, app
        host = settings.host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind((host, settings.port))
            self.socket.listen(1024)
        except OSError:
            self.socket.close()
            raise
        self.socket.setblocking(False)
        self.server_address = self.socket.getsockname()
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.socket, selectors.EVENT_READ, "listen")
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self.lock = threading.Condition()
        self.returned = deque()            # (conn, keep) handed back by workers
        self.busy = 0                      # connections inside a request (guarded by lock)
        self.total = 0                     # open connections (selector thread only)
        self.per_ip = {}                   # ip -> open connections
        self.waiting = Evictable()         # connections not inside a request
        self.waiting_ip = {}               # ip -> Evictable of that address
        self.lingering = OrderedDict()     # socket -> deadline: answered for the last time, closing
        self.no_room = deque()             # (conn, deadline): accepted at a cap, waiting for a slot
        self.draining = False
        self._stop = False
        self._done = threading.Event()
        self._drained = threading.Event()
        self._expired_at = 0.0
        self._accept_paused_until = 0.0
        self.watchdog = Watchdog(app.metrics)

    # --- lifecycle (called from other threads) --------------------------------------------
    def serve_forever(self, poll_interval=0.5):
        try:
            while not self._stop:
                self._round(poll_interval)
        finally:
            self._close_all()
            self._done.set()

    def drain(self):
        """Stops accepting and closes every connection that is not inside a request; returns
        once the port is closed."""
        self.draining = True
        self._wake()
        self._drained.wait(5)

    def in_flight(self):
        with self.lock:
            return self.busy

    def wait_idle(self, timeout):
        """Waits until no request is in progress; True if that happened within `timeout` s."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while self.busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.lock.wait(min(left, 0.5))
        return True

    def shutdown(self):
        self._stop = True
        self._wake()
        self._done.wait(10)

    def server_close(self):
        for s in (self.socket, self._wake_r, self._wake_w):
            try:
                s.close()
            except OSError:
                pass

    def _wake(self):
        try:
            self._wake_w.send(b".")
        except OSError:
            pass

    # --- the selector thread --------------------------------------------------------------
    def _round(self, poll_interval):
        if self.draining and self.socket.fileno() >= 0:
            self._start_drain()
        elif self._accept_paused_until and not self.draining and time.monotonic() >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            self.sel.register(self.socket, selectors.EVENT_READ, "listen")
        timeout = min(poll_interval, EXPIRE_EVERY) if self.waiting or self.no_room else poll_interval
        for key, _ in self.sel.select(timeout):
            if key.data == "listen":
                self._accept()
            elif key.data == "linger":
                self._linger_read(key.fileobj)
            elif key.data == "wake":
                try:
                    self._wake_r.recv(4096)
                except OSError:
                    pass
            elif key.data.state in ("head", "body", "idle"):  # not one closed earlier in this round
                self._readable(key.data)
        self._take_returned()
        now = time.monotonic()
        if self.no_room:
            self._retry_no_room(now)
        if now - self._expired_at >= EXPIRE_EVERY:
            self._expired_at = now
            self._expire(now)

    def _start_drain(self):
        if not self._accept_paused_until:
            self.sel.unregister(self.socket)
        self.socket.close()
        for c in list(self.waiting):
            self._close(c)
        self._drained.set()

    def _accept(self):
        for _ in range(ACCEPTS_PER_ROUND):
            try:
                sock, addr = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of file descriptors: leave the rest in the backlog for a moment
                self.app.log(f"accept failed ({e}); pausing new connections for {ACCEPT_PAUSE_S:g} s")
                self.sel.unregister(self.socket)
                self._accept_paused_until = time.monotonic() + ACCEPT_PAUSE_S
                return
            sock.setblocking(False)
            c = Conn(sock, addr)
            if not self._make_room(c.ip):
                # Every connection of its scope is inside a request. One may be about to come
                # back (its answer already sent, its worker not yet done): a client that
                # reconnects at once must not get a 503 for that, so the new one waits briefly.
                if len(self.no_room) < NO_ROOM_MAX:
                    self.no_room.append((c, time.monotonic() + NO_ROOM_WAIT_S))
                else:
                    self._refuse_new(c)
                continue
            self._admit(c)

    def _admit(self, c):
        try:
            c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # SSE events go out at once
        except OSError:
            pass
        self.total += 1
        self.per_ip[c.ip] = self.per_ip.get(c.ip, 0) + 1
        self.sel.register(c.sock, selectors.EVENT_READ, c)
        self._wait(c, "head", self.settings.header_timeout)
        self._readable(c)  # a normal client's head is usually there already

    def _refuse_new(self, c):
        self.app.metrics.count("connections_refused")
        self._refuse(c.sock)

    def _retry_no_room(self, now):
        """Connections that met a cap get a slot once one frees, or a 503 when their wait ends."""
        for _ in range(len(self.no_room)):
            c, deadline = self.no_room.popleft()
            if self.draining:
                c.sock.close()
            elif self._make_room(c.ip):
                self._admit(c)
            elif now >= deadline:
                self._refuse_new(c)
            else:
                self.no_room.append((c, deadline))

    def _make_room(self, ip):
        s = self.settings
        if self.per_ip.get(ip, 0) >= s.max_connections_per_ip:
            group = self.waiting_ip.get(ip)
            if not group:
                return False
            self._evict(group.oldest())
        if self.total >= s.max_connections:
            if not self.waiting:
                return False
            self._evict(self._fair_victim(ip))
        return True

    def _fair_victim(self, new_ip):
        """At the total cap, the address that would hold the most connections (the new one's
        counted) gives up its oldest waiting one: a reconnect storm evicts its own connections,
        not those of an address holding fewer, still sending its head."""
        ip = max(self.waiting_ip, key=lambda a: self.per_ip.get(a, 0) + (a == new_ip))
        return self.waiting_ip[ip].oldest()

    def _evict(self, c):
        self.app.metrics.count("connections_evicted")
        self._close(c)

    def _refuse(self, sock):
        s = self.settings
        self._linger(sock, canned(503, "Service Unavailable",
                                  f"too many connections (--max-connections {s.max_connections}, "
                                  f"--max-connections-per-ip {s.max_connections_per_ip}) are inside requests; "
                                  f"retry later", "too_many_connections", "Retry-After: 1\r\n"))

    def _linger(self, sock, response):
        """Sends a last answer (best effort: the socket is non-blocking), then half-closes and
        drops what the client still sends until it closes too or LINGER_S pass."""
        try:
            sock.send(response)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            sock.close()
            return
        if len(self.lingering) >= min(MAX_LINGER, self.settings.max_connections):  # descriptors: config.py
            self._linger_end(next(iter(self.lingering)))
        self.lingering[sock] = time.monotonic() + LINGER_S
        self.sel.register(sock, selectors.EVENT_READ, "linger")

    def _linger_read(self, sock):
        try:
            if sock.recv(65536):
                return
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            pass
        self._linger_end(sock)

    def _linger_end(self, sock):
        self.lingering.pop(sock, None)
        try:
            self.sel.unregister(sock)
        except (KeyError, ValueError):
            pass
        sock.close()

    def _wait(self, c, state, seconds):
        """Makes `c` evictable, in `state`, with a deadline `seconds` from now."""
        c.state, c.deadline = state, time.monotonic() + seconds
        self.waiting.add(c)
        self.waiting_ip.setdefault(c.ip, Evictable()).add(c)

    def _unwait(self, c):
        self.waiting.remove(c)
        group = self.waiting_ip.get(c.ip)
        if group is not None:
            group.remove(c)
            if not group:
                del self.waiting_ip[c.ip]

    def _readable(self, c):
        try:
            data = c.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(c)
            return
        if c.state == "idle":  # the next request begins: the header deadline applies from now
            c.state = "head"
            c.deadline = min(c.deadline, time.monotonic() + self.settings.header_timeout)
        if not isinstance(c.buf, bytearray):  # appends in place: a large body arrives in many reads
            c.buf = bytearray(c.buf)
        c.buf += data
        self._maybe_dispatch(c)

    def _maybe_dispatch(self, c):
        if c.state == "body":
            if not self._body_complete(c):
                return
        else:
            head = c.buf.lstrip(b"\r\n")  # RFC 9112 2.2: ignore empty lines before a request
            m = HEAD_END.search(head, 0, MAX_HEAD + 4)
            if m is None:
                if len(head) > MAX_HEAD:
                    self._answer(c, canned(431, "Request Header Fields Too Large",
                                           f"the request head is larger than {MAX_HEAD // 1024} KiB",
                                           "headers_too_large"))
                return
            c.buf = head
            try:
                c.head = parse_head(head[:m.end()])
            except BadHead as e:  # nothing after a refused head is read: it could be a smuggled request
                self.app.metrics.count("bad_requests")
                self._answer(c, canned(e.status, e.reason, e.message, e.code))
                return
            c.continued = False
            if bodies.framing(c.head, self.settings.max_body) in ("length", "chunked"):
                # Every body is read here, where a slow one stays evictable and under its rate
                # deadline; a worker only ever gets a complete request.
                now = time.monotonic()
                c.state, c.body_at, c.body_t0 = "body", m.end(), now
                c.body_until = now + self.settings.body_timeout
                if c.head.expect and c.head.version >= (1, 1):
                    try:
                        c.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")
                        c.continued = True
                    except OSError:
                        pass
                if not self._body_complete(c):
                    return
        self._unwait(c)
        self.sel.unregister(c.sock)
        c.state = "busy"
        with self.lock:
            self.busy += 1
        threading.Thread(target=self._work, args=(c,), name="http-request", daemon=True).start()

    def _body_complete(self, c):
        """True once c's body is buffered; else moves its deadline by the progress made (or
        answers a malformed or oversized chunked body and returns False)."""
        if c.head.chunked:
            try:
                done = bodies.chunked_end(c.buf, c.body_at, self.settings.max_body) is not None
            except bodies.BodyError as e:
                self._answer(c, canned(e.status, e.reason, e.message, e.code))
                return False
        else:
            done = len(c.buf) >= c.body_at + c.head.content_length
        if not done:
            c.deadline = bodies.deadline(c.body_t0, len(c.buf) - c.body_at, self.settings.body_timeout)
        return done

    def _answer(self, c, response):
        """A last answer from the selector thread, then the connection closes."""
        self._close(c, close_sock=False)
        self._linger(c.sock, response)

    def _work(self, c):
        keep = False
        try:
            c.sock.setblocking(True)
            keep = self.handler_cls(c, self).run_one()
        except Exception as e:  # noqa: BLE001 - one request's bug must not leak the connection
            self.app.log(f"internal error serving {c.ip}: {type(e).__name__}: {e}")
        with self.lock:
            self.returned.append((c, keep))
        self._wake()

    def _take_returned(self):
        while True:
            with self.lock:
                if not self.returned:
                    return
                c, keep = self.returned.popleft()
                self.busy -= 1
                self.lock.notify_all()
            c.served += 1
            if not keep or self.draining:
                self._close(c)
                continue
            try:
                c.sock.setblocking(False)
                self.sel.register(c.sock, selectors.EVENT_READ, c)
            except (OSError, ValueError):
                self._close(c, registered=False)
                continue
            if c.buf:
                self._wait(c, "head", self.settings.header_timeout)
                self._maybe_dispatch(c)
            else:
                self._wait(c, "idle", self.settings.keepalive_timeout)

    def _expire(self, now):
        while self.lingering:
            sock, deadline = next(iter(self.lingering.items()))
            if deadline > now:
                break
            self._linger_end(sock)
        late = []
        for c in self.waiting:  # oldest first, but deadlines differ by state: look at all
            if c.deadline <= now:
                late.append(c)
        for c in late:
            if c.state == "body":
                self.app.metrics.count("slow_clients")
                self._answer(c, canned(408, "Request Timeout", bodies.late_message(now < c.body_until,
                                       self.settings.body_timeout), "request_timeout"))
                continue
            if c.state == "head" and (c.buf or c.served == 0):
                self.app.metrics.count("slow_clients")
            self._close(c)

    def _close(self, c, registered=True, close_sock=True):
        if c.state == "closed":
            return
        c.state = "closed"
        self._unwait(c)
        if registered:
            try:
                self.sel.unregister(c.sock)
            except (KeyError, ValueError):
                pass
        if close_sock:
            try:
                c.sock.close()
            except OSError:
                pass
        self.total -= 1
        n = self.per_ip.get(c.ip, 1) - 1
        if n:
            self.per_ip[c.ip] = n
        else:
            self.per_ip.pop(c.ip, None)

    def _close_all(self):
        for key in list(self.sel.get_map().values()):
            if isinstance(key.data, Conn):
                self._close(key.data)
        for sock in list(self.lingering):
            self._linger_end(sock)
        while self.no_room:
            self.no_room.popleft()[0].sock.close()
        self.sel.close()
