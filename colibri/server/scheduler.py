"""One engine process behind a bounded FIFO admission queue.

A single worker thread owns the engine's conversation: it SUBMITs queued jobs while fewer than
`parallel` run (each on a KV slot of its own; the engine batches them, docs/protocol.md
"Concurrency"), and forwards every frame to its job's event list. A reader thread per engine
only turns stdout into events for the worker, so a new job is submitted at once even while the
running ones are silent in a long prefill. HTTP threads only write STOP/CANCEL (under the write
lock). Whatever goes wrong (the engine dies, hangs, sends an odd frame, cannot start, or the
worker itself hits a bug), only the jobs it happened in fail: the worker retires the engine,
starts a new one with back-off and keeps serving the queue. An engine that cannot load stops the
retries as load_policy says (at the first load, or the same failure again and again): queued
and new jobs then get its error. A watchdog kills an engine that stays silent past its liveness
deadline while jobs run.
"""
import json
import math
import os
import threading
import time
import traceback
from collections import deque

from colibri import engine_client, limits
from colibri.server import load_policy, private_files, telemetry

RECENT_TURNS = 16    # requests the Retry-After estimate averages over
RETRY_MAX_S = 3600   # the largest Retry-After sent


class QueueFull(Exception):
    def __init__(self, retry_after):
        super().__init__("queue full")
        self.retry_after = retry_after


class Unavailable(Exception):
    """The engine cannot be started; the message says why. `failure` (a load_policy.LoadFailure)
    when the server has stopped trying."""

    def __init__(self, message, failure=None):
        super().__init__(message)
        self.failure = failure


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

    def __init__(self, n, path=None, fingerprint="", log=None):
        self.prompts = [""] * n
        self.used = [0.0] * n
        self.path, self.fingerprint = path, fingerprint
        self.log = log or (lambda msg: None)
        self.lock = threading.Lock()
        if path and os.path.lexists(path):
            self._load(n)

    def _load(self, n):
        """A damaged, foreign or refused table only costs one cold turn per conversation; the
        log says which file is replaced and why."""
        try:
            saved = json.loads(private_files.read_private(self.path))
            if saved.get("fingerprint") != self.fingerprint:
                self.log(f"slot table {self.path} was written for another model; it will be replaced")
                return
            for i, s in enumerate(saved.get("slots", [])[:n]):
                self.prompts[i], self.used[i] = str(s.get("prompt", "")), float(s.get("used", 0))
        except OSError as e:
            self.log(f"slot table {self.path} refused ({e.strerror or e}): only a regular file is read; "
                     f"it will be replaced")
        except (ValueError, AttributeError, TypeError) as e:
            self.prompts, self.used = [""] * n, [0.0] * n
            self.log(f"slot table {self.path} is damaged ({type(e).__name__}: {e}); it will be replaced")

    def pick(self, prompt, busy=frozenset()):
        """The slot for `prompt` among those not in `busy` (held by running requests)."""
        with self.lock:
            free = [i for i in range(len(self.prompts)) if i not in busy]
            best, best_len = None, -1
            for i in free:
                p = self.prompts[i]
                if p and prompt.startswith(p) and len(p) > best_len:
                    best, best_len = i, len(p)
            if best is None:
                best = min(free, key=lambda i: (bool(self.prompts[i]), self.used[i]))
            return best

    def update(self, slot, prompt):
        with self.lock:
            self.prompts[slot], self.used[slot] = prompt, time.time()
            if not self.path:
                return
            data = {"fingerprint": self.fingerprint,
                    "slots": [{"prompt": p, "used": u} for p, u in zip(self.prompts, self.used)]}
            try:
                private_files.write_private(self.path, json.dumps(data).encode())
            except OSError as e:
                self.log(f"cannot save the slot table {self.path} ({e.strerror or e}); slots start cold "
                         f"after a restart")

    def occupancy(self):
        with self.lock:
            return [{"slot": i, "in_use": bool(p), "prompt_chars": len(p),
                     "last_used": round(u, 3) if u else None} for i, (p, u) in enumerate(zip(self.prompts, self.used))]


