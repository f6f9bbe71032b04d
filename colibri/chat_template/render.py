"""Chat templates rendered exactly as Hugging Face transformers renders them, without jinja2.

A checkpoint ships its prompt format as a Jinja2 template (`chat_template` in
tokenizer_config.json, or chat_template.jinja beside it). transformers'
`apply_chat_template` renders it in a sandboxed jinja2 environment with trim_blocks,
lstrip_blocks and loop controls, plus the globals `raise_exception`, `strftime_now`,
`namespace`, `dict` and a `tojson` filter that is plain `json.dumps(ensure_ascii=False)`.

colibri's launcher is stdlib-only, so it carries its own interpreter for the part of
Jinja2 that chat templates use, following jinja2's own lexer, parser and runtime rules:

    source --lex()--> tokens --Parser--> tuple AST --Renderer--> text
           syntax.py                           runtime.py

Anything outside that subset raises TemplateError naming the construct and the line: a
template renders byte-for-byte as transformers renders it, or not at all.

This module is the public face: render_chat() prepares messages and variables exactly as
apply_chat_template does; load_chat_template() and load_special_tokens() read them from a
checkpoint directory the way transformers does; render_for_model() combines the three.
"""

import json
import os
from collections import abc
from functools import lru_cache

from colibri.chat_template.runtime import Renderer, Scope, TemplateError, Undefined, type_name
from colibri.chat_template.syntax import Parser, lex

__all__ = [
    "TemplateError", "ChatTemplate", "render_chat", "render_for_model",
    "load_chat_template", "load_special_tokens", "SPECIAL_TOKEN_NAMES", "Undefined",
]

# Named special tokens transformers passes to every template (PreTrainedTokenizerBase).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token",
                       "pad_token", "cls_token", "mask_token")


class ChatTemplate:
    """A parsed template; render(**variables) may be called many times."""

    def __init__(self, source):
        if not isinstance(source, str):
            raise TemplateError(f"a chat template must be a string, got {type_name(source)}")
        self.source = source
        try:
            self.body = Parser(lex(source)).parse()
        except RecursionError:  # the parser recurses once per nesting level
            raise TemplateError("the template nests blocks or expressions too deeply to "
                                "parse") from None

    def render(self, **variables):
        out = []
        Renderer().exec_body(self.body, Scope(None, dict(variables)), out)
        return "".join(out)


@lru_cache(maxsize=32)
def _compiled(source):
    return ChatTemplate(source)


