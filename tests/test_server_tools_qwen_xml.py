"""`coli serve` on a Qwen3.5 (qwen3_5_moe) checkpoint with its official template: a scripted
engine writes the family's XML tool call in small pieces; the server answers with a typed
call, writes it back into the next prompt in the template's own syntax, and forces a named
call with the family's grammar."""
import json
from pathlib import Path

import openai

from server_helpers import as_family, model  # noqa: F401
from test_server_tools import ASK, Scripted

TEMPLATE = Path(__file__).parent / "data" / "chat_templates" / "Qwen3.5.jinja"
BOOK = {"type": "function", "function": {"name": "book", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "code": {"type": "string"},
                                     "guests": {"type": "integer"}, "terrace": {"type": "boolean"}},
    "required": ["city", "guests"]}}}
REPLY = ["Checking.</think>\n\nOn it.\n\n<tool", "_call>\n<function=bo", "ok>\n<parameter=city>\nPa", "ris\n</para",
         "meter>\n<parameter=code>\n007\n</parameter>\n<parameter=guests>\n4\n</parameter>\n",
         "<parameter=terrace>\nTrue\n</parameter>\n</function>\n</tool_call>"]
ARGS = {"city": "Paris", "code": "007", "guests": 4, "terrace": True}


def test_qwen3_5_xml_call_round_trip(model, tmp_path):  # noqa: F811
    q = as_family(model, tmp_path / "qwen3_5", "qwen3_5_moe")
    s = Scripted(q, TEMPLATE, tmp_path)
    with s.proc:
        c = openai.OpenAI(base_url=s.proc.base + "/v1", api_key="unused", max_retries=0, timeout=30)
        s.reply(REPLY)
        r = c.chat.completions.create(model="qwen3_5", messages=ASK, tools=[BOOK])
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls" and msg.content == "On it."
        assert [(t.function.name, json.loads(t.function.arguments)) for t in msg.tool_calls] == [("book", ARGS)]
        s.reply(REPLY)
        chunks = list(c.chat.completions.create(model="qwen3_5", messages=ASK, tools=[BOOK], stream=True))
        deltas = [t for ch in chunks if ch.choices for t in (ch.choices[0].delta.tool_calls or [])]
        assert deltas[0].function.name == "book"
        assert json.loads("".join(d.function.arguments or "" for d in deltas)) == ARGS
        follow = ASK + [msg.model_dump(exclude_none=True),
                        {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "booked"}]
        s.reply(["</think>\n\nDone."])
        r2 = c.chat.completions.create(model="qwen3_5", messages=follow, tools=[BOOK],
                                       tool_choice={"type": "function", "function": {"name": "book"}})
        sub = s.last_submit()
        sent, g = sub["payload"], int(sub["opts"]["grammar"])
    assert r2.choices[0].message.content == "Done."
    assert '"<tool_call>\\n<function=book>\\n"' in sent[:g] and '"<parameter=city>\\n"' in sent[:g]
    assert "<tool_call>\n<function=book>\n<parameter=city>\nParis\n</parameter>\n<parameter=code>\n007\n</parameter>" \
           in sent[g:]
    assert "<tool_response>\nbooked\n</tool_response>" in sent[g:]
