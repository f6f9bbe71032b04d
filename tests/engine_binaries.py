"""The engine binaries the protocol-level tests run against: the release build and the
ASan+UBSan build (`make build/colibri_asan`), so a memory error or undefined behaviour in the
engine fails a test instead of passing unseen. Import the fixture into a test module:
`from engine_binaries import engine_bin  # noqa: F401`."""
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
from colibri import engine_client  # noqa: E402

BINARIES = {"release": "build/colibri", "asan": "build/colibri_asan"}


def build(target):
    """Builds (or finds up to date) one engine target; fails the test if make cannot."""
    r = subprocess.run(["make", "-s", "-C", str(ROOT), target], capture_output=True, text=True)
    if r.returncode:
        pytest.fail(f"make {target} failed:\n{r.stdout}{r.stderr}", pytrace=False)
    return ROOT / target


@pytest.fixture(scope="module", params=sorted(BINARIES))
def engine_bin(request):
    """Path of the engine under test; engine_client spawns it for the module's duration, and
    env_for() passes it on to a `coli serve` subprocess."""
    path = build(BINARIES[request.param])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine_client, "ENGINE", path)
        for k, v in SANITIZER_ENV.items():
            mp.setenv(k, v)
        yield path


# A report must fit the 20 stderr lines an engine error carries: no legend, one line per frame.
SANITIZER_ENV = {"ASAN_OPTIONS": "print_legend=0", "UBSAN_OPTIONS": "print_stacktrace=1"}


def env_for(path):
    """Environment for a `coli serve` subprocess that must spawn this engine binary."""
    return {"COLI_ENGINE": str(path), **SANITIZER_ENV}


def assert_clean_exit(eng):
    """A closed engine exited 0: a sanitizer report at exit (a leak, UB in teardown) is a failure."""
    assert eng.proc.returncode == 0, engine_client.describe_exit(eng.proc.returncode, eng.stderr_tail)