def _plain(value):
    """Copy inputs into plain JSON-like data, as transformers' _plain_template_data does."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, abc.Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return f"<{type(value).__name__}>"


_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def _prepare_messages(messages):
    """transformers' message normalisation: drop None-valued keys, then expose a message's
    reasoning under both `thinking` and `reasoning_content` (the field names templates read)."""
    prepared = []
    for message in messages:
        if not isinstance(message, abc.Mapping):
            raise TemplateError(f"chat messages must be dicts, got {type_name(message)}")
        message = _plain({k: v for k, v in message.items() if v is not None})
        reasoning = next((message[k] for k in _REASONING_FIELDS
                          if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        prepared.append(message)
    return prepared


def render_chat(template_source, messages, *, add_generation_prompt=True, tools=None,
                documents=None, bos_token=None, eos_token=None,
                continue_final_message=False, **extra):
    """Render `messages` the way tokenizer.apply_chat_template(..., tokenize=False) does.

    bos_token/eos_token (and any other special token passed in **extra, see
    load_special_tokens) are only defined for the template when not None, like
    transformers' special_tokens_map. Extra keyword arguments (enable_thinking,
    reasoning_effort, date_string, ...) become template variables.
    continue_final_message (True, or the name of the field to continue) leaves the last
    message open for the model to continue, as in transformers.
    """
    template = _compiled(template_source)
    if not messages:
        raise TemplateError("Cannot apply chat template to an empty conversation.")
    chat = _prepare_messages(messages)
    variables = {k: v for k, v in (("bos_token", bos_token), ("eos_token", eos_token))
                 if v is not None}
    variables.update(_plain({k: v for k, v in extra.items()
                             if not (k in SPECIAL_TOKEN_NAMES and v is None)}))
    final = None
    if continue_final_message:
        if add_generation_prompt:
            raise TemplateError("continue_final_message and add_generation_prompt are not "
                                "compatible")
        final = _mark_final_message(chat, template_source, continue_final_message)
    rendered = template.render(messages=chat, tools=_plain(tools), documents=_plain(documents),
                               add_generation_prompt=add_generation_prompt, **variables)
    if continue_final_message:
        rendered = _cut_at_continue_tag(rendered, final)
    return rendered


def _mark_final_message(chat, template_source, continue_final_message):
    # mirrors transformers.render_jinja_template's continue_final_message handling
    field = continue_final_message if isinstance(continue_final_message, str) else "content"
    final = chat[-1].get(field)
    if final is None:
        raise TemplateError(f'continue_final_message is set but the final message has no '
                            f'"{field}" to continue')
    fields = [field]
    if field in _REASONING_FIELDS:
        fields = [f for f in _REASONING_FIELDS if chat[-1].get(f) == final]
    if not any(f in template_source for f in fields):
        raise TemplateError(f'continue_final_message is set to "{field}" but this is not an '
                            f'accepted field in the chat_template')
    if isinstance(final, (list, tuple)):
        for block in reversed(final):
            if "text" in block:
                final = block["text"]
                block["text"] = block["text"] + _CONTINUE_TAG
                break
        else:
            raise TemplateError("continue_final_message is set but there is no text to "
                                "continue in the final message")
    else:
        for f in fields:
            chat[-1][f] = chat[-1][f] + _CONTINUE_TAG
    return final


def _cut_at_continue_tag(rendered, final):
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in rendered or tag not in rendered:
        raise TemplateError("continue_final_message is set but the final message does not "
                            "appear in the rendered chat")
    loc = rendered.rindex(tag)
    if rendered[loc:loc + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:loc]
    return rendered[:loc].rstrip()


def _read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def load_chat_template(model_dir, name=None, tools=None):
    """The checkpoint's chat template source, found the way transformers finds it:
    chat_template.jinja and additional_chat_templates/*.jinja first, then
    tokenizer_config.json's "chat_template" (a string, or a list of {name, template}).
    With several templates: `name` if given, "tool_use" when tools are passed, else "default".
    """
    templates = {}
    jinja_file = os.path.join(model_dir, "chat_template.jinja")
    if os.path.isfile(jinja_file):
        with open(jinja_file, encoding="utf-8") as f:
            templates["default"] = f.read()
    extra_dir = os.path.join(model_dir, "additional_chat_templates")
    if os.path.isdir(extra_dir):
        for fname in sorted(os.listdir(extra_dir)):
            if fname.endswith(".jinja"):
                with open(os.path.join(extra_dir, fname), encoding="utf-8") as f:
                    templates[fname[:-len(".jinja")]] = f.read()
    config_path = os.path.join(model_dir, "tokenizer_config.json")
    if not templates and os.path.isfile(config_path):
        value = _read_json(config_path).get("chat_template")
        if isinstance(value, str):
            templates["default"] = value
        elif isinstance(value, list):
            templates = {t["name"]: t["template"] for t in value}
        elif isinstance(value, dict):
            templates = dict(value)
    if not templates:
        raise TemplateError(f"{model_dir} has no chat template (looked for chat_template.jinja "
                            f"and \"chat_template\" in tokenizer_config.json); use --raw to "
                            f"send the prompt without one")
    if name is not None:
        if name not in templates:
            raise TemplateError(f"no chat template named {name!r} in {model_dir}; available: "
                                f"{', '.join(sorted(templates))}")
        return templates[name]
    if len(templates) == 1 and "default" in templates:
        return templates["default"]
    if tools is not None and "tool_use" in templates:
        return templates["tool_use"]
    if "default" in templates:
        return templates["default"]
    raise TemplateError(f"{model_dir} has several chat templates and none named 'default': "
                        f"{', '.join(sorted(templates))}")


def load_special_tokens(model_dir):
    """The named special tokens transformers passes to the template (bos_token, eos_token,
    unk_token, ...), from tokenizer_config.json (plain strings or {"content": ...}), with the
    legacy special_tokens_map.json consulted as transformers does."""
    config_path = os.path.join(model_dir, "tokenizer_config.json")
    config = _read_json(config_path) if os.path.isfile(config_path) else {}
    values = {k: config.get(k) for k in SPECIAL_TOKEN_NAMES}
    legacy = os.path.join(model_dir, "special_tokens_map.json")
    if "added_tokens_decoder" not in config and os.path.isfile(legacy):
        values.update({k: v for k, v in _read_json(legacy).items() if k in SPECIAL_TOKEN_NAMES})
    tokens = {}
    for key, value in values.items():
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            tokens[key] = value
    return tokens


def render_for_model(model_dir, messages, *, add_generation_prompt=True, tools=None, **extra):
    """Render with the checkpoint's own template and special tokens."""
    source = load_chat_template(model_dir, tools=tools)
    variables = {**load_special_tokens(model_dir), **extra}
    return render_chat(source, messages, add_generation_prompt=add_generation_prompt,
                       tools=tools, **variables)
