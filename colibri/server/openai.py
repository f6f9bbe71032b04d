"""The OpenAI dialect: /v1/chat/completions and /v1/completions requests -> GenSpec, and the
JSON / SSE chunk shapes the official clients expect."""
import json
import time
import uuid

from colibri.chat_template import render as chat_template
from colibri.chat_template import runtime as chat_template_runtime
from colibri.chat import harmony
from colibri.chat.params import (ApiError, GenSpec, bad, cache_slot, get_bool, get_int, get_max_tokens, get_stop, get_str,
                           message_text, sampling_options, unsupported)
from colibri.server import structured
from colibri.chat.text import token_text
from colibri.toolcall import fallback as tool_fallback
from colibri.toolcall import request as tool_request
from colibri.toolcall.forced import call_grammar
from version import VERSION

FINGERPRINT = f"colibri-{VERSION}"
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")

# Template variables the server sets itself: chat_template_kwargs may not override them (the
# conversation, the generation prompt, tool definitions that bypass the tools refusal, special
# tokens that would turn text into control tokens, the template's own functions).
RESERVED_TEMPLATE_KWARGS = frozenset(
    ("messages", "add_generation_prompt", "continue_final_message", "tools", "functions", "tool_choice",
     "documents") + tuple(chat_template.SPECIAL_TOKEN_NAMES) + tuple(chat_template_runtime._GLOBALS))


def check_model(body, model):
    name = body.get("model")
    if name is None:
        return
    if not isinstance(name, str):
        raise bad("'model' must be a string", param="model", code="invalid_type")
    if not model.serves(name):
        raise ApiError(404, f"The model '{name}' does not exist; this server serves '{model.id}'",
                       code="model_not_found", param="model")


def _common(body, model, n_slots):
    check_model(body, model)
    n = get_int(body, "n", 1, 128, 1)
    if n != 1:
        raise unsupported("'n' > 1 is not supported: colibri generates one choice per request", param="n",
                          code="n_unsupported")
    lb = body.get("logit_bias")
    if lb not in (None, {}):
        raise unsupported("'logit_bias' is not supported by colibri yet", param="logit_bias")
    stream = get_bool(body, "stream", False)
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise bad("'stream_options' must be an object", param="stream_options", code="invalid_type")
    include_usage = bool(stream and so and get_bool(so, "include_usage", False))
    spec = GenSpec(payload=None, opts=sampling_options(body, model.defaults), key_text="", stream=stream,
                   include_usage=include_usage, stops=get_stop(body, "stop"), cache_slot=cache_slot(body, n_slots))
    if get_bool(body, "ignore_eos", False):  # vLLM's and llama-server's switch: generate max_tokens whatever comes
        spec.opts["ignore_eos"] = 1
    return spec


def cap_at_context(spec, body):
    """llama-server's `n_predict`: a cap that the end of the context may cut short, where OpenAI's
    max_tokens must fit after the prompt (the dashboard sends it, so a long default cap cannot
    refuse a short prompt on a small context)."""
    n = get_max_tokens(body, "n_predict")
    if n is not None:
        spec.opts["max_tokens"] = n


