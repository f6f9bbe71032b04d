"""Tool calling through `coli serve` with the official clients: a scripted engine
(fake_engine.py script) writes Qwen3 tool calls, the server renders the conversation through the
official Qwen3 template, parses the calls back and answers in the OpenAI and Anthropic shapes."""
import json

import anthropic
import openai
import pytest

from server_helpers import ServerProc, model, post_json  # noqa: F401
from test_server_worker import FAKE
from colibri.chat_template import render as ct

MID = "qwen3_moe"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time",
                                         "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALL = ["Let me check.\n", "<tool_call>", '\n{"name": "get_weather", ', '"arguments": {"city": "Par', 'is"}}\n',
        "</tool_call>"]
TWO_CALLS = CALL + ["\n<tool_call>\n", '{"name": "get_time", "arguments": {}}', "\n</tool_call>"]


@pytest.fixture(scope="module")
def qwen3_template(tmp_path_factory):
    import fetch_chat_templates
    d = fetch_chat_templates.ensure(["qwen3"], quiet=True)["qwen3"]
    path = tmp_path_factory.mktemp("tpl") / "qwen3.jinja"
    path.write_text(ct.load_chat_template(d), encoding="utf-8")
    return path


class Scripted:
    """The server on the scripted engine; `reply(pieces)` sets what the next turns generate."""

    def __init__(self, model, template, tmp):  # noqa: F811
        self.replies, self.log = tmp / "replies.json", tmp / "submits.jsonl"
        self.reply(["Hello."])
        env = {"COLI_ENGINE": str(FAKE), "COLI_FAKE_MODE": "script", "COLI_FAKE_REPLIES": str(self.replies),
               "COLI_FAKE_LOG": str(self.log)}
        self.proc = ServerProc(model, "--chat-template", str(template), "--no-kv-persist", env=env)

    def reply(self, pieces):
        self.replies.write_text(json.dumps([pieces]), encoding="utf-8")

    def last_submit(self):
        return json.loads(self.log.read_text(encoding="utf-8").splitlines()[-1])


@pytest.fixture(scope="module")
def scripted(model, qwen3_template, tmp_path_factory):  # noqa: F811
    s = Scripted(model, qwen3_template, tmp_path_factory.mktemp("script"))
    with s.proc:
        yield s


