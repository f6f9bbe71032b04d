"""What the server keeps about conversations is owner-only: the state folder 700, the slot
table (every slot's prompt) and the KV files 600, whatever the umask, existing files fixed at
start; every state file it replaces or refuses is named in the log."""
import json
import os
import stat

from colibri.server import private_files
from colibri.server.scheduler import SlotTable
from server_helpers import ServerProc, model, post_json, template  # noqa: F401


def mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_slot_table_is_written_600_under_a_lax_umask(tmp_path):
    old = os.umask(0o022)
    try:
        path = str(tmp_path / "slots.json")
        SlotTable(2, path, "fp").update(0, "secret prompt")
    finally:
        os.umask(old)
    assert mode(path) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["slots.json"]  # no temporary left behind


def test_damaged_foreign_and_refused_tables_are_logged_by_name(tmp_path):
    path = tmp_path / "slots.json"
    for content, needle in ((b"{not json", "is damaged"), (json.dumps({"fingerprint": "x", "slots": []}).encode(),
                                                           "another model")):
        path.write_bytes(content)
        logs = []
        assert SlotTable(2, str(path), "fp", logs.append).pick("a") == 0
        assert len(logs) == 1 and str(path) in logs[0] and needle in logs[0] and "replaced" in logs[0], logs
    path.unlink()
    (tmp_path / "elsewhere.json").write_text(json.dumps({"fingerprint": "fp", "slots": [{"prompt": "a"}]}))
    path.symlink_to(tmp_path / "elsewhere.json")
    logs = []
    t = SlotTable(2, str(path), "fp", logs.append)
    assert t.prompts == ["", ""] and len(logs) == 1 and "refused" in logs[0] and str(path) in logs[0], logs
    t.update(0, "new")  # the symlink is replaced, never written through
    assert not path.is_symlink() and json.loads((tmp_path / "elsewhere.json").read_text())["slots"][0]["prompt"] == "a"


def test_secure_dir_fixes_modes_and_says_so(tmp_path):
    d = tmp_path / "state"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    (d / "slots.json").write_text("{}")
    os.chmod(d / "slots.json", 0o644)
    (d / ".coli_kv.0").write_bytes(b"x")
    os.chmod(d / ".coli_kv.0", 0o600)
    logs = []
    private_files.secure_dir(str(d), logs.append)
    assert mode(d) == 0o700 and mode(d / "slots.json") == 0o600 and mode(d / ".coli_kv.0") == 0o600
    assert len(logs) == 2 and any(str(d / "slots.json") in m and "644 -> 600" in m for m in logs), logs


def test_serve_fixes_an_existing_state_folder_at_start(model, template, tmp_path):  # noqa: F811
    kv = tmp_path / "kv"
    kv.mkdir()
    os.chmod(kv, 0o755)
    (kv / "slots.json").write_text("{broken")
    os.chmod(kv / "slots.json", 0o644)
    old = os.umask(0o022)
    try:
        with ServerProc(model, "--chat-template", template, "--kv-dir", str(kv), "--kv-slots", "2") as server:
            assert mode(kv) == 0o700 and mode(kv / "slots.json") == 0o600
            status, _, out = post_json(server.port, "/v1/chat/completions",
                                       {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
            assert status == 200, out
            log = server.log()
        files = sorted(p for p in kv.iterdir())
    finally:
        os.umask(old)
    assert f"{kv / 'slots.json'} owner-only" in log and f"slot table {kv / 'slots.json'} is damaged" in log
    assert files and all(mode(p) & 0o077 == 0 for p in files), [(p.name, oct(mode(p))) for p in files]
