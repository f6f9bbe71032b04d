"""JSON Schema -> GBNF (colibri/grammar): over random schemas, every valid instance, however it
is spaced, is a complete sentence of the compiled grammar, checked by the engine's own matcher
(`colibri grammar-check`); patterns agree with Python's re; keywords outside the subset are
refused by name."""
import json
import random
import re

import jsonschema
import pytest

from colibri.grammar import SchemaError, gbnf, json_object_gbnf, schema_grammar, schema_to_gbnf
from colibri.grammar.regex import PatternError, pattern_to_gbnf
from engine_binaries import build
from grammar_schemas import PATTERNS, NoInstance, dumps_styles, grammar_check, random_instance, random_root, valid


@pytest.fixture(scope="module", autouse=True)
def engine():
    build("build/colibri")


def test_random_schemas_accept_their_valid_instances(tmp_path):
    checked = 0
    for seed in range(120):
        rng = random.Random(seed)
        schema = random_root(rng)
        jsonschema.Draft202012Validator.check_schema(schema)
        texts = []
        for _ in range(4):
            try:
                v = random_instance(rng, schema, schema)
            except NoInstance:
                continue
            jsonschema.validate(v, schema)  # the generator itself is right
            texts += dumps_styles(v)
        if not texts:
            continue
        verdicts = grammar_check(schema_grammar(schema), texts, tmp_path)
        bad = [(t, v) for t, v in zip(texts, verdicts) if v != "complete"]
        assert not bad, f"seed {seed}: {json.dumps(schema)}\n{bad[:3]}"
        checked += len(texts)
    assert checked > 500


def test_invalid_texts_are_not_complete(tmp_path):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string", "maxLength": 2},
                                               "e": {"enum": ["a", 1]}},
              "required": ["n"], "additionalProperties": False}
    texts = ['{"n": 1.5}', '{"s": "ab"}', '{"n": 1, "s": "abc"}', '{"n": 1, "e": "b"}', '{"n": 1, "x": 2}',
             '{"n": 01}', '{"n": 1', '[1]', '{"s": "a", "n": 1}']
    verdicts = grammar_check(schema_grammar(schema), texts, tmp_path)
    assert all(v != "complete" for v in verdicts), list(zip(texts, verdicts))
    assert grammar_check(schema_grammar(schema), ['{"n": 1, "s": "ab", "e": 1}'], tmp_path) == ["complete"]


def test_json_object_mode(tmp_path):
    rules, name = json_object_gbnf()
    g = gbnf.grammar(rules, name)
    ok = ['{}', '{"a": [1, 2.5e-3, {"b": null}], "c": "\\u00e9"}', '{ "x" : true }']
    bad = ['[]', '"x"', '{"a": tru}', '{"a": 1,}', "{'a': 1}"]
    verdicts = grammar_check(g, ok + bad, tmp_path)
    assert verdicts[:len(ok)] == ["complete"] * len(ok)
    assert all(v != "complete" for v in verdicts[len(ok):]), list(zip(bad, verdicts[len(ok):]))


