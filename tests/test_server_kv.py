"""KV slots survive a server restart: the next turn reuses the restored cache and answers
byte-identically to a server that computes the whole conversation from scratch. A hostile KV
directory (a crafted file, a second server, a crashed save's temporary) costs at most one slot."""
import os

import kv_files
from engine_binaries import engine_bin, env_for  # noqa: F401
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


# --- hostile KV directories (against the release and the ASan+UBSan engine) ---------------------

def test_crafted_kv_file_is_refused_and_the_server_answers(model, template, tmp_path, engine_bin):  # noqa: F811
    """A KV file whose count once overran the slot (the model folder is the default KV dir, so a
    shared folder is enough to plant one): the engine refuses it, starts and answers."""
    kv = tmp_path / "kv"
    kv.mkdir()
    kv_files.craft(kv / ".coli_kv", model, 2 ** 31, body=bytes(256 * 1024))
    with ServerProc(model, "--chat-template", template, "--kv-dir", str(kv), "--kv-slots", "1",
                    env=env_for(engine_bin)) as s:
        reply, slot, reused = turn(s, [{"role": "user", "content": "hi"}], max_tokens=3)
        assert slot == 0 and reused == 0
        assert "2147483648 positions exceed the context" in s.log()
        engine = s.health()["engine"]
        assert engine["restarts"] == 0
        assert os.path.realpath(f"/proc/{engine['pid']}/exe") == str(engine_bin)  # COLI_ENGINE was honoured


def test_two_servers_on_one_kv_dir(model, template, tmp_path, engine_bin):  # noqa: F811
    """The second server's engine is refused with a message naming the directory and --kv-dir;
    the first keeps serving, and the second recovers once the directory is free."""
    kv = tmp_path / "kv"
    args = ("--chat-template", template, "--kv-dir", str(kv), "--kv-slots", "1")
    a = ServerProc(model, *args, env=env_for(engine_bin))
    try:
        b = ServerProc(model, *args, env=env_for(engine_bin), wait_ready=False)
        try:
            h = b.wait_health(lambda h: h["status"] == "failed")
            assert h["engine"]["pid"] is None
            log = b.log()
            assert f"the KV directory {kv} is in use by another colibri engine" in log and "--kv-dir" in log
            turn(a, [{"role": "user", "content": "still mine"}], max_tokens=2)
            a.stop()
            b.wait_health(lambda h: h["status"] == "ok", timeout=90)  # retried with back-off
            turn(b, [{"role": "user", "content": "now mine"}], max_tokens=2)
        finally:
            b.stop()
    finally:
        a.stop()


def test_stale_temporary_is_removed_at_start(model, template, tmp_path, engine_bin):  # noqa: F811
    kv = tmp_path / "kv"
    kv.mkdir()
    stale = kv / ".coli_kv.tmp"
    with open(stale, "wb") as f:
        f.truncate(120 * 1024 * 1024)  # a save killed half-way (sparse: no disk used)
    with ServerProc(model, "--chat-template", template, "--kv-dir", str(kv), env=env_for(engine_bin)) as s:
        assert not stale.exists()
        assert f"removed {stale}" in s.log() and "interrupted" in s.log()
        turn(s, [{"role": "user", "content": "hi"}], max_tokens=2)
