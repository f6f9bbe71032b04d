"""`coli serve` settings: command-line flags, their environment fallbacks and validation.

An explicit flag always wins over the environment; a value the server cannot honour is refused
with the reason (colibri.errors.UserError), never clamped.
"""
import hashlib
import ipaddress
import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from colibri.errors import UserError
from colibri.model.paths import model_arg, require_model
from colibri.limits import DEFAULT_BATCH, DEFAULT_BATCH_AMX, DEFAULT_SPIN, MAX_KV_SLOTS
from colibri.server import private_files
from colibri import launch_opts



@dataclass
class Settings:
    model_dir: Path
    model_id: str
    model_aliases: list = field(default_factory=list)  # other names requests may use
    any_model_name: bool = False    # accept whatever name a request gives
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str = None
    kv_slots: int = 4
    parallel: int = None            # requests the engine runs at once; None: every KV slot
    max_queue: int = 8
    queue_timeout: float = 300.0
    cors_origins: list = field(default_factory=list)
    allowed_hosts: list = field(default_factory=list)
    ctx: int = None
    threads: int = None
    batch: int = None
    spin: int = None                # GOMP_SPINCOUNT of the engine's threads; None: engine_client's default
    kv: str = None
    kv_dir: Path = None
    chat_template: Path = None
    max_body: int = 16 << 20
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    keepalive_timeout: float = 30.0
    max_connections: int = 512
    max_connections_per_ip: int = 64
    shutdown_timeout: float = 20.0
    quiet: bool = False
    engine_timeout: float = None    # seconds of engine silence per forward step before it counts as hung
    stream_args: list = field(default_factory=list)  # the expert store's engine flags (--ram, --cap, ...)


def add_arguments(p):
    model_arg(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    p.add_argument("--api-key", help="require this key (Authorization: Bearer K or x-api-key: K); default $COLI_API_KEY")
    p.add_argument("--api-key-file", help="read the key from this file (keeps it out of the process list)")
    p.add_argument("--allow-remote-without-key", action="store_true",
                   help="allow a non-loopback --host without an API key (anyone who can reach the port can use it)")
    p.add_argument("--max-queue", type=int, help="requests that may wait behind the running ones (default 8; $COLI_MAX_QUEUE)")
    p.add_argument("--parallel", type=int,
                   help="requests decoded together, each on its own KV slot (continuous batching; at most "
                        "--kv-slots, default all of them; $COLI_PARALLEL)")
    p.add_argument("--queue-timeout", type=float,
                   help="seconds a request may wait in the queue before a 429 (default 300; $COLI_QUEUE_TIMEOUT)")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="allow browser requests from this exact origin, e.g. https://app.example.com (repeatable); "
                        "http://localhost and http://127.0.0.1 on any port are always allowed")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="accept this Host header name too (repeatable; IP literals and localhost always pass; "
                        "'*' turns the DNS-rebinding check off)")
    p.add_argument("--model-id", action="append", metavar="NAME[,NAME...]",
                   help="model name clients use (default: the model directory's name); repeat it or separate names "
                        "with commas to accept aliases: the first is the one answers carry")
    p.add_argument("--any-model-name", action="store_true",
                   help="accept any model name in requests (as llama-server does) instead of a 404 for unknown ones")
    p.add_argument("--chat-template", help="Jinja chat template file to use instead of the model's own")
    p.add_argument("--kv-dir", help="directory where KV slots persist across restarts (default: .coli_serve in the "
                                    "model directory if writable, else ~/.cache/colibri/serve/...)")
    p.add_argument("--no-kv-persist", action="store_true", help="keep KV slots in memory only")
    launch_opts.add_engine_flags(
        p, ("ctx", "threads", "batch", "spin", "kv-slots", "kv") + launch_opts.STREAM_FLAGS + launch_opts.DRAFT_FLAGS
        + ("kernels", "no-profile"), group=None,
        ctx={"help": "context length in tokens per slot (default min(model max, 4096))"},
        threads={"help": "compute threads (default: tuned profile, else all cores)"},
        batch={"help": f"positions per forward pass during prefill (default: tuned profile, else {DEFAULT_BATCH}, "
                       f"{DEFAULT_BATCH_AMX} with AMX kernels)"},
        spin={"help": f"{launch_opts.SPIN_HELP} (default: tuned profile, else {DEFAULT_SPIN})"},
        kv_slots={"help": f"independent KV caches, 1-{MAX_KV_SLOTS} (default 4; $COLI_KV_SLOTS)"})
    p.add_argument("--max-body-mb", type=float, default=16.0, help="largest request body in MiB (default 16)")
    p.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds a client has to send its request headers (default 10)")
    p.add_argument("--body-timeout", type=float, default=60.0, help="seconds a client has to send its body (default 60)")
    p.add_argument("--keepalive-timeout", type=float, default=30.0, help="idle seconds before a kept-alive connection closes")
    p.add_argument("--max-connections", type=int,
                   help="open connections in total (default 512, less if the open-files limit is lower); at the "
                        "cap the one idle longest without a request is closed, and only when all are inside "
                        "requests does a new one get a 503")
    p.add_argument("--max-connections-per-ip", type=int,
                   help="open connections from one client address (default 64, at most --max-connections), "
                        "with the same rule")
    p.add_argument("--shutdown-timeout", type=float, default=20.0,
                   help="on SIGTERM/SIGINT, seconds running requests may take to finish before their streams are "
                        "ended with an error (default 20); a second signal exits at once")
    p.add_argument("--engine-timeout", type=float,
                   help="seconds the engine may stay silent per forward step (a decode token or a prefill batch) "
                        "before it counts as hung and is restarted (default 300 + 10 per GB of weights; "
                        "$COLI_ENGINE_TIMEOUT)")
    p.add_argument("--quiet", action="store_true", help="no access log")


