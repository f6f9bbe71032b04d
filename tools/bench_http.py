"""The HTTP half of tools/concurrency_bench.py: start an OpenAI-compatible server (`coli serve`
or llama.cpp's llama-server), send P streamed /v1/completions at once (token-id prompts, greedy,
ignore_eos) and time every streamed token. Stdlib only.

Both servers get the same requests, so both rates include the HTTP and SSE layers."""
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid, proc_root="/proc"):
    """User + system CPU seconds of process pid and all its live descendants (coli serve's engine
    is its child): a machine's load slows a server's wall clock, not the CPU its work takes."""
    tick = os.sysconf("SC_CLK_TCK")
    kids, cpu = {}, {}
    for d in os.listdir(proc_root):
        if not d.isdigit():
            continue
        try:
            with open(os.path.join(proc_root, d, "stat")) as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        except OSError:  # gone meanwhile
            continue
        kids.setdefault(int(fields[1]), []).append(int(d))  # field 4: ppid
        cpu[int(d)] = (int(fields[11]) + int(fields[12])) / tick  # fields 14, 15: utime, stime
    total, todo = 0.0, [pid]
    while todo:
        q = todo.pop()
        total += cpu.get(q, 0.0)
        todo += kids.get(q, [])
    return total


def sse_events(lines):
    """JSON objects of an SSE stream given as an iterable of byte lines; stops at [DONE]."""
    for raw in lines:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        yield json.loads(data)


def chunk_tokens(event):
    """Generated tokens a streamed completion chunk carries: llama-server and colibri send one
    chunk per token; a chunk without choices (the usage chunk) or with empty text carries none."""
    choices = event.get("choices") or []
    return sum(1 for c in choices if c.get("text"))


MODEL_ID = "bench"  # the name coli serve is told to answer to (llama-server takes any)


def stream_one(port, prompt_ids, gen_tokens, t0, out, model=MODEL_ID):
    """One streamed completion; out gets the times (since t0) at which each text chunk arrived
    and the server's completion_tokens (usage) when it sent one."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {"model": model, "prompt": prompt_ids, "max_tokens": gen_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        out["error"] = f"HTTP {resp.status}: {resp.read()[:300]!r}"
        return
    times, usage = [], None
    for ev in sse_events(iter(resp.readline, b"")):
        now = time.perf_counter() - t0
        times += [now] * chunk_tokens(ev)
        if ev.get("usage"):
            usage = ev["usage"].get("completion_tokens")
    conn.close()
    out.update(times=times, usage=usage)


def http_round(port, prompts, gen_tokens):
    """P concurrent streams; returns per-stream chunk arrival times, per-stream completion tokens
    (the usage the server reported, else the chunks counted) and the wall time."""
    outs = [{} for _ in prompts]
    t0 = time.perf_counter()
    threads = [threading.Thread(target=stream_one, args=(port, p, gen_tokens, t0, o)) for p, o in zip(prompts, outs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for o in outs:
        if "error" in o:
            raise SystemExit(f"a request failed: {o['error']}")
    wall = time.perf_counter() - t0
    return [o["times"] for o in outs], [o["usage"] or len(o["times"]) for o in outs], wall


def wait_health(port, proc, what, log, timeout=300):
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            log.seek(0)
            tail = log.read().decode(errors="replace")[-2000:]
            raise SystemExit(f"{what} exited with code {proc.returncode} before it was ready; its last output:\n{tail}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            ok = conn.getresponse().status == 200
            conn.close()
            if ok:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"{what} did not answer /health on port {port} within {timeout}s")


class Server:
    """A server process on a free loopback port, its output kept in a temporary file (shown if
    it fails to start), stopped on exit."""

    def __init__(self, cmd, port, what):
        self.port, self.what = port, what
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def __enter__(self):
        try:
            wait_health(self.port, self.proc, self.what, self.log)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def __exit__(self, *exc):
        self.stop()


def coli_serve_cmd(model, port, p, ctx, threads, extra=()):
    cmd = [sys.executable, str(ROOT / "coli"), "serve", "--model", str(model), "--port", str(port), "--kv-slots", str(p),
           "--parallel", str(p), "--ctx", str(ctx), "--no-kv-persist", "--quiet", "--model-id", MODEL_ID]
    return cmd + (["--threads", str(threads)] if threads else []) + list(extra)


def llama_server_cmd(binary, gguf, port, p, ctx, threads):
    """llama-server with p slots of ctx positions each (-c is the total), continuous batching."""
    cmd = [binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-np", str(p), "-c", str(ctx * p),
           "--cont-batching", "--no-webui"]
    return cmd + (["-t", str(threads), "-tb", str(threads)] if threads else [])
