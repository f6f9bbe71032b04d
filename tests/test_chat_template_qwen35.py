"""The official Qwen3.5/3.6 chat template (tests/data/chat_templates/Qwen3.5.jinja), kept verbatim
and rendered byte-identical to jinja2 by colibri's renderer: system / user / assistant turns with
and without reasoning, tool loops, content parts, thinking on and off, with and without the
generation prompt. tests/test_chat_template_reasoning.py covers the server's reasoning split."""
import hashlib
from pathlib import Path

import pytest

from colibri.chat_template import render as ct
from test_chat_template import (A, CONVERSATIONS, KWARG_SETS, S, SEARCH_TOOL, TOOL_CONVERSATIONS, U, WEATHER_TOOL,
                                assert_same)

DATA = Path(__file__).resolve().parent / "data" / "chat_templates"
TEMPLATE = DATA / "Qwen3.5.jinja"
TEMPLATE_SHA256 = "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715"
T = lambda text: {"role": "tool", "content": text}  # noqa: E731
CALL = lambda name, args: {"type": "function", "function": {"name": name, "arguments": args}}  # noqa: E731
PARTS = lambda *parts: {"role": "user", "content": list(parts)}  # noqa: E731
TEXT = lambda text: {"type": "text", "text": text}  # noqa: E731

KWARGS = KWARG_SETS + [dict(add_generation_prompt=False, enable_thinking=False),
                       dict(add_generation_prompt=False, enable_thinking=True)]
QWEN35_CONVERSATIONS = {
    "earlier_reasoning_dropped": [S("Be brief."), U("2+2?"), A("4", reasoning_content="Two and two."),
                                  U("3+3?"), A("<think>\nThree and three.\n</think>\n\n6"), U("And 4+4?")],
    "reasoning_kept_in_tool_loop": [
        U("Weather in Lima and Quito?"),
        A("First Lima.", reasoning_content="Call it twice.", tool_calls=[CALL("get_weather", {"city": "Lima"})]),
        T("mild"),
        A("", reasoning_content="Now Quito.", tool_calls=[CALL("get_weather", {"city": "Quito"})]),
        T("cool"), A("Mild and cool.", reasoning_content="Both known.")],
    "reasoning_padded": [U("q"), A("\n\nanswer\n", reasoning_content="\n  padded  \n"), U("again")],
    "think_inline_no_newlines": [U("q"), A("<think>why</think>because"), U("ok")],
    "close_tag_only": [U("q"), A("reasoned</think>\n\nanswer")],
    "structured_arguments": [
        U("Book it"),
        A("", tool_calls=[CALL("book", {"seats": 2, "names": ["Ana", "Bo"], "meta": {"vip": True},
                                        "note": "multi\nline", "ok": False, "none": None})]),
        T("booked")],
    "tool_call_no_function_wrapper": [U("Weather?"), A("", tool_calls=[{"name": "get_weather",
                                                                        "arguments": {"city": "Oslo"}}]),
                                      T("cold")],
    "tool_results_then_user": [U("Weather?"), A("", tool_calls=[CALL("get_weather", {"city": "Oslo"})]),
                               T("cold"), T("windy"), U("Thanks, and tomorrow?")],
    "text_parts": [PARTS(TEXT("Look at "), TEXT("this.")), A("Seen."), U("ok")],
    "image_and_video_parts": [PARTS(TEXT("Compare "), {"type": "image"}, {"type": "image_url", "image_url": "x"},
                                    {"type": "video"}, TEXT(" please")), A("Done."),
                              PARTS({"type": "image"}, TEXT("and this"))],
    "system_parts": [{"role": "system", "content": [TEXT("Be "), TEXT("brief.")]}, U("Hi")],
    "system_with_image": [{"role": "system", "content": [{"type": "image"}]}, U("Hi")],
    "unknown_part": [PARTS({"type": "audio"})],
    "content_number": [U(5)],
    "content_none_assistant": [U("q"), {"role": "assistant", "content": None,
                                        "tool_calls": [CALL("search", {"query": "x"})]}, T("y")],
    "system_not_first": [U("Hi"), S("late"), U("again")],
    "no_user_query": [S("alone")],
    "only_tool_responses": [U("<tool_response>\nx\n</tool_response>")],
    "unknown_role": [U("Hi"), {"role": "critic", "content": "no"}],
    "empty": [],
}
ALL = {**CONVERSATIONS, **TOOL_CONVERSATIONS, **QWEN35_CONVERSATIONS}
# the template's raise_exception cases, a mapping as tool content, and arguments given as a JSON
# string (the template iterates them with |items, so they must arrive as a mapping)
ERRORS = {"system_with_image", "unknown_part", "content_number", "system_not_first", "no_user_query",
          "only_tool_responses", "unknown_role", "empty", "tool_content_mapping", "tool_call_string_args"}


def source():
    return TEMPLATE.read_text(encoding="utf-8")


def test_official_template_is_kept_verbatim():
    assert hashlib.sha256(TEMPLATE.read_bytes()).hexdigest() == TEMPLATE_SHA256
    readme = (DATA / "README.md").read_text()
    assert "Qwen3.5.jinja" in readme and TEMPLATE_SHA256 in readme


@pytest.mark.parametrize("conv", sorted(ALL))
def test_official_template_matches_jinja2(conv):
    outcomes = [assert_same(source(), ALL[conv], **kw)[0] for kw in KWARGS]
    outcomes += [assert_same(source(), ALL[conv], tools=[WEATHER_TOOL, SEARCH_TOOL], **kw)[0] for kw in KWARGS[:3]]
    outcomes += [assert_same(source(), ALL[conv], add_vision_id=True)[0]]
    # not vacuous: the ERRORS cases fail in both, everything else renders
    assert set(outcomes) == ({"error"} if conv in ERRORS else {"ok"}), outcomes


def test_known_bytes_thinking_on_and_off():
    # spelled out from the template by hand, independent of jinja2
    messages = [S("Be brief."), U("2+2?"), A("4", reasoning_content="Two and two."), U("3+3?")]
    head = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n")
    assert ct.render_chat(source(), messages, add_generation_prompt=True) == head + "<think>\n"
    assert ct.render_chat(source(), messages, add_generation_prompt=True, enable_thinking=True) == head + "<think>\n"
    assert ct.render_chat(source(), messages, add_generation_prompt=True,
                          enable_thinking=False) == head + "<think>\n\n</think>\n\n"
    last = [U("2+2?"), A("4", reasoning_content="Two and two.")]
    assert ct.render_chat(source(), last, add_generation_prompt=False) == (
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\nTwo and two.\n</think>\n\n4<|im_end|>\n")


def test_known_bytes_tool_call():
    messages = [U("Weather?"), A("", tool_calls=[CALL("get_weather", {"city": "Lima", "days": [1, 2]})]), T("mild")]
    assert ct.render_chat(source(), messages, add_generation_prompt=False) == (
        "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nLima\n</parameter>\n"
        "<parameter=days>\n[1, 2]\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nmild\n</tool_response><|im_end|>\n")


@pytest.mark.parametrize("conv,message", [("no_user_query", "No user query found in messages."),
                                          ("system_not_first", "System message must be at the beginning."),
                                          ("system_with_image", "System message cannot contain images.")])
def test_template_errors_name_the_cause(conv, message):
    with pytest.raises(ct.TemplateError, match=message):
        ct.render_chat(source(), ALL[conv])
