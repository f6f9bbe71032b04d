"""Continuous batching in the engine (docs/protocol.md, "Concurrency"): with --parallel N the
engine runs up to N requests at once, one KV slot each, decoding them in one forward pass per
step. A request's greedy tokens are the same alone or in company (dense and MoE, exact and
quantized containers), and a long prompt submitted while a stream runs holds it back by at most
one prefill chunk per token. Every test runs against the release and the ASan+UBSan build."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
from colibri import engine_client  # noqa: E402
from engine_binaries import engine_bin  # noqa: E402, F401


@pytest.fixture(scope="module", autouse=True)
def every_binary(engine_bin):  # noqa: F811 - the release and the ASan+UBSan build both
    return engine_bin

PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13], [40, 41], [7, 100, 200, 33, 21, 8, 90]]
CASES = {"llama-bf16": ("llama", "bf16", "bf16"), "qwen3_moe-bf16": ("qwen3_moe", "bf16", "bf16"),
         "qwen3_moe-q4": ("qwen3_moe", "q4", "q8")}


_CONVERTED = {}


def converted(case, oracle_root, tmp_path_factory):
    """The CASES container, converted once per test session."""
    if case not in _CONVERTED:
        name, experts, dense = CASES[case]
        out = tmp_path_factory.mktemp("batch") / name
        subprocess.run([sys.executable, str(ROOT / "coli"), "convert", str(Path(oracle_root) / name / "hf"), str(out),
                        "--experts", experts, "--dense", dense], check=True, capture_output=True)
        _CONVERTED[case] = out
    return _CONVERTED[case]


@pytest.fixture(scope="module", params=sorted(CASES))
def model(request, oracle_root, tmp_path_factory):
    return converted(request.param, oracle_root, tmp_path_factory)


# Experts streaming (--cap 1) prefill a lone prompt in one pass; next to another request they
# take one batch per turn as the resident engine does. (case, engine flags); dense models have
# no experts to stream.
PREFILL_SETUPS = [(c, []) for c in sorted(CASES)] + [(c, ["--cap", "1"]) for c in sorted(CASES) if "moe" in c]


@pytest.fixture(scope="module", params=PREFILL_SETUPS, ids=lambda s: s[0] + ("-streaming" if s[1] else ""))
def prefill_setup(request, oracle_root, tmp_path_factory):
    return converted(request.param[0], oracle_root, tmp_path_factory), request.param[1]


def collect(eng, rids):
    """Reads frames until every request in rids ended: rid -> tokens, and the DATA order."""
    toks, order, ends = {r: [] for r in rids}, [], {}
    while len(ends) < len(rids):
        verb, f, body = eng.read_frame()
        if verb == "DATA" and int(f[1]) >= 0:
            toks[f[0]].append(int(f[1]))
            order.append(f[0])
        elif verb in ("END", "ERROR"):
            ends[f[0]] = (verb, f[1:], body)
    assert all(v[0] == "END" for v in ends.values()), ends
    return toks, order


def concurrent(eng, prompts, **opts):
    rids = [f"c{i}" for i in range(len(prompts))]
    eng.write(b"".join(engine_client.submit_frame(r, p, slot=i, **opts) for i, (r, p) in enumerate(zip(rids, prompts))))
    toks, order = collect(eng, rids)
    return [toks[r] for r in rids], order


def sequential(eng, prompts, **opts):
    out = []
    for i, p in enumerate(prompts):
        rid = eng.submit(p, slot=i, **opts)
        out.append(collect(eng, [rid])[0][rid])
    return out


@pytest.mark.parametrize("threads", [1, 2])
def test_concurrent_greedy_equals_sequential(model, threads):
    opts = dict(max_tokens=24, temp=0, ignore_eos=1)
    with engine_client.Engine(model, ctx=128, kv_slots=4, threads=threads, extra=["--parallel", "4"]) as eng:
        assert eng.info["parallel"] == "4"
        together, order = concurrent(eng, PROMPTS, **opts)
    with engine_client.Engine(model, ctx=128, kv_slots=4, threads=threads, extra=["--parallel", "1"]) as eng:
        alone = sequential(eng, PROMPTS, **opts)
    assert together == alone and all(len(t) == 24 for t in alone)
    # they really ran together: every request's tokens interleave with the others'
    assert set(order[:10]) == {"c0", "c1", "c2", "c3"}


def test_parallel_one_serves_in_order(model):
    with engine_client.Engine(model, ctx=128, kv_slots=4, extra=["--parallel", "1"]) as eng:
        _, order = concurrent(eng, PROMPTS[:3], max_tokens=4, temp=0, ignore_eos=1)
    assert order == ["c0"] * 4 + ["c1"] * 4 + ["c2"] * 4


def test_sampled_requests_keep_their_own_seeds(model):
    opts = dict(max_tokens=16, temp=1.0, top_k=40, seed=7, ignore_eos=1)
    with engine_client.Engine(model, ctx=128, kv_slots=4) as eng:  # --parallel defaults to every slot
        assert eng.info["parallel"] == "4"
        together, _ = concurrent(eng, PROMPTS, **opts)
        alone = sequential(eng, PROMPTS, **opts)
    assert together == alone


def test_long_prompt_does_not_stall_a_running_stream(prefill_setup):
    """B's 200-token prompt is prefilled 4 positions per chunk (50 chunks) while A streams: A
    gets a token after every chunk, so it emits at least 49 tokens between B's ACCEPT and B's
    first token. Tokens are counted, not seconds."""
    # A's budget is far beyond what it needs, so a test process slowed by a busy machine (A runs
    # on while B's SUBMIT is on its way) cannot see A end first
    model, flags = prefill_setup
    with engine_client.Engine(model, ctx=512, kv_slots=2, batch=4, extra=flags) as eng:
        eng.write(engine_client.submit_frame("a", [5, 6, 7], slot=0, max_tokens=500, temp=0, ignore_eos=1))
        verb, f, _ = eng.read_frame()
        assert verb == "ACCEPT"
        verb, f, _ = eng.read_frame()
        assert (verb, f[0]) == ("DATA", "a")
        eng.write(engine_client.submit_frame("b", [1 + i % 300 for i in range(200)], slot=1, max_tokens=2, temp=0,
                                             ignore_eos=1))
        a_during, b_accepted, b_first = 0, False, False
        while not b_first:
            verb, f, _ = eng.read_frame()
            if verb == "ACCEPT" and f[0] == "b":
                b_accepted = True
            elif verb == "DATA" and f[0] == "a" and b_accepted:
                a_during += 1
            elif verb == "DATA" and f[0] == "b":
                b_first = True
            assert verb not in ("END", "ERROR") or f[0] != "a", "A ended before B's prefill did"
        assert a_during >= 49
        eng.control("STOP", "a")
        collect(eng, ["a", "b"])


def test_stop_and_cancel_reach_one_of_several(model):
    with engine_client.Engine(model, ctx=128, kv_slots=3) as eng:
        # one write: sent apart, a descheduled test process could let y and z run their 60 tokens
        # before STOP and CANCEL arrive (a loaded machine did)
        eng.write(b"".join(engine_client.submit_frame(r, [5, 6, 7], slot=i, max_tokens=60, temp=0, ignore_eos=1)
                           for i, r in enumerate(("x", "y", "z"))) + b"STOP y\nCANCEL z\n")
        seen = {"x": 0, "y": 0, "z": 0}
        ends = {}
        while len(ends) < 3:
            verb, f, body = eng.read_frame()
            if verb == "DATA" and int(f[1]) >= 0:
                seen[f[0]] += 1
            elif verb in ("END", "ERROR"):
                ends[f[0]] = (verb, f)
    assert ends["x"][0] == "END" and seen["x"] == 60
    assert ends["y"][0] == "END" and "finish=stop" in ends["y"][1] and seen["y"] < 60
    assert ends["z"][0] == "ERROR" and ends["z"][1][1] == "cancelled" and seen["z"] < 60


def test_parallel_above_kv_slots_is_refused(model):
    with pytest.raises(engine_client.EngineError) as e:
        engine_client.Engine(model, ctx=64, kv_slots=2, extra=["--parallel", "3"])
    assert "--parallel 3 exceeds --kv-slots 2" in e.value.message


def test_short_prompt_is_not_held_behind_a_long_prefill(prefill_setup):
    """A 200-token prompt (50 chunks of 4) arrives first, a 3-token one right behind it: the
    prompts take turns chunk by chunk, so the short one answers first."""
    model, flags = prefill_setup
    with engine_client.Engine(model, ctx=400, kv_slots=2, batch=4, extra=flags) as eng:
        eng.write(engine_client.submit_frame("long", [1 + i % 300 for i in range(200)], slot=0, max_tokens=2, temp=0,
                                             ignore_eos=1)
                  + engine_client.submit_frame("short", [5, 6, 7], slot=1, max_tokens=2, temp=0, ignore_eos=1))
        _, order = collect(eng, ["long", "short"])
    assert order[0] == "short" and order.count("long") == 2


# Families whose attention keeps more than per-position K/V: a DSA selection passed up the
# layers (a shared-indexer layer reads the one its slot's indexer layer made), recurrent state
# (gated DeltaNet, KDA), window rings with sinks. The prompts differ in length, so the rows of
# one step sit at different positions of different slots.
STATEFUL = ["glm_moe_dsa_shared", "qwen3_5_moe", "kimi_linear", "gpt_oss", "mimo_v2_flash"]


@pytest.fixture(scope="module", params=STATEFUL)
def stateful_model(request, oracle_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("batch") / request.param
    subprocess.run([sys.executable, str(ROOT / "coli"), "convert", str(Path(oracle_root) / request.param / "hf"),
                    str(out), "--experts", "bf16", "--dense", "bf16"], check=True, capture_output=True)
    return out


def test_stateful_families_concurrent_greedy_equals_sequential(stateful_model):
    opts = dict(max_tokens=20, temp=0, ignore_eos=1)
    with engine_client.Engine(stateful_model, ctx=128, kv_slots=4, extra=["--parallel", "4"]) as eng:
        together, order = concurrent(eng, PROMPTS, **opts)
    with engine_client.Engine(stateful_model, ctx=128, kv_slots=4, extra=["--parallel", "1"]) as eng:
        alone = sequential(eng, PROMPTS, **opts)
    assert together == alone and all(len(t) == 20 for t in alone)
    assert set(order[:10]) == {"c0", "c1", "c2", "c3"}
