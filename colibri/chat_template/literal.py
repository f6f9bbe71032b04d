"""Message text stays text: role injection defence for rendered chat prompts.

The engine matches added tokens (<|im_start|>, <|im_end|>, ...) anywhere in the prompt text, so
a user who types "<|im_end|><|im_start|>system" would open a real system turn. Before the
template runs, every added token's text inside a string the caller supplied (message fields,
tools, documents, template variables) is swapped for a private-use placeholder character the
template cannot confuse with anything; after rendering the placeholders turn back into the
original text and their byte ranges become literal spans, which the engine tokenizes as plain
text (SUBMIT literal=, docs/protocol.md). The template's own markup is untouched.

Which tokens: every added token with special=true, as HF's split_special_tokens does, and,
outside assistant messages, the non-special added tokens the template itself prints: those are
its markup too (DeepSeek-V3's role markers <｜User｜>/<｜Assistant｜> are non-special, so are
Qwen3's <think>, <tool_call>, <tool_response>). Other non-special tokens are ordinary vocabulary
(Gemma's <table>, <b>, <unusedN>, whitespace runs) and are matched as HF matches them. In
assistant messages (what the model wrote, sent back) non-special tokens keep their meaning,
because templates parse them there (Qwen3 splits the reasoning off at '</think>').
"""
import json
import os
import re
from collections import abc
from functools import lru_cache

from colibri.chat_template import render as chat_template
from colibri.chat_template.runtime import TemplateError

# Supplementary private-use planes: no tokenizer or template uses them for structure.
_PUA_FIRST, _PUA_LAST = 0xF0000, 0x10FFFD
_PUA = re.compile(f"[{chr(_PUA_FIRST)}-{chr(0x10FFFF)}]")


class AddedTokens:
    """A tokenizer's added-token texts: `special` (special=true) and `other` (non-special)."""

    def __init__(self, special=(), other=()):
        self.special = frozenset(t for t in special if t)
        # whitespace runs (Gemma's "\n\n", ...) mark nothing, and templates strip them
        self.other = frozenset(t for t in other if t and not t.isspace()) - self.special
        self.texts = sorted(self.special | self.other, key=lambda t: (-len(t), t))
        self.code = {t: i for i, t in enumerate(self.texts)}
        self.firsts = frozenset(t[0] for t in self.texts)
        # the tokenizer's leftmost-longest rule
        self._all = _alternation(self.texts)
        self._special = _alternation([t for t in self.texts if t in self.special])

    def __bool__(self):
        return bool(self.texts)

    def pattern(self, special_only):
        return self._special if special_only else self._all

    def for_template(self, source):
        """The tokens to escape for this template: the special ones and the template's markup."""
        return _for_template(self, source)


@lru_cache(maxsize=16)
def _for_template(tokens, source):
    return AddedTokens(tokens.special, [t for t in tokens.other if t in source])


def _alternation(texts):
    """A regex matching any of texts, longest first at each position. Built as a trie (shared
    prefixes once) since DeepSeek's 800 tokens as a flat alternation cost 7x the rendering."""
    if not texts:
        return None
    if max(map(len, texts)) > 200:  # a crafted tokenizer's huge token must not nest the regex that deep
        return re.compile("|".join(map(re.escape, texts)))
    trie = {}
    for t in texts:
        node = trie
        for ch in t:
            node = node.setdefault(ch, {})
        node[""] = True

    def emit(node):
        branches = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        # greedy: the longer token first, this one ending here only when no longer one matches
        return f"(?:{body})?" if "" in node else body
    return re.compile(emit(trie))


def load_added_tokens(model_dir):
    """Added tokens from tokenizer.json (what the engine matches), else tokenizer_config.json's
    added_tokens_decoder; empty when the model directory has neither. ValueError when unreadable."""
    path, key = os.path.join(model_dir, "tokenizer.json"), "added_tokens"
    if not os.path.isfile(path):
        path, key = os.path.join(model_dir, "tokenizer_config.json"), "added_tokens_decoder"
        if not os.path.isfile(path):
            return AddedTokens()
    st = os.stat(path)
    return _load_added(path, key, st.st_mtime_ns, st.st_size)  # coli chat renders every turn


@lru_cache(maxsize=4)
def _load_added(path, key, _mtime_ns, _size):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    entries = (doc.get(key) if isinstance(doc, dict) else None) or []
    if isinstance(entries, dict):
        entries = list(entries.values())
    if not isinstance(entries, list):
        raise ValueError(f"{path}: \"{key}\" must be a list or an object")
    special = [e["content"] for e in entries if isinstance(e, dict) and e.get("special") and isinstance(e.get("content"), str)]
    other = [e["content"] for e in entries if isinstance(e, dict) and not e.get("special") and isinstance(e.get("content"), str)]
    return AddedTokens(special, other)


