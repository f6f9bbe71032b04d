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
    return dict(w.split("=", 1) for w in r.stdout.split()[2:])


def test_version_lists_the_sets_this_cpu_runs():
    w = version_words()
    avail = w["available"].split(",")
    assert avail[0] == "portable" and w["kernels"] == avail[-1]
    assert set(avail) <= {"portable", "avx2", "avx512", "amx", "neon"}


def test_each_set_is_forced_and_reported(tiny):
    for name in version_words()["available"].split(","):
        with engine_client.Engine(tiny, threads=1, extra=["--kernels", name]) as eng:
            assert eng.info.get("kernels") == name
            # the prefill batch without --batch follows the set (AMX tiles want more positions)
            assert int(eng.info["batch"]) == limits.default_batch(name)
        with engine_client.Engine(tiny, threads=1, batch=64, extra=["--kernels", name]) as eng:
            assert eng.info["batch"] == "64"


def test_unknown_or_missing_sets_are_refused(tiny):
    with pytest.raises(engine_client.EngineError) as e:
        with engine_client.Engine(tiny, threads=1, extra=["--kernels", "sse9"]):
            pass
    assert "--kernels" in e.value.message and "portable" in e.value.message
    missing = [k for k in ("avx2", "avx512", "amx", "neon") if k not in version_words()["available"].split(",")]
    for name in missing:  # only on a CPU without them; the sets it has are checked above
        with pytest.raises(engine_client.EngineError) as e:
            with engine_client.Engine(tiny, threads=1, extra=["--kernels", name]):
                pass
        assert "cannot run" in e.value.message
