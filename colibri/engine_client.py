"""Launcher side of the engine protocol (docs/protocol.md): spawn, wait for READY, submit,
read frames. Shared by `coli` and the HTTP server; stdlib only."""
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

from colibri import ROOT, children
from colibri.limits import DEFAULT_SPIN
# COLI_ENGINE picks another engine binary (the tests run the sanitizer build this way).
RELEASE = ROOT / "build" / "colibri"  # what `make` builds
ENGINE = Path(os.environ["COLI_ENGINE"]).resolve() if os.environ.get("COLI_ENGINE") else RELEASE


class EngineError(RuntimeError):
    """The engine refused a request (typed ERROR frame) or died."""

    def __init__(self, kind, message, exit_code=None, stderr=()):
        super().__init__(f"{kind}: {message}")
        self.kind, self.message = kind, message
        self.exit_code = exit_code      # load_failed: the engine's exit status (negative: a signal)
        self.stderr = list(stderr)      # load_failed: its last stderr lines, its own error last


def ensure_built():
    """The engine to run: $COLI_ENGINE if set, else build/colibri (built now when missing)."""
    if os.environ.get("COLI_ENGINE") and not ENGINE.exists():
        raise EngineError("not_built", f"COLI_ENGINE names {ENGINE}, which does not exist; build it or unset COLI_ENGINE")
    if not ENGINE.exists():
        _make(ENGINE)
    return ENGINE


def release_engine():
    """build/colibri whatever $COLI_ENGINE says (the converter's byte mover), built now when missing."""
    if not RELEASE.exists():
        _make(RELEASE)
    return RELEASE


def _make(exe):
    # make's chatter goes to stderr: stdout may carry a command's answer
    r = subprocess.run(["make", "-s", "-C", str(ROOT), "build/colibri"], stdout=sys.stderr)
    if r.returncode or not exe.exists():
        raise EngineError("not_built", "the engine is not built and `make` failed; run `make` in the colibri directory")


def engine_env(spin=None):
    """Environment for an engine process. OpenMP threads that spin long between parallel regions
    starve everything else on a busy machine (2 shared cores: 4-9x slower decode with the default
    spin), while sleeping at once makes every region pay a wake-up (SmolLM2 decode 70 tok/s
    passive vs 101 with a short spin). A short spin keeps both. spin (--spin, or the tuned
    profile's) sets it; otherwise the user's own OMP_WAIT_POLICY / GOMP_SPINCOUNT wins."""
    env = dict(os.environ)
    if spin is not None:
        env.pop("OMP_WAIT_POLICY", None)  # it would override the count
        env["GOMP_SPINCOUNT"] = str(spin)
    elif "OMP_WAIT_POLICY" not in env and "GOMP_SPINCOUNT" not in env:
        env["GOMP_SPINCOUNT"] = str(DEFAULT_SPIN)
    return env


def wait_policy(env):
    """The engine threads' wait between parallel regions under env, in words."""
    if "GOMP_SPINCOUNT" in env:
        return f"spin {env['GOMP_SPINCOUNT']}"
    if "OMP_WAIT_POLICY" in env:
        return f"OMP_WAIT_POLICY={env['OMP_WAIT_POLICY']}"
    return "the OpenMP default"


def describe_exit(code, stderr_tail):
    """Explains an engine death: exit code, signal, the likely OOM killer for SIGKILL."""
    if code is None:
        return "the engine is still running"
    if code < 0:
        sig = -code
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        why = f"the engine was killed by {name}"
        if sig == signal.SIGKILL:
            why += " (most likely the kernel's out-of-memory killer: try a smaller --ctx or free some RAM)"
    else:
        why = f"the engine exited with code {code}"
    tail = "\n".join(stderr_tail)
    return f"{why}" + (f"; its last messages:\n{tail}" if tail else "")


