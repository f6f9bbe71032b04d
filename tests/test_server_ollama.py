"""`coli serve`'s ollama API through the official `ollama` client on a tiny real model:
/api/chat and /api/generate (NDJSON streaming and not), options, format, the model endpoints."""
import json

import ollama
import pytest

from server_helpers import ServerProc, model, post_json, template  # noqa: F401

MID = "qwen3_moe"
HI = [{"role": "user", "content": "Hello there"}]
GREEDY = {"temperature": 0, "num_predict": 8}


@pytest.fixture(scope="module")
def server(model, template):  # noqa: F811
    with ServerProc(model, "--chat-template", template, "--kv-slots", "2", "--no-kv-persist") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.base, timeout=30)


def openai_chat(server, **kw):
    s, _, b = post_json(server.port, "/v1/chat/completions", {"messages": HI, **kw})
    assert s == 200, b
    return b["choices"][0]


def test_chat_answers_as_the_openai_endpoint_does(client, server):
    r = client.chat(model=MID, messages=HI, options=GREEDY)
    want = openai_chat(server, max_tokens=8, temperature=0)
    assert r.message.role == "assistant" and r.message.content == want["message"]["content"]
    assert r.done and r.done_reason == "length" and r.eval_count == 8 and r.prompt_eval_count > 0
    assert r.total_duration > 0 and r.model == MID


def test_chat_streams_ndjson(client, server):
    parts = list(client.chat(model=MID, messages=HI, options=GREEDY, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done and parts[-1].eval_count == 8
    assert "".join(p.message.content for p in parts) == client.chat(model=MID, messages=HI, options=GREEDY).message.content
    s, h, raw = server.request("POST", "/api/chat", {"model": MID, "messages": HI, "options": GREEDY})
    assert s == 200 and h["content-type"] == "application/x-ndjson"  # ollama streams unless told not to
    lines = [json.loads(ln) for ln in raw.decode().splitlines()]
    assert lines[-1]["done"] is True and lines[-1]["done_reason"] == "length"


def test_generate_templated_and_raw(client, server):
    r = client.generate(model=MID, prompt="Hello there", options=GREEDY)
    assert r.response == client.chat(model=MID, messages=HI, options=GREEDY).message.content and r.done
    raw = client.generate(model=MID + ":latest", prompt="Once upon a time", raw=True, options=GREEDY)
    s, _, b = post_json(server.port, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8,
                                                         "temperature": 0})
    assert raw.response == b["choices"][0]["text"]
    streamed = list(client.generate(model=MID, prompt="Once upon a time", raw=True, options=GREEDY, stream=True))
    assert "".join(p.response for p in streamed) == raw.response and streamed[-1].done


def test_options_map_to_sampling(client):
    def gen(**o):
        return client.generate(model=MID, prompt="Hello there", options={"num_predict": 12, **o}).response
    a = gen(temperature=1.5, top_k=0, top_p=1, seed=11)
    assert a == gen(temperature=1.5, top_k=0, top_p=1, seed=11)
    assert {gen(temperature=1.5, top_k=0, top_p=1, seed=s) for s in (12, 13)} - {a}
    plain = gen(temperature=0)
    assert gen(temperature=0, repeat_penalty=1, presence_penalty=0, frequency_penalty=0, repeat_last_n=64,
               num_ctx=4096, num_thread=2) == plain
    assert gen(temperature=0, presence_penalty=2, frequency_penalty=2, repeat_last_n=-1) != plain
    stop = gen(temperature=0)[3:5]
    if stop.strip():
        assert stop not in gen(temperature=0, stop=[stop])


def test_format_json_is_valid_json(client):
    r = client.chat(model=MID, messages=HI, format="json", options={"temperature": 0, "num_predict": 64})
    assert isinstance(json.loads(r.message.content), dict)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    r = client.generate(model=MID, prompt="a number", format=schema, options={"temperature": 0, "num_predict": 64})
    assert isinstance(json.loads(r.response)["n"], int)


def test_model_endpoints(client, server):
    tags = client.list()
    assert [m.model for m in tags.models] == [MID] and tags.models[0].size > 0
    show = client.show(MID)
    assert "temperature" in show.parameters and show.modelinfo["general.architecture"] == MID
    assert "completion" in show.capabilities
    assert [m.model for m in client.ps().models] == [MID]
    s, _, b = server.request("GET", "/api/version")
    assert s == 200 and json.loads(b)["version"]
    loaded = client.generate(model=MID, prompt="", keep_alive="5m")
    assert loaded.done and loaded.done_reason == "load"


def test_errors_name_the_problem(client):
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="llama3", messages=HI)
    assert e.value.status_code == 404 and "llama3" in e.value.error and MID in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model=MID, messages=HI, options={"temperature": 5})
    assert e.value.status_code == 400 and "options.temperature" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model=MID, messages=HI, options={"mirostat": 2})
    assert e.value.status_code == 400 and "options.mirostat" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.show("nope")
    assert e.value.status_code == 404
