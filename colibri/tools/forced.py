"""GBNF for a forced tool call (tool_choice "required" or a named function): the family's own
call syntax around arguments valid under the tool's JSON schema, so that even a weak model
emits a call the parser reads back and the schema accepts. The engine ends the turn once the
grammar is complete (docs/protocol.md, Grammar)."""
from colibri.grammar import SchemaError, gbnf, schema_to_gbnf
from colibri.server.params import bad
from colibri.tools import formats

RAW_TEXT = '[^<]*'  # an XML-style string value: anything up to the next tag


def _args(schema, prefix, rules, param):
    try:
        text, name = schema_to_gbnf(schema, prefix=prefix)
    except SchemaError as e:
        raise bad(f"'{param}' cannot force a call: {e}; drop the keyword or use tool_choice 'auto'",
                  param=param, code="unsupported_schema") from None
    rules.append(text)
    return name


def _json_call(fmt, name, args, v3_fences):
    lit = gbnf.literal
    quoted = formats._dumps(name)
    if fmt is formats.HERMES:
        head, tail = '<tool_call>\n{"name": ' + quoted + ', "arguments": ', '}\n</tool_call>'
        return f"{lit(head)} {args} {lit(tail)}"
    if fmt is formats.LLAMA3_JSON:
        head = '{"name": ' + quoted + ', "parameters": '
        return f"{lit(head)} {args} {lit('}')}"
    if fmt is formats.DEEPSEEK:
        if v3_fences:
            head = f"{formats.DS_CALL_BEGIN}function{formats.DS_SEP}{name}\n```json\n"
            return f"{lit(head)} {args} {lit(chr(10) + '```' + formats.DS_CALL_END)}"
        return f"{lit(formats.DS_CALL_BEGIN + name + formats.DS_SEP)} {args} {lit(formats.DS_CALL_END)}"
    if fmt is formats.HARMONY:
        return f"{lit('<|channel|>commentary to=functions.' + name + ' <|constrain|>json<|message|>')} {args} " \
               f"{lit('<|call|>')}"
    raise ValueError(fmt.name)


def _glm_call(name, schema, prefix, rules, param, newlines):
    """GLM writes one <arg_key>/<arg_value> pair per argument: a string value raw, others JSON."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    props = props if isinstance(props, dict) else {}
    required = set(schema.get("required") or []) if isinstance(schema, dict) else set()
    nl = "\n" if newlines else ""
    parts = [gbnf.literal(f"<tool_call>{name}{nl}")]
    for i, (key, sub) in enumerate(props.items()):
        if isinstance(sub, dict) and formats._is_string_schema(sub) and not ({"enum", "const", "pattern"} & set(sub)):
            value = RAW_TEXT
        else:
            value = _args(sub if isinstance(sub, dict) else {}, f"{prefix}a{i}-", rules, f"{param}.properties.{key}")
        pair = f"{gbnf.literal(f'<arg_key>{key}</arg_key>{nl}<arg_value>')} {value} {gbnf.literal('</arg_value>' + nl)}"
        parts.append(pair if key in required else f"({pair})?")
    parts.append(gbnf.literal("</tool_call>"))
    return " ".join(parts)


def call_grammar(spec, template_source="", in_reasoning=False):
    """The GBNF that forces spec's call(s): the named function, or any of the tools for
    "required" (one or more when parallel calls are allowed)."""
    fmt, source = spec.fmt, template_source or ""
    names = [spec.name] if spec.choice == "function" else list(spec.schemas)
    rules, alts = [], []
    for i, name in enumerate(names):
        param = f"tools[{list(spec.schemas).index(name)}].function.parameters"
        schema, prefix = spec.schemas[name], f"tc{i}-"
        if fmt is formats.GLM:
            alts.append(_glm_call(name, schema, prefix, rules, param, "</arg_key>\n" in source))
        else:
            alts.append(_json_call(fmt, name, _args(schema, prefix, rules, param), "```json" in source))
    rules.append("tc-call ::= " + " | ".join(f"( {a} )" for a in alts) + "\n")
    many = spec.parallel and fmt in (formats.HERMES, formats.GLM, formats.DEEPSEEK)
    sep = '"\\n"' if fmt in (formats.HERMES, formats.GLM) else ""
    body = f"tc-call ( {sep} tc-call )*" if many else "tc-call"
    if fmt is formats.DEEPSEEK:
        body = f"{gbnf.literal(formats.DS_CALLS_BEGIN)} {body} {gbnf.literal(formats.DS_CALLS_END)}"
    if in_reasoning:  # the prompt opened a thinking block: close it at once, then call
        body = f"{gbnf.literal('</think>')} {body}"
    return gbnf.grammar("".join(rules), body)
