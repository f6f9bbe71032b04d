"""Tool-call syntaxes of each model family: where a call starts and ends in the generated text,
and how a complete call region parses into structured calls.

A call is {"name": str, "arguments": dict}. A region that does not parse is not a call: its text
stays visible content, so nothing the model wrote is ever lost. `schemas` (tool name -> the JSON
schema of its parameters) lets the XML-style formats keep a string parameter a string even when
its text looks like a number ("123")."""
import json
import re

from colibri.toolcall.stream import ToolCallFilter


class Format:
    """One family's syntax. `starts`: markers that open a call region; `start_only`: calls are
    recognized only at the very beginning of the answer (Llama's bare JSON, which prose may also
    contain); `find_end(buf)` -> index just past the region that starts `buf`, or -1 while it is
    incomplete; `parse(region, schemas, final)` -> list of calls, or None when it is no call
    (`final`: the answer ended, so a region without its closing marker is judged as it is)."""

    def __init__(self, name, starts, find_end, parse, render, start_only=False):
        self.name, self.starts, self.find_end, self.parse, self.start_only = name, starts, find_end, parse, start_only
        self.render = render  # call -> the text the model writes for it (templates without tool syntax)
        # JSON-argument formats whose arguments can stream as they are written: a regex for the
        # call's head up to the arguments (group 1: the name) and the marker that ends the call
        self.args_head, self.args_end = None, None

    def split(self, text, schemas=None):
        """A whole answer -> (visible content, calls)."""
        f = ToolCallFilter(self, schemas)
        pieces = f.feed(text) + f.finish()
        content = "".join(p[1] for p in pieces if p[0] == "content")
        return content, [p[1] for p in pieces if p[0] in ("tool_call", "tool_call_end") and p[1] is not None]


def _until(marker):
    def find_end(buf):
        i = buf.find(marker)
        return -1 if i < 0 else i + len(marker)
    return find_end


def _json_object(text):
    try:
        v = json.loads(text)
    except ValueError:
        return None
    return v if isinstance(v, dict) else None


def _value(text, schema):
    """An XML-style argument value: raw text for a string parameter, else JSON when it parses."""
    if isinstance(schema, dict) and is_string_schema(schema):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def is_string_schema(s):
    t = s.get("type")
    return t == "string" or (isinstance(t, list) and "string" in t and len([x for x in t if x != "null"]) == 1)


def _props(schemas, name):
    sch = (schemas or {}).get(name) or {}
    p = sch.get("properties") if isinstance(sch, dict) else None
    return p if isinstance(p, dict) else {}


# --- Qwen2.5 / Qwen3 (Hermes style): <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>

def _parse_hermes(region, schemas, final):
    body = region[len("<tool_call>"):]
    if body.endswith("</tool_call>"):
        body = body[:-len("</tool_call>")]
    elif not final:
        return None
    obj = _json_object(body.strip())
    if obj is None or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some fine-tunes write the arguments as a JSON string
        args = _json_object(args)
    if not isinstance(args, dict):
        return None
    return [{"name": obj["name"], "arguments": args}]


def dumps(v):
    return json.dumps(v, ensure_ascii=False)


HERMES = Format("hermes", ("<tool_call>",), _until("</tool_call>"), _parse_hermes,
                lambda c: f'<tool_call>\n{{"name": {dumps(c["name"])}, "arguments": {dumps(c["arguments"])}}}\n</tool_call>')


# --- GLM-4.5 / 4.6 / 4.7 / GLM-5: <tool_call>NAME<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>
# (4.5/4.6 put newlines between the parts; string values are raw text, others JSON)

_GLM_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


def _parse_glm(region, schemas, final):
    body = region[len("<tool_call>"):]
    if body.endswith("</tool_call>"):
        body = body[:-len("</tool_call>")]
    elif not final:
        return None
    cut = body.find("<arg_key>")
    name = (body if cut < 0 else body[:cut]).strip()
    if not name or "<" in name or "\n" in name:
        return None
    rest = "" if cut < 0 else body[cut:]
    props = _props(schemas, name)
    args = {}
    for m in _GLM_PAIR.finditer(rest):
        key = m.group(1).strip()
        args[key] = _value(m.group(2), props.get(key))
    if _GLM_PAIR.sub("", rest).strip():  # stray text: not the format
        return None
    return [{"name": name, "arguments": args}]


