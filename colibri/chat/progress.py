"""Prompt progress on a terminal: a long prompt's prefill can take minutes (streamed experts, an
agent's 30k-token context), and a silent terminal looks hung. The engine reports each prefill
chunk (PROGRESS frames, SUBMIT progress=1); after the first few seconds one status line shows the
positions done and the rate, and it is cleared when the first token arrives."""
import sys

SHOW_AFTER_MS = 2000  # a prompt done sooner shows nothing


class PromptProgress:
    def __init__(self, stream=None, show_after_ms=SHOW_AFTER_MS):
        self.stream = stream if stream is not None else sys.stderr
        self.show_after_ms = show_after_ms
        self.on = bool(getattr(self.stream, "isatty", lambda: False)())
        self.shown = False

    def event(self, ev):
        """Feeds one engine event (engine_client.Engine.generate); only progress and the first
        token after it matter."""
        if not self.on:
            return
        if ev[0] == "progress":
            done, total, reused, ms = ev[1:5]
            if done >= total or ms < self.show_after_ms:
                self.clear()
                return
            rate = (done - reused) / (ms / 1000) if ms > 0 else 0.0
            self.stream.write(f"\r\033[Kprompt {done}/{total} positions ({100 * done // total}%), {rate:.0f}/s")
            self.stream.flush()
            self.shown = True
        else:
            self.clear()

    def clear(self):
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.shown = False
