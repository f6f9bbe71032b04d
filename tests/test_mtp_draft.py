"""Speculative decoding with the checkpoint's multi-token-prediction head (--draft mtp).

The head's logits match a torch reference written from the DeepSeek-V3 report (tests/
mtp_reference.py) on the tiny models of every family whose checkpoints ship MTP layers and whose
layer the engine runs; decoding with MTP drafts gives exactly the tokens decoding without them
gives, greedy and sampled with a seed. A head with random weights proposes tokens the model
rarely takes, so the identity tests also use a head built to propose the model's own bigrams
(add_mtp_layer's bigram): drafts get accepted, and the kept positions' head state is rebuilt
from the verify pass."""
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mtp_reference
from colibri import engine_client
from engine_binaries import assert_clean_exit, engine_bin, env_for  # noqa: F401
from test_batching import collect

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ["deepseek_v3", "glm4_moe", "glm_moe_dsa"]
HYBRID = "qwen3_5_moe_text"  # mtp.* in Qwen3.5's layout, beside gated-DeltaNet layers
FORCED = ["--draft", "mtp", "--draft-adapt", "off"]
PROMPT = [5, 6, 7, 8, 9, 10, 11, 12] * 3 + [5, 6]
IDS = [3, 17, 42, 99, 5, 250, 7, 8, 13, 200, 31, 64, 1, 2, 77, 150]
BF16 = ["--experts", "bf16", "--dense", "bf16"]


@pytest.fixture(scope="module", autouse=True)
def every_binary(engine_bin):  # noqa: F811
    """Release and ASan+UBSan: the head's slot is cut back after every draft."""
    return engine_bin


