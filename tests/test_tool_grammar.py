"""The forced-call grammar of each family accepts exactly the calls its official template
writes: the template's own rendering of a call (tests/data/tool_calls) is a complete sentence of
the grammar (`colibri grammar-check`, the engine's matcher), a call of another function or with
arguments outside the schema is rejected."""
import pytest

from colibri.toolcall.request import ToolSpec
from colibri.toolcall import formats
from colibri.toolcall.forced import call_grammar
from engine_binaries import build
from grammar_schemas import grammar_check
from test_tool_parsers import DATA, OFFICIAL, SCHEMAS, _fmt, _source, assistant_text, cached_templates  # noqa: F401


@pytest.fixture(scope="module", autouse=True)
def engine():
    build("build/colibri")


def _spec(family, choice="required", name=None, parallel=True):
    return ToolSpec(tools=DATA["tools"], schemas=SCHEMAS, choice=choice, name=name, parallel=parallel,
                    fmt=_fmt(family))


@pytest.mark.parametrize("name", sorted(OFFICIAL))
def test_the_official_templates_calls_are_complete_sentences(cached_templates, name, tmp_path):  # noqa: F811
    family, single = OFFICIAL[name][0], OFFICIAL[name][4]
    source = _source(name, cached_templates)
    calls = DATA["single_call"] if single else DATA["calls"]
    text = assistant_text(name, cached_templates, calls, "")
    required = call_grammar(_spec(family, parallel=not single), source)
    named = call_grammar(_spec(family, "function", "get_weather"), source)
    one = assistant_text(name, cached_templates, DATA["single_call"], "")
    other = one.replace("get_weather", "get_wether")
    got = grammar_check(required, [text, one, other], tmp_path)
    assert got[:2] == ["complete", "complete"] and got[2].startswith("reject"), (got, text)
    got = grammar_check(named, [one, text], tmp_path)
    assert got[0] == "complete" and (single or got[1] != "complete")  # named: that one call only


@pytest.mark.parametrize("key,family", [("deepseek_v3", "deepseek_v3"), ("harmony_model", "gpt_oss")])
def test_hand_written_formats(key, family, tmp_path):
    source = "```json" if key == "deepseek_v3" else ""  # the original DeepSeek-V3 template fences the arguments
    text = DATA["hand_written"][key]
    parallel = key == "deepseek_v3"
    g = call_grammar(_spec(family, parallel=parallel), source)
    assert grammar_check(g, [text], tmp_path) == ["complete"]


def test_arguments_outside_the_schema_are_rejected(tmp_path):
    g = call_grammar(_spec("qwen3_moe", "function", "book_table"), "")
    good = formats.HERMES.render(DATA["calls"][1])
    bad_type = good.replace('"guests": 4', '"guests": "4"')
    missing = good.replace('"restaurant": "Café Öl", ', "")
    got = grammar_check(g, [good, bad_type, missing], tmp_path)
    assert got[0] == "complete" and got[1].startswith("reject") and got[2].startswith("reject")


def test_glm_raw_strings_keep_their_length_bounds(tmp_path):
    schema = {"type": "object", "properties": {"code": {"type": "string", "minLength": 2, "maxLength": 3},
                                               "unit": {"type": "string", "enum": ["c", "f"]}},
              "required": ["code", "unit"]}
    spec = ToolSpec(tools=[], schemas={"f": schema}, choice="function", name="f", parallel=False, fmt=formats.GLM)
    g = call_grammar(spec, "")

    def call(code, unit):
        return f"<tool_call>f<arg_key>code</arg_key><arg_value>{code}</arg_value>" \
               f"<arg_key>unit</arg_key><arg_value>{unit}</arg_value></tool_call>"
    got = grammar_check(g, [call("ab", "c"), call("abcd", "c"), call("a", "f"), call("ab", "k")], tmp_path)
    assert got[0] == "complete" and all(r.startswith("reject") for r in got[1:])
