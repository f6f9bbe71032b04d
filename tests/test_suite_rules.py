"""Rules for the test suite itself: a test that cannot run fails, it never skips. A skipped
test reads as fine in a summary line while the regression it guards goes unseen."""
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
SKIPS = re.compile(r"importorskip|skipif|mark\.skip|pytest\.skip\(")


def test_no_test_skips_for_a_missing_dependency_or_anything_else():
    found = []
    for f in sorted(HERE.glob("*.py")):
        if f == Path(__file__).resolve():
            continue
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if SKIPS.search(line):
                found.append(f"{f.name}:{n}: {line.strip()}")
    assert not found, ("tests must fail, not skip (a missing dependency: needs.need(); see `make test`):\n"
                       + "\n".join(found))
