"""Each family's tool-call parser on its official chat template's own output: a conversation
with calls (tests/data/tool_calls/conversation.json) is rendered through the template, the
assistant's text is cut out, and parsing it must give back the same calls and content, whole
and streamed in small pieces."""
import json
import random
import re
from pathlib import Path

import pytest

import family_registry
from colibri.chat_template import render as ct
from colibri.toolcall import formats
from colibri.toolcall.request import with_string_arguments
from colibri.toolcall.stream import ToolCallFilter

DATA = json.loads((Path(__file__).parent / "data" / "tool_calls" / "conversation.json").read_text(encoding="utf-8"))
TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in DATA["tools"]}

# template -> (family, where the assistant's turn opens, where it ends, variables, single call only)
OFFICIAL = {
    "qwen3": ("qwen3_moe", "<|im_start|>assistant\n", "<|im_end|>", {}, False),
    "llama3_2": ("llama", "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>",
                 {"date_string": "01 Dec 2026"}, True),
    "Qwen3.5.jinja": ("qwen3_5_moe", "<|im_start|>assistant\n", "<|im_end|>", {}, False),
    "GLM-4.6.jinja": ("glm4_moe", "<|assistant|>", "<|observation|>", {}, False),
    "GLM-4.7-Flash.jinja": ("glm4_moe_lite", "<|assistant|>", "<|observation|>", {}, False),
    "deepseek-ai-DeepSeek-V3.1.jinja": ("deepseek_v3", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", {"bos_token": "<s>"},
                                        False),
    "MiniMax-M2.jinja": ("minimax_m2", "]~b]ai\n", "[e~[", {}, False),
    "deepseek-ai-DeepSeek-V3.2.jinja": ("deepseek_v32", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", {"bos_token": "<s>"},
                                        False),
}


@pytest.fixture(scope="module")
def cached_templates():
    import fetch_chat_templates
    try:
        return fetch_chat_templates.ensure(["qwen3", "llama3_2"], quiet=True)
    except fetch_chat_templates.FetchError as e:
        pytest.fail(f"real chat templates unavailable: {e}", pytrace=False)


def _source(name, cached):
    if name.endswith(".jinja"):
        return (TEMPLATES / name).read_text(encoding="utf-8")
    return ct.load_chat_template(cached[name])


def _conversation(calls, content):
    tool_calls = [{"id": f"call_{i}", "type": "function", "function": c} for i, c in enumerate(calls)]
    return [{"role": "user", "content": DATA["user"]},
            {"role": "assistant", "content": content, "tool_calls": tool_calls}] + \
        [{"role": "tool", "tool_call_id": f"call_{i}", "content": "ok"} for i in range(len(calls))]


def assistant_text(name, cached, calls, content):
    """The assistant turn of the rendered conversation, as the model would have generated it
    (the empty or short thinking block the template writes before it removed)."""
    family, opener, end, variables, _ = OFFICIAL[name]
    chat = _conversation(calls, content)
    source = _source(name, cached)
    try:
        text = ct.render_chat(source, chat, tools=DATA["tools"], add_generation_prompt=False, **variables)
    except ct.TemplateError:  # templates that concatenate the arguments as text
        text = ct.render_chat(source, with_string_arguments(chat), tools=DATA["tools"], add_generation_prompt=False,
                              **variables)
    turn = text[text.rindex(opener) + len(opener):]
    turn = turn[:turn.index(end)] if end in turn else turn
    return re.sub(r"^\s*(<think>.*?)?</think>\s*", "", turn, flags=re.S)


def _fmt(family):
    return formats.get(family_registry.FAMILIES[family]["tools"])


def _expected(name):
    return DATA["single_call"] if OFFICIAL[name][4] else DATA["calls"]


@pytest.mark.parametrize("name", sorted(OFFICIAL))
def test_parser_reads_the_official_template_back(cached_templates, name):
    calls = _expected(name)
    content = "" if OFFICIAL[name][4] else DATA["content"]  # Llama's template writes no text with a call
    text = assistant_text(name, cached_templates, calls, content)
    assert calls[0]["name"] in text  # not vacuous: the template wrote the call
    got_content, got_calls = _fmt(OFFICIAL[name][0]).split(text, SCHEMAS)
    assert got_calls == calls
    assert got_content.strip() == content


