"""The HTTP server `coli serve` and `coli web` run: OpenAI-compatible (and Anthropic Messages)
around one engine.

Stdlib only. The pieces, one job per module of colibri/server/:
  config        flags, environment, validation
  conns         connections: request heads read without a thread each, caps, eviction
  http          HTTP plumbing and the security checks
  scheduler     the engine process, admission queue, KV slot table
  load_policy   when an engine that fails to load is no longer restarted
  generate      one generation request from queue to last byte
  openai / anthropic   request parsing and response shapes per dialect
  colibri/chat  stop sequences, <think> and harmony splitting on the text stream
  metrics       /health counters and /metrics (Prometheus)
  tokens        prompt token counts for /v1/messages/count_tokens
  telemetry     per-turn routing and expert tiers; dashboard: web/ at / and /v1/colibri/*
"""
import ipaddress
import os
import re
import signal
import socket
import sys
import threading
import time
import traceback
import uuid
from urllib.parse import unquote, urlsplit

from colibri import children, sampling
from colibri.server import config as server_config
from colibri.errors import UserError
from colibri.server.anthropic import MessagesResponder, parse_count_tokens, parse_messages
from colibri.server import dashboard, ollama, private_files
from colibri.server.conns import Server
from colibri.server.scheduler import Scheduler, ServedEngine, SlotTable
from colibri.server.telemetry import Telemetry
from colibri.server.generate import Generation
from colibri.server.http import BaseHandler
from colibri.server.metrics import Metrics
from colibri.server.model import ModelInfo
from colibri.server.openai import ChatResponder, CompletionResponder, parse_chat, parse_completion
from colibri.chat.params import ApiError, parse_json_object
from colibri.server.tokens import TokenCounter
from version import VERSION

HELP = "serve the model over HTTP: OpenAI-compatible, Anthropic Messages and ollama APIs"
DESCRIPTION = ("Serve one model over HTTP with the OpenAI API (/v1/chat/completions, /v1/completions, /v1/models), "
               "the Anthropic Messages API (/v1/messages) and the ollama API (/api/chat, /api/generate, /api/tags, "
               "/api/show), plus /health and /metrics. Binds 127.0.0.1 by default.")

REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

GENERATION = {  # path -> (dialect, parser, responder)
    "/v1/chat/completions": ("openai", parse_chat, ChatResponder),
    "/v1/completions": ("openai", parse_completion, CompletionResponder),
    "/v1/messages": ("anthropic", parse_messages, MessagesResponder),
    "/api/chat": ("ollama", ollama.parse_chat_request, ollama.ChatResponder),
    "/api/generate": ("ollama", ollama.parse_generate_request, ollama.GenerateResponder),
}
OLLAMA_INFO = {"/api/tags": "GET", "/api/ps": "GET", "/api/version": "GET", "/api/show": "POST"}
COUNT_TOKENS = "/v1/messages/count_tokens"


def add_arguments(parser):
    server_config.add_arguments(parser)


def make_log():
    lock = threading.Lock()

    def log(msg):
        with lock:
            print(f"{time.strftime('%H:%M:%S')} coli serve: {msg}", file=sys.stderr, flush=True)
    return log


