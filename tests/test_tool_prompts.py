"""What a tool request turns into before the engine: the prompt each family's official template
renders for earlier calls and results, and the GBNF that forces a call (tool_choice required
or named) in the family's own syntax."""
import json
from pathlib import Path

import pytest

import family_registry
from colibri.chat_template import literal
from colibri.chat_template import render as ct
from colibri.server import openai as oa
from colibri.chat.params import ApiError

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                                          "days": {"type": "integer"}},
                                          "required": ["city"]}}}
ASK = [{"role": "user", "content": "Weather in Bern?"}]
HISTORY = ASK + [{"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Bern"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]


class Model:
    """The part of server.model.ModelInfo that request parsing reads, over a template source."""
    id, defaults, manifest, harmony = "m", {}, {}, False

    def __init__(self, template, family, **special):
        fam = family_registry.FAMILIES[family]
        self.template, self.special = template, special
        self.thinks = "<think>" in template
        self.tool_format, self.family_display = fam["tools"] or None, fam["display"]

    def render(self, messages, add_generation_prompt=True, continue_final_message=False, **kw):
        return literal.render_prompt(self.template, messages, literal.AddedTokens(), model_vars=self.special,
                                     add_generation_prompt=add_generation_prompt,
                                     continue_final_message=continue_final_message, **kw)


def _cached(name):
    import fetch_chat_templates
    return ct.load_chat_template(fetch_chat_templates.ensure([name], quiet=True)[name])


def parse(model, **body):
    return oa.parse_chat({"messages": ASK, **body}, model, 1)


def test_original_deepseek_v3_template_gets_the_call_it_would_drop():
    m = Model(_cached("deepseek_v3"), "deepseek_v3", bos_token="<s>")
    spec = parse(m, messages=HISTORY, tools=[WEATHER])
    text = spec.key_text
    assert "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Bern\"}<｜tool▁call▁end｜>" in text
    assert "<｜tool▁output▁begin｜>sunny<｜tool▁output▁end｜>" in text  # the template's own result syntax


@pytest.mark.parametrize("name,family,needle", [
    ("GLM-4.6.jinja", "glm4_moe", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Bern</arg_value>"),
    ("GLM-4.7-Flash.jinja", "glm4_moe_lite", "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Bern</arg_value>"),
    ("deepseek-ai-DeepSeek-V3.1.jinja", "deepseek_v3", "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Bern\"}"),
    ("deepseek-ai-DeepSeek-V3.2.jinja", "deepseek_v32", '<｜DSML｜parameter name="city" string="true">Bern'),
    ("Qwen3.5.jinja", "qwen3_5_moe", "<tool_call>\n<function=get_weather>\n<parameter=city>\nBern\n</parameter>"),
])
def test_official_templates_render_history_calls_their_way(name, family, needle):
    m = Model((TEMPLATES / name).read_text(encoding="utf-8"), family, bos_token="<s>")
    spec = parse(m, messages=HISTORY, tools=[WEATHER])
    assert needle in spec.key_text and "sunny" in spec.key_text


def _grammar(spec):
    g = spec.opts["grammar"]
    assert g == spec.tools.grammar and g.startswith("root ::= ")
    return g


@pytest.mark.parametrize("name,family,pieces", [
    ("qwen3", "qwen3_moe", ['"<tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": "', '"}\\n</tool_call>"']),
    ("llama3_2", "llama", ['"{\\"name\\": \\"get_weather\\", \\"parameters\\": "']),
    ("GLM-4.7-Flash.jinja", "glm4_moe_lite", ['"<tool_call>get_weather"', '"<arg_key>city</arg_key><arg_value>"',
                                              '( "<arg_key>days</arg_key><arg_value>"']),
    ("GLM-4.6.jinja", "glm4_moe", ['"<arg_key>city</arg_key>\\n<arg_value>"']),
    ("deepseek-ai-DeepSeek-V3.1.jinja", "deepseek_v3", ['"<｜tool▁calls▁begin｜>"',
                                                        '"<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"']),
    ("deepseek_v3", "deepseek_v3", ['"<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\\n```json\\n"']),
    ("Qwen3.5.jinja", "qwen3_5_moe", ['"<tool_call>\\n<function=get_weather>\\n"', '"<parameter=city>\\n"',
                                      '( "<parameter=days>\\n"', '"</function>\\n</tool_call>"']),
])
def test_named_tool_choice_grammar_spells_the_family_call(name, family, pieces):
    source = (TEMPLATES / name).read_text(encoding="utf-8") if name.endswith(".jinja") else _cached(name)
    m = Model(source, family, bos_token="<s>", date_string="01 Dec 2026")
    spec = parse(m, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    g = _grammar(spec)
    for p in pieces:
        assert p in g, (p, g)
    if spec.in_reasoning:  # GLM-4.7 opens <think> in the prompt: the grammar closes it first
        assert g.startswith('root ::= "</think>"')


def test_required_with_parallel_calls_repeats_and_without_does_not():
    m = Model(_cached("qwen3"), "qwen3_moe")
    time_tool = {"type": "function", "function": {"name": "get_time"}}
    g = _grammar(parse(m, tools=[WEATHER, time_tool], tool_choice="required"))
    assert g.splitlines()[0] == 'root ::= tc-call ( "\\n" tc-call )*' and "get_time" in g
    g = _grammar(parse(m, tools=[WEATHER, time_tool], tool_choice="required", parallel_tool_calls=False))
    assert g.splitlines()[0] == "root ::= tc-call"


def test_auto_and_none_force_nothing():
    m = Model(_cached("qwen3"), "qwen3_moe")
    for choice in ("auto", "none"):
        spec = parse(m, tools=[WEATHER], tool_choice=choice)
        assert "grammar" not in spec.opts and spec.tools.parses == (choice == "auto")


def test_history_calls_on_a_family_without_tool_syntax_are_refused():
    m = Model(_cached("qwen3"), "mixtral")
    with pytest.raises(ApiError) as e:
        parse(m, messages=HISTORY)
    assert e.value.code == "tools_unsupported" and "Mixtral" in e.value.message


def test_schema_outside_the_grammar_subset_names_the_keyword():
    m = Model(_cached("qwen3"), "qwen3_moe")
    tool = json.loads(json.dumps(WEATHER))
    tool["function"]["parameters"]["properties"]["city"]["not"] = {"const": "x"}
    with pytest.raises(ApiError) as e:
        parse(m, tools=[tool], tool_choice="required")
    assert e.value.status == 400 and "'not'" in e.value.message and e.value.param == "tools[0].function.parameters"
    assert "grammar" not in parse(m, tools=[tool]).opts  # unforced, the schema is only shown to the model


def test_a_forced_call_and_structured_output_do_not_mix():
    m = Model(_cached("qwen3"), "qwen3_moe")
    with pytest.raises(ApiError) as e:
        parse(m, tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"})
    assert e.value.param == "tool_choice"


def test_legacy_functions_and_function_call():
    m = Model(_cached("qwen3"), "qwen3_moe")
    spec = parse(m, functions=[WEATHER["function"]], function_call={"name": "get_weather"},
                 messages=ASK + [{"role": "assistant", "content": None,
                                  "function_call": {"name": "get_weather", "arguments": "{\"city\": \"Bern\"}"}},
                                 {"role": "function", "name": "get_weather", "content": "sunny"}])
    assert spec.tools.choice == "function" and spec.tools.name == "get_weather" and "get_weather" in _grammar(spec)
    assert '{"name": "get_weather", "arguments": {"city": "Bern"}}' in spec.key_text
    assert "<tool_response>\nsunny\n</tool_response>" in spec.key_text


def test_anthropic_tools_reach_the_template():
    from colibri.server import anthropic as an
    m = Model(_cached("qwen3"), "qwen3_moe")
    body = {"max_tokens": 5, "tools": [{"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "messages": ASK + [
                {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                                  {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                   "input": {"city": "Bern"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                                             {"type": "text", "text": "And tomorrow?"}]}]}
    spec = an.parse_messages(body, m, 1)
    assert spec.tools.choice == "required" and not spec.tools.parallel
    assert _grammar(spec).splitlines()[0] == "root ::= tc-call"
    text = spec.key_text
    assert 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Bern"}}\n</tool_call>' in text
    assert text.index("<tool_response>\nsunny\n</tool_response>") < text.index("And tomorrow?")


def test_flat_named_tool_choice_of_the_responses_api():
    m = Model(_cached("qwen3"), "qwen3_moe")
    spec = parse(m, tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"})
    assert spec.tools.choice == "function" and spec.tools.name == "get_weather"
