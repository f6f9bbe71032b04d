"""gpt-oss's harmony format on the output side: the generated stream is a sequence of messages

    <|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...<|return|>

(the prompt already ends with `<|start|>assistant`). HarmonySplitter turns it into the same
('reasoning', s) / ('content', s) pieces as text.ThinkSplitter: the analysis channel is the
reasoning, final and commentary are the answer, and the markup itself is dropped. The engine
must render special tokens into the text (SUBMIT render_special=1) so the markup is visible.
"""
import re

import family_registry
from colibri.chat.text import partial_suffix
from colibri.chat_template import render as chat_template
from colibri.toolcall import formats

START, CHANNEL, MESSAGE, END = "<|start|>", "<|channel|>", "<|message|>", "<|end|>"
TERMINATORS = (END, "<|return|>", "<|call|>")  # what ends a message body
REASONING_CHANNELS = ("analysis",)
# A header longer than this without <|message|> is not harmony: the rest is passed on as text.
MAX_HEADER = 512
# what a header may begin with, after an optional <|start|> and role
HEADER_OPENERS = (CHANNEL, " to=", "<|constrain|>")
ROLE = re.compile(r"[\w.\-]*")  # assistant, or a tool's functions.name
EFFORTS = ("low", "medium", "high")  # the reasoning levels the harmony system message names


def effort_error(value):
    """None if `value` is a reasoning effort the harmony format knows, else the reason it is not."""
    if value in EFFORTS:
        return None
    return (f"{value!r} is not a reasoning effort this model knows: use low, medium or high "
            f"(gpt-oss always reasons; low reasons least)")


def uses_harmony(template, family_facts):
    """True when the model writes harmony messages: the registry says so, or its chat template
    opens assistant turns with <|start|>assistant and names channels."""
    if (family_facts or {}).get("reasoning") == "harmony":
        return True
    return bool(template) and "<|start|>assistant" in template and "<|channel|>" in template


def speaks_harmony(model_dir, family):
    """True when the model answers in harmony messages (gpt-oss): its registry entry or template says so."""
    facts = family_registry.FAMILIES.get(family, {})
    try:
        source = chat_template.load_chat_template(str(model_dir))
    except Exception:  # noqa: BLE001 - no readable template: plain text
        return False
    return uses_harmony(source, facts)


class HarmonySplitter:
    """Streams harmony messages into ('reasoning', s) / ('content', s) pieces; text that cannot
    begin a header is passed on as content (a model that does not speak harmony loses nothing).
    `marks`: also ("think_start",) / ("think_end",) around each analysis message (coli chat)."""

    def __init__(self, marks=False):
        self.marks = marks
        self.state = "header"    # header | body | raw
        self.kind = None         # the body's piece kind
        self.buf = ""
        self.primed = ""         # the header's start that came from the prompt, never emitted

    @classmethod
    def after_prompt(cls, prompt_text, marks=False):
        """A splitter in the state the prompt leaves the model in: normally inside the header the
        generation prompt opened; inside a message body when the prompt ends in one (a prefill)."""
        s = cls(marks)
        i = prompt_text.rfind(START)
        if i >= 0:
            s.feed(prompt_text[i:])
            s.primed = s.buf if s.state == "header" else ""
        return s

    def _header_done(self, header):
        h = header
        if h.startswith(START):
            h = h[len(START):]
        channel = h.split(CHANNEL, 1)[1] if CHANNEL in h else ""
        channel = channel.split(" ", 1)[0].split("<|", 1)[0].strip()
        self.kind = "reasoning" if channel in REASONING_CHANNELS else "content"
        if "to=functions." in h:  # a tool call: its body is held and leaves as one piece
            self.kind, self.call_header, self.call_body = "call", h, ""
        self.state = "body"
        return [("think_start",)] if self.marks and self.kind == "reasoning" else []

    def _could_be_header(self, s):
        """False once `s` (the header so far) can no longer grow into a harmony header."""
        if not s or START.startswith(s):
            return True
        rest = s
        if s.startswith(START):  # a role follows <|start|>
            role = ROLE.match(s, len(START)).group()
            rest = s[len(START) + len(role):]
            if not rest:
                return True
        return any(rest.startswith(o) or o.startswith(rest) for o in HEADER_OPENERS)

    def feed(self, text):
        self.buf += text
        out = []
        while self.buf:
            if self.state == "raw":
                out.append(("content", self.buf))
                self.buf = ""
            elif self.state == "header":
                i = self.buf.find(MESSAGE)
                head = self.buf if i < 0 else self.buf[:i]
                j = head.rfind(START)
                if j > 0:  # a header started over (`<|start|>assistant` repeated): the last one counts
                    self.buf, head, self.primed = self.buf[j:], head[j:], ""
                    continue
                if not self._could_be_header(head) or len(head) > MAX_HEADER:
                    self.state = "raw"
                    if self.primed and self.buf.startswith(self.primed):
                        self.buf = self.buf[len(self.primed):]
                    continue
                if i < 0:
                    break
                self.buf, self.primed = self.buf[i + len(MESSAGE):], ""
                out += self._header_done(head)
            else:  # body
                hits = [(self.buf.find(t), t) for t in TERMINATORS if t in self.buf]
                if hits:
                    i, t = min(hits)
                    if self.kind == "call":
                        out.append(self._call(self.buf[:i]))
                    elif i:
                        out.append((self.kind, self.buf[:i]))
                    self.buf = self.buf[i + len(t):]
                    if self.marks and self.kind == "reasoning":
                        out.append(("think_end",))
                    self.state, self.kind = "header", None
                    continue
                hold = max(partial_suffix(self.buf, t) for t in TERMINATORS)
                cut = len(self.buf) - hold
                if cut and self.kind == "call":
                    self.call_body += self.buf[:cut]
                elif cut:
                    out.append((self.kind, self.buf[:cut]))
                self.buf = self.buf[cut:]
                break
        return out

    def _call(self, tail):
        """The end of a function call's body: ("tool_call", call), or its text when it is no call."""
        body, self.call_body = self.call_body + tail, ""
        call = formats.harmony_call(self.call_header, body)
        return ("tool_call", call) if call else ("content", body)

    def flush(self):
        rest, self.buf = self.buf, ""
        if self.state == "body" and self.kind == "call":
            return [self._call(rest)]
        if self.state == "body":
            return ([(self.kind, rest)] if rest else []) + \
                ([("think_end",)] if self.marks and self.kind == "reasoning" else [])
        # an unfinished header is dropped; text that was never harmony stays
        return [("content", rest)] if rest and self.state == "raw" else []
