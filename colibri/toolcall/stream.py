"""Holds tool calls back from the visible answer while it streams.

Content text passes through until a family's call marker (or a prefix of one, at the end of
what arrived so far) appears; from there the text is held until the call region closes, then
it leaves as ("tool_call", call) pieces, or as plain content when it turns out to be no call.
Whitespace right before and after a call is layout, not content: it is dropped.

Formats with streamable JSON arguments (Format.args_head) stream a call as it is written:
("tool_call_start", name), ("tool_call_args", fragment)..., ("tool_call_end", call or None); the
fragments join to the arguments' JSON text as the model wrote it."""
from colibri.chat.text import partial_suffix


class ToolCallFilter:
    def __init__(self, fmt, schemas=None, max_calls=None):
        self.fmt, self.schemas, self.max_calls = fmt, schemas or {}, max_calls
        self.buf, self.in_call, self.blanks = "", False, ""
        self.started = False     # some content (not whitespace) or a call came already
        self.strip_next = False  # drop the whitespace that follows a call
        self.calls = 0
        self.streaming = None    # (where the arguments start, how much of them went out) of the call in progress

    def feed(self, text):
        self.buf += text
        out = []
        while self.buf:
            if self.in_call:
                end = self.fmt.find_end(self.buf)
                if self.fmt.args_head is not None:
                    self._stream_args(end, out)
                if end < 0:
                    return out
                self._region(self.buf[:end], False, out)
                self.buf = self.buf[end:]
                continue
            if self.strip_next:
                self.buf = self.buf.lstrip()
                if not self.buf:
                    return out
                self.strip_next = False
            at = self._marker_at()
            if at is None:  # no call here: emit all but a possible marker start and trailing blanks
                hold = 0 if (self.fmt.start_only and self.started) else \
                    max(partial_suffix(self.buf, m) for m in self.fmt.starts)
                cut = len(self.buf) - hold
                text_part = self.buf[:cut]
                keep = len(text_part) - len(text_part.rstrip())
                self._content(text_part[:len(text_part) - keep], out)
                self.buf = text_part[len(text_part) - keep:] + self.buf[cut:]
                return out
            before = self.buf[:at]
            self._content(before.rstrip(), out)
            self.blanks = before[len(before.rstrip()):]  # shown again if the region is no call
            self.buf, self.in_call = self.buf[at:], True
        return out

    def _marker_at(self):
        if self.fmt.start_only:
            if self.started:
                return None
            s = self.buf.lstrip()
            for m in self.fmt.starts:
                if s.startswith(m):
                    return len(self.buf) - len(s)
            return None
        hits = [i for i in (self.buf.find(m) for m in self.fmt.starts) if i >= 0]
        return min(hits) if hits else None

    def _content(self, text, out):
        if text:
            out.append(("content", text))
            if text.strip():
                self.started = True

    def _stream_args(self, end, out):
        """Sends what is sure to be arguments: all but a final '}' and the end marker, which
        close the call's object rather than the arguments."""
        if self.streaming is None:
            m = self.fmt.args_head.match(self.buf)
            if not m or (self.max_calls is not None and self.calls >= self.max_calls):
                return
            self.streaming = [m.end(), m.end()]
            out.append(("tool_call_start", m.group(1)))
        head, sent = self.streaming
        text = self.buf[:end] if end >= 0 else self.buf
        if text.endswith(self.fmt.args_end):
            text = text[:-len(self.fmt.args_end)]
        elif end < 0:
            text = text[:len(text) - partial_suffix(text, self.fmt.args_end)]
        text = text.rstrip()
        safe = len(text) - 1 if text.endswith("}") else len(text)
        if safe > sent:
            out.append(("tool_call_args", self.buf[sent:safe]))
            self.streaming[1] = safe

    def _region(self, region, final, out):
        self.in_call = False
        calls = self.fmt.parse(region, self.schemas, final)
        if self.streaming is not None:  # the call went out in pieces already: close it
            self.streaming = None
            self.calls += 1
            call = calls[0] if calls else None
            self.started, self.strip_next = True, call is not None
            out.append(("tool_call_end", call))
            if call is None:
                self._content(self.blanks + region, out)
            return
        if calls is None:
            self._content(self.blanks + region, out)
            return
        self.started = self.strip_next = True
        for c in calls:
            if self.max_calls is None or self.calls < self.max_calls:
                self.calls += 1
                out.append(("tool_call", c))

    def take(self, call):
        """A call found upstream (the harmony splitter), counted against max_calls."""
        out = []
        self.started = self.strip_next = True
        if self.max_calls is None or self.calls < self.max_calls:
            self.calls += 1
            out.append(("tool_call", call))
        return out

    def finish(self):
        out = []
        rest, self.buf = self.buf, ""
        if self.in_call:
            self.buf = rest.rstrip()
            if self.fmt.args_head is not None:
                self._stream_args(len(self.buf), out)
            self.buf = ""
            self._region(rest.rstrip(), True, out)
        elif not self.strip_next:
            self._content(rest, out)
        return out

    def done(self):
        """The calls allowed (max_calls) are all out: the rest of the answer is not needed."""
        return self.max_calls is not None and self.calls >= self.max_calls
