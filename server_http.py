"""HTTP plumbing on http.server: connection cap, header/body deadlines, body limits, the
Host / Origin / API-key checks, JSON and SSE (chunked) responses, client-disconnect detection."""
import hashlib
import hmac
import ipaddress
import json
import select
import socket
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from server_params import ApiError
from version import VERSION

LOCAL_NAMES = ("localhost", "127.0.0.1", "[::1]", "::1")


class Watchdog:
    """Total deadlines for reading a request: a slow client gets its socket shut down.

    Socket timeouts bound each recv(); a client dribbling one byte at a time would never hit
    them, so this thread enforces the header and body deadlines as a whole."""

    def __init__(self, metrics):
        self.metrics = metrics
        self.lock = threading.Lock()
        self.deadlines = {}   # socket -> (deadline, how, counted)
        self.fired = set()
        t = threading.Thread(target=self._loop, name="deadline-watchdog", daemon=True)
        t.start()

    def arm(self, sock, seconds, how, counted=True):
        """`counted`: a miss is a slow client (not an idle keep-alive connection closing)."""
        with self.lock:
            self.deadlines[sock] = (time.monotonic() + seconds, how, counted)
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
                late = [(s, how, counted) for s, (d, how, counted) in self.deadlines.items() if d <= now]
                for s, _, _ in late:
                    del self.deadlines[s]
                    self.fired.add(s)
            for s, how, counted in late:
                if counted:
                    self.metrics.count("slow_clients")
                try:
                    s.shutdown(how)
                except OSError:
                    pass


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, settings, handler, app):
        self.app = app
        self.max_conns = settings.max_connections
        self.conns = 0
        self.conn_lock = threading.Lock()
        self.watchdog = Watchdog(app.metrics)
        host = settings.host.strip("[]")
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, settings.port), handler)

    def server_bind(self):
        # HTTPServer.server_bind would do a reverse DNS lookup (getfqdn) here; skip it.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]

    def process_request(self, request, client_address):
        with self.conn_lock:
            full = self.conns >= self.max_conns
            if not full:
                self.conns += 1
        if full:
            self.app.metrics.count("connections_refused")
            self._refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            with self.conn_lock:
                self.conns -= 1
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.conn_lock:
                self.conns -= 1

    def _refuse(self, request):
        body = json.dumps(ApiError(503, f"too many connections (--max-connections {self.max_conns}); retry later",
                                   code="too_many_connections").body("openai")).encode()
        head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
                f"\r\nRetry-After: 1\r\nConnection: close\r\n\r\n").encode()
        try:
            request.settimeout(0.5)
            request.sendall(head + body)
        except OSError:
            pass
        self.shutdown_request(request)


def _digest(s):
    return hashlib.sha256(s.encode("utf-8", "surrogateescape")).digest()


class BaseHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = f"colibri/{VERSION}"
    sys_version = ""
    disable_nagle_algorithm = True  # SSE events go out as soon as they are written

    def version_string(self):
        return self.server_version

    def setup(self):
        s = self.server.app.settings
        self.timeout = max(s.header_timeout, s.body_timeout, 30.0)  # per recv/send; totals via the watchdog
        super().setup()
        self.served = 0
        self.extra_headers = {}
        self.dialect = "openai"
        self._chunked = False
        self._watch_sock = True
        self.body_consumed = False

    # --- request reading -------------------------------------------------------------------
    def handle_one_request(self):
        s = self.server.app.settings
        self.extra_headers, self.dialect, self._watch_sock = {}, "openai", True
        self.body_consumed = self.response_started = False
        wait = s.header_timeout if self.served == 0 else s.keepalive_timeout + s.header_timeout
        self.server.watchdog.arm(self.connection, wait, socket.SHUT_RDWR, counted=self.served == 0)
        try:
            super().handle_one_request()
        finally:
            self.server.watchdog.disarm(self.connection)
            self.served += 1

    def headers_done(self):
        """Called first by every do_*: the header deadline no longer applies."""
        self.server.watchdog.disarm(self.connection)

    def handle_expect_100(self):
        cl = self.headers.get("Content-Length", "")
        if cl.strip().isdigit() and int(cl) > self.server.app.settings.max_body:
            self.close_connection = True
            self.send_api_error(self._too_large())
            return False
        return super().handle_expect_100()

    def _too_large(self):
        mb = self.server.app.settings.max_body / (1 << 20)
        return ApiError(413, f"the request body is larger than {mb:g} MiB (--max-body-mb)", code="request_too_large")

    def read_body(self):
        s = self.server.app.settings
        te, cl = self.headers.get("Transfer-Encoding"), self.headers.get("Content-Length")
        if te is not None:
            if te.strip().lower() != "chunked" or cl is not None:
                self.close_connection = True
                raise ApiError(400, "unsupported Transfer-Encoding (only chunked, and not with Content-Length)",
                               code="bad_transfer_encoding")
        elif cl is None:
            self.close_connection = True
            raise ApiError(411, "a request body needs a Content-Length header", code="length_required")
        elif not cl.strip().isdigit():
            self.close_connection = True
            raise ApiError(400, "Content-Length is not a number", code="bad_content_length")
        elif int(cl) > s.max_body:
            self.close_connection = True
            raise self._too_large()
        self.server.watchdog.arm(self.connection, s.body_timeout, socket.SHUT_RD)
        complete = False
        try:
            data = self._read_chunked(s.max_body) if te is not None else self.rfile.read(int(cl))
            complete = data is not None and (te is not None or len(data) == int(cl))
        except OSError:
            data = None
        finally:
            fired = self.server.watchdog.disarm(self.connection)
        self.body_consumed = complete
        if not complete:
            self.close_connection = True
            if fired:
                raise ApiError(408, f"the request body did not arrive within {s.body_timeout:g} s (--body-timeout)",
                               code="request_timeout")
            raise ApiError(400, "the request body ended before it was complete", code="incomplete_body")
        return data

    def _read_chunked(self, cap):
        parts, total = [], 0
        while True:
            line = self.rfile.readline(1026)
            if not line.endswith(b"\n"):
                return None
            try:
                size = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                return None
            if size == 0:
                break
            total += size
            if total > cap:
                self.close_connection = True
                raise self._too_large()
            chunk = self.rfile.read(size + 2)
            if len(chunk) != size + 2:
                return None
            parts.append(chunk[:-2])
        for _ in range(64):  # trailers
            line = self.rfile.readline(8192)
            if line in (b"\r\n", b"\n"):
                return b"".join(parts)
            if not line:
                return None
        return None

    # --- security --------------------------------------------------------------------------
    def host_allowed(self):
        """DNS-rebinding guard: a browser tricked into calling us sends the attacker's name as Host."""
        app = self.server.app
        host = self.headers.get("Host")
        if host is None or "*" in app.settings.allowed_hosts:
            return True
        host = host.strip().lower()
        name = host.rsplit("]", 1)[0].lstrip("[") if host.startswith("[") else host.rsplit(":", 1)[0]
        try:
            ipaddress.ip_address(name)
            return True
        except ValueError:
            pass
        if name == "localhost" or name.endswith(".localhost") or name in app.settings.allowed_hosts:
            return True
        return name in app.host_names

    def origin_allowed(self, origin):
        o = origin.strip().lower().rstrip("/")
        if o in self.server.app.settings.cors_origins:
            return True
        u = urlsplit(o)
        try:
            return u.scheme in ("http", "https") and u.hostname in LOCAL_NAMES and (u.port is None or u.port > 0)
        except ValueError:
            return False

    def cors_headers(self):
        headers = getattr(self, "headers", None)  # absent when the request line itself was bad
        origin = headers.get("Origin") if headers else None
        if origin and self.origin_allowed(origin):
            return {"Access-Control-Allow-Origin": origin, "Vary": "Origin",
                    "Access-Control-Expose-Headers": "x-request-id, x-colibri-queue-wait-ms, retry-after, request-id"}
        return {}

    def authorized(self):
        key = self.server.app.settings.api_key
        if not key:
            return True
        want = _digest(key)
        auth = self.headers.get("Authorization", "")
        offered = [auth[7:].strip()] if auth[:7].lower() == "bearer " else []
        if self.headers.get("x-api-key") is not None:
            offered.append(self.headers["x-api-key"].strip())
        ok = False
        for cand in offered:  # constant time per candidate; no early exit
            ok |= hmac.compare_digest(_digest(cand), want)
        return ok

    # --- responses -------------------------------------------------------------------------
    def log_message(self, fmt, *args):
        app = self.server.app
        if not app.settings.quiet:
            app.log(f"{self.client_address[0]} {fmt % args}")

    def log_request(self, code="-", size="-"):
        rid = self.extra_headers.get("x-request-id", "-")
        self.log_message('"%s" %s %s', self.requestline, str(getattr(code, "value", code)), rid)

    def send_error(self, code, message=None, explain=None):
        """http.server's own errors (bad request line, header too long...) as JSON."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":  # never answer in HTTP/0.9 (no status line, no headers)
            self.request_version = "HTTP/1.0"
        msg = message or self.responses.get(code, ("error",))[0]
        try:
            self.send_api_error(ApiError(code, msg, code="http_error"))
        except OSError:
            pass

    def has_unread_body(self):
        if self.body_consumed or not getattr(self, "headers", None):
            return False
        cl = self.headers.get("Content-Length", "0").strip()
        return self.headers.get("Transfer-Encoding") is not None or cl != "0"

    def send_api_error(self, err):
        headers = dict(err.headers)
        if err.status == 401:
            headers["WWW-Authenticate"] = 'Bearer realm="colibri"'
        self.send_json(err.status, err.body(self.dialect), headers)

    def send_response(self, code, message=None):
        self.response_started = True
        super().send_response(code, message)

    def send_json(self, status, obj, headers=None, content_type="application/json"):
        body = obj if isinstance(obj, bytes) else json.dumps(obj, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self._common_headers(headers)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _common_headers(self, headers):
        if self.has_unread_body():  # its bytes would be read as the next request
            self.close_connection = True
        for k, v in {**self.cors_headers(), **self.extra_headers, **(headers or {})}.items():
            self.send_header(k, str(v))
        if self.close_connection:
            self.send_header("Connection", "close")

    def begin_stream(self, headers):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("X-Accel-Buffering", "no")
        self._chunked = self.request_version == "HTTP/1.1"
        if self._chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.close_connection = True
        self._common_headers(headers)
        self.end_headers()

    def send_events(self, events):
        data = b"".join(events)
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if self._chunked else data)

    def end_stream(self):
        if self._chunked:
            self.wfile.write(b"0\r\n\r\n")

    # --- waiting on a job while watching the client ----------------------------------------
    def client_gone(self):
        """True once the client closed its end (EOF or reset); pipelined data is not a close."""
        try:
            data = self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True
        if data:
            self._watch_sock = False  # the client sent more; stop watching, it is not gone
            return False
        return True

    def wait_job(self, job, timeout):
        """Waits up to `timeout` s for job events or a client close; returns (events, gone)."""
        p = select.poll()
        p.register(job.fileno(), select.POLLIN)
        if self._watch_sock:
            p.register(self.connection.fileno(), select.POLLIN | getattr(select, "POLLRDHUP", 0))
        ready = dict(p.poll(max(0, timeout) * 1000))
        gone = self._watch_sock and self.connection.fileno() in ready and self.client_gone()
        return job.drain(), gone
