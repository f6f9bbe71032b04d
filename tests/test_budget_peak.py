"""The RAM budget holds under a workload that uses everything the planner counts besides
weights: four conversations decoding at once (--parallel 4) over several turns, each turn
boundary keeping a checkpoint of the recurrent state, and grammar-constrained requests over a
152k-token vocabulary. The engine's peak RSS (VmHWM, every END frame) stays within --ram, with no
tolerance beyond it: the process itself (binary, libraries, thread stacks) is the runtime's
16 MiB base. A budget that only fits without the checkpoints is refused, naming them."""
import pytest

import big_vocab_model
import recurrent_model
from colibri import engine_client
from colibri.grammar import schema_grammar

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "n", "tags"]}


def workload(model, ram, grammar, turns=6, streams=4, max_tokens=16):
    """Runs `turns` rounds of `streams` concurrent requests, one KV slot each, every prompt the
    slot's history plus a few tokens; returns READY's fields and every END's fields."""
    g = schema_grammar(SCHEMA) if grammar else None
    ends = []
    with engine_client.Engine(model, ctx=512, kv_slots=streams, threads=2,
                              extra=["--ram", str(ram), "--parallel", str(streams)]) as eng:
        hist = [[1, 2, 3] for _ in range(streams)]
        for t in range(turns):
            rids = {}
            for s in range(streams):
                opts = dict(slot=s, max_tokens=max_tokens, temp=1.0, seed=10 * t + s)
                if g and s % 2 == 0:
                    opts["grammar"] = g
                rids[eng.submit(hist[s], **opts)] = s
            while len(rids):
                verb, f, body = eng.read_frame()
                if verb == "DATA" and int(f[1]) >= 0:
                    hist[rids[f[0]]].append(int(f[1]))
                elif verb == "END":
                    ends.append(dict(kv.split("=", 1) for kv in f[1:]))
                    del rids[f[0]]
                elif verb == "ERROR":
                    raise AssertionError(f"{f}: {body!r}")
            for s in range(streams):
                hist[s] += [5, 6, 7, 8]
        return eng.info, ends


def peak_bytes(ends):
    return max(int(e["peak_rss_mb"]) for e in ends) << 20


def test_checkpoints_of_recurrent_state_stay_within_the_budget():
    info, ends = workload(recurrent_model.container(), 0.1, grammar=False)
    # per DeltaNet layer: 16 heads of 128 x 128 f32, and the conv state of (2 x 4 + 16) x 128
    # channels over kernel - 1 positions; 3 such layers, 4 checkpoints per slot, 4 slots
    layer = 16 * 128 * 128 * 4 + (2 * 4 + 16) * 128 * 3 * 4
    assert int(info["checkpoint_bytes"]) == 4 * 4 * 3 * layer
    assert sum(int(e["reused_tokens"]) for e in ends) > 0  # later turns resumed from checkpoints
    assert peak_bytes(ends) <= int(info["ram_budget"])


def test_grammar_and_parallel_streams_stay_within_the_budget():
    info, ends = workload(big_vocab_model.container(), 0.25, grammar=True)
    assert int(info["grammar_bytes"]) > 150 * 151936 and int(info["mask_cache_bytes"]) > 0
    assert sum("grammar_masks" in e for e in ends) == len(ends) // 2
    assert peak_bytes(ends) <= int(info["ram_budget"])


def test_a_budget_without_room_for_the_checkpoints_is_refused():
    # 0.052 GB holds dense + KV + runtime + every expert of this model, but not the 52 MB of
    # checkpoints four slots keep (it started before, and its RSS grew to 91 MB)
    with pytest.raises(engine_client.EngineError) as e:
        workload(recurrent_model.container(), 0.052, grammar=False, turns=1)
    assert "checkpoints 52.1 MB" in e.value.message and "give at least --ram 0.10" in e.value.message