class App:
    def __init__(self, settings, log):
        self.settings, self.log = settings, log
        self.metrics = Metrics()
        self.model = ModelInfo(settings.model_dir, settings.model_id, settings.chat_template, log,
                               aliases=settings.model_aliases, any_name=settings.any_model_name)
        if settings.kv_dir:
            private_files.secure_dir(str(settings.kv_dir), log)
        slots_file = str(settings.kv_dir / "slots.json") if settings.kv_dir else None
        self.slots = SlotTable(settings.kv_slots, slots_file, self.model.fingerprint, log)
        ServedEngine.log = log
        extra = (["--kv-dir", str(settings.kv_dir)] if settings.kv_dir else []) + settings.stream_args
        parallel = settings.parallel or settings.kv_slots
        extra += ["--parallel", str(parallel)]

        def factory():
            return ServedEngine(settings.model_dir, ctx=settings.ctx, kv_slots=settings.kv_slots,
                                threads=settings.threads, batch=settings.batch, extra=extra, kv=settings.kv,
                                spin=settings.spin)
        self.sched = Scheduler(factory, settings.max_queue, self.slots, self.metrics, log,
                               engine_timeout=settings.engine_timeout, prefill_batch=settings.batch, parallel=parallel)
        self.telemetry = Telemetry(settings.model_dir, self.model.manifest)
        self.sched.telemetry = self.telemetry
        self.started = time.time()
        self.host_names = self._host_names()
        self.tokens = TokenCounter(settings.model_dir)
        self.inflight = set()        # Generations in progress, for the shutdown drain
        self.inflight_lock = threading.Lock()

    def _host_names(self):
        """Names of this machine a LAN client may put in Host when the server listens beyond loopback."""
        if server_config.is_loopback_host(self.settings.host):
            return set()
        names = {socket.gethostname().lower()}
        try:
            names.add(socket.getfqdn().lower())
        except OSError:
            pass
        return names

    def health(self, detail=False):
        """/health. Fault details (exit status, engine stderr, paths) only when `detail`: see
        Handler.may_see_details; everyone else gets the short public text."""
        st = self.sched.status()
        counts = self.metrics.snapshot()
        info = st["info"]
        status = {"ready": "ok"}.get(st["state"], st["state"])
        failure = st["gave_up"]
        requests = {"active": st["active"], "queued": st["queued"], "prefilling": st["prefill"], **counts}
        body = {
            "status": status,
            "model": self.model.id,
            "chat_template": self.model.template_origin,  # model | file | chatml-fallback
            "version": VERSION,
            "uptime_s": round(time.time() - self.started, 1),
            "engine": {"state": st["state"], "worker": "running" if st["worker_alive"] else "stopped",
                       "pid": st["pid"], "restarts": st["restarts"],
                       "last_error": st["last_error"] if detail else st["last_error_public"],
                       "last_error_at": st["last_error_at"], "details": bool(detail),
                       # set once the server stopped starting engines (load_policy): what to fix
                       "load_error": None if failure is None else {
                           "kind": failure.kind, "message": failure.reason if detail else None, "fix": failure.fix},
                       "timeout_s": st["timeout_s"], "turn": st["turn"], "family": info.get("family"),
                       "ctx": int(info["ctx"]) if info.get("ctx", "").isdigit() else None,
                       "threads": info.get("threads"), "kernels": info.get("kernels")},
            "requests": requests,
            **requests,  # also flat, for scripts that read health["queued"]
            "queue": {"max": self.settings.max_queue, "timeout_s": self.settings.queue_timeout},
            "kv_slots": {"total": self.settings.kv_slots, "used": st["slots_used"],
                         "persistent": self.settings.kv_dir is not None, "slots": self.slots.occupancy()},
            "experts": {**self.model.expert_summary(), **self.metrics.experts(),
                        "cache_slots_per_layer": _int(info.get("cap")), "pinned_at_start": _int(info.get("pinned")),
                        "direct_io": _flag(info.get("direct")), "readahead": _flag(info.get("readahead"))},
            "memory": {k: _int(info.get(k)) for k in ("ram_budget", "dense_bytes", "kv_bytes", "runtime_bytes",
                                                      "checkpoint_bytes", "grammar_bytes", "mask_cache_bytes",
                                                      "expert_cache_bytes")},
            "last_cancel": self.metrics.last_cancel,
        }
        return (200 if st["state"] == "ready" else 503), body

    def models(self, name=None):
        """The model object under `name` (default: its first name); /v1/models lists one per name."""
        st = self.sched.status()
        ctx = st["info"].get("ctx")
        return {"id": name or self.model.id, "object": "model", "created": self.model.created, "owned_by": "colibri",
                "max_model_len": int(ctx) if ctx and ctx.isdigit() else None,
                "sampling_defaults": sampling.as_api(self.model.defaults, self.model.default_sources)}


def _int(v):
    """A READY integer field, or None when the engine did not send it."""
    return int(v) if isinstance(v, str) and v.isdigit() else None


def _flag(v):
    return None if v is None else v == "1"


