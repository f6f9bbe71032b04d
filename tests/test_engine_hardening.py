"""The engine under hostile files and faults, against the release and the ASan+UBSan builds:
crafted KV state files are refused and only their slot starts cold, one KV directory admits one
engine, stale temporaries are cleaned at start, and an allocation failure in the forward pass
costs one request an `ERROR out_of_memory`, never the engine."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
from colibri import engine_client  # noqa: E402
import kv_files  # noqa: E402
from engine_binaries import assert_clean_exit, engine_bin  # noqa: E402, F401


@pytest.fixture(scope="module", autouse=True)
def every_binary(engine_bin):  # noqa: F811
    return engine_bin


def convert(oracle_root, name, out):
    subprocess.run([sys.executable, str(ROOT / "coli"), "convert", str(Path(oracle_root) / name / "hf"), str(out),
                    "--experts", "bf16", "--dense", "bf16"], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def models(oracle_root, tmp_path_factory):
    base = tmp_path_factory.mktemp("hardening")
    return {name: convert(oracle_root, name, base / name) for name in ("llama", "qwen3_moe", "qwen3_5_moe", "glm_moe_dsa")}


@pytest.fixture(scope="module")
def model(models):
    return models["llama"]


def tokens(ev):
    return [e[1] for e in ev if e[0] == "data" and e[1] >= 0]


def run(eng, prompt, **opts):
    return list(eng.generate(prompt, **opts))


def stderr_has(eng, needle):
    eng.close()  # stderr is complete once the engine has exited
    eng._err_thread.join(timeout=10)
    return any(needle in line for line in eng.stderr_tail)


PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


def reference(model, prompt=PROMPT, max_tokens=6, **kw):
    with engine_client.Engine(model, ctx=64, **kw) as eng:
        return tokens(run(eng, prompt, max_tokens=max_tokens))


# --- crafted KV state files -------------------------------------------------------------------

@pytest.mark.parametrize("count", [2 ** 31, 2 ** 32 - 1, 65])
def test_crafted_kv_count_is_refused_and_other_slots_survive(model, tmp_path, count):
    """A count beyond the slot once passed a signed check and overran the buffer (ASan saw it).
    The body is far larger than the slot's token buffer, so an unchecked read would overrun."""
    with engine_client.Engine(model, ctx=64, kv_slots=2, kv_dir=tmp_path) as eng:
        run(eng, PROMPT, max_tokens=4, slot=1)
    kv_files.craft(tmp_path / ".coli_kv", model, count, body=bytes(256 * 1024))
    eng = engine_client.Engine(model, ctx=64, kv_slots=2, kv_dir=tmp_path)
    cold = run(eng, PROMPT, max_tokens=6, slot=0)
    warm = run(eng, PROMPT, max_tokens=6, slot=1)
    assert cold[0] == ("accept", len(PROMPT), 0)                 # the crafted slot starts cold...
    assert warm[0] == ("accept", len(PROMPT), len(PROMPT) - 1)   # ...the good one was restored
    assert tokens(cold) == tokens(warm) == reference(model)
    assert stderr_has(eng, f"{count} positions exceed the context of 64")
    assert_clean_exit(eng)


@pytest.mark.parametrize("damage,needle", [
    ("fingerprint", "another model"),
    ("truncated", "truncated or corrupt"),
    ("checksum", "corrupt"),
    ("header only", "truncated"),
])
def test_damaged_kv_file_is_refused_with_a_reason(model, tmp_path, damage, needle):
    with engine_client.Engine(model, ctx=64, kv_dir=tmp_path) as eng:
        run(eng, PROMPT, max_tokens=2)
    path = tmp_path / ".coli_kv"
    good = path.read_bytes()
    if damage == "fingerprint":
        kv_files.craft(path, model, 4, body=bytes(4 * 4 + 2 * 2 * 4 * 64 * 4), fp=kv_files.fingerprint(model) ^ 1)
    elif damage == "truncated":
        path.write_bytes(good[:-100])
    elif damage == "checksum":
        path.write_bytes(good[:-8] + bytes(8))
    else:
        kv_files.craft(path, model, 9, checksum=False)
    eng = engine_client.Engine(model, ctx=64, kv_dir=tmp_path)
    ev = run(eng, PROMPT, max_tokens=6)
    assert ev[0] == ("accept", len(PROMPT), 0) and tokens(ev) == reference(model)
    assert stderr_has(eng, needle)
    assert_clean_exit(eng)


# --- one engine per KV directory ----------------------------------------------------------------

def test_second_engine_on_a_kv_dir_is_refused(model, tmp_path):
    with engine_client.Engine(model, ctx=64, kv_dir=tmp_path) as first:
        with pytest.raises(engine_client.EngineError) as e:
            engine_client.Engine(model, ctx=64, kv_dir=tmp_path)
        msg = e.value.message
        # exit 3, not 1: worth a retry once the first engine has gone (docs/protocol.md)
        assert e.value.kind == "load_failed" and e.value.exit_code == 3 and "exited with code 3" in msg
        assert f"the KV directory {tmp_path} is in use by another colibri engine (pid {first.proc.pid})" in msg
        assert "--kv-dir" in msg
        assert tokens(run(first, PROMPT, max_tokens=2))  # the first one is untouched
    with engine_client.Engine(model, ctx=64, kv_dir=tmp_path) as again:  # free once the first has gone
        assert run(again, PROMPT, max_tokens=1)[0][0] == "accept"
    assert_clean_exit(again)


