"""The engine's kernel sets chosen at run time: `colibri version` names the chosen set and every
set this CPU runs, `--kernels NAME` forces one (READY reports it), and a set the CPU lacks or an
unknown name is refused by name. Every set gives the same greedy tokens on a tiny model."""
import subprocess

import pytest

from launcher_helpers import convert_tiny

from colibri import engine_client, limits


@pytest.fixture(scope="module")
def tiny(oracle_root, tmp_path_factory):
    return convert_tiny(oracle_root, tmp_path_factory.mktemp("kern") / "moe")


def version_words():
    r = subprocess.run([str(engine_client.ensure_built()), "version"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return dict(w.split("=", 1) for w in r.stdout.splitlines()[0].split()[2:])


def test_version_lists_the_sets_this_cpu_runs():
    w = version_words()
    avail = w["available"].split(",")
    assert avail[0] == "portable" and w["kernels"] == avail[-1]
    assert set(avail) <= {"portable", "avx2", "avx512", "vnni", "amx", "neon"}


def set_lines():
    """`colibri version`'s "set NAME: complete|portable ENTRY,..." lines, by set name."""
    r = subprocess.run([str(engine_client.ensure_built()), "version"], capture_output=True, text=True)
    out = {}
    for line in r.stdout.splitlines()[1:]:
        head, _, what = line.partition(": ")
        out[head.split()[1]] = what
    return out


def test_every_set_lists_its_portable_fallbacks():
    """Each kernel set this build has is complete or names the entries it takes from the portable
    set; on x86 every set has all of its own (the NEON set's list is checked under QEMU by
    `make ctest-aarch64`, c/tests/test_kernel_table.c)."""
    lines = set_lines()
    avail = version_words()["available"].split(",")
    assert set(avail) <= set(lines) and lines["portable"] == "complete"
    for name, what in lines.items():
        assert what == "complete" or what.startswith("portable "), (name, what)
    if "avx2" in avail:
        assert all(lines[k] == "complete" for k in ("avx2", "avx512", "vnni", "amx")), lines


def test_each_set_is_forced_and_reported(tiny):
    lines = set_lines()
    for name in version_words()["available"].split(","):
        with engine_client.Engine(tiny, threads=1, extra=["--kernels", name]) as eng:
            assert eng.info.get("kernels") == name
            fb = lines[name].removeprefix("portable ")
            assert eng.info.get("kernel_fallbacks") == ("none" if fb == "complete" else fb)
            # the prefill batch without --batch follows the set (AMX tiles want more positions)
            assert int(eng.info["batch"]) == limits.default_batch(name)
        with engine_client.Engine(tiny, threads=1, batch=64, extra=["--kernels", name]) as eng:
            assert eng.info["batch"] == "64"


def test_unknown_or_missing_sets_are_refused(tiny):
    with pytest.raises(engine_client.EngineError) as e:
        with engine_client.Engine(tiny, threads=1, extra=["--kernels", "sse9"]):
            pass
    assert "--kernels" in e.value.message and "portable" in e.value.message
    missing = [k for k in ("avx2", "avx512", "vnni", "amx", "neon") if k not in version_words()["available"].split(",")]
    for name in missing:  # only on a CPU without them; the sets it has are checked above
        with pytest.raises(engine_client.EngineError) as e:
            with engine_client.Engine(tiny, threads=1, extra=["--kernels", name]):
                pass
        assert "cannot run" in e.value.message


def test_launcher_commands_pass_the_set_to_the_engine(tiny, tmp_path):
    """`--kernels` on coli logits, run and serve reaches the engine: a set this CPU lacks is
    refused by the engine with its reason, a set it has computes the same model."""
    import numpy as np

    from launcher_helpers import coli
    avail = version_words()["available"].split(",")
    lacking = next(k for k in ("neon", "avx2") if k not in avail)  # x86 has no neon, aarch64 no avx2
    ids = "1,5,9,13,2,7"
    r = coli("logits", "--model", tiny, "--ids", ids, "--out", tmp_path / "x.f32", "--kernels", lacking)
    assert r.returncode != 0 and f"--kernels {lacking}" in r.stderr and "cannot run" in r.stderr
    r = coli("run", "--model", tiny, "--ids", ids, "--max-tokens", "2", "--kernels", lacking)
    assert r.returncode != 0 and "cannot run" in r.stderr
    r = coli("run", "--model", tiny, "--ids", ids, "--max-tokens", "2", "--kernels", "sse9")
    assert r.returncode == 2 and "invalid choice: 'sse9'" in r.stderr  # argparse names the choices
    outs = {}
    for name in (avail[0], avail[-1]):  # portable and the best set
        r = coli("logits", "--model", tiny, "--ids", ids, "--out", tmp_path / f"{name}.f32", "--kernels", name)
        assert r.returncode == 0, r.stderr
        outs[name] = np.fromfile(tmp_path / f"{name}.f32", dtype="<f4")
    a, b = outs[avail[0]], outs[avail[-1]]
    assert a.size and a.size == b.size and np.abs(a - b).max() <= 1e-4 * np.abs(a).max()
    from colibri.server import config
    import argparse
    p = argparse.ArgumentParser()
    config.add_arguments(p)
    args = p.parse_args(["--model", str(tiny), "--kernels", avail[0], "--no-kv-persist"])
    assert ["--kernels", avail[0]] == config.resolve(args).stream_args[-2:]
