"""Prompt token counts for POST /v1/messages/count_tokens.

The engine protocol has no tokenize-only request, and a SUBMIT with max_tokens=0 would still
prefill and overwrite a KV slot. So the count comes from the engine binary's own tokenizer in
batch mode (`colibri tokenize --batch`, the same C tokenizer, the same tokenizer.json and the
same special-token switches as the SUBMIT), kept running: a count never waits behind a
generation and costs no model memory."""
import os
import select
import subprocess
import threading
from pathlib import Path

from colibri import children, engine_client
from colibri.chat.params import ApiError

TIMEOUT_S = 30.0


class TokenCounter:
    def __init__(self, model_dir):
        self.model_dir = Path(model_dir)
        self.procs = {}               # (special, add_special) -> tokenizer process
        self.lock = threading.Lock()  # one record in flight per process

    def count(self, payload, opts):
        """Tokens the engine would read for this SUBMIT payload and options."""
        if isinstance(payload, (list, tuple)):  # token ids already
            return len(payload)
        if not (self.model_dir / "tokenizer.json").is_file():
            raise ApiError(400, "this model has no tokenizer.json, so its tokens cannot be counted",
                           code="tokenizer_missing")
        # A chat prompt arrives as the SUBMIT payload: bytes led by its literal-span table.
        data = payload if isinstance(payload, bytes) else payload.encode("utf-8", "surrogatepass")
        literal = int(opts.get("literal", 0) or 0)
        key = (int(opts.get("special", 1)) != 0, int(opts.get("add_special", 0)) != 0)
        with self.lock:
            line = self._ask(key, data, literal)
        if line.startswith("ERR "):
            raise ApiError(400, f"the prompt cannot be tokenized: {line[4:]}", code="invalid_request")
        return line.count(",") + 1 if line else 0

    def _ask(self, key, data, literal=0):
        for _ in range(2):  # a process that died is started once more
            p = self.procs.get(key) or self._start(key)
            try:
                head = b"%d %d\n" % (len(data), literal) if literal else b"%d\n" % len(data)
                p.stdin.write(head + data)
                p.stdin.flush()
                line = self._readline(p)
            except OSError:
                line = None
            if line is not None:
                return line
            self._drop(key)
        raise ApiError(503, "the tokenizer process is not answering; retry the request", code="tokenizer_unavailable",
                       headers={"Retry-After": "2"})

    def _start(self, key):
        special, add_special = key
        args = [str(engine_client.ensure_built()), "tokenize", "--model", str(self.model_dir), "--batch"]
        args += [] if special else ["--no-special"]
        args += ["--add-special"] if add_special else []
        p = children.register(subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                               stderr=subprocess.DEVNULL, start_new_session=True))
        self.procs[key] = p
        return p

    @staticmethod
    def _readline(p):
        """One answer line, or None if the process ended or stayed silent for TIMEOUT_S."""
        fd, out = p.stdout.fileno(), b""
        while not out.endswith(b"\n"):
            ready, _, _ = select.select([fd], [], [], TIMEOUT_S)
            chunk = os.read(fd, 1 << 20) if ready else b""
            if not chunk:
                return None
            out += chunk
        return out.decode(errors="replace").rstrip("\n")

    def _drop(self, key):
        p = self.procs.pop(key, None)
        if p is not None:
            p.kill()
            p.wait()

    def close(self):
        with self.lock:
            for key in list(self.procs):
                self._drop(key)
