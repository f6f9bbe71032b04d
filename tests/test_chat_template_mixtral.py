"""The official Mixtral-8x7B-Instruct-v0.1 chat template (tests/data/chat_templates/
mistralai-Mixtral-8x7B-Instruct-v0.1.jinja), kept verbatim and rendered byte-identical to jinja2 by
colibri's renderer with the release's <s> / </s>: [INST] turns, strict user/assistant alternation and
no system role (both refused by the template itself, with its own message)."""
import hashlib
import re
from pathlib import Path

import pytest

from colibri.chat_template import render as ct
from test_chat_template import A, CONVERSATIONS, KWARG_SETS, S, TOOL_CONVERSATIONS, U, assert_same

DATA = Path(__file__).resolve().parent / "data" / "chat_templates"
TEMPLATE = DATA / "mistralai-Mixtral-8x7B-Instruct-v0.1.jinja"
TEMPLATE_SHA256 = "26a59556925c987317ce5291811ba3b7f32ec4c647c400c6cc7e3a9993007ba7"
TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}
ALL = {**CONVERSATIONS, **TOOL_CONVERSATIONS, "assistant_first": [A("Hi"), U("q")]}
# the conversations this template accepts: user first, then strict alternation, no other roles
RENDERS = {"single_user", "multi_turn_no_system", "ends_with_assistant", "template_lookalike",
           "empty_content", "reasoning_content", "reasoning_last_turn", "think_inline", "think_inline_last",
           "thinking_field", "extra_keys", "none_valued_keys", "tool_response_wrapped"}


def source():
    return TEMPLATE.read_text(encoding="utf-8")


def test_official_template_is_kept_verbatim():
    assert hashlib.sha256(TEMPLATE.read_bytes()).hexdigest() == TEMPLATE_SHA256
    readme = (DATA / "README.md").read_text()
    assert TEMPLATE.name in readme and TEMPLATE_SHA256 in readme


@pytest.mark.parametrize("conv", sorted(ALL))
def test_official_template_matches_jinja2(conv):
    outcomes = {assert_same(source(), ALL[conv], TOKENS, **kw)[0] for kw in KWARG_SETS}
    assert outcomes == ({"ok"} if conv in RENDERS else {"error"}), outcomes  # not vacuous


def test_known_bytes():
    # spelled out from the template by hand, independent of jinja2
    messages = [U("Hi"), A("Hello."), U("Joke?")]
    assert ct.render_chat(source(), messages, **TOKENS) == "<s>[INST] Hi [/INST]Hello.</s>[INST] Joke? [/INST]"


@pytest.mark.parametrize("messages,message", [
    ([S("Be brief."), U("Hi")], "Conversation roles must alternate user/assistant/user/assistant/..."),
    ([U("Hi"), {"role": "tool", "content": "x"}], "Only user and assistant roles are supported!"),
])
def test_template_errors_name_the_cause(messages, message):
    with pytest.raises(ct.TemplateError, match=re.escape(message)):
        ct.render_chat(source(), messages, **TOKENS)