def convert(src, out, *flags):
    r = subprocess.run([sys.executable, str(ROOT / "coli"), "convert", str(src), str(out), *flags],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


def generate(model, extra, prompt=PROMPT, n=64, **opts):
    with engine_client.Engine(model, ctx=256, threads=1, extra=extra) as eng:
        ev = list(eng.generate(prompt, max_tokens=n, ignore_eos=1, **opts))
        info = eng.info
    assert_clean_exit(eng)
    assert ev[-1][0] == "end", ev[-1]
    return [e[1] for e in ev if e[0] == "data" and e[1] >= 0], ev[-1][1], info


@pytest.fixture(scope="module")
def models(oracle_root, tmp_path_factory):
    """family -> (random head: hf dir, container), built on first use."""
    root, cache = tmp_path_factory.mktemp("mtp"), {}

    def get(family):
        if family not in cache:
            hf = mtp_reference.add_mtp_layer(Path(oracle_root) / family / "hf", root / family / "hf")
            cache[family] = hf, convert(hf, root / family / "c", *BF16)
        return cache[family]
    return get


@pytest.fixture(scope="module")
def bigram_models(oracle_root, models, tmp_path_factory):
    """family -> container whose head proposes the bigrams of the model's own greedy output."""
    root, cache = tmp_path_factory.mktemp("mtp_bigram"), {}

    def get(family):
        if family not in cache:
            out, _, _ = generate(models(family)[1], [])
            seq = PROMPT + out
            bigram = {a: b for a, b in zip(seq, seq[1:])}
            hf = mtp_reference.add_mtp_layer(Path(oracle_root) / family / "hf", root / family / "hf", bigram=bigram)
            cache[family] = convert(hf, root / family / "c", *BF16)
        return cache[family]
    return get


@pytest.mark.parametrize("family", FAMILIES + [HYBRID])
def test_mtp_head_matches_the_reference(family, models, tmp_path):
    hf, c = models(family)
    out, mtp = tmp_path / "main.f32", tmp_path / "mtp.f32"
    r = subprocess.run([sys.executable, str(ROOT / "coli"), "logits", "--model", str(c), "--ids", ",".join(map(str, IDS)),
                        "--out", str(out), "--mtp-out", str(mtp), "--threads", "1"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ref = mtp_reference.mtp_logits(hf, IDS)
    got = np.fromfile(mtp, "<f4").reshape(ref.shape)
    scale = np.abs(ref).max()
    assert np.abs(got - ref).max() <= 1e-3 * scale, (np.abs(got - ref).max(), scale)
    assert (got.argmax(1) == ref.argmax(1)).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_output_is_unchanged(family, models, bigram_models):
    plain, _, _ = generate(models(family)[1], [])
    for c in (models(family)[1], bigram_models(family)):
        got, end, info = generate(c, FORCED)
        assert info["draft"] == "mtp"
        assert got == plain
        assert int(end["draft_tokens"]) > 0
    assert int(end["draft_accepted"]) > 0, end  # the bigram head's drafts are taken


def test_hybrid_drafts_and_keeps_the_output(models):
    """Qwen3.5's head drafts beside the gated-DeltaNet layers, whose state each cut draft restores
    and replays: the output is the plain one."""
    hf, c = models(HYBRID)
    meta = json.loads((c / "colibri.json").read_text())
    assert meta["mtp_layers"] == [4] and meta["mtp"][0]["enorm"]["weight_offset"] == 1.0
    plain, _, _ = generate(c, [])
    got, end, info = generate(c, FORCED)
    assert info["draft"] == "mtp" and "draft_off" not in info
    assert got == plain and int(end["draft_tokens"]) > 0


def test_sampled_output_is_unchanged_with_a_seed(models, bigram_models):
    """A greedy draft is a point-mass proposal: sampling each position and keeping the draft while
    it matches is the speculative-sampling rule for it, so a seed gives the same tokens."""
    c = bigram_models("deepseek_v3")
    for seed in (1, 2):
        opts = dict(temp=0.4, top_p=0.95, seed=seed)
        plain, _, _ = generate(c, [], **opts)
        got, end, _ = generate(c, FORCED, **opts)
        assert got == plain and int(end["draft_tokens"]) > 0


def test_prefix_reuse_and_later_turns_keep_the_output(bigram_models):
    """A second request on the same slot reuses the prompt's prefix: the head's slot is cut back
    with the main one, and the output is still the plain one."""
    c = bigram_models("deepseek_v3")
    second = PROMPT + [9, 10, 11]
    with engine_client.Engine(c, ctx=256, threads=1, extra=FORCED) as eng:
        runs = [[e[1] for e in eng.generate(p, max_tokens=40, ignore_eos=1) if e[0] == "data" and e[1] >= 0]
                for p in (PROMPT, second, PROMPT)]
    assert_clean_exit(eng)
    with engine_client.Engine(c, ctx=256, threads=1) as eng:
        plain = [[e[1] for e in eng.generate(p, max_tokens=40, ignore_eos=1) if e[0] == "data" and e[1] >= 0]
                 for p in (PROMPT, second, PROMPT)]
    assert runs == plain


def test_mtp_is_refused_without_mtp_layers(oracle_root, tmp_path):
    no_mtp = convert(Path(oracle_root) / "qwen3_moe" / "hf", tmp_path / "q")
    r = subprocess.run([str(engine_client.ENGINE), "--model", str(no_mtp), "--draft", "mtp"], input="",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "has no multi-token-prediction layers" in r.stderr, r.stderr


def test_streamed_experts_keep_the_output_and_the_head_in_the_budget(bigram_models):
    """Under --cap the trunk's experts and the head's stream through the cache, the head's as one
    more MoE layer of the budget; the output is still the plain one."""
    c = bigram_models("deepseek_v3")
    runs = {}
    for name, extra in (("plain", []), ("mtp", FORCED)):
        r = subprocess.run([sys.executable, str(ROOT / "coli"), "run", "--model", str(c), "--ids", ",".join(map(str, PROMPT)),
                            "--max-tokens", "32", "--cap", "2", "--threads", "1", "--stats", *extra],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        runs[name] = r
    assert runs["mtp"].stdout == runs["plain"].stdout
    assert "the MTP layer's included" in runs["mtp"].stderr and "the MTP layer's included" not in runs["plain"].stderr
    assert "page cache" not in runs["mtp"].stderr
    assert "draft_tokens=" in runs["mtp"].stderr
    layers = [int(re.search(r"moe_layers=(\d+)", run_ready(c, extra)).group(1)) for extra in ([], FORCED)]
    assert layers[1] == layers[0] + 1, layers


def run_ready(model, extra):
    """The READY line of an engine on model with --cap 2 and the given flags."""
    from colibri import engine_client
    with engine_client.Engine(model, threads=1, extra=["--cap", "2", *extra]) as eng:
        return " ".join(f"{k}={v}" for k, v in eng.info.items())


def test_draft_bench_measures_mtp(bigram_models, engine_bin):  # noqa: F811
    """tools/draft_bench.py --draft mtp: both sides print the same text, and the MTP side drafts."""
    import json
    import os
    env = {**os.environ, **env_for(engine_bin), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "draft_bench.py"), "--model", str(bigram_models("deepseek_v3")),
                        "--draft", "mtp", "--rounds", "1", "--max-tokens", "24", "--threads", "1", "--adapt", "off", "--raw",
                        "--json"], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert all(row["draft_tok_s"] > 0 and 0 < row["draft_tokens"] for row in res.values()), res


def test_batched_decode_keeps_every_slot_s_head_in_step(bigram_models):
    """Two requests decoding together (batched rows, no drafts while both run), then the longer
    one alone (it drafts): each slot's head follows its own rows, and every output is the plain
    one."""
    c = bigram_models("deepseek_v3")
    jobs = ((PROMPT, 48), ([9, 10, 11, 12, 5, 6, 7, 8] * 2, 16))
    outs = {}
    for name, extra in (("plain", []), ("mtp", FORCED)):
        with engine_client.Engine(c, ctx=256, threads=1, kv_slots=2, extra=extra + ["--parallel", "2"]) as eng:
            eng.write(b"".join(engine_client.submit_frame(f"r{i}", p, slot=i, max_tokens=n, ignore_eos=1)
                               for i, (p, n) in enumerate(jobs)))
            outs[name] = collect(eng, ["r0", "r1"])[0]
        assert_clean_exit(eng)
    assert outs["mtp"] == outs["plain"] and len(outs["mtp"]["r0"]) == 48
