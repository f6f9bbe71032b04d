"""Hostile chat templates (a template comes from the model folder, which may not be trusted):
each must end in the module's own TemplateError naming the problem, never in another exception
type, a hang or gigabytes of memory. The sizes are chosen so the unbounded renderer finished
them quickly but wrongly (a 20M-character prompt, RecursionError); fuzz/fuzz_chat_template.py
found the classes and fuzz/corpus/chat_template/ keeps reproducers."""
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

from colibri.chat_template import render as ct
from colibri.chat_template import runtime as rt

MESSAGES = [{"role": "user", "content": "hi"}]
BIG = rt.MAX_LENGTH + 10

CASES = {
    # nesting deeper than Python's recursion limit in the parser
    "deep_parens": ("{{ " + "(" * 3000 + "1" + ")" * 3000 + " }}", "nests"),
    "deep_blocks": ("{% if 1 %}" * 1500 + "{% endif %}" * 1500, "nests"),
    "deep_unary": ("{{ " + "-" * 5000 + "1 }}", "nests"),
    # values built in one step
    "str_repeat": (f"{{{{ 'a' * {BIG} }}}}", "would build a str"),
    "list_repeat": (f"{{{{ ([1] * {BIG // 2}) | length }}}}", "would build a list"),
    "power": ("{{ (2 ** 70000) | string | length }}", "too large a number"),
    "center": (f"{{{{ 'x' | center({BIG}) }}}}", "centered string"),
    "format_width": (f"{{{{ '{{:{BIG}}}'.format(1) }}}}", "formatted field"),
    "printf_width": (f"{{{{ '%{BIG}d' % 1 }}}}", "formatted field"),
    "printf_star": (f"{{{{ '%*d' % ({BIG}, 1) }}}}", "formatted field"),
    "indent": (f"{{{{ 'a\nb' | indent({BIG}) }}}}", "indent"),
    "replace": ("{% set s = 'a' * 5000 %}{{ s | replace('a', s) | length }}", "replaced string"),
    "join_aliased": ("{% set s = 'a' * 100000 %}{{ ([s] * 200) | join | length }}", "would build a list"),
    "tojson_aliased": ("{% set s = 'a' * 100000 %}{% set l = [s, s, s, s, s, s, s, s, s, s] %}"
                       "{% set m = [l, l, l, l, l, l, l, l, l, l] %}{% set n = [m, m] %}{{ n | tojson | length }}",
                       "JSON text"),
    "list_text": ("{% set s = 'a' * 100000 %}{% set l = [s, s, s, s, s, s, s, s, s, s] %}"
                  "{% set m = [l, l, l, l, l, l, l, l, l, l] %}{% set n = [m, m] %}{{ n | length }}{{ n }}",
                  "text of a list"),
    # values built over many steps
    "doubling": ("{% set ns = namespace(s='a') %}{% for i in range(30) %}{% set ns.s = ns.s ~ ns.s %}"
                 "{% endfor %}{{ ns.s | length }}", "would build a str"),
    "output": ("{% for i in range(200) %}{{ 'x' * 100000 }}{% endfor %}", "would build output"),
    # work: run with MAX_STEPS lowered to STEPS (as the fuzz target does) so the case is quick;
    # the unbounded renderer finished these without complaint
    "loops": ("{% for i in range(1000) %}{% for j in range(11) %}{% endfor %}{% endfor %}",
              "loop iterations"),
    "macro_calls": ("{% macro f() %}{% endmacro %}{% for i in range(1000) %}{% for j in range(6) %}"
                    "{{ f() }}{% endfor %}{% endfor %}", "loop iterations and macro calls"),
}
STEPS = 5000


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_template_is_refused_with_template_error(name, monkeypatch):
    monkeypatch.setattr(rt, "MAX_STEPS", STEPS)
    source, needle = CASES[name]
    with pytest.raises(ct.TemplateError) as e:
        ct.render_chat(source, MESSAGES)
    assert needle in str(e.value), str(e.value)


def test_bounds_leave_real_sized_prompts_alone():
    # a long conversation with tools renders as before: the bounds are far above real prompts
    messages = [{"role": "user" if i % 2 else "assistant", "content": "word " * 200} for i in range(2000)]
    source = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}{% for t in tools %}"
              "{{ t | tojson }}{% endfor %}\n{% endfor %}")
    out = ct.render_chat(source, messages, tools=[{"name": "f", "parameters": {"type": "object"}}])
    assert out.count("<|user|>") == 1000 and len(out) > 2_000_000


def test_reproducers_in_the_kept_corpus_raise_only_template_error(monkeypatch):
    monkeypatch.setattr(rt, "MAX_STEPS", STEPS)
    corpus = ROOT / "fuzz" / "corpus" / "chat_template"
    regress = sorted(corpus.glob("regress-*"))
    assert regress, "the fuzz corpus lost its chat-template reproducers"
    for path in regress:
        with pytest.raises(ct.TemplateError):
            ct.render_chat(path.read_bytes().decode("utf-8", "replace"), MESSAGES)
