"""The tool side of a chat request: tool definitions and tool_choice from the OpenAI or the
Anthropic dialect checked and normalized to one ToolSpec, and the calls of earlier turns made
ready for the chat template (which reads OpenAI-shaped `tool_calls` with mapping arguments)."""
import json
import re
import uuid
from dataclasses import dataclass

from colibri.grammar import SchemaError, schema_limits
from colibri.chat.params import bad, unsupported
from colibri.toolcall import formats
from colibri.toolcall.stream import ToolCallFilter

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
EMPTY_PARAMS = {"type": "object", "properties": {}}


@dataclass
class ToolSpec:
    tools: list                 # OpenAI-shaped definitions, as the chat templates read them
    schemas: dict               # function name -> JSON schema of its arguments
    choice: str = "auto"        # none | auto | required | function
    name: str = None            # the function tool_choice names
    parallel: bool = True
    fmt: formats.Format = None
    grammar: str = None         # GBNF that forces the call (required / named), when built

    @property
    def parses(self):
        return self.choice != "none"

    def filter(self):
        return ToolCallFilter(self.fmt, self.schemas, max_calls=None if self.parallel else 1)


def call_id(prefix="call_"):
    return prefix + uuid.uuid4().hex[:24]


def tool_format(model, param):
    """The family's Format, or a 400 saying the family has none."""
    name = getattr(model, "tool_format", None)
    if not name:
        fam = getattr(model, "family_display", None) or "this model's family"
        raise unsupported(f"tool calling is not supported for {fam}: colibri knows no tool-call format for it "
                          f"(send the request without tools)", param=param, code="tools_unsupported")
    return formats.get(name)


def _definition(name, description, params, param):
    if not isinstance(name, str) or not NAME.match(name):
        raise bad(f"'{param}.name' must be 1 to 64 letters, digits, '_' or '-'", param=f"{param}.name")
    if params is None:
        params = dict(EMPTY_PARAMS)
    if not isinstance(params, dict):
        raise bad(f"'{param}' parameters must be a JSON schema object", param=param, code="invalid_type")
    if description is not None and not isinstance(description, str):
        raise bad(f"'{param}.description' must be a string", param=f"{param}.description", code="invalid_type")
    try:
        schema_limits.check(params)
    except SchemaError as e:
        raise bad(f"'{param}' parameters: {e}", param=param, code="unsupported_schema") from None
    fn = {"name": name, "parameters": params}
    if description:
        fn["description"] = description
    return {"type": "function", "function": fn}


def _spec(defs, param, model):
    if not isinstance(defs, list):
        raise bad(f"'{param}' must be a list", param=param, code="invalid_type")
    fmt = tool_format(model, param)
    schemas = {}
    for i, d in enumerate(defs):
        name = d["function"]["name"]
        if name in schemas:
            raise bad(f"'{param}[{i}]': the function name {name!r} is defined twice", param=f"{param}[{i}]")
        schemas[name] = d["function"]["parameters"]
    return ToolSpec(tools=defs, schemas=schemas, fmt=fmt)


def openai_tools(body, model):
    """`tools`/`tool_choice`/`parallel_tool_calls` (and the legacy `functions`/`function_call`)
    -> ToolSpec, or None when the request brings no tools."""
    raw, param = body.get("tools"), "tools"
    if raw is None and body.get("functions") is not None:
        raw, param = body.get("functions"), "functions"
        if isinstance(raw, list):
            raw = [{"type": "function", "function": f} for f in raw]
    choice = body.get("tool_choice") if body.get("tool_choice") is not None else body.get("function_call")
    cparam = "tool_choice" if body.get("tool_choice") is not None else "function_call"
    if not raw:
        if choice not in (None, "none", "auto"):
            raise bad(f"'{cparam}' names a tool but the request defines none in 'tools'", param=cparam)
        return None
    if not isinstance(raw, list):
        raise bad(f"'{param}' must be a list of tools", param=param, code="invalid_type")
    defs = []
    for i, t in enumerate(raw):
        p = f"{param}[{i}]"
        if not isinstance(t, dict):
            raise bad(f"'{p}' must be an object", param=p, code="invalid_type")
        if t.get("type", "function") != "function":
            raise unsupported(f"'{p}.type' is {t.get('type')!r}: only 'function' tools are supported", param=p)
        fn = t.get("function")
        if not isinstance(fn, dict):
            raise bad(f"'{p}.function' must be an object", param=f"{p}.function", code="invalid_type")
        defs.append(_definition(fn.get("name"), fn.get("description"), fn.get("parameters"), f"{p}.function"))
    spec = _spec(defs, param, model)
    if choice is None or choice == "auto":
        spec.choice = "auto"
    elif choice in ("none", "required"):
        spec.choice = choice
    elif isinstance(choice, dict):
        # {"type": "function", "function": {"name": ...}}; the Responses API's flat {"type": "function", "name": ...}
        fn = (choice.get("function") or choice) if cparam == "tool_choice" else choice
        if cparam == "tool_choice" and choice.get("type") != "function":
            raise bad("'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", "
                      "\"function\": {\"name\": ...}}", param="tool_choice")
        name = fn.get("name") if isinstance(fn, dict) else None
        _named(spec, name, cparam)
    else:
        raise bad(f"'{cparam}' must be 'none', 'auto', 'required' or a named function", param=cparam)
    par = body.get("parallel_tool_calls")
    if par is not None and not isinstance(par, bool):
        raise bad("'parallel_tool_calls' must be a boolean", param="parallel_tool_calls", code="invalid_type")
    spec.parallel = par is not False and spec.choice != "function"
    return spec


