"""The official MiniMax-M2 chat template (tests/data/chat_templates/MiniMax-M2.jinja), kept verbatim and
rendered byte-identical to jinja2 by colibri's renderer: system / user / assistant turns, reasoning kept
only after the last user turn, tool definitions, tool calls and grouped tool results, multi-turn, with
and without the generation prompt (which always opens a <think> block); and the server splitting what
the model generates into reasoning and content. tests/test_tool_minimax.py covers its tool calls."""
import hashlib
import json
from pathlib import Path

import pytest

from colibri.chat_template import render as ct
from colibri.server.model import ModelInfo
from colibri.server.openai import render_prompt
from colibri.chat.params import GenSpec
from colibri.chat.pipeline import TextPipeline
from test_chat_template import (A, CONVERSATIONS, KWARG_SETS, S, SEARCH_TOOL, TOOL_CONVERSATIONS, U, WEATHER_TOOL,
                                assert_same)

DATA = Path(__file__).resolve().parent / "data" / "chat_templates"
TEMPLATE = DATA / "MiniMax-M2.jinja"
TEMPLATE_SHA256 = "967ff7e387676f4b4340585da0585416532f1e6c5ee3f1ede64b2c21ef7ea001"
T = lambda text: {"role": "tool", "content": text}  # noqa: E731
CALL = lambda name, args: {"type": "function", "function": {"name": name, "arguments": args}}  # noqa: E731

MINIMAX_CONVERSATIONS = {
    "reasoning_after_last_user_only": [
        S("Be brief."), U("2+2?"), A("4", reasoning_content="Two and two."), U("3+3?"),
        A("6", reasoning_content="Three and three.")],
    "inline_think_split": [U("q"), A("<think>\nwhy\n</think>\n\nbecause"), U("ok"), A("<think>how</think>so")],
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
    "grouped_tool_results": [U("Weather?"), A("", tool_calls=[CALL("get_weather", {"city": "Oslo"}),
                                                             CALL("get_weather", {"city": "Bern"})]),
                             T("cold"), T("windy"), U("Thanks, and tomorrow?")],
    "tool_result_parts": [U("Weather?"), A("", tool_calls=[CALL("get_weather", {"city": "Oslo"})]),
                          {"role": "tool", "content": [{"type": "text", "text": "cold"}, {"output": "dry"}]}],
    "system_details": [{"role": "system", "content": "Be brief.", "current_date": "2026-12-01",
                        "current_location": "Zürich"}, U("Hi")],
    "text_parts": [{"role": "user", "content": [{"type": "text", "text": "Look at "}, {"type": "text", "text": "this."}]},
                   A("Seen."), U("ok")],
    "tool_without_call": [U("Hi"), T("orphan")],
}
ALL = {**CONVERSATIONS, **TOOL_CONVERSATIONS, **MINIMAX_CONVERSATIONS}
# raise_exception for a tool turn with no call before it; string arguments have no .items() in jinja2 either
ERRORS = {"tool_without_call", "tool_call_string_args"}


def source():
    return TEMPLATE.read_text(encoding="utf-8")


def test_official_template_is_kept_verbatim():
    assert hashlib.sha256(TEMPLATE.read_bytes()).hexdigest() == TEMPLATE_SHA256
    readme = (DATA / "README.md").read_text()
    assert "MiniMax-M2.jinja" in readme and TEMPLATE_SHA256 in readme


@pytest.mark.parametrize("conv", sorted(ALL))
def test_official_template_matches_jinja2(conv):
    outcomes = [assert_same(source(), ALL[conv], **kw)[0] for kw in KWARG_SETS]
    outcomes += [assert_same(source(), ALL[conv], tools=[WEATHER_TOOL, SEARCH_TOOL], **kw)[0] for kw in KWARG_SETS[:2]]
    outcomes += [assert_same(source(), ALL[conv], model_identity="You are M.")[0]]
    assert set(outcomes) == ({"error"} if conv in ERRORS else {"ok"}), outcomes  # not vacuous


def test_known_bytes_generation_prompt_and_reasoning():
    # spelled out from the template by hand, independent of jinja2
    messages = [U("2+2?"), A("4", reasoning_content="Two and two."), U("3+3?")]
    assert ct.render_chat(source(), messages) == (
        "]~!b[]~b]system\nYou are a helpful assistant.[e~[\n]~b]user\n2+2?[e~[\n]~b]ai\n4[e~[\n"
        "]~b]user\n3+3?[e~[\n]~b]ai\n<think>\n")
    last = [S("Be brief."), U("2+2?"), A("4", reasoning_content="Two and two.")]
    assert ct.render_chat(source(), last, add_generation_prompt=False) == (
        "]~!b[]~b]system\nBe brief.[e~[\n]~b]user\n2+2?[e~[\n]~b]ai\n<think>\nTwo and two.\n</think>\n\n4[e~[\n")


def test_known_bytes_tools_calls_and_results():
    messages = [U("Weather?"), A("", tool_calls=[CALL("get_weather", {"city": "Lima", "days": [1, 2]})]), T("mild")]
    text = ct.render_chat(source(), messages, tools=[WEATHER_TOOL], add_generation_prompt=False)
    assert text.startswith("]~!b[]~b]system\nYou are a helpful assistant.\n\n# Tools\n")
    assert "<tools>\n<tool>" + json.dumps(WEATHER_TOOL["function"], ensure_ascii=False) + "</tool>\n</tools>" in text
    assert text.endswith(
        "]~b]user\nWeather?[e~[\n]~b]ai\n\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n"
        "<parameter name=\"city\">Lima</parameter>\n<parameter name=\"days\">[1, 2]</parameter>\n</invoke>\n"
        "</minimax:tool_call>[e~[\n]~b]tool\n<response>mild</response>[e~[\n")


def test_template_error_names_the_cause():
    with pytest.raises(ct.TemplateError, match="Message has tool role, but there was no previous assistant"):
        ct.render_chat(source(), ALL["tool_without_call"])


def _server_model(tmp_path):
    (tmp_path / "colibri.json").write_text('{"family": "minimax_m2"}')
    (tmp_path / "chat_template.jinja").write_text(source(), encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text('{"added_tokens": []}')
    return ModelInfo(tmp_path, "m", log=lambda *a: None)


def test_server_splits_reasoning(tmp_path):
    model = _server_model(tmp_path)
    assert model.template_error is None and model.thinks and model.tool_format == "minimax"
    spec = GenSpec(payload=None, opts={}, key_text="")
    render_prompt(spec, model, [U("2+2?"), A("4"), U("4+4?")], {}, add_generation_prompt=True,
                  continue_final_message=False)
    assert spec.in_reasoning  # the generation prompt opened the block
    pipe, merged = TextPipeline(spec.stops, spec.think, spec.in_reasoning), {}
    generated = "Add them.\n</think>\n\nIt is 8."
    for i in range(len(generated)):  # one character per engine frame: tags split anywhere
        for kind, text in pipe.feed(generated[i].encode()):
            merged[kind] = merged.get(kind, "") + text
    for kind, text in pipe.finish():
        merged[kind] = merged.get(kind, "") + text
    assert merged == {"reasoning": "Add them.\n", "content": "It is 8."}
