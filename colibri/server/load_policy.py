"""When `coli serve` stops starting an engine that fails to load.

A failure at the first load is a setting or a file only the operator can fix (a --ram too small
for the dense trunk, a damaged container, an engine binary that cannot run): the server prints
the engine's error and exits. Once the engine has served, a crash is restarted with back-off;
a restarted engine that fails to load the same way MAX_SAME times in a row, or in a way no retry
can change, ends the retries: requests get the engine's error and /health shows it.
"""
from dataclasses import dataclass

from colibri import engine_client

MAX_SAME = 3  # the same load error this many times in a row after a crash: give up

# Kinds a retry cannot change. "busy" (another engine holds --kv-dir) is the only kind retried
# at the first load too: that engine may exit, and this server then takes over.
PERMANENT = {"cannot_start", "bad_arguments"}
RETRIED_AT_START = {"busy"}

FIX = {
    "load_refused": "fix what the engine's message says (a flag such as --ram or --ctx, or the model files; "
                    "`coli doctor --deep` checks them), then start coli serve again",
    "load_crashed": "the engine died while loading (out of memory, or a bug): free memory or lower --ram / --ctx, "
                    "then start coli serve again",
    "bad_arguments": "the engine binary does not match this launcher: rebuild it with `make` (or unset COLI_ENGINE), "
                     "then start coli serve again",
    "cannot_start": "the engine binary cannot be run: build it with `make` or point COLI_ENGINE at a working one, "
                    "then start coli serve again",
    "busy": "another engine uses the KV directory: stop it, or give this server its own --kv-dir",
    "internal_error": "the server could not start the engine (the log has the traceback); start coli serve again",
}


@dataclass
class LoadFailure:
    kind: str      # a key of FIX
    reason: str    # the engine's own error: its last stderr line, or the exception's text
    detail: str    # everything known: exit status and the stderr tail (server log, /health)

    @property
    def fix(self):
        return FIX.get(self.kind, FIX["internal_error"])


def classify(exc):
    """The LoadFailure of an exception raised while starting the engine."""
    if isinstance(exc, engine_client.EngineError):
        if exc.kind != "load_failed":  # not_built: COLI_ENGINE names nothing, or `make` failed
            return LoadFailure("cannot_start", exc.message, exc.message)
        code = exc.exit_code
        kind = ("load_crashed" if code is None or code < 0 else
                {2: "bad_arguments", 3: "busy"}.get(code, "load_refused"))  # docs/protocol.md: exit codes
        last = next((ln.strip() for ln in reversed(exc.stderr) if ln.strip()), "")
        how = engine_client.describe_exit(code, ())  # "the engine exited with code 1", "... killed by SIGSEGV"
        if code is not None and code > 0:
            reason = last or how  # the engine's own error is its last line (main.c)
        else:
            reason = f"{how}; its last message: {last}" if last else how
        return LoadFailure(kind, reason, exc.message)
    text = f"{type(exc).__name__}: {exc}"
    return LoadFailure("cannot_start" if isinstance(exc, OSError) else "internal_error", text, text)


class LoadPolicy:
    def __init__(self, max_same=MAX_SAME):
        self.max_same = max_same
        self.served = False  # an engine has loaded once: later failures follow a crash
        self.streak, self.last = 0, None

    def loaded(self):
        self.served, self.streak, self.last = True, 0, None

    def give_up(self, failure):
        """True when no more engines should be started after `failure`."""
        same = self.last is not None and (self.last.kind, self.last.detail) == (failure.kind, failure.detail)
        self.streak = self.streak + 1 if same else 1
        self.last = failure
        if failure.kind in RETRIED_AT_START:
            return False
        if not self.served or failure.kind in PERMANENT:
            return True
        return self.streak >= self.max_same