def parse_chat(body, model, n_slots):
    spec = _common(body, model, n_slots)
    spec.tools = tool_request.openai_tools(body, model)
    rf = body.get("response_format")
    if spec.tools is not None and spec.tools.choice in ("required", "function") and (
            body.get("grammar") is not None or (isinstance(rf, dict) and rf.get("type") not in (None, "text"))):
        raise bad("a forced 'tool_choice' constrains the answer to the call already; send it without "
                  "'response_format' / 'grammar' (or with tool_choice 'auto')", param="tool_choice")
    structured.grammar_for(body)  # a bad response_format or grammar is refused before the prompt is rendered
    mods = body.get("modalities")
    if mods is not None and mods != ["text"]:
        raise unsupported("only the text modality is supported", param="modalities")
    for name in ("audio", "prediction", "web_search_options"):
        if body.get(name) is not None:
            raise unsupported(f"'{name}' is not supported by colibri", param=name)

    mct = get_max_tokens(body, "max_completion_tokens")
    mt = get_max_tokens(body, "max_tokens")
    limit = mct if mct is not None else mt
    if limit is not None:  # asked for: it must fit after the prompt, as OpenAI refuses what cannot
        spec.opts.update(max_tokens=limit, fit=1)
    else:
        cap_at_context(spec, body)
    spec.logprobs = get_bool(body, "logprobs", False)
    spec.top_logprobs = get_int(body, "top_logprobs", 0, 20, 0)
    spec.return_progress = get_bool(body, "return_progress", False)
    if body.get("top_logprobs") is not None and not spec.logprobs:
        raise bad("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    if spec.logprobs:
        spec.opts.update(logprobs=1, top_logprobs=spec.top_logprobs)

    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list", param="messages",
                  code="invalid_type" if not isinstance(messages, list) else "invalid_value")
    chat = [_message(m, i) for i, m in enumerate(messages)]

    kwargs = {}
    ctk = body.get("chat_template_kwargs")
    if ctk is not None:
        if not isinstance(ctk, dict):
            raise bad("'chat_template_kwargs' must be an object", param="chat_template_kwargs", code="invalid_type")
        reserved = sorted(RESERVED_TEMPLATE_KWARGS.intersection(ctk))
        if reserved:
            raise bad(f"'chat_template_kwargs' may not set {', '.join(repr(k) for k in reserved)}: the server sets "
                      f"these itself (send the conversation in 'messages', the other switches as request fields)",
                      param="chat_template_kwargs." + reserved[0], code="reserved_template_kwarg")
        kwargs.update(ctk)
    effort = get_str(body, "reasoning_effort")
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise bad(f"'reasoning_effort' must be one of {', '.join(REASONING_EFFORTS)}", param="reasoning_effort")
        kwargs["reasoning_effort"] = effort
        if effort == "none":
            kwargs.setdefault("enable_thinking", False)
    et = get_bool(body, "enable_thinking")
    if et is not None:
        kwargs["enable_thinking"] = et
    if model.harmony:
        check_harmony_effort(kwargs, "reasoning_effort" if effort is not None else "chat_template_kwargs.reasoning_effort")
    agp = get_bool(body, "add_generation_prompt", True)
    cfm = get_bool(body, "continue_final_message", False)
    render_prompt(spec, model, chat, kwargs, add_generation_prompt=agp and not cfm, continue_final_message=cfm)
    structured.apply(spec, body)
    return spec


def check_harmony_effort(kwargs, param):
    """gpt-oss's template writes reasoning_effort into its system message as is: only the levels
    the model was trained on may get there."""
    if "reasoning_effort" in kwargs:
        why = harmony.effort_error(kwargs["reasoning_effort"])
        if why:
            raise bad(f"'{param}': {why}", param=param)


def render_prompt(spec, model, chat, kwargs, **flags):
    tools, fmt = spec.tools, None
    if tools is not None or tool_request.has_calls(chat):  # earlier calls need a family with tool syntax
        fmt = tools.fmt if tools else tool_request.tool_format(model, "messages")
        chat = tool_fallback.plain_conversation(chat, tools.tools if tools else None, fmt, model.template)
    try:
        prompt = _render(model, chat, flags, kwargs, tools)
        if _dropped_calls(model, chat, flags, kwargs, tools, prompt.text):
            chat = tool_fallback.plain_conversation(chat, None, fmt, model.template, calls_as_text=True)
            prompt = _render(model, chat, flags, kwargs, tools)
        payload, literal = prompt.frame()  # message text that spells added tokens stays text
    except chat_template.TemplateError as e:
        code = "chat_template_missing" if model.template is None else "chat_template_error"
        raise bad(f"the chat template could not render this conversation: {e}", param="messages", code=code) from None
    spec.payload, spec.key_text = payload, prompt.text
    spec.opts.update(special=1, add_special=0, **literal)
    spec.think = model.thinks
    spec.in_reasoning = model.thinks and prompt.text.rstrip().endswith("<think>")
    if model.harmony:  # the channel markup is special tokens: the engine must write them out
        spec.harmony = True
        spec.opts["render_special"] = 1
    if tools is not None and tools.choice in ("required", "function"):
        tools.grammar = spec.opts["grammar"] = call_grammar(tools, model.template, spec.in_reasoning)


def _dropped_calls(model, chat, flags, kwargs, tools, text):
    """The template read the earlier calls but wrote nothing for them (the original DeepSeek-V3
    template writes calls only for content None, which the renderer drops as transformers does)."""
    if not any(m.get("tool_calls") for m in chat):
        return False
    bare = [{k: v for k, v in m.items() if k != "tool_calls"} for m in chat]
    try:
        return _render(model, bare, flags, kwargs, tools).text == text
    except chat_template.TemplateError:
        return False


def _render(model, chat, flags, kwargs, tools):
    extra = {"tools": tools.tools} if tools is not None else {}
    try:
        return model.render(chat, **flags, **kwargs, **extra)
    except chat_template.TemplateError:
        if not any(m.get("tool_calls") for m in chat):
            raise
        # the original DeepSeek-V3 template concatenates the arguments as text
        return model.render(tool_request.with_string_arguments(chat), **flags, **kwargs, **extra)


