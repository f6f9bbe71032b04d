"""The expert store's flags reach the engine the same way from every command: --ram, else
$COLI_RAM_GB, else the default budget (90% of usable memory, cgroup limits included); a bad
value is refused with the reason, never replaced."""
import argparse

import pytest

import resource_plan
from colibri import launch_opts
from colibri.machine import probe as machine_probe
from colibri.errors import UserError


def parse(*argv):
    p = argparse.ArgumentParser()
    launch_opts.add_engine_flags(p, launch_opts.STREAM_FLAGS, group=None)
    return p.parse_args(list(argv))


def test_flags_become_engine_arguments(monkeypatch):
    monkeypatch.delenv("COLI_RAM_GB", raising=False)
    args = parse("--ram", "0.5", "--cap", "2", "--no-direct", "--readahead", "off", "--pin", "off")
    assert launch_opts.stream_args(args) == ["--ram", "0.5", "--cap", "2", "--no-direct", "--readahead", "off",
                                             "--pin", "off"]


def test_prefill_pass_reaches_the_engine_and_a_negative_one_is_refused(monkeypatch):
    monkeypatch.delenv("COLI_RAM_GB", raising=False)
    assert launch_opts.stream_args(parse("--ram", "1", "--prefill-pass", "1024")) == ["--ram", "1", "--prefill-pass", "1024"]
    with pytest.raises(UserError, match="--prefill-pass -8"):
        launch_opts.stream_args(parse("--ram", "1", "--prefill-pass", "-8"))


def test_environment_budget_and_its_refusal(monkeypatch):
    monkeypatch.setenv("COLI_RAM_GB", "0.25")
    assert launch_opts.stream_args(parse()) == ["--ram", "0.25"]
    assert launch_opts.stream_args(parse("--ram", "3")) == ["--ram", "3"]  # the flag wins
    for bad in ("lots", "0", "-2", "nan"):
        monkeypatch.setenv("COLI_RAM_GB", bad)
        with pytest.raises(UserError, match="COLI_RAM_GB"):
            launch_opts.stream_args(parse())


def test_default_budget_is_the_planners(monkeypatch):
    monkeypatch.delenv("COLI_RAM_GB", raising=False)
    assert resource_plan.memory_info is machine_probe.memory_info  # the planner's budget is the probe's
    mem = machine_probe.memory_info()
    assert mem["default_budget"], "this machine reports no usable memory"
    # available memory moves while other processes run: read it once for both sides
    monkeypatch.setattr(machine_probe, "memory_info", lambda: mem)
    got = launch_opts.stream_args(parse())
    assert got[0] == "--ram" and abs(float(got[1]) * 1e9 - mem["default_budget"]) < 1e-5 * mem["default_budget"]
