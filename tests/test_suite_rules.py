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


ROOT = HERE.parent
# The design's top-level entry points; everything else lives in colibri/ (tools/ is dev-only).
ENTRY_POINTS = {"version.py", "family_registry.py", "resource_plan.py", "autotune.py", "doctor.py", "openai_server.py"}
PATH_EDIT = re.compile(r"sys\.path\.(insert|append)|sys\.path\s*\+?=")


def test_only_coli_sets_the_import_path():
    """Modules import through the package, tests through pytest.ini's pythonpath: a path edit
    elsewhere would let a module import something the launcher cannot."""
    files = [*ROOT.glob("*.py"), *ROOT.glob("colibri/**/*.py"), *ROOT.glob("tools/*.py"), *HERE.glob("*.py")]
    found = [str(f.relative_to(ROOT)) for f in files
             if f != Path(__file__).resolve() and PATH_EDIT.search(f.read_text(encoding="utf-8"))]
    assert not found, f"sys.path is set only in coli; found in {found}"
    assert PATH_EDIT.search((ROOT / "coli").read_text(encoding="utf-8"))


def test_top_level_python_is_only_the_entry_points():
    assert {f.name for f in ROOT.glob("*.py")} == ENTRY_POINTS, "move runtime modules into colibri/<concern>/"


def test_engine_flags_are_declared_once():
    """--ctx, --threads, ... mean one thing in every command: they come from launch_opts.ENGINE_FLAGS."""
    flag = re.compile(r"""add_argument\(\s*["']--(ctx|threads|batch|kv-slots|kv|ram|cap|no-profile)["']""")
    files = [ROOT / "coli", *ROOT.glob("*.py"), *ROOT.glob("colibri/**/*.py")]
    found = [f"{f.relative_to(ROOT)}: --{m.group(1)}" for f in files for m in flag.finditer(f.read_text(encoding="utf-8"))]
    assert not found, f"declare engine flags through launch_opts.add_engine_flags: {found}"
