"""The launcher's habits as a new user meets them: help texts, usage errors, suggestions for
near-miss names, prompts from stdin, the store commands and a run stopped by a full context."""
import inspect

from launcher_helpers import coli


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
