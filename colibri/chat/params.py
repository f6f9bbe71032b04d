"""API errors and the validation of request fields shared by the OpenAI and Anthropic dialects."""
import json
import re
from dataclasses import dataclass, field

ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
                   500: "api_error", 503: "overloaded_error"}


class ApiError(Exception):
    """An HTTP error response; rendered in the dialect of the endpoint that raised it."""

    def __init__(self, status, message, code=None, param=None, type=None, headers=None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")
        if status == 401:
            self.type = type or "authentication_error"
        if status == 429:
            self.type = type or "rate_limit_exceeded"
        self.headers = dict(headers or {})

    def body(self, dialect):
        if dialect == "ollama":
            return {"error": self.message}
        if dialect == "anthropic":
            return {"type": "error", "error": {"type": ANTHROPIC_TYPES.get(self.status, "api_error"),
                                               "message": self.message}}
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message, param=None, code="invalid_value"):
    return ApiError(400, message, code=code, param=param)


def unsupported(message, param=None, code="unsupported_parameter"):
    return ApiError(400, message, code=code, param=param)


def parse_json_object(raw):
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise bad("the request body is not valid UTF-8", code="invalid_json") from None

    def no_constant(name):
        raise ValueError(f"{name} is not valid JSON")

    try:
        obj = json.loads(text, parse_constant=no_constant)
    except (ValueError, RecursionError) as e:
        raise bad(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(obj, dict):
        raise bad("the request body must be a JSON object", code="invalid_json")
    if LONE_SURROGATE_ESCAPE.search(text):
        check_text(obj)
    return obj


# A string that cannot be encoded as UTF-8 can only come from a \uD800-\uDFFF escape that is
# not half of a pair: the body itself was valid UTF-8. Such text must never reach the engine.
LONE_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def check_text(obj):
    """Refuses (400, naming the field) any key or string in `obj` that is not valid Unicode."""
    stack = [(obj, "")]
    while stack:
        v, path = stack.pop()
        if isinstance(v, str):
            _check_str(v, path or "body")
        elif isinstance(v, dict):
            for k, item in v.items():
                sub = f"{path}.{k}" if path else k
                _check_str(k, f"{sub} (a key)")
                stack.append((item, sub))
        elif isinstance(v, list):
            stack.extend((item, f"{path}[{i}]") for i, item in enumerate(v))


def _check_str(s, path):
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        path = path.encode("ascii", "backslashreplace").decode()
        raise bad(f"'{path}' is not valid Unicode text: it contains a lone surrogate "
                  f"(\\u{ord(s[e.start]):04x} at character {e.start}); send UTF-8 text", param=path,
                  code="invalid_text") from None


def _type_error(name, what):
    return bad(f"'{name}' must be {what}", param=name, code="invalid_type")


def get_bool(body, name, default=None):
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _type_error(name, "a boolean")
    return v


def get_int(body, name, lo=None, hi=None, default=None):
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
        raise _type_error(name, "an integer")
    v = int(v)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f"at least {lo}" if hi is None else f"between {lo} and {hi}"
        raise bad(f"'{name}' is {v}; it must be {rng}", param=name)
    return v


def get_float(body, name, lo, hi, default=None, lo_open=False):
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _type_error(name, "a number")
    v = float(v)
    if v < lo or v > hi or (lo_open and v == lo):
        raise bad(f"'{name}' is {v}; it must be {'more than' if lo_open else 'between'} {lo} "
                  f"{'and at most' if lo_open else 'and'} {hi}", param=name)
    return v


def get_str(body, name, default=None):
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, str):
        raise _type_error(name, "a string")
    return v


def get_stop(body, name, limit=4):
    """`stop`: a string or a list of up to `limit` non-empty strings."""
    v = body.get(name)
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise _type_error(name, "a string or a list of strings")
    if len(v) > limit:
        raise bad(f"'{name}' has {len(v)} sequences; at most {limit} are supported", param=name)
    if any(s == "" for s in v):
        raise bad(f"'{name}' contains an empty string", param=name)
    return v


# The engine's largest count for max_tokens and top_k (docs/protocol.md).
ENGINE_MAX_COUNT = 1 << 30


def get_max_tokens(body, name, default=None):
    return get_int(body, name, 1, ENGINE_MAX_COUNT, default)


def seed_value(body, name="seed"):
    v = get_int(body, name, -(1 << 63), (1 << 64) - 1)
    return None if v is None else v & ((1 << 64) - 1)


