"""GLM-4.5/4.6/4.7-Flash/GLM-5, DeepSeek-V3.1/V3.2 and Qwen3.5/3.6 official chat templates (tests/data/
chat_templates) rendered byte-identical to jinja2, thinking on and off, and the server splitting
what those models generate into reasoning_content and content."""
from pathlib import Path

import pytest

import family_registry
from colibri.chat_template import render as ct
from colibri.server.model import ModelInfo
from colibri.server.openai import render_prompt
from colibri.chat.params import GenSpec
from colibri.chat.pipeline import TextPipeline
from test_chat_template import A, CONVERSATIONS, KWARG_SETS, S, TOOL_CONVERSATIONS, U, assert_same

DATA = Path(__file__).resolve().parent / "data" / "chat_templates"
BOS = "<｜begin▁of▁sentence｜>"
# template file: (family, special tokens its tokenizer_config.json gives)
TEMPLATES = {
    "GLM-4.6.jinja": ("glm4_moe", {}),
    "GLM-4.7-Flash.jinja": ("glm4_moe_lite", {}),
    "deepseek-ai-DeepSeek-V3.1.jinja": ("deepseek_v3", {"bos_token": BOS}),
    "deepseek-ai-DeepSeek-V3.2.jinja": ("deepseek_v32", {"bos_token": BOS}),
    "Qwen3.5.jinja": ("qwen3_5_moe", {}),
}
THINK_KWARGS = KWARG_SETS + [dict(thinking=True), dict(thinking=False),
                             dict(add_generation_prompt=False, thinking=True)]
EARLIER_REASONING = [S("Be brief."), U("2+2?"), A("4", reasoning_content="Two and two."),
                     U("3+3?"), A("<think>\nThree and three.\n</think>\n\n6"), U("And 4+4?")]