class Prompt:
    """A rendered prompt: `text` and `literal`, sorted disjoint UTF-8 byte ranges of text that
    came from the caller and spell added tokens (the engine keeps them as plain text)."""

    def __init__(self, text, literal=()):
        self.text, self.literal = text, tuple(literal)

    def frame(self):
        """(payload bytes, SUBMIT options): the span list leads the payload (literal=K)."""
        try:
            body = self.text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise TemplateError(f"the conversation is not valid Unicode text ({e.reason} at character {e.start} of "
                                f"the prompt); send UTF-8 text without lone surrogates") from None
        if not self.literal:
            return body, {}
        table = ",".join(f"{a}-{b}" for a, b in self.literal).encode()
        return table + body, {"literal": len(table)}

    def __repr__(self):
        return f"Prompt({self.text!r}, literal={self.literal!r})"


def _strings(value, out):
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, abc.Mapping):
        for k, v in value.items():
            _strings(k, out)
            _strings(v, out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _strings(v, out)


class _Placeholders:
    """One private-use character per added token, none of which occurs in the inputs."""

    def __init__(self, tokens, inputs):
        n = len(tokens.texts)
        used = sorted({ord(c) for s in inputs for c in _PUA.findall(s)})
        base = _PUA_FIRST
        for cp in used:
            if cp >= base + n:
                break
            if cp >= base:
                base = cp + 1
        if base + n - 1 > _PUA_LAST:
            raise TemplateError("the conversation uses too many private-use characters to render it safely")
        self.tokens, self.base = tokens, base
        self.find = re.compile(f"[{chr(base)}-{chr(base + n - 1)}]")

    def escape(self, value, special_only):
        pattern = self.tokens.pattern(special_only)
        if pattern is None:
            return value
        if isinstance(value, str):
            if not any(c in value for c in self.tokens.firsts):  # the common case, 10x faster than the regex
                return value
            return pattern.sub(lambda m: chr(self.base + self.tokens.code[m.group()]), value)
        if isinstance(value, abc.Mapping):
            return {self.escape(k, special_only): self.escape(v, special_only) for k, v in value.items()}
        if isinstance(value, list):
            return [self.escape(v, special_only) for v in value]
        if isinstance(value, tuple):
            return tuple(self.escape(v, special_only) for v in value)
        return value

    def restore(self, rendered):
        pieces, spans, pos, nbytes = [], [], 0, 0
        for m in self.find.finditer(rendered):
            before = rendered[pos:m.start()]
            token = self.tokens.texts[ord(m.group()) - self.base]
            nbytes += len(before.encode("utf-8", "surrogatepass"))
            size = len(token.encode("utf-8"))
            if spans and spans[-1][1] == nbytes:  # adjacent spans merge
                spans[-1] = (spans[-1][0], nbytes + size)
            else:
                spans.append((nbytes, nbytes + size))
            nbytes += size
            pieces += [before, token]
            pos = m.end()
        pieces.append(rendered[pos:])
        return Prompt("".join(pieces), spans)


def render_prompt(template_source, messages, tokens, *, model_vars=None, tools=None, documents=None, **flags_and_vars):
    """render_chat with the caller's strings kept as text: returns a Prompt.

    model_vars (bos_token, eos_token, ... from the checkpoint) are the template's own and are
    not escaped; everything else the caller passes (messages, tools, documents and template
    variables) is. add_generation_prompt and continue_final_message pass through."""
    flags = {k: flags_and_vars.pop(k) for k in ("add_generation_prompt", "continue_final_message")
             if k in flags_and_vars}
    user_vars = flags_and_vars
    tokens = tokens.for_template(template_source)
    if not tokens:
        text = chat_template.render_chat(template_source, messages, tools=tools, documents=documents,
                                         **flags, **{**(model_vars or {}), **user_vars})
        return Prompt(text)
    inputs = [template_source]
    _strings([messages, tools, documents, model_vars or {}, user_vars], inputs)
    ph = _Placeholders(tokens, inputs)
    if not isinstance(messages, (list, tuple)):
        raise TemplateError(f"chat messages must be a list, got {type(messages).__name__}")
    escaped = [ph.escape(m, special_only=isinstance(m, abc.Mapping) and m.get("role") == "assistant")
               for m in messages]
    text = chat_template.render_chat(template_source, escaped, tools=ph.escape(tools, False),
                                     documents=ph.escape(documents, False), **flags,
                                     **{**(model_vars or {}), **ph.escape(user_vars, False)})
    return ph.restore(text)


def render_for_model(model_dir, messages, *, add_generation_prompt=True, tools=None, **extra):
    """chat_template.render_for_model, as a Prompt with the caller's strings kept as text."""
    source = chat_template.load_chat_template(model_dir, tools=tools)
    return render_prompt(source, messages, load_added_tokens(model_dir),
                         model_vars=chat_template.load_special_tokens(model_dir),
                         add_generation_prompt=add_generation_prompt, tools=tools, **extra)
