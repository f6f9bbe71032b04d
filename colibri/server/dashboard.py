"""The dashboard on the API's port: the static files of web/ at `/`, and the telemetry the page
reads: /v1/colibri/experts, /v1/colibri/runtime, /v1/colibri/atlas and the /v1/colibri/events
server-sent event stream of per-turn telemetry (telemetry.py keeps the state). The atlas is the
model directory's experts.json when there is one, else built here from the turns the server
kept (atlas.py), within a fixed amount of work."""
import json
import select
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from colibri import ROOT
from colibri.machine import probe
from colibri.server import atlas
from colibri.chat.params import ApiError

WEB = ROOT / "web"
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png",
         ".ico": "image/x-icon", ".json": "application/json"}
# No inline script or style, nothing from elsewhere; the chat may call another OpenAI endpoint.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self' http: https:; font-src 'self'; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")
STATIC_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                  "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY", "Cache-Control": "no-cache"}
API = ("/v1/colibri/experts", "/v1/colibri/runtime", "/v1/colibri/events", "/v1/colibri/atlas", "/v1/colibri/auth")
HEARTBEAT_S = 15


def handles(path):
    return path == "/" or path.startswith("/ui/") or path == "/favicon.ico" or path in API


def serve(h, app, method, path):
    """Answers a dashboard request on handler `h`; raises ApiError for what the client got wrong."""
    if method not in ("GET", "HEAD"):
        raise ApiError(405, f"use GET {path}", code="method_not_allowed")
    if path not in API:
        return _static(h, path)
    if path == "/v1/colibri/auth":  # public, so the page can ask for a key before it gets a 401
        h.send_json(200, {"required": bool(app.settings.api_key), "authorized": h.authorized()})
        return
    if not h.authorized():
        raise h._unauthorized()
    query = parse_qs(urlsplit(h.path).query)
    if path == "/v1/colibri/experts":
        h.send_json(200, app.telemetry.experts_json(history=query.get("history") == ["1"]))
    elif path == "/v1/colibri/runtime":
        h.send_json(200, runtime_json(app))
    elif path == "/v1/colibri/atlas":
        saved = Path(app.settings.model_dir) / "experts.json"
        if saved.is_file():
            h.send_json(200, saved.read_bytes())
        else:
            h.send_json(200, live_atlas(app.telemetry))
    else:
        _events(h, app, query)


ATLAS_MISSING = ("no expert atlas yet: the server has not finished a turn with an engine that reports routing "
                 "(a model that streams its experts); chat a few turns and open the Atlas again. To keep one "
                 "for this model: PYTHONPATH=. python tools/expert_atlas.py --server URL --out MODEL/experts.json (in the colibri checkout)")
_live = {"seq": None, "doc": None}
_live_lock = threading.Lock()


def live_atlas(tel):
    """The atlas of the server's kept turns, rebuilt once per new turn: the most recent turns
    that fit atlas.LIVE_BUDGET (a 76 x 256 model gets 20 of them). 404 atlas_missing before any."""
    with _live_lock:  # one build at a time; the others wait for it and get the same document
        if _live["seq"] != (id(tel), tel.seq):
            doc = tel.experts_json(history=True)
            n = atlas.turns_within(doc["layers"], doc["experts"])
            try:
                built = atlas.layout(doc, n, method="co-activation PCA, live")
            except atlas.NoRouting:
                built = None
            if built is not None:
                built["source"] = "live"
            _live.update(seq=(id(tel), tel.seq), doc=built)
        if _live["doc"] is None:
            raise ApiError(404, ATLAS_MISSING, code="atlas_missing")
        return _live["doc"]


def _static(h, path):
    name = "index.html" if path == "/" else ("favicon.svg" if path == "/favicon.ico" else path[len("/ui/"):])
    f = (WEB / name).resolve()
    if ".." in name.split("/") or WEB.resolve() not in f.parents or f.suffix not in TYPES or not f.is_file():
        raise ApiError(404, f"no such dashboard file: {path}", code="not_found")
    h.send_json(200, f.read_bytes(), STATIC_HEADERS, content_type=TYPES[f.suffix])


_MACHINE = {}


def machine(model_dir):
    """CPU and GPU are probed once (nvidia-smi is slow); memory and disk on every call."""
    if not _MACHINE:
        found = probe.discover(model_dir)
        _MACHINE.update(cpu=found["cpu"], gpus=found["gpus"])
    return {"cpu": _MACHINE["cpu"], "gpus": _MACHINE["gpus"], "memory": probe.memory_info(),
            "disk": probe.disk_info(model_dir)}


def runtime_json(app):
    st = app.sched.status()
    info, s = st["info"], app.settings
    q = app.model.manifest.get("quant", {})

    def num(k):
        v = info.get(k)
        return int(v) if v is not None and v.isdigit() else v
    engine = {"state": st["state"], "pid": st["pid"], "family": info.get("family"), "threads": num("threads"),
              "ctx": num("ctx"), "kv_slots": s.kv_slots, "kv_type": s.kv or "f16", "kernels": info.get("kernels"),
              "quant": {"experts": q.get("experts"), "dense": q.get("dense")},
              "ram_budget": num("ram_budget"), "cap": num("cap"), "experts": num("experts"),
              "pinned": num("pinned"), "direct": num("direct"), "readahead": num("readahead"),
              "dense_bytes": num("dense_bytes"), "kv_bytes": num("kv_bytes"),
              "expert_cache_bytes": num("expert_cache_bytes"), "expert_bytes": num("expert_bytes")}
    return {"model": app.model.id, "machine": machine(str(s.model_dir)), "engine": engine,
            "requests": {"active": st["active"], "queued": st["queued"], **app.metrics.snapshot()},
            "turns": app.telemetry.runtime_turns(), "telemetry": app.telemetry.overhead(),
            "api_key_required": bool(s.api_key), "uptime_s": round(time.time() - app.started, 1)}


def _events(h, app, query):
    """Server-sent events, one `turn` event per finished turn; ends when the client leaves or
    the server drains (it never holds up a shutdown for more than a second)."""
    tel = app.telemetry
    try:
        seq = int(query.get("after", [""])[0])
    except ValueError:
        seq = tel.seq
    h.close_connection = True
    h.begin_stream({"Cache-Control": "no-cache"})
    h.send_events([f"event: hello\ndata: {json.dumps({'seq': tel.seq})}\n\n".encode()])
    beat = time.monotonic()
    while not h.server.draining:
        seq, evs = tel.wait_events(seq, 1.0)
        out = [f"event: turn\nid: {n}\ndata: {json.dumps(ev, separators=(',', ':'))}\n\n".encode() for n, ev in evs]
        if not out and time.monotonic() - beat > HEARTBEAT_S:
            out = [b": keep-alive\n\n"]
        if out:
            h.send_events(out)
            beat = time.monotonic()
        # client_gone() reads only once the socket is readable: on a socket with a timeout its
        # peek would otherwise wait out that timeout
        if select.select([h.connection], [], [], 0)[0] and h.client_gone():
            return
    h.end_stream()
