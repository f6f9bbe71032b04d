"""Speculative decoding with prompt-lookup drafts (--draft lookup): the output is exactly what
decoding without drafts gives, greedy and sampled with a seed, on every family whose state can be
cut back or, for a fixed recurrent state, saved and replayed; families with a sliding window turn
drafting off and say why.

Drafting is forced with `--draft-adapt off` (every step with a match drafts --draft-max tokens):
adaptive drafting pauses itself where it does not pay, which on these tiny models is often, and
would leave the verification path untested."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from colibri import engine_client
from engine_binaries import assert_clean_exit, engine_bin, env_for  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
FORCED = ["--draft", "lookup", "--draft-adapt", "off"]
# copy-heavy: a phrase repeated, then its start, so lookup finds matches from the first step
PROMPT = [5, 6, 7, 8, 9, 10, 11, 12] * 3 + [5, 6]
TOKENS = 64

DRAFTING = ["llama", "llama_gqa", "qwen2", "qwen3_moe", "qwen3_moe_fused", "glm4_moe", "deepseek_v3", "glm_moe_dsa",
            "deepseek_v32", "olmoe", "qwen2_moe", "mixtral", "minimax_m2", "glm4_moe_lite"]
# a fixed recurrent state (gated DeltaNet, KDA): saved before each verify pass, replayed to the
# kept positions when a draft is cut
RECURRENT = ["qwen3_5_moe", "kimi_linear"]
# a state that cannot be cut back to any position: no drafting, and the reason in READY
NOT_DRAFTING = {"gpt_oss": "sliding_window", "mimo_v2_flash": "sliding_window"}


@pytest.fixture(scope="module", autouse=True)
def every_binary(engine_bin):  # noqa: F811
    """Release and ASan+UBSan: the verify pass cuts the cache back, which memory errors would show."""
    return engine_bin


@pytest.fixture(scope="module")
def models(oracle_root, tmp_path_factory):
    root = tmp_path_factory.mktemp("draft")
    cache = {}

    def get(variant):
        if variant not in cache:
            out = root / variant
            subprocess.run([sys.executable, str(ROOT / "coli"), "convert", str(Path(oracle_root) / variant / "hf"),
                            str(out)], check=True, capture_output=True)
            cache[variant] = out
        return cache[variant]
    return get


def generate(model, extra, prompt=PROMPT, n=TOKENS, ctx=256, events=False, **opts):
    """(token ids, END stats, READY info) of one request on a fresh engine; with events, every
    frame but END in place of the ids."""
    with engine_client.Engine(model, ctx=ctx, threads=1, extra=extra) as eng:
        ev = list(eng.generate(prompt, max_tokens=n, ignore_eos=1, **opts))
        info = eng.info
    assert_clean_exit(eng)
    assert ev[-1][0] == "end", ev[-1]
    return ev[:-1] if events else [e[1] for e in ev if e[0] == "data" and e[1] >= 0], ev[-1][1], info


@pytest.mark.parametrize("variant", DRAFTING)
def test_greedy_output_is_the_same_with_drafts(models, variant):
    plain, s0, info0 = generate(models(variant), ["--draft", "off"])
    drafted, s1, info1 = generate(models(variant), FORCED)
    assert info0["draft"] == "off" and info1["draft"] == "lookup" and "draft_tokens" not in s0
    assert len(plain) == TOKENS and drafted == plain
    assert int(s1["draft_tokens"]) > 0, "lookup never drafted on a copy-heavy prompt"
    assert 0 <= int(s1["draft_accepted"]) <= int(s1["draft_tokens"])
    assert s1["completion_tokens"] == str(TOKENS)


@pytest.mark.parametrize("variant", RECURRENT)
def test_recurrent_state_is_replayed_to_the_kept_positions(models, variant):
    """The tiny hybrids do not copy the repeated phrase, so the prompt ends with their own greedy
    text, which lookup matches: drafts are made and cut (each cut restores the saved DeltaNet/KDA
    state and replays the kept positions), and the tokens, greedy and sampled, are the plain ones,
    with the same logprobs to the bit (a verify pass runs the recurrent layers one token at a
    time, as decoding does)."""
    model = models(variant)
    own, _, _ = generate(model, ["--draft", "off"], n=200, ctx=512)
    prompt = PROMPT + own
    for opts in (dict(logprobs=1, top_logprobs=2), dict(temp=0.4, top_p=0.95, seed=1)):
        plain, _, _ = generate(model, ["--draft", "off"], prompt=prompt, ctx=512, events=True, **opts)
        drafted, stats, info = generate(model, FORCED, prompt=prompt, ctx=512, events=True, **opts)
        assert info["draft"] == "lookup" and "draft_off" not in info
        assert drafted == plain, opts
        assert int(stats["draft_tokens"]) > int(stats["draft_accepted"]) >= 0, stats  # drafts were cut


@pytest.mark.parametrize("variant", ["llama", "qwen3_moe", "deepseek_v3"])
def test_sampled_output_is_the_same_with_drafts(models, variant):
    """Sampling each verified position's logits in turn with the request's own generator, and
    keeping the draft while the sample equals it, is the speculative-sampling acceptance rule for a
    draft that is one token with probability 1 (accept with p(x); otherwise a sample of p without
    x): the output distribution is unchanged, and with a seed even the same tokens come out."""
    drafted_total = 0
    for seed in (1, 2, 3):
        opts = dict(temp=0.4, top_p=0.95, seed=seed)
        plain, _, _ = generate(models(variant), ["--draft", "off"], **opts)
        drafted, stats, _ = generate(models(variant), FORCED, **opts)
        assert drafted == plain, seed
        drafted_total += int(stats["draft_tokens"])
    assert drafted_total > 0


TEMP = 0.5


def test_acceptance_rule_keeps_the_distribution(models):
    """The statistical form of the rule: over many seeds, the third token after the most common
    first two is distributed as the model says (chi-square against the softmax of the
    teacher-forced logits at the same temperature), while drafts are verified and kept."""
    import numpy as np
    model = models("llama")
    draws, third, accepted = 400, {}, 0
    with engine_client.Engine(model, ctx=256, threads=1, extra=FORCED) as eng:
        # the model's own greedy text as the prompt: it falls into a loop, which lookup drafts
        greedy = [e[1] for e in eng.generate(PROMPT, max_tokens=24, temp=0, ignore_eos=1) if e[0] == "data" and e[1] >= 0]
        prompt = PROMPT + greedy
        for seed in range(draws):
            ev = list(eng.generate(prompt, max_tokens=3, temp=TEMP, seed=seed, ignore_eos=1))
            toks = tuple(e[1] for e in ev if e[0] == "data" and e[1] >= 0)
            accepted += int(ev[-1][1]["draft_accepted"])
            third.setdefault(toks[:2], []).append(toks[2])
        prefix, seen = max(third.items(), key=lambda kv: len(kv[1]))
        ev = list(eng.generate(prompt + list(prefix), logits=1))
        rows = np.frombuffer(ev[1][2], dtype="<f4").reshape(len(prompt) + 2, -1)
    assert_clean_exit(eng)
    assert accepted > 0, "no draft was ever kept: the rule was not exercised"
    logits = rows[-1].astype(np.float64) / TEMP
    p = np.exp(logits - logits.max())
    p /= p.sum()
    n = len(seen)
    assert n >= 50, f"the most common first two tokens came only {n} times in {draws}"
    bins = [int(t) for t in np.argsort(-p) if p[t] * n >= 5]  # expected counts of 5 or more, the rest pooled
    obs = [seen.count(t) for t in bins] + [n - sum(seen.count(t) for t in bins)]
    exp = [p[t] * n for t in bins] + [n * (1 - sum(p[t] for t in bins))]
    chi2 = sum((o - e) ** 2 / e for o, e in zip(obs, exp) if e > 1e-9)
    dof = len(obs) - 1
    assert dof >= 1
    assert chi2 < dof + 5 * (2 * dof) ** 0.5, (chi2, dof, obs, exp)  # far past the 99.9th percentile


@pytest.mark.parametrize("variant", sorted(NOT_DRAFTING))
def test_state_that_cannot_be_cut_back_turns_drafting_off(models, variant):
    plain, _, _ = generate(models(variant), ["--draft", "off"], n=16)
    drafted, stats, info = generate(models(variant), FORCED, n=16)
    assert info["draft"] == "off" and info["draft_off"] == NOT_DRAFTING[variant]
    assert drafted == plain and "draft_tokens" not in stats


def test_logprobs_and_limits_with_drafts(models):
    model = models("qwen3_moe")
    plain_ev, _, _ = generate(model, ["--draft", "off"], logprobs=1, top_logprobs=3, events=True)
    drafted_ev, stats, _ = generate(model, FORCED, logprobs=1, top_logprobs=3, events=True)
    assert drafted_ev == plain_ev and int(stats["draft_tokens"]) > 0  # logprob lines of verified rows included
    assert sum(e[0] == "logprob" for e in drafted_ev) == TOKENS
    plain = [e[1] for e in plain_ev if e[0] == "data" and e[1] >= 0]
    # max_tokens smaller than a draft: exactly max_tokens come out
    few, stats, _ = generate(model, FORCED + ["--draft-max", "16"], n=3)
    assert few == plain[:3] and stats["completion_tokens"] == "3"
    # the context ends inside a draft: the output stops at the context, as without drafts
    ctx = len(PROMPT) + 10
    a, sa, _ = generate(model, ["--draft", "off"], n=50, ctx=ctx)
    b, sb, _ = generate(model, FORCED, n=50, ctx=ctx)
    assert a == b and sa["finish"] == sb["finish"] == "length" and len(b) == ctx - len(PROMPT)


def test_next_turn_reuses_the_cache_after_cut_back_drafts(models):
    """Rejected draft positions are cut off: a follow-up turn in the same slot reuses the prefix
    and gives what a fresh engine gives."""
    model = models("llama")
    with engine_client.Engine(model, ctx=256, threads=1, extra=FORCED) as eng:
        first = [e[1] for e in eng.generate(PROMPT, max_tokens=30, ignore_eos=1) if e[0] == "data" and e[1] >= 0]
        follow = PROMPT + first + [13, 14]
        ev = list(eng.generate(follow, max_tokens=20, ignore_eos=1))
        second = [e[1] for e in ev if e[0] == "data" and e[1] >= 0]
        assert ev[0][0] == "accept" and ev[0][2] >= len(PROMPT) + len(first) - 1  # reused
    assert_clean_exit(eng)
    fresh, _, _ = generate(model, ["--draft", "off"], prompt=follow, n=20)
    assert second == fresh


def test_parallel_streams_are_unchanged(models):
    """Two requests decoding together do not draft (the batched step would wait for the longer
    pass); their outputs are each what a lone plain request gives."""
    model = models("qwen3_moe")
    p2 = [20, 21, 22, 23] * 4
    solo = [generate(model, ["--draft", "off"], prompt=p, n=24)[0] for p in (PROMPT, p2)]
    with engine_client.Engine(model, ctx=256, kv_slots=2, threads=1, extra=FORCED + ["--parallel", "2"]) as eng:
        a, b = eng.new_id(), eng.new_id()
        eng.submit(PROMPT, rid=a, max_tokens=24, ignore_eos=1, slot=0)
        eng.submit(p2, rid=b, max_tokens=24, ignore_eos=1, slot=1)
        got, ended = {a: [], b: []}, set()
        while len(ended) < 2:
            verb, f, body = eng.read_frame()
            if verb == "DATA" and int(f[1]) >= 0:
                got[f[0]].append(int(f[1]))
            elif verb in ("END", "ERROR"):
                assert verb == "END", body
                ended.add(f[0])
    assert_clean_exit(eng)
    assert [got[a], got[b]] == solo


def test_flags_are_checked():
    r = subprocess.run([str(engine_client.ENGINE), "serve", "--model", "x", "--draft", "maybe"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "--draft needs lookup, mtp or off" in r.stderr
    r = subprocess.run([str(engine_client.ENGINE), "serve", "--model", "x", "--draft-max", "0"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "--draft-max needs an integer between 1 and 64" in r.stderr


def test_mtp_is_refused_without_mtp_layers(models):
    """MTP drafting itself is tested in test_mtp_draft.py; a model without the layers says so."""
    with pytest.raises(engine_client.EngineError, match="has no multi-token-prediction layers"):
        with engine_client.Engine(models("llama"), ctx=64, extra=["--draft", "mtp"]):
            pass
    r = subprocess.run([sys.executable, str(ROOT / "coli"), "run", "--model", str(models("llama")), "--draft", "mtp",
                        "hi"], capture_output=True, text=True)
    assert r.returncode != 0 and "has no multi-token-prediction layers" in r.stderr


def test_coli_run_passes_the_flags_and_stats_show_drafts(models, engine_bin):  # noqa: F811
    model = models("llama")
    args = [sys.executable, str(ROOT / "coli"), "run", "--model", str(model), "--ids", ",".join(map(str, PROMPT)),
            "--max-tokens", "32", "--temp", "0", "--stats", "--threads", "1"]
    env = {**os.environ, **env_for(engine_bin)}
    plain = subprocess.run(args + ["--draft", "off"], capture_output=True, text=True, env=env)
    drafted = subprocess.run(args + FORCED, capture_output=True, text=True, env=env)
    assert plain.returncode == 0 and drafted.returncode == 0, drafted.stderr
    assert drafted.stdout == plain.stdout
    assert "draft_tokens=" in drafted.stderr and "draft_accepted=" in drafted.stderr


def test_draft_bench_checks_outputs_and_reports(models, engine_bin):  # noqa: F811
    """tools/draft_bench.py on a tiny model: one round, its JSON has every prompt with both sides."""
    import json
    env = {**os.environ, **env_for(engine_bin), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "draft_bench.py"), "--model", str(models("llama")),
                        "--rounds", "1", "--max-tokens", "24", "--threads", "1", "--adapt", "off", "--raw", "--json"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert set(res) == {"quote", "edit-code", "story", "list"}
    for row in res.values():
        assert row["plain_tok_s"] > 0 and row["draft_tok_s"] > 0 and row["completion_tokens"] >= 1
        assert 0 <= row["draft_accepted"] <= row["draft_tokens"]


def test_budget_counts_the_verify_logits(models):
    """Each stream that may draft holds (K + 1) rows of logits: the RAM budget's runtime share
    grows by exactly that, so a tight --ram leaves them room."""
    model = models("llama")
    runtime = {}
    for name, extra in (("off", ["--draft", "off"]), ("lookup", ["--draft", "lookup", "--draft-max", "5"])):
        with engine_client.Engine(model, ctx=64, kv_slots=2, extra=extra + ["--parallel", "2"]) as eng:
            runtime[name], vocab = int(eng.info["runtime_bytes"]), int(eng.info["vocab"])
        assert_clean_exit(eng)
    assert runtime["lookup"] - runtime["off"] == 2 * (5 + 1) * vocab * 4
