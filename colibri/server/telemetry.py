"""Per-turn engine telemetry for the dashboard: which experts each MoE layer routed to (the
engine's ROUTING frame), where experts live (END's tier counts), the turn's time breakdown, and
the long-run routing counts the engine keeps in `.coli_usage`. Feeds /v1/colibri/experts,
/v1/colibri/runtime and the /v1/colibri/events stream (dashboard.py)."""
import json
import os
import sys
import threading
import time
from array import array
from collections import deque

HISTORY = 256          # turns kept in memory (the Atlas tool reads them for co-activation)
SUBSCRIBER_BACKLOG = 64  # events a slow SSE client may fall behind before it loses the oldest

# Tier codes per expert cell, as /v1/colibri/experts sends them.
DISK, CACHED, PINNED, RESIDENT = 0, 1, 2, 3


def parse_routing(fields, body):
    """A ROUTING frame (`ROUTING id layers experts nbytes` + body) -> (layers, experts, flat
    counts). Raises ValueError when the sizes disagree: the frame cannot be trusted."""
    layers, experts, nbytes = int(fields[1]), int(fields[2]), int(fields[3])
    if layers < 0 or experts < 0 or nbytes != layers * experts * 4 or len(body) != nbytes:
        raise ValueError(f"ROUTING frame of {layers}x{experts} experts carries {len(body)} bytes")
    counts = array("I")
    counts.frombytes(body)
    if sys.byteorder != "little":
        counts.byteswap()
    return layers, experts, counts


def _num(stats, key, kind=float):
    try:
        return kind(stats[key])
    except (KeyError, ValueError, TypeError):
        return None


