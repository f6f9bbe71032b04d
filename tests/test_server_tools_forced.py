"""Forced tool calls on the real engine: a tiny random-weight Qwen3 model with the real Qwen3
tokenizer (152k vocabulary, <tool_call> an added token) and its official template, tool_choice
naming the function, driven by the official `openai` client. The grammar (the family's
<tool_call> wrapper around the arguments' JSON schema) makes even random weights write a call
whose arguments validate against the tool's schema; then the loop goes on with the result."""
import json
import shutil
import subprocess
import sys

import jsonschema
import openai
import pytest

from server_helpers import COLI, ServerProc

MID = "qwen3"
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "days", "unit"],
          "properties": {"city": {"type": "string", "minLength": 1},
                         "days": {"type": "integer", "minimum": 1},
                         "unit": {"enum": ["celsius", "fahrenheit"]},
                         "hourly": {"type": "boolean"},
                         "tags": {"type": "array", "items": {"type": "string"}}}}
FORECAST = {"type": "function", "function": {"name": "forecast", "description": "Weather forecast",
                                             "parameters": SCHEMA}}
OTHER = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
NAMED = {"type": "function", "function": {"name": "forecast"}}
ASK = [{"role": "user", "content": "Forecast for Bern?"}]


def build_qwen3(hf):
    """A 2-layer random Qwen3 (dense) around the real Qwen3 tokenizer and its chat template."""
    import torch
    import transformers
    import fetch_tokenizers
    tok = fetch_tokenizers.fetch("qwen3")
    cfg = transformers.Qwen3Config(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   max_position_embeddings=4096, tie_word_embeddings=False, eos_token_id=151645)
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(hf)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{tok}/{name}", hf / name)
    (hf / "generation_config.json").write_text(json.dumps({"eos_token_id": 151645, "do_sample": False}))


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3")
    build_qwen3(root / "hf")
    subprocess.run([sys.executable, str(COLI), "convert", str(root / "hf"), str(root / MID), "--experts", "bf16",
                    "--dense", "bf16"], check=True, capture_output=True, timeout=300)
    return root / MID


@pytest.fixture(scope="module", params=["official", "none"])
def server(request, qwen3_dir, tmp_path_factory):
    """The checkpoint's official Qwen3 template, and none at all (the generic ChatML fallback)."""
    model = qwen3_dir
    if request.param == "none":
        model = tmp_path_factory.mktemp("plain") / MID
        shutil.copytree(qwen3_dir, model)
        cfg = json.loads((model / "tokenizer_config.json").read_text(encoding="utf-8"))
        del cfg["chat_template"]
        (model / "tokenizer_config.json").write_text(json.dumps(cfg), encoding="utf-8")
    with ServerProc(model, "--no-kv-persist") as s:
        assert s.health()["chat_template"] == ("model" if request.param == "official" else "chatml-fallback")
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=120)


def _valid_call(choice, name="forecast", schema=SCHEMA):
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == name
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, schema)
    return call, args


@pytest.mark.parametrize("seed", range(3))
def test_named_call_validates_on_random_weights(client, seed):
    r = client.chat.completions.create(model=MID, messages=ASK, tools=[OTHER, FORECAST], tool_choice=NAMED,
                                       temperature=1.0, seed=seed, max_tokens=150)
    _valid_call(r.choices[0])


def test_required_streamed_call_validates(client):
    with client.chat.completions.stream(model=MID, messages=ASK, tools=[FORECAST], tool_choice="required",
                                        temperature=1.0, seed=11, max_tokens=150) as stream:
        final = stream.get_final_completion()
    _valid_call(final.choices[0])


def test_forced_call_then_result_then_answer(client):
    r = client.chat.completions.create(model=MID, messages=ASK, tools=[FORECAST], tool_choice=NAMED, temperature=0,
                                       max_tokens=150)
    call, args = _valid_call(r.choices[0])
    messages = ASK + [r.choices[0].message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"high": 21, **args})}]
    answer = client.chat.completions.create(model=MID, messages=messages, tools=[FORECAST], temperature=0,
                                            max_tokens=8)
    assert answer.choices[0].finish_reason in ("length", "stop", "tool_calls")
    assert answer.usage.prompt_tokens > r.usage.prompt_tokens  # the call and its result were in the prompt


def test_pydantic_tool_parsed_by_the_official_client(client):
    from typing import Literal

    from pydantic import BaseModel, Field

    class Forecast(BaseModel):
        city: str = Field(min_length=1)
        days: int
        unit: Literal["celsius", "fahrenheit"]

    tool = openai.pydantic_function_tool(Forecast)  # a strict tool; parse() turns its arguments into Forecast
    r = client.chat.completions.parse(model=MID, messages=ASK, tools=[tool], temperature=1.0, seed=5, max_tokens=150,
                                      tool_choice={"type": "function", "function": {"name": "Forecast"}})
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls" and isinstance(call.function.parsed_arguments, Forecast)


def test_anthropic_forced_tool_use_validates(server):
    import anthropic
    ac = anthropic.Anthropic(base_url=server.base, api_key="unused", max_retries=0, timeout=120)
    m = ac.messages.create(model=MID, max_tokens=150, messages=ASK,
                           tools=[{"name": "forecast", "description": "Weather forecast", "input_schema": SCHEMA}],
                           tool_choice={"type": "tool", "name": "forecast"})
    assert m.stop_reason == "tool_use"
    use = [b for b in m.content if b.type == "tool_use"]
    assert len(use) == 1 and use[0].name == "forecast"
    jsonschema.validate(use[0].input, SCHEMA)
