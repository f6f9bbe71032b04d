"""Structured output: OpenAI `response_format` (json_object, json_schema) and the `grammar`
extension (GBNF text) -> the engine's grammar option (docs/protocol.md, "Grammar")."""
from colibri.grammar import SchemaError, gbnf, json_object_gbnf, schema_to_gbnf
from colibri.chat.params import bad, unsupported

# What a thinking model's open reasoning block gets before the constrained answer: the block
# closes at once (what enable_thinking=false renders), so the answer is not taken for reasoning.
CLOSE_THINK = "</think>\n\n"


def grammar_for(body, in_reasoning=False):
    """The GBNF text the request asks for (None: unconstrained). Raises ApiError (400). A
    response_format answer after an open reasoning block (in_reasoning) closes the block first;
    a `grammar` is the whole output, as the caller wrote it."""
    g = body.get("grammar")
    rf = body.get("response_format")
    if g is not None:
        if not isinstance(g, str) or not g.strip():
            raise bad("'grammar' must be a non-empty string of GBNF rules with a 'root' rule", param="grammar",
                      code="invalid_type" if not isinstance(g, str) else "invalid_value")
        if rf is not None and not (isinstance(rf, dict) and rf.get("type") == "text"):
            raise bad("give either 'grammar' or 'response_format', not both", param="grammar")
        return g
    if rf is None:
        return None
    if not isinstance(rf, dict):
        raise bad("'response_format' must be an object", param="response_format", code="invalid_type")
    kind = rf.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        rules, name = json_object_gbnf()
        return gbnf.wrap(rules, name, CLOSE_THINK if in_reasoning else "")
    if kind != "json_schema":
        raise bad("'response_format.type' must be 'text', 'json_object' or 'json_schema'", param="response_format.type")
    js = rf.get("json_schema")
    if not isinstance(js, dict):
        raise bad("'response_format.json_schema' must be an object with 'name' and 'schema'",
                  param="response_format.json_schema", code="invalid_type")
    name = js.get("name")
    if name is not None and not isinstance(name, str):
        raise bad("'response_format.json_schema.name' must be a string", param="response_format.json_schema.name",
                  code="invalid_type")
    schema = js.get("schema", {})
    if not isinstance(schema, (dict, bool)):
        raise bad("'response_format.json_schema.schema' must be a JSON Schema object",
                  param="response_format.json_schema.schema", code="invalid_type")
    try:
        rules, root = schema_to_gbnf(schema)
    except SchemaError as e:
        raise unsupported(f"{e}; colibri constrains output to a JSON Schema subset", code="unsupported_schema",
                          param="response_format.json_schema.schema" + ("" if e.path == "#" else e.path[1:].replace("/", ".")))
    return gbnf.wrap(rules, root, CLOSE_THINK if in_reasoning else "")


def apply(spec, body):
    """Puts the request's grammar (if any) on the generation spec."""
    g = grammar_for(body, spec.in_reasoning)
    if g is not None:
        spec.opts["grammar"] = g