def test_wrapped_grammar_for_tool_calls(tmp_path):
    rules, name = schema_to_gbnf({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
                                 prefix="t0-")
    assert all(line.startswith("t0-") for line in rules.splitlines())
    g = gbnf.wrap(rules, name, "<tool_call>\n", "\n</tool_call>")
    assert grammar_check(g, ['<tool_call>\n{"q": "hi"}\n</tool_call>', '{"q": "hi"}'], tmp_path) == \
        ["complete", "reject 0"]


@pytest.mark.parametrize("bounds", [
    {"minimum": 0}, {"minimum": 1}, {"minimum": -15, "maximum": 7}, {"minimum": 95, "maximum": 1203},
    {"exclusiveMinimum": -1.5, "exclusiveMaximum": 20}, {"maximum": -8}, {"minimum": 3, "maximum": 3},
    {"minimum": 2.5, "maximum": 99.9}, {"minimum": -1005, "maximum": -998},
])
def test_integer_bounds_are_exact(tmp_path, bounds):
    schema = {"type": "integer", **bounds}
    window = list(range(-1300, 1300)) + [10 ** 15, -(10 ** 15)]
    texts = [str(v) for v in window] + ["-0", "007", "1.0"]
    verdicts = grammar_check(schema_grammar(schema), texts, tmp_path)
    for v, verdict in zip(window, verdicts):
        assert (verdict == "complete") == valid(v, schema, schema), (bounds, v, verdict)
    assert all(v != "complete" for v in verdicts[len(window):])


def test_integer_bounds_with_no_integer_between_are_refused():
    with pytest.raises(SchemaError) as e:
        schema_to_gbnf({"type": "integer", "minimum": 2.1, "maximum": 2.9})
    assert e.value.keyword == "maximum"


@pytest.mark.parametrize("pattern,good,bad", PATTERNS)
def test_patterns_agree_with_python_re(tmp_path, pattern, good, bad):
    for s in good:
        assert re.search(pattern, s), s
    for s in bad:
        assert not re.search(pattern, s), s
    g = schema_grammar({"type": "string", "pattern": pattern})
    texts = [json.dumps(s, ensure_ascii=False) for s in good + bad]
    verdicts = grammar_check(g, texts, tmp_path)
    assert verdicts[:len(good)] == ["complete"] * len(good), list(zip(good, verdicts))
    assert all(v != "complete" for v in verdicts[len(good):]), list(zip(bad, verdicts[len(good):]))


@pytest.mark.parametrize("pattern", ["(?=a)b", "(a)\\1", "\\bword", "a*+", "^a|b^"])
def test_unsupported_patterns_say_so(pattern):
    with pytest.raises(PatternError):
        pattern_to_gbnf(pattern, "char")
    with pytest.raises(SchemaError) as e:
        schema_to_gbnf({"type": "string", "pattern": pattern})
    assert e.value.keyword == "pattern"


@pytest.mark.parametrize("schema,keyword,path", [
    ({"type": "number", "minimum": 3}, "minimum", "#"),
    ({"type": "integer", "minimum": "3"}, "minimum", "#"),
    ({"type": "object", "properties": {"a": {"type": "string", "format": "email", "minLength": 1,
                                             "pattern": "x"}}}, "minLength", "#/properties/a"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems", "#"),
    ({"type": "object", "patternProperties": {"^a": {}}}, "patternProperties", "#"),
    ({"type": "array", "prefixItems": [{}]}, "prefixItems", "#"),
    ({"not": {"type": "string"}}, "not", "#"),
    ({"allOf": [{"type": "string"}, {"maxLength": 3}]}, "allOf", "#"),
    ({"$ref": "https://example.com/s.json"}, "$ref", "#"),
    ({"$ref": "#/$defs/missing"}, "$ref", "#"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf", "#"),
    ({"oneOf": [{"type": "object", "properties": {"k": {"const": 1}}}, {"type": "object"}]}, "oneOf", "#"),
    ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "$ref", "#"),
    ({"type": "strin"}, "type", "#"),
    ({"type": "object", "properties": {}, "required": ["a"], "additionalProperties": False}, "required", "#"),
    ({"type": "array", "minItems": 3, "maxItems": 2}, "maxItems", "#"),
    (False, "false", "#"),
])
def test_out_of_subset_keywords_are_named(schema, keyword, path):
    with pytest.raises(SchemaError) as e:
        schema_to_gbnf(schema)
    assert e.value.keyword == keyword and e.value.path == path and f"'{keyword}'" in str(e.value)


def test_one_of_with_distinct_branches_is_allowed():
    assert schema_to_gbnf({"oneOf": [{"type": "string"}, {"type": "integer"}, {"enum": [True]}]})
    tagged = [{"type": "object", "properties": {"t": {"const": t}}, "required": ["t"]} for t in "ab"]
    assert schema_to_gbnf({"oneOf": tagged})


def test_recursive_refs_and_annotations(tmp_path):
    schema = {"$defs": {"node": {"type": "object", "title": "Node", "description": "a tree",
                                 "properties": {"v": {"type": "integer", "default": 0},
                                                "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                                 "required": ["v"], "additionalProperties": False}},
              "$ref": "#/$defs/node"}
    tree = {"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}, {"v": 4}]}
    assert grammar_check(schema_grammar(schema), [json.dumps(tree)], tmp_path) == ["complete"]