@pytest.fixture(scope="module")
def client(scripted):
    return openai.OpenAI(base_url=scripted.proc.base + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_call_comes_back_structured_and_out_of_the_content(scripted, client):
    scripted.reply(CALL)
    r = client.chat.completions.create(model=MID, messages=ASK, tools=[WEATHER])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    sent = scripted.last_submit()["payload"]
    assert "<tools>" in sent and '"name": "get_weather"' in sent  # the template's own tool preamble
    assert "grammar" not in scripted.last_submit()["opts"]  # auto: nothing forced


def test_streamed_calls_accumulate_in_the_official_client(scripted, client):
    scripted.reply(TWO_CALLS)
    with client.chat.completions.stream(model=MID, messages=ASK, tools=[WEATHER, TIME]) as stream:
        chunks = [e.chunk for e in stream if e.type == "chunk"]
        final = stream.get_final_completion()
    msg = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls" and msg.content == "Let me check."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == \
        [("get_weather", {"city": "Paris"}), ("get_time", {})]
    deltas = [c.choices[0].delta for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    first = deltas[0].tool_calls[0]  # name and id first, arguments after
    assert first.index == 0 and first.id and first.function.name == "get_weather" and first.function.arguments == ""
    fragments = [t.function.arguments for d in deltas for t in d.tool_calls if t.index == 0 and t.function.arguments]
    assert fragments == ['{"city": "Par', 'is"}']  # the arguments stream as the model writes them
    assert all("<tool_call>" not in (c.choices[0].delta.content or "") for c in chunks if c.choices)


def test_full_loop_call_result_answer(scripted, client):
    scripted.reply(CALL)
    messages = list(ASK)
    r = client.chat.completions.create(model=MID, messages=messages, tools=[WEATHER], tool_choice="auto")
    call = r.choices[0].message.tool_calls[0]
    messages.append(r.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"})
    scripted.reply(["It is ", "sunny in Paris."])
    r2 = client.chat.completions.create(model=MID, messages=messages, tools=[WEATHER])
    assert r2.choices[0].finish_reason == "stop" and r2.choices[0].message.content == "It is sunny in Paris."
    assert r2.choices[0].message.tool_calls is None
    sent = scripted.last_submit()["payload"]
    # the official template wrote the earlier call and the result its own way
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in sent
    assert "<|im_start|>user\n<tool_response>\nsunny, 21 C\n</tool_response><|im_end|>" in sent


def test_named_tool_choice_sends_a_grammar_for_that_call(scripted, client):
    scripted.reply(CALL[1:])
    r = client.chat.completions.create(model=MID, messages=ASK, tools=[TIME, WEATHER],
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    sub = scripted.last_submit()
    g = int(sub["opts"]["grammar"])
    grammar = sub["payload"].encode()[:g].decode()
    assert grammar.startswith("root ::= ") and '"get_weather' in grammar and "get_time" not in grammar


def test_required_allows_any_tool_and_none_parses_nothing(scripted, client):
    scripted.reply(CALL)
    client.chat.completions.create(model=MID, messages=ASK, tools=[TIME, WEATHER], tool_choice="required")
    sub = scripted.last_submit()
    grammar = sub["payload"].encode()[:int(sub["opts"]["grammar"])].decode()
    assert "get_time" in grammar and "get_weather" in grammar
    r = client.chat.completions.create(model=MID, messages=ASK, tools=[WEATHER], tool_choice="none")
    assert r.choices[0].message.tool_calls is None and "<tool_call>" in r.choices[0].message.content


def test_parallel_tool_calls_false_keeps_one_call(scripted, client):
    scripted.reply(TWO_CALLS)
    r = client.chat.completions.create(model=MID, messages=ASK, tools=[WEATHER, TIME], parallel_tool_calls=False)
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_weather"]


@pytest.mark.parametrize("body,param", [
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1]"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "string", "format": "email", "not": {}}}}}}], "tool_choice": "required"},
     "tools[0].function.parameters"),
    ({"messages": ASK + [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": "get_weather", "arguments": "{not json"}}]}]}, "messages[1].tool_calls[0].function"),
])
def test_bad_tool_requests_are_clear_400s(scripted, body, param):
    status, _, err = post_json(scripted.proc.port, "/v1/chat/completions", {"model": MID, "messages": ASK, **body})
    assert status == 400, err
    assert err["error"]["param"] == param and err["error"]["message"]


def test_anthropic_tool_use_round_trip(scripted):
    ac = anthropic.Anthropic(base_url=scripted.proc.base, api_key="unused", max_retries=0, timeout=30)
    tool = {"name": "get_weather", "description": "Current weather", "input_schema": WEATHER["function"]["parameters"]}
    scripted.reply(CALL)
    m = ac.messages.create(model=MID, max_tokens=64, tools=[tool], messages=ASK)
    assert m.stop_reason == "tool_use"
    text, use = m.content
    assert text.type == "text" and text.text == "Let me check."
    assert use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "Paris"}
    assert use.id.startswith("toolu_")
    scripted.reply(["Sunny."])
    follow = ASK + [{"role": "assistant", "content": m.content},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}]
    m2 = ac.messages.create(model=MID, max_tokens=64, tools=[tool], messages=follow)
    assert m2.stop_reason == "end_turn" and m2.content[0].text == "Sunny."
    sent = scripted.last_submit()["payload"]
    assert '"arguments": {"city": "Paris"}' in sent and "<tool_response>\nsunny\n</tool_response>" in sent
    scripted.reply(CALL)
    with ac.messages.stream(model=MID, max_tokens=64, tools=[tool], messages=ASK,
                            tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[-1].input == {"city": "Paris"}
    assert "input_json" in kinds  # the SDK's event for input_json_delta
    assert "grammar" in scripted.last_submit()["opts"]


def test_anthropic_bad_tool_choice(scripted):
    status, _, err = post_json(scripted.proc.port, "/v1/messages", {
        "model": MID, "max_tokens": 8, "messages": ASK, "tool_choice": {"type": "tool", "name": "x"},
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]})
    assert status == 400 and "x" in err["error"]["message"]


def test_family_without_tool_support_refuses_tools(model, qwen3_template, tmp_path):  # noqa: F811
    import shutil
    other = tmp_path / "mixtral"
    shutil.copytree(model, other)
    man = json.loads((other / "colibri.json").read_text())
    man["family"] = "mixtral"  # a family the registry knows no tool syntax for
    (other / "colibri.json").write_text(json.dumps(man))
    s = Scripted(other, qwen3_template, tmp_path)
    with s.proc:
        status, _, err = post_json(s.proc.port, "/v1/chat/completions", {"model": "mixtral", "messages": ASK,
                                                                         "tools": [WEATHER]})
        assert status == 400 and err["error"]["code"] == "tools_unsupported"
        assert "Mixtral" in err["error"]["message"]
        status, _, _ = post_json(s.proc.port, "/v1/chat/completions", {"model": "mixtral", "messages": ASK})
        assert status == 200


def test_template_without_tool_syntax_gets_the_family_syntax(model, tmp_path):  # noqa: F811
    s = Scripted(model, model.parent / "chatml.jinja", tmp_path)  # a plain ChatML template: no tools, no tool_calls
    with s.proc:
        c = openai.OpenAI(base_url=s.proc.base + "/v1", api_key="unused", max_retries=0, timeout=30)
        s.reply(CALL)
        r = c.chat.completions.create(model=MID, messages=ASK, tools=[WEATHER])
        call = r.choices[0].message.tool_calls[0]
        follow = ASK + [r.choices[0].message.model_dump(exclude_none=True),
                        {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
        s.reply(["Sunny."])
        assert c.chat.completions.create(model=MID, messages=follow, tools=[WEATHER]).choices[0].message.content == "Sunny."
        sent = s.last_submit()["payload"]
    assert sent.startswith("<|im_start|>system\n# Tools") and '"name":"get_weather"' in sent
    assert '<|im_start|>assistant\nLet me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' \
           '\n</tool_call><|im_end|>' in sent
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>" in sent


def test_gpt_oss_harmony_call(model, tmp_path):  # noqa: F811
    import shutil
    from pathlib import Path
    gpt = tmp_path / "gpt_oss"
    shutil.copytree(model, gpt)
    man = json.loads((gpt / "colibri.json").read_text())
    man["family"] = "gpt_oss"
    (gpt / "colibri.json").write_text(json.dumps(man))
    template = Path(__file__).parent / "data" / "chat_templates" / "openai-gpt-oss.jinja"
    s = Scripted(gpt, template, tmp_path)
    with s.proc:
        c = openai.OpenAI(base_url=s.proc.base + "/v1", api_key="unused", max_retries=0, timeout=30)
        s.reply(["<|channel|>analysis<|message|>Need weather.<|end|>", "<|start|>assistant to=functions.get_weather",
                 "<|channel|>commentary <|constrain|>json<|message|>", '{"city": ', '"Paris"}', "<|call|>"])
        r = c.chat.completions.create(model="gpt_oss", messages=ASK, tools=[WEATHER])
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls" and msg.content is None
        assert msg.model_extra["reasoning_content"] == "Need weather."
        assert [(t.function.name, json.loads(t.function.arguments)) for t in msg.tool_calls] == \
            [("get_weather", {"city": "Paris"})]
        follow = ASK + [msg.model_dump(exclude_none=True),
                        {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "sunny"}]
        s.reply(["<|channel|>final<|message|>Sunny.", "<|return|>"])
        r2 = c.chat.completions.create(model="gpt_oss", messages=follow, tools=[WEATHER],
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
        sub = s.last_submit()
        sent, g = sub["payload"], int(sub["opts"]["grammar"])
    assert r2.choices[0].message.content == "Sunny."
    assert sent.startswith('root ::= tc-call\n') and '"<|channel|>commentary to=functions.get_weather' in sent[:g]
    assert "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>" in sent
    assert "<|start|>functions.get_weather to=assistant" in sent  # the template's tool-result message