class Handler(BaseHandler):
    def do_GET(self):
        self.dispatch("GET")

    def do_POST(self):
        self.dispatch("POST")

    def do_HEAD(self):
        self.dispatch("HEAD")

    def do_OPTIONS(self):
        self.headers_done()
        origin = self.headers.get("Origin")
        if not self.host_allowed() or not origin or not self.origin_allowed(origin):
            self.close_connection = True
            self.send_api_error(ApiError(403, "this origin may not call the server (start it with --cors-origin "
                                              "ORIGIN to allow one)", code="origin_not_allowed"))
            return
        want = self.headers.get("Access-Control-Request-Headers", "")
        allow = want if re.fullmatch(r"[A-Za-z0-9_, -]*", want) and want.strip() else \
            "authorization, content-type, x-api-key, anthropic-version, x-request-id"
        self.send_response(204)
        self._common_headers({"Access-Control-Allow-Methods": "GET, POST, OPTIONS",
                              "Access-Control-Allow-Headers": allow, "Access-Control-Max-Age": "600",
                              "Content-Length": "0"})
        self.end_headers()

    def _method_not_allowed(self):
        self.headers_done()
        self.close_connection = True
        self.send_api_error(ApiError(405, f"method {self.command} is not allowed here", code="method_not_allowed"))

    do_PUT = do_DELETE = do_PATCH = _method_not_allowed

    def dispatch(self, method):
        self.headers_done()
        app = self.server.app
        path = unquote(urlsplit(self.path).path).rstrip("/") or "/"
        self.dialect = "anthropic" if path.startswith("/v1/messages") else "ollama" if path.startswith("/api/") \
            else "openai"
        rid = self.headers.get("x-request-id", "")
        rid = rid if REQUEST_ID.match(rid) else uuid.uuid4().hex
        self.extra_headers["x-request-id"] = rid
        if self.dialect == "anthropic":
            self.extra_headers["request-id"] = rid
        gen = GENERATION.get(path)
        outcome, status = None, None
        try:
            if not self.host_allowed():
                raise ApiError(403, f"Host '{self.headers.get('Host')}' is not allowed (DNS-rebinding protection); "
                                    f"start the server with --allowed-host NAME to accept it", code="host_not_allowed")
            origin = self.headers.get("Origin")
            if origin is not None and not self.origin_allowed(origin):
                raise ApiError(403, f"origin '{origin}' may not call the server (add it with --cors-origin)",
                               code="origin_not_allowed")
            if gen and method == "POST":
                self.extra_headers["x-colibri-queue-wait-ms"] = "0"
                outcome = "invalid"
                if not self.authorized():
                    raise self._unauthorized()
                outcome = self.generate(app, *gen)
                return
            if path == COUNT_TOKENS and method == "POST":
                if not self.authorized():
                    raise self._unauthorized()
                self.count_tokens(app)
                return
            if path in OLLAMA_INFO:
                self.ollama_info(app, method, path)
                return
            self.route(app, method, path)
        except ApiError as e:
            status = e.status
            if gen and outcome is not None:
                outcome = "rejected" if e.status == 429 else ("failed" if e.status >= 500 else "invalid")
            try:
                self.send_api_error(e)
            except OSError:
                self.close_connection = True
        except Exception as e:  # noqa: BLE001 - a bug must not kill the connection silently
            app.log(f"internal error on {method} {path}:\n{traceback.format_exc()}")
            outcome = "failed" if outcome is not None else None
            status = 500
            self.close_connection = True
            if not self.response_started:
                try:
                    self.send_api_error(ApiError(500, f"internal server error ({type(e).__name__}); see the server log",
                                                 code="internal_error"))
                except OSError:
                    pass
        finally:
            self.outcome = outcome
            if gen and outcome is not None:
                app.metrics.outcome(outcome, path, status or {"completed": 200, "cancelled": 499}.get(outcome, 200))

    def may_see_details(self):
        """Fault details in /health: for a caller with the API key; with no key set, for loopback
        callers only (a --allow-remote-without-key server shows LAN clients the short text)."""
        if self.server.app.settings.api_key:
            return self.authorized()
        try:
            return ipaddress.ip_address(self.client_address[0].split("%")[0]).is_loopback
        except (ValueError, IndexError, AttributeError):
            return False

    def _unauthorized(self):
        present = "Authorization" in self.headers or "x-api-key" in self.headers
        return ApiError(401, "Incorrect API key provided" if present else
                        "Missing API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
                        code="invalid_api_key")

    def route(self, app, method, path):
        if path == "/health":
            if method not in ("GET", "HEAD"):
                raise ApiError(405, "use GET /health", code="method_not_allowed")
            code, body = app.health(detail=self.may_see_details())
            retrying = body["engine"]["load_error"] is None  # else waiting will not help
            headers = {"Retry-After": "2"} if code == 503 and retrying else {}
            self.send_json(code, body, headers)
            return
        if dashboard.handles(path):
            dashboard.serve(self, app, method, path)
            return
        known = (path in ("/metrics", "/v1/models", COUNT_TOKENS) or path.startswith("/v1/models/")
                 or path in GENERATION)
        if not known:
            raise ApiError(404, f"no such endpoint: {method} {path}", code="not_found")
        if not self.authorized():
            raise self._unauthorized()
        if path in GENERATION or path == COUNT_TOKENS or method not in ("GET", "HEAD"):
            raise ApiError(405, f"method {method} is not allowed on {path}", code="method_not_allowed")
        if path == "/metrics":
            text = app.metrics.prometheus(app.sched, app.model.id).encode()
            self.send_json(200, text, content_type="text/plain; version=0.0.4; charset=utf-8")
        elif path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [app.models(n) for n in app.model.names]})
        else:
            name = path[len("/v1/models/"):]
            if not app.model.serves(name):
                raise ApiError(404, f"The model '{name}' does not exist; this server serves '{app.model.id}'",
                               code="model_not_found", param="model")
            self.send_json(200, app.models(name))

    def ollama_info(self, app, method, path):
        want = OLLAMA_INFO[path]
        if method != want and not (want == "GET" and method == "HEAD"):
            raise ApiError(405, f"use {want} {path}", code="method_not_allowed")
        if path != "/api/version" and not self.authorized():
            raise self._unauthorized()
        if path == "/api/show":
            ctx = app.sched.status()["info"].get("ctx")
            body = ollama.show(parse_json_object(self.read_body()), app.model, int(ctx) if ctx and ctx.isdigit() else None)
        else:
            body = ollama.tags(app.model) if path == "/api/tags" else ollama.ps(app.model) if path == "/api/ps" \
                else ollama.version()
        self.send_json(200, body)

    def count_tokens(self, app):
        """Anthropic's token counting: the prompt /v1/messages would render, counted by the
        engine's tokenizer (server_tokens)."""
        spec = parse_count_tokens(parse_json_object(self.read_body()), app.model, app.settings.kv_slots)
        self.send_json(200, {"input_tokens": app.tokens.count(spec.payload, spec.opts)})

    def generate(self, app, dialect, parser, responder_cls):
        body = parse_json_object(self.read_body())
        spec = parser(body, app.model, app.settings.kv_slots)
        if isinstance(spec, ollama.OllamaLoad):  # nothing to generate: ollama's "load the model" request
            answer = ollama.load_answer("chat" if responder_cls is ollama.ChatResponder else "generate",
                                        body.get("model"))
            if spec.stream:
                self.begin_stream({}, ollama.ChatResponder.content_type)
                self.send_events([ollama.line(answer)])
                self.end_stream()
            else:
                self.send_json(200, answer)
            return "completed"
        gen = Generation(self, app, spec, responder_cls(spec, app.model.id))
        with app.inflight_lock:
            app.inflight.add(gen)
        try:
            return gen.run()
        finally:
            with app.inflight_lock:
                app.inflight.discard(gen)
            self.tokens = (gen.usage["prompt"], gen.usage["completion"] or gen.tokens)


