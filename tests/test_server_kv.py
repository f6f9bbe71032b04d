"""KV slots survive a server restart: the next turn reuses the restored cache and answers
byte-identically to a server that computes the whole conversation from scratch."""
from server_helpers import ServerProc, model, post_json, template  # noqa: F401

MID = "qwen3_moe"


def turn(srv, messages, max_tokens=12):
    s, h, b = post_json(srv.port, "/v1/chat/completions",
                        {"model": MID, "messages": messages, "max_tokens": max_tokens, "temperature": 0})
    assert s == 200, b
    return b["choices"][0]["message"]["content"], int(h["x-colibri-slot"]), int(h["x-colibri-reused-tokens"])


def test_restart_continues_conversations_warm(model, template, tmp_path):  # noqa: F811
    kv = tmp_path / "kv"
    first = [{"role": "user", "content": "Tell me about the sea"}]
    other = [{"role": "user", "content": "A different conversation entirely"}]
    with ServerProc(model, "--chat-template", template, "--kv-dir", str(kv), "--kv-slots", "2") as a:
        r1, slot1, _ = turn(a, first)
        r_other, slot_other, _ = turn(a, other)
        assert slot1 != slot_other
        assert "persisted in" in a.log() and str(kv) in a.log()
    assert (kv / ".coli_kv").exists() and (kv / ".coli_kv.1").exists() and (kv / "slots.json").exists()

    second = first + [{"role": "assistant", "content": r1}, {"role": "user", "content": "And the mountains?"}]
    with ServerProc(model, "--chat-template", template, "--kv-dir", str(kv), "--kv-slots", "2") as b:
        assert "restored KV slot" in b.log()
        r2_warm, slot2, reused = turn(b, second)
        assert slot2 == slot1            # the conversation found its slot again after the restart
        assert reused > 10               # ...and its cache: the earlier turn was not recomputed

    with ServerProc(model, "--chat-template", template, "--no-kv-persist") as c:
        r2_cold, _, reused_cold = turn(c, second)
        assert reused_cold == 0
    assert r2_warm == r2_cold


def test_default_kv_dir_and_chatml_fallback(model):  # noqa: F811
    # the tiny model ships no chat template: chat still works, with a warning and /health saying so
    with ServerProc(model) as s:
        turn(s, [{"role": "user", "content": "hi"}], max_tokens=2)
        assert str(model / ".coli_serve") in s.log()
        assert "generic ChatML template" in s.log() and s.health()["chat_template"] == "chatml-fallback"
    assert (model / ".coli_serve" / ".coli_kv").exists()
