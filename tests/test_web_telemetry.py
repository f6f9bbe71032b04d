"""The dashboard's telemetry state (colibri/server/telemetry.py) and the expert atlas layout
(tools/expert_atlas.py), without a server or a browser."""
import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from colibri.server import telemetry
from colibri.server.telemetry import CACHED, DISK, PINNED, RESIDENT, Telemetry

import expert_atlas  # tools/ is on the path (pytest.ini)

ROOT = Path(__file__).resolve().parents[1]
TOOL_ENV = {**os.environ, "PYTHONPATH": str(ROOT)}  # tools/ scripts import colibri from the checkout

MANIFEST = {"arch": {"num_experts": 4, "layer_mlp": ["dense", "moe", "moe"]}}


def routing(counts, layers=2, experts=4):
    body = struct.pack(f"<{len(counts)}I", *counts)
    return telemetry.parse_routing(["r1", str(layers), str(experts), str(len(body))], body)


def test_routing_frame_is_decoded_and_checked():
    layers, experts, counts = routing([1, 0, 0, 2, 0, 5, 0, 0])
    assert (layers, experts, list(counts)) == (2, 4, [1, 0, 0, 2, 0, 5, 0, 0])
    with pytest.raises(ValueError, match="2x4 experts carries 28 bytes"):
        telemetry.parse_routing(["r1", "2", "4", "32"], b"\0" * 28)
    with pytest.raises(ValueError):
        telemetry.parse_routing(["r1", "2", "4", "28"], b"\0" * 28)  # nbytes disagrees with the shape


def test_routing_is_asked_only_of_an_engine_that_advertises_experts():
    t = Telemetry("/nonexistent", MANIFEST)
    assert not t.wants_routing({})                      # today's engine: no experts= in READY
    assert not t.wants_routing({"experts": "0"})
    assert not t.wants_routing({"experts": "many"})
    assert t.wants_routing({"experts": "4"})


def test_turns_accumulate_and_tiers_follow_the_engine(tmp_path):
    t = Telemetry(tmp_path, MANIFEST)
    assert (t.layers, t.experts, t.layer_index) == (2, 4, [1, 2])
    assert t.experts_json()["cells"] == [RESIDENT] * 8  # no RAM budget: everything resident
    t.on_ready({"ram_budget": "1000", "cap": "2", "experts": "4", "pinned": "1"})
    before = t.experts_json()
    assert before["tier_source"] == "estimate" and before["tiers"] == {"pinned": 1, "cached": 1, "total": 8, "disk": 7}
    stats = {"completion_tokens": "5", "decode_tok_s": "8", "ttft_ms": "10", "io_wait_ms": "2.5",
             "experts_pinned": "1", "experts_cached": "3", "experts_total": "8"}
    t.on_turn(stats, routing([1, 1, 0, 0, 0, 0, 0, 3]), 0.25)
    t.on_turn(stats, routing([0, 0, 4, 0, 0, 0, 0, 1]), 0.0)
    d = t.experts_json(history=True)
    assert d["session"] == [1, 1, 4, 0, 0, 0, 0, 4]
    assert d["tiers"] == {"pinned": 1, "cached": 3, "total": 8, "disk": 5} and d["tier_source"] == "engine"
    assert d["history"] == [[[0, 1, 1, 1], [3, 3]], [[2, 4], [3, 1]]]
    # per layer the `cap` most recently routed are cached; no usage file, so none is pinned
    assert d["cells"][:4].count(CACHED) == 2 and d["cells"][2] == CACHED and d["cells"][7] == CACHED
    turn = t.runtime_turns()[0]
    assert turn["queue_wait_ms"] == 250.0 and turn["decode_ms"] == 500.0 and turn["io_wait_ms"] == 2.5
    assert "routing" not in turn
    seq, evs = t.wait_events(1, 0)
    assert seq == 2 and [s for s, _ in evs] == [2]
    # the hottest experts of .coli_usage are the pinned ones
    (tmp_path / ".coli_usage").write_text(json.dumps(
        {"version": 1, "layers": 2, "experts": 4, "turns": 9, "counts": [[0, 0, 0, 0], [0, 0, 0, 90]]}))
    d = t.experts_json()
    assert d["usage"] == [0, 0, 0, 0, 0, 0, 0, 90] and d["cells"][7] == PINNED and d["cells"][4] == DISK


