"""Model names: --model-id takes aliases (repeated or comma-separated), --any-model-name accepts
any name as llama-server does, and otherwise an unknown name is a 404."""
import json

import ollama
import openai
import pytest

from launcher_helpers import coli
from server_helpers import ServerProc, model, post_json, template  # noqa: F401

from colibri.server import config as server_config
from colibri.errors import UserError

HI = [{"role": "user", "content": "Hello there"}]


def chat(server, name):
    return post_json(server.port, "/v1/chat/completions", {"model": name, "messages": HI, "max_tokens": 2,
                                                           "temperature": 0})


def test_names_are_split_and_checked():
    assert server_config.model_names(["a,b", "c", "a"]) == ["a", "b", "c"]
    assert server_config.model_names(None) == []
    for bad in (["a,,b"], ["a b"], [" a"]):
        with pytest.raises(UserError) as e:
            server_config.model_names(bad)
        assert "--model-id" in str(e.value) and "commas" in str(e.value)


def test_aliases_are_served_and_listed(model, template):  # noqa: F811
    with ServerProc(model, "--chat-template", template, "--no-kv-persist", "--kv-slots", "1",
                    "--model-id", "first,gpt-4o-mini", "--model-id", "llama3:8b") as s:
        for name in ("first", "gpt-4o-mini", "llama3:8b"):
            st, _, b = chat(s, name)
            assert st == 200 and b["model"] == "first", b  # answers carry the first name
        st, _, b = chat(s, "qwen3_moe")  # the directory's name is no longer one of them
        assert st == 404 and b["error"]["code"] == "model_not_found" and "first" in b["error"]["message"]
        client = openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0, timeout=30)
        assert [m.id for m in client.models.list().data] == ["first", "gpt-4o-mini", "llama3:8b"]
        assert client.models.retrieve("gpt-4o-mini").id == "gpt-4o-mini"
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("other")
        oc = ollama.Client(host=s.base, timeout=30)
        assert [m.model for m in oc.list().models] == ["first", "gpt-4o-mini", "llama3:8b"]
        assert oc.chat(model="gpt-4o-mini:latest", messages=HI, options={"num_predict": 2}).done


def test_any_model_name(model, template):  # noqa: F811
    with ServerProc(model, "--chat-template", template, "--no-kv-persist", "--kv-slots", "1",
                    "--any-model-name") as s:
        for name in ("gpt-4o", "whatever", "qwen3_moe"):
            st, _, b = chat(s, name)
            assert st == 200 and b["model"] == "qwen3_moe", b
        st, _, b = post_json(s.port, "/v1/messages", {"model": "claude-x", "messages": HI, "max_tokens": 2})
        assert st == 200
        st, _, b = s.request("GET", "/v1/models/anything")
        assert st == 200 and json.loads(b)["id"] == "anything"


def test_a_bad_name_is_refused_at_start(model):  # noqa: F811
    r = coli("serve", "--model", model, "--port", "0", "--model-id", "a b", timeout=60)
    assert r.returncode != 0 and "--model-id 'a b'" in r.stderr