def source(name):
    return (DATA / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize("conv", sorted({**CONVERSATIONS, **TOOL_CONVERSATIONS, "earlier": 0}))
def test_official_template_matches_jinja2(name, conv):
    messages = EARLIER_REASONING if conv == "earlier" else {**CONVERSATIONS, **TOOL_CONVERSATIONS}[conv]
    outcomes = [assert_same(source(name), messages, TEMPLATES[name][1], **kw)[0] for kw in THINK_KWARGS]
    if conv in ("single_user", "multi_turn", "earlier", "reasoning_last_turn"):
        assert all(o == "ok" for o in outcomes), outcomes  # ordinary chats really render


# the generation prompt each template ends with, thinking on / off, spelled out independently
GEN_PROMPTS = {
    "GLM-4.6.jinja": ("<|user|>\nHi<|assistant|>", "<|user|>\nHi/nothink<|assistant|>\n<think></think>"),
    "GLM-4.7-Flash.jinja": ("<|user|>Hi<|assistant|><think>", "<|user|>Hi<|assistant|></think>"),
    "deepseek-ai-DeepSeek-V3.1.jinja": ("<｜User｜>Hi<｜Assistant｜><think>", "<｜User｜>Hi<｜Assistant｜><think></think>"),
    "deepseek-ai-DeepSeek-V3.2.jinja": ("<｜User｜>Hi<｜Assistant｜><think>", "<｜User｜>Hi<｜Assistant｜><think></think>"),
    "Qwen3.5.jinja": ("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n",
                      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"),
}


def test_every_reasoning_family_has_a_thinking_switch():
    # GLM-5 (glm_moe_dsa) ships the GLM-4.5/4.6 template's enable_thinking switch
    assert family_registry.FAMILIES["glm_moe_dsa"]["thinking"] in source("GLM-4.6.jinja")
    for family, _ in TEMPLATES.values():
        assert family_registry.FAMILIES[family]["thinking"], family


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_thinking_switch_from_the_registry(name):
    family, specials = TEMPLATES[name]
    switch = family_registry.FAMILIES[family]["thinking"]
    assert switch in source(name)
    on, off = GEN_PROMPTS[name]
    got_on = ct.render_chat(source(name), [U("Hi")], **specials, **{switch: True})
    got_off = ct.render_chat(source(name), [U("Hi")], **specials, **{switch: False})
    assert got_on.endswith(on) and got_off.endswith(off), (got_on, got_off)


def test_glm_drops_reasoning_of_earlier_turns_only():
    text = ct.render_chat(source("GLM-4.6.jinja"), EARLIER_REASONING[:-1])
    assert "Two and two" not in text and "<think>Three and three.</think>\n6" in text


# what each model generates after the prompt, thinking on: GLM-4.6 opens the block itself
GENERATED = {
    "GLM-4.6.jinja": "\n<think>Add them.</think>\nIt is 8.",
    "GLM-4.7-Flash.jinja": "Add them.</think>It is 8.",
    "deepseek-ai-DeepSeek-V3.1.jinja": "Add them.</think>It is 8.",
    "deepseek-ai-DeepSeek-V3.2.jinja": "Add them.</think>It is 8.",
    "Qwen3.5.jinja": "Add them.\n</think>\n\nIt is 8.",
}
# the reasoning is passed on as generated, as for Qwen3: the newline before </think> stays
REASONING = {"Qwen3.5.jinja": "Add them.\n"}


def _server_model(tmp_path, name):
    family, specials = TEMPLATES[name]
    (tmp_path / "colibri.json").write_text('{"family": "%s"}' % family)
    (tmp_path / "chat_template.jinja").write_text(source(name), encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(__import__("json").dumps(specials))
    (tmp_path / "tokenizer.json").write_text('{"added_tokens": []}')
    return ModelInfo(tmp_path, "m", log=lambda *a: None)


def _generate(model, think, generated):
    spec = GenSpec(payload=None, opts={}, key_text="")
    render_prompt(spec, model, [U("2+2?"), A("4"), U("4+4?")], {"enable_thinking": think},
                  add_generation_prompt=True, continue_final_message=False)
    pipe = TextPipeline(spec.stops, spec.think, spec.in_reasoning)
    merged = {}
    for i in range(len(generated)):  # one character per engine frame: tags split anywhere
        for kind, text in pipe.feed(generated[i].encode()):
            merged[kind] = merged.get(kind, "") + text
    for kind, text in pipe.finish():
        merged[kind] = merged.get(kind, "") + text
    return merged


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_server_splits_reasoning(tmp_path, name):
    model = _server_model(tmp_path, name)
    assert model.template_error is None and model.thinks
    reasoning = REASONING.get(name, "Add them.")
    assert _generate(model, True, GENERATED[name]) == {"reasoning": reasoning, "content": "It is 8."}
    assert _generate(model, False, "It is 8.") == {"content": "It is 8."}


# ------------------------------------------------------------------------------------------
# jinja2 compiles an unknown filter or test inside {% if %} / an inline if and fails only
# when it is called (DeepSeek-V3.2 guards `from_json` so); elsewhere it fails to compile
# ------------------------------------------------------------------------------------------

SOFT = [
    "{% if x %}{{ x | from_json }}{% endif %}ok",
    "{% if x %}{% set y = x | from_json %}{% endif %}ok",
    "{{ (x | from_json) if x else 'ok' }}",
    "{% if x and x is nosuchtest %}a{% endif %}ok",
    "{% if x %}{% for i in x | nosuch %}{% endfor %}{% endif %}ok",
]
HARD = [
    "{{ x | from_json }}",
    "{% if x %}{% for i in [1] %}{{ i | from_json }}{% endfor %}{% endif %}ok",
    "{% if x %}{% macro m() %}{{ 1 | nosuch }}{% endmacro %}{% endif %}ok",
    "{% if x %}{% set y %}{{ 1 | nosuch }}{% endset %}{% endif %}ok",
    "{% for i in [1] %}{% if i is nosuchtest %}{% endif %}{% endfor %}{{ 1 is nosuchtest }}",
]


@pytest.mark.parametrize("template", SOFT)
def test_unknown_filter_in_if_fails_only_when_called(template):
    assert assert_same(template, [U("hi")], x=False)[0] == "ok"
    assert assert_same(template, [U("hi")], x="[1]")[0] == "error"


@pytest.mark.parametrize("template", HARD)
def test_unknown_filter_outside_if_fails_to_compile(template):
    assert assert_same(template, [U("hi")], x=False)[0] == "error"
    with pytest.raises(ct.TemplateError, match="No (filter|test) named"):
        ct.render_chat(template, [U("hi")], x=False)


# ------------------------------------------------------------------------------------------
# coli chat: --think/--no-think and :think set the family's own switch
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_chat_think_command_switches_the_family_variable(tmp_path, name):
    from colibri.cli import chat as chat_cli
    from colibri import launch_opts
    from types import SimpleNamespace
    model = _server_model(tmp_path, name)
    on, off = GEN_PROMPTS[name]
    template_vars = launch_opts.thinking_vars(SimpleNamespace(think=True, raw=False), tmp_path)
    assert chat_cli.thinking_note(template_vars) == "; thinking on"
    assert chat_cli.switch_thinking(template_vars, tmp_path, "off") == "thinking off"
    assert model.render([U("Hi")], **template_vars).text.endswith(off)
    assert chat_cli.switch_thinking(template_vars, tmp_path, "on") == "thinking on"
    assert model.render([U("Hi")], **template_vars).text.endswith(on)
    assert chat_cli.switch_thinking(template_vars, tmp_path, "maybe") == ":think on, or :think off"
    no_think = launch_opts.thinking_vars(SimpleNamespace(think=False, raw=False), tmp_path)
    assert chat_cli.thinking_note(no_think) == "; thinking off"
