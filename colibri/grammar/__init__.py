"""Constrained decoding support: GBNF builders and the JSON Schema -> GBNF compiler.

    rules, name = schema_to_gbnf(schema, prefix="t0-")   # rules for one JSON value
    text = gbnf.wrap(rules, name, "<tool_call>\\n", "\\n</tool_call>")
    engine.submit(prompt, grammar=text)                  # SUBMIT ... grammar=N (docs/protocol.md)
"""
from colibri.grammar import gbnf
from colibri.grammar.json_schema import SchemaError, json_object_gbnf, schema_grammar, schema_to_gbnf

__all__ = ["gbnf", "SchemaError", "json_object_gbnf", "schema_grammar", "schema_to_gbnf"]
