"""The Anthropic Messages dialect: POST /v1/messages requests -> GenSpec, and the message /
event-stream shapes the official `anthropic` client expects."""
import json
import uuid

from colibri.server.openai import check_harmony_effort, check_model, render_prompt
from colibri.chat.params import (GenSpec, bad, cache_slot, get_bool, get_max_tokens, get_stop, message_text,
                           sampling_options, unsupported)
from colibri.toolcall import request as tool_request


def parse_messages(body, model, n_slots):
    check_model(body, model)
    if body.get("max_tokens") is None:
        raise bad("max_tokens: Field required", param="max_tokens")
    max_tokens = get_max_tokens(body, "max_tokens")
    tools = tool_request.anthropic_tools(body, model)
    opts = sampling_options(body, model.defaults, temp_max=1.0)
    opts["max_tokens"] = max_tokens
    spec = GenSpec(payload=None, opts=opts, key_text="", stream=get_bool(body, "stream", False),
                   stops=get_stop(body, "stop_sequences"), cache_slot=cache_slot(body, n_slots), tools=tools)

    chat = []
    system = body.get("system")
    if system is not None:
        text = message_text(system, "system")
        if text:
            chat.append({"role": "system", "content": text})
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages: must be a non-empty list", param="messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise bad(f"messages.{i}.role: must be 'user' or 'assistant'", param=f"messages.{i}")
        content = m.get("content")
        if content is None:
            raise bad(f"messages.{i}.content: Field required (a string or a list of content blocks)",
                      param=f"messages.{i}.content")
        if isinstance(content, list):  # earlier thinking blocks are not sent back to the model
            content = [b for b in content if not (isinstance(b, dict) and b.get("type") in
                                                  ("thinking", "redacted_thinking"))]
        chat += _turn(m["role"], content, i)

    kwargs = {}
    thinking = body.get("thinking")
    if thinking is not None:
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        if kind not in ("enabled", "disabled", "adaptive", "between_tools"):
            raise bad("thinking.type must be 'enabled', 'disabled', 'adaptive' or 'between_tools'", param="thinking")
        kwargs["enable_thinking"] = kind != "disabled"
    oc = body.get("output_config")
    if oc is not None:
        if not isinstance(oc, dict):
            raise bad("output_config must be an object", param="output_config", code="invalid_type")
        if oc.get("format") is not None:
            raise unsupported("output_config.format (structured JSON output) is not supported by colibri yet",
                              param="output_config.format")
        effort = oc.get("effort")
        if effort is not None:
            if effort not in ("low", "medium", "high", "xhigh", "max"):
                raise bad("output_config.effort must be low, medium, high, xhigh or max", param="output_config.effort")
            kwargs["reasoning_effort"] = effort
            if model.harmony:
                check_harmony_effort(kwargs, "output_config.effort")
    if body.get("container") is not None:
        raise unsupported("containers (server-side tools) are not supported by colibri", param="container")
    # A final assistant message is a prefill: the answer continues it.
    prefill = chat[-1]["role"] == "assistant"
    render_prompt(spec, model, chat, kwargs, add_generation_prompt=not prefill, continue_final_message=prefill)
    return spec


def _blocks(content, kind):
    return [b for b in content if isinstance(b, dict) and b.get("type") == kind] if isinstance(content, list) else []


