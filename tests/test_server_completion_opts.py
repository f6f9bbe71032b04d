"""The vLLM / llama-server extensions `cache_slot` and `ignore_eos` through the official openai
client's extra_body, on /v1/completions as on chat."""
import json
import shutil

import openai
import pytest

from colibri import engine_client
from server_helpers import ServerProc, model, template  # noqa: F401

MID = "qwen3_moe"
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def eos_model(model, tmp_path_factory):  # noqa: F811
    """The model with its end-of-sequence id set to the token greedy decoding emits third, so a
    greedy run stops early unless ignore_eos holds it open."""
    with engine_client.Engine(model, ctx=128, kv_slots=1) as eng:
        toks = [e[1] for e in eng.generate(PROMPT, max_tokens=3, add_special=1) if e[0] == "data" and e[1] >= 0]
    out = tmp_path_factory.mktemp("eos") / MID
    shutil.copytree(model, out)
    man = json.loads((out / "colibri.json").read_text())
    man["eos_token_ids"] = [toks[2]]
    (out / "colibri.json").write_text(json.dumps(man))
    return out


@pytest.fixture(scope="module")
def client(eos_model, template):  # noqa: F811
    with ServerProc(eos_model, "--chat-template", template, "--kv-slots", "4", "--no-kv-persist") as s:
        yield openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0, timeout=60)


def complete(client, **extra):
    raw = client.completions.with_raw_response.create(model=MID, prompt=PROMPT, max_tokens=10, temperature=0,
                                                      extra_body=extra or None)
    return raw.parse(), int(raw.headers["x-colibri-slot"])


def test_completion_stops_at_eos_without_ignore_eos(client):
    r, _ = complete(client)
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 2


def test_ignore_eos_on_completions_runs_to_max_tokens(client):
    r, _ = complete(client, ignore_eos=True)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 10


def test_ignore_eos_on_chat(client):
    args = dict(model=MID, messages=[{"role": "user", "content": "hi"}], max_tokens=40, temperature=0)
    free = client.chat.completions.create(**args, extra_body={"ignore_eos": True})
    assert free.choices[0].finish_reason == "length" and free.usage.completion_tokens == 40


def test_cache_slot_on_completions(client):
    for slot in (3, 1):
        r, got = complete(client, cache_slot=slot)
        assert got == slot and r.usage.completion_tokens == 2
    with pytest.raises(openai.BadRequestError) as e:
        complete(client, cache_slot=4)
    assert e.value.body["code"] == "invalid_cache_slot"
