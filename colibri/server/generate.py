"""Drives one generation request: admission, waiting in the queue, the engine's events through
the text pipeline, and the response (JSON or SSE) in the dialect of the endpoint.

Nothing is sent to the client before the engine ACCEPTs the prompt, so a full queue, a queue
timeout or a prompt that does not fit is a plain HTTP error, never a broken stream."""
import json
import time

from colibri.server.scheduler import Job, QueueFull, Unavailable
from colibri.chat.params import ApiError
from colibri.chat.pipeline import TextPipeline

ENGINE_ERRORS = {  # kind -> (HTTP status, error code)
    "context_exceeded": (400, "context_length_exceeded"),
    "bad_request": (400, "invalid_request"),
    "out_of_memory": (503, "out_of_memory"),
    "engine_died": (500, "engine_crashed"),
    "engine_timeout": (504, "engine_timeout"),
    "bad_frame": (500, "internal_error"),
    "internal_error": (500, "internal_error"),
    "unavailable": (503, "engine_unavailable"),
    "shutting_down": (503, "engine_unavailable"),  # the engine is going away with the server
}

# Faults of the engine or the server, not of the request: the client gets this short, stable
# text; the detail (exit status, stderr, paths, tracebacks) is in the server log and /health.
FAULT_MESSAGES = {
    "engine_died": "the engine stopped unexpectedly during this request; it is being restarted, retry the request",
    "engine_timeout": "the engine stopped responding during this request (--engine-timeout); it was restarted, "
                      "retry the request",
    "bad_frame": "internal error while generating (the server log has the details); retry the request",
    "internal_error": "internal error while generating (the server log has the details); retry the request",
    "unavailable": "the engine is not available: it could not be started (the server log says why); retry later",
}


def engine_error(kind, message):
    """An engine ERROR frame or a fault -> the ApiError the client sees."""
    status, code = ENGINE_ERRORS.get(kind, (500, "engine_error"))
    if kind in FAULT_MESSAGES:
        message = FAULT_MESSAGES[kind]
    elif kind not in ENGINE_ERRORS:
        message = f"the engine failed this request ({kind}); retry the request"
    headers = {"Retry-After": "2"} if status >= 500 else {}
    return ApiError(status, message, code=code, headers=headers)


def load_failed_error(failure, detail):
    """The server stopped starting the engine (load_policy): a 503 without Retry-After, since
    only the operator can fix it. The engine's own message only for a caller allowed to see
    details (as /health's last_error); everyone else gets its kind."""
    why = f": {failure.reason}" if detail else " (the server log says why)"
    return ApiError(503, f"the engine cannot load the model ({failure.kind}){why}; the server has stopped retrying "
                         f"until its operator fixes this and restarts it", code="engine_load_failed")


class ClientGone(Exception):
    pass