class Telemetry:
    def __init__(self, model_dir, manifest):
        self.usage_path = os.path.join(str(model_dir), ".coli_usage")
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        # MoE layers: the layer specs' MLP kinds (moe, and any moe_* variant), else the arch's list
        specs = manifest.get("layers") or []
        kinds = [str((s.get("mlp") or {}).get("kind", "")) for s in specs if isinstance(s, dict)] or \
            [str(k) for k in manifest.get("arch", {}).get("layer_mlp") or []]
        index = [i for i, k in enumerate(kinds) if k == "moe" or k.startswith("moe_")]
        experts = int(manifest.get("arch", {}).get("num_experts") or 0)
        self._shape(len(index) if experts else 0, experts, index)
        self.turns = deque(maxlen=HISTORY)
        self.engine = {}        # the engine's READY fields
        self.tiers = None       # the last END's tier counts
        self.seq = 0            # events published so far
        self.events = deque(maxlen=SUBSCRIBER_BACKLOG)
        self._usage = (None, None)  # (mtime, counts) of .coli_usage
        self.parse_s = 0.0      # time spent handling telemetry, for the overhead measurement
        self.parse_n = 0

    def _shape(self, layers, experts, index):
        self.layers, self.experts, self.layer_index = layers, experts, index
        self.session = [0] * (layers * experts)    # routing counts since the server started
        self.last_seen = [0] * (layers * experts)  # the turn (seq) that last routed each expert

    # --- what the engine says ---------------------------------------------------------------
    def wants_routing(self, info):
        """SUBMIT routing=1 only to an engine whose READY advertises experts (today's engine
        refuses unknown SUBMIT options)."""
        n = info.get("experts", "")
        return n.isdigit() and int(n) > 0

    def on_ready(self, info):
        """READY's fields; its `moe_layers` x `experts`, when given, is the shape ROUTING frames
        will have, and wins over what the manifest suggested."""
        with self.lock:
            self.engine = dict(info)
            layers, experts = _num(info, "moe_layers", int), _num(info, "experts", int)
            if layers and experts and (layers, experts) != (self.layers, self.experts):
                self._shape(layers, experts, self.layer_index if len(self.layer_index) == layers else
                            list(range(layers)))

    def on_turn(self, stats, routing, queue_wait_s):
        """END stats of one turn, with its ROUTING counts (or None); publishes an SSE event."""
        t0 = time.perf_counter()
        routed = []
        with self.lock:
            if routing is not None:
                layers, experts, counts = routing
                if layers == self.layers and experts == self.experts:
                    for layer in range(layers):
                        base = layer * experts
                        row = [(e, counts[base + e]) for e in range(experts) if counts[base + e]]
                        for e, c in row:
                            self.session[base + e] += c
                            self.last_seen[base + e] = self.seq + 1
                        routed.append([x for ec in row for x in ec])
            turn = self._turn_record(stats, queue_wait_s)
            if routed:
                turn["routing"] = routed
            if _num(stats, "experts_total", int) is not None:
                self.tiers = {k: _num(stats, f"experts_{k}", int) for k in ("pinned", "cached", "total")}
            self.turns.append(turn)
            self.seq += 1
            self.events.append((self.seq, turn))
            self.cond.notify_all()
            self.parse_s += time.perf_counter() - t0
            self.parse_n += 1

    @staticmethod
    def _turn_record(stats, queue_wait_s):
        completion = _num(stats, "completion_tokens", int) or 0
        tok_s = _num(stats, "decode_tok_s")
        rec = {"at": round(time.time(), 3), "queue_wait_ms": round(queue_wait_s * 1000, 1),
               "prompt_tokens": _num(stats, "prompt_tokens", int), "completion_tokens": completion,
               "reused_tokens": _num(stats, "reused_tokens", int), "ttft_ms": _num(stats, "ttft_ms"),
               "prefill_tok_s": _num(stats, "prefill_tok_s"), "decode_tok_s": tok_s,
               "prefill_ms": _num(stats, "ttft_ms"),
               # the engine's decode_tok_s counts the tokens after the first (which prefill made)
               "decode_ms": round((completion - 1) / tok_s * 1000, 1) if tok_s and completion > 1 else None,
               "finish": stats.get("finish")}
        for k in ("hit_rate", "read_gbps", "io_wait_ms", "compute_ms"):
            rec[k] = _num(stats, k)
        for k in ("hits", "misses", "bytes_read", "rss_mb", "peak_rss_mb", "draft_tokens", "draft_accepted"):
            rec[k] = _num(stats, k, int)
        return rec

    # --- what the dashboard reads -----------------------------------------------------------
    def usage_counts(self):
        """`.coli_usage` counts as one flat list (layer-major), re-read when the file changes;
        None when it is missing, unreadable or of another shape (never an error)."""
        try:
            mtime = os.stat(self.usage_path).st_mtime_ns
        except OSError:
            return None
        if self._usage[0] == mtime:
            return self._usage[1]
        counts = None
        try:
            with open(self.usage_path, encoding="utf-8") as f:
                data = json.load(f)
            rows = data["counts"]
            if (data.get("version") == 1 and len(rows) == self.layers
                    and all(len(r) == self.experts for r in rows)):
                counts = [int(c) for r in rows for c in r]
        except (OSError, ValueError, KeyError, TypeError):
            counts = None
        self._usage = (mtime, counts)
        return counts

    def _tier_cells(self, usage):
        """Tier of each expert. The engine reports how many experts are pinned and cached, not
        which, so the cells follow its policy: the hottest `pinned` by usage are pinned, and per
        layer the `cap` most recently routed are cached. Without streaming all are resident."""
        n = self.layers * self.experts
        cap = _num(self.engine, "cap", int) or 0
        budget = _num(self.engine, "ram_budget", int) or 0
        if not budget or not cap or cap >= self.experts:
            return [RESIDENT] * n
        cells = [DISK] * n
        for layer in range(self.layers):
            base = layer * self.experts
            recent = sorted(range(base, base + self.experts), key=lambda i: -self.last_seen[i])[:cap]
            for i in recent:
                if self.last_seen[i]:
                    cells[i] = CACHED
        pinned = (self.tiers or {}).get("pinned") or _num(self.engine, "pinned", int) or 0
        if pinned and usage:
            for i in sorted(range(n), key=lambda i: -usage[i])[:pinned]:
                cells[i] = PINNED
        return cells

    def experts_json(self, history=False):
        usage = self.usage_counts()
        with self.lock:
            total = self.layers * self.experts
            tiers = dict(self.tiers) if self.tiers else None
            if tiers is None:  # before the first turn of a streaming engine, or no streaming at all
                streaming = bool(_num(self.engine, "ram_budget", int))
                pinned = _num(self.engine, "pinned", int) or 0
                tiers = {"pinned": pinned, "cached": pinned if streaming else total, "total": total}
            tiers["disk"] = max(0, (tiers.get("total") or 0) - (tiers.get("cached") or 0))
            body = {"layers": self.layers, "experts": self.experts, "layer_index": self.layer_index,
                    "tiers": tiers, "tier_source": "engine" if self.tiers else "estimate",
                    "usage": usage, "session": list(self.session),
                    "cells": self._tier_cells(usage), "turns": len(self.turns), "seq": self.seq}
            if history:
                body["history"] = [t.get("routing") for t in self.turns if t.get("routing")]
            return body

    def runtime_turns(self):
        with self.lock:
            return [{k: v for k, v in t.items() if k != "routing"} for t in self.turns]

    def overhead(self):
        with self.lock:
            return {"turns": self.parse_n, "handle_ms_per_turn": round(self.parse_s / self.parse_n * 1000, 3)
                    if self.parse_n else None}

    def wait_events(self, after, timeout):
        """Events newer than seq `after` (waits up to `timeout` s for one) -> (seq, [(seq, turn)...])."""
        with self.cond:
            if self.seq <= after:
                self.cond.wait(timeout)
            evs = [(s, t) for s, t in self.events if s > after]
            return self.seq, evs
