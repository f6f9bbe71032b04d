"""Engine DATA bytes to the pieces an answer streams: UTF-8 decoding, then the stop sequences,
then the reasoning split (<think> tags, or harmony channels for a model that writes them). It
sits above text.py and harmony.py so that neither needs the other's module back."""
import codecs

from colibri.chat.harmony import HarmonySplitter
from colibri.chat.text import StopMatcher, ThinkSplitter


class TextPipeline:
    """Engine DATA bytes -> [(kind, text)] with stop sequences removed.

    Stop sequences are matched on the raw generated text (reasoning included), like vLLM."""

    def __init__(self, stops=(), think=False, in_reasoning=False, harmony_prompt=None):
        """harmony_prompt: the prompt text of a model that writes harmony messages (gpt-oss)."""
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stop = StopMatcher(stops)
        if harmony_prompt is not None:
            self.think = HarmonySplitter.after_prompt(harmony_prompt)
        else:
            self.think = ThinkSplitter(think, in_reasoning)
        self.matched = None
        self.raw = []  # everything the engine produced, for the KV slot table

    def feed(self, data):
        """Returns the pieces to emit; after a stop sequence matched, everything else is ignored."""
        if self.matched is not None:
            return []
        text = self.decoder.decode(data)
        self.raw.append(text)
        out, hit = self.stop.feed(text)
        pieces = self.think.feed(out)
        if hit is not None:
            self.matched = hit
            pieces += self.think.flush()
        return pieces

    def finish(self):
        if self.matched is not None:
            return []
        tail = self.decoder.decode(b"", final=True)
        self.raw.append(tail)
        out, hit = self.stop.feed(tail)
        if hit is not None:
            self.matched = hit
        else:
            out += self.stop.flush()
        return self.think.feed(out) + self.think.flush()
