"""GBNF for a forced tool call (tool_choice "required" or a named function): the family's own
call syntax around arguments valid under the tool's JSON schema, so that even a weak model
emits a call the parser reads back and the schema accepts. The engine ends the turn once the
grammar is complete (docs/protocol.md, Grammar)."""
from colibri.grammar import SchemaError, gbnf, schema_to_gbnf
from colibri.chat.params import bad
from colibri.toolcall import formats

NL = "\n"
RAW_CHAR = "[^<]"  # an XML-style string value: anything up to the next tag
RAW_TEXT = RAW_CHAR + "*"


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
    quoted = formats.dumps(name)
    if fmt is formats.HERMES:
        head, tail = '<tool_call>\n{"name": ' + quoted + ', "arguments": ', '}\n</tool_call>'
        return f"{lit(head)} {args} {lit(tail)}"
    if fmt is formats.LLAMA3_JSON:
        head = '{"name": ' + quoted + ', "parameters": '
        return f"{lit(head)} {args} {lit('}')}"
    if fmt is formats.DEEPSEEK:
        if v3_fences:
            head, tail = f"{formats.DS_CALL_BEGIN}function{formats.DS_SEP}{name}\n```json\n", "\n```" + formats.DS_CALL_END
            return f"{lit(head)} {args} {lit(tail)}"
        return f"{lit(formats.DS_CALL_BEGIN + name + formats.DS_SEP)} {args} {lit(formats.DS_CALL_END)}"
    if fmt is formats.HARMONY:
        return f"{lit('<|channel|>commentary to=functions.' + name + ' <|constrain|>json<|message|>')} {args} " \
               f"{lit('<|call|>')}"
    raise ValueError(fmt.name)


def _raw_string(sub, param):
    """A string argument written raw between tags (GLM, DSML): text without '<', its length
    bounded as the schema says; enum / const as the literal choices."""
    if "enum" in sub or "const" in sub:
        values = sub["enum"] if "enum" in sub else [sub["const"]]
        if all(isinstance(v, str) for v in values):
            return "( " + " | ".join(gbnf.literal(v) for v in values) + " )"
    extra = sorted(set(sub) & {"pattern", "format", "enum", "const"})
    if extra:
        raise bad(f"'{param}' cannot force a call: '{extra[0]}' on a string this family writes as raw text is not "
                  f"supported; drop the keyword or use tool_choice 'auto'", param=param, code="unsupported_schema")
    lo, hi = int(sub.get("minLength", 0)), sub.get("maxLength")
    return f"{RAW_CHAR}{{{lo},{'' if hi is None else int(hi)}}}" if lo or hi is not None else RAW_TEXT


def _xml_args(schema, prefix, rules, param, pair, special=None):
    """One part per declared property in order (optional ones optional); `pair(key, value_rule,
    raw)` spells a key and its value (raw: a string written as text, else JSON); `special(sub)`
    -> a family's own rule for a value, or None for the usual one."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    props = props if isinstance(props, dict) else {}
    required = set(schema.get("required") or []) if isinstance(schema, dict) else set()
    parts = []
    for i, (key, sub) in enumerate(props.items()):
        sub = sub if isinstance(sub, dict) else {}
        p = f"{param}.properties.{key}"
        raw = formats.is_string_schema(sub)
        value = (special and special(sub)) or (_raw_string(sub, p) if raw else _args(sub, f"{prefix}a{i}-", rules, p))
        one = pair(key, value, raw)
        parts.append(one if key in required else f"( {one} )?")
    return parts


def _glm_call(name, schema, prefix, rules, param, newlines):
    """GLM writes one <arg_key>/<arg_value> pair per argument: a string value raw, others JSON."""
    nl = "\n" if newlines else ""
    lit = gbnf.literal

    def pair(key, value, raw):
        return f"{lit(f'<arg_key>{key}</arg_key>{nl}<arg_value>')} {value} {lit('</arg_value>' + nl)}"
    parts = [lit(f"<tool_call>{name}{nl}")] + _xml_args(schema, prefix, rules, param, pair) + [lit("</tool_call>")]
    return " ".join(parts)


def _qwen_bool(sub):
    """The Qwen3.5 template writes a boolean with Jinja's `string` filter: "True" / "False"."""
    if sub.get("type") == "boolean" and not set(sub) & {"enum", "const"}:
        return '( "true" | "false" | "True" | "False" )'
    return None


