"""The engine's C follows .clang-format: every C file under c/ and fuzz/ (bar the generated ones
named in .clang-format-ignore) is what clang-format makes of it. The clang-format is the pinned
wheel from requirements-test.txt, so every machine formats alike."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLANG_FORMAT = Path(sys.executable).parent / "clang-format"


def c_files():
    out = subprocess.run(["git", "ls-files", "c/*.c", "c/*.h", "fuzz/*.c", "fuzz/*.h"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    ignored = {ln.strip() for ln in (ROOT / ".clang-format-ignore").read_text().splitlines()
               if ln.strip() and not ln.startswith("#")}
    return [f for f in out if f not in ignored]


def check(files, stdin=None):
    return subprocess.run([str(CLANG_FORMAT), "--dry-run", "--Werror", *files], cwd=ROOT, input=stdin,
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def clang_format():
    if not CLANG_FORMAT.exists():
        pytest.fail(f"{CLANG_FORMAT} is missing: make test installs requirements-test.txt's clang-format", pytrace=False)
    return CLANG_FORMAT


def test_every_c_file_follows_the_style(clang_format):
    files = c_files()
    assert len(files) > 100  # the whole engine, not an empty listing
    r = check(files)
    assert r.returncode == 0, ("run `.venv/bin/clang-format -i FILE` on the files named below\n"
                               + r.stderr[-4000:])


def test_the_check_fails_on_code_off_the_style(clang_format):
    """What the check above would say of a file that breaks the style (two statements on one
    line, a four-space block opened on its own line)."""
    r = check(["--assume-filename=c/util/example.c"], "int f(int a)\n{\n  int b = a; return b;\n}\n")
    assert r.returncode != 0 and "code should be clang-formatted" in r.stderr
