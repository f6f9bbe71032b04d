"""Counters and histograms of the server, rendered for /health (JSON) and /metrics (Prometheus)."""
import threading

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TOKS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
WAIT_BUCKETS = (0.001, 0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300)


class Histogram:
    def __init__(self, buckets):
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.count = 0
        self.sum = 0.0

    def observe(self, v):
        self.count += 1
        self.sum += v
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1

    def render(self, name, help_text):
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        for b, c in zip(self.buckets, self.counts):
            lines.append(f'{name}_bucket{{le="{b}"}} {c}')
        lines += [f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {self.sum:.6f}", f"{name}_count {self.count}"]
        return lines


# Request outcomes. Every generation request ends in exactly one of these, so they add up to
# the number of generation requests the server answered.
OUTCOMES = ("completed", "rejected", "cancelled", "failed", "invalid")


class Metrics:
    def __init__(self):
        self.lock = threading.Lock()
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.timed_out = 0          # subset of `rejected`: waited longer than --queue-timeout
        self.by_status = {}         # (endpoint, status) -> count
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.reused_tokens = 0
        self.bytes_read = 0
        self.hit_rate = None
        self.rss_mb = None
        self.connections_refused = 0
        self.connections_evicted = 0  # waited longest without a request when a connection cap was reached
        self.slow_clients = 0       # connections dropped by the header/body deadlines
        self.ttft = Histogram(TTFT_BUCKETS)
        self.decode = Histogram(TOKS_BUCKETS)
        self.queue_wait = Histogram(WAIT_BUCKETS)
        self.last_cancel = None     # how promptly the last cancelled generation stopped

    def outcome(self, kind, endpoint=None, status=None):
        with self.lock:
            self.outcomes[kind] += 1
            if endpoint:
                k = (endpoint, status)
                self.by_status[k] = self.by_status.get(k, 0) + 1

    def count(self, name, n=1):
        with self.lock:
            setattr(self, name, getattr(self, name) + n)

    def turn(self, stats, queue_wait_s):
        """Records the engine's END stats of one turn."""
        with self.lock:
            self.queue_wait.observe(queue_wait_s)
            for key, attr in (("prompt_tokens", "prompt_tokens"), ("completion_tokens", "completion_tokens"),
                              ("reused_tokens", "reused_tokens"), ("bytes_read", "bytes_read")):
                try:
                    setattr(self, attr, getattr(self, attr) + int(stats.get(key, 0)))
                except ValueError:
                    pass
            try:
                self.ttft.observe(float(stats["ttft_ms"]) / 1000)
                if int(stats.get("completion_tokens", 0)) > 1:
                    self.decode.observe(float(stats["decode_tok_s"]))
                self.hit_rate = float(stats["hit_rate"])
                self.rss_mb = int(stats["rss_mb"])
            except (KeyError, ValueError):
                pass

    def snapshot(self):
        with self.lock:
            return {**self.outcomes, "timed_out": self.timed_out}

    def prometheus(self, sched, model_id):
        """The Prometheus text exposition (format 0.0.4)."""
        with self.lock:
            out = []

            def metric(name, kind, help_text, samples):
                out.append(f"# HELP {name} {help_text}")
                out.append(f"# TYPE {name} {kind}")
                for labels, v in samples:
                    lab = "{" + ",".join(f'{k}="{_esc(val)}"' for k, val in labels.items()) + "}" if labels else ""
                    out.append(f"{name}{lab} {v}")

            metric("colibri_requests_total", "counter", "generation requests by outcome",
                   [({"outcome": k}, v) for k, v in self.outcomes.items()])
            metric("colibri_requests_timed_out_total", "counter", "requests refused after waiting --queue-timeout",
                   [({}, self.timed_out)])
            metric("colibri_http_responses_total", "counter", "generation responses by endpoint and status",
                   [({"endpoint": e, "status": str(s)}, v) for (e, s), v in sorted(self.by_status.items())])
            metric("colibri_prompt_tokens_total", "counter", "prompt tokens processed", [({}, self.prompt_tokens)])
            metric("colibri_completion_tokens_total", "counter", "tokens generated", [({}, self.completion_tokens)])
            metric("colibri_reused_tokens_total", "counter", "prompt tokens served from the KV cache",
                   [({}, self.reused_tokens)])
            metric("colibri_expert_bytes_read_total", "counter", "expert bytes read from disk", [({}, self.bytes_read)])
            if self.hit_rate is not None:
                metric("colibri_expert_hit_rate", "gauge", "expert cache hit rate of the last turn", [({}, self.hit_rate)])
            if self.rss_mb is not None:
                metric("colibri_engine_rss_bytes", "gauge", "engine resident memory", [({}, self.rss_mb << 20)])
            metric("colibri_connections_refused_total", "counter", "connections refused by --max-connections",
                   [({}, self.connections_refused)])
            metric("colibri_connections_evicted_total", "counter",
                   "connections closed to make room because they had sent no complete request",
                   [({}, self.connections_evicted)])
            metric("colibri_slow_clients_total", "counter", "connections dropped by the header/body deadlines",
                   [({}, self.slow_clients)])
            st = sched.status()
            metric("colibri_queue_depth", "gauge", "requests waiting for the engine", [({}, st["queued"])])
            metric("colibri_active_requests", "gauge", "requests being generated", [({}, st["active"])])
            metric("colibri_engine_up", "gauge", "1 when the engine is loaded and serving",
                   [({"model": model_id}, int(st["state"] == "ready"))])
            metric("colibri_engine_restarts_total", "counter", "engine restarts after a failure", [({}, st["restarts"])])
            metric("colibri_kv_slots_used", "gauge", "KV slots holding a conversation", [({}, st["slots_used"])])
            out += self.ttft.render("colibri_ttft_seconds", "time to first token")
            out += self.decode.render("colibri_decode_tokens_per_second", "decode speed per turn")
            out += self.queue_wait.render("colibri_queue_wait_seconds", "time spent waiting for the engine")
            return "\n".join(out) + "\n"


def _esc(v):
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