def _env_or(value, name, conv, what):
    """The flag's value, else the environment variable's, converted; None when neither is set."""
    if value is not None:
        return value
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return conv(raw.strip())
    except ValueError:
        raise UserError(f"{name}={raw!r} is not {what}") from None


def _check_range(name, v, lo, hi):
    if v is not None and not (lo <= v <= hi):
        raise UserError(f"{name} {v} is out of range: it must be between {lo} and {hi}")


def is_loopback_host(host):
    """True when every address `host` names is a loopback address."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        raise UserError(f"--host {host}: cannot resolve this name") from None
    return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback for i in infos)


def check_origin(origin):
    """An exact origin: scheme://host[:port], no path, no wildcard."""
    from urllib.parse import urlsplit
    if origin == "*":
        raise UserError("--cors-origin '*' is refused: list the exact origins that may call the server")
    u = urlsplit(origin)
    if u.scheme not in ("http", "https") or not u.hostname or u.path not in ("", "/") or u.query or u.fragment:
        raise UserError(f"--cors-origin {origin!r} is not an origin like https://app.example.com[:port]")
    return origin.rstrip("/").lower()


# Descriptors per connection: its socket, plus at most one socket closing after a last answer
# (conns.py lingers at most --max-connections of them); and a margin for engine and tokenizer
# pipes, job pipes, KV and model files.
FD_PER_CONNECTION = 2
FD_MARGIN = 64
DEFAULT_MAX_CONNECTIONS = 512


def _descriptor_limit(need):
    """The open-files limit after raising the soft limit towards `need`; None when unlimited."""
    try:
        import resource
    except ImportError:  # not POSIX: nothing to check
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return None if soft == resource.RLIM_INFINITY else soft


def _max_connections(asked):
    """--max-connections, checked against the open-files limit (raised as far as it needs). The
    default shrinks to fit a low limit; an explicit value that cannot be honoured is refused."""
    n = DEFAULT_MAX_CONNECTIONS if asked is None else asked
    _check_range("--max-connections", n, 2, 100000)
    need = n * FD_PER_CONNECTION + FD_MARGIN
    limit = _descriptor_limit(need)
    if limit is None or limit >= need:
        return n
    fits = (limit - FD_MARGIN) // FD_PER_CONNECTION
    if asked is None and fits >= 16:
        return fits
    raise UserError(f"--max-connections {n} needs {need} open files, but this process may open only {limit} "
                    f"(ulimit -n); lower --max-connections or raise the limit")


