"""Helpers for the `coli serve` tests: convert a tiny oracle model, run the real server as a
subprocess on a free loopback port, and talk to it with bounded timeouts."""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COLI = ROOT / "coli"

# A ChatML template with Qwen3-style thinking switches (the tiny oracles ship no template).
CHATML = (
    "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- elif enable_thinking is defined and enable_thinking %}{{ '<think>\\n' }}{%- endif %}{%- endif %}"
)


def convert(oracle_root, name, out):
    """An exact (bf16) container of the oracle `name`, plus a chat template file beside it."""
    out = Path(out)
    if not (out / "colibri.json").exists():
        subprocess.run([sys.executable, str(COLI), "convert", str(Path(oracle_root) / name / "hf"), str(out),
                        "--experts", "bf16", "--dense", "bf16"], check=True, capture_output=True, timeout=120)
    tpl = out.parent / "chatml.jinja"
    tpl.write_text(CHATML)
    return out


class ServerProc:
    """`coli serve` in a subprocess; stderr goes to a file so a chatty log never blocks it."""

    def __init__(self, model, *args, env=None, log_dir=None, wait_ready=True):
        self.log_path = Path(log_dir or model.parent) / f"serve-{os.getpid()}-{time.monotonic_ns()}.log"
        self.log_file = open(self.log_path, "w+b")
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("COLI_")}
        full_env.update(env or {})
        self.proc = subprocess.Popen([sys.executable, str(COLI), "serve", "--model", str(model), "--port", "0", *args],
                                     stdout=self.log_file, stderr=subprocess.STDOUT, env=full_env,
                                     start_new_session=True)
        self.port = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", self.log())
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"coli serve exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.05)
        if self.port is None:
            self.stop()
            raise RuntimeError(f"coli serve did not start listening:\n{self.log()}")
        if wait_ready:
            self.wait_health(lambda h: h["status"] == "ok")

    def log(self):
        return self.log_path.read_bytes().decode(errors="replace")

    @property
    def base(self):
        return f"http://127.0.0.1:{self.port}"

    def request(self, method, path, body=None, headers=None, timeout=30):
        return request(self.port, method, path, body, headers, timeout)

    def health(self):
        status, _, data = self.request("GET", "/health")
        return json.loads(data)

    def wait_health(self, pred, timeout=30):
        deadline = time.monotonic() + timeout
        h = None
        while time.monotonic() < deadline:
            try:
                h = self.health()
                if pred(h):
                    return h
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise AssertionError(f"health never satisfied the condition; last: {h}\n{self.log()[-3000:]}")

    def engine_pid(self):
        return self.health()["engine"]["pid"]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.log_file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def request(port, method, path, body=None, headers=None, timeout=30):
    """One HTTP request on a fresh connection -> (status, headers dict (lower-case), body bytes)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def post_json(port, path, obj, headers=None, timeout=30):
    status, h, data = request(port, "POST", path, obj, {"Content-Type": "application/json", **(headers or {})}, timeout)
    return status, h, (json.loads(data) if data else None)


def raw_exchange(port, data, timeout=10):
    """Sends raw bytes, returns everything the server sends back until it closes (bounded)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        out = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
        return out
    finally:
        s.close()


def sse_events(raw):
    """`data:` payloads of an SSE body (chunked framing already removed by http.client)."""
    return [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]


def stop_engine(pid):
    os.kill(pid, signal.SIGSTOP)


def resume_engine(pid):
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def model(oracle_root, tmp_path_factory):
    return convert(oracle_root, "qwen3_moe", tmp_path_factory.mktemp("serve") / "qwen3_moe")


def as_family(model, out, family):
    """A copy of container `model` at `out` whose manifest names `family`: the server then uses
    that family's chat and tool-call handling over the same weights (for scripted-engine tests)."""
    shutil.copytree(model, out)
    man = json.loads((out / "colibri.json").read_text())
    man["family"] = family
    (out / "colibri.json").write_text(json.dumps(man))
    return out


@pytest.fixture(scope="module")
def template(model):
    return str(model.parent / "chatml.jinja")
