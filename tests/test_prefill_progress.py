"""PROGRESS frames (SUBMIT progress=1): one after each prefill chunk, counting up to the prompt's
length, reused positions included, the last just before the first token; none without the flag."""
import subprocess
import sys
from pathlib import Path

import pytest

from colibri import engine_client
from engine_binaries import assert_clean_exit, engine_bin  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def every_binary(engine_bin):  # noqa: F811
    return engine_bin


@pytest.fixture(scope="module")
def model(oracle_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("progress") / "llama"
    subprocess.run([sys.executable, str(ROOT / "coli"), "convert", str(Path(oracle_root) / "llama" / "hf"), str(out)],
                   check=True, capture_output=True)
    return out


def test_progress_counts_the_chunks(model):
    prompt = list(range(5, 45))  # 40 positions in chunks of 16: 16, 32, 40
    with engine_client.Engine(model, ctx=128, batch=16) as eng:
        ev = list(eng.generate(prompt, max_tokens=2, progress=1))
        plain = list(eng.generate(prompt + [50], max_tokens=2, slot=0))
        again = list(eng.generate(prompt + [50, 51, 52], max_tokens=1, progress=1))
    assert_clean_exit(eng)
    prog = [e for e in ev if e[0] == "progress"]
    assert [p[1] for p in prog] == [16, 32, 40] and all(p[2] == 40 and p[3] == 0 for p in prog)
    assert all(a[4] <= b[4] for a, b in zip(prog, prog[1:]))
    first_data = next(i for i, e in enumerate(ev) if e[0] == "data")
    assert ev[first_data - 1][0] == "progress" and ev[first_data - 1][1] == 40
    assert not any(e[0] == "progress" for e in plain)
    prog = [e for e in again if e[0] == "progress"]
    reused = again[0][2]
    assert reused > 0 and prog[-1][1:4] == (43, 43, reused) and prog[0][1] > reused