def _turn(role, content, i):
    """One Anthropic message -> template messages: tool_result blocks become tool messages (before
    the user's text), tool_use blocks the assistant's tool_calls."""
    param = f"messages.{i}.content"
    rest = [b for b in content if not (isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result"))] \
        if isinstance(content, list) else content
    if role == "assistant":
        uses = _blocks(content, "tool_use")
        msg = {"role": "assistant", "content": message_text(rest, param)}
        if uses:
            msg["tool_calls"] = [tool_request.history_call(b.get("name"), b.get("input", {}), b.get("id"),
                                                           f"{param}.{j}") for j, b in enumerate(uses)]
        return [msg]
    out = []
    for j, b in enumerate(_blocks(content, "tool_result")):
        result = b.get("content", "")
        text = message_text(result, f"{param}.{j}.content") if isinstance(result, (str, list)) else json.dumps(result)
        out.append({"role": "tool", "tool_call_id": str(b.get("tool_use_id", "")),
                    "content": ("Error: " + text) if b.get("is_error") else text})
    if not out or rest:
        out.append({"role": "user", "content": message_text(rest, param)})
    return out


def parse_count_tokens(body, model, n_slots):
    """POST /v1/messages/count_tokens: the spec /v1/messages would build for the same body (its
    rendered prompt is what gets counted); the request has no max_tokens of its own."""
    return parse_messages({**body, "max_tokens": 1}, model, n_slots)


def event(name, obj):
    return f"event: {name}\ndata: ".encode() + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() \
        + b"\n\n"


def stop_reason(finish, stop_seq, usage, max_tokens):
    if finish == "tool_calls":
        return "tool_use"
    if stop_seq is not None:
        return "stop_sequence"
    if finish != "length":
        return "end_turn"
    # `length` without reaching max_tokens means the context window filled up
    return "max_tokens" if usage["completion"] >= max_tokens else "model_context_window_exceeded"


def _usage(u):
    return {"input_tokens": u["prompt"] - u["reused"], "cache_read_input_tokens": u["reused"],
            "cache_creation_input_tokens": 0, "output_tokens": u["completion"]}


class MessagesResponder:
    def __init__(self, spec, model_id):
        self.spec, self.model_id = spec, model_id
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self.index, self.kind = -1, None

    def _reason(self, finish, stop_seq, usage):
        return stop_reason(finish, stop_seq, usage, self.spec.opts["max_tokens"])

    def _message(self, content, usage, reason=None, stop_seq=None):
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model_id, "content": content,
                "stop_reason": reason, "stop_sequence": stop_seq, "usage": _usage(usage)}

    def stream_start(self, usage):
        return [event("message_start", {"type": "message_start", "message": self._message([], usage)}),
                event("ping", {"type": "ping"})]

    def _close_block(self):
        return [event("content_block_stop", {"type": "content_block_stop", "index": self.index})] \
            if self.kind else []

    def stream_piece(self, kind, text, entries):
        if kind.startswith("tool_call"):
            return self._tool_use(kind, text)
        out = []
        if kind != self.kind:
            out += self._close_block()
            self.index, self.kind = self.index + 1, kind
            block = {"type": "thinking", "thinking": "", "signature": ""} if kind == "reasoning" \
                else {"type": "text", "text": ""}
            out.append(event("content_block_start", {"type": "content_block_start", "index": self.index,
                                                     "content_block": block}))
        if text:
            delta = {"type": "thinking_delta", "thinking": text} if kind == "reasoning" \
                else {"type": "text_delta", "text": text}
            out.append(event("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                                     "delta": delta}))
        return out

    def _tool_use(self, kind, value):
        """A tool_use block: start, its input as input_json_delta fragments, stop (a whole call
        is all three at once)."""
        out = []
        if kind in ("tool_call", "tool_call_start"):
            out += self._close_block()
            self.index, self.kind = self.index + 1, "tool_use"
            name = value["name"] if kind == "tool_call" else value
            block = {"type": "tool_use", "id": tool_request.call_id("toolu_"), "name": name, "input": {}}
            out.append(event("content_block_start", {"type": "content_block_start", "index": self.index,
                                                     "content_block": block}))
        args = json.dumps(value["arguments"], ensure_ascii=False) if kind == "tool_call" else \
            value if kind == "tool_call_args" else None
        if args:
            out.append(event("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                                     "delta": {"type": "input_json_delta", "partial_json": args}}))
        if kind in ("tool_call", "tool_call_end"):
            out += self._close_block()
            self.kind = None
        return out

    def stream_end(self, finish, stop_seq, usage):
        return self._close_block() + [
            event("message_delta", {"type": "message_delta",
                                    "delta": {"stop_reason": self._reason(finish, stop_seq, usage),
                                              "stop_sequence": stop_seq},
                                    "usage": _usage(usage)}),
            event("message_stop", {"type": "message_stop"})]

    def stream_error(self, err):
        return [event("error", err.body("anthropic"))]

    def body(self, content, reasoning, entries, finish, stop_seq, usage, calls=()):
        blocks = []
        if reasoning:
            blocks.append({"type": "thinking", "thinking": reasoning, "signature": ""})
        if content or not calls:
            blocks.append({"type": "text", "text": content})
        blocks += [{"type": "tool_use", "id": tool_request.call_id("toolu_"), "name": c["name"], "input": c["arguments"]}
                   for c in calls]
        return self._message(blocks, usage, self._reason(finish, stop_seq, usage), stop_seq)

