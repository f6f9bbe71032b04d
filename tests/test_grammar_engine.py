"""Constrained decoding end to end: a real engine on tiny random-weight models, driven through
engine_client with `grammar=` (docs/protocol.md). Over many random schemas and seeds the output
always parses and validates, even when max_tokens is short (the grammar closes what it opened
within the budget), and never dead-ends. Runs against the release and the ASan+UBSan builds."""
import json
import random
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from colibri import engine_client
from colibri.grammar import schema_grammar
from engine_binaries import assert_clean_exit, engine_bin  # noqa: F401
from grammar_schemas import grammar_check, random_root

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def every_binary(engine_bin):  # noqa: F811
    return engine_bin


@pytest.fixture(scope="module", params=["qwen3_moe", "llama"])
def model(request, oracle_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("grammar") / request.param
    subprocess.run([sys.executable, str(ROOT / "coli"), "convert", str(Path(oracle_root) / request.param / "hf"),
                    str(out), "--experts", "bf16", "--dense", "bf16"], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def engine(model):
    with engine_client.Engine(model, ctx=512) as eng:
        yield eng
    assert_clean_exit(eng)


def generate(eng, prompt, **opts):
    text, end = b"", None
    for ev in eng.generate(prompt, **opts):
        if ev[0] == "data":
            text += ev[2]
        elif ev[0] == "end":
            end = ev[1]
    return text.decode(), end


def test_random_schemas_always_give_valid_json(engine, engine_bin, tmp_path):  # noqa: F811
    n = 40 if engine_bin.name == "colibri" else 8  # the sanitizer build is slow
    for seed in range(n):
        schema = random_root(random.Random(1000 + seed))
        g = schema_grammar(schema)
        need = int(grammar_check(g, [""], tmp_path)[0].split()[1])  # bytes the shortest output has
        # the second run gets barely enough tokens: the grammar must steer to a close in time
        for opts in ({"temp": 1.0, "seed": seed, "max_tokens": max(120, need)}, {"temp": 0, "max_tokens": need + 1}):
            text, end = generate(engine, "Reply in JSON.", grammar=g, **opts)
            try:
                value = json.loads(text)
            except ValueError:
                pytest.fail(f"seed {seed} {opts}: not JSON ({end['finish']}): {text!r}\nschema {json.dumps(schema)}")
            jsonschema.validate(value, schema)
            assert end["finish"] in ("stop", "length") and int(end["completion_tokens"]) <= opts["max_tokens"]


def test_eos_only_when_complete_and_stop_when_finished(engine):
    for seed in range(10):
        text, end = generate(engine, "Hi", grammar='root ::= [a-z]{3,5} "!"?', temp=1.5, seed=seed, max_tokens=50)
        assert 3 <= len(text.rstrip("!")) <= 5 and text.rstrip("!").isalpha(), text
        assert end["finish"] == "stop"
    text, end = generate(engine, "Hi", grammar='root ::= "yes" | "no"', temp=1.0, seed=3)
    assert text in ("yes", "no") and end["finish"] == "stop" and "grammar_ms" in end


def test_budget_closes_what_was_opened(engine):
    # an unbounded list of strings with only 12 tokens: the grammar still ends it
    g = schema_grammar({"type": "array", "items": {"type": "string"}, "minItems": 1})
    for seed in range(6):
        text, end = generate(engine, "List", grammar=g, temp=1.0, seed=seed, max_tokens=12)
        assert isinstance(json.loads(text), list) and int(end["completion_tokens"]) <= 12, text


def test_grammar_with_token_ids_and_literal_spans(engine):
    ids_text, _ = generate(engine, [1, 2, 3], grammar='root ::= "ok"')
    lit = "0-3"
    text, _ = generate(engine, lit + "abcd", literal=len(lit), grammar='root ::= "ok"')
    assert ids_text == text == "ok"


def test_same_grammar_again_is_served_warm(engine):
    g = schema_grammar({"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]})
    first = [generate(engine, "x", grammar=g, temp=0)[1] for _ in range(2)]
    assert int(first[1]["grammar_masks"]) <= int(first[0]["grammar_masks"])
    assert generate(engine, "x", grammar=g, temp=0)[0] == generate(engine, "x", grammar=g, temp=0)[0]


@pytest.mark.parametrize("grammar,needle", [
    ("root ::= foo", "grammar: at byte 9: rule 'foo' is used but never defined"),
    ("root ::= \"a", "grammar: at byte 9: unterminated string literal"),
    ("root ::= root \"x\" | \"y\"", "left recursion"),
    ("x ::= \"a\"", "no 'root' rule"),
])
def test_bad_grammar_is_a_bad_request_naming_the_place(engine, grammar, needle):
    with pytest.raises(engine_client.EngineError) as e:
        generate(engine, "x", grammar=grammar)
    assert e.value.kind == "bad_request" and needle in e.value.message
    assert generate(engine, "x", grammar='root ::= "z"')[0] == "z"  # the engine goes on serving
