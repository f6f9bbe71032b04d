"""The ollama dialect: /api/chat and /api/generate requests -> GenSpec (through the OpenAI parsers,
so validation, templates, tools and structured output are the same), NDJSON / JSON responses in
the shapes the official `ollama` client reads, and the model endpoints /api/tags, /api/show,
/api/ps, /api/version."""
import json
import time

from colibri.server.openai import parse_chat, parse_completion
from colibri.chat.params import ApiError, bad, get_bool, unsupported
from version import VERSION

# options.X -> the OpenAI field that carries it
OPTIONS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed",
           "stop": "stop", "repeat_penalty": "repeat_penalty", "repeat_last_n": "repeat_last_n",
           "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty"}
# Load-time options: the server's own flags (--ctx, --threads, ...) decide these, per server not per request.
LOAD_OPTIONS = frozenset(("num_ctx", "num_batch", "num_gpu", "main_gpu", "low_vram", "vocab_only", "use_mmap",
                          "use_mlock", "num_thread", "numa", "num_keep", "f16_kv", "logits_all"))
# Samplers colibri does not have: accepted at their neutral value only.
NEUTRAL = {"typical_p": 1.0, "tfs_z": 1.0, "mirostat": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1}


def model_name(body, model):
    """The request's model, which may carry ollama's `:latest` tag; a 404 for another model."""
    name = body.get("model", body.get("name"))
    if name is None:
        raise bad("'model' is required", param="model")
    if not isinstance(name, str):
        raise bad("'model' must be a string", param="model", code="invalid_type")
    if not model.serves(name.removesuffix(":latest")):
        raise ApiError(404, f"model '{name}' not found; this server serves '{model.id}'", code="model_not_found",
                       param="model")
    return name


def _options(body):
    """ollama's options -> OpenAI request fields."""
    opts = body.get("options")
    if opts is None:
        return {}
    if not isinstance(opts, dict):
        raise bad("'options' must be an object", param="options", code="invalid_type")
    out = {}
    for k, v in opts.items():
        if k in OPTIONS:
            out[OPTIONS[k]] = v
        elif k == "num_predict":
            if isinstance(v, int) and not isinstance(v, bool) and v in (-1, -2):
                continue  # -1: no limit, -2: until the context is full; both are colibri's default
            out["max_tokens"] = v
        elif k in NEUTRAL:
            if v != NEUTRAL[k]:
                raise unsupported(f"'options.{k}' is not supported by colibri; leave it out or set it to "
                                  f"{NEUTRAL[k]:g}", param=f"options.{k}")
        elif k not in LOAD_OPTIONS and k != "penalize_newline":
            raise bad(f"'options.{k}' is not an option colibri knows; the sampling options are "
                      f"{', '.join(sorted(OPTIONS))} and num_predict", param=f"options.{k}")
    return out


def _format(body):
    fmt = body.get("format")
    if fmt in (None, ""):
        return {}
    if fmt == "json":
        return {"response_format": {"type": "json_object"}}
    if isinstance(fmt, dict):
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}}
    raise bad("'format' must be \"json\" or a JSON schema object", param="format")


def _think(body):
    think = body.get("think")
    if think is None:
        return {}
    if isinstance(think, bool):
        return {"enable_thinking": think}
    if think in ("low", "medium", "high"):
        return {"reasoning_effort": think}
    raise bad("'think' must be true, false, or \"low\", \"medium\" or \"high\"", param="think")


def _common(body, model):
    model_name(body, model)
    for name in ("images", "context", "template", "suffix"):
        if body.get(name):
            what = "images are not supported: colibri runs text-only models" if name == "images" else \
                f"'{name}' is not supported by colibri; send the conversation to /api/chat instead" \
                if name == "context" else f"'{name}' is not supported by colibri"
            raise unsupported(what, param=name, code="images_unsupported" if name == "images" else
                              "unsupported_parameter")
    ka = body.get("keep_alive")  # accepted: one server keeps its one model loaded for its whole life
    if ka is not None and (isinstance(ka, bool) or not isinstance(ka, (str, int, float))):
        raise bad("'keep_alive' must be a duration such as \"5m\" or a number of seconds", param="keep_alive")
    stream = get_bool(body, "stream", True)  # ollama streams unless told not to
    return {"model": model.id, "stream": stream, **_options(body), **_format(body), **_think(body)}


