"""The HF `tokenizers` reference for literal spans (docs/protocol.md, SUBMIT literal=): added
tokens are matched by HF itself in the text outside the spans; the spans' text is ordinary text,
normalized, pre-tokenized and BPE-encoded together with the text around it, which is how HF
treats a special token's text under encode_special_tokens=True."""
import json
from pathlib import Path


class LiteralReference:
    def __init__(self, tokenizer_json):
        from tokenizers import Tokenizer
        text = Path(tokenizer_json).read_text(encoding="utf-8")
        self.hf = Tokenizer.from_str(text)
        spec = json.loads(text)
        spec["added_tokens"] = []  # what is left is HF's ordinary-text pipeline
        self.plain = Tokenizer.from_str(json.dumps(spec))
        self.added = {i: t.content for i, t in self.hf.get_added_tokens_decoder().items()}

    def encode(self, text, spans=()):
        """Token ids of text with literal byte ranges `spans`."""
        data = text.encode("utf-8")
        regions, pos = [], 0
        for a, b in spans:
            regions += [(data[pos:a], False), (data[a:b], True)]
            pos = b
        regions.append((data[pos:], False))
        ids, pending = [], []
        for raw, literal in regions:
            chunk = raw.decode("utf-8")
            if literal:
                pending.append(chunk)
                continue
            cut = 0
            enc = self.hf.encode(chunk, add_special_tokens=False)
            for tid, (s, e) in zip(enc.ids, enc.offsets):
                if self.added.get(tid) == chunk[s:e]:
                    pending.append(chunk[cut:s])
                    ids += self._plain("".join(pending))
                    pending, cut = [], e
                    ids.append(tid)
            pending.append(chunk[cut:])
        return ids + self._plain("".join(pending))

    def _plain(self, text):
        return self.plain.encode(text, add_special_tokens=False).ids if text else []
