"""The request head parser (colibri/server/request_head.py) against h11, a strict HTTP/1.1
implementation: over a corpus of valid and hostile heads, both make the same accept/reject
decision and, for accepted heads, the same body framing. Where RFC 9112 lets a server choose
and colibri chooses differently from h11, the difference is listed in DIFFERENT with its reason;
the test checks that each listed difference is real. Then the hostile heads against a running
server: each gets its error and a closed connection, and no byte after it is served."""
import re

import h11
import pytest

from colibri.server.conns import HEAD_END
from colibri.server.request_head import BadHead, parse_head
from server_helpers import ServerProc, model, raw_exchange, request, template  # noqa: F401

OK = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
POST = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"

CORPUS = {
    "plain": OK,
    "http10 without host": b"GET / HTTP/1.0\r\n\r\n",
    "http10 with host": b"GET / HTTP/1.0\r\nHost: a\r\n\r\n",
    "http12 (minor versions are compatible)": b"GET / HTTP/1.2\r\nHost: a\r\n\r\n",
    "bare LF line ends": b"GET / HTTP/1.1\nHost: a\n\n",
    "lower-case method": b"get / HTTP/1.1\r\nHost: a\r\n\r\n",
    "empty host": b"GET / HTTP/1.1\r\nHost:\r\n\r\n",
    "host with port": b"GET / HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n\r\n",
    "value with inner spaces and tabs": b"GET / HTTP/1.1\r\nHost: a\r\nUser-Agent: x \t y\r\n\r\n",
    "value with obs-text": b"GET / HTTP/1.1\r\nHost: a\r\nX: \x80\xff\r\n\r\n",
    "value with trailing whitespace": b"GET / HTTP/1.1\r\nHost: a\r\nX: b \t\r\n\r\n",
    "absolute-form target": b"GET http://a/v1/models HTTP/1.1\r\nHost: a\r\n\r\n",
    "content-length": POST + b"Content-Length: 5\r\n\r\n",
    "content-length zero": POST + b"Content-Length: 0\r\n\r\n",
    "content-length repeated, same": POST + b"Content-Length: 5\r\nContent-Length: 5\r\n\r\n",
    "content-length list, same": POST + b"Content-Length: 5, 5\r\n\r\n",
    "chunked": POST + b"Transfer-Encoding: chunked\r\n\r\n",
    "chunked, upper case": POST + b"Transfer-Encoding: Chunked\r\n\r\n",
    "expect": POST + b"Content-Length: 5\r\nExpect: 100-continue\r\n\r\n",
    # hostile or malformed
    "content-length conflicting": POST + b"Content-Length: 5\r\nContent-Length: 50\r\n\r\n",
    "content-length list, conflicting": POST + b"Content-Length: 5, 6\r\n\r\n",
    "content-length signed": POST + b"Content-Length: +5\r\n\r\n",
    "content-length negative": POST + b"Content-Length: -1\r\n\r\n",
    "content-length hex": POST + b"Content-Length: 0x10\r\n\r\n",
    "content-length empty": POST + b"Content-Length:\r\n\r\n",
    "content-length huge": POST + b"Content-Length: 1" + b"0" * 30 + b"\r\n\r\n",
    "transfer-encoding gzip": POST + b"Transfer-Encoding: gzip\r\n\r\n",
    "transfer-encoding gzip, chunked": POST + b"Transfer-Encoding: gzip, chunked\r\n\r\n",
    "transfer-encoding twice": POST + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
    "transfer-encoding with obs whitespace": POST + b"Transfer-Encoding : chunked\r\n\r\n",
    "transfer-encoding and content-length": POST + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
    "transfer-encoding in http10": b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
    "http11 without host": b"GET / HTTP/1.1\r\n\r\n",
    "duplicate host": b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    "duplicate host in http10": b"GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n",
    "space before colon": b"GET / HTTP/1.1\r\nHost : a\r\n\r\n",
    "tab before colon": b"GET / HTTP/1.1\r\nHost\t: a\r\n\r\n",
    "line without colon": b"GET / HTTP/1.1\r\nHost: a\r\nfoo\r\nContent-Length: 5\r\n\r\n",
    "empty field name": b"GET / HTTP/1.1\r\nHost: a\r\n: x\r\n\r\n",
    "field name with a slash": b"GET / HTTP/1.1\r\nHost: a\r\nX/Y: 1\r\n\r\n",
    "NUL in value": b"GET / HTTP/1.1\r\nHost: a\r\nX: a\x00b\r\n\r\n",
    "bare CR in value": b"GET / HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n",
    "NUL in name": b"GET / HTTP/1.1\r\nHost: a\r\nX\x00: 1\r\n\r\n",
    "obsolete line folding": b"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n",
    "folding into content-length": POST + b"X: a\r\n Content-Length: 5\r\n\r\n",
    "continuation first": b"GET / HTTP/1.1\r\n Host: a\r\n\r\n",
    "http09": b"GET /\r\n\r\n",
    "http2 version": b"GET / HTTP/2.0\r\nHost: a\r\n\r\n",
    "lower-case version": b"GET / http/1.1\r\nHost: a\r\n\r\n",
    "double space in request line": b"GET  / HTTP/1.1\r\nHost: a\r\n\r\n",
    "trailing space in request line": b"GET / HTTP/1.1 \r\nHost: a\r\n\r\n",
    "tab in request line": b"GET\t/ HTTP/1.1\r\nHost: a\r\n\r\n",
    "space in target": b"GET /a b HTTP/1.1\r\nHost: a\r\n\r\n",
    "obs-text in target": b"GET /\x80 HTTP/1.1\r\nHost: a\r\n\r\n",
    "NUL in target": b"GET /\x00 HTTP/1.1\r\nHost: a\r\n\r\n",
    "method with a slash": b"G/ET / HTTP/1.1\r\nHost: a\r\n\r\n",
    "no target": b"GET HTTP/1.1\r\nHost: a\r\n\r\n",
    "version with two digits": b"GET / HTTP/1.10\r\nHost: a\r\n\r\n",
}