def _renamed(fn, body, model, n_slots):
    """Runs an OpenAI parser; an error about a field that came from `options` names it so."""
    try:
        return fn(body, model, n_slots)
    except ApiError as e:
        option = {v: k for k, v in OPTIONS.items()}.get(e.param, "num_predict" if e.param == "max_tokens" else None)
        if option:
            e.message = e.message.replace(f"'{e.param}'", f"'options.{option}'")
            e.param = f"options.{option}"
        raise


def _message(m, i):
    if not isinstance(m, dict):
        raise bad(f"'messages[{i}]' must be an object", param=f"messages[{i}]", code="invalid_type")
    if m.get("images"):
        raise unsupported("images are not supported: colibri runs text-only models", param=f"messages[{i}].images",
                          code="images_unsupported")
    out = {k: m[k] for k in ("role", "content", "tool_calls") if k in m}
    if m.get("role") == "tool" and isinstance(m.get("tool_name"), str):
        out["name"] = m["tool_name"]
    if isinstance(m.get("thinking"), str):
        out["reasoning_content"] = m["thinking"]
    if out.get("role") == "assistant" and out.get("tool_calls") and out.get("content") is None:
        out["content"] = ""
    return out


def parse_chat_request(body, model, n_slots):
    req = _common(body, model)
    messages = body.get("messages")
    if messages is None:
        messages = []
    if not isinstance(messages, list):
        raise bad("'messages' must be a list", param="messages", code="invalid_type")
    req["messages"] = [_message(m, i) for i, m in enumerate(messages)]
    if body.get("tools") is not None:
        req["tools"] = body["tools"]
    if not messages:  # ollama's way of loading a model: answered at once
        return OllamaLoad(req["stream"])
    return _renamed(parse_chat, req, model, n_slots)


def parse_generate_request(body, model, n_slots):
    req = _common(body, model)
    prompt, system = body.get("prompt"), body.get("system")
    for name, v in (("prompt", prompt), ("system", system)):
        if v is not None and not isinstance(v, str):
            raise bad(f"'{name}' must be a string", param=name, code="invalid_type")
    if not prompt:
        return OllamaLoad(req["stream"])
    if get_bool(body, "raw", False):  # the prompt as written, no template (as /v1/completions)
        if system:
            raise bad("'system' needs the chat template; leave it out with 'raw': true", param="system")
        req["prompt"] = prompt
        req.setdefault("max_tokens", None)
        spec = _renamed(parse_completion, {k: v for k, v in req.items() if v is not None}, model, n_slots)
        if req["max_tokens"] is None:  # not 16 as for /v1/completions: until the end, as ollama
            spec.opts.pop("max_tokens", None)
            spec.opts.pop("fit", None)
        return spec
    req["messages"] = ([{"role": "system", "content": system}] if system else []) + \
        [{"role": "user", "content": prompt}]
    return _renamed(parse_chat, req, model, n_slots)


class OllamaLoad:
    """An /api/chat without messages or an /api/generate without a prompt: ollama loads the model
    and answers `done` with done_reason "load"; colibri's model is always loaded."""

    def __init__(self, stream):
        self.stream = stream


def _now():
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


def line(obj):
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def load_answer(kind, model_name_):
    body = {"model": model_name_, "created_at": _now(), "done": True, "done_reason": "load"}
    body["message" if kind == "chat" else "response"] = {"role": "assistant", "content": ""} if kind == "chat" else ""
    return body


