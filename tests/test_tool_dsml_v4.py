"""DeepSeek-V4 tool calls: the DSML <｜DSML｜tool_calls> block of its chat templates, rendered by jinja2, parses
back through the deepseek format into the same calls whole and streamed, typed by each parameter's
string="true|false"; malformed blocks stay visible; the forced-call grammar built from a V4 template
spells the V4 block and accepts the template's own calls. Checked at the tools layer with the deepseek
format itself, so it needs no deepseek_v4 registry entry (the family names "deepseek" as its tools)."""
import random

import pytest

from colibri.toolcall import formats
from colibri.toolcall.forced import call_grammar
from colibri.toolcall.request import ToolSpec
from colibri.toolcall.stream import ToolCallFilter
from engine_binaries import build
from grammar_schemas import grammar_check
from test_chat_template import reference_render
from test_tool_parsers import DATA, SCHEMAS, TEMPLATES, _conversation

NAMES = ("deepseek-ai-DeepSeek-V4.jinja", "deepseek-ai-DeepSeek-V4-Flash-0731.jinja")
BOS = {"bos_token": "<｜begin▁of▁sentence｜>"}
OPEN, END = "<｜Assistant｜>", "<｜end▁of▁sentence｜>"
F, D = formats.DEEPSEEK, formats.DSML
NO_ARGS = [{"name": "now", "arguments": {}}]
MULTILINE = [{"name": "book_table", "arguments": {"restaurant": "Line one\nline \"two\" & co", "guests": 2}}]
CASES = {"two_calls": (DATA["calls"], DATA["content"]), "one_call": (DATA["single_call"], ""),
         "no_arguments": (NO_ARGS, ""), "multiline_string": (MULTILINE, "Booking.")}


def source(name):
    return (TEMPLATES / name).read_text(encoding="utf-8")


def generated(name, calls, content, thinking=False):
    """The assistant turn as the template writes it, from where the generation prompt ends (after
    </think>, or after <think> when thinking)."""
    chat = _conversation(calls, content)
    if thinking:
        chat[1]["reasoning_content"] = "Check first."
    text = reference_render(source(name), chat, tools=DATA["tools"], add_generation_prompt=False, thinking=thinking,
                            **BOS)
    turn = text[text.rindex(OPEN) + len(OPEN):]
    turn = turn[:turn.index(END)]
    return turn[len("<think>"):] if thinking else turn[len("</think>"):]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_parses_the_templates_calls_back_whole_and_in_random_chunks(name, case):
    calls, content = CASES[case]
    text = generated(name, calls, content)
    assert formats.DSML_V4_BEGIN in text and formats.DSML_BEGIN not in text  # not vacuous: the V4 block
    got_content, got_calls = F.split(text, SCHEMAS)
    assert got_calls == calls and got_content.strip() == content
    for seed in range(10):
        rng, f, pieces, i = random.Random(seed), ToolCallFilter(F, SCHEMAS), [], 0
        while i < len(text):
            n = rng.randint(1, 7)
            pieces += f.feed(text[i:i + n])
            i += n
        pieces += f.finish()
        shown = "".join(p[1] for p in pieces if p[0] == "content")
        assert [p[1] for p in pieces if p[0] == "tool_call"] == calls
        assert shown.strip() == content and D not in shown


def test_the_v32_block_still_parses():
    text = f'<{D}function_calls>\n<{D}invoke name="get_weather">\n<{D}parameter name="city" string="true">Oslo' \
           f'</{D}parameter>\n</{D}invoke>\n</{D}function_calls>'
    assert F.split(text, SCHEMAS) == ("", [{"name": "get_weather", "arguments": {"city": "Oslo"}}])


@pytest.mark.parametrize("text", [
    f'<{D}tool_calls>\n<{D}invoke name="get_weather">\n<{D}parameter name="guests" string="false">four'
    f'</{D}parameter>\n</{D}invoke>\n</{D}tool_calls>',                      # string="false" but no JSON
    f'<{D}tool_calls>\nno invoke\n</{D}tool_calls>',
    f'<{D}tool_calls>\n<{D}invoke name="get_weather">\nstray\n</{D}invoke>\n</{D}tool_calls>',
    f'<{D}tool_calls>\n<{D}invoke name="get_weather">\n</{D}invoke>\n</{D}function_calls>',  # V3.2's end
    f"I mention <{D}tool_calls> in prose.",
])
def test_a_block_that_is_no_call_stays_visible(text):
    assert F.split(text, SCHEMAS) == (text, [])


@pytest.fixture(scope="module")
def engine():
    build("build/colibri")


def _spec(choice="required", name=None, parallel=True, schemas=SCHEMAS):
    return ToolSpec(tools=DATA["tools"], schemas=schemas, choice=choice, name=name, parallel=parallel, fmt=F)


@pytest.mark.parametrize("name", NAMES)
def test_forced_grammar_accepts_the_templates_calls(engine, tmp_path, name):
    two, one = generated(name, DATA["calls"], ""), generated(name, DATA["single_call"], "")
    v32 = one.replace("tool_calls>", "function_calls>")
    got = grammar_check(call_grammar(_spec(), source(name)), [two, one, v32], tmp_path)
    assert got[:2] == ["complete", "complete"] and got[2].startswith("reject"), got
    got = grammar_check(call_grammar(_spec("function", "get_weather", parallel=False), source(name)), [one, two],
                        tmp_path)
    assert got[0] == "complete" and got[1] != "complete", got
    thinking = "</think>" + generated(name, DATA["single_call"], "", thinking=True).split("</think>", 1)[1]
    assert grammar_check(call_grammar(_spec(), source(name), in_reasoning=True), [thinking], tmp_path) == ["complete"]
    schemas = {"now": {"type": "object", "properties": {}}}
    g = call_grammar(_spec("function", "now", parallel=False, schemas=schemas), source(name))
    assert grammar_check(g, [generated(name, NO_ARGS, "")], tmp_path) == ["complete"]


def test_forced_grammar_rejects_values_outside_the_schema(engine, tmp_path):
    g = call_grammar(_spec("function", "book_table", parallel=False), source(NAMES[0]))

    def call(*params):
        body = "".join(f'<{D}parameter name="{k}" string="{s}">{v}</{D}parameter>\n' for k, s, v in params)
        return f'\n\n<{D}tool_calls>\n<{D}invoke name="book_table">\n{body}</{D}invoke>\n</{D}tool_calls>'
    texts = [call(("restaurant", "true", "Café Öl"), ("guests", "false", "4")),
             call(("restaurant", "true", "X"), ("guests", "true", "4")),
             call(("restaurant", "true", "X"), ("guests", "false", "four")), call(("guests", "false", "4"))]
    got = grammar_check(g, texts, tmp_path)
    assert got[0] == "complete" and all(r.startswith("reject") for r in got[1:]), got