HERMES.args_head = re.compile(r'<tool_call>\s*\{\s*"name"\s*:\s*"([A-Za-z0-9_.-]+)"\s*,\s*"arguments"\s*:\s*')
HERMES.args_end = "</tool_call>"


def _render_glm(c):
    pairs = "".join(f"<arg_key>{k}</arg_key><arg_value>{v if isinstance(v, str) else dumps(v)}</arg_value>"
                    for k, v in c["arguments"].items())
    return f"<tool_call>{c['name']}{pairs}</tool_call>"


GLM = Format("glm", ("<tool_call>",), _until("</tool_call>"), _parse_glm, _render_glm)


# --- Qwen3.5 / Qwen3.6 (Qwen3-Coder style XML): <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n
# ...</function>\n</tool_call>. The template writes a string raw, a mapping or list as JSON and
# anything else with Jinja's `string` filter (so a boolean reads "True"/"False").

_QWEN_FUNC = re.compile(r"\s*<function=([^>\n]+)>\n?(.*?)</function>\s*$", re.S)
_QWEN_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)
_PY_WORDS = {"True": True, "False": False, "None": None}


def _qwen_value(text, schema):
    v = _value(text, schema)
    if isinstance(schema, dict) and not is_string_schema(schema) and isinstance(v, str) and text.strip() in _PY_WORDS:
        return _PY_WORDS[text.strip()]
    return v


def _parse_qwen_xml(region, schemas, final):
    body = region[len("<tool_call>"):]
    if body.endswith("</tool_call>"):
        body = body[:-len("</tool_call>")]
    elif not final:
        return None
    if body.lstrip().startswith("{"):  # a Hermes JSON call, which fine-tunes of this family also write
        return _parse_hermes(region, schemas, final)
    m = _QWEN_FUNC.match(body)
    if not m or not m.group(1).strip():
        return None
    name = m.group(1).strip()
    props = _props(schemas, name)
    args = {}
    for p in _QWEN_PARAM.finditer(m.group(2)):
        key = p.group(1).strip()
        args[key] = _qwen_value(p.group(2), props.get(key))
    if _QWEN_PARAM.sub("", m.group(2)).strip():  # stray text: not the format
        return None
    return [{"name": name, "arguments": args}]


def qwen_xml_value(v):
    """An argument value as the Qwen3.5 template writes it (JSON for non-strings, read back as JSON)."""
    return v if isinstance(v, str) else dumps(v)


def _render_qwen_xml(c):
    params = "".join(f"<parameter={k}>\n{qwen_xml_value(v)}\n</parameter>\n" for k, v in c["arguments"].items())
    return f"<tool_call>\n<function={c['name']}>\n{params}</function>\n</tool_call>"


QWEN_XML = Format("qwen_xml", ("<tool_call>",), _until("</tool_call>"), _parse_qwen_xml, _render_qwen_xml)


# --- DeepSeek-V3 / R1 / V3.1 (special tokens) and V3.2 (DSML markup)
DS_CALLS_BEGIN, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_DS_CALL = re.compile(re.escape(DS_CALL_BEGIN) + r"(.*?)" + re.escape(DS_CALL_END), re.S)
_DS_V3_BODY = re.compile(r"\s*(.+?)\n```(?:json)?\n(.*)\n```\s*$", re.S)  # V3/R1: NAME\n```json\nARGS\n```
DSML = "｜DSML｜"
DSML_BEGIN, DSML_END = f"<{DSML}function_calls>", f"</{DSML}function_calls>"
DSML_V4_BEGIN, DSML_V4_END = f"<{DSML}tool_calls>", f"</{DSML}tool_calls>"  # DeepSeek-V4 renamed the block
_DSML_BLOCKS = {DSML_BEGIN: DSML_END, DSML_V4_BEGIN: DSML_V4_END}
_DSML_INVOKE = re.compile(f'<{DSML}invoke name="([^"]*)">(.*?)</{DSML}invoke>', re.S)
_DSML_PARAM = re.compile(f'<{DSML}parameter name="([^"]*)" string="(true|false)">(.*?)</{DSML}parameter>', re.S)


def _dsml_block(region):
    """(begin, end) of the DSML block `region` starts with, or None."""
    return next(((b, e) for b, e in _DSML_BLOCKS.items() if region.startswith(b)), None)


def _ds_find_end(buf):
    block = _dsml_block(buf)
    return _until(block[1] if block else DS_CALLS_END)(buf)