class _Responder:
    content_type = "application/x-ndjson"
    kind = "chat"

    def __init__(self, spec, model_id):
        self.spec, self.model_id = spec, model_id
        self.t0 = time.monotonic_ns()
        self.t_accept = self.t_first = None
        self.args = {}  # a streamed tool call's name and argument text, until it ends

    def _base(self, done):
        return {"model": self.model_id, "created_at": _now(), "done": done}

    def _chunk(self, content="", thinking=None, calls=None, done=False):
        raise NotImplementedError

    def stream_start(self, usage):
        self.t_accept = time.monotonic_ns()
        return []

    def stream_piece(self, kind, text, entries):
        if self.t_first is None:
            self.t_first = time.monotonic_ns()
        if kind == "tool_call":
            return [self._chunk(calls=[text])]
        if kind == "tool_call_start":
            self.args = {"name": text, "arguments": ""}
            return []
        if kind == "tool_call_args":
            self.args["arguments"] += text or ""
            return []
        if kind == "tool_call_end":
            call = self.args if text is None else text
            if isinstance(call.get("arguments"), str):
                try:
                    call = dict(call, arguments=json.loads(call["arguments"] or "{}"))
                except ValueError:
                    pass
            return [self._chunk(calls=[call])]
        if not text:
            return []
        return [self._chunk(thinking=text) if kind == "reasoning" else self._chunk(content=text)]

    def _stats(self, finish, usage):
        end = time.monotonic_ns()
        accept = self.t_accept or end
        first = self.t_first or end
        return {"done_reason": "length" if finish == "length" else "stop", "total_duration": end - self.t0,
                "load_duration": 0, "prompt_eval_count": usage["prompt"], "prompt_eval_duration": first - accept,
                "eval_count": usage["completion"], "eval_duration": end - first}

    def stream_end(self, finish, stop_seq, usage):
        last = self._chunk(done=True)
        return [line({**json.loads(last), **self._stats(finish, usage)})]

    def stream_error(self, err):
        return [line({"error": err.message})]

    def body(self, content, reasoning, entries, finish, stop_seq, usage, calls=()):
        self.t_first = self.t_first or self.t_accept
        out = json.loads(self._chunk(content, reasoning or None, list(calls) or None, done=True))
        return {**out, **self._stats(finish, usage)}


class ChatResponder(_Responder):
    def _chunk(self, content="", thinking=None, calls=None, done=False):
        msg = {"role": "assistant", "content": content}
        if thinking:
            msg["thinking"] = thinking
        if calls:
            msg["tool_calls"] = [{"function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]
        return line({**self._base(done), "message": msg})


class GenerateResponder(_Responder):
    kind = "generate"

    def _chunk(self, content="", thinking=None, calls=None, done=False):
        out = {**self._base(done), "response": content}
        if thinking:
            out["thinking"] = thinking
        return line(out)


# ---------------------------------------------------------------- model endpoints

def _details(model):
    fam = model.manifest.get("family")
    return {"parent_model": "", "format": "colibri", "family": fam, "families": [fam] if fam else None,
            "parameter_size": "", "quantization_level": str(model.manifest.get("quant", {}).get("experts") or "")}


def _size(model):
    return sum(f.stat().st_size for f in model.dir.glob("*.safetensors"))


def _entry(model, name):
    mtime = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(model.created))
    return {"name": name, "model": name, "modified_at": mtime, "size": _size(model),
            "digest": model.fingerprint, "details": _details(model)}


def tags(model):
    return {"models": [_entry(model, n) for n in model.names]}


def ps(model):
    return {"models": [{**_entry(model, n), "expires_at": "9999-12-31T23:59:59Z", "size_vram": 0} for n in model.names]}


def version():
    return {"version": VERSION}


def show(body, model, ctx):
    model_name(body, model)
    names = {"temp": "temperature"}  # the others are ollama's names already
    params = "\n".join(f"{names.get(k, k):<16}{v:g}" for k, v in model.defaults.items())
    caps = ["completion"] + (["tools"] if model.tool_format else []) + (["thinking"] if model.thinks else [])
    fam = model.manifest.get("family") or "colibri"
    info = {"general.architecture": fam}
    if ctx:
        info[f"{fam}.context_length"] = ctx
    return {"modelfile": "", "parameters": params, "template": model.template or "", "details": _details(model),
            "model_info": info, "capabilities": caps,
            "modified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(model.created))}