# Where RFC 9112 lets a server choose and colibri refuses what h11 accepts: name -> reason.
DIFFERENT = {
    "obsolete line folding": "RFC 9112 5.2: a server may refuse obs-fold with 400 instead of unfolding it",
    "folding into content-length": "RFC 9112 5.2, as above; here the fold would hide a framing header",
    "transfer-encoding and content-length": "RFC 9112 6.1: a server may refuse a request with both",
    "transfer-encoding in http10": "RFC 9112 6.1: HTTP/1.0 with Transfer-Encoding has faulty framing",
    "http2 version": "RFC 9110 15.6.6: 505 for a major version the server does not support",
}


def h11_decision(raw):
    """(accepted, framing) as h11 sees the head: framing is ('length', n) or ('chunked',)."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(raw)
    try:
        event = conn.next_event()
    except h11.RemoteProtocolError:
        return False, None
    assert isinstance(event, h11.Request), event
    fields = dict(event.headers)
    if b"transfer-encoding" in fields:
        return True, ("chunked",)
    if b"content-length" in fields:
        return True, ("length", int(fields[b"content-length"]))
    return True, None


def our_decision(raw):
    m = HEAD_END.search(raw)
    assert m is not None, "every corpus entry is a complete head"
    try:
        head = parse_head(raw[:m.end()])
    except BadHead:
        return False, None
    if head.chunked:
        return True, ("chunked",)
    return True, None if head.content_length is None else ("length", head.content_length)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_same_decision_as_h11(name):
    raw = CORPUS[name]
    ours, theirs = our_decision(raw), h11_decision(raw)
    if name in DIFFERENT:
        assert ours[0] is False and theirs[0] is True, f"{name}: the listed difference is gone"
    else:
        assert ours == theirs, f"{name}: colibri {ours}, h11 {theirs}"


def test_the_corpus_has_both_kinds():
    decisions = [our_decision(raw)[0] for raw in CORPUS.values()]
    assert decisions.count(True) >= 15 and decisions.count(False) >= 30


def test_refusals_name_the_problem():
    with pytest.raises(BadHead) as e:
        parse_head(CORPUS["content-length conflicting"])
    assert e.value.status == 400 and "Content-Length" in e.value.message
    with pytest.raises(BadHead) as e:
        parse_head(CORPUS["transfer-encoding gzip"])
    assert e.value.status == 501 and "chunked" in e.value.message
    with pytest.raises(BadHead) as e:
        parse_head(CORPUS["http2 version"])
    assert e.value.status == 505


@pytest.fixture(scope="module")
def server(model, template):  # noqa: F811
    with ServerProc(model, "--chat-template", template, "--no-kv-persist") as s:
        yield s


STATUS_LINE = re.compile(rb"HTTP/1\.1 \d{3} [A-Za-z ]+\r\n")  # JSON bodies hold no raw CR LF
SMUGGLED = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@pytest.mark.parametrize("name,status", [
    ("content-length conflicting", 400), ("content-length list, conflicting", 400),
    ("transfer-encoding and content-length", 400), ("transfer-encoding gzip", 501),
    ("http11 without host", 400), ("duplicate host", 400), ("space before colon", 400),
    ("line without colon", 400), ("NUL in value", 400), ("http09", 400), ("obsolete line folding", 400),
    ("http2 version", 505),
])
def test_the_server_refuses_and_closes(server, name, status):
    """A refused head gets its status and a closed connection; the request smuggled after it
    (and its body) is never answered."""
    head = CORPUS[name].replace(b"Host: a\r\n", b"Host: 127.0.0.1\r\n")
    out = raw_exchange(server.port, head + b"{\"x\":1}" + SMUGGLED)
    assert out.startswith(b"HTTP/1.1 %d " % status), out[:200]
    assert len(STATUS_LINE.findall(out)) == 1 and b"Connection: close" in out, out


def test_valid_pipelined_requests_are_still_served(server):
    out = raw_exchange(server.port, OK + OK.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
    assert STATUS_LINE.findall(out) == [b"HTTP/1.1 200 OK\r\n"] * 2, out[:400]
    assert request(server.port, "GET", "/metrics")[0] == 200
