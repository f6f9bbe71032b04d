"""Size and depth limits for JSON Schemas that clients send (response_format, tools,
tool_choice): the compiler walks a schema recursively, so a schema nested a few hundred levels
deep would overflow the interpreter's stack. `check` measures a schema without recursion and
raises SchemaLimit naming the limit; the compiler also counts its own nesting, which `$ref`
chains can make deeper than the document."""
from colibri.grammar.errors import SchemaError

MAX_DEPTH = 64          # nested schemas (items, properties, anyOf, $ref, ...) along one path
MAX_JSON_DEPTH = 2 * MAX_DEPTH + 8   # JSON containers along one path ({"items": {...}} is two per schema)
MAX_NODES = 20_000      # JSON values in one schema


class SchemaLimit(SchemaError):
    """A schema over a size or depth limit; `limit` names it."""

    def __init__(self, limit, why):
        super().__init__(limit, "#", why)
        self.args = (f"JSON schema over the {limit} limit: {why}",)
        self.limit = limit


def too_deep():
    return SchemaLimit("depth", f"the schema nests deeper than the limit of {MAX_DEPTH} schemas "
                                f"({MAX_JSON_DEPTH} JSON levels, $ref chains included); flatten it")


def check(schema):
    """Raises SchemaLimit when `schema` (any JSON value) is nested too deep or too large."""
    stack, nodes = [(schema, 1)], 0
    while stack:
        v, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise SchemaLimit("size", f"the schema has more than {MAX_NODES} JSON values (limit {MAX_NODES}); "
                                      f"send a smaller schema")
        if isinstance(v, dict):
            children = v.values()
        elif isinstance(v, list):
            children = v
        else:
            continue
        if depth > MAX_JSON_DEPTH:
            raise too_deep()
        stack.extend((c, depth + 1) for c in children)