def _qwen_xml_call(name, schema, prefix, rules, param):
    """Qwen3.5: <function=N> with one <parameter=K> element per argument, the value on its own lines."""
    lit = gbnf.literal

    def pair(key, value, raw):
        return f"{lit(f'<parameter={key}>' + NL)} {value} {lit(NL + '</parameter>' + NL)}"
    parts = [lit(f"<tool_call>\n<function={name}>\n")] + \
        _xml_args(schema, prefix, rules, param, pair, _qwen_bool) + [lit("</function>\n</tool_call>")]
    return " ".join(parts)


def _dsml_call(name, schema, prefix, rules, param, v4):
    """DeepSeek-V3.2 / V4: <｜DSML｜invoke name="N"> with one parameter element per argument (V4 writes an
    empty line in a call without arguments)."""
    lit, d = gbnf.literal, formats.DSML

    def pair(key, value, raw):
        head = f'<{d}parameter name="{key}" string="{"true" if raw else "false"}">'
        return f"{lit(head)} {value} {lit(f'</{d}parameter>' + NL)}"
    parts = [lit(f'<{d}invoke name="{name}">\n')] + _xml_args(schema, prefix, rules, param, pair) + \
        (['"\\n"?'] if v4 else []) + [lit(f"</{d}invoke>\n")]
    return " ".join(parts)


def _minimax_call(name, schema, prefix, rules, param):
    """MiniMax-M2: <invoke name="N"> with one <parameter name="K"> element per argument, one per line."""
    lit = gbnf.literal

    def pair(key, value, raw):
        head = f'<parameter name="{key}">'
        return f"{lit(head)} {value} {lit('</parameter>' + NL)}"
    parts = [lit(f'<invoke name="{name}">\n')] + _xml_args(schema, prefix, rules, param, pair) + \
        [lit("</invoke>\n")]
    return " ".join(parts)


def call_grammar(spec, template_source="", in_reasoning=False):
    """The GBNF that forces spec's call(s): the named function, or any of the tools for
    "required" (one or more when parallel calls are allowed)."""
    fmt, source = spec.fmt, template_source or ""
    names = [spec.name] if spec.choice == "function" else list(spec.schemas)
    rules, alts = [], []
    dsml = fmt is formats.DEEPSEEK and formats.DSML in source
    dsml_v4 = dsml and "tool_calls>" in source  # V4's template names the block tool_calls, V3.2's function_calls
    fences = fmt is formats.DEEPSEEK and "```json" in source
    glm_lines = fmt is formats.GLM and "</arg_key>\n" in source
    for i, name in enumerate(names):
        param = f"tools[{list(spec.schemas).index(name)}].function.parameters"
        schema, prefix = spec.schemas[name], f"tc{i}-"
        if fmt is formats.GLM:
            alts.append(_glm_call(name, schema, prefix, rules, param, glm_lines))
        elif fmt is formats.QWEN_XML:
            alts.append(_qwen_xml_call(name, schema, prefix, rules, param))
        elif dsml:
            alts.append(_dsml_call(name, schema, prefix, rules, param, dsml_v4))
        elif fmt is formats.MINIMAX:
            alts.append(_minimax_call(name, schema, prefix, rules, param))
        else:
            alts.append(_json_call(fmt, name, _args(schema, prefix, rules, param), fences))
    rules.append("tc-call ::= " + " | ".join(f"( {a} )" for a in alts) + "\n")
    many = spec.parallel and fmt in (formats.HERMES, formats.GLM, formats.QWEN_XML, formats.DEEPSEEK, formats.MINIMAX)
    # what the templates write between two calls
    sep = '"\\n" ' if fmt in (formats.HERMES, formats.QWEN_XML) or glm_lines or fences else ""
    body = f"tc-call ( {sep}tc-call )*" if many else "tc-call"
    if dsml:
        begin, end = (formats.DSML_V4_BEGIN, formats.DSML_V4_END) if dsml_v4 else (formats.DSML_BEGIN, formats.DSML_END)
        body = f'"\\n\\n"? {gbnf.literal(begin + NL)} {body} {gbnf.literal(end)}'
    elif fmt is formats.MINIMAX:  # the template writes "\n\n" after </think> and "\n" before the block
        body = f'"\\n"{{0,3}} {gbnf.literal(formats.MINIMAX_BEGIN + NL)} {body} {gbnf.literal(formats.MINIMAX_END)}'
    elif fmt is formats.DEEPSEEK:
        body = f"{gbnf.literal(formats.DS_CALLS_BEGIN)} {body} {gbnf.literal(formats.DS_CALLS_END)}"
    if in_reasoning:  # the prompt opened a thinking block: close it at once, then call
        body = f"{gbnf.literal('</think>')} {body}"
    return gbnf.grammar("".join(rules), body)
