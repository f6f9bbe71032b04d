"""Deep or huge JSON Schemas from clients are a 400 `unsupported_schema` naming the limit, in
every place a schema enters (response_format on both endpoints, tools, tool_choice required,
Anthropic tool_choice any), never a 500 from the compiler's recursion."""
import pytest

from colibri.grammar import SchemaError, schema_limits, schema_to_gbnf
from server_helpers import ServerProc, model, post_json, template  # noqa: F401

MID = "qwen3_moe"
ASK = [{"role": "user", "content": "hi"}]


def nested_items(n):
    s = {"type": "string"}
    for _ in range(n):
        s = {"type": "array", "items": s}
    return s


def nested_any_of(n):
    s = {"type": "string"}
    for _ in range(n):
        s = {"anyOf": [s, {"type": "null"}]}
    return s


def ref_chain(n):
    """Shallow as a document, but each $ref nests one level deeper in the compiler."""
    defs = {f"a{i}": {"type": "array", "items": {"$ref": f"#/$defs/a{i + 1}"}} for i in range(n)}
    defs[f"a{n}"] = {"type": "string"}
    return {"type": "object", "properties": {"x": {"$ref": "#/$defs/a0"}}, "$defs": defs}


HUGE = {"enum": [f"v{i}" for i in range(schema_limits.MAX_NODES + 1)]}


def obj(schema):
    """Tool parameters are an object schema; $defs stay at its root."""
    return schema if schema.get("type") == "object" else {"type": "object", "properties": {"x": schema}}


def rf(schema):
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def openai_tools(schema, choice):
    return {"tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}], "tool_choice": choice}


@pytest.mark.parametrize("schema,limit", [(nested_items(300), "depth"), (nested_any_of(400), "depth"),
                                          (ref_chain(200), "depth"), (HUGE, "size")])
def test_the_compiler_refuses_with_the_limit(schema, limit):
    with pytest.raises(SchemaError) as e:
        schema_to_gbnf(schema)
    assert isinstance(e.value, schema_limits.SchemaLimit) and e.value.limit == limit
    assert f"{limit} limit" in str(e.value)


def test_schemas_within_the_limits_still_compile():
    for s in (nested_items(schema_limits.MAX_DEPTH - 2), nested_any_of(schema_limits.MAX_DEPTH // 2 - 2),
              ref_chain(schema_limits.MAX_DEPTH // 2 - 2)):
        rules, root = schema_to_gbnf(s)
        assert root in rules


@pytest.fixture(scope="module")
def server(model, template):  # noqa: F811
    with ServerProc(model, "--chat-template", template, "--no-kv-persist") as s:
        yield s


ENTRIES = [
    ("/v1/chat/completions", lambda s: {"messages": ASK, "response_format": rf(s)}),
    ("/v1/completions", lambda s: {"prompt": "hi", "response_format": rf(s)}),
    ("/v1/chat/completions", lambda s: {"messages": ASK, **openai_tools(obj(s), "required")}),
    ("/v1/chat/completions", lambda s: {"messages": ASK, **openai_tools(obj(s), "auto")}),
    ("/v1/messages", lambda s: {"messages": ASK, "max_tokens": 4, "tool_choice": {"type": "any"},
                                "tools": [{"name": "f", "input_schema": obj(s)}]}),
]


@pytest.mark.parametrize("entry", range(len(ENTRIES)))
@pytest.mark.parametrize("schema,limit", [(nested_items(300), "depth"), (nested_any_of(400), "depth"),
                                          (HUGE, "size")])
def test_every_entry_answers_400_naming_the_limit(server, entry, schema, limit):
    path, body = ENTRIES[entry]
    status, _, out = post_json(server.port, path, {"model": MID, "max_tokens": 4, **body(schema)})
    assert status == 400, out
    err = out["error"]
    if path != "/v1/messages":  # Anthropic's error shape has a type and a message, no code
        assert err["code"] == "unsupported_schema", out
    assert f"{limit} limit" in err["message"], out


@pytest.mark.parametrize("entry", [0, 2, 4])
def test_ref_chains_are_counted_where_a_grammar_is_built(server, entry):
    path, body = ENTRIES[entry]
    status, _, out = post_json(server.port, path, {"model": MID, "max_tokens": 4, **body(ref_chain(200))})
    assert status == 400 and "depth limit" in out["error"]["message"], out
    assert server.health()["status"] == "ok"