class Generation:
    def __init__(self, handler, app, spec, responder):
        self.h, self.app, self.spec, self.resp = handler, app, spec, responder
        self.pipe = TextPipeline(spec.stops, spec.think, spec.in_reasoning,
                                 harmony_prompt=spec.key_text if spec.harmony else None)
        self.toolf = spec.tools.filter() if spec.tools is not None and spec.tools.parses else None
        self.calls = []  # parsed tool calls (non-streaming; streamed ones only counted)
        self.n_calls = 0
        self.content, self.reasoning = [], []
        self.entries, self.pending_lp, self.held = [], [], []
        self.tokens = 0
        self.usage = {"prompt": 0, "completion": 0, "reused": 0}
        self.stop_sent = False
        self.streaming = False
        self.finished = False   # the engine ended the job (END or ERROR seen), or it never entered the queue
        self.job = None

    def run(self):
        """Returns the outcome (see metrics.OUTCOMES); raises ApiError before any header."""
        spec = self.spec
        self.job = job = Job(spec.payload, spec.opts, spec.cache_slot, spec.key_text)
        try:
            return self._run(job)
        except ClientGone:
            self.h.close_connection = True
            return "cancelled"
        finally:
            if not self.finished:  # the client left, or an error: free the engine and the queue place
                self.app.sched.cancel(job)
            job.close()

    def _run(self, job):
        app, sched = self.app, self.app.sched
        try:
            sched.enqueue(job)
        except QueueFull as e:
            self.finished = True
            raise ApiError(429, f"the server is busy: {app.settings.max_queue} requests are already waiting "
                                f"(--max-queue); retry in {e.retry_after} s", code="queue_full",
                           headers={"Retry-After": str(e.retry_after)}) from None
        except Unavailable as e:
            self.finished = True
            if e.failure is not None:
                raise load_failed_error(e.failure, self.h.may_see_details()) from None
            raise ApiError(503, f"the engine is not available: {e}; retry later", code="engine_unavailable",
                           headers={"Retry-After": "5"}) from None
        deadline = job.enqueued_at + app.settings.queue_timeout
        while True:
            queued = job.state == "queued"
            evs, gone = self.h.wait_job(job, min(deadline - time.monotonic(), 5.0) if queued else 5.0)
            if gone:
                raise ClientGone()
            if not evs and not sched.worker_alive():  # no one will ever answer this job
                evs = [("error", "internal_error", "the engine worker stopped")]
            if not evs and job.state == "queued" and time.monotonic() >= deadline:
                if sched.withdraw(job):
                    self.finished = True
                    app.metrics.count("timed_out")
                    self.h.extra_headers["x-colibri-queue-wait-ms"] = str(int(app.settings.queue_timeout * 1000))
                    raise ApiError(429, f"the request waited {app.settings.queue_timeout:g} s in the queue "
                                        f"(--queue-timeout) without reaching the engine; retry later",
                                   code="queue_timeout", headers={"Retry-After": str(sched.retry_after())})
            for ev in evs:
                outcome = self._event(ev)
                if outcome:
                    return outcome

    def _event(self, ev):
        kind = ev[0]
        if kind == "start":
            self.h.extra_headers["x-colibri-queue-wait-ms"] = str(int(ev[2] * 1000))
            self.h.extra_headers["x-colibri-slot"] = str(ev[1])
        elif kind == "accept":
            self.usage["prompt"], self.usage["reused"] = ev[1], ev[2]
            self.h.extra_headers["x-colibri-prompt-tokens"] = str(ev[1])
            self.h.extra_headers["x-colibri-reused-tokens"] = str(ev[2])
            if self.spec.stream:
                self._write(lambda: self.h.begin_stream({}, getattr(self.resp, "content_type", None)))
                self.streaming = True
                self._send(self.resp.stream_start(self.usage))
        elif kind == "data":
            if self.pipe.matched is None:
                if ev[1] >= 0:
                    self.tokens += 1
                self.held += self._tool_calls(self.pipe.feed(ev[2]))
                if (self.pipe.matched is not None or (self.toolf and self.toolf.done())) and not self.stop_sent:
                    self.stop_sent = True
                    self.app.sched.stop(self.job)
                if not self.spec.logprobs or ev[1] < 0:
                    self._flush()
        elif kind == "progress":
            if self.streaming and self.spec.return_progress and hasattr(self.resp, "stream_progress"):
                self._send(self.resp.stream_progress(*ev[1:5]))
        elif kind == "logprob":
            if len(self.entries) < self.tokens:  # only tokens before the stop sequence ended the answer
                self.entries.append(ev[1:])
                self.pending_lp.append(ev[1:])
            self._flush()
        elif kind == "end":
            return self._finish(ev[1])
        elif kind == "error":
            return self._error(ev[1], ev[2])
        return None

    def _tool_calls(self, pieces, final=False):
        """Content pieces through the family's tool-call filter (calls come out as their own pieces)."""
        out = []
        for p in pieces:
            if p[0] == "tool_call":  # a call the splitter found itself (harmony)
                out += self.toolf.take(p[1]) if self.toolf else [("content", json.dumps(p[1]["arguments"]))]
            elif p[0] == "content" and self.toolf:
                out += self.toolf.feed(p[1])
            else:
                out.append(p)
        return out + (self.toolf.finish() if final and self.toolf else [])

    def _flush(self):
        pieces, self.held = self.held, []
        for kind, text in pieces:
            if kind.startswith("tool_call"):  # a whole call, or the start / arguments / end of one
                if self.streaming:
                    self.n_calls += kind in ("tool_call", "tool_call_start")
                    self._send(self.resp.stream_piece(kind, text, []))
                elif kind in ("tool_call", "tool_call_end") and text is not None:
                    self.calls.append(text)
                    self.n_calls += 1
                continue
            if self.streaming:
                self._send(self.resp.stream_piece(kind, text, self.pending_lp))
                self.pending_lp = []
            else:
                (self.reasoning if kind == "reasoning" else self.content).append(text)

    def _finish(self, stats):
        self.finished = True
        self.held += self._tool_calls(self.pipe.finish(), final=True)
        self._flush()
        matched = self.pipe.matched
        finish = "stop" if matched is not None else stats.get("finish", "stop")
        if self.n_calls:
            finish = "tool_calls"
        try:
            self.usage["completion"] = self.tokens if matched is not None else int(stats["completion_tokens"])
        except (KeyError, ValueError):
            self.usage["completion"] = self.tokens
        if self.streaming:
            if self.pending_lp:
                self._send(self.resp.stream_piece("content", "", self.pending_lp))
            self._send(self.resp.stream_end(finish, matched, self.usage))
            self._write(self.h.end_stream)
        else:
            body = self.resp.body("".join(self.content), "".join(self.reasoning), self.entries, finish, matched,
                                  self.usage, calls=self.calls)
            self._write(lambda: self.h.send_json(200, body))
        return "completed"

    def _error(self, kind, message):
        self.finished = True
        if kind == "cancelled":
            raise ClientGone()
        if kind == "engine_load_failed":  # message: the LoadFailure (scheduler._fail_queue)
            err = load_failed_error(message, self.h.may_see_details())
        else:
            err = engine_error(kind, message)
        if not self.streaming:
            raise err
        self._send(self.resp.stream_error(err))
        self._write(self.h.end_stream)
        self.h.close_connection = True
        return "failed" if err.status >= 500 else "invalid"

    def _send(self, events):
        self._write(lambda: self.h.send_events(events))

    def _write(self, fn):
        try:
            fn()
        except OSError:  # broken pipe, reset, or a client that stopped reading past the socket timeout
            raise ClientGone() from None
