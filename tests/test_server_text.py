"""The server's text stream logic without a server: stop sequences across arbitrary piece
boundaries, <think> splitting, UTF-8 split across DATA frames, the KV slot table."""
import random

import pytest

from colibri.server.scheduler import SlotTable  # noqa: E402
from colibri.chat.pipeline import TextPipeline  # noqa: E402
from colibri.chat.text import StopMatcher, ThinkSplitter  # noqa: E402


def run_stop(pieces, stops):
    m = StopMatcher(stops)
    out, hit = "", None
    for p in pieces:
        o, hit = m.feed(p)
        out += o
        if hit:
            return out, hit
    return out + m.flush(), None


def random_split(text, rng):
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, len(text) - 1))) if len(text) > 1 else []
    return [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]


@pytest.mark.parametrize("seed", range(40))
def test_stop_matches_across_any_split(seed):
    rng = random.Random(seed)
    alphabet = "ab<>/ \n"
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
    stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 4))]
    hits = [(text.find(s), s) for s in stops if s in text]
    out, hit = run_stop(random_split(text, rng), stops)
    if hits:
        pos = min(h[0] for h in hits)
        assert out == text[:pos] and hit in stops and text[pos:].startswith(hit)
    else:
        assert out == text and hit is None


def test_stop_holds_back_only_a_possible_prefix():
    m = StopMatcher(["END"])
    assert m.feed("abcE") == ("abc", None)
    assert m.feed("N") == ("", None)
    assert m.feed("x") == ("ENx", None)
    assert m.feed("yyEND tail") == ("yy", "END")


def split(pieces, enabled=True, in_reasoning=False):
    t = ThinkSplitter(enabled, in_reasoning)
    out = []
    for p in pieces:
        out += t.feed(p)
    out += t.flush()
    merged = {}
    for kind, text in out:
        merged[kind] = merged.get(kind, "") + text
    return merged


@pytest.mark.parametrize("seed", range(20))
def test_think_split_any_boundaries(seed):
    rng = random.Random(seed)
    text = "<think>\nweigh the options</think>\n\nThe answer is 4."
    assert split(random_split(text, rng)) == {"reasoning": "\nweigh the options", "content": "The answer is 4."}
    opened = "plan first</think>final"
    assert split(random_split(opened, rng), in_reasoning=True) == {"reasoning": "plan first", "content": "final"}


def test_think_split_edge_cases():
    assert split(["no thinking here"]) == {"content": "no thinking here"}
    assert split(["<thi", "nk>only reasoning"]) == {"reasoning": "only reasoning"}
    assert split(["<think>x</think>"]) == {"reasoning": "x"}
    assert split(["<thinking is a word"]) == {"content": "<thinking is a word"}
    assert split(["<think>a</think>b"], enabled=False) == {"content": "<think>a</think>b"}


def test_pipeline_utf8_split_and_stop_inside_reasoning():
    p = TextPipeline(stops=["é!"], think=True)
    data = "<think>caf".encode() + "é".encode()[:1]
    assert p.feed(data) == [("reasoning", "caf")]
    out = p.feed("é".encode()[1:] + "!tail".encode())
    assert p.matched == "é!" and out == []
    assert p.finish() == []


def test_slot_table_prefers_the_conversation_and_persists(tmp_path):
    path = str(tmp_path / "slots.json")
    t = SlotTable(3, path, "fp")
    a = "<s>user: apples"
    t.update(t.pick(a), a)
    b = "<s>user: boats"
    sb = t.pick(b)
    t.update(sb, b)
    assert t.pick(a + " assistant: ... user: more") == 0 and sb == 1
    assert t.pick("<s>user: cars") == 2             # an unused slot before evicting anyone
    t2 = SlotTable(3, path, "fp")
    assert t2.pick(b + " more") == 1                # the mapping survives a restart
    assert SlotTable(3, path, "other-model").pick(b + " more") == 0  # but not a model change
