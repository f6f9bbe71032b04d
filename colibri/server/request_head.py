"""The request head parser of `coli serve`: what RFC 9112 (HTTP/1.1 message syntax) lets a
server accept, and nothing more.

The selector thread (conns.py) runs every complete head through `parse_head` before a worker
sees it; a head it refuses gets its status and the connection closes, so no byte after a head
whose framing is in doubt is ever read as a request (request smuggling). The rules, with the
section of RFC 9112 (or RFC 9110) each follows:

- request line: `method SP request-target SP HTTP-version`, exactly one space apart (3); no
  HTTP/0.9 (a line without a version); only major version 1 (RFC 9110 2.5: 505 otherwise);
- header lines: `field-name ":" OWS field-value OWS` (5); no space before the colon (5.1), no
  line without a colon, no control characters (NUL, CR, ...) in a value (5.5); a line that
  starts with a space or tab (obsolete line folding) is refused (5.2 allows refusing it);
- Host: exactly one in HTTP/1.1, at most one in HTTP/1.0 (3.2);
- Content-Length: digits only; several (or a list) must all be equal (6.3); with
  Transfer-Encoding, or Transfer-Encoding in HTTP/1.0, the framing is ambiguous: 400 (6.1);
- Transfer-Encoding: `chunked` only, once; any other coding is a 501 (6.1).

tests/test_http_conformance.py compares these decisions with h11's, request by request.
"""
import re

TOKEN = rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+"
REQUEST_LINE = re.compile(rb"(" + TOKEN + rb") ([\x21-\x7e]+) HTTP/([0-9])\.([0-9])")
FIELD_LINE = re.compile(rb"(" + TOKEN + rb"):[ \t]*((?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*)?)[ \t]*")
MAX_LENGTH_DIGITS = 20


class BadHead(Exception):
    """A head the server refuses: the status, its reason phrase, a message for the client
    that says what is wrong, and a stable error code."""

    def __init__(self, status, message, code="bad_request"):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.reason = {400: "Bad Request", 501: "Not Implemented", 505: "HTTP Version Not Supported"}[status]


class Head:
    """A parsed request head. `fields` keeps (lower-case name, value) in order; the body is
    `content_length` bytes, or chunked."""

    __slots__ = ("method", "target", "version", "fields", "content_length", "chunked", "expect")

    def get(self, name, default=None):
        name = name.lower().encode("latin-1")
        for k, v in self.fields:
            if k == name:
                return v.decode("latin-1")
        return default


def _lines(head):
    lines = head.split(b"\n")
    while lines and lines[-1] in (b"", b"\r"):  # the empty line that ends the head
        lines.pop()
    return [ln[:-1] if ln.endswith(b"\r") else ln for ln in lines]


def parse_head(head):
    """Parses a complete head (request line through the empty line); raises BadHead."""
    lines = _lines(head)
    if not lines:
        raise BadHead(400, "the request has no request line; send `METHOD /path HTTP/1.1`")
    m = REQUEST_LINE.fullmatch(lines[0])
    if m is None:
        raise BadHead(400, "malformed request line; send `METHOD /path HTTP/1.1` with single spaces "
                           "(HTTP/0.9 requests are not supported)")
    h = Head()
    h.method, h.target = m.group(1).decode(), m.group(2).decode("latin-1")
    h.version = (int(m.group(3)), int(m.group(4)))
    if h.version[0] != 1:
        raise BadHead(505, f"HTTP/{h.version[0]}.{h.version[1]} is not supported; use HTTP/1.1",
                      code="http_version_not_supported")
    h.fields = []
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t"):
            raise BadHead(400, "a header line starts with whitespace (obsolete line folding); "
                               "send each header on one line")
        f = FIELD_LINE.fullmatch(line)
        if f is None:
            raise BadHead(400, "malformed header line; each header must be `Name: value`, with no space "
                               "before the colon and no control characters in the value")
        h.fields.append((f.group(1).lower(), f.group(2)))
    _framing(h)
    return h


def _framing(h):
    names = [k for k, _ in h.fields]
    hosts = names.count(b"host")
    if hosts > 1:
        raise BadHead(400, "the request has more than one Host header; send exactly one")
    if hosts == 0 and h.version >= (1, 1):
        raise BadHead(400, "an HTTP/1.1 request needs a Host header")
    lengths = set()
    for k, v in h.fields:
        if k == b"content-length":
            lengths.update(x.strip() for x in v.split(b","))
    if len(lengths) > 1:
        raise BadHead(400, "the request has conflicting Content-Length values; send one")
    length = lengths.pop() if lengths else None
    if length is not None and (not re.fullmatch(rb"[0-9]+", length) or len(length) > MAX_LENGTH_DIGITS):
        raise BadHead(400, "Content-Length is not a number; send the body's size in bytes", code="bad_content_length")
    codings = [v for k, v in h.fields if k == b"transfer-encoding"]
    if len(codings) > 1:
        raise BadHead(501, "the request has more than one Transfer-Encoding header; send one: chunked",
                      code="bad_transfer_encoding")
    if codings and codings[0].lower() != b"chunked":
        raise BadHead(501, "unsupported Transfer-Encoding; only `chunked` is supported", code="bad_transfer_encoding")
    if codings and (length is not None or h.version < (1, 1)):
        raise BadHead(400, "Transfer-Encoding with Content-Length, or in an HTTP/1.0 request, makes the body's "
                           "length ambiguous; send one of them, over HTTP/1.1", code="bad_transfer_encoding")
    h.chunked = bool(codings)
    h.content_length = int(length) if length is not None else None
    h.expect = b"expect" in names