def _parse_ds_tokens(region, final):
    body = region[len(DS_CALLS_BEGIN):]
    if body.endswith(DS_CALLS_END):
        body = body[:-len(DS_CALLS_END)]
    elif not final:
        return None
    calls, last = [], 0
    for m in _DS_CALL.finditer(body):
        if body[last:m.start()].strip():
            return None
        last = m.end()
        head, sep, tail = m.group(1).partition(DS_SEP)
        if not sep:
            return None
        v3 = _DS_V3_BODY.match(tail) if head.strip() == "function" else None
        name, args = (v3.group(1), v3.group(2)) if v3 else (head, tail)
        args = _json_object(args.strip())
        if args is None or not name.strip():
            return None
        calls.append({"name": name.strip(), "arguments": args})
    return calls if calls and not body[last:].strip() else None


def _parse_dsml(region, schemas, final):
    begin, end = _dsml_block(region)
    body = region[len(begin):]
    if body.endswith(end):
        body = body[:-len(end)]
    elif not final:
        return None
    calls, last = [], 0
    for m in _DSML_INVOKE.finditer(body):
        if body[last:m.start()].strip():
            return None
        last = m.end()
        args, plast = {}, 0
        for p in _DSML_PARAM.finditer(m.group(2)):
            if m.group(2)[plast:p.start()].strip():
                return None
            plast = p.end()
            if p.group(2) == "true":
                args[p.group(1)] = p.group(3)
            else:
                try:
                    args[p.group(1)] = json.loads(p.group(3))
                except ValueError:
                    return None
        if m.group(2)[plast:].strip():
            return None
        calls.append({"name": m.group(1), "arguments": args})
    return calls if calls and not body[last:].strip() else None


def _parse_deepseek(region, schemas, final):
    if _dsml_block(region):
        return _parse_dsml(region, schemas, final)
    return _parse_ds_tokens(region, final)


# V3/R1/V3.1 special tokens, V3.2's DSML <function_calls> block and V4's DSML <tool_calls> block
DEEPSEEK = Format("deepseek", (DS_CALLS_BEGIN, DSML_BEGIN, DSML_V4_BEGIN), _ds_find_end, _parse_deepseek,
                  lambda c: f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}{c['name']}{DS_SEP}{dumps(c['arguments'])}{DS_CALL_END}"
                            f"{DS_CALLS_END}")


# --- MiniMax-M2: <minimax:tool_call>\n<invoke name="NAME">\n<parameter name="KEY">VALUE</parameter>\n...
# </invoke>\n...</minimax:tool_call>, several invokes in one block; the template writes a string raw and
# anything else as JSON (tojson)
MINIMAX_BEGIN, MINIMAX_END = "<minimax:tool_call>", "</minimax:tool_call>"
_MINIMAX_INVOKE = re.compile(r'<invoke name="([^"\n]*)">(.*?)</invoke>', re.S)
_MINIMAX_PARAM = re.compile(r'<parameter name="([^"\n]*)">(.*?)</parameter>', re.S)


def _parse_minimax(region, schemas, final):
    body = region[len(MINIMAX_BEGIN):]
    if body.endswith(MINIMAX_END):
        body = body[:-len(MINIMAX_END)]
    elif not final:
        return None
    calls, last = [], 0
    for m in _MINIMAX_INVOKE.finditer(body):
        name = m.group(1).strip()
        if body[last:m.start()].strip() or not name:
            return None
        last = m.end()
        props, args, plast = _props(schemas, name), {}, 0
        for p in _MINIMAX_PARAM.finditer(m.group(2)):
            if m.group(2)[plast:p.start()].strip():  # stray text: not the format
                return None
            plast = p.end()
            key = p.group(1).strip()
            args[key] = _value(p.group(2), props.get(key))
        if m.group(2)[plast:].strip():
            return None
        calls.append({"name": name, "arguments": args})
    return calls if calls and not body[last:].strip() else None


def minimax_invoke(c):
    """One call as the MiniMax-M2 template writes it inside the block."""
    params = "".join(f'<parameter name="{k}">{v if isinstance(v, str) else dumps(v)}</parameter>\n'
                     for k, v in c["arguments"].items())
    return f'<invoke name="{c["name"]}">\n{params}</invoke>\n'


MINIMAX = Format("minimax", (MINIMAX_BEGIN,), _until(MINIMAX_END), _parse_minimax,
                 lambda c: f"{MINIMAX_BEGIN}\n{minimax_invoke(c)}{MINIMAX_END}")