def test_stale_temporaries_are_removed_at_start(model, tmp_path):
    big = tmp_path / ".coli_kv.tmp"
    with open(big, "wb") as f:
        f.truncate(150 * 1024 * 1024)  # what a save killed half-way leaves (sparse: no disk used)
    (tmp_path / ".coli_kv.3.tmp").write_bytes(b"x" * 1000)
    (tmp_path / "notes.tmp").write_bytes(b"mine")
    eng = engine_client.Engine(model, ctx=64, kv_dir=tmp_path)
    assert not big.exists() and not (tmp_path / ".coli_kv.3.tmp").exists()
    assert (tmp_path / "notes.tmp").read_bytes() == b"mine"  # only the engine's own temporaries
    assert run(eng, PROMPT, max_tokens=1)[0][0] == "accept"
    assert stderr_has(eng, f"removed {big} (157.3 MB)")
    assert_clean_exit(eng)


# --- out of memory in the forward pass ----------------------------------------------------------

@pytest.mark.parametrize("name", ["llama", "qwen3_moe", "qwen3_5_moe"])
@pytest.mark.parametrize("after", [0, 3, 9, 25, 60])
def test_forward_allocation_failure_fails_one_request(models, name, after, monkeypatch):
    """COLI_FAIL_ALLOC_AFTER=N fails the forward pass's allocation N+1, once: during prefill or
    mid-generation (after some DATA frames). That request gets ERROR out_of_memory; the engine
    goes on, and the same conversation then answers exactly as a fresh engine does."""
    want = reference(models[name], max_tokens=8)
    monkeypatch.setenv("COLI_FAIL_ALLOC_AFTER", str(after))
    with engine_client.Engine(models[name], ctx=64) as eng:
        with pytest.raises(engine_client.EngineError) as e:
            run(eng, PROMPT, max_tokens=8)
        assert e.value.kind == "out_of_memory" and "forward pass" in e.value.message
        assert tokens(run(eng, PROMPT, max_tokens=8)) == want
        assert tokens(run(eng, PROMPT, max_tokens=8)) == want  # and its cache was left consistent
    assert_clean_exit(eng)


# long enough that the DSA indexer (top-16) selects, and that a prompt's later chunks attend
# through the latent rather than expanding keys and values (--batch 8)
LONG_PROMPT = [(7 * i) % 300 + 1 for i in range(40)]


@pytest.mark.parametrize("after", [0, 5, 20, 60, 150, 400])
def test_latent_attention_allocation_failure_fails_one_request(models, after, monkeypatch):
    """The same for latent attention with a DSA indexer (glm_moe_dsa): an allocation that fails in
    the indexer's selection, the gathered rows or the absorbed attention fails that request
    alone, leaks nothing (the ASan build's leak check at exit), and the conversation then
    answers as a fresh engine does."""
    model = models["glm_moe_dsa"]
    want = reference(model, prompt=LONG_PROMPT, max_tokens=8, batch=8)
    monkeypatch.setenv("COLI_FAIL_ALLOC_AFTER", str(after))
    with engine_client.Engine(model, ctx=64, batch=8) as eng:
        with pytest.raises(engine_client.EngineError) as e:
            run(eng, LONG_PROMPT, max_tokens=8)
        assert e.value.kind == "out_of_memory" and "forward pass" in e.value.message
        assert tokens(run(eng, LONG_PROMPT, max_tokens=8)) == want
    assert_clean_exit(eng)


def test_logits_allocation_failure_is_an_error_frame(model, monkeypatch):
    with engine_client.Engine(model, ctx=64) as eng:
        want = run(eng, PROMPT, logits=1)[1][2]
    monkeypatch.setenv("COLI_FAIL_ALLOC_AFTER", "0")
    with engine_client.Engine(model, ctx=64) as eng:
        with pytest.raises(engine_client.EngineError) as e:
            run(eng, PROMPT, logits=1)
        assert e.value.kind == "out_of_memory"
        assert run(eng, PROMPT, logits=1)[1][2] == want
    assert_clean_exit(eng)


def test_logits_command_reports_out_of_memory(model, tmp_path):
    env = {**os.environ, "COLI_FAIL_ALLOC_AFTER": "0"}
    r = subprocess.run([str(engine_client.ENGINE), "logits", "--model", str(model), "--ids", "1,2,3",
                        "--out", str(tmp_path / "l.f32")], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1 and "out of memory for 3 positions" in r.stderr
    assert not (tmp_path / "l.f32").exists()


# --- a tokenizer.json that does not belong to the weights ---------------------------------------

def test_tokenizer_ids_past_the_embedding_are_refused(model, tmp_path):
    """A model folder is untrusted: its tokenizer.json may name ids the embedding has no row for.
    The prompt that produces one gets a bad_request naming the cause; nothing is read past the
    table (the ASan build would say so) and the engine goes on serving."""
    import json
    import shutil
    hostile = tmp_path / "hostile"
    shutil.copytree(model, hostile)
    tj = json.loads((hostile / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = json.loads((hostile / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    tj["added_tokens"].append({"id": vocab + 1000, "content": "<|evil|>", "single_word": False, "lstrip": False,
                               "rstrip": False, "normalized": False, "special": True})
    (hostile / "tokenizer.json").write_text(json.dumps(tj), encoding="utf-8")
    with engine_client.Engine(hostile, ctx=64) as eng:
        with pytest.raises(engine_client.EngineError) as e:
            run(eng, "hello <|evil|>", max_tokens=2)
        assert e.value.kind == "bad_request"
        # (like HF tokenizers, the loader numbers the added token right after the vocabulary)
        assert f"token id {vocab}, outside the model's vocabulary of {vocab}" in e.value.message
        assert tokens(run(eng, "hello", max_tokens=2))
    assert_clean_exit(eng)
