"""Requests and settings the context cannot hold, through `coli serve` and the official clients
on a tiny model (512 positions): an OpenAI max_tokens that does not fit after the prompt is a
400 context_length_exceeded naming the numbers, as OpenAI answers; without max_tokens the answer
runs to the end of the context; Anthropic's required max_tokens is a cap that ends in
model_context_window_exceeded; a --ctx or --ram the model or machine cannot honour stops the
server at start-up instead of an engine that never loads."""
import re
import subprocess
import sys

import anthropic
import openai
import pytest

from server_helpers import COLI, ServerProc, model, template  # noqa: F401

MID = "qwen3_moe"
CTX = 512
HI = [{"role": "user", "content": "Hello there"}]
NEEDS = re.compile(r"maximum context length is 512 tokens, but the request needs (\d+) \((\d+) in the prompt, "
                   r"max_tokens (\d+)\): lower max_tokens to (\d+) or less")


@pytest.fixture(scope="module")
def server(model, template):  # noqa: F811
    with ServerProc(model, "--chat-template", template, "--no-kv-persist") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=60)


def prompt_tokens(client):
    return client.chat.completions.create(model=MID, messages=HI, max_tokens=1, temperature=0).usage.prompt_tokens


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("stream", [False, True])
def test_chat_max_tokens_past_the_context_is_a_400(client, field, stream):
    n = prompt_tokens(client)
    with pytest.raises(openai.BadRequestError) as e:
        r = client.chat.completions.create(model=MID, messages=HI, temperature=0, stream=stream,
                                           **{field: CTX - n + 1})
        list(r) if stream else r  # noqa: B018 - a stream raises on its first read at the latest
    assert e.value.status_code == 400 and e.value.code == "context_length_exceeded"
    m = NEEDS.search(e.value.message)
    assert m, e.value.message
    assert [int(x) for x in m.groups()] == [CTX + 1, n, CTX - n + 1, CTX - n]


def test_the_largest_max_tokens_that_fits_is_honoured(client):
    n = prompt_tokens(client)
    r = client.chat.completions.create(model=MID, messages=HI, temperature=0, max_tokens=CTX - n,
                                       extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == CTX - n


def test_without_max_tokens_chat_runs_to_the_end_of_the_context(client):
    r = client.chat.completions.create(model=MID, messages=HI, temperature=0, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.total_tokens == CTX


def test_completions_explicit_max_tokens_is_checked_the_default_is_cut(client):
    ids = [5 + i % 200 for i in range(CTX - 7)]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MID, prompt=ids, max_tokens=8, temperature=0)
    assert e.value.code == "context_length_exceeded" and "lower max_tokens to 7 or less" in e.value.message
    r = client.completions.create(model=MID, prompt=ids, max_tokens=7, temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 7
    # no max_tokens: OpenAI's default of 16 was not asked for, so it ends with the context
    r = client.completions.create(model=MID, prompt=ids, temperature=0, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 7


def test_n_predict_is_a_cap_the_context_ends(client):
    """llama-server's n_predict (what the dashboard sends): past the context it is cut, not refused;
    inside it, it caps the answer as max_tokens does."""
    n = prompt_tokens(client)
    r = client.chat.completions.create(model=MID, messages=HI, temperature=0,
                                       extra_body={"ignore_eos": True, "n_predict": 4 * CTX})
    assert r.choices[0].finish_reason == "length" and r.usage.total_tokens == CTX
    r = client.chat.completions.create(model=MID, messages=HI, temperature=0, extra_body={"ignore_eos": True, "n_predict": 3})
    assert r.usage.completion_tokens == 3 and r.usage.prompt_tokens == n
    ids = [5 + i % 200 for i in range(CTX - 7)]
    r = client.completions.create(model=MID, prompt=ids, temperature=0, extra_body={"ignore_eos": True, "n_predict": 100})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 7
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MID, messages=HI, extra_body={"n_predict": 0})
    assert e.value.param == "n_predict"


def test_a_prompt_past_the_context_is_still_named(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MID, prompt=[5] * (CTX + 3), max_tokens=1)
    assert e.value.code == "context_length_exceeded" and "prompt has 515 tokens; the context holds 512" in e.value.message


def test_anthropic_max_tokens_is_a_cap_that_says_the_context_filled(server):
    client = anthropic.Anthropic(base_url=server.base, api_key="unused", max_retries=0, timeout=60)
    m = client.messages.create(model=MID, max_tokens=1000, messages=HI, extra_body={"temperature": 0, "ignore_eos": True})
    assert m.stop_reason == "model_context_window_exceeded"
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens + m.usage.output_tokens == CTX


@pytest.mark.parametrize("flags,message", [
    (["--ctx", "4096"], "--ctx 4096: this model holds 1 to 512 positions"),
    (["--ram", "100000"], "--ram 100000: this machine (or its cgroup) has"),
])
def test_settings_the_model_or_machine_cannot_honour_stop_the_server(model, flags, message):  # noqa: F811
    r = subprocess.run([sys.executable, str(COLI), "serve", "--model", str(model), "--port", "0", "--no-kv-persist",
                        *flags], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert "listening" not in r.stderr + r.stdout and "Traceback" not in r.stderr
