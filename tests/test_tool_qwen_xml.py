"""Qwen3.5 / Qwen3.6 tool calls (the `qwen_xml` format): the official template's own call text,
rendered by jinja2 and kept in tests/data/tool_calls/qwen3_5.json, parses back into the same
calls whole and streamed; values are typed by the tool's schema; the forced-call grammar
accepts the template's calls and rejects arguments outside the schema."""
import json
import random
import re
from pathlib import Path

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from colibri.toolcall import formats
from colibri.toolcall.forced import call_grammar
from colibri.toolcall.request import ToolSpec
from colibri.toolcall.stream import ToolCallFilter
from engine_binaries import build
from grammar_schemas import grammar_check
from test_tool_parsers import DATA, SCHEMAS, TEMPLATES, _conversation

CASES = json.loads((Path(__file__).parent / "data" / "tool_calls" / "qwen3_5.json")
                   .read_text(encoding="utf-8"))["cases"]
SOURCE = (TEMPLATES / "Qwen3.5.jinja").read_text(encoding="utf-8")
OPEN, END = "<|im_start|>assistant\n", "<|im_end|>"
Q = formats.QWEN_XML


def jinja2_render(messages):
    """The template through jinja2 set up as transformers' apply_chat_template sets it up."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: \
        json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(msg):
        raise ValueError(msg)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(SOURCE).render(messages=messages, tools=DATA["tools"], add_generation_prompt=False)


def _generated(case):
    """The turn as the model generates it: the empty thinking block the template writes removed."""
    return re.sub(r"^\s*<think>.*?</think>\s*", "", CASES[case]["assistant"], flags=re.S)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_stored_text_is_what_jinja2_renders(case):
    c = CASES[case]
    text = jinja2_render(_conversation(c["calls"], c["content"]))
    turn = text[text.rindex(OPEN) + len(OPEN):]
    assert turn[:turn.index(END)] == c["assistant"] and "<function=" in c["assistant"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_parses_back_whole_and_in_random_chunks(case):
    c, text = CASES[case], _generated(case)
    assert Q.split(text, SCHEMAS) == (c["content"], c["calls"])
    rng = random.Random(case)
    for _ in range(20):
        f, pieces, i = ToolCallFilter(Q, SCHEMAS), [], 0
        while i < len(text):
            n = rng.randint(1, 7)
            pieces += f.feed(text[i:i + n])
            i += n
        pieces += f.finish()
        shown = "".join(p[1] for p in pieces if p[0] == "content")
        assert [p[1] for p in pieces if p[0] == "tool_call"] == c["calls"] and shown == c["content"]


def test_values_follow_the_schema():
    text = "<tool_call>\n<function=book_table>\n<parameter=code>\n123\n</parameter>\n<parameter=guests>\n4\n" \
           "</parameter>\n<parameter=terrace>\nFalse\n</parameter>\n<parameter=restaurant>\ntrue\n</parameter>\n" \
           "</function>\n</tool_call>"
    _, calls = Q.split(text, SCHEMAS)
    assert calls == [{"name": "book_table", "arguments": {"code": "123", "guests": 4, "terrace": False,
                                                          "restaurant": "true"}}]
    _, calls = Q.split(text, {})  # without the schema a value reads as JSON when it parses
    assert calls[0]["arguments"] == {"code": 123, "guests": 4, "terrace": "False", "restaurant": True}


def test_a_hermes_json_call_is_read_too():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Bern"}}\n</tool_call>'
    assert Q.split(text, SCHEMAS) == ("", [{"name": "get_weather", "arguments": {"city": "Bern"}}])


@pytest.mark.parametrize("text", [
    "<tool_call>\n<function=get_weather>\nstray text\n</function>\n</tool_call>",
    "<tool_call>\nno function here\n</tool_call>",
    "I write <tool_call> tags in prose.",
])
def test_a_region_that_is_no_call_stays_visible(text):
    assert Q.split(text, SCHEMAS) == (text, [])


@pytest.fixture(scope="module")
def engine():
    build("build/colibri")


def _spec(choice="required", name=None, parallel=True, schemas=SCHEMAS):
    return ToolSpec(tools=DATA["tools"], schemas=schemas, choice=choice, name=name, parallel=parallel, fmt=Q)


def test_forced_grammar_accepts_the_templates_calls(engine, tmp_path):
    two, one, multi = _generated("two_calls"), _generated("one_call"), _generated("multiline_string")
    two_calls = two[two.index("<tool_call>"):]  # the content before is not part of a forced call
    required = call_grammar(_spec(), SOURCE)
    got = grammar_check(required, [two_calls, one, multi[multi.index("<tool_call>"):],
                                   one.replace("get_weather", "get_wether")], tmp_path)
    assert got[:3] == ["complete"] * 3 and got[3].startswith("reject"), got
    named = call_grammar(_spec("function", "get_weather", parallel=False), SOURCE)
    got = grammar_check(named, [one, two_calls], tmp_path)
    assert got[0] == "complete" and got[1] != "complete"
    assert formats.QWEN_XML.split(one, SCHEMAS)[1] == DATA["single_call"]


def test_forced_grammar_rejects_values_outside_the_schema(engine, tmp_path):
    g = call_grammar(_spec("function", "book_table", parallel=False), SOURCE)

    def call(**params):
        body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
        return f"<tool_call>\n<function=book_table>\n{body}</function>\n</tool_call>"
    good = call(restaurant="Café Öl", guests=4, terrace="true")
    texts = [good, call(restaurant="X", guests=4, terrace="True"), call(restaurant="X", guests="four"),
             call(restaurant="X", guests=4, terrace="yes"), call(guests=4), call(restaurant="a<b", guests=1)]
    got = grammar_check(g, texts, tmp_path)
    assert got[:2] == ["complete", "complete"] and all(r.startswith("reject") for r in got[2:]), got


def test_forced_grammar_keeps_raw_string_bounds_and_enums(engine, tmp_path):
    schema = {"type": "object", "properties": {"code": {"type": "string", "minLength": 2, "maxLength": 3},
                                               "unit": {"type": "string", "enum": ["c", "f"]}},
              "required": ["code", "unit"]}
    g = call_grammar(_spec("function", "f", parallel=False, schemas={"f": schema}), "")

    def call(code, unit):
        return f"<tool_call>\n<function=f>\n<parameter=code>\n{code}\n</parameter>\n" \
               f"<parameter=unit>\n{unit}\n</parameter>\n</function>\n</tool_call>"
    got = grammar_check(g, [call("ab", "c"), call("abcd", "c"), call("a", "f"), call("ab", "k")], tmp_path)
    assert got[0] == "complete" and all(r.startswith("reject") for r in got[1:]), got
