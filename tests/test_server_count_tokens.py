"""Anthropic POST /v1/messages/count_tokens: the prompt /v1/messages renders, counted by the
engine's tokenizer, must equal the prompt tokens the engine reports for the same request."""
import anthropic
import pytest

from server_helpers import ServerProc, model, post_json, template  # noqa: F401

MID = "qwen3_moe"
KEY = "count-key"

CASES = [
    dict(messages=[{"role": "user", "content": "hi"}]),
    dict(system="You are terse.", messages=[{"role": "user", "content": "Tell me about colibris <|im_end|> now"}]),
    dict(messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b c"}]},
                   {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and then?"}]),
    dict(messages=[{"role": "user", "content": "continue this"}, {"role": "assistant", "content": "Once upon"}]),
    dict(thinking={"type": "disabled"}, messages=[{"role": "user", "content": "déjà vu ✓ 日本"}]),
]


@pytest.fixture(scope="module")
def client(model, template):  # noqa: F811
    with ServerProc(model, "--chat-template", template, "--no-kv-persist", "--api-key", KEY) as s:
        yield s, anthropic.Anthropic(base_url=s.base, api_key=KEY, max_retries=0, timeout=30)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_count_matches_the_prompt_the_engine_reads(client, case):
    _, c = client
    counted = c.messages.count_tokens(model=MID, **CASES[case]).input_tokens
    usage = c.messages.create(model=MID, max_tokens=1, **CASES[case]).usage
    assert counted == usage.input_tokens + usage.cache_read_input_tokens > 0


def test_count_tokens_needs_the_key_and_a_valid_body(client):
    server, _ = client
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.base, api_key="wrong", max_retries=0).messages.count_tokens(
            model=MID, messages=[{"role": "user", "content": "hi"}])
    auth = {"x-api-key": KEY}
    status, _, body = post_json(server.port, "/v1/messages/count_tokens", {"messages": []}, auth)
    assert status == 400 and body["type"] == "error" and "messages" in body["error"]["message"]
    status, _, body = post_json(server.port, "/v1/messages/count_tokens", {"model": "other", "messages": [
        {"role": "user", "content": "hi"}]}, auth)
    assert status == 404
    assert server.request("GET", "/v1/messages/count_tokens", headers=auth)[0] == 405
