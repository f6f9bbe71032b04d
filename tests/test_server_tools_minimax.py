"""`coli serve` on a MiniMax-M2 (minimax_m2) checkpoint with its official template: a scripted engine
writes the family's <minimax:tool_call> block in small pieces after its reasoning; the server answers
with a typed call (reasoning apart), streams it, writes it back into the next prompt in the template's
own syntax, and forces a named call with the family's grammar."""
import json
from pathlib import Path

import openai

from server_helpers import as_family, model  # noqa: F401
from test_server_tools import ASK, Scripted

TEMPLATE = Path(__file__).parent / "data" / "chat_templates" / "MiniMax-M2.jinja"
BOOK = {"type": "function", "function": {"name": "book", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "code": {"type": "string"},
                                     "guests": {"type": "integer"}, "terrace": {"type": "boolean"}},
    "required": ["city", "guests"]}}}
REPLY = ["Checking.\n</think>\n\nOn it.\n<mini", "max:tool_call>\n<invoke name=\"bo", "ok\">\n<parameter name=\"city\">Pa",
         "ris</para", "meter>\n<parameter name=\"code\">007</parameter>\n<parameter name=\"guests\">4</parameter>\n",
         "<parameter name=\"terrace\">true</parameter>\n</invoke>\n</minimax:tool_call>"]
ARGS = {"city": "Paris", "code": "007", "guests": 4, "terrace": True}


def test_minimax_call_round_trip(model, tmp_path):  # noqa: F811
    m = as_family(model, tmp_path / "minimax", "minimax_m2")
    s = Scripted(m, TEMPLATE, tmp_path)
    with s.proc:
        c = openai.OpenAI(base_url=s.proc.base + "/v1", api_key="unused", max_retries=0, timeout=30)
        s.reply(REPLY)
        r = c.chat.completions.create(model="minimax", messages=ASK, tools=[BOOK])
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls" and msg.content == "On it."
        assert msg.model_dump().get("reasoning_content") == "Checking.\n"
        assert [(t.function.name, json.loads(t.function.arguments)) for t in msg.tool_calls] == [("book", ARGS)]
        s.reply(REPLY)
        chunks = list(c.chat.completions.create(model="minimax", messages=ASK, tools=[BOOK], stream=True))
        deltas = [t for ch in chunks if ch.choices for t in (ch.choices[0].delta.tool_calls or [])]
        assert deltas[0].function.name == "book"
        assert json.loads("".join(d.function.arguments or "" for d in deltas)) == ARGS
        shown = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert shown == "On it." and "<invoke" not in shown
        follow = ASK + [msg.model_dump(exclude_none=True),
                        {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "booked"}]
        s.reply(["Booked.\n</think>\n\nDone."])
        r2 = c.chat.completions.create(model="minimax", messages=follow, tools=[BOOK],
                                       tool_choice={"type": "function", "function": {"name": "book"}})
        sub = s.last_submit()
        sent, g = sub["payload"], int(sub["opts"]["grammar"])
    assert r2.choices[0].message.content == "Done."
    assert '"<minimax:tool_call>\\n"' in sent[:g] and '"<invoke name=\\"book\\">\\n"' in sent[:g]
    assert sent[:g].startswith('root ::= "</think>"')  # the prompt opened <think>: the call closes it first
    assert '<invoke name="book">\n<parameter name="city">Paris</parameter>\n<parameter name="code">007</parameter>' \
           in sent[g:]
    assert "]~b]tool\n<response>booked</response>[e~[\n]~b]ai\n<think>\n" in sent[g:]
