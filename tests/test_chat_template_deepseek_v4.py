"""The DeepSeek-V4 chat templates (tests/data/chat_templates/deepseek-ai-DeepSeek-V4*.jinja, the base and
the Flash-0731 variant), kept verbatim and rendered byte-identical to jinja2 by colibri's renderer:
thinking off (the default) and on, via `thinking` or `enable_thinking`, reasoning_effort, reasoning of
earlier turns dropped unless tools are in play, tool definitions, DSML tool calls and tool results.
Checked at the chat-template layer: it needs no deepseek_v4 registry entry.
tests/test_tool_dsml_v4.py covers the tool calls."""
import hashlib
from pathlib import Path

import pytest

from colibri.chat_template import render as ct
from test_chat_template import (A, CONVERSATIONS, KWARG_SETS, S, SEARCH_TOOL, TOOL_CONVERSATIONS, U, WEATHER_TOOL,
                                assert_same)

DATA = Path(__file__).resolve().parent / "data" / "chat_templates"
SHA256 = {"deepseek-ai-DeepSeek-V4.jinja": "7bd4fbdf0c06cd7398ddb6913de6e4a5839b9d06569e74e5b2ec246b375ca9c9",
          "deepseek-ai-DeepSeek-V4-Flash-0731.jinja": "aec3d906bce80d43a9e6e89922c04e8e752c05f71f10040ba3f61b746ebacd6d"}
BOS = {"bos_token": "<｜begin▁of▁sentence｜>"}
T = lambda text: {"role": "tool", "content": text}  # noqa: E731
CALL = lambda name, args: {"type": "function", "function": {"name": name, "arguments": args}}  # noqa: E731
KWARGS = KWARG_SETS + [dict(thinking=True), dict(thinking=False), dict(add_generation_prompt=False, thinking=True),
                       dict(thinking=True, enable_thinking=False), dict(thinking=True, drop_thinking=False),
                       dict(thinking=True, reasoning_effort="high"), dict(thinking=True, reasoning_effort="max"),
                       dict(thinking=False, reasoning_effort="max"), dict(response_format={"type": "object"})]
V4_CONVERSATIONS = {
    "earlier_reasoning": [S("Be brief."), U("2+2?"), A("4", reasoning_content="Two and two."), U("3+3?")],
    "two_systems_and_developer": [S("One."), S("Two."), {"role": "developer", "content": "Dev."}, U("Hi")],
    "tool_loop_with_reasoning": [
        U("Weather in Lima and Quito?"),
        A("First Lima.", reasoning_content="Call it twice.", tool_calls=[CALL("get_weather", {"city": "Lima"})]),
        T("mild"),
        A("", reasoning_content="Now Quito.", tool_calls=[CALL("get_weather", {"city": "Quito", "days": 2})]),
        T("cool"), A("Mild and cool.", reasoning_content="Both known.")],
    "structured_arguments": [
        U("Book it"),
        A("", tool_calls=[CALL("book", {"seats": 2, "names": ["Ana", "Bo"], "meta": {"vip": True},
                                        "note": "multi\nline", "ok": False, "none": None})]),
        T("booked")],
    "no_arguments": [U("Time?"), A("", tool_calls=[CALL("now", {})]), T("noon")],
    "tool_results_then_user": [U("Weather?"), A("", tool_calls=[CALL("get_weather", {"city": "Oslo"})]),
                               T("cold"), T("windy"), U("Thanks, and tomorrow?")],
    "none_content": [U("Hi"), {"role": "assistant", "content": None}, U("again")],
}
ALL = {**CONVERSATIONS, **TOOL_CONVERSATIONS, **V4_CONVERSATIONS}
# jinja2 has no from_json filter (the template calls it only for arguments given as a string), and tool
# content must be a string to concatenate
ERRORS = {"tool_call_string_args", "tool_content_mapping"}


def source(name):
    return (DATA / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(SHA256))
def test_templates_are_kept_verbatim(name):
    assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == SHA256[name]
    readme = (DATA / "README.md").read_text()
    assert name in readme and SHA256[name] in readme


@pytest.mark.parametrize("name", sorted(SHA256))
@pytest.mark.parametrize("conv", sorted(ALL))
def test_template_matches_jinja2(name, conv):
    outcomes = [assert_same(source(name), ALL[conv], BOS, **kw)[0] for kw in KWARGS]
    outcomes += [assert_same(source(name), ALL[conv], BOS, tools=[WEATHER_TOOL, SEARCH_TOOL], **kw)[0]
                 for kw in KWARGS[:6]]
    assert set(outcomes) == ({"error"} if conv in ERRORS else {"ok"}), outcomes  # not vacuous


@pytest.mark.parametrize("name", sorted(SHA256))
def test_known_bytes_thinking_off_by_default_and_on(name):
    # spelled out from the template by hand, independent of jinja2
    head = "<｜begin▁of▁sentence｜>Be brief.<｜User｜>2+2?<｜Assistant｜></think>4<｜end▁of▁sentence｜><｜User｜>3+3?"
    messages = V4_CONVERSATIONS["earlier_reasoning"]
    assert ct.render_chat(source(name), messages, **BOS) == head + "<｜Assistant｜></think>"
    assert ct.render_chat(source(name), messages, **BOS, thinking=True) == head + "<｜Assistant｜><think>"
    assert ct.render_chat(source(name), messages, **BOS, enable_thinking=True) == head + "<｜Assistant｜><think>"


def test_flash_0731_has_its_own_high_effort_text():
    base, flash = source("deepseek-ai-DeepSeek-V4.jinja"), source("deepseek-ai-DeepSeek-V4-Flash-0731.jinja")
    kw = dict(thinking=True, reasoning_effort="high", **BOS)
    assert "Reasoning Effort: Absolute maximum" not in ct.render_chat(base, [U("Hi")], **kw)
    assert "Reasoning Effort: Absolute maximum" in ct.render_chat(flash, [U("Hi")], **kw)
    kw["reasoning_effort"] = "max"
    assert "Reasoning Effort: Beyond maximum" in ct.render_chat(flash, [U("Hi")], **kw)


def test_known_bytes_tool_call_and_result():
    messages = [U("Weather?"), A("", tool_calls=[CALL("get_weather", {"city": "Lima", "days": [1, 2]})]), T("mild")]
    text = ct.render_chat(source("deepseek-ai-DeepSeek-V4.jinja"), messages, add_generation_prompt=False, **BOS)
    assert text == ("<｜begin▁of▁sentence｜><｜User｜>Weather?<｜Assistant｜></think>\n\n<｜DSML｜tool_calls>\n"
                    "<｜DSML｜invoke name=\"get_weather\">\n"
                    "<｜DSML｜parameter name=\"city\" string=\"true\">Lima</｜DSML｜parameter>\n"
                    "<｜DSML｜parameter name=\"days\" string=\"false\">[1, 2]</｜DSML｜parameter>\n"
                    "</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>mild</tool_result>")
