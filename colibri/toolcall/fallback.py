"""Tool turns for a chat template that has no tool syntax (a checkpoint without a template gets
the generic ChatML one): tool definitions become a system message, earlier calls are written in
the family's own call syntax inside the assistant's text, and tool results become user turns.
The model then sees the conversation in the syntax the server parses back."""
import json

PREAMBLE = "# Tools\n\nFunctions you may call, one JSON object each:\n"


def _tools_text(tools):
    lines = "\n".join(json.dumps(t, ensure_ascii=False, separators=(",", ":")) for t in tools)
    return f"{PREAMBLE}{lines}\n"


def plain_conversation(chat, tools, fmt, template_source, calls_as_text=False):
    """`chat` (template-shaped messages) rewritten for a template that reads neither `tools` nor
    `tool_calls`; unchanged where the template can render them itself. `calls_as_text`: write
    the calls into the text even so (the template read them but dropped them)."""
    source = template_source or ""
    out = list(chat)
    if calls_as_text or "tool_calls" not in source:
        out = []
        for m in chat:
            if m.get("role") == "tool" and "tool_calls" not in source:
                out.append({"role": "user", "content": f"<tool_response>\n{m.get('content', '')}\n</tool_response>"})
            elif m.get("tool_calls"):
                calls = "\n".join(fmt.render(c["function"]) for c in m["tool_calls"])
                text = m.get("content") or ""
                out.append({k: v for k, v in m.items() if k != "tool_calls"} |
                           {"content": f"{text}\n{calls}" if text else calls})
            else:
                out.append(m)
    if tools and "tools" not in source:
        if out and out[0].get("role") == "system":
            out[0] = dict(out[0], content=f"{out[0].get('content') or ''}\n\n{_tools_text(tools)}".lstrip())
        else:
            out.insert(0, {"role": "system", "content": _tools_text(tools)})
    return out