@pytest.mark.parametrize("text", ["{not json", json.dumps({"version": 1, "layers": 3, "experts": 4, "counts": []}),
                                  json.dumps({"version": 2, "layers": 2, "experts": 4, "counts": [[0] * 4] * 2}),
                                  json.dumps({"version": 1, "counts": [[0] * 3, [0] * 4]})])
def test_a_bad_usage_file_is_ignored(tmp_path, text):
    (tmp_path / ".coli_usage").write_text(text)
    assert Telemetry(tmp_path, MANIFEST).experts_json()["usage"] is None


def test_a_turn_of_another_shape_is_not_counted():
    t = Telemetry("/nonexistent", MANIFEST)
    t.on_turn({}, routing([1] * 6, layers=2, experts=3), 0.0)
    assert t.experts_json()["session"] == [0] * 8 and t.turns[-1].get("routing") is None


def test_atlas_places_co_activated_experts_together(tmp_path):
    # layer 0: experts 0+1 fire in the same turns, experts 2+3 in the others; 3 never in layer 1
    turns = [[[0, 5, 1, 4], [0, 2]], [[2, 6, 3, 5], [1, 2]]] * 4 + [[[0, 3, 1, 3], [0, 1, 2, 1]]]
    doc = {"layers": 2, "experts": 4, "layer_index": [1, 2], "history": turns}
    atlas = expert_atlas.layout(doc)
    assert atlas["turns"] == 9 and len(atlas["points"]) == 8
    pos = {(p[0], p[1]): p[2:5] for p in atlas["points"]}
    assert math.dist(pos[0, 0], pos[0, 1]) < math.dist(pos[0, 0], pos[0, 2])
    assert math.dist(pos[0, 2], pos[0, 3]) < math.dist(pos[0, 1], pos[0, 3])
    assert {(p[0], p[1]): p[5] for p in atlas["points"]}[1, 3] == 0  # never fired: on the outer shell
    assert math.isclose(math.dist(pos[1, 3], (0, 0, 0)), 1.3, rel_tol=1e-3)
    src = tmp_path / "history.json"
    src.write_text(json.dumps(doc))
    out = tmp_path / "experts.json"
    tool = str(ROOT / "tools" / "expert_atlas.py")
    r = subprocess.run([sys.executable, tool, "--history", str(src), "--out", str(out)],
                       capture_output=True, text=True, timeout=60, env=TOOL_ENV)
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text()) == json.loads(json.dumps(atlas))


def test_atlas_without_routing_says_what_to_do(tmp_path):
    src = tmp_path / "history.json"
    src.write_text(json.dumps({"layers": 2, "experts": 4, "history": []}))
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "expert_atlas.py"), "--history", str(src),
                        "--out", str(tmp_path / "x.json")], capture_output=True, text=True, timeout=60, env=TOOL_ENV)
    assert r.returncode != 0 and "no per-turn routing yet" in r.stderr and "chat a few turns" in r.stderr


def test_a_live_atlas_keeps_to_its_budget():
    from colibri.server import atlas
    assert atlas.turns_within(2, 8) == atlas.MAX_TURNS  # a small model: every kept turn
    n = atlas.turns_within(76, 256)  # GLM-5's shape: the most recent turns that fit
    assert 2 <= n < atlas.MAX_TURNS and 76 * 256 * n * n <= atlas.LIVE_BUDGET
    turns = [[[e % 8, 1 + t % 3] for e in (t, t + 1)] for t in range(40)]
    doc = {"layers": 2, "experts": 8, "history": turns}
    assert atlas.layout(doc, 10)["turns"] == 10  # the most recent ones only
    with pytest.raises(atlas.NoRouting):
        atlas.layout({"layers": 2, "experts": 8, "history": []})


def test_the_engine_shape_wins_over_the_manifest():
    t = Telemetry("/nonexistent", MANIFEST)
    t.on_ready({"experts": "6", "moe_layers": "3"})  # e.g. a family whose layer kinds the manifest spells otherwise
    assert (t.layers, t.experts, t.layer_index) == (3, 6, [0, 1, 2])
    t.on_turn({}, routing([0] * 17 + [2], layers=3, experts=6), 0.0)
    assert t.experts_json()["session"][17] == 2


def test_moe_layers_come_from_the_layer_specs():
    man = {"arch": {"num_experts": 4, "layer_mlp": ["dense"] * 3},
           "layers": [{"mlp": {"kind": "dense"}}, {"mlp": {"kind": "moe_shared"}}, {"mlp": {"kind": "moe"}}]}
    t = Telemetry("/nonexistent", man)
    assert (t.layers, t.layer_index) == (2, [1, 2])