def run(args, on_listen=None):
    """`on_listen(app, url)` is called once the port is open (`coli web` opens the browser from it)."""
    settings = server_config.resolve(args)
    log = make_log()
    app = App(settings, log)
    try:
        server = Server(settings, Handler, app)
    except OSError as e:
        raise UserError(f"cannot listen on {settings.host}:{settings.port}: {e.strerror or e}") from None
    host, port = server.server_address[:2]
    shown = f"[{host}]" if ":" in str(host) else host
    log(f"colibri {VERSION}: model '{app.model.id}' from {settings.model_dir}")
    log(f"KV slots: {settings.kv_slots}, " + (f"persisted in {settings.kv_dir}" if settings.kv_dir else "not persisted"))
    log(f"queue: {settings.max_queue} waiting at most, {settings.queue_timeout:g} s timeout; API key "
        + ("required" if settings.api_key else "not required"))
    log(f"connections: at most {settings.max_connections}, {settings.max_connections_per_ip} per client address; "
        f"shutdown timeout {settings.shutdown_timeout:g} s")
    if not server_config.is_loopback_host(settings.host) and not settings.api_key:
        log("WARNING: listening beyond loopback without an API key (--allow-remote-without-key)")
    app.sched.start()
    signals = []

    def on_signal(signum, frame):
        signals.append(signum)
        if len(signals) > 1:  # the operator insists: no more waiting
            # os.write, not log(): this thread may be inside log() holding its lock
            os.write(2, f"{time.strftime('%H:%M:%S')} coli serve: second {signal.Signals(signum).name}: "
                        f"ending the engine and exiting now\n".encode())
            left = children.end_all()  # every engine, also one still loading or restarting
            if left:
                os.write(2, f"coli serve: engine process(es) {left} did not exit after SIGKILL\n".encode())
            os._exit(128 + signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    acceptor = threading.Thread(target=server.serve_forever, name="http-acceptor", daemon=True)
    acceptor.start()
    log(f"listening on http://{shown}:{port} (the model is loading; GET /health says when it is ready)")
    if on_listen is not None:
        on_listen(app, f"http://{shown}:{port}/")
    while not signals and acceptor.is_alive() and not startup_failed(app):
        time.sleep(0.2)
    try:
        if startup_failed(app) and not signals:
            refuse_at_start(app, server)
        return drain(app, server, signals[0] if signals else None, log)
    finally:
        left = children.end_all()  # what a graceful close left running (an engine still loading, say)
        if left:
            log(f"engine process(es) {left} did not exit after SIGKILL")


def startup_failed(app):
    st = app.sched.status()
    return st["gave_up"] is not None and not st["ever_loaded"]


def refuse_at_start(app, server):
    """The first load failed in a way a retry cannot fix: the requests that waited for it have
    their answer (the engine's error); close and exit non-zero with that error, as `coli run` does."""
    failure = app.sched.status()["gave_up"]
    server.drain()
    server.wait_idle(5.0)
    server.shutdown()
    server.server_close()
    app.sched.close(timeout=3.0)
    app.tokens.close()
    raise UserError(f"the engine could not load {app.settings.model_dir} ({failure.kind}): {failure.reason}\n"
                    f"coli serve: {failure.fix}")


def drain(app, server, signum, log):
    """Graceful stop: no new connections, running requests get --shutdown-timeout to finish, the
    rest end with an error (an SSE error event once a stream has begun), then the engine stops."""
    timeout = app.settings.shutdown_timeout
    why = signal.Signals(signum).name if signum else "the connection thread stopped"
    server.drain()
    log(f"{why}: shutting down, no longer accepting; {server.in_flight()} request(s) in progress get up to "
        f"{timeout:g} s (--shutdown-timeout); a second signal exits at once")
    ended = 0
    if not server.wait_idle(timeout):
        with app.inflight_lock:
            gens = [g for g in app.inflight if g.job is not None]
        for g in gens:  # wakes the request's thread, which ends its response with this error
            g.job.push(("error", "shutting_down", "the server is shutting down; retry the request"))
        ended = len(gens)
        server.wait_idle(3.0)
    server.shutdown()
    server.server_close()
    app.sched.close(timeout=3.0)
    app.tokens.close()
    log("stopped" + (f"; {ended} request(s) did not finish within --shutdown-timeout and ended with an error"
                     if ended else "; every request in progress finished"))
    return 0 if signum else 1