def default_kv_dir(model_dir):
    """A state directory under the model if writable, else under ~/.cache/colibri/serve."""
    d = model_dir / ".coli_serve"
    try:
        d.mkdir(mode=private_files.DIR_MODE, exist_ok=True)
        probe = d / ".probe"
        probe.write_bytes(b"")
        probe.unlink()
        return d
    except OSError:
        pass
    tag = hashlib.sha256(str(model_dir.resolve()).encode()).hexdigest()[:12]
    d = Path.home() / ".cache" / "colibri" / "serve" / f"{model_dir.resolve().name}-{tag}"
    private_files.make_dir(d)
    return d


def model_names(values):
    """--model-id values (repeated, or comma-separated) -> the names, first one first, no repeats."""
    names = []
    for v in values or []:
        for name in v.split(","):
            if not name.strip() or any(c.isspace() for c in name.strip()) or name != name.strip():
                raise UserError(f"--model-id {v!r}: each name must be non-empty and without spaces "
                                f"(separate aliases with commas, e.g. --model-id qwen3,gpt-4o-mini)")
            if name not in names:
                names.append(name)
    return names


def resolve(args):
    """argparse namespace -> Settings; raises UserError for anything the server cannot honour."""
    model_dir = require_model(args)
    names = model_names(getattr(args, "model_id", None)) or [model_dir.resolve().name]
    s = Settings(model_dir=model_dir, model_id=names[0], model_aliases=names[1:],
                 any_model_name=bool(getattr(args, "any_model_name", False)))
    s.host, s.port = args.host, args.port
    _check_range("--port", s.port, 0, 65535)

    key = args.api_key
    if args.api_key_file:
        if key is not None:
            raise UserError("give either --api-key or --api-key-file, not both")
        try:
            key = Path(args.api_key_file).read_text().strip()
        except OSError as e:
            raise UserError(f"--api-key-file: {e}") from None
        if not key:
            raise UserError(f"--api-key-file {args.api_key_file} is empty")
    if key is not None and not key:
        raise UserError("--api-key is empty; give a key or leave the flag out")
    s.api_key = key or os.environ.get("COLI_API_KEY") or None
    if s.api_key is not None and (any(c.isspace() for c in s.api_key) or not s.api_key.isprintable()):
        raise UserError("the API key must be printable and contain no spaces")
    if not is_loopback_host(s.host) and not s.api_key and not args.allow_remote_without_key:
        raise UserError(f"--host {s.host} is reachable from other machines and no API key is set: pass --api-key "
                        f"(or COLI_API_KEY), or --allow-remote-without-key if that is really what you want")

    s.kv_slots = _env_or(args.kv_slots, "COLI_KV_SLOTS", int, "an integer")
    s.kv_slots = 4 if s.kv_slots is None else s.kv_slots
    _check_range("--kv-slots", s.kv_slots, 1, MAX_KV_SLOTS)
    par = _env_or(args.parallel, "COLI_PARALLEL", int, "an integer")
    s.parallel = s.kv_slots if par is None else par
    if not 1 <= s.parallel <= s.kv_slots:
        raise UserError(f"--parallel {s.parallel} must be between 1 and --kv-slots ({s.kv_slots}): each running "
                        f"request needs a KV slot of its own; raise --kv-slots or lower --parallel")
    mq = _env_or(args.max_queue, "COLI_MAX_QUEUE", int, "an integer")
    s.max_queue = 8 if mq is None else mq
    _check_range("--max-queue", s.max_queue, 0, 100000)
    qt = _env_or(args.queue_timeout, "COLI_QUEUE_TIMEOUT", float, "a number of seconds")
    s.queue_timeout = 300.0 if qt is None else qt
    if not (0 < s.queue_timeout <= 86400):
        raise UserError(f"--queue-timeout {s.queue_timeout} must be more than 0 and at most 86400 seconds")

    s.cors_origins = [check_origin(o) for o in args.cors_origin]
    s.allowed_hosts = [h.lower() for h in args.allowed_host]
    s.ctx, s.threads, s.batch, s.kv = args.ctx, args.threads, args.batch, args.kv
    _check_range("--threads", s.threads, 1, 1024)
    _check_range("--batch", s.batch, 1, 1 << 16)
    s.spin = args.spin
    launch_opts.check_spin(s.spin)
    man = launch_opts.manifest(model_dir)
    # here, as `coli run` does, not as an engine that fails to load while the server listens
    launch_opts.check_ctx(s.ctx, man["arch"])
    launch_opts.check_cap(args.cap, man["arch"])
    say = lambda msg: print(f"coli serve: {msg}", file=sys.stderr)  # noqa: E731
    tuned = launch_opts.tuned_knobs(args, model_dir, say)
    s.threads, s.batch, s.spin = (tuned.get("threads", s.threads), tuned.get("batch", s.batch),
                                  tuned.get("spin", s.spin))
    launch_opts.check_memory(args, model_dir, man, s.ctx or launch_opts.default_ctx(man), s.kv_slots, say)
    s.stream_args = launch_opts.stream_args(args)
    if args.chat_template:
        s.chat_template = Path(args.chat_template)
        if not s.chat_template.is_file():
            raise UserError(f"--chat-template {s.chat_template}: no such file")
    if args.kv_dir and args.no_kv_persist:
        raise UserError("give either --kv-dir or --no-kv-persist, not both")
    if args.kv_dir:
        s.kv_dir = Path(args.kv_dir)
        try:
            private_files.make_dir(s.kv_dir)
        except OSError as e:
            raise UserError(f"--kv-dir {s.kv_dir}: {e.strerror}") from None
        if not os.access(s.kv_dir, os.W_OK):
            raise UserError(f"--kv-dir {s.kv_dir} is not writable")
    elif not args.no_kv_persist:
        try:
            s.kv_dir = default_kv_dir(model_dir)
        except OSError as e:
            raise UserError(f"no writable place for KV state ({e}); pass --kv-dir DIR or --no-kv-persist") from None

    if not (0 < args.max_body_mb <= 4096):
        raise UserError(f"--max-body-mb {args.max_body_mb} must be more than 0 and at most 4096")
    s.max_body = int(args.max_body_mb * (1 << 20))
    for name in ("header_timeout", "body_timeout", "keepalive_timeout"):
        v = getattr(args, name)
        if not (0 < v <= 3600):
            raise UserError(f"--{name.replace('_', '-')} {v} must be more than 0 and at most 3600 seconds")
        setattr(s, name, v)
    s.max_connections = _max_connections(args.max_connections)
    per_ip = args.max_connections_per_ip
    s.max_connections_per_ip = min(64, s.max_connections) if per_ip is None else per_ip
    _check_range("--max-connections-per-ip", s.max_connections_per_ip, 1, s.max_connections)
    if not (0 <= args.shutdown_timeout <= 3600):
        raise UserError(f"--shutdown-timeout {args.shutdown_timeout} must be between 0 and 3600 seconds")
    s.shutdown_timeout = args.shutdown_timeout
    s.quiet = args.quiet
    et = _env_or(getattr(args, "engine_timeout", None), "COLI_ENGINE_TIMEOUT", float, "a number of seconds")
    s.engine_timeout = default_engine_timeout(model_dir) if et is None else et
    if not (0 < s.engine_timeout <= 7 * 86400):
        raise UserError(f"--engine-timeout {s.engine_timeout} must be more than 0 and at most 604800 seconds")
    return s


def default_engine_timeout(model_dir):
    """Generous enough for one prefill batch that reads every expert from a slow disk: 300 s plus
    10 s per GB of weights (about 100 MB/s)."""
    weights = 0
    try:
        weights = sum(f.stat().st_size for f in Path(model_dir).glob("*.safetensors"))
    except OSError:
        pass
    return 300.0 + 10.0 * weights / 1e9