class Engine:
    """One engine process. Frames are read by the caller's thread; stderr is kept in a tail."""

    def __init__(self, model_dir, ctx=None, kv_slots=None, threads=None, batch=None, kv_dir=None, extra=(),
                 command=None, kv=None, spin=None):
        """`command` replaces the engine binary (a list: program and its first arguments); the
        model and knob flags follow it as usual. Tests use it to run a scripted engine.
        spin: GOMP_SPINCOUNT for the engine's threads (engine_env)."""
        args = list(command) if command else [str(ensure_built()), "serve"]
        args += ["--model", str(model_dir)]
        for flag, val in (("--ctx", ctx), ("--kv-slots", kv_slots), ("--threads", threads), ("--batch", batch),
                          ("--kv-dir", kv_dir), ("--kv", kv)):
            if val is not None:
                args += [flag, str(val)]
        args += list(extra)
        # A session of its own: a terminal's Ctrl-C goes to the launcher, which decides whether
        # to STOP a generation, instead of killing the engine with it.
        self.proc = children.register(subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                       stderr=subprocess.PIPE, start_new_session=True,
                                                       env=engine_env(spin)))
        self.stderr_tail = deque(maxlen=20)
        self._err_thread = threading.Thread(target=self._drain_stderr, daemon=True)
        self._err_thread.start()
        self.info = {}
        self._next_id = 0
        line = self.proc.stdout.readline().decode(errors="replace").rstrip("\n")
        if not line.startswith("READY"):
            self.proc.wait()
            self._err_thread.join(timeout=2)
            raise EngineError("load_failed", describe_exit(self.proc.returncode, self.stderr_tail),
                              exit_code=self.proc.returncode, stderr=self.stderr_tail)
        for kv in line.split()[1:]:
            k, _, v = kv.partition("=")
            self.info[k] = v

    def _drain_stderr(self):
        for raw in self.proc.stderr:
            self.stderr_tail.append(raw.decode(errors="replace").rstrip())

    def stderr_seen(self, needle, timeout=5.0):
        """Whether a stderr line containing needle (a string), or for which needle(line) holds,
        arrives within timeout seconds. The lines come through their own thread, which may still
        be behind the frames the caller has read."""
        match = needle if callable(needle) else (lambda line: needle in line)
        deadline = time.monotonic() + timeout
        while True:
            if any(match(line) for line in list(self.stderr_tail)):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def _died(self):
        self.proc.wait()
        self._err_thread.join(timeout=2)
        return EngineError("engine_died", describe_exit(self.proc.returncode, self.stderr_tail))

    def new_id(self):
        self._next_id += 1
        return f"r{self._next_id}"

    def submit(self, payload, rid=None, **opts):
        """Sends a SUBMIT; payload is str (text) or a list of token ids (ids=1)."""
        rid = rid or self.new_id()
        self.write(submit_frame(rid, payload, **opts))
        return rid

    def control(self, verb, rid):
        self._write(f"{verb} {rid}\n".encode())

    def write(self, data):
        """Writes prepared frame bytes; raises EngineError if the engine is gone."""
        self._write(data)

    def _write(self, data):
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._died() from None

    def read_frame(self):
        """Returns (verb, fields, body). body is bytes for DATA/ERROR/LOGITS, else None."""
        line = self.proc.stdout.readline()
        if not line:
            raise self._died()
        parts = line.decode(errors="replace").rstrip("\n").split(" ")
        verb = parts[0]
        body = None
        size_field = {"DATA": 3, "ERROR": 3, "LOGITS": 4, "ROUTING": 4}.get(verb)
        if size_field is not None:
            try:
                n = int(parts[size_field])
                if n < 0:
                    raise ValueError(n)
            except (IndexError, ValueError):
                # The byte stream can no longer be trusted: the caller restarts the engine.
                raise EngineError("bad_frame", f"malformed frame from the engine: {line[:200]!r}") from None
            body = self._read_exact(n)
        return verb, parts[1:], body

    def _read_exact(self, n):
        data = self.proc.stdout.read(n) if n else b""
        if len(data) != n:
            raise self._died()
        return data

    def generate(self, payload, **opts):
        """Yields ('accept', n_prompt, n_reused), ('data', token, bytes) ..., ('end', stats);
        with logprobs=1 also ('logprob', token, logprob, bytes, alternatives) after each data; with
        progress=1 ('progress', done, total, reused, ms) after each prefill chunk."""
        rid = self.submit(payload, **opts)
        while True:
            verb, f, body = self.read_frame()
            if f and f[0] != rid and not (verb == "ERROR" and f[0] == "-"):
                continue  # another request's frame (the engine serves one at a time, in order)
            if verb == "ACCEPT":
                yield ("accept", int(f[1]), int(f[2]))
            elif verb == "DATA":
                yield ("data", int(f[1]), body)
            elif verb == "LOGITS":
                yield ("logits", (int(f[1]), int(f[2])), body)
            elif verb == "LOGPROB":
                yield ("logprob",) + parse_logprob(f)
            elif verb == "PROGRESS":
                yield ("progress", int(f[1]), int(f[2]), int(f[3]), float(f[4]))
            elif verb == "END":
                yield ("end", dict(kv.split("=", 1) for kv in f[1:]))
                return
            elif verb == "ERROR":
                raise EngineError(f[1], body.decode(errors="replace"))

    def kill(self):
        """Ends the process at once (also a stopped one) and reaps it."""
        if self.proc.poll() is None:
            try:
                self.proc.kill()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def submit_frame(rid, payload, grammar=None, **opts):
    """The bytes of a SUBMIT frame. Raises ValueError (UnicodeEncodeError) for text that is not
    valid Unicode, before anything reaches the engine. `grammar` (GBNF text) constrains the
    output: it travels at the payload's head, its byte count in `grammar=N`."""
    if isinstance(payload, (list, tuple)):
        opts["ids"] = 1
        payload = ",".join(str(int(i)) for i in payload)
    body = payload.encode() if isinstance(payload, str) else payload
    if grammar:
        g = grammar.encode() if isinstance(grammar, str) else grammar
        opts["grammar"] = len(g)
        body = g + body
    head = " ".join(["SUBMIT", rid, str(len(body))] + [f"{k}={_fmt(v)}" for k, v in opts.items() if v is not None])
    return head.encode() + b"\n" + body


def _hex(h):
    return b"" if h == "-" else bytes.fromhex(h)


def parse_logprob(f):
    """Fields of a LOGPROB line (after the verb) -> (token, logprob, bytes, [(token, logprob, bytes)])."""
    alts = []
    for item in f[5:5 + int(f[4])]:
        tok, lp, hx = item.split(":")
        alts.append((int(tok), float(lp), _hex(hx)))
    return int(f[1]), float(f[2]), _hex(f[3]), alts


def _fmt(v):
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


def model_dir_from(args_model):
    m = args_model or os.environ.get("COLI_MODEL")
    return Path(m) if m else None
