"""Repetition, frequency and presence penalties in the engine's sampler, through a real engine on
a tiny model, against a numpy reference of llama.cpp's rule over the same teacher-forced logits
(the window holds the last repeat_last_n tokens of prompt and output)."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
from colibri import engine_client  # noqa: E402
from engine_binaries import assert_clean_exit, engine_bin  # noqa: E402, F401

PROMPT = [5, 6, 7, 5, 6, 9]


@pytest.fixture(scope="module", autouse=True)
def every_binary(engine_bin):  # noqa: F811
    return engine_bin


@pytest.fixture(scope="module")
def model(oracle_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("pen") / "llama"
    subprocess.run([sys.executable, str(ROOT / "coli"), "convert", str(Path(oracle_root) / "llama" / "hf"), str(out),
                    "--experts", "bf16", "--dense", "bf16"], check=True, capture_output=True)
    return out


@pytest.fixture
def engine(model):
    with engine_client.Engine(model, ctx=96, kv_slots=1) as eng:
        yield eng
    assert_clean_exit(eng)


def tokens(eng, payload, **opts):
    return [e[1] for e in eng.generate(payload, ignore_eos=1, **opts) if e[0] == "data" and e[1] >= 0]


def logits_rows(eng, ids):
    ev = [e for e in eng.generate(ids, logits=1) if e[0] == "logits"][0]
    (rows, vocab), body = ev[1], ev[2]
    return np.frombuffer(body, dtype="<f4").reshape(rows, vocab)


def penalize(logits, window, repeat=1.0, frequency=0.0, presence=0.0):
    """llama.cpp's llama_sampler_penalties_apply over one row."""
    x = logits.astype(np.float32).copy()
    ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
    v = x[ids]
    v = np.where(v <= 0, v * np.float32(repeat), v / np.float32(repeat))
    x[ids] = v - (counts.astype(np.float32) * np.float32(frequency) + np.float32(presence))
    return x


@pytest.mark.parametrize("pen", [dict(repeat_penalty=1.8, repeat_last_n=4),
                                 dict(frequency_penalty=2.0, presence_penalty=2.0, repeat_last_n=64),
                                 dict(repeat_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.1, repeat_last_n=-1)])
def test_greedy_with_penalties_matches_the_reference(engine, pen):
    n = 16
    plain = tokens(engine, PROMPT, max_tokens=n)
    got = tokens(engine, PROMPT, max_tokens=n, **pen)
    assert len(got) == n and got != plain  # the penalties change this greedy run
    rows = logits_rows(engine, PROMPT + got[:-1])
    last_n = pen["repeat_last_n"]
    kw = {k: pen[k] for k in pen if k != "repeat_last_n"}
    names = {"repeat_penalty": "repeat", "frequency_penalty": "frequency", "presence_penalty": "presence"}
    kw = {names[k]: v for k, v in kw.items()}
    checked = 0
    for j, tok in enumerate(got):
        seen = PROMPT + got[:j]
        window = seen if last_n < 0 else seen[-last_n:]
        x = penalize(rows[len(PROMPT) - 1 + j], window, **kw)
        top2 = np.sort(x)[-2:]
        if top2[1] - top2[0] < 1e-3:  # a near-tie: batched prefill and decode may round apart
            continue
        assert tok == int(x.argmax()), (j, tok, int(x.argmax()))
        checked += 1
    assert checked >= n - 2


def test_neutral_penalties_change_nothing(engine):
    plain = tokens(engine, PROMPT, max_tokens=12)
    assert tokens(engine, PROMPT, max_tokens=12, repeat_penalty=1, frequency_penalty=0, presence_penalty=0,
                  repeat_last_n=8) == plain
    seeded = tokens(engine, PROMPT, max_tokens=12, temp=1.0, seed=7)
    assert tokens(engine, PROMPT, max_tokens=12, temp=1.0, seed=7, repeat_penalty=1, repeat_last_n=0) == seeded


def test_a_large_presence_penalty_never_repeats_a_sampled_token(engine):
    # temperature 1.5 over the whole vocabulary: without the penalty tokens recur within 40 draws
    free = [tokens(engine, PROMPT, max_tokens=40, temp=1.5, seed=s) for s in (1, 2, 3)]
    assert any(len(set(PROMPT + t)) < len(set(PROMPT)) + 40 for t in free)
    for s in (1, 2, 3):
        t = tokens(engine, PROMPT, max_tokens=40, temp=1.5, seed=s, presence_penalty=100, repeat_last_n=-1)
        assert len(t) == 40 and not set(t) & set(PROMPT) and len(set(t)) == 40


def test_bad_values_are_refused_by_name(engine):
    with pytest.raises(engine_client.EngineError) as e:
        tokens(engine, PROMPT, max_tokens=2, repeat_last_n=-2)
    assert e.value.kind == "bad_request" and "repeat_last_n" in e.value.message


def test_run_takes_the_penalty_flags(model):
    def run(*flags):
        return subprocess.run([sys.executable, str(ROOT / "coli"), "run", "--model", str(model), "--ids", "5,6,7,5,6,9",
                               "--max-tokens", "16", *flags], capture_output=True, text=True, timeout=120)
    plain, pen = run(), run("--frequency-penalty", "2", "--presence-penalty", "2", "--repeat-last-n", "-1")
    assert plain.returncode == 0 and pen.returncode == 0, plain.stderr + pen.stderr
    assert plain.stdout != pen.stdout
    bad = run("--repeat-penalty", "0")
    assert bad.returncode != 0 and "--repeat-penalty 0" in bad.stderr and "above 0" in bad.stderr
