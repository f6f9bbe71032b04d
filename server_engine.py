"""One engine process behind a bounded FIFO admission queue.

A single worker thread owns the engine's stdout: it takes the oldest job, SUBMITs it, and
forwards its frames to the job's event list. HTTP threads only write STOP/CANCEL (under the
write lock). If the engine dies, the running job gets an error, the worker restarts the engine
and the queue keeps being served.
"""
import json
import os
import threading
import time
from collections import deque

import engine_client


class QueueFull(Exception):
    def __init__(self, retry_after):
        super().__init__("queue full")
        self.retry_after = retry_after


class Unavailable(Exception):
    """The engine cannot be started; the message says why."""


class ServedEngine(engine_client.Engine):
    """engine_client.Engine whose stderr also reaches the server log."""

    log = None

    def _drain_stderr(self):
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            self.stderr_tail.append(line)
            if ServedEngine.log:
                ServedEngine.log(f"engine: {line}")


class Job:
    """One generation request. The worker pushes events; the HTTP thread waits on `fileno()`."""

    _ids = iter(range(1, 1 << 62))

    def __init__(self, payload, opts, cache_slot=None, key_text=""):
        self.payload, self.opts, self.cache_slot, self.key_text = payload, opts, cache_slot, key_text
        self.state = "new"          # new -> queued -> running -> done
        self.rid = None             # engine request id, set once SUBMIT is written
        self.cancelled = False
        self.slot = None
        self.enqueued_at = self.started_at = None
        self.cancel_sent_at = None
        self.tokens_after_cancel = 0
        self._events = deque()
        self._lock = threading.Lock()
        self._closed = False
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)

    def fileno(self):
        return self._r

    def push(self, ev):
        with self._lock:
            if self._closed:
                return
            self._events.append(ev)
            try:
                os.write(self._w, b".")
            except BlockingIOError:
                pass  # the pipe is full, so it is readable already

    def drain(self):
        with self._lock:
            evs = list(self._events)
            self._events.clear()
            if not self._closed:
                try:
                    os.read(self._r, 65536)
                except BlockingIOError:
                    pass
            return evs

    def close(self):
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self._r)
                os.close(self._w)


class SlotTable:
    """Which KV slot holds which conversation, so each conversation keeps its slot.

    A request goes to the slot whose last prompt is a prefix of its own (the same conversation,
    one turn later; the longest such prefix wins), else to the least recently used slot. The
    engine itself reuses the common token prefix, so a wrong guess costs speed, never
    correctness. Persisted next to the engine's KV files so a restart keeps the mapping."""

    def __init__(self, n, path=None, fingerprint=""):
        self.prompts = [""] * n
        self.used = [0.0] * n
        self.path, self.fingerprint = path, fingerprint
        self.lock = threading.Lock()
        if path and os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as f:
                    saved = json.load(f)
                if saved.get("fingerprint") == fingerprint:
                    for i, s in enumerate(saved.get("slots", [])[:n]):
                        self.prompts[i], self.used[i] = str(s.get("prompt", "")), float(s.get("used", 0))
            except (OSError, ValueError, AttributeError, TypeError):
                pass  # a damaged table only costs one cold turn per conversation

    def pick(self, prompt):
        with self.lock:
            best, best_len = None, -1
            for i, p in enumerate(self.prompts):
                if p and prompt.startswith(p) and len(p) > best_len:
                    best, best_len = i, len(p)
            if best is None:
                best = min(range(len(self.prompts)), key=lambda i: (bool(self.prompts[i]), self.used[i]))
            return best

    def update(self, slot, prompt):
        with self.lock:
            self.prompts[slot], self.used[slot] = prompt, time.time()
            if not self.path:
                return
            data = {"fingerprint": self.fingerprint,
                    "slots": [{"prompt": p, "used": u} for p, u in zip(self.prompts, self.used)]}
            tmp = f"{self.path}.tmp"
            try:
                with open(tmp, "w", encoding="utf-8") as f:
                    json.dump(data, f)
                os.replace(tmp, self.path)
            except OSError:
                pass

    def occupancy(self):
        with self.lock:
            return [{"slot": i, "in_use": bool(p), "prompt_chars": len(p),
                     "last_used": round(u, 3) if u else None} for i, (p, u) in enumerate(zip(self.prompts, self.used))]