# What a client or an unauthenticated /health caller is told about an engine fault: short and
# stable. The detail (exit status, stderr lines, paths) goes to the server log and to /health
# for a caller allowed to see it.
FAULTS = {
    "engine_died": "the engine stopped unexpectedly; it is being restarted",
    "engine_timeout": "the engine stopped responding; it was killed and is being restarted",
    "bad_frame": "the engine sent a malformed reply; it is being restarted",
    "internal_error": "the engine worker hit an internal error; the engine is being restarted",
    "load_failed": "the engine could not be started; the server keeps retrying",
}


def restart_delay(failures):
    """Seconds to wait before starting the engine again after `failures` faults in a row: the
    first restart is immediate, then 1, 2, 4 ... 30 s, so a model that crashes on every start or
    every request does not spin."""
    return 0.0 if failures <= 1 else min(30.0, 2.0 ** (failures - 2))


class Turn:
    """A request the engine is working on: its liveness clock and what its frames told so far."""

    def __init__(self, eng, job, rid, allowance):
        self.eng, self.job, self.rid = eng, job, rid
        self.last = time.monotonic()   # when the engine last said something about this request
        self.allowance = allowance     # seconds of silence tolerated from `last`
        self.accepted = False
        self.produced = 0
        self.routing = None            # this turn's ROUTING counts, when the engine streams experts
        self.prefill = None            # the last PROGRESS while the prompt is prefilled; None once tokens come