@pytest.mark.parametrize("name", sorted(OFFICIAL))
def test_streamed_in_pieces_gives_the_same_and_never_leaks_markup(cached_templates, name):
    calls = _expected(name)
    content = "" if OFFICIAL[name][4] else DATA["content"]
    text = assistant_text(name, cached_templates, calls, content)
    fmt = _fmt(OFFICIAL[name][0])
    rng = random.Random(7)
    for _ in range(5):
        f, pieces, i = ToolCallFilter(fmt, SCHEMAS), [], 0
        while i < len(text):
            n = rng.randint(1, 6)
            pieces += f.feed(text[i:i + n])
            i += n
        pieces += f.finish()
        shown = "".join(p[1] for p in pieces if p[0] == "content")
        assert [p[1] for p in pieces if p[0] in ("tool_call", "tool_call_end")] == calls
        if fmt.args_head is not None:  # arguments streamed as written: the fragments join to each call's JSON
            assert [p[1] for p in pieces if p[0] == "tool_call_start"] == [c["name"] for c in calls]
            joined = "".join(p[1] if p[0] == "tool_call_args" else "\0" for p in pieces
                             if p[0] in ("tool_call_args", "tool_call_end"))
            assert [json.loads(a) for a in joined.split("\0")[:-1]] == [c["arguments"] for c in calls]
        assert shown.strip() == content and not any(m[:3] in shown for m in fmt.starts if len(m) > 1)


def test_glm_keeps_a_numeric_looking_string_a_string():
    text = "<tool_call>book_table<arg_key>code</arg_key><arg_value>123</arg_value>" \
           "<arg_key>guests</arg_key><arg_value>4</arg_value><arg_key>restaurant</arg_key><arg_value>X</arg_value></tool_call>"
    _, calls = formats.GLM.split(text, SCHEMAS)
    assert calls == [{"name": "book_table", "arguments": {"code": "123", "guests": 4, "restaurant": "X"}}]
    _, calls = formats.GLM.split(text, {})  # without the schema the value reads as JSON
    assert calls[0]["arguments"]["code"] == 123


def test_original_deepseek_v3_format():
    content, calls = formats.DEEPSEEK.split("Sure." + DATA["hand_written"]["deepseek_v3"])
    assert calls == DATA["calls"] and content == "Sure."


@pytest.mark.parametrize("key", ["harmony_template", "harmony_model"])
def test_harmony_calls(key):
    text = DATA["hand_written"][key]
    assert formats.parse_harmony_calls(text) == DATA["single_call"]
    content, calls = formats.HARMONY.split(text)
    assert calls == DATA["single_call"] and content == ""


def test_harmony_call_after_analysis_and_without_the_call_token():
    text = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant" \
           "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Bern\"}"
    assert formats.parse_harmony_calls(text) == [{"name": "get_weather", "arguments": {"city": "Bern"}}]


@pytest.mark.parametrize("fmt", sorted(formats.FORMATS))
def test_render_then_parse_round_trips(fmt):
    f = formats.get(fmt)
    calls = DATA["calls"][:1] if fmt in ("harmony",) else DATA["calls"]
    text = "\n".join(f.render(c) for c in calls)
    assert f.split(text, SCHEMAS) == ("", calls)


@pytest.mark.parametrize("fmt,text", [
    ("hermes", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Bern\"\n</tool_call> done"),
    ("hermes", "I use <tool_call> tags like this one."),
    ("glm", "<tool_call>not a call\nat all</tool_call>"),
    ("deepseek", "<｜tool▁calls▁begin｜>garbage<｜tool▁calls▁end｜>"),
    ("llama3_json", "{\"answer\": 42}"),
])
def test_a_region_that_is_no_call_stays_visible(fmt, text):
    content, calls = formats.get(fmt).split(text, SCHEMAS)
    assert calls == [] and content == text


def test_text_around_calls_and_max_calls():
    f = ToolCallFilter(formats.HERMES, SCHEMAS, max_calls=1)
    text = "Checking.\n\n" + "\n".join(formats.HERMES.render(c) for c in DATA["calls"]) + "\n"
    pieces = f.feed(text) + f.finish()
    args = json.dumps(DATA["calls"][0]["arguments"], ensure_ascii=False)
    assert pieces == [("content", "Checking."), ("tool_call_start", "get_weather"), ("tool_call_args", args),
                      ("tool_call_end", DATA["calls"][0])] and f.done()


def test_llama_json_counts_only_at_the_start():
    content, calls = formats.LLAMA3_JSON.split('The call would be {"name": "get_weather", "parameters": {}}')
    assert calls == [] and content.startswith("The call")
    content, calls = formats.LLAMA3_JSON.split('<|python_tag|>{"name": "get_weather", "parameters": {"city": "X"}}')
    assert calls == [{"name": "get_weather", "arguments": {"city": "X"}}] and content == ""


