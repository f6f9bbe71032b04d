"""HTTP plumbing on http.server's request handler: the body deadline and limits, the Host /
Origin / API-key checks, JSON and SSE (chunked) responses, client-disconnect detection.
Connections, request heads and their deadlines are conns.py's job."""
import hashlib
import hmac
import ipaddress
import json
import select
import socket
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit

from colibri.server.conns import ConnReader, ConnWriter
from colibri.chat.params import ApiError
from version import VERSION

LOCAL_NAMES = ("localhost", "127.0.0.1", "[::1]", "::1")
# Response headers a browser page may read (CORS hides all but a few by default).
EXPOSED_HEADERS = ", ".join(("x-request-id", "request-id", "retry-after", "x-colibri-queue-wait-ms", "x-colibri-slot",
                             "x-colibri-prompt-tokens", "x-colibri-reused-tokens"))


def _digest(s):
    return hashlib.sha256(s.encode("utf-8", "surrogateescape")).digest()


class BaseHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = f"colibri/{VERSION}"
    sys_version = ""

    def version_string(self):
        return self.server_version

    def __init__(self, conn, server):
        """One request on `conn`, whose complete head the selector thread has read already."""
        self.conn = conn
        self.request = self.connection = conn.sock
        self.client_address = conn.addr
        self.server = server
        self.setup()

    def setup(self):
        s = self.server.app.settings
        self.timeout = max(s.header_timeout, s.body_timeout, 30.0)  # per recv/send; totals via the watchdog
        self.connection.settimeout(self.timeout)
        self.rfile = ConnReader(self.connection, self.conn.buf)
        self.wfile = ConnWriter(self.connection)
        self.served = self.conn.served
        self.close_connection = True
        self.extra_headers = {}
        self.dialect = "openai"
        self._chunked = False
        self._watch_sock = True
        self.body_consumed = self.response_started = False
        self.sent_status = None     # the status line sent, for the access log
        self.outcome = None         # a generation's outcome (metrics.OUTCOMES)
        self.tokens = None          # a generation's (prompt, completion) tokens

    def run_one(self):
        """Serves the request; returns True when the connection may carry another one."""
        t0 = time.monotonic()
        try:
            self.handle_one_request()
        except OSError:  # the client went away mid-response
            self.close_connection = True
        finally:
            self.log_access((time.monotonic() - t0) * 1000)
        if self.server.draining:
            self.close_connection = True
        self.conn.buf = self.rfile.leftover()
        return not self.close_connection

    def headers_done(self):
        """Called first by every do_*; the head was complete before the request reached a thread."""

    def handle_expect_100(self):
        if self.conn.continued:  # the selector sent "100 Continue" and read the body already
            return True
        length = self.conn.head.content_length
        if length is not None and length > self.server.app.settings.max_body:
            self.close_connection = True
            self.send_api_error(self._too_large())
            return False
        return super().handle_expect_100()

    def _too_large(self):
        mb = self.server.app.settings.max_body / (1 << 20)
        return ApiError(413, f"the request body is larger than {mb:g} MiB (--max-body-mb)", code="request_too_large")

    def read_body(self):
        s = self.server.app.settings
        head = self.conn.head  # framing checked by request_head.py: no TE with CL, one length
        chunked, length = head.chunked, head.content_length
        if not chunked and length is None:
            self.close_connection = True
            raise ApiError(411, "a request body needs a Content-Length header", code="length_required")
        if not chunked and length > s.max_body:
            self.close_connection = True
            raise self._too_large()
        self.server.watchdog.arm(self.connection, s.body_timeout, socket.SHUT_RD)
        complete = False
        try:
            data = self._read_chunked(s.max_body) if chunked else self.rfile.read(length)
            complete = data is not None and (chunked or len(data) == length)
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
                    "Access-Control-Expose-Headers": EXPOSED_HEADERS}
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
        """http.server calls this when the status line goes out; the line is written at the end."""
        self.sent_status = str(getattr(code, "value", code))

    def log_access(self, ms):
        """One access-log line per request once it has ended: client, request line, status,
        request id, latency, and for a generation its prompt and completion tokens. A client that
        went away (queued, or mid-stream after a 200 went out) is logged as 499 cancelled."""
        if not getattr(self, "requestline", ""):
            return  # nothing arrived that makes a request
        status = self.sent_status or "-"
        if self.outcome == "cancelled":
            status = "499"
        line = f'"{self.requestline}" {status} {self.extra_headers.get("x-request-id", "-")} {ms:.0f} ms'
        if self.tokens is not None:
            line += f" prompt={self.tokens[0]} completion={self.tokens[1]}"
        if self.outcome == "cancelled":
            line += " cancelled: the client went away" + (f" after a {self.sent_status}" if self.sent_status else "")
        self.log_message("%s", line)

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
        head = self.conn.head
        return head.chunked or bool(head.content_length)

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

    def begin_stream(self, headers, content_type=None):
        self.send_response(200)
        self.send_header("Content-Type", content_type or "text/event-stream; charset=utf-8")
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