class Scheduler:
    def __init__(self, engine_factory, max_queue, slots, metrics, log, engine_timeout=None, prefill_batch=None,
                 parallel=1):
        self.factory, self.max_queue, self.slots, self.metrics, self.log = engine_factory, max_queue, slots, metrics, log
        self.parallel = parallel                    # jobs running in the engine at once (--parallel)
        self.engine_timeout = engine_timeout        # None: no liveness deadline
        self.prefill_batch = prefill_batch or limits.DEFAULT_BATCH
        self.cond = threading.Condition()
        self.write_lock = threading.Lock()
        self.queue = deque()
        self.active = {}            # engine request id -> Turn, in submission order
        self.inbox = deque()        # (engine, frame or EngineError) from the reader thread
        self.engine = None
        self.state = "loading"      # loading | ready | restarting | failed | stopped
        self.last_error = None      # {"kind", "public", "detail", "at"} of the last fault
        self.restarts = 0
        self.failures = 0           # engine faults since the last turn the engine finished cleanly
        self.load = load_policy.LoadPolicy()
        self.gave_up = None         # the LoadFailure that ended the retries; None while retrying
        self.hung = {}              # engine object -> why the watchdog killed it
        self.recent_s = deque(maxlen=RECENT_TURNS)  # durations of the last requests, for Retry-After
        self.telemetry = None       # telemetry.Telemetry: per-turn routing and tiers for the dashboard
        self._closing = False
        self._started = False
        self._thread = threading.Thread(target=self._worker, name="engine-worker", daemon=True)
        self._watch = threading.Thread(target=self._watchdog, name="engine-watchdog", daemon=True)

    def start(self):
        self._started = True
        self._thread.start()
        if self.engine_timeout:
            self.log(f"engine liveness deadline: {self.engine_timeout:g} s of silence per forward step "
                     f"(--engine-timeout)")
            self._watch.start()

    def worker_alive(self):
        return not self._started or self._thread.is_alive()

    # --- admission -------------------------------------------------------------------------
    def mean_request_s(self):
        """The mean duration (engine start to end) of the last requests; before any has ended,
        the age of the oldest running one. Called with self.cond held."""
        if self.recent_s:
            return sum(self.recent_s) / len(self.recent_s)
        now = time.monotonic()
        return max((now - t.job.started_at for t in self.active.values() if t.job.started_at), default=0.0)

    def _retry_s(self):
        """Retry-After: the time for the requests ahead (queued and running) to drain through the
        parallel slots at the recent mean duration, rounded up, at least 1 s (cond held)."""
        ahead = len(self.queue) + len(self.active)
        return max(1, min(RETRY_MAX_S, math.ceil(ahead * self.mean_request_s() / self.parallel)))

    def retry_after(self):
        with self.cond:
            return self._retry_s()

    def enqueue(self, job):
        with self.cond:
            if not self.worker_alive():
                raise Unavailable("the engine worker stopped; restart the server")
            if self.gave_up is not None:
                raise Unavailable(self.gave_up.reason, failure=self.gave_up)
            if self.state in ("failed", "stopped"):
                raise Unavailable(self.last_error["public"] if self.last_error else "the engine is not running")
            if len(self.queue) + len(self.active) >= self.max_queue + self.parallel:
                raise QueueFull(self._retry_s())
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
            eng, err = self.engine, self.last_error
            turns = list(self.active.values())
            turn = turns[0] if turns else None  # the oldest running request
            last = max((t.last for t in turns), default=None)
            alive = self.worker_alive()
            return {
                "state": self.state if alive else "failed",
                "worker_alive": alive,
                "last_error": err["detail"] if err else None,
                "last_error_public": err["public"] if err else None,
                "last_error_at": err["at"] if err else None,
                "restarts": self.restarts,
                "gave_up": self.gave_up,
                "ever_loaded": self.load.served,
                "pid": eng.proc.pid if eng is not None and eng.proc.poll() is None else None,
                "info": dict(eng.info) if eng is not None else {},
                "timeout_s": self.engine_timeout,
                "turn": None if turn is None else {
                    "request": turn.rid, "silent_s": round(time.monotonic() - last, 3),
                    "deadline_s": round(turn.allowance, 3) if self.engine_timeout else None,
                    "cancel_sent": turn.job.cancel_sent_at is not None},
                "prefill": [{"request": t.rid, "slot": t.job.slot, **t.prefill} for t in turns if t.prefill],
                "queued": len(self.queue),
                "active": len(self.active),
                "parallel": self.parallel,
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
            active = [t.job for t in self.active.values()]
            self.cond.notify_all()
        for job in pending:
            job.push(("error", "shutting_down", "the server is shutting down; retry on another instance or later"))
        for job in active:
            self._control(job, "CANCEL")
        self._thread.join(timeout=timeout)
        eng = self.engine
        if eng is not None:
            if self._thread.is_alive():  # a generation that does not honour CANCEL (a stopped engine)
                eng.proc.kill()
            with self.write_lock:
                eng.close()

    # --- faults ----------------------------------------------------------------------------
    def _fault(self, kind, detail):
        """Records an engine fault for /health and the log; the detail never reaches clients."""
        with self.cond:
            self.last_error = {"kind": kind, "public": FAULTS.get(kind, FAULTS["internal_error"]), "detail": detail,
                               "at": round(time.time(), 3)}
            self.failures += 1
        self.log(f"engine fault ({kind}): {detail}")

    def _retire(self, eng, kind, detail):
        """The engine cannot be trusted any more (dead, hung, out of step): kill it; the worker
        starts a new one."""
        with self.cond:
            if self.engine is eng:
                self.engine = None
                self.restarts += 1
                self.state = "restarting"
            self.inbox = deque(x for x in self.inbox if x[0] is not eng)
        self._fault(kind, detail)
        try:
            eng.kill()
        except Exception as e:  # noqa: BLE001 - a failed kill must not stop the worker
            self.log(f"could not end the old engine process: {e!r}")
        self.hung.pop(eng, None)

    def _watchdog(self):
        """Kills an engine that has been silent longer than its allowance while jobs run: any
        frame counts as a sign of life, and the allowance is the largest of the running jobs'
        (a prefill is allowed one deadline per batch). The worker then sees EOF and reports
        engine_timeout to the clients."""
        tick = max(0.05, min(1.0, self.engine_timeout / 4))
        while True:
            with self.cond:
                if self._closing:
                    return
                self.cond.wait(tick)
                turns = list(self.active.values())
            if not turns or turns[0].eng in self.hung:
                continue
            eng = turns[0].eng
            silent = time.monotonic() - max(t.last for t in turns)
            allowance = max(t.allowance for t in turns)
            if silent <= allowance:
                continue
            why = (f"no reply from the engine (pid {eng.proc.pid}) for {silent:.1f} s during request "
                   f"{turns[0].rid}, more than the {allowance:g} s allowed (--engine-timeout)")
            with self.cond:
                if not self.active or next(iter(self.active.values())).eng is not eng:
                    continue  # the turns ended meanwhile: the engine is fine
                self.hung[eng] = why
            self.log(f"{why}; killing it")
            try:
                eng.proc.kill()
            except OSError:
                pass

    # --- the worker ------------------------------------------------------------------------
    def _worker(self):
        """Never returns before close(), nor after it while jobs still run in the engine (their
        CANCELs are answered): every failure ends at most the jobs it happened in."""
        while not self._closing or self.active:
            try:
                self._step()
            except Exception:  # noqa: BLE001 - the worker must survive its own bugs
                detail = traceback.format_exc()
                eng = self.engine
                if eng is not None:
                    self._fail_active(eng, "internal_error", detail)
                    self._retire(eng, "internal_error", detail)
                else:
                    self._fault("internal_error", detail)
                self._pause(restart_delay(self.failures))

    def _step(self):
        eng = self.engine
        if self._closing:  # only the running jobs' last frames are left to read
            eng = None if eng is None or eng.proc.poll() is not None else eng
            if eng is None:
                self._fail_active(self.engine, "shutting_down", "the server is shutting down")
                return
            self._drain_inbox(wait=0.2)
            return
        if self.gave_up is not None:  # nothing more to start; new jobs are refused in enqueue()
            self._fail_queue()
            self._pause(1.0)
            return
        if eng is not None and eng.proc.poll() is not None and not self.active:  # died while idle
            self._retire(eng, "engine_died", eng._died().message)
            eng = None
        if eng is None:
            if not self._pause(restart_delay(self.failures)):
                return
            if not self._start_engine():
                self._fail_queue()
                return
            eng = self.engine
        while self._submit_next(eng):
            pass
        self._drain_inbox(wait=0.5)  # frames and new jobs notify; wakes to notice an idle engine's death

    def _drain_inbox(self, wait):
        with self.cond:
            if not self.inbox:
                self.cond.wait(wait)
            events = list(self.inbox)
            self.inbox.clear()
        for src, item in events:
            if src is not self.engine:
                continue  # a retired engine's last words
            if isinstance(item, Exception):
                self._engine_failed(src, item)
                return
            self._on_frame(src, *item)

    def _pause(self, seconds):
        """Waits the whole time (new requests notify the condition too), unless close() is
        called; False when the server is closing."""
        deadline = time.monotonic() + seconds
        with self.cond:
            while not self._closing and deadline - time.monotonic() > 0:
                self.cond.wait(deadline - time.monotonic())
        return not self._closing

    def _start_engine(self):
        with self.cond:
            if self.state != "loading":
                self.state = "restarting"
        try:
            eng = self.factory()
        except Exception as e:  # noqa: BLE001 - e.g. PermissionError or a missing binary: load_policy decides
            failure = load_policy.classify(e)
        else:
            with self.cond:
                if self._closing:
                    eng.close()
                    return False
                self.engine, self.state = eng, "ready"
                self.load.loaded()
            threading.Thread(target=self._reader, args=(eng,), name="engine-reader", daemon=True).start()
            self.log(f"engine ready (pid {eng.proc.pid}): " + " ".join(f"{k}={v}" for k, v in eng.info.items()))
            if self.telemetry is not None:
                self.telemetry.on_ready(eng.info)
            return True
        with self.cond:
            self.state = "failed"
        self._fault("load_failed", failure.detail)
        if self.load.give_up(failure):
            with self.cond:
                self.gave_up = failure
            n = self.load.streak
            tries = f"after a restart, {n} attempt{'s' * (n > 1)} in a row" if self.load.served else "at start-up"
            self.log(f"the engine cannot load the model ({failure.kind}, {tries}); not retrying"
                     + (f": {failure.reason}; {failure.fix}" if self.load.served else ""))  # else run() says it
        return False

    def _fail_queue(self):
        with self.cond:
            pending = list(self.queue)
            self.queue.clear()
            for job in pending:
                job.state = "done"
            failure = self.gave_up
        for job in pending:
            if failure is not None:  # the Generation words it for its caller (details or not)
                job.push(("error", "engine_load_failed", failure))
            else:
                job.push(("error", "unavailable", FAULTS["load_failed"]))

    def _allowance(self, steps=1):
        """Silence tolerated before the engine counts as hung: --engine-timeout per forward step
        (one decode token, or one prefill batch of --batch positions)."""
        return (self.engine_timeout or 0) * max(1, steps)

    def _reader(self, eng):
        """Turns the engine's stdout into inbox events until it ends (EOF, a malformed frame)."""
        while True:
            try:
                item = eng.read_frame()
            except engine_client.EngineError as e:
                item = e
            except Exception as e:  # noqa: BLE001 - reported as the engine's fault by the worker
                item = engine_client.EngineError("internal_error", f"{type(e).__name__}: {e}")
            with self.cond:
                self.inbox.append((eng, item))
                self.cond.notify_all()
            if isinstance(item, Exception):
                return

    def _submit_next(self, eng):
        """SUBMITs the oldest queued job that can run now (a free place, and its slot not held by
        a running job); False when there is none."""
        with self.cond:
            if len(self.active) >= self.parallel or self._closing:
                return False
            busy = {t.job.slot for t in self.active.values()}
            job = next((j for j in self.queue if j.cache_slot is None or j.cache_slot not in busy), None)
            if job is None:
                return False
            self.queue.remove(job)
            job.state, job.started_at = "running", time.monotonic()
        rid = f"q{next(Job._ids)}"
        try:
            extra = {"routing": 1} if self.telemetry is not None and self.telemetry.wants_routing(eng.info) else {}
            extra["progress"] = 1  # prefill progress: /health, return_progress, and a sign of life on long prompts
            if job.cache_slot is not None:
                job.slot = job.cache_slot
            else:  # a prompt-prefix guess among the free slots (the plain call when all are free)
                job.slot = self.slots.pick(job.key_text, busy=busy) if busy else self.slots.pick(job.key_text)
            try:
                frame = engine_client.submit_frame(rid, job.payload, slot=job.slot, **job.opts, **extra)
            except ValueError as e:  # text the boundary should have refused; nothing reached the engine
                self.log(f"request {rid} not sent to the engine: {e!r}")
                job.push(("error", "internal_error", f"the request could not be encoded: {e}"))
                self._done(job, None)
                return True
            turn = Turn(eng, job, rid, self._allowance())
            with self.write_lock:
                if job.cancelled:
                    job.push(("error", "cancelled", "cancelled before it started"))
                    self._done(job, None)
                    return True
                with self.cond:
                    self.active[rid] = turn
                try:
                    eng.write(frame)
                except engine_client.EngineError:
                    pass  # the reader reports the death, and this job with the others
                job.rid = rid
            job.push(("start", job.slot, job.started_at - job.enqueued_at))
            return True
        except Exception:  # noqa: BLE001 - a bug before the SUBMIT: this job fails, the engine is kept
            detail = traceback.format_exc()
            job.push(("error", "internal_error", detail))
            with self.cond:
                self.active.pop(rid, None)
            self._done(job, None)
            self._fault("internal_error", f"request {rid}: {detail}")
            return True

    def _on_frame(self, eng, verb, f, body):
        rid = f[0] if f else None
        if verb == "ERROR" and rid == "-":  # a frame the engine could not attribute: the oldest job's
            rid = next(iter(self.active), None)
        turn = self.active.get(rid)
        if turn is None:
            return  # a frame of a request that already ended
        job = turn.job
        turn.last = time.monotonic()
        try:
            self._frame(turn, job, verb, f, body)
        except Exception:  # noqa: BLE001 - an odd frame or a bug: this job fails, the engine restarts
            detail = traceback.format_exc()
            self.metrics.count("completion_tokens", turn.produced)
            job.push(("error", "internal_error", detail))
            self._done(job, turn)
            self._fail_active(eng, "internal_error", detail)
            self._retire(eng, "internal_error", f"request {rid}: {detail}")

    def _frame(self, turn, job, verb, f, body):
        wait_s = job.started_at - job.enqueued_at
        tel = self.telemetry
        if verb == "ACCEPT":
            turn.accepted = True
            n_prompt, n_reused = int(f[1]), int(f[2])
            # the next frame comes after prefill: one allowance per prefill batch
            turn.allowance = self._allowance(-(-(n_prompt - n_reused) // self.prefill_batch))
            job.push(("accept", n_prompt, n_reused))
        elif verb == "DATA":
            turn.allowance = self._allowance()
            turn.prefill = None
            if int(f[1]) >= 0:
                turn.produced += 1
                if job.cancel_sent_at is not None:
                    job.tokens_after_cancel += 1
            job.push(("data", int(f[1]), body))
        elif verb == "LOGPROB":
            job.push(("logprob",) + engine_client.parse_logprob(f))
        elif verb == "PROGRESS":
            turn.allowance = self._allowance(-(-(int(f[2]) - int(f[1])) // self.prefill_batch))  # what is left
            turn.prefill = {"done": int(f[1]), "total": int(f[2]), "reused": int(f[3]), "ms": float(f[4])}
            job.push(("progress", int(f[1]), int(f[2]), int(f[3]), float(f[4])))
        elif verb == "ROUTING":  # the body is read already, so a bad shape costs only the telemetry
            try:
                turn.routing = telemetry.parse_routing(f, body)
            except (ValueError, IndexError) as e:
                self.log(f"request {turn.rid}: ROUTING frame ignored: {e}")
        elif verb == "END":
            stats = dict(kv.split("=", 1) for kv in f[1:] if "=" in kv)
            self.metrics.turn(stats, wait_s)
            if tel is not None:
                try:
                    tel.on_turn(stats, turn.routing, wait_s)
                except Exception:  # noqa: BLE001 - the dashboard's bookkeeping never fails a turn
                    self.log(f"telemetry of request {turn.rid} dropped:\n{traceback.format_exc()}")
            self.failures = 0
            job.push(("end", stats))
            self._done(job, turn)
        elif verb == "ERROR":
            kind, msg = f[1], body.decode(errors="replace")
            self.metrics.count("completion_tokens", turn.produced)  # generated, though never delivered
            if kind == "cancelled" and job.cancel_sent_at is not None:
                self.metrics.last_cancel = {
                    "tokens_generated": turn.produced, "tokens_after_cancel": job.tokens_after_cancel,
                    "ms_after_cancel": round((time.monotonic() - job.cancel_sent_at) * 1000, 2)}
            self.failures = 0
            job.push(("error", kind, msg))
            self._done(job, turn)

    def _engine_failed(self, eng, e):
        """The engine died, or its output can no longer be trusted: every running job fails."""
        hung = self.hung.get(eng)
        kind = "engine_timeout" if hung else ("bad_frame" if e.kind == "bad_frame" else "engine_died")
        if e.kind == "internal_error":
            kind = "internal_error"
        detail = f"{hung}; {e.message}" if hung else e.message
        rids = list(self.active)
        self._fail_active(eng, kind, detail)
        self._retire(eng, kind, f"request {', '.join(rids) or '(none running)'}: {detail}")

    def _fail_active(self, eng, kind, detail):
        with self.cond:
            turns = [t for t in self.active.values() if eng is None or t.eng is eng]
        for turn in turns:
            self.metrics.count("completion_tokens", turn.produced)
            turn.job.push(("error", kind, detail))
            self._done(turn.job, turn)

    def _done(self, job, turn):
        """The job ended: its slot keeps the conversation, its place goes to the next one."""
        if turn is not None and turn.accepted:
            self.slots.update(job.slot, job.key_text)
        with self.cond:
            if turn is not None:
                self.active.pop(turn.rid, None)
            job.state = "done"
            if job.started_at is not None:
                self.recent_s.append(time.monotonic() - job.started_at)
            self.cond.notify_all()
