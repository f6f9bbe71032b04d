"""Request bodies as the selector thread (conns.py) buffers them: which framing a head asks for,
when a buffered body is complete (Content-Length, or the last chunk of a chunked one), and the
deadline a body in progress has. A body must keep arriving at MIN_RATE bytes a second after a
short grace, within --body-timeout in all: a client that dribbles it is dropped long before the
total deadline, so it cannot keep a connection slot for a minute."""
GRACE_S = 2.0
MIN_RATE = 16 * 1024        # bytes a second
MAX_CHUNK_LINE = 1026       # a chunk-size line with a short extension
MAX_TRAILERS = 64


class BodyError(Exception):
    def __init__(self, status, reason, message, code):
        super().__init__(message)
        self.status, self.reason, self.message, self.code = status, reason, message, code


def framing(head, max_body):
    """"none" (no body), "length", "chunked", or "handler" (a declared length over the cap,
    which the handler refuses with a 413 without reading it)."""
    if head.chunked:
        return "chunked"
    if not head.content_length:
        return "none"
    return "length" if head.content_length <= max_body else "handler"


def deadline(t0, got, body_timeout):
    """When a body that started at `t0` and has `got` bytes so far is late."""
    return min(t0 + body_timeout, t0 + GRACE_S + got / MIN_RATE)


def late_message(rate_fired, body_timeout):
    if rate_fired:
        return (f"the request body arrived slower than {MIN_RATE // 1024} KiB/s; send it at once "
                f"(or within --body-timeout {body_timeout:g} s)")
    return f"the request body did not arrive within {body_timeout:g} s (--body-timeout)"


def _malformed():
    return BodyError(400, "Bad Request", "malformed chunked body; each chunk is `SIZE-IN-HEX CRLF data CRLF`, "
                                         "the last `0 CRLF CRLF`", "incomplete_body")


def chunked_end(buf, pos, cap):
    """The offset just past a complete chunked body that starts at buf[pos], or None while it
    is incomplete. Raises BodyError when it is malformed or its data exceed `cap` bytes."""
    total = 0
    while True:
        nl = buf.find(b"\n", pos, pos + MAX_CHUNK_LINE)
        if nl < 0:
            if len(buf) - pos >= MAX_CHUNK_LINE:
                raise _malformed()
            return None
        try:
            size = int(buf[pos:nl].split(b";")[0].strip(), 16)
        except ValueError:
            raise _malformed() from None
        pos = nl + 1
        if size == 0:
            break
        total += size
        if total > cap:
            mb = cap / (1 << 20)
            raise BodyError(413, "Content Too Large", f"the request body is larger than {mb:g} MiB (--max-body-mb)",
                            "request_too_large")
        if len(buf) < pos + size + 2:
            return None
        if buf[pos + size:pos + size + 2] != b"\r\n":
            raise _malformed()
        pos += size + 2
    for _ in range(MAX_TRAILERS):
        nl = buf.find(b"\n", pos, pos + 8192)
        if nl < 0:
            if len(buf) - pos >= 8192:
                raise _malformed()
            return None
        line, pos = buf[pos:nl + 1], nl + 1
        if line in (b"\r\n", b"\n"):
            return pos
    raise _malformed()