@dataclass
class GenSpec:
    """Everything the generation driver needs, independent of the API dialect."""
    payload: object                 # prompt text, or a list of token ids
    opts: dict                      # SUBMIT options (without slot)
    key_text: str                   # the prompt as text, for the KV slot table
    stream: bool = False
    include_usage: bool = False
    stops: list = field(default_factory=list)
    think: bool = False             # split <think>...</think> into reasoning
    in_reasoning: bool = False      # the prompt already opened a <think> block
    harmony: bool = False           # split harmony channels (gpt-oss) into reasoning and content
    cache_slot: int = None
    logprobs: bool = False
    top_logprobs: int = 0
    return_progress: bool = False   # llama-server's return_progress: prompt progress chunks in the stream
    tools: object = None            # colibri.toolcall.request.ToolSpec when the request defines tools


def sampling_options(body, defaults, temp_max=2.0):
    """temperature/top_p/top_k/min_p/seed -> SUBMIT options; unset ones come from `defaults`."""
    opts = {}
    t = get_float(body, "temperature", 0.0, temp_max)
    opts["temp"] = defaults.get("temp", 1.0) if t is None else t
    p = get_float(body, "top_p", 0.0, 1.0, lo_open=True)
    if p is None:
        p = defaults.get("top_p")
    if p is not None:
        opts["top_p"] = p
    k = get_int(body, "top_k", -1, ENGINE_MAX_COUNT)  # -1 means off, as in vLLM
    if k is None:
        k = defaults.get("top_k")
    elif k < 0:
        k = 0
    if k is not None:
        opts["top_k"] = k
    m = get_float(body, "min_p", 0.0, 1.0)
    if m is None:
        m = defaults.get("min_p")
    if m is not None:
        opts["min_p"] = m
    opts.update(penalty_options(body, defaults))
    seed = seed_value(body)
    if seed is not None:
        opts["seed"] = seed
    return opts


def penalty_options(body, defaults):
    """presence_penalty / frequency_penalty (OpenAI, -2 to 2), repetition_penalty (vLLM) or
    repeat_penalty (llama-server, ollama) and repeat_last_n (the window, -1: the context) -> SUBMIT
    options; unset ones from `defaults`."""
    opts = {}
    for name in ("presence_penalty", "frequency_penalty"):
        v = get_float(body, name, -2.0, 2.0)
        if v:
            opts[name] = v
    names = [n for n in ("repetition_penalty", "repeat_penalty") if body.get(n) is not None]
    if len(names) == 2 and body[names[0]] != body[names[1]]:
        raise bad("'repetition_penalty' and 'repeat_penalty' are two names for one knob; send one of them",
                  param="repeat_penalty")
    r = get_float(body, names[0], 0.0, 100.0, lo_open=True) if names else defaults.get("repeat_penalty")
    if r is not None and r != 1:
        opts["repeat_penalty"] = r
    n = get_int(body, "repeat_last_n", -1, ENGINE_MAX_COUNT)
    if n is not None:
        opts["repeat_last_n"] = n
    return opts


def cache_slot(body, n_slots, name="cache_slot"):
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(f"'{name}' must be an integer KV slot between 0 and {n_slots - 1}", param=name, code="invalid_cache_slot")
    if not 0 <= v < n_slots:
        raise bad(f"'{name}' is {v}; this server has {n_slots} KV slot(s): use 0 to {n_slots - 1} "
                  f"(or start it with a larger --kv-slots)", param=name, code="invalid_cache_slot")
    return v


def message_text(content, param, allow_types=("text",)):
    """A message's content (a string or a list of parts) as one string; other part types are refused."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _type_error(param, "a string or a list of content parts")
    texts = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            raise _type_error(f"{param}[{i}]", "a content part object")
        kind = part.get("type")
        if kind in ("image_url", "image", "input_image"):
            raise unsupported("images are not supported: colibri runs text-only models", f"{param}[{i}]",
                              code="images_unsupported")
        if kind in ("input_audio", "audio", "file", "document"):
            raise unsupported(f"'{kind}' content is not supported: colibri runs text-only models", f"{param}[{i}]",
                              code="unsupported_content")
        if kind in ("tool_use", "tool_result"):
            raise unsupported(f"a '{kind}' block belongs in the content of an {'assistant' if kind == 'tool_use' else 'user'} "
                              f"message", f"{param}[{i}]", code="invalid_content")
        if kind not in allow_types:
            raise unsupported(f"content part type {kind!r} is not supported", f"{param}[{i}]", code="unsupported_content")
        if kind == "text":
            t = part.get("text")
            if not isinstance(t, str):
                raise _type_error(f"{param}[{i}].text", "a string")
            texts.append(t)
    return "\n".join(texts)