def _named(spec, name, param):
    if name not in spec.schemas:
        raise bad(f"'{param}' names the function {name!r}, which is not in 'tools' (defined: "
                  f"{', '.join(sorted(spec.schemas))})", param=param)
    spec.choice, spec.name = "function", name


def anthropic_tools(body, model):
    """Anthropic `tools` / `tool_choice` -> ToolSpec, or None without tools."""
    raw, choice = body.get("tools"), body.get("tool_choice")
    if choice is not None and (not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none")):
        raise bad("tool_choice.type must be 'auto', 'any', 'tool' or 'none'", param="tool_choice")
    if not raw:
        if choice is not None and choice["type"] in ("any", "tool"):
            raise bad("tool_choice asks for a tool but the request defines none in 'tools'", param="tool_choice")
        return None
    if not isinstance(raw, list):
        raise bad("tools: must be a list", param="tools", code="invalid_type")
    defs = []
    for i, t in enumerate(raw):
        p = f"tools.{i}"
        if not isinstance(t, dict):
            raise bad(f"{p}: must be an object", param=p, code="invalid_type")
        if t.get("type") not in (None, "custom"):
            raise unsupported(f"{p}: server tool {t.get('type')!r} is not supported by colibri; define a custom "
                              f"tool with name and input_schema", param=p)
        if not isinstance(t.get("input_schema"), dict):
            raise bad(f"{p}.input_schema: Field required (a JSON schema object)", param=f"{p}.input_schema")
        defs.append(_definition(t.get("name"), t.get("description"), t["input_schema"], p))
    spec = _spec(defs, "tools", model)
    kind = (choice or {}).get("type", "auto")
    spec.choice = {"auto": "auto", "any": "required", "none": "none"}.get(kind, "function")
    if kind == "tool":
        _named(spec, choice.get("name"), "tool_choice.name")
    dp = (choice or {}).get("disable_parallel_tool_use", False)
    if not isinstance(dp, bool):
        raise bad("tool_choice.disable_parallel_tool_use must be a boolean", param="tool_choice")
    spec.parallel = not dp and spec.choice != "function"
    return spec


def history_call(name, arguments, cid, param):
    """One earlier call, OpenAI-shaped for the template, arguments as a mapping (the templates
    write them with tojson or walk their items)."""
    if not isinstance(name, str) or not name:
        raise bad(f"'{param}' needs the function's name", param=param)
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError as e:
            raise bad(f"'{param}' arguments are not valid JSON ({e}); send the JSON text the model produced",
                      param=param) from None
    if not isinstance(arguments, dict):
        raise bad(f"'{param}' arguments must be a JSON object", param=param, code="invalid_type")
    return {"id": cid if isinstance(cid, str) else call_id(), "type": "function",
            "function": {"name": name, "arguments": arguments}}


def openai_history_calls(m, i):
    """An OpenAI assistant message's tool_calls (or legacy function_call) -> template calls."""
    calls = m.get("tool_calls")
    if calls is None and isinstance(m.get("function_call"), dict):
        fc = m["function_call"]
        return [history_call(fc.get("name"), fc.get("arguments", "{}"), None, f"messages[{i}].function_call")]
    if not isinstance(calls, list):
        raise bad(f"'messages[{i}].tool_calls' must be a list", param=f"messages[{i}].tool_calls", code="invalid_type")
    out = []
    for j, c in enumerate(calls):
        p = f"messages[{i}].tool_calls[{j}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict):
            raise bad(f"'{p}.function' must be an object with name and arguments", param=p, code="invalid_type")
        out.append(history_call(fn.get("name"), fn.get("arguments", "{}"), c.get("id"), f"{p}.function"))
    return out


def with_string_arguments(chat):
    """The same conversation with each call's arguments as JSON text: the original DeepSeek-V3
    template concatenates them as a string, which a mapping cannot be."""
    out = []
    for m in chat:
        if m.get("tool_calls"):
            m = dict(m, tool_calls=[dict(c, function=dict(c["function"], arguments=json.dumps(
                c["function"]["arguments"], ensure_ascii=False))) for c in m["tool_calls"]])
        out.append(m)
    return out


def has_calls(chat):
    return any(m.get("tool_calls") or m.get("role") == "tool" for m in chat)
