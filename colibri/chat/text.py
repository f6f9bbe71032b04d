"""The generated text stream between the engine and the API: stop sequences matched across token
boundaries, and the <think>...</think> split into reasoning vs content (pipeline.py chains them
after UTF-8 decoding)."""

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def partial_suffix(text, needle):
    """Length of the longest suffix of `text` that is a proper prefix of `needle`."""
    for k in range(min(len(needle) - 1, len(text)), 0, -1):
        if text.endswith(needle[:k]):
            return k
    return 0


class StopMatcher:
    """Finds the first stop sequence in a stream; text that might begin one is held back."""

    def __init__(self, stops):
        self.stops = [s for s in stops if s]
        self.buf = ""

    def feed(self, text):
        """Returns (text safe to emit, the matched stop sequence or None)."""
        self.buf += text
        if not self.stops:
            out, self.buf = self.buf, ""
            return out, None
        best = None
        for s in self.stops:
            i = self.buf.find(s)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best:
            out, self.buf = self.buf[:best[0]], ""
            return out, best[1]
        hold = max(partial_suffix(self.buf, s) for s in self.stops)
        cut = len(self.buf) - hold
        out, self.buf = self.buf[:cut], self.buf[cut:]
        return out, None

    def flush(self):
        out, self.buf = self.buf, ""
        return out


class ThinkSplitter:
    """Splits text into ('reasoning', s) and ('content', s) pieces at <think> / </think>.

    `in_reasoning`: the prompt already opened a <think> block (the template ends with it).
    Otherwise an output that starts with <think> (after whitespace) opens one, unless `answered`
    (the output continues an answer, so a <think> in it is text). `marks` also yields
    ("think_start",) and ("think_end",) where a block opens and closes (the terminal chat shows them).
    """

    def __init__(self, enabled, in_reasoning=False, answered=False, marks=False):
        self.enabled, self.marks = enabled, marks
        if not enabled or (answered and not in_reasoning):
            self.state = "content"
        else:
            self.state = "reasoning" if in_reasoning else "start"
        self.buf = ""
        self.strip_next = False  # drop the blank lines the model puts after </think>

    def feed(self, text):
        if self.state == "content" and not self.enabled:
            return [("content", text)] if text else []
        self.buf += text
        out = []
        while True:
            if self.state == "start":
                s = self.buf.lstrip()
                if s.startswith(THINK_OPEN):
                    self.buf = s[len(THINK_OPEN):]
                    self.state = "reasoning"
                    if self.marks:
                        out.append(("think_start",))
                    continue
                if THINK_OPEN.startswith(s):  # empty or a partial tag: wait
                    return out
                self.state = "content"
                continue
            if self.state == "reasoning":
                i = self.buf.find(THINK_CLOSE)
                if i >= 0:
                    if i:
                        out.append(("reasoning", self.buf[:i]))
                    self.buf = self.buf[i + len(THINK_CLOSE):]
                    self.state, self.strip_next = "content", True
                    if self.marks:
                        out.append(("think_end",))
                    continue
                cut = len(self.buf) - partial_suffix(self.buf, THINK_CLOSE)
                if cut:
                    out.append(("reasoning", self.buf[:cut]))
                self.buf = self.buf[cut:]
                return out
            # content
            if self.strip_next:
                self.buf = self.buf.lstrip()
                if not self.buf:
                    return out
                self.strip_next = False
            if self.buf:
                out.append(("content", self.buf))
            self.buf = ""
            return out

    def flush(self):
        rest, self.buf = self.buf, ""
        if not rest or (self.strip_next and not rest.strip()):
            return []
        kind = "reasoning" if self.state == "reasoning" else "content"
        return [(kind, rest.lstrip() if self.strip_next else rest)]


def token_text(b):
    """A token's bytes as a display string; partial UTF-8 is written as \\xNN like OpenAI does."""
    return b.decode("utf-8", errors="backslashreplace")
