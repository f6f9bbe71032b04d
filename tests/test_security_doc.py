"""docs/security.md names a test for each threat: every test file and function it names exists,
so the table cannot point at a test that was renamed or removed."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_test_the_threat_table_names_exists():
    text = (ROOT / "docs" / "security.md").read_text()
    table = text.split("## Threats and the tests that cover them", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| threat")
            and not ln.startswith("|---")]
    assert len(rows) >= 20
    missing = []
    for row in rows:
        cells = row.split("|")
        assert len(cells) == 5 and cells[3].strip(), f"a threat without a test: {row}"
        current = None
        for ref in re.findall(r"`([^`]+)`", cells[3]):
            path, _, func = ref.partition("::")
            if path:
                current = ROOT / path
                if not current.exists():
                    missing.append(path)
                    continue
            if func and current is not None and f"def {func}(" not in current.read_text():
                missing.append(f"{current.relative_to(ROOT)}::{func}")
    assert not missing, missing