def _message(m, i):
    if not isinstance(m, dict):
        raise bad(f"'messages[{i}]' must be an object", param=f"messages[{i}]", code="invalid_type")
    role = m.get("role")
    if role in ("tool", "function"):
        out = {"role": "tool", "content": message_text(m.get("content"), f"messages[{i}].content")}
        for key in ("tool_call_id", "name"):
            if isinstance(m.get(key), str):
                out[key] = m[key]
        return out
    if role == "assistant" and (m.get("tool_calls") or m.get("function_call")):
        text = message_text(m.get("content"), f"messages[{i}].content", allow_types=("text", "refusal"))
        out = {"role": "assistant", "content": text, "tool_calls": tool_request.openai_history_calls(m, i)}
        if isinstance(m.get("reasoning_content"), str):
            out["reasoning_content"] = m["reasoning_content"]
        return out
    if role not in ("system", "developer", "user", "assistant", "tool"):
        raise bad(f"'messages[{i}].role' must be system, developer, user, assistant or tool",
                  param=f"messages[{i}].role")
    if m.get("content") is None:  # as OpenAI: only an assistant message with tool calls may omit it
        raise bad(f"'messages[{i}].content' is required for a {role} message (a string or a list of content parts)",
                  param=f"messages[{i}].content", code="missing_content")
    out = {"role": "system" if role == "developer" else role,
           "content": message_text(m.get("content"), f"messages[{i}].content", allow_types=("text", "refusal"))}
    for extra in ("name", "reasoning_content"):
        if isinstance(m.get(extra), str):
            out[extra] = m[extra]
    return out


def parse_completion(body, model, n_slots):
    spec = _common(body, model, n_slots)
    if get_bool(body, "echo", False):
        raise unsupported("'echo' is not supported by colibri yet", param="echo")
    if body.get("suffix"):
        raise unsupported("'suffix' (fill-in-the-middle) is not supported by colibri yet", param="suffix")
    if get_int(body, "best_of", 1, 128, 1) != 1:
        raise unsupported("'best_of' > 1 is not supported", param="best_of")
    spec.opts["max_tokens"] = get_max_tokens(body, "max_tokens", default=16)  # OpenAI's default for completions
    if body.get("max_tokens") is not None:  # asked for (not the default): it must fit after the prompt
        spec.opts["fit"] = 1
    else:
        cap_at_context(spec, body)
    spec.return_progress = get_bool(body, "return_progress", False)
    lp = get_int(body, "logprobs", 0, 20)
    if lp is not None:
        spec.logprobs, spec.top_logprobs = True, lp
        spec.opts.update(logprobs=1, top_logprobs=lp)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        spec.payload = spec.key_text = prompt
        spec.opts.update(special=1, add_special=1)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        vocab = model.manifest.get("arch", {}).get("vocab_size")
        low, high = min(prompt), max(prompt)
        if low < 0 or (isinstance(vocab, int) and high >= vocab):
            raise bad(f"token id {low if low < 0 else high} in 'prompt' is not in this model's vocabulary "
                      f"(ids 0 to {vocab - 1 if isinstance(vocab, int) else 'vocab size - 1'})", param="prompt",
                      code="invalid_token_id")
        spec.payload = prompt
        spec.key_text = "\x00ids:" + ",".join(map(str, prompt)) + ","
    elif isinstance(prompt, list) and len(prompt) > 1:
        raise unsupported(f"'prompt' holds {len(prompt)} prompts; batched prompts are not supported, send one "
                          f"per request", param="prompt", code="batch_unsupported")
    else:
        raise bad("'prompt' must be a string or a list of token ids", param="prompt", code="invalid_type")
    structured.apply(spec, body)
    return spec


def sse(obj):
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def usage_obj(u):
    return {"prompt_tokens": u["prompt"], "completion_tokens": u["completion"],
            "total_tokens": u["prompt"] + u["completion"], "prompt_tokens_details": {"cached_tokens": u["reused"]}}


def chat_logprobs(entries):
    def one(tok_bytes, lp):
        return {"token": token_text(tok_bytes), "logprob": lp, "bytes": list(tok_bytes)}
    return {"content": [dict(one(b, lp), top_logprobs=[one(ab, alp) for _, alp, ab in alts])
                        for _, lp, b, alts in entries], "refusal": None}


def progress_chunk(r, chunk_object, done, total, reused, ms):
    """llama-server's `return_progress` chunk: no choices, the prompt's progress (processed counts
    the cached positions too, as llama-server's does)."""
    return [sse({"id": r.id, "object": chunk_object, "created": r.created, "model": r.model_id,
                 "system_fingerprint": FINGERPRINT, "choices": [],
                 "prompt_progress": {"total": total, "cache": reused, "processed": done, "time_ms": round(ms, 1)}})]


def stream_tail(r, chunk_object, final_chunk, usage):
    """The end of an OpenAI stream: the finishing chunk, the usage chunk when the client asked
    for it (stream_options.include_usage), then [DONE]."""
    out = [final_chunk]
    if r.spec.include_usage:
        out.append(sse({"id": r.id, "object": chunk_object, "created": r.created, "model": r.model_id,
                        "system_fingerprint": FINGERPRINT, "choices": [], "usage": usage_obj(usage)}))
    return out + [DONE]


