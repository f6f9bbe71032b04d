"""MiniMax-M2 tool calls (the `minimax` format): the official template's own call text, rendered by
jinja2, parses back into the same calls whole and streamed; values are typed by the tool's schema;
text that is no call stays visible; the forced-call grammar (tool_choice required / named) accepts
the template's calls and rejects unknown tools and arguments outside the schema."""
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

SOURCE = (TEMPLATES / "MiniMax-M2.jinja").read_text(encoding="utf-8")
OPEN, END = "]~b]ai\n", "[e~["
M = formats.MINIMAX
MULTILINE = [{"name": "book_table", "arguments": {"restaurant": "Line one\nline \"two\" & <b", "guests": 2}}]
NO_ARGS = [{"name": "now", "arguments": {}}]
CASES = {  # case -> (calls, content)
    "two_calls": (DATA["calls"], DATA["content"]),
    "one_call": (DATA["single_call"], ""),
    "multiline_string": (MULTILINE, "Booking."),
    "no_arguments": (NO_ARGS, ""),
}


def generated(calls, content, reasoning=None):
    """The assistant turn as the official template writes it (jinja2), i.e. as the model generates it after
    the generation prompt's <think>: the reasoning block cut off where the prompt ends."""
    chat = _conversation(calls, content)
    if reasoning is not None:
        chat[1]["reasoning_content"] = reasoning
    text = reference_render(SOURCE, chat, tools=DATA["tools"], add_generation_prompt=False)
    turn = text[text.rindex(OPEN) + len(OPEN):]
    turn = turn[:turn.index(END)]
    return turn.split("</think>", 1)[1] if reasoning is not None else turn


def _split_in_pieces(text, seed):
    rng, f, pieces, i = random.Random(seed), ToolCallFilter(M, SCHEMAS), [], 0
    while i < len(text):
        n = rng.randint(1, 7)
        pieces += f.feed(text[i:i + n])
        i += n
    pieces += f.finish()
    return "".join(p[1] for p in pieces if p[0] == "content"), [p[1] for p in pieces if p[0] == "tool_call"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_parses_the_templates_calls_back_whole_and_in_random_chunks(case):
    calls, content = CASES[case]
    text = generated(calls, content)
    assert "<minimax:tool_call>\n<invoke name=" in text  # not vacuous: the template wrote the call
    got_content, got_calls = M.split(text, SCHEMAS)
    assert got_calls == calls and got_content.strip() == content
    for seed in range(20):
        shown, streamed = _split_in_pieces(text, seed)
        assert streamed == calls and shown.strip() == content and "<minimax" not in shown and "<invoke" not in shown


def test_render_writes_what_the_template_writes():
    block = generated(DATA["calls"], "")
    assert block.strip() == formats.MINIMAX_BEGIN + "\n" + "".join(formats.minimax_invoke(c) for c in DATA["calls"]) \
        + formats.MINIMAX_END


def test_values_follow_the_schema():
    text = '<minimax:tool_call>\n<invoke name="book_table">\n<parameter name="code">123</parameter>\n' \
           '<parameter name="guests">4</parameter>\n<parameter name="terrace">false</parameter>\n' \
           '<parameter name="restaurant">true</parameter>\n</invoke>\n</minimax:tool_call>'
    _, calls = M.split(text, SCHEMAS)
    assert calls == [{"name": "book_table", "arguments": {"code": "123", "guests": 4, "terrace": False,
                                                          "restaurant": "true"}}]
    _, calls = M.split(text, {})  # without the schema a value reads as JSON when it parses
    assert calls[0]["arguments"] == {"code": 123, "guests": 4, "terrace": False, "restaurant": True}


@pytest.mark.parametrize("text", [
    '<minimax:tool_call>\n<invoke name="get_weather">\nstray<parameter name="city">Oslo</parameter>\n</invoke>\n'
    '</minimax:tool_call>',
    '<minimax:tool_call>\nno invoke here\n</minimax:tool_call>',
    '<minimax:tool_call>\n<invoke name="">\n</invoke>\n</minimax:tool_call>',
    '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Oslo</parameter>\n'
    '</minimax:tool_call>',
    "I write <minimax:tool_call> tags in prose.",
])
def test_a_region_that_is_no_call_stays_visible(text):
    assert M.split(text, SCHEMAS) == (text, [])


def test_an_unclosed_block_at_the_end_is_judged_as_it_is():
    text = '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Oslo</parameter>\n</invoke>\n'
    assert M.split(text, SCHEMAS) == ("", [{"name": "get_weather", "arguments": {"city": "Oslo"}}])


def test_reasoning_before_the_call_is_the_reasoning_splitters_not_the_parsers():
    text = generated(DATA["single_call"], "", reasoning="Check the weather.")
    assert text.startswith("\n\n\n<minimax:tool_call>")  # what follows </think> when the turn only calls
    assert M.split(text, SCHEMAS) == ("", DATA["single_call"])


@pytest.fixture(scope="module")
def engine():
    build("build/colibri")


def _spec(choice="required", name=None, parallel=True, schemas=SCHEMAS):
    return ToolSpec(tools=DATA["tools"], schemas=schemas, choice=choice, name=name, parallel=parallel, fmt=M)


def test_forced_grammar_accepts_the_templates_calls(engine, tmp_path):
    two, one = generated(DATA["calls"], ""), generated(DATA["single_call"], "")
    multi = generated(MULTILINE, "")
    required = call_grammar(_spec(), SOURCE)
    texts = [two, one, one.replace("get_weather", "get_wether"), multi]
    got = grammar_check(required, texts, tmp_path)
    assert got[:2] == ["complete"] * 2 and got[2].startswith("reject"), got
    assert got[3].startswith("reject")  # a raw string value cannot hold '<': the grammar keeps it parseable
    named = call_grammar(_spec("function", "get_weather", parallel=False), SOURCE)
    got = grammar_check(named, [one, two], tmp_path)
    assert got[0] == "complete" and got[1] != "complete"
    # the prompt opened <think>: the forced call closes it first, as the template writes a calling turn
    after_think = "</think>" + generated(DATA["single_call"], "", reasoning="Check.")
    assert grammar_check(call_grammar(_spec(), SOURCE, in_reasoning=True), [after_think, one], tmp_path)[0] == \
        "complete"
    assert M.split(one, SCHEMAS)[1] == DATA["single_call"]


def test_forced_grammar_rejects_values_outside_the_schema(engine, tmp_path):
    g = call_grammar(_spec("function", "book_table", parallel=False), SOURCE)

    def call(**params):
        body = "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in params.items())
        return f'<minimax:tool_call>\n<invoke name="book_table">\n{body}</invoke>\n</minimax:tool_call>'
    texts = [call(restaurant="Café Öl", guests=4, terrace="true"), call(restaurant="X", guests="four"),
             call(restaurant="X", guests=4, terrace="yes"), call(guests=4), call(restaurant="a<b", guests=1)]
    got = grammar_check(g, texts, tmp_path)
    assert got[0] == "complete" and all(r.startswith("reject") for r in got[1:]), got


def test_forced_grammar_for_a_tool_without_arguments(engine, tmp_path):
    schemas = {"now": {"type": "object", "properties": {}}}
    g = call_grammar(_spec("function", "now", parallel=False, schemas=schemas), SOURCE)
    got = grammar_check(g, [generated(NO_ARGS, ""), generated(DATA["single_call"], "")], tmp_path)
    assert got[0] == "complete" and got[1].startswith("reject"), got
