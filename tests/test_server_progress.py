"""Prompt progress through `coli serve`: llama-server's `return_progress` adds chunks with
`prompt_progress` (total, cache, processed, time_ms) to a stream while the prompt is prefilled,
the official openai client reads such a stream unchanged, and /health lists prefilling requests."""
import json

import openai
import pytest

from server_helpers import ServerProc, model, post_json, request, sse_events, template  # noqa: F401

MID = "qwen3_moe"


@pytest.fixture(scope="module")
def server(model, template):  # noqa: F811
    with ServerProc(model, "--chat-template", template, "--no-kv-persist", "--batch", "8") as s:
        yield s


def stream(server, path, body):
    status, _, raw = request(server.port, "POST", path, {**body, "stream": True}, {"Content-Type": "application/json"},
                             timeout=60)
    assert status == 200, raw
    return [json.loads(e) for e in sse_events(raw) if e != "[DONE]"]


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "one two three four five six seven eight nine ten " * 4}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "count: " + "one two three " * 12}]})])
def test_return_progress_chunks_count_up_to_the_prompt(server, path, body):
    body = {"model": MID, "max_tokens": 3, "temperature": 0, **body}
    chunks = stream(server, path, {**body, "return_progress": True})
    prog = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    assert len(prog) >= 3, chunks  # a prompt of several batches of 8
    assert all(c["choices"] == [] for c in chunks if "prompt_progress" in c)
    done = [p["processed"] for p in prog]
    assert done == sorted(done) and done[-1] == prog[-1]["total"] and len({p["total"] for p in prog}) == 1
    assert all(p["time_ms"] >= 0 and 0 <= p["cache"] <= p["processed"] for p in prog)
    def answer(c):  # a chunk carrying generated text (chat's first chunk only names the role)
        ch = c.get("choices") or [{}]
        return bool(ch[0].get("text") or (ch[0].get("delta") or {}).get("content"))
    first_text = next(i for i, c in enumerate(chunks) if answer(c))
    assert all("prompt_progress" not in c for c in chunks[first_text:])  # all before the answer
    usage_total = prog[-1]["total"]
    assert usage_total > 24
    plain = stream(server, path, body)
    assert not any("prompt_progress" in c for c in plain)


def test_openai_client_reads_a_stream_with_progress(server):
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=60)
    r = client.chat.completions.create(model=MID, messages=[{"role": "user", "content": "hi " * 40}], max_tokens=4,
                                       temperature=0, stream=True, extra_body={"return_progress": True})
    chunks = list(r)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert any(c.choices == [] for c in chunks) and isinstance(text, str)
    plain = client.chat.completions.create(model=MID, messages=[{"role": "user", "content": "hi " * 40}], max_tokens=4,
                                           temperature=0)
    assert text == plain.choices[0].message.content


def test_health_lists_prefilling_requests(server):
    status, _, raw = request(server.port, "GET", "/health")
    h = json.loads(raw)
    assert status == 200 and h["requests"]["prefilling"] == []  # idle: nothing prefilling