class ChatResponder:
    """Shapes of /v1/chat/completions: one JSON body, or chat.completion.chunk events."""

    def __init__(self, spec, model_id):
        self.spec, self.model_id = spec, model_id
        self.id = "chatcmpl-" + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.n_calls = 0

    def _chunk(self, delta, finish=None, logprobs=None):
        c = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model_id,
             "system_fingerprint": FINGERPRINT,
             "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}
        if self.spec.include_usage:
            c["usage"] = None
        return sse(c)

    def stream_start(self, usage):
        return [self._chunk({"role": "assistant", "content": ""})]

    def stream_progress(self, done, total, reused, ms):
        return progress_chunk(self, "chat.completion.chunk", done, total, reused, ms)

    def stream_piece(self, kind, text, entries):
        if kind.startswith("tool_call"):  # what the official client accumulates: id, type and name, then arguments
            return self._call_chunks(kind, text)
        key = "reasoning_content" if kind == "reasoning" else "content"
        lp = chat_logprobs(entries) if self.spec.logprobs and entries else None
        return [self._chunk({key: text}, logprobs=lp)]

    def _call_chunks(self, kind, value):
        out = []
        if kind in ("tool_call", "tool_call_start"):
            name = value["name"] if kind == "tool_call" else value
            head = {"index": self.n_calls, "id": tool_request.call_id(), "type": "function",
                    "function": {"name": name, "arguments": ""}}
            self.n_calls += 1
            out.append(self._chunk({"tool_calls": [head]}))
        args = _arguments(value) if kind == "tool_call" else value if kind == "tool_call_args" else None
        if args:
            out.append(self._chunk({"tool_calls": [{"index": self.n_calls - 1, "function": {"arguments": args}}]}))
        return out

    def stream_end(self, finish, stop_seq, usage):
        return stream_tail(self, "chat.completion.chunk", self._chunk({}, finish=finish), usage)

    def stream_error(self, err):
        return [sse(err.body("openai")), DONE]  # [DONE] too: a stream always ends the way clients expect

    def body(self, content, reasoning, entries, finish, stop_seq, usage, calls=()):
        msg = {"role": "assistant", "content": content if content or not calls else None, "refusal": None}
        if reasoning:
            msg["reasoning_content"] = reasoning
        if calls:
            msg["tool_calls"] = [{"id": tool_request.call_id(), "type": "function",
                                  "function": {"name": c["name"], "arguments": _arguments(c)}} for c in calls]
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model_id,
                "system_fingerprint": FINGERPRINT,
                "choices": [{"index": 0, "message": msg,
                             "logprobs": chat_logprobs(entries) if self.spec.logprobs else None,
                             "finish_reason": finish}],
                "usage": usage_obj(usage)}


def _arguments(call):
    return json.dumps(call["arguments"], ensure_ascii=False)


class CompletionResponder:
    """Shapes of /v1/completions (text_completion objects, legacy logprobs)."""

    def __init__(self, spec, model_id):
        self.spec, self.model_id = spec, model_id
        self.id = "cmpl-" + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.offset = 0

    def _logprobs(self, entries):
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for _, lp, b, alts in entries:
            t = token_text(b)
            out["tokens"].append(t)
            out["token_logprobs"].append(lp)
            out["top_logprobs"].append({token_text(ab): alp for _, alp, ab in alts})
            out["text_offset"].append(self.offset)
            self.offset += len(t)
        return out

    def _chunk(self, text, finish=None, logprobs=None):
        c = {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model_id,
             "system_fingerprint": FINGERPRINT,
             "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}]}
        if self.spec.include_usage:
            c["usage"] = None
        return sse(c)

    def stream_start(self, usage):
        return []

    def stream_progress(self, done, total, reused, ms):
        return progress_chunk(self, "text_completion", done, total, reused, ms)

    def stream_piece(self, kind, text, entries):
        lp = self._logprobs(entries) if self.spec.logprobs and entries else None
        return [self._chunk(text, logprobs=lp)]

    def stream_end(self, finish, stop_seq, usage):
        return stream_tail(self, "text_completion", self._chunk("", finish=finish), usage)

    def stream_error(self, err):
        return [sse(err.body("openai")), DONE]  # [DONE] too: a stream always ends the way clients expect

    def body(self, content, reasoning, entries, finish, stop_seq, usage, calls=()):
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model_id,
                "system_fingerprint": FINGERPRINT,
                "choices": [{"index": 0, "text": reasoning + content,
                             "logprobs": self._logprobs(entries) if self.spec.logprobs else None,
                             "finish_reason": finish}],
                "usage": usage_obj(usage)}