def test_every_tool_family_names_a_known_format():
    named = {f: fam["tools"] for f, fam in family_registry.FAMILIES.items() if fam["tools"]}
    assert {"qwen3_moe", "deepseek_v3", "deepseek_v32", "glm4_moe", "glm_moe_dsa", "llama"} <= set(named)
    for fam, fmt in named.items():
        assert formats.get(fmt).name == fmt


def test_gpt_oss_official_template_call_through_the_harmony_splitter():
    from colibri.chat.harmony import HarmonySplitter
    source = (TEMPLATES / "openai-gpt-oss.jinja").read_text(encoding="utf-8")
    call = DATA["single_call"][0]
    chat = [{"role": "user", "content": DATA["user"]},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c0", "type": "function", "function": call}]}]
    prompt = ct.render_chat(source, chat[:1], tools=DATA["tools"], add_generation_prompt=True)
    full = ct.render_chat(source, chat, tools=DATA["tools"], add_generation_prompt=False)
    assert full.startswith(prompt) and prompt.endswith("<|start|>assistant")
    generated = full[len(prompt):]  # " to=functions.get_weather<|channel|>commentary json<|message|>{...}<|call|>"
    assert generated.startswith(" to=functions.get_weather") and generated.endswith("<|call|>")
    rng = random.Random(3)
    for _ in range(3):
        s, pieces, i = HarmonySplitter.after_prompt(prompt), [], 0
        while i < len(generated):
            n = rng.randint(1, 5)
            pieces += s.feed(generated[i:i + n])
            i += n
        pieces += s.flush()
        assert pieces == [("tool_call", call)]
    assert formats.parse_harmony_calls(full[full.rindex("<|start|>assistant"):]) == [call]


def test_streamed_arguments_hold_back_only_the_closing_brace():
    f = ToolCallFilter(formats.HERMES, SCHEMAS)
    steps = ['<tool_call>\n{"name": "get_weather", ', '"arguments": {"city": "Zü', 'rich"}', "}", "\n</tool", "_call>"]
    got = [f.feed(s) for s in steps] + [f.finish()]
    assert got == [[], [("tool_call_start", "get_weather"), ("tool_call_args", '{"city": "Zü')], [("tool_call_args", 'rich"')],
                   [("tool_call_args", "}")], [], [("tool_call_end", {"name": "get_weather", "arguments": {"city": "Zürich"}})],
                   []]


def test_a_streamed_call_that_does_not_parse_ends_empty_and_shows_its_text():
    f = ToolCallFilter(formats.HERMES, SCHEMAS)
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>'
    pieces = f.feed(text) + f.finish()
    assert pieces[0] == ("tool_call_start", "get_weather") and ("tool_call_end", None) in pieces
    assert pieces[-1] == ("content", text)


FRAGMENTS = ["<tool_call>", "</tool_call>", "<tool_", "call>", "{", "}", '"name": "get_weather"', ', "arguments": ',
             '{"city": "Bern"}', "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "city", "Bern", "\n", " ",
             formats.DS_CALLS_BEGIN, formats.DS_CALL_BEGIN, formats.DS_SEP, formats.DS_CALL_END, formats.DS_CALLS_END,
             formats.DSML_BEGIN, formats.DSML_END, f'<{formats.DSML}invoke name="get_weather">', f"</{formats.DSML}invoke>",
             f'<{formats.DSML}parameter name="city" string="true">', f"</{formats.DSML}parameter>", formats.PYTHON_TAG,
             '"parameters": ', "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>", "<|call|>",
             "get_weather", "text ", "é", '"', ",", "```json\n", "```", "function", "<function=get_weather>\n",
             "</function>", "<parameter=city>\n", "\n</parameter>\n", "True"]


@pytest.mark.parametrize("fmt", sorted(formats.FORMATS))
def test_random_text_never_breaks_the_filter_and_chunking_changes_nothing(fmt):
    """Any text, cut anywhere: no exception, and the same content and calls as the whole text."""
    f = formats.get(fmt)
    rng = random.Random(fmt)
    for _ in range(300):
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 14)))
        whole = f.split(text, SCHEMAS)
        filt, pieces, i = ToolCallFilter(f, SCHEMAS), [], 0
        while i < len(text):
            n = rng.randint(1, 4)
            pieces += filt.feed(text[i:i + n])
            i += n
        pieces += filt.finish()
        calls = [p[1] for p in pieces if p[0] in ("tool_call", "tool_call_end") and p[1] is not None]
        assert ("".join(p[1] for p in pieces if p[0] == "content"), calls) == whole, text
        for c in calls:
            assert isinstance(c["name"], str) and isinstance(c["arguments"], dict)
