"""Structured output through `coli serve` on a tiny random-weight Qwen3-family model, driven by
the official `openai` client: chat.completions.parse with a Pydantic model, json_schema and
json_object response formats (streaming and not), the `grammar` extension on both endpoints,
and a 400 naming the keyword for a schema outside the subset."""
import json
from typing import Literal, Optional

import jsonschema
import openai
import pydantic
import pytest

from server_helpers import ServerProc, model, template  # noqa: F401

MID = "qwen3_moe"
ASK = [{"role": "user", "content": "Describe a person as JSON."}]


class Address(pydantic.BaseModel):
    city: str
    zip: Optional[str] = None


class Person(pydantic.BaseModel):
    name: str
    age: int
    tags: list[Literal["a", "b", "c"]] = pydantic.Field(max_length=3)
    home: Address


@pytest.fixture(scope="module")
def server(model, template):  # noqa: F811
    with ServerProc(model, "--chat-template", template, "--no-kv-persist") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.mark.parametrize("seed", range(4))
def test_parse_with_a_pydantic_model(client, seed):
    r = client.chat.completions.parse(model=MID, messages=ASK, response_format=Person, temperature=1.0, seed=seed)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(msg.parsed, Person) and Person.model_validate_json(msg.content) == msg.parsed


SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0},
                                           "words": {"type": "array", "items": {"type": "string", "maxLength": 6},
                                                     "minItems": 1, "maxItems": 2}},
          "required": ["ok", "n", "words"], "additionalProperties": False}
RF = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}


def test_json_schema_streaming_and_not(client):
    plain = client.chat.completions.create(model=MID, messages=ASK, response_format=RF, temperature=0)
    jsonschema.validate(json.loads(plain.choices[0].message.content), SCHEMA)
    chunks = client.chat.completions.create(model=MID, messages=ASK, response_format=RF, temperature=0, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == plain.choices[0].message.content


def test_json_object_mode(client):
    for seed in range(3):
        r = client.chat.completions.create(model=MID, messages=ASK, response_format={"type": "json_object"},
                                           temperature=1.0, seed=seed, max_tokens=60)
        assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_thinking_prompt_closes_the_block_before_the_answer(client):
    r = client.chat.completions.create(model=MID, messages=ASK, response_format=RF, temperature=0,
                                       extra_body={"enable_thinking": True})
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)


def test_grammar_extension_on_both_endpoints(client):
    g = 'root ::= ("yes" | "no") "!"'
    chat = client.chat.completions.create(model=MID, messages=ASK, extra_body={"grammar": g}, temperature=1.0, seed=1)
    assert chat.choices[0].message.content in ("yes!", "no!")
    comp = client.completions.create(model=MID, prompt="Answer:", extra_body={"grammar": g}, max_tokens=10)
    assert comp.choices[0].text in ("yes!", "no!")
    comp = client.completions.create(model=MID, prompt="Answer:", max_tokens=200,
                                     extra_body={"response_format": RF})
    jsonschema.validate(json.loads(comp.choices[0].text), SCHEMA)


@pytest.mark.parametrize("body,param,needle", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "number", "multipleOf": 3}}}}}},
     "response_format.json_schema.schema.properties.a", "'multipleOf'"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "string", "pattern": "(?=x)"}}}}, "response_format.json_schema.schema", "'pattern'"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "json_schema"),
    ({"grammar": ""}, "grammar", "non-empty"),
    ({"grammar": "root ::= x", "response_format": {"type": "json_object"}}, "grammar", "not both"),
])
def test_bad_structured_requests_are_400s_naming_the_problem(client, body, param, needle):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MID, messages=ASK, extra_body=body)
    assert e.value.status_code == 400 and e.value.body["param"] == param and needle in e.value.body["message"]


def test_bad_grammar_is_a_400_naming_the_byte(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MID, messages=ASK, extra_body={"grammar": "root ::= nothing"})
    assert "grammar: at byte 9: rule 'nothing' is used but never defined" in e.value.body["message"]
