"""The launcher's habits as a new user meets them: help texts, usage errors, suggestions for
near-miss names, prompts from stdin, the store commands and a run stopped by a full context."""
import inspect
import os
import subprocess
import sys

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
    """One range (colibri/cli/launch_opts.py): 0 and one past the model's 512 positions refused alike."""
    for bad in ("0", "513"):
        r = coli(cmd, "--model", model, "--ctx", bad, *extra, cwd=tmp_path, input="")
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        assert f"--ctx {bad}: this model holds 1 to 512 positions (max_position_embeddings)" in r.stderr, (cmd, r.stderr)
    if cmd in ("run", "logits"):  # the low end is what the engine takes: a one-position context is not refused
        r = coli(cmd, "--model", model, "--ctx", "1", *extra, cwd=tmp_path, input="")
        assert "--ctx 1" not in r.stderr, (cmd, r.stderr)