# --- Llama 3.1 / 3.2 / 3.3: the answer is {"name": ..., "parameters": {...}} (maybe after <|python_tag|>)
PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()


def _llama_objects(body):
    """Consecutive JSON objects separated by whitespace or ';' -> (objects, end) or None."""
    objs, i = [], 0
    while True:
        while i < len(body) and (body[i].isspace() or body[i] == ";"):
            i += 1
        if i >= len(body) or body[i] != "{":
            return objs, i
        try:
            obj, i = _DECODER.raw_decode(body, i)
        except ValueError:
            return None
        objs.append(obj)


def _llama_find_end(buf):
    start = len(PYTHON_TAG) if buf.startswith(PYTHON_TAG) else 0
    got = _llama_objects(buf[start:])
    if got is None or not got[0]:
        return -1
    objs, end = got
    return -1 if end >= len(buf) - start else start + end  # more calls may follow until other text does


def _parse_llama(region, schemas, final):
    body = region[len(PYTHON_TAG):] if region.startswith(PYTHON_TAG) else region
    got = _llama_objects(body)
    if got is None or not got[0] or body[got[1]:].strip():
        return None
    calls = []
    for obj in got[0]:
        args = obj.get("parameters", obj.get("arguments"))
        if not isinstance(obj.get("name"), str) or not isinstance(args, dict):
            return None
        calls.append({"name": obj["name"], "arguments": args})
    return calls


LLAMA3_JSON = Format("llama3_json", (PYTHON_TAG, "{"), _llama_find_end, _parse_llama,
                     lambda c: f'{{"name": {dumps(c["name"])}, "parameters": {dumps(c["arguments"])}}}',
                     start_only=True)


# --- gpt-oss (harmony): a message addressed to=functions.NAME on the commentary channel.
# The template writes `<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>ARGS<|call|>`,
# the model writes `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS<|call|>`.
HARMONY_STARTS = ("<|start|>assistant to=functions.", "<|channel|>commentary to=functions.",
                  "<|start|>assistant<|channel|>commentary to=functions.")
_HARMONY_CALL = re.compile(r"(?:<\|start\|>assistant)?\s*(?:<\|channel\|>commentary)?\s*to=functions\.([^\s<]+)"
                           r"\s*(?:<\|channel\|>commentary)?\s*(?:<\|constrain\|>)?\s*(?:json)?\s*<\|message\|>"
                           r"(.*?)(?:<\|call\|>|$)", re.S)


def parse_harmony_calls(text):
    """Every function call in a harmony transcript -> list of calls (arguments that are not a
    JSON object make the call unparsable and it is left out). Kept apart from the reasoning /
    final-channel split so either can change without the other."""
    calls = []
    for m in _HARMONY_CALL.finditer(text):
        args = _json_object(m.group(2).strip())
        if args is not None:
            calls.append({"name": m.group(1), "arguments": args})
    return calls


_HARMONY_TO = re.compile(r"to=functions\.([^\s<]+)")


def harmony_call(header, body):
    """One harmony message -> a call when its header addresses functions.NAME and its body is a
    JSON object, else None (the splitter in colibri/chat/harmony.py hands over both parts)."""
    m = _HARMONY_TO.search(header)
    args = _json_object(body.strip()) if m else None
    return None if args is None else {"name": m.group(1), "arguments": args}


def _parse_harmony(region, schemas, final):
    if not region.endswith("<|call|>") and not final:
        return None
    m = _HARMONY_CALL.fullmatch(region.strip())
    if not m:
        return None
    args = _json_object(m.group(2).strip())
    return None if args is None else [{"name": m.group(1), "arguments": args}]


HARMONY = Format("harmony", HARMONY_STARTS, _until("<|call|>"), _parse_harmony,
                 lambda c: f"<|channel|>commentary to=functions.{c['name']} <|constrain|>json<|message|>"
                           f"{dumps(c['arguments'])}<|call|>")

FORMATS = {f.name: f for f in (HERMES, GLM, QWEN_XML, DEEPSEEK, MINIMAX, LLAMA3_JSON, HARMONY)}


def get(name):
    """The Format called `name` (the registry's `tools` value); KeyError names the known ones."""
    if name not in FORMATS:
        raise KeyError(f"unknown tool-call format {name!r}; known: {', '.join(sorted(FORMATS))}")
    return FORMATS[name]
