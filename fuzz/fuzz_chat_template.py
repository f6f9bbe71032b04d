#!/usr/bin/env python3
"""atheris target: a chat template source from arbitrary bytes, parsed and rendered over a
conversation that exercises the variables real templates read. Anything but success or
TemplateError (another exception type, a hang, a memory blow-up) is a finding."""
import sys

import atheris

with atheris.instrument_imports():
    from colibri.chat_template import render as chat_template
    from colibri.chat_template import runtime as chat_template_runtime
    from colibri.chat_template import syntax  # noqa: F401  (instrumented for coverage)

# Smaller bounds than a real render's, so one input runs in milliseconds and a libFuzzer timeout
# means an unbounded path, not a long bounded one (the same checks fire, only sooner).
chat_template_runtime.MAX_STEPS = 5000
chat_template_runtime.MAX_LENGTH = 1 << 20

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "What is 6*7?"}, {"type": "image"}]},
    {"role": "assistant", "content": "", "reasoning_content": "multiply",
     "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": {"expr": "6*7"}}}]},
    {"role": "tool", "content": "42", "tool_call_id": "c1"},
    {"role": "user", "content": "thanks <|im_end|>"},
]
TOOLS = [{"type": "function", "function": {"name": "calc", "description": "evaluate",
                                           "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}}}}]


def one_input(data):
    source = data.decode("utf-8", "replace")
    try:
        out = chat_template.render_chat(source, MESSAGES, add_generation_prompt=True, tools=TOOLS,
                                        bos_token="<s>", eos_token="</s>", enable_thinking=False)
    except chat_template_runtime.TemplateError as e:
        assert e.message, "TemplateError without a message"
        return
    assert isinstance(out, str)


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
