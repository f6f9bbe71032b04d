"""`coli perplexity` on the converted SmolLM2 against transformers on the same weights and the
same token chunks: perplexity equal, KL ~0 and top-1 100%; misaligned reference logits must
show up as a large KL."""
import json
import subprocess
import sys

import numpy as np
import pytest

from test_gguf_common import ENGINE_OPTS, ROOT, reference, smollm2_container  # noqa: F401

CTX = 64
TEXT = (
    "The history of the city begins in ancient times, when a small settlement grew along the banks of the river. "
    "Over the centuries, merchants and farmers arrived, drawn by fertile land and the promise of trade. By the "
    "middle ages the town had built walls, a market square and a cathedral whose bells could be heard for miles. "
    "Today it is known for its museums, its narrow streets and its cafes, where visitors sit for hours watching "
    "people go by. Every spring a festival fills the squares with music, and in the autumn the harvest brings food "
    "from all over the region to the old market hall. Scientists who study the region have found that the climate "
    "has changed slowly over the last thousand years, and that the river once followed a different course through "
    "the valley, leaving behind lakes, marshes and the rich soil that made the first farms possible.\n")


def coli_ppl(model, text_file, *extra):
    r = subprocess.run([sys.executable, str(ROOT / "coli"), "perplexity", "--model", str(model), "--file",
                        str(text_file), "--ctx", str(CTX), *ENGINE_OPTS, *map(str, extra)],
                       capture_output=True, text=True, timeout=600)
    return r


def log_softmax(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


@pytest.fixture(scope="module")
def setup(smollm2_container, reference, tmp_path_factory):
    """(text file, token ids, transformers logits per chunk)."""
    import torch
    from tokenizers import Tokenizer
    d = tmp_path_factory.mktemp("ppl")
    text = d / "text.txt"
    text.write_text(TEXT)
    ids = Tokenizer.from_file(str(smollm2_container / "tokenizer.json")).encode(TEXT).ids
    n = len(ids) // CTX
    assert n >= 2, f"the test text must give 2 chunks of {CTX} tokens, it has {len(ids)} tokens"
    model, _ = reference
    with torch.no_grad():
        ref = np.stack([model(torch.tensor([ids[c * CTX:(c + 1) * CTX]])).logits[0].numpy() for c in range(n)])
    return text, ids, ref.astype(np.float32)


def test_perplexity_matches_transformers(smollm2_container, setup, tmp_path):
    text, ids, ref = setup
    ref_file = tmp_path / "ref.f32"
    ref.tofile(ref_file)
    r = coli_ppl(smollm2_container, text, "--json", "--ref-logits", ref_file)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    n = ref.shape[0]
    lp = log_softmax(ref.astype(np.float64))
    nll = [-lp[c, j, ids[c * CTX + j + 1]] for c in range(n) for j in range(CTX // 2, CTX - 1)]
    want = float(np.exp(np.mean(nll)))
    print(f"SmolLM2 Q4_1 perplexity on {got['scored']} tokens: engine {got['ppl']:.4f} +/- {got['ppl_err']:.3f}, "
          f"transformers {want:.4f}; KL mean {got['kl_mean']:.2e}, max {got['kl_max']:.2e}, "
          f"top-1 {100 * got['top1']:.1f}%")
    assert got["chunks"] == n and got["scored"] == len(nll) and got["tokens"] == len(ids)
    assert abs(got["ppl"] - want) / want < 1e-3
    assert abs(got["ref_ppl"] - want) / want < 1e-4
    assert 1.5 < got["ppl"] < 200, "a sane English text under a working model"
    assert got["kl_mean"] < 1e-4 and got["top1"] >= 0.98


def test_kl_detects_other_logits(smollm2_container, setup, tmp_path):
    """Reference logits shifted by one position belong to other contexts: large KL, low top-1."""
    text, _, ref = setup
    ref_file = tmp_path / "shifted.f32"
    np.roll(ref, 1, axis=1).tofile(ref_file)
    r = coli_ppl(smollm2_container, text, "--json", "--ref-logits", ref_file)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    print(f"misaligned reference: KL mean {got['kl_mean']:.2f}, top-1 {100 * got['top1']:.1f}%")
    assert got["kl_mean"] > 0.5 and got["top1"] < 0.5


def test_save_logits_then_compare_is_exact(smollm2_container, setup, tmp_path):
    text, _, _ = setup
    saved = tmp_path / "self.f32"
    r = coli_ppl(smollm2_container, text, "--save-logits", saved)
    assert r.returncode == 0, r.stderr
    assert "perplexity" in r.stdout
    r = coli_ppl(smollm2_container, text, "--ref-logits", saved)
    assert r.returncode == 0, r.stderr
    assert "mean KL 0.000e+00" in r.stdout and "top-1 agreement 100.00%" in r.stdout, r.stdout


def test_errors(smollm2_container, setup, tmp_path):
    text, _, _ = setup
    bad = tmp_path / "bad.f32"
    bad.write_bytes(b"\0" * 100)
    r = coli_ppl(smollm2_container, text, "--ref-logits", bad)
    assert r.returncode == 2 and "expected" in r.stderr and "--save-logits" in r.stderr, r.stderr
    short = tmp_path / "short.txt"
    short.write_text("Too short.")
    r = coli_ppl(smollm2_container, short)
    assert r.returncode == 2 and "fewer than one chunk" in r.stderr, r.stderr
    r = coli_ppl(smollm2_container, tmp_path / "missing.txt")
    assert r.returncode == 2 and "no such file" in r.stderr, r.stderr
    r = coli_ppl(smollm2_container, tmp_path)
    assert r.returncode == 2 and "a directory, not a text file" in r.stderr, r.stderr
