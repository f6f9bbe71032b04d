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
