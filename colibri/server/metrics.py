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
        self.draft_tokens = 0        # speculative decoding: tokens drafted, and those verification kept
        self.draft_accepted = 0
        self.bytes_read = 0          # expert bytes the engine read from the model files
        self.expert_hits = 0
        self.expert_misses = 0
        self.io_wait_ms = 0.0        # compute threads waiting on expert reads
        self.compute_ms = 0.0
        self.hit_rate = None         # of the last turn
        self.read_gbps = None        # of the last turn that read anything
        self.rss_mb = None
        self.peak_rss_mb = None
        self.tiers = None            # experts pinned / cached (in RAM) / total, after the last turn
        self.connections_refused = 0
        self.connections_evicted = 0  # waited longest without a request when a connection cap was reached
        self.slow_clients = 0       # connections dropped by the header/body deadlines
        self.bad_requests = 0       # request heads refused by the parser (request_head.py)
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
            for key, attr in (("hits", "expert_hits"), ("misses", "expert_misses"), ("draft_tokens", "draft_tokens"),
                              ("draft_accepted", "draft_accepted")):
                setattr(self, attr, getattr(self, attr) + _num(stats, key, int, 0))
            self.io_wait_ms += _num(stats, "io_wait_ms", float, 0.0)
            self.compute_ms += _num(stats, "compute_ms", float, 0.0)
            for key, attr, kind in (("hit_rate", "hit_rate", float), ("rss_mb", "rss_mb", int),
                                    ("peak_rss_mb", "peak_rss_mb", int)):
                v = _num(stats, key, kind, None)
                if v is not None:
                    setattr(self, attr, v)
            if _num(stats, "bytes_read", int, 0) > 0 and _num(stats, "read_gbps", float, None) is not None:
                self.read_gbps = _num(stats, "read_gbps", float, None)
            tiers = [_num(stats, k, int, None) for k in ("experts_pinned", "experts_cached", "experts_total")]
            if None not in tiers:
                self.tiers = dict(zip(("pinned", "cached", "total"), tiers))
            try:
                self.ttft.observe(float(stats["ttft_ms"]) / 1000)
                if int(stats.get("completion_tokens", 0)) > 1:
                    self.decode.observe(float(stats["decode_tok_s"]))
            except (KeyError, ValueError):
                pass

    def experts(self):
        """The expert-store figures for /health: totals since start and the last turn's."""
        with self.lock:
            looked_up = self.expert_hits + self.expert_misses
            return {"hits": self.expert_hits, "misses": self.expert_misses,
                    "hit_rate_total": round(self.expert_hits / looked_up, 4) if looked_up else None,
                    "hit_rate": self.hit_rate, "bytes_read": self.bytes_read, "read_gbps": self.read_gbps,
                    "io_wait_s": round(self.io_wait_ms / 1000, 3), "compute_s": round(self.compute_ms / 1000, 3),
                    "tiers": self.tiers, "rss_mb": self.rss_mb, "peak_rss_mb": self.peak_rss_mb}

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
            metric("colibri_draft_tokens_total", "counter", "tokens drafted for speculative decoding (--draft)",
                   [({}, self.draft_tokens)])
            metric("colibri_draft_accepted_total", "counter", "drafted tokens the model's own choice confirmed",
                   [({}, self.draft_accepted)])
            metric("colibri_expert_bytes_read_total", "counter", "expert bytes read from the model files",
                   [({}, self.bytes_read)])
            metric("colibri_expert_hits_total", "counter", "routed experts found in RAM", [({}, self.expert_hits)])
            metric("colibri_expert_misses_total", "counter", "routed experts read from disk", [({}, self.expert_misses)])
            metric("colibri_expert_io_wait_seconds_total", "counter", "time compute waited for expert reads",
                   [({}, round(self.io_wait_ms / 1000, 6))])
            metric("colibri_compute_seconds_total", "counter", "engine compute time of the turns",
                   [({}, round(self.compute_ms / 1000, 6))])
            if self.hit_rate is not None:
                metric("colibri_expert_hit_rate", "gauge", "expert cache hit rate of the last turn", [({}, self.hit_rate)])
            if self.read_gbps is not None:
                metric("colibri_expert_read_gbps", "gauge", "expert read bandwidth of the last turn that read",
                       [({}, self.read_gbps)])
            if self.tiers is not None:
                metric("colibri_experts", "gauge", "routed experts by tier after the last turn",
                       [({"tier": "pinned"}, self.tiers["pinned"]),
                        ({"tier": "cached"}, self.tiers["cached"] - self.tiers["pinned"]),
                        ({"tier": "disk"}, self.tiers["total"] - self.tiers["cached"])])
            if self.rss_mb is not None:
                metric("colibri_engine_rss_bytes", "gauge", "engine resident memory", [({}, self.rss_mb << 20)])
            if self.peak_rss_mb is not None:
                metric("colibri_engine_peak_rss_bytes", "gauge", "engine peak resident memory",
                       [({}, self.peak_rss_mb << 20)])
            metric("colibri_connections_refused_total", "counter", "connections refused by --max-connections",
                   [({}, self.connections_refused)])
            metric("colibri_connections_evicted_total", "counter",
                   "connections closed to make room because they had sent no complete request",
                   [({}, self.connections_evicted)])
            metric("colibri_slow_clients_total", "counter", "connections dropped by the header/body deadlines",
                   [({}, self.slow_clients)])
            metric("colibri_bad_requests_total", "counter", "request heads refused as malformed or ambiguous",
                   [({}, self.bad_requests)])
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


def _num(stats, key, kind, default):
    """stats[key] as kind, or default when absent or malformed (an older engine, a fake one)."""
    try:
        return kind(stats[key])
    except (KeyError, TypeError, ValueError):
        return default


def _esc(v):
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
