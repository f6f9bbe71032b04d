"""The expert-store figures of the END frame reach /health and /metrics: totals add up over
turns, the last turn's gauges follow the last turn, and an engine that sends none of them
(an older or scripted engine) leaves them absent instead of inventing values."""
from colibri.server.metrics import Metrics


class Sched:
    def status(self):
        return {"queued": 0, "active": 0, "state": "ready", "restarts": 0, "slots_used": 0}


TURN1 = {"prompt_tokens": "20", "completion_tokens": "4", "ttft_ms": "900", "decode_tok_s": "3.1", "hit_rate": "0.250",
         "hits": "16", "misses": "48", "bytes_read": "48000000", "read_gbps": "1.50", "io_wait_ms": "32.0",
         "compute_ms": "100.5", "rss_mb": "90", "peak_rss_mb": "97", "experts_pinned": "4", "experts_cached": "12",
         "experts_total": "64"}
TURN2 = {**TURN1, "hit_rate": "1.000", "hits": "64", "misses": "0", "bytes_read": "0", "read_gbps": "0.00",
         "io_wait_ms": "0.0", "experts_cached": "16"}


def samples(text):
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, v = line.rpartition(" ")
            out[name] = float(v)
    return out


def test_totals_and_last_turn_reach_health_and_metrics():
    m = Metrics()
    m.turn(TURN1, 0.0)
    m.turn(TURN2, 0.0)
    e = m.experts()
    assert (e["hits"], e["misses"], e["bytes_read"]) == (80, 48, 48000000)
    assert e["hit_rate_total"] == round(80 / 128, 4) and e["hit_rate"] == 1.0
    assert e["read_gbps"] == 1.5  # the last turn that read something, not the 0.00 of a turn that read nothing
    assert e["io_wait_s"] == 0.032 and e["compute_s"] == 0.201
    assert e["tiers"] == {"pinned": 4, "cached": 16, "total": 64}
    assert (e["rss_mb"], e["peak_rss_mb"]) == (90, 97)
    s = samples(m.prometheus(Sched(), "m"))
    assert s["colibri_expert_hits_total"] == 80 and s["colibri_expert_misses_total"] == 48
    assert s["colibri_expert_bytes_read_total"] == 48000000
    assert s["colibri_expert_io_wait_seconds_total"] == 0.032
    assert s['colibri_experts{tier="pinned"}'] == 4 and s['colibri_experts{tier="cached"}'] == 12
    assert s['colibri_experts{tier="disk"}'] == 48
    assert s["colibri_engine_peak_rss_bytes"] == 97 << 20


def test_an_engine_without_expert_stats_leaves_them_absent():
    m = Metrics()
    m.turn({"prompt_tokens": "3", "completion_tokens": "1", "ttft_ms": "1", "hit_rate": "oops"}, 0.0)
    e = m.experts()
    assert e["hit_rate"] is None and e["hit_rate_total"] is None and e["tiers"] is None and e["read_gbps"] is None
    s = samples(m.prometheus(Sched(), "m"))
    assert "colibri_expert_hit_rate" not in s and 'colibri_experts{tier="disk"}' not in s
    assert s["colibri_expert_hits_total"] == 0


def test_a_streaming_server_reports_its_expert_store(oracle_root, tmp_path):
    """`coli serve --ram/--cap` reaches the engine; /health and /metrics show the real counts."""
    import json

    from server_helpers import ServerProc, convert
    model = convert(oracle_root, "qwen3_moe", tmp_path / "m")
    srv = ServerProc(model, "--cap", "1", "--ram", "0.5", "--no-kv-persist")
    try:
        h = srv.health()
        assert h["experts"]["cache_slots_per_layer"] == 1 and h["memory"]["ram_budget"] == 500_000_000
        assert h["memory"]["dense_bytes"] > 0 and h["memory"]["runtime_bytes"] > 0
        assert h["memory"]["grammar_bytes"] > 0 and h["memory"]["checkpoint_bytes"] == 0  # a tokenizer; GQA only
        body = json.dumps({"prompt": [5, 6, 7, 8, 9, 10], "max_tokens": 4, "temperature": 0})
        status, _, _ = srv.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        assert status == 200
        e = srv.health()["experts"]
        assert e["misses"] > 0 and e["hits"] + e["misses"] > 0 and e["bytes_read"] > 0
        assert e["tiers"]["total"] == h["experts"]["moe_layers"] * h["experts"]["experts_per_layer"]
        assert e["tiers"]["cached"] <= h["experts"]["moe_layers"]  # one slot per MoE layer
        _, _, text = srv.request("GET", "/metrics")
        s = samples(text.decode())
        assert s["colibri_expert_misses_total"] == e["misses"] and s["colibri_expert_hits_total"] == e["hits"]
    finally:
        srv.stop()