class Scheduler:
    def __init__(self, engine_factory, max_queue, slots, metrics, log):
        self.factory, self.max_queue, self.slots, self.metrics, self.log = engine_factory, max_queue, slots, metrics, log
        self.cond = threading.Condition()
        self.write_lock = threading.Lock()
        self.queue = deque()
        self.active = None
        self.engine = None
        self.state = "loading"      # loading | ready | restarting | failed | stopped
        self.last_error = None
        self.restarts = 0
        self.turn_s = 1.0           # moving average of a turn's duration, for Retry-After
        self._closing = False
        self._thread = threading.Thread(target=self._worker, name="engine-worker", daemon=True)

    def start(self):
        self._thread.start()

    # --- admission -------------------------------------------------------------------------
    def retry_after(self):
        with self.cond:
            ahead = len(self.queue) + (1 if self.active else 0)
        return max(1, min(60, int(self.turn_s * max(ahead, 1) + 0.999)))

    def enqueue(self, job):
        with self.cond:
            if self.state in ("failed", "stopped"):
                raise Unavailable(self.last_error or "the engine is not running")
            if len(self.queue) + (1 if self.active else 0) >= self.max_queue + 1:
                ahead = len(self.queue) + 1
                raise QueueFull(max(1, min(60, int(self.turn_s * ahead + 0.999))))
            job.state, job.enqueued_at = "queued", time.monotonic()
            self.queue.append(job)
            self.cond.notify_all()

    def withdraw(self, job):
        """Takes a job that has not started out of the queue; False if it already started."""
        with self.cond:
            if job.state == "queued":
                self.queue.remove(job)
                job.state = "done"
                return True
            return False

    def cancel(self, job):
        """The client went away: drop the job if queued, else CANCEL it in the engine."""
        if self.withdraw(job):
            return
        with self.cond:
            job.cancelled = True
        self._control(job, "CANCEL")

    def stop(self, job):
        """A stop sequence matched: end the generation normally."""
        self._control(job, "STOP")

    def _control(self, job, verb):
        with self.write_lock:
            if job.rid and job.state != "done" and self.engine is not None:
                try:
                    self.engine.control(verb, job.rid)
                except engine_client.EngineError:
                    return  # the worker reports the death
                if verb == "CANCEL" and job.cancel_sent_at is None:
                    job.cancel_sent_at = time.monotonic()

    def status(self):
        with self.cond:
            eng = self.engine
            return {
                "state": self.state,
                "last_error": self.last_error,
                "restarts": self.restarts,
                "pid": eng.proc.pid if eng is not None and eng.proc.poll() is None else None,
                "info": dict(eng.info) if eng is not None else {},
                "queued": len(self.queue),
                "active": 1 if self.active else 0,
                "slots_used": sum(1 for p in self.slots.prompts if p),
            }

    def close(self, timeout=15):
        with self.cond:
            self._closing = True
            self.state = "stopped"
            pending = list(self.queue)
            self.queue.clear()
            for job in pending:
                job.state = "done"
            active = self.active
            self.cond.notify_all()
        for job in pending:
            job.push(("error", "unavailable", "the server is shutting down"))
        if active is not None:
            self._control(active, "CANCEL")
        self._thread.join(timeout=timeout)
        eng = self.engine
        if eng is not None:
            if self._thread.is_alive():  # a generation that does not honour CANCEL (a stopped engine)
                eng.proc.kill()
            with self.write_lock:
                eng.close()

    # --- the worker ------------------------------------------------------------------------
    def _worker(self):
        backoff = 1.0
        while not self._closing:
            eng = self.engine
            if eng is None or eng.proc.poll() is not None:
                if eng is not None:
                    self._engine_died(eng._died().message)
                if not self._start_engine():
                    self._fail_queue()
                    with self.cond:
                        self.cond.wait(backoff)
                    backoff = min(backoff * 2, 30.0)
                    continue
                backoff = 1.0
            job = self._next_job()
            if job is not None:
                self._run(job)

    def _start_engine(self):
        with self.cond:
            if self.state != "loading":
                self.state = "restarting"
        try:
            eng = self.factory()
        except engine_client.EngineError as e:
            with self.cond:
                self.state, self.last_error = "failed", e.message
            self.log(f"engine failed to start: {e.message}")
            return False
        with self.cond:
            if self._closing:
                eng.close()
                return False
            self.engine, self.state = eng, "ready"
        self.log(f"engine ready (pid {eng.proc.pid}): " + " ".join(f"{k}={v}" for k, v in eng.info.items()))
        return True

    def _engine_died(self, reason):
        with self.cond:
            self.engine = None
            self.restarts += 1
            self.last_error = reason
            self.state = "restarting"
        self.log(f"engine died ({reason}); restarting it")

    def _fail_queue(self):
        with self.cond:
            pending = list(self.queue)
            self.queue.clear()
            for job in pending:
                job.state = "done"
        for job in pending:
            job.push(("error", "unavailable", self.last_error or "the engine could not be started"))

    def _next_job(self):
        with self.cond:
            if not self.queue:
                self.cond.wait(0.5)  # wakes periodically to notice an engine that died while idle
            if not self.queue or self._closing:
                return None
            job = self.queue.popleft()
            job.state, job.started_at = "running", time.monotonic()
            self.active = job
            return job

    def _run(self, job):
        eng = self.engine
        wait_s = job.started_at - job.enqueued_at
        job.slot = job.cache_slot if job.cache_slot is not None else self.slots.pick(job.key_text)
        rid = f"q{next(Job._ids)}"
        accepted = False
        produced = 0
        try:
            with self.write_lock:
                if job.cancelled:
                    job.push(("error", "cancelled", "cancelled before it started"))
                    return
                eng.submit(job.payload, rid=rid, slot=job.slot, **job.opts)
                job.rid = rid
            job.push(("start", job.slot, wait_s))
            while True:
                verb, f, body = eng.read_frame()
                if not f or (f[0] != rid and not (verb == "ERROR" and f[0] == "-")):
                    continue  # a frame of an earlier, already finished request
                if verb == "ACCEPT":
                    accepted = True
                    job.push(("accept", int(f[1]), int(f[2])))
                elif verb == "DATA":
                    if int(f[1]) >= 0:
                        produced += 1
                        if job.cancel_sent_at is not None:
                            job.tokens_after_cancel += 1
                    job.push(("data", int(f[1]), body))
                elif verb == "LOGPROB":
                    job.push(("logprob",) + engine_client.parse_logprob(f))
                elif verb == "END":
                    stats = dict(kv.split("=", 1) for kv in f[1:] if "=" in kv)
                    self.metrics.turn(stats, wait_s)
                    job.push(("end", stats))
                    return
                elif verb == "ERROR":
                    kind, msg = f[1], body.decode(errors="replace")
                    self.metrics.count("completion_tokens", produced)  # generated, though never delivered
                    if kind == "cancelled" and job.cancel_sent_at is not None:
                        self.metrics.last_cancel = {
                            "tokens_generated": produced, "tokens_after_cancel": job.tokens_after_cancel,
                            "ms_after_cancel": round((time.monotonic() - job.cancel_sent_at) * 1000, 2)}
                    job.push(("error", kind, msg))
                    return
        except engine_client.EngineError as e:
            self.metrics.count("completion_tokens", produced)
            job.push(("error", "engine_died", e.message))
            self._engine_died(e.message)
        finally:
            if accepted:
                self.slots.update(job.slot, job.key_text)
            with self.cond:
                job.state = "done"
                self.active = None
                self.turn_s = 0.8 * self.turn_s + 0.2 * (time.monotonic() - job.started_at)
                self.cond.notify_all()
