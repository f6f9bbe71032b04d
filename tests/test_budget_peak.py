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


def workload(model, ram, grammar, turns=6, streams=4, max_tokens=16, kv_dir=None, then=None, hist=None, turn0=0):
    """Runs `turns` rounds of `streams` concurrent requests, one KV slot each, every prompt the
    slot's history plus a few tokens; then(eng, hist), if given, runs in the same engine after
    them. hist and turn0 continue an earlier run's histories (extended in place) and seeds.
    Returns READY's fields and every END's fields."""
    g = schema_grammar(SCHEMA) if grammar else None
    ends = []
    with engine_client.Engine(model, ctx=512, kv_slots=streams, threads=2, kv_dir=kv_dir,
                              extra=["--ram", str(ram), "--parallel", str(streams)]) as eng:
        if hist is None:
            hist = [[1, 2, 3] for _ in range(streams)]
        for t in range(turn0, turn0 + turns):
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
        if then:
            then(eng, hist)
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


def greedy_turns(eng, hist):
    """One greedy turn on each slot's history: (reused tokens, tokens) per slot."""
    out = []
    for s, ids in enumerate(hist):
        ev = list(eng.generate(ids, slot=s, max_tokens=6, temp=0, ignore_eos=1))
        out.append((ev[0][2], [e[1] for e in ev if e[0] == "data" and e[1] >= 0]))
    return out


def test_kv_persistence_stays_within_the_budget(tmp_path):
    """With --kv-dir every turn's record goes to a writer thread; four streams ending turns faster
    than the disk takes their checkpoints used to queue copies without bound (RSS twice the
    budget). The writer's records are bounded (two whole slots' worth, a newer turn of a slot
    replacing its queued one) and the budget reserves them plus the writer's image of a slot;
    nothing is lost: after EOF the slots restore to exactly what the live engine held."""
    model = recurrent_model.container()
    live = []
    workload(model, 0.16, grammar=False, then=lambda eng, hist: live.append(greedy_turns(eng, hist)))  # no --kv-dir
    (tmp_path / "kv").mkdir()
    hist = []
    info, ends = workload(model, 0.16, grammar=False, kv_dir=tmp_path / "kv", then=lambda eng, h: hist.append(h))
    assert peak_bytes(ends) <= int(info["ram_budget"])
    slot, ck = int(info["kv_slot_bytes"]), int(info["checkpoint_bytes"]) // (4 * 4)
    record_max = 24 + slot + 4 * (4 + ck)  # c/kv/kv_log.c kv_record_max: a whole slot with its checkpoints
    assert int(info["kv_writer_bytes"]) == 2 * record_max + slot + 4 * ck  # the records' bound + one image
    assert max(int(e["kv_queue_peak_bytes"]) for e in ends) <= 2 * record_max
    def restored():
        return engine_client.Engine(model, ctx=512, kv_slots=4, threads=2, kv_dir=tmp_path / "kv",
                                    extra=["--ram", "0.16", "--parallel", "4"])
    eng = restored()
    eng.close()  # stderr is complete once the engine has exited (a start with no requests writes nothing)
    eng._err_thread.join(timeout=10)
    assert sum("restored KV slot" in line for line in eng.stderr_tail) == 4
    with restored() as eng:
        assert greedy_turns(eng, hist[0]) == live[0]  # the same reuse and the same tokens as the live slots


@pytest.mark.parametrize("name, ram", [("recurrent", 0.16), ("big_vocab", 0.3)])
def test_kv_files_do_not_depend_on_how_far_the_disk_has_got(name, ram, tmp_path):
    """Turns sent as fast as they end (the writer behind, records queued) leave the same files
    as the same turns with the writer drained after each (a fresh engine per round: EOF drains
    it, and the next one resumes from the files): which record is whole, and so when a log is
    compacted, follows from the files' sizes, never from timing, and no record is dropped. The
    recurrent model's records carry its large state, so each is whole (a new base every turn); the
    other's are small deltas appended to logs."""
    model = {"recurrent": recurrent_model, "big_vocab": big_vocab_model}[name].container()
    fast, drained = tmp_path / "fast", tmp_path / "drained"
    fast.mkdir()
    drained.mkdir()
    workload(model, ram, grammar=False, turns=4, kv_dir=fast)
    hist = [[1, 2, 3] for _ in range(4)]
    for t in range(4):
        workload(model, ram, grammar=False, turns=1, kv_dir=drained, hist=hist, turn0=t)
    names = sorted(p.name for p in fast.iterdir() if p.name.startswith(".coli_kv") and p.name != ".coli_kv.lock")
    assert names == sorted(p.name for p in drained.iterdir() if p.name.startswith(".coli_kv") and p.name != ".coli_kv.lock")
    assert len(names) == (4 if name == "recurrent" else 8)  # a base per slot, and the small records' logs
    for n in names:
        assert (fast / n).read_bytes() == (drained / n).read_bytes(), n


def test_latent_attention_stays_within_the_smallest_budget(oracle_root):
    """GLM-5-shaped latent attention (64 heads over a 512-wide latent, a DSA indexer): a prompt's
    first chunk expands every position's keys and values, the next attends through the latent
    with the indexer's selection, then decode. At the smallest --ram the engine accepts, which
    is its own count of what it will hold, the peak RSS stays within it (the count once missed
    the expanded keys and values: a 208 MB budget for a 416 MB peak on a wider model)."""
    import random
    import re
    import wide_mla_model
    model = wide_mla_model.container()
    with pytest.raises(engine_client.EngineError) as e:
        engine_client.Engine(model, ctx=1100, kv_slots=1, threads=2, batch=512, extra=["--ram", "0.001"])
    ram = re.search(r"give at least --ram ([0-9.]+)", e.value.message).group(1)
    rng = random.Random(1)
    with engine_client.Engine(model, ctx=1100, kv_slots=1, threads=2, batch=512, extra=["--ram", ram]) as eng:
        info, ends = eng.info, []
        prompt = [rng.randrange(1, 320) for _ in range(900)]
        for ids in (prompt, prompt + [5, 6, 7]):  # the second reuses the slot: absorbed only
            ev = list(eng.generate(ids, slot=0, max_tokens=16, temp=0, ignore_eos=1))
            ends.append(ev[-1][1])
    assert sum(int(x["reused_tokens"]) for x in ends) > 0
    assert peak_bytes(ends) <= int(info["ram_budget"]), (peak_bytes(ends) >> 20, int(info["ram_budget"]) >> 20)
